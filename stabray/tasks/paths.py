"""Path finding on star graphs and trees: the planning tasks of the multi-token-prediction paper
(the star graph of Bachmann & Nagarajan 2024) and of the one-layer transformer tree-path paper.

Every node label is an integer drawn without replacement from 0..pool-1 (one token each; the
embedded tokenizer always holds 0..127). Edges are directed, written `parent > child`, and listed
in a random order, so nothing in the order gives the path away.

Answer format, shared by the four tasks: the intermediate steps are the path's inner nodes, one
node (one token) per step, in the order the path is written; the final answer is the whole path
as a vector, e.g. `40, 39 | [31 40 39 6]`. Scoring is exact match of that vector (there is exactly
one path). Without hints the output line is `path` and the answer is the vector alone.

- `star_graph` (Bachmann & Nagarajan): a source with `degree` arms, each a chain; the path runs
  from the source to the goal at the end of one arm, `path_len` nodes counting both ends. Only the
  first step is a decision; after it, teacher forcing lets next-token prediction follow the one
  out-edge of the previous node (the "Clever Hans" shortcut), which is what the MTP planning paper says NTP
  stalls on (about 1/degree) and MTP escapes.
- `binary_tree_path`: a perfect binary tree of `depth` levels below the root, random labels; the
  path from the root down to a goal leaf. Every step chooses one of two children.
- `tree_path_backward` : the same trees; the path from the goal leaf up to the root, each
  step one parent lookup.
- `tree_path_forward` : the root-to-goal path, after writing the backward path as a
  scratchpad: the steps are the goal's ancestors from its parent up to the root, the final is the
  path from the root down to the goal (`binary_tree_path` is this task without the scratchpad).

Size (length generalization): star_graph grows `path_len`; the tree tasks grow `depth` (one more
level doubles the tree; the default long splits are depth + 1 and depth + 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from stabray.errors import UserError
from stabray.tasks.base import TASKS, Example, Task


def fmt_path(path: list[int]) -> str:
    return "[" + " ".join(str(v) for v in path) + "]"


def fmt_edges(edges: list[tuple[int, int]]) -> str:
    return ", ".join(f"{u} > {v}" for u, v in edges)


def shuffled(rng: np.random.RandomState, edges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [edges[i] for i in rng.permutation(len(edges))]


class PathTask(Task):
    """Shared rendering: edges + endpoints in the question; inner nodes as steps; the path as final."""

    output = "path"

    def render(
        self, edges: list[tuple[int, int]], ends: str, steps: list[int], final: list[int], meta: dict
    ) -> Example:
        head = f"{self.name}:\nedges: {fmt_edges(edges)}, {ends}\n"
        return Example(
            question=head + f"trace | {self.output}:\n",
            steps=tuple(str(v) for v in steps),
            final=fmt_path(final),
            question_nohint=head + f"{self.output}:\n",
            meta=meta,
        )


# ---------------------------------------------------------------------------------- star graph


@dataclass(frozen=True)
class StarParams:
    degree: int = 2  # arms leaving the source (Bachmann & Nagarajan's d)
    path_len: int = 5  # nodes on the source-to-goal path, both ends included (their l)
    pool: int = 50  # node labels are drawn from 0..pool-1 (their N)


@TASKS.register("star_graph")
class StarGraph(PathTask):
    """Star graph path finding: `degree` arms of `path_len - 1` nodes hang off the source.

    Example (degree=2, path_len=4; `draw(get_task('star_graph', path_len=4), "test", 1, seed=0,
    size=4)[0]`, question then answer; the answer ends with a blank line):

        star_graph:
        edges: 32 > 35, 31 > 38, 40 > 39, 38 > 32, 39 > 6, 31 > 40, source: 31, goal: 6
        trace | path:
        40, 39 | [31 40 39 6]
    """

    Params = StarParams
    size_field = "path_len"
    min_size = 3  # at least one inner node, so there is one step

    def check_size(self, size: int, key: str | None = None) -> None:
        super().check_size(size, key)
        p = self.params  # set before Task.__init__ checks the size
        if p.degree < 2:
            raise UserError(f"task {self.name!r}: degree must be >= 2, got {p.degree}")
        need = 1 + p.degree * (size - 1)
        if need > p.pool:
            raise UserError(
                f"task {self.name!r}: {need} nodes at path_len={size}, degree={p.degree} do not fit in pool={p.pool}"
            )

    def sample(self, rng: np.random.RandomState, size: int) -> Example:
        self.check_size(size)
        d, length = self.params.degree, int(size)
        labels = rng.choice(self.params.pool, 1 + d * (length - 1), replace=False).tolist()
        source = labels[0]
        arms = [[source] + labels[1 + a * (length - 1) : 1 + (a + 1) * (length - 1)] for a in range(d)]
        goal_arm = int(rng.randint(d))
        edges = [(arm[i], arm[i + 1]) for arm in arms for i in range(length - 1)]
        path = arms[goal_arm]
        return self.render(
            shuffled(rng, edges),
            f"source: {source}, goal: {path[-1]}",
            path[1:-1],
            path,
            meta={"n": length, "source": source, "goal": path[-1], "path": path, "edges": [list(e) for e in edges]},
        )

    def trivial_baselines(self) -> dict[str, Callable[[Example], str]]:
        def lowest_arm(ex: Example) -> str:
            # follow the arm whose first node has the lowest label: right 1/degree of the time
            children = {}
            for u, v in ex.meta["edges"]:
                children.setdefault(u, []).append(v)
            path = [ex.meta["source"]]
            path.append(min(children[path[0]]))
            while path[-1] in children:
                path.append(children[path[-1]][0])
            return fmt_path(path)

        return {"follow the lowest-labelled arm": lowest_arm}


# ---------------------------------------------------------------------------------- trees


@dataclass(frozen=True)
class TreeParams:
    depth: int = 3  # levels below the root; a perfect binary tree of 2^(depth+1) - 1 nodes
    pool: int = 100  # node labels are drawn from 0..pool-1 (depth 5 needs 63)


def sample_tree(rng: np.random.RandomState, depth: int, pool: int) -> tuple[list[tuple[int, int]], list[int]]:
    """(edges in heap order, root-to-goal path) of a perfect binary tree with random labels and a
    uniformly random goal leaf."""
    n = 2 ** (depth + 1) - 1
    labels = rng.choice(pool, n, replace=False).tolist()  # labels[i] is heap node i (children 2i+1, 2i+2)
    edges = [(labels[(i - 1) // 2], labels[i]) for i in range(1, n)]
    leaf = (2**depth - 1) + int(rng.randint(2**depth))
    heap_path = [leaf]
    while heap_path[-1]:
        heap_path.append((heap_path[-1] - 1) // 2)
    return edges, [labels[i] for i in reversed(heap_path)]


class TreeTask(PathTask):
    Params = TreeParams
    size_field = "depth"
    min_size = 2  # at least one inner node

    def check_size(self, size: int, key: str | None = None) -> None:
        super().check_size(size, key)
        p = self.params  # set before Task.__init__ checks the size
        if 2 ** (size + 1) - 1 > p.pool:
            raise UserError(
                f"task {self.name!r}: a depth-{size} tree has {2 ** (size + 1) - 1} nodes, more than pool={p.pool}"
            )

    def arrange(self, down: list[int]) -> tuple[list[int], list[int]]:
        """(steps, final) from the root-to-goal path."""
        raise NotImplementedError

    def sample(self, rng: np.random.RandomState, size: int) -> Example:
        self.check_size(size)
        edges, down = sample_tree(rng, int(size), self.params.pool)
        steps, final = self.arrange(down)
        return self.render(
            shuffled(rng, edges),
            f"root: {down[0]}, goal: {down[-1]}",
            steps,
            final,
            meta={"n": int(size), "root": down[0], "goal": down[-1], "path": down, "edges": [list(e) for e in edges]},
        )

    def trivial_baselines(self) -> dict[str, Callable[[Example], str]]:
        def lower_child(ex: Example) -> str:
            # walk down from the root always taking the lower-labelled child: right 2^-depth of the time
            children = {}
            for u, v in ex.meta["edges"]:
                children.setdefault(u, []).append(v)
            down = [ex.meta["root"]]
            while down[-1] in children:
                down.append(min(children[down[-1]]))
            return fmt_path(self.arrange(down)[1])

        return {"always the lower-labelled child": lower_child}


@TASKS.register("binary_tree_path")
class BinaryTreePath(TreeTask):
    """Root-to-goal-leaf path in a perfect binary tree; every step picks one of two children.

    Example (depth=2; `draw(get_task('binary_tree_path', depth=2), "test", 1, seed=0, size=2)[0]`):

        binary_tree_path:
        edges: 65 > 56, 89 > 83, 89 > 19, 65 > 0, 2 > 89, 2 > 65, root: 2, goal: 0
        trace | path:
        65 | [2 65 0]
    """

    def arrange(self, down):
        return down[1:-1], down


@TASKS.register("tree_path_backward")
class TreePathBackward(TreeTask):
    """Goal-to-root path (backward reasoning): each step is the parent of the last node.

    Example (depth=2; `draw(get_task('tree_path_backward', depth=2), "test", 1, seed=0, size=2)[0]`):

        tree_path_backward:
        edges: 65 > 56, 89 > 83, 89 > 19, 65 > 0, 2 > 89, 2 > 65, root: 2, goal: 0
        trace | path:
        65 | [0 65 2]
    """

    def arrange(self, down):
        up = down[::-1]
        return up[1:-1], up


@TASKS.register("tree_path_forward")
class TreePathForward(TreeTask):
    """Root-to-goal path after a backward scratchpad (forward reasoning): the steps climb
    from the goal's parent to the root, the final reverses the climb.

    Example (depth=2; `draw(get_task('tree_path_forward', depth=2), "test", 1, seed=0, size=2)[0]`):

        tree_path_forward:
        edges: 65 > 56, 89 > 83, 89 > 19, 65 > 0, 2 > 89, 2 > 65, root: 2, goal: 0
        trace | path:
        65, 2 | [2 65 0]
    """

    def arrange(self, down):
        up = down[::-1]
        return up[1:], down
