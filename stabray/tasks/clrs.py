"""CLRS-Text graph algorithms (Markeeva et al. 2024, CLRS code >= 2.0.2 format).

Sampling, per example, with one seeded RandomState and in this order (docs/design.md, "Tasks"):
edge mask `binomial(1, p, (n, n))`, symmetrised for undirected graphs (`mat *= mat.T`, so an edge
appears with probability p², self-loops possible); weights `uniform(0, 1, (n, n))`, `w *= w.T`,
`w = sqrt(w + 1e-3)`; `A = mat * w` truncated to `decimals` places *before* the algorithm runs;
then the source `choice(n)`.

Text: `question = f"{algo}:\\n{inputs}\\n{output_line}:\\n"`, answer = the middle `pi_h` trace
steps joined by ", ", then " | ", then the final `pi`. The first trace step (the identity) is shown
as `initial_trace`; the last equals the answer and is not repeated.

Trace points (CLRS's `pi_h` probes; mean steps at n = 10 in brackets): dijkstra and mst_prim, one
per extraction [~7.8]; bellman_ford, one per round of relaxing every edge from the previous round's
distances [~2.5]; bfs, one per level [~2.1]; dfs (directed, no source), one when a root is picked or
a tree edge taken, one when a node is discovered, one when it finishes: exactly 3n [28].

Tie-breaking: the next node is the lowest index among the minima. CLRS's own code extracts with an
unstable `argsort`, so about 1% of its traces differ from ours on ties; ours are deterministic.

Labelled variant (`labels: k`, a laptop-scale variant of this format; 0, the default, is CLRS-Text):
the same graph, source and algorithm, but the n nodes carry labels drawn without replacement from
0..k-1 and sorted (node i is the i-th smallest label, so "lowest index" is "lowest label"); the graph
is written as adjacency lists by label (`A: {2: [5 0.6], 5: [2 0.6, 5 0.3], 9: []}`, a weight after
each neighbour in weighted graphs, self-loops kept) and every `pi` vector names its entries
(`[2:5 5:5 9:9]`: node 2's predecessor is node 5). A model trained on small graphs then has written
every label and finds every entry by its name rather than by counting positions.

Whole-state steps (`distances: true`, labelled Dijkstra and Prim only): every trace step, and the
initial trace, writes the state after one extraction, `[2:5 1.2; 5:5 0.0 *; 9:9]`: each node's
predecessor, its key (Dijkstra: tentative distance; Prim: lightest edge to the tree) once reached,
and `*` once extracted. The `pi` trace alone leaves the distances implicit, so a step depends on
sums over the whole path so far; with the state written, each step follows from the previous step
and the graph (one extraction, one-edge sums). Sums are computed in units of the last decimal place,
so the written keys are the ones compared (with float sums a displayed tie, 0.1 + 0.2 vs 0.3, could
update). The final answer stays the labelled `pi`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from stabray.errors import UserError
from stabray.tasks.base import TASKS, Example, Task


def fmt_num(x: float | int) -> str:
    """Floats with Python str() (0.197, 0.0), integers bare."""
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return str(float(x))


def fmt_vec(v: np.ndarray) -> str:
    return "[" + " ".join(fmt_num(x) for x in v.tolist()) + "]"


def fmt_mat(m: np.ndarray) -> str:
    return "[" + ", ".join(fmt_vec(row) for row in m) + "]"


def fmt_named(labels: list[int], pi: np.ndarray) -> str:
    """A labelled `pi` vector: `[2:5 5:5 9:9]` (label of node i, then the label of its predecessor)."""
    return "[" + " ".join(f"{labels[i]}:{labels[int(p)]}" for i, p in enumerate(pi.tolist())) + "]"


def fmt_adjacency(labels: list[int], A: np.ndarray, weighted: bool) -> str:
    """Adjacency lists by label: `{2: [5 0.6], 5: [2 0.6, 5 0.3], 9: []}` (row u lists every v with
    A[u, v] != 0 in node order, with the weight A[u, v] when weighted; self-loops included)."""
    rows = []
    for u in range(A.shape[0]):
        nbrs = [f"{labels[v]} {fmt_num(A[u, v])}" if weighted else str(labels[v]) for v in np.flatnonzero(A[u])]
        rows.append(f"{labels[u]}: [{', '.join(nbrs)}]")
    return "{" + ", ".join(rows) + "}"


def truncate(a: np.ndarray, decimals: int) -> np.ndarray:
    scale = 10.0**decimals
    return np.trunc(a * scale) / scale


def sample_graph(
    rng: np.random.RandomState, n: int, *, directed: bool, weighted: bool, p: float, decimals: int
) -> np.ndarray:
    """Adjacency matrix in CLRS's random-number order; weights truncated to `decimals` places."""
    mat = rng.binomial(1, p, (n, n))
    if not directed:
        mat *= mat.T
    if weighted:
        w = rng.uniform(0.0, 1.0, (n, n))
        if not directed:
            w *= w.T
        w = np.sqrt(w + 1e-3)
        return truncate(mat * w, decimals)
    return mat.astype(np.int64)


@dataclass(frozen=True)
class State:
    """The algorithm's state after one extraction (the labelled variant with `distances: true`
    writes it): `pi`, the key of every node (Dijkstra: the tentative distance; Prim: the lightest
    edge to the tree), `reached` (in the queue or extracted) and `done` (extracted)."""

    pi: np.ndarray
    key: np.ndarray
    reached: np.ndarray
    done: np.ndarray


def extraction_states(A: np.ndarray, s: int, prim: bool = False) -> list[State]:
    """Dijkstra's (prim=False) or Prim's (prim=True) extraction loop, the state after the initial
    step and after every extraction (CLRS semantics: strict < updates, lowest index among minima).
    The arithmetic is exact when A holds integers (the distances variant passes weights in units
    of the last decimal place, so the sums it writes are the ones compared)."""
    n = A.shape[0]
    key = np.zeros(n, dtype=A.dtype)
    mark = np.zeros(n, dtype=bool)
    in_queue = np.zeros(n, dtype=bool)
    pi = np.arange(n)
    in_queue[s] = True

    def snap() -> State:
        return State(pi.copy(), key.copy(), in_queue | mark, mark.copy())

    states = [snap()]
    while in_queue.any():
        cand = np.where(in_queue, key, np.inf)
        u = int(np.flatnonzero(cand == cand.min())[0])
        in_queue[u] = False
        mark[u] = True
        for v in range(n):
            new = A[u, v] if prim else key[u] + A[u, v]
            if A[u, v] != 0 and not mark[v] and (not in_queue[v] or new < key[v]):
                pi[v] = u
                key[v] = new
                in_queue[v] = True
        states.append(snap())
    return states


def dijkstra(A: np.ndarray, s: int) -> list[np.ndarray]:
    """pi_h after the initial state and after every extraction (CLRS semantics, strict < updates,
    lowest index among minima)."""
    return [st.pi for st in extraction_states(A, s)]


@dataclass(frozen=True)
class GraphParams:
    n_nodes: int = 10  # nodes per graph (the paper: 10; length generalization: 11 and 12)
    p: float = 0.5  # CLRS edge probability before symmetrising (an undirected edge: p**2)
    decimals: int = 3  # weights truncated to this many decimal places (CLRS-Text: 3)
    # 0: CLRS-Text (an unlabelled matrix, pi by position); k > 0: the labelled variant, node labels
    # drawn from 0..k-1 (k >= every size used), adjacency lists and named pi entries (module docstring)
    labels: int = 0
    # labelled variant only, Dijkstra and Prim: every trace step writes the whole state (module docstring)
    distances: bool = False


class CLRSTask(Task):
    """Shared sampling and rendering; subclasses give the algorithm and the graph kind."""

    Params = GraphParams
    size_field = "n_nodes"
    # A graph is drawn as an n x n weight matrix and written out whole: one example is 1.4 MB of text at
    # 256 nodes and about 20 MB at 1000, far past any model's context; at 100000 the matrix alone would
    # need 75 GiB.
    max_size = 1000

    directed = False
    weighted = True
    has_source = True
    prim: bool | None = None  # Dijkstra (False) or Prim (True): the extraction loop; None: no `distances`

    def __init__(self, **params):
        super().__init__(**params)
        if not 0.0 < self.params.p <= 1.0:
            raise UserError(f"task {self.name!r}: p must be in (0, 1], got {self.params.p}")
        # the types were checked by Task._check_types; here the ranges
        if not 1 <= self.params.decimals <= 6:
            raise UserError(f"task {self.name!r}: decimals must be an integer in 1..6, got {self.params.decimals!r}")
        labels = self.params.labels
        if labels < 0:
            raise UserError(f"task {self.name!r}: labels must be 0 (CLRS-Text) or a pool size > 0, got {labels!r}")
        if self.params.distances and (self.prim is None or not labels):
            raise UserError(
                f"task {self.name!r}: distances: true needs the labelled variant (labels > 0) of dijkstra or "
                f"mst_prim" + ("" if self.prim is not None else f", not {self.name}")
            )
        for size in (*self.in_dist_sizes, *self.long_sizes().values()):
            self.check_size(size)

    def check_size(self, size: int, key: str | None = None) -> None:
        super().check_size(size, key)
        labels = getattr(getattr(self, "params", None), "labels", 0)
        if labels and size > labels:
            raise UserError(
                f"task {self.name!r}: {self.size_field}={size} needs at least {size} labels, but labels={labels}"
            )

    def describe(self) -> dict:
        d = super().describe()
        if not d.get("labels"):  # CLRS-Text keeps its dataset cache keys
            d.pop("labels", None)
        if not d.get("distances"):  # and so does the labelled variant without distances
            d.pop("distances", None)
        return d

    def run(self, A: np.ndarray, s: int) -> list[np.ndarray]:
        raise NotImplementedError

    def sample(self, rng: np.random.RandomState, size: int) -> Example:
        self.check_size(size)
        n = int(size)
        A = sample_graph(
            rng, n, directed=self.directed, weighted=self.weighted, p=self.params.p, decimals=self.params.decimals
        )
        s = int(rng.choice(n)) if self.has_source else None
        if self.params.distances:
            # exact sums: weights in units of the last decimal place (0.7 -> 7)
            units = np.rint(A * 10**self.params.decimals).astype(np.int64)
            states = extraction_states(units, s, prim=bool(self.prim))
            trace = [st.pi for st in states]
        else:
            states, trace = None, self.run(A, s)
        # drawn after the graph and source, so the labelled variant has CLRS-Text's graphs
        labels = (
            sorted(int(x) for x in rng.choice(self.params.labels, n, replace=False)) if self.params.labels else None
        )
        if states is not None:
            return self.render(A, s, trace, labels, steps=[self.fmt_state(st, labels) for st in states])
        return self.render(A, s, trace, labels)

    def fmt_state(self, st: State, labels: list[int]) -> str:
        """A whole state, by label: `[2:5 1.2; 5:5 0.0 *; 9:9]` (node 2: predecessor 5, key 1.2, in
        the queue; node 5: extracted; node 9: not reached, no key). Entries are separated by ';'
        because ', ' separates trace steps (generated answers are split into steps on it)."""
        scale = 10**self.params.decimals
        entries = []
        for i in range(len(labels)):
            e = f"{labels[i]}:{labels[int(st.pi[i])]}"
            if st.reached[i]:
                e += f" {fmt_num(round(int(st.key[i]) / scale, self.params.decimals))}"
            if st.done[i]:
                e += " *"
            entries.append(e)
        return "[" + "; ".join(entries) + "]"

    def fmt_pi(self, pi: np.ndarray, labels: list[int] | None) -> str:
        return fmt_vec(pi) if labels is None else fmt_named(labels, pi)

    def render(
        self,
        A: np.ndarray,
        s: int | None,
        trace: list[np.ndarray],
        labels: list[int] | None = None,
        steps: list[str] | None = None,
    ) -> Example:
        """`steps`: the rendered trace points (the distances variant's states); default: `trace`'s pi."""
        n = A.shape[0]
        if steps is None:
            steps = [self.fmt_pi(t, labels) for t in trace]
        graph = fmt_mat(A) if labels is None else fmt_adjacency(labels, A, self.weighted)
        inputs = [f"s: {s if labels is None else labels[s]}"] if s is not None else []
        inputs += [f"A: {graph}", f"initial_trace: {steps[0]}"]
        head = f"{self.name}:\n{', '.join(inputs)}\n"
        meta = {"n": n, "source": s, "A": A.tolist()}
        if labels is not None:
            meta["labels"] = labels
        return Example(
            question=head + "trace | pi:\n",
            steps=tuple(steps[1:-1]),
            final=self.fmt_pi(trace[-1], labels),
            question_nohint=head + "pi:\n",
            meta=meta,
        )

    def trivial_baselines(self) -> dict[str, Callable[[Example], str]]:
        if not self.has_source:
            return {}

        def adjacent_to_source(ex: Example) -> str:
            # "a node's predecessor is the source if they are adjacent, else itself"
            A, s = np.asarray(ex.meta["A"]), ex.meta["source"]
            pi = np.arange(A.shape[0])
            pi[(A[s] != 0) & (pi != s)] = s
            return self.fmt_pi(pi, ex.meta.get("labels"))

        def identity(ex: Example) -> str:
            return self.fmt_pi(np.arange(ex.meta["n"]), ex.meta.get("labels"))

        return {"pi=s if adjacent to s else v": adjacent_to_source, "pi=identity": identity}


@TASKS.register("dijkstra")
class Dijkstra(CLRSTask):
    """Single-source shortest paths; one trace step per extraction.

    Example (n_nodes=4; `draw(get_task('dijkstra'), "test", 8, seed=0, size=4)[7]`,
    question then answer; the answer ends with a blank line):

        dijkstra:
        s: 3, A: [[0.0 0.0 0.79 0.65], [0.0 0.789 0.36 0.0], [0.79 0.36 0.0 0.0], [0.65 0.0 0.0 0.0]], initial_trace: [0 1 2 3]
        trace | pi:
        [3 1 2 3], [3 1 0 3], [3 2 0 3] | [3 2 0 3]
    """

    prim = False

    def run(self, A, s):
        return dijkstra(A, s)


def bellman_ford(A: np.ndarray, s: int) -> list[np.ndarray]:
    """pi_h at the start of every round, as CLRS probes it: each round relaxes every edge from the
    previous round's distances; rounds run until `d` stops changing (the last round changes
    nothing, so its pi_h is the answer)."""
    n = A.shape[0]
    d = np.zeros(n)
    reached = np.zeros(n, dtype=bool)
    pi = np.arange(n)
    reached[s] = True
    trace = []
    while True:
        prev_d, prev_reached = d.copy(), reached.copy()
        trace.append(pi.copy())
        for u in np.flatnonzero(prev_reached):
            for v in np.flatnonzero(A[u]):
                if not reached[v] or prev_d[u] + A[u, v] < d[v]:
                    d[v] = prev_d[u] + A[u, v]
                    pi[v] = u
                reached[v] = True
        if np.array_equal(d, prev_d):
            return trace


def mst_prim(A: np.ndarray, s: int) -> list[np.ndarray]:
    """pi_h after the initial state and after every extraction: Dijkstra's loop with the key of a
    node = the lightest edge to the tree (strict < updates, lowest index among minima)."""
    return [st.pi for st in extraction_states(A, s, prim=True)]


def bfs(A: np.ndarray, s: int) -> list[np.ndarray]:
    """pi_h at the start of every level, as CLRS probes it; a node's parent is the lowest-index
    node of the previous frontier adjacent to it. The last level adds nothing (pi_h = the answer)."""
    n = A.shape[0]
    reach = np.zeros(n, dtype=bool)
    pi = np.arange(n)
    reach[s] = True
    trace = []
    while True:
        prev = reach.copy()
        trace.append(pi.copy())
        for i in np.flatnonzero(prev):  # ascending: the lowest-index parent claims j first
            for j in np.flatnonzero(A[i]):
                if pi[j] == j and j != s:
                    pi[j] = i
                reach[j] = True
        if np.array_equal(reach, prev):
            return trace


def dfs(A: np.ndarray) -> list[np.ndarray]:
    """pi_h at CLRS's probe points: when a root is picked, when a node is discovered, when a tree
    edge is taken and when a node finishes; roots in index order, out-neighbours ascending.
    That is one push per root + one per tree edge (roots + tree edges = n) + 2 per node: 3n.

    CLRS walks an explicit stack (`s_prev`); the recursion below visits nodes in the same order
    and pushes at the same points, so the traces are identical."""
    n = A.shape[0]
    visited = np.zeros(n, dtype=bool)
    pi = np.arange(n)
    trace: list[np.ndarray] = []

    def visit(u: int) -> None:
        visited[u] = True
        trace.append(pi.copy())  # discovered
        for v in np.flatnonzero(A[u]):
            if not visited[v]:
                pi[v] = u
                trace.append(pi.copy())  # tree edge u -> v
                visit(int(v))
        trace.append(pi.copy())  # finished

    for r in range(n):
        if not visited[r]:
            trace.append(pi.copy())  # new root
            visit(r)
    return trace


@TASKS.register("bellman_ford")
class BellmanFord(CLRSTask):
    """Single-source shortest paths; one trace step per round of relaxing every edge.

    Example (n_nodes=4; `draw(get_task('bellman_ford'), "test", 8, seed=0, size=4)[7]`,
    question then answer; the answer ends with a blank line):

        bellman_ford:
        s: 3, A: [[0.0 0.0 0.79 0.65], [0.0 0.789 0.36 0.0], [0.79 0.36 0.0 0.0], [0.65 0.0 0.0 0.0]], initial_trace: [0 1 2 3]
        trace | pi:
        [3 1 2 3], [3 1 0 3] | [3 2 0 3]
    """

    def run(self, A, s):
        return bellman_ford(A, s)


@TASKS.register("mst_prim", aliases=("prim",))
class MSTPrim(CLRSTask):
    """Minimum spanning tree of the source's component; one trace step per extraction.

    Example (n_nodes=4; `draw(get_task('mst_prim'), "test", 6, seed=0, size=4)[5]`,
    question then answer; the answer ends with a blank line):

        mst_prim:
        s: 3, A: [[0.0 0.161 0.0 0.0], [0.161 0.269 0.0 0.914], [0.0 0.0 0.945 0.446], [0.0 0.914 0.446 0.0]], initial_trace: [0 1 2 3]
        trace | pi:
        [0 3 3 3], [0 3 3 3], [1 3 3 3] | [1 3 3 3]
    """

    prim = True

    def run(self, A, s):
        return mst_prim(A, s)


@TASKS.register("bfs")
class BFS(CLRSTask):
    """Breadth-first search on an undirected 0/1 graph; one trace step per level.

    Example (n_nodes=4; `draw(get_task('bfs'), "test", 4, seed=0, size=4)[3]`,
    question then answer; the answer ends with a blank line):

        bfs:
        s: 2, A: [[1 1 1 1], [1 0 0 1], [1 0 0 0], [1 1 0 0]], initial_trace: [0 1 2 3]
        trace | pi:
        [2 1 2 3] | [2 0 2 0]
    """

    weighted = False

    def run(self, A, s):
        return bfs(A, s)


@TASKS.register("dfs")
class DFS(CLRSTask):
    """Depth-first forest of a directed 0/1 graph, no source; exactly 3 trace arrays per node
    (T = 3n: root picked or tree edge taken, node discovered, node finished), many repeated.

    Example (n_nodes=3; `draw(get_task('dfs'), "test", 3, seed=0, size=3)[2]`,
    question then answer; the answer ends with a blank line):

        dfs:
        A: [[0 0 1], [1 0 1], [0 1 1]], initial_trace: [0 1 2]
        trace | pi:
        [0 1 2], [0 1 0], [0 1 0], [0 2 0], [0 2 0], [0 2 0], [0 2 0] | [0 2 0]
    """

    directed = True
    weighted = False
    has_source = False

    def run(self, A, s):
        return dfs(A)

    def trivial_baselines(self) -> dict[str, Callable[[Example], str]]:
        def first_in_neighbour(ex: Example) -> str:
            # "a node's predecessor is its lowest-index in-neighbour below it, else itself"
            A = np.asarray(ex.meta["A"])
            pi = np.arange(A.shape[0])
            for v in range(A.shape[0]):
                below = np.flatnonzero(A[:v, v])
                if below.size:
                    pi[v] = below[0]
            return self.fmt_pi(pi, ex.meta.get("labels"))

        def identity(ex: Example) -> str:
            return self.fmt_pi(np.arange(ex.meta["n"]), ex.meta.get("labels"))

        return {"pi=lowest in-neighbour below v": first_in_neighbour, "pi=identity": identity}
