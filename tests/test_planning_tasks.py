"""The planning tasks (star_graph, binary_tree_path, tree_path_backward/forward, countdown, sat3)
against references written here, independently of the generators: BFS over the edges parsed back
from the question, a perfect-binary-tree check, an AST evaluation and replay of countdown
operations, brute-force 3-SAT and a replay of the DPLL trace."""

from __future__ import annotations

import ast
import itertools
import operator
import re
from collections import Counter, deque
from fractions import Fraction

import numpy as np
import pytest

from stabray.data.splits import draw, make_splits
from stabray.tasks import extract_final, get_task, normalize_answer

PATH_TASKS = ["star_graph", "binary_tree_path", "tree_path_backward", "tree_path_forward"]
PLANNING = [*PATH_TASKS, "countdown", "sat3"]
N_REF = 200  # instances per reference check


def instances(name: str, n: int = N_REF, seed: int = 7, **params):
    """n examples over the default, the long and the longer size, from one seeded RandomState."""
    task = get_task(name, **params)
    sizes = [task.size, *task.long_sizes().values()]
    rng = np.random.RandomState(seed)
    return task, [(task.sample(rng, sizes[i % len(sizes)]), sizes[i % len(sizes)]) for i in range(n)]


def vec(text: str) -> list[str]:
    assert re.fullmatch(r"\[[^\[\]]*\]", text), text
    return text[1:-1].split()


# ---------------------------------------------------------------- generic


@pytest.mark.parametrize("name", PLANNING)
def test_deterministic_seeded_and_global_rng_untouched(name):
    task = get_task(name)
    np.random.seed(0)
    before = np.random.get_state()[1].copy()
    a = draw(task, "test", 30, seed=3, size=task.size)
    assert np.array_equal(np.random.get_state()[1], before)
    b = draw(get_task(name), "test", 30, seed=3, size=task.size)
    c = draw(task, "test", 30, seed=4, size=task.size)
    assert [e.to_record() for e in a] == [e.to_record() for e in b]
    assert [e.question for e in a] != [e.question for e in c]


@pytest.mark.parametrize("name", PLANNING)
def test_format_and_own_answer_scores(name):
    task, exs = instances(name, n=60)
    for ex, _ in exs:
        assert ex.question.startswith(f"{name}:\n") and ex.question.endswith(
            " | " + ex.question_nohint.split("\n")[-2] + "\n"
        )
        assert ex.question_nohint == ex.question.replace("trace | ", "")
        assert ex.answer.endswith("\n\n") and extract_final(ex.answer) == ex.final
        assert all(", " not in s and "|" not in s for s in ex.steps)
        assert task.is_correct(ex, ex.final) and task.is_correct(ex, " " + ex.final + " ")
        # decoding the word-level tokens (joined by spaces) still scores
        assert task.is_correct(ex, normalize_answer(ex.final))
        for rule in task.trivial_baselines().values():
            task.is_correct(ex, rule(ex))  # a string the checker can score


@pytest.mark.parametrize("name", PLANNING)
def test_longer_splits_are_longer(name):
    task = get_task(name)
    splits = make_splits(task, {"train": 20, "val": 10, "test": 10}, seed=0)
    n = {s: {e.meta["n"] for e in exs} for s, exs in splits.items()}
    assert n["train"] == n["test"] == {task.size}
    assert n["test_long"] == {task.long_sizes()["test_long"]} and n["test_longer"] == {task.long_sizes()["test_longer"]}
    assert task.size < task.long_sizes()["test_long"] < task.long_sizes()["test_longer"]
    length = {s: np.mean([len(e.question) + len(e.answer) for e in exs]) for s, exs in splits.items()}
    assert length["test"] < length["test_long"] < length["test_longer"]


# ---------------------------------------------------------------- paths


def parse_graph(question: str) -> tuple[dict[int, list[int]], dict[str, int]]:
    line = question.split("\n")[1]
    children: dict[int, list[int]] = {}
    for u, v in re.findall(r"(\d+) > (\d+)", line):
        children.setdefault(int(u), []).append(int(v))
    ends = {k: int(v) for k, v in re.findall(r"(source|goal|root): (\d+)", line)}
    return children, ends


def bfs_path(children: dict[int, list[int]], s: int, g: int) -> list[int]:
    prev, q = {s: None}, deque([s])
    while q:
        u = q.popleft()
        for v in children.get(u, []):
            if v not in prev:
                prev[v] = u
                q.append(v)
    assert g in prev, "goal unreachable"
    path = [g]
    while path[-1] != s:
        path.append(prev[path[-1]])
    return path[::-1]


def test_star_graph_matches_bfs_and_shape():
    task, exs = instances("star_graph", degree=3, path_len=5, pool=60)
    for ex, size in exs:
        children, ends = parse_graph(ex.question)
        s, g = ends["source"], ends["goal"]
        nodes = set(children) | {v for vs in children.values() for v in vs}
        assert len(nodes) == 1 + 3 * (size - 1) and max(nodes) < 60
        assert len(children[s]) == 3 and all(len(vs) == 1 for u, vs in children.items() if u != s)
        path = bfs_path(children, s, g)
        assert len(path) == size and g not in children  # the goal ends an arm
        assert vec(ex.final) == [str(v) for v in path]
        assert list(ex.steps) == [str(v) for v in path[1:-1]]
        assert len(normalize_answer(ex.final).split()) == size + 2  # one token per label


def check_perfect_binary(children: dict[int, list[int]], root: int, depth: int) -> set[int]:
    """Every internal node has two children, every leaf is at `depth`; returns the leaves."""
    leaves, frontier = set(), [(root, 0)]
    while frontier:
        u, d = frontier.pop()
        if u in children:
            assert len(children[u]) == 2 and d < depth
            frontier += [(v, d + 1) for v in children[u]]
        else:
            assert d == depth
            leaves.add(u)
    assert len(leaves) == 2**depth
    return leaves


@pytest.mark.parametrize("name", ["binary_tree_path", "tree_path_backward", "tree_path_forward"])
def test_tree_paths_match_bfs(name):
    task, exs = instances(name)
    for ex, depth in exs:
        children, ends = parse_graph(ex.question)
        r, g = ends["root"], ends["goal"]
        assert g in check_perfect_binary(children, r, depth)
        down = [str(v) for v in bfs_path(children, r, g)]
        assert len(down) == depth + 1
        if name == "binary_tree_path":
            assert vec(ex.final) == down and list(ex.steps) == down[1:-1]
        elif name == "tree_path_backward":
            assert vec(ex.final) == down[::-1] and list(ex.steps) == down[::-1][1:-1]
        else:  # scratchpad: the climb from the goal's parent to the root, then the path down
            assert list(ex.steps) == down[::-1][1:] and vec(ex.final) == down


def test_tree_tasks_share_trees_and_star_baseline_is_chance():
    a = draw(get_task("binary_tree_path"), "test", 5, seed=1, size=3)
    b = draw(get_task("tree_path_forward"), "test", 5, seed=1, size=3)
    assert [e.question.split("\n")[1] for e in a] == [e.question.split("\n")[1] for e in b]
    task, exs = instances("star_graph", n=400)
    rule = task.trivial_baselines()["follow the lowest-labelled arm"]
    assert 0.4 < np.mean([task.is_correct(e, rule(e)) for e, _ in exs]) < 0.6  # 1 / degree


def test_path_size_errors():
    from stabray.errors import UserError

    with pytest.raises(UserError, match="pool"):
        get_task("star_graph", degree=5, path_len=20, pool=50)
    with pytest.raises(UserError, match="pool"):
        get_task("binary_tree_path", depth=7)


# ---------------------------------------------------------------- countdown

_AST_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def ast_eval(text: str) -> tuple[Fraction, list[int]]:
    """Value and literals of an arithmetic expression via Python's own parser."""
    lits: list[int] = []

    def ev(node):
        if isinstance(node, ast.BinOp):
            return _AST_OPS[type(node.op)](ev(node.left), ev(node.right))
        assert isinstance(node, ast.Constant) and isinstance(node.value, int)
        lits.append(node.value)
        return Fraction(node.value)

    return ev(ast.parse(text, mode="eval").body), lits


def question_numbers(q: str) -> tuple[list[int], int]:
    m = re.search(r"numbers: \[([\d ]+)\], target: (\d+)", q)
    return [int(x) for x in m[1].split()], int(m[2])


def brute_solutions(nums: list[int], target: int, limit: int = 50) -> list[str]:
    """Up to `limit` expressions over all the numbers that reach the target (exhaustive pairing)."""
    out = []

    def go(items):
        if len(out) >= limit:
            return
        if len(items) == 1:
            if items[0][0] == target:
                out.append(items[0][1])
            return
        for i, j in itertools.permutations(range(len(items)), 2):
            (va, ta), (vb, tb) = items[i], items[j]
            rest = [x for k, x in enumerate(items) if k not in (i, j)]
            for op, v in (("+", va + vb), ("-", va - vb), ("*", va * vb), ("/", va / vb if vb else None)):
                if v is not None and v >= 0 and v.denominator == 1:
                    go(rest + [(v, f"({ta} {op} {tb})")])

    go([(Fraction(n), str(n)) for n in nums])
    return out


def test_countdown_solutions_evaluate_and_steps_replay():
    task, exs = instances("countdown")
    for ex, size in exs:
        nums, target = question_numbers(ex.question)
        assert len(nums) == size
        value, lits = ast_eval(ex.final)
        assert value == target and Counter(lits) == Counter(nums)
        pool = Counter(nums)  # replay the steps on the multiset of available numbers
        for step in ex.steps:
            a, op, b, c = re.fullmatch(r"(\d+) ([-+*/]) (\d+) = (\d+)", step).groups()
            a, b, c = int(a), int(b), int(c)
            for x in (a, b):
                assert pool[x] > 0
                pool[x] -= 1
            assert Fraction(c) == _AST_OPS[{"+": ast.Add, "-": ast.Sub, "*": ast.Mult, "/": ast.Div}[op]](
                Fraction(a), Fraction(b)
            )
            pool[c] += 1
        assert +pool == Counter([target]) and len(ex.steps) == size - 1


def test_countdown_checker_accepts_any_valid_solution_and_rejects_invalid():
    task, exs = instances("countdown", n=40)
    others = 0
    for ex, _ in exs:
        nums, target = question_numbers(ex.question)
        for expr in brute_solutions(nums, target):
            assert ast_eval(expr)[0] == target
            if normalize_answer(expr) != normalize_answer(ex.final):
                assert task.is_correct(ex, expr), (ex.question, expr)
                others += 1
                break
        assert not task.is_correct(ex, f"{ex.final} + 1")  # wrong value and a foreign literal
        assert not task.is_correct(ex, " + ".join(map(str, nums[:-1])) + f" + {target}")  # not the numbers
        assert not task.is_correct(ex, "(")
        assert not task.is_correct(ex, "")
    assert others > 10
    ex = exs[0][0]
    assert not task.is_correct(ex, "7 / 0") and not task.is_correct(ex, "1 - 2")


# ---------------------------------------------------------------- 3-SAT


def sat_clauses(q: str) -> tuple[int, list[tuple[int, ...]]]:
    n = int(re.search(r"vars: (\d+)", q)[1])
    return n, [tuple(int(x) for x in c.split()) for c in re.findall(r"\(([-\d ]+)\)", q)]


def holds(clauses, bits: list[int]) -> bool:
    return all(any((bits[abs(lit) - 1] == 1) == (lit > 0) for lit in c) for c in clauses)


def replay_dpll(n, clauses, steps) -> dict[int, int]:
    """Check every trace line against the assignment it acts on, by the rules of stabray.tasks.sat3's
    docstring; return the end state. Propagation scans the clauses in order: the first clause with no
    true literal and at most one unassigned one gives a `unit` (one) or a `conflict` (none); with no
    such clause, `decide v = 1` on the lowest unassigned variable of an unsatisfied clause; `decide
    v = 0` only right after a conflict, on the most recent decision whose 0 is untried, undoing
    everything since its `decide v = 1`. At the end every clause is satisfied."""
    assign: dict[int, int] = {}
    saved: dict[int, dict[int, int]] = {}  # insertion order: the most recent untried decision last

    def value(lit):
        v = assign.get(abs(lit))
        return None if v is None else (v == 1) == (lit > 0)

    def forced():  # (the first clause with no true literal and <= 1 unassigned, its unassigned) or None
        for c in clauses:
            if any(value(lit) for lit in c):
                continue
            free = [lit for lit in c if value(lit) is None]
            if len(free) <= 1:
                return c, free
        return None

    prev = None
    for step in steps:
        if step == "conflict":
            f = forced()
            assert f is not None and f[1] == [], (step, assign)
            prev = step
            continue
        kind, v, b = re.fullmatch(r"(unit|decide) (\d+) = ([01])", step).groups()
        v, b = int(v), int(b)
        if kind == "unit":
            f = forced()
            assert f is not None and f[1] == [v if b else -v], (step, assign, f)
        elif b == 1:
            assert forced() is None, (step, assign)  # propagation had finished
            open_vars = {abs(lit) for c in clauses if not any(value(x) for x in c) for lit in c if value(lit) is None}
            assert v == min(open_vars), (step, sorted(open_vars))
            saved[v] = dict(assign)
        else:
            assert prev == "conflict" and saved and v == list(saved)[-1], (step, prev, list(saved))
            assign = dict(saved.pop(v))  # undo everything since "decide v = 1"
        assert v not in assign
        assign[v] = b
        prev = step
    assert forced() is None and all(any(value(lit) for lit in c) for c in clauses)
    return assign


def test_sat3_assignments_satisfy_and_trace_replays():
    task, exs = instances("sat3")
    for ex, n in exs:
        n2, clauses = sat_clauses(ex.question)
        assert n2 == n and all(
            len({abs(lit) for lit in c}) == 3 and all(1 <= abs(lit) <= n for lit in c) for c in clauses
        )
        assert len(set(clauses)) == len(clauses)
        bits = [int(t) for t in vec(ex.final)]
        assert len(bits) == n and holds(clauses, bits)
        end = replay_dpll(n, clauses, ex.steps)
        assert [end.get(v, 1) for v in range(1, n + 1)] == bits
        assert holds(clauses, ex.meta["planted"])


def test_trivial_rules_score_what_they_say():
    """The floors, against independent evaluations: sat3's "every variable 1" is right exactly when the
    formula holds with every variable true; countdown's "the sum of all numbers" exactly when the
    numbers add up to the target. Both are right on some questions and wrong on others."""
    for name, right in (
        ("sat3", lambda q: holds(sat_clauses(q)[1], [1] * sat_clauses(q)[0])),
        ("countdown", lambda q: sum(question_numbers(q)[0]) == question_numbers(q)[1]),
    ):
        task, exs = instances(name, n=400)
        (rule,) = task.trivial_baselines().values()
        got = [task.is_correct(ex, rule(ex)) for ex, _ in exs]
        assert got == [right(ex.question) for ex, _ in exs], name
        assert 0 < sum(got) < len(got), (name, sum(got))


def test_sat3_checker_is_evaluation():
    task, exs = instances("sat3", n=60)
    other = 0
    for ex, n in exs:
        _, clauses = sat_clauses(ex.question)
        for bits in itertools.product([0, 1], repeat=n):  # brute force over all assignments
            text = "[" + " ".join(map(str, bits)) + "]"
            assert task.is_correct(ex, text) == holds(clauses, list(bits))
            other += holds(clauses, list(bits)) and text != ex.final
        assert not task.is_correct(ex, "[1 0]") and not task.is_correct(ex, "1 0 1 1 0") and not task.is_correct(ex, "")
    assert other > 0  # some formulas have satisfying assignments other than DPLL's, and they count
