"""Every registered task: seeded and deterministic, parseable, and correct against an independent
reference (scipy.sparse.csgraph for the graph algorithms, a CLRS-style explicit-stack DFS, a
direct evaluation of the LEGO clauses parsed back from the question)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy.sparse import csgraph

from stabray.data.splits import draw
from stabray.tasks import TASKS, extract_final, get_task, normalize_answer

ALL_TASKS = TASKS.names()
CLRS_TASKS = ["dijkstra", "bellman_ford", "mst_prim", "bfs", "dfs"]
LEGO_TASKS = ["lego_cyclic", "lego_symmetry"]
N_REF = 200  # random instances per reference check


def test_every_paper_task_is_registered():
    assert set(CLRS_TASKS + LEGO_TASKS) <= set(ALL_TASKS)
    assert TASKS.canonical("prim") == "mst_prim"


def parse_vec(text: str) -> list[str]:
    assert re.fullmatch(r"\[[^\[\]]*\]", text), text
    return text[1:-1].split(" ")


def ints(text: str) -> np.ndarray:
    return np.array([int(x) for x in parse_vec(text)])


def instances(name: str, sizes=range(2, 13), n=N_REF, seed=1234, **params):
    """n (example, size) pairs over a mix of sizes, from one seeded RandomState."""
    task = get_task(name, **params)
    rng = np.random.RandomState(seed)
    size_rng = np.random.RandomState(seed + 1)
    out = []
    for _ in range(n):
        size = int(size_rng.choice(list(sizes)))
        if name.startswith("lego"):
            size = min(size, task.max_size)
        out.append((task.sample(rng, size), size))
    return out


# ---------------------------------------------------------------- generic properties


@pytest.mark.parametrize("name", ALL_TASKS)
def test_deterministic_and_seeded(name):
    task = get_task(name)
    a = draw(task, "test", 20, seed=3, size=task.size)
    b = draw(get_task(name), "test", 20, seed=3, size=task.size)
    c = draw(task, "test", 20, seed=4, size=task.size)
    assert [e.to_record() for e in a] == [e.to_record() for e in b]
    assert [e.question for e in a] != [e.question for e in c]


@pytest.mark.parametrize("name", ALL_TASKS)
def test_global_random_state_untouched(name):
    np.random.seed(0)
    before = np.random.get_state()[1].copy()
    task = get_task(name)
    task.sample(np.random.RandomState(1), task.size)
    assert np.array_equal(np.random.get_state()[1], before)


@pytest.mark.parametrize("name", CLRS_TASKS + LEGO_TASKS)  # vector-per-step layout; other tasks: test_planning_tasks.py
def test_steps_and_final_parse(name):
    task = get_task(name)
    for ex, size in instances(name, n=50):
        assert ex.question.startswith(f"{task.name}:\n") and ex.question.endswith(
            "\ntrace | pi:\n" if name in CLRS_TASKS else "\ntrace | values:\n"
        )
        assert ex.question_nohint == ex.question.replace("trace | ", "")
        for text in (*ex.steps, ex.final):
            vec = parse_vec(text)
            assert len(vec) == size
            assert all(re.fullmatch(r"\d+|n", t) for t in vec), text
            # one token per value under the embedded tokenizer's pre-tokenizer
            assert normalize_answer(text).split(" ") == ["[", *vec, "]"]
        assert ex.answer.endswith("\n\n")
        assert extract_final(ex.answer) == ex.final
        assert task.is_correct(ex, ex.final)
        for rule in task.trivial_baselines().values():
            parse_vec(rule(ex))


# ---------------------------------------------------------------- CLRS references


def check_shortest_path_tree(ex):
    A, s = np.asarray(ex.meta["A"]), ex.meta["source"]
    pi = ints(ex.final)
    d = csgraph.shortest_path(A, directed=True, indices=s)
    for v in range(len(pi)):
        if v == s or np.isinf(d[v]):
            assert pi[v] == v
        else:
            u = pi[v]
            assert u != v and A[u, v] != 0
            assert abs(d[u] + A[u, v] - d[v]) <= 1e-9


@pytest.mark.parametrize("name", ["dijkstra", "bellman_ford"])
def test_shortest_paths_match_scipy(name):
    for ex, _ in instances(name):
        check_shortest_path_tree(ex)


def test_bellman_ford_steps_are_the_rounds():
    """Every written step, not only the answer: step k is pi after k rounds of relaxing every edge
    from the previous round's distances. The k-hop distances D_k (D_0 = 0 at s, inf elsewhere;
    D_k[v] = min(D_{k-1}[v], min_u D_{k-1}[u] + A[u, v])) are computed here with numpy; a node more
    than k hops from s still points to itself, and every other node's parent u is an edge with
    D_{k-1}[u] + A[u, v] = D_k[v]. The chain has one step per round that changed a distance, less the
    last (whose pi is the answer)."""
    steps_seen = 0
    for ex, size in instances("bellman_ford"):
        A, s = np.asarray(ex.meta["A"]), ex.meta["source"]
        W = np.where(A != 0, A, np.inf)
        D = [np.where(np.arange(size) == s, 0.0, np.inf)]
        while True:
            nxt = np.minimum(D[-1], (D[-1][:, None] + W).min(axis=0))
            if np.array_equal(nxt, D[-1]):
                break
            D.append(nxt)
        rounds = len(D)  # D_0 .. D_{R-1} differ; round R changes nothing
        assert len(ex.steps) == max(0, rounds - 2), ex.answer
        for k, text in enumerate([*ex.steps, ex.final], start=1):
            k = min(k, rounds - 1)
            pi = ints(text)
            for v in range(size):
                if v == s or np.isinf(D[k][v]):
                    assert pi[v] == v, (k, v, ex.answer)
                else:
                    u = pi[v]
                    assert A[u, v] != 0 and abs(D[k - 1][u] + A[u, v] - D[k][v]) <= 1e-9, (k, v, ex.answer)
        steps_seen += len(ex.steps)
    assert steps_seen > 100  # the check read many intermediate steps


def test_bfs_steps_are_the_levels():
    """Step k is pi after k levels, levels from scipy: a node at level <= k points to the
    lowest-index neighbour one level closer, every other node to itself."""
    steps_seen = 0
    for ex, size in instances("bfs"):
        A, s = np.asarray(ex.meta["A"]), ex.meta["source"]
        level = csgraph.shortest_path(A, indices=s, unweighted=True)
        for k, text in enumerate(ex.steps, start=1):
            pi = ints(text)
            for v in range(size):
                if v == s or not level[v] <= k:
                    assert pi[v] == v, (k, v, ex.answer)
                else:
                    assert pi[v] == min(u for u in range(size) if A[u, v] and level[u] == level[v] - 1)
        steps_seen += len(ex.steps)
    assert steps_seen > 50


def test_prim_is_a_minimum_spanning_tree_of_the_source_component():
    for ex, _ in instances("mst_prim"):
        A, s = np.asarray(ex.meta["A"]), ex.meta["source"]
        np.fill_diagonal(A, 0.0)
        pi = ints(ex.final)
        comp = np.flatnonzero(np.isfinite(csgraph.shortest_path(A, indices=s, unweighted=True)))
        for v in range(len(pi)):
            if v not in comp or v == s:
                assert pi[v] == v
        weight = 0.0
        for v in comp:
            if v == s:
                continue
            assert pi[v] in comp and A[pi[v], v] != 0
            weight += A[pi[v], v]
            seen, u = set(), v  # following pi from any node reaches s: a tree, not a cycle
            while u != s:
                assert u not in seen
                seen.add(u)
                u = pi[u]
        ref = csgraph.minimum_spanning_tree(A[np.ix_(comp, comp)]).sum()
        assert abs(weight - ref) <= 1e-9


def test_prim_trace_matches_dijkstra_shape():
    # one step per extraction: trace = identity + one array per node of the source's component
    for ex, _ in instances("mst_prim", n=50):
        A, s = np.asarray(ex.meta["A"]), ex.meta["source"]
        reached = np.isfinite(csgraph.shortest_path(A, indices=s, unweighted=True)).sum()
        assert len(ex.steps) == reached - 1


def test_bfs_parents_are_one_level_closer():
    for ex, _ in instances("bfs"):
        A, s = np.asarray(ex.meta["A"]), ex.meta["source"]
        assert set(np.unique(A)) <= {0, 1} and np.array_equal(A, A.T)
        pi = ints(ex.final)
        level = csgraph.shortest_path(A, indices=s, unweighted=True)
        for v in range(len(pi)):
            if v == s or np.isinf(level[v]):
                assert pi[v] == v
            else:
                cands = [u for u in range(len(pi)) if A[u, v] and level[u] == level[v] - 1]
                assert pi[v] == min(cands)  # one level closer, and the lowest index of those
        depth = int(level[np.isfinite(level)].max())
        assert len(ex.steps) == max(0, depth - 1)  # one array per level; the last is the final


def clrs_dfs_trace(A: np.ndarray) -> list[list[int]]:
    """CLRS's dfs with its explicit stack (s_prev / s_last) and its probe points, written
    independently of stabray's recursive version."""
    n = A.shape[0]
    color = [0] * n  # 0 white, 1 grey, 2 black
    discovered = [False] * n
    pi = list(range(n))
    s_prev = list(range(n))
    trace = []
    for s in range(n):
        if color[s] != 0:
            continue
        s_last = u = s
        trace.append(list(pi))
        while True:
            if not discovered[u]:
                discovered[u] = True
                color[u] = 1
                trace.append(list(pi))
            for v in range(n):
                if A[u, v] != 0 and color[v] == 0:
                    pi[v] = u
                    color[v] = 1
                    s_prev[v] = s_last
                    s_last = v
                    trace.append(list(pi))
                    break
            if s_last == u:
                color[u] = 2
                trace.append(list(pi))
                if s_prev[u] == u:
                    break
                pr = s_prev[s_last]
                s_prev[s_last] = s_last
                s_last = pr
            u = s_last
    return trace


def recursive_dfs_forest(A: np.ndarray) -> list[int]:
    n = A.shape[0]
    pi, seen = list(range(n)), [False] * n

    def go(u):
        seen[u] = True
        for v in range(n):
            if A[u, v] and not seen[v]:
                pi[v] = u
                go(v)

    for r in range(n):
        if not seen[r]:
            go(r)
    return pi


def test_dfs_is_the_ascending_dfs_forest_with_clrs_probes():
    for ex, size in instances("dfs"):
        A = np.asarray(ex.meta["A"])
        assert ex.meta["source"] is None and "\ns: " not in ex.question
        assert list(ints(ex.final)) == recursive_dfs_forest(A)
        trace = clrs_dfs_trace(A)
        assert len(trace) == 3 * size  # T = 3n
        rendered = ["[" + " ".join(map(str, t)) + "]" for t in trace]
        assert ex.question.endswith(f"initial_trace: {rendered[0]}\ntrace | pi:\n")
        assert list(ex.steps) == rendered[1:-1] and ex.final == rendered[-1]


def test_dfs_forest_is_valid():
    """A property that needs no DFS reference: tree edges are edges, and the tree of each root
    (in index order) is everything reachable from it that no earlier tree holds."""
    for ex, _ in instances("dfs", n=50):
        A = np.asarray(ex.meta["A"])
        pi = ints(ex.final)
        n = len(pi)
        reach = np.isfinite(csgraph.shortest_path(A, directed=True, unweighted=True))  # reach[u, v]

        def root_of(v, pi=pi, A=A):
            while pi[v] != v:
                assert A[pi[v], v] == 1
                v = pi[v]
            return v

        taken = np.zeros(n, dtype=bool)
        for r in range(n):
            if pi[r] != r:
                continue
            tree = np.array([root_of(v) == r for v in range(n)])
            assert not taken[r]
            assert np.array_equal(tree, reach[r] & ~taken)
            taken |= tree
        assert taken.all()


# ---------------------------------------------------------------- LEGO reference


def evaluate_lego(question: str, group: str) -> dict[str, str]:
    """Values of every variable, by evaluating the clauses parsed back from the question."""
    clauses = question.split("clauses: ")[1].split("\n")[0].split("; ")
    const, rel = {}, {}
    for c in clauses:
        if m := re.fullmatch(r"([a-z]) = (\d+)", c):
            const[m[1]] = m[2]
        elif group == "cyclic" and (m := re.fullmatch(r"([a-z]) = ([a-z]) \+ (\d)", c)):
            rel[m[1]] = (m[2], int(m[3]))
        elif group == "symmetry" and (m := re.fullmatch(r"([a-z]) = (\d+) \* ([a-z])", c)):
            rel[m[1]] = (m[3], m[2])
        else:
            raise AssertionError(f"unparsed clause {c!r}")
    assert len(const) == 1
    values = dict(const)
    while len(values) < len(clauses):
        for y, (x, op) in rel.items():
            if x in values and y not in values:
                if group == "cyclic":
                    values[y] = str((int(values[x]) + op) % 6)
                else:  # y(i) = op(x(i)) on one-line notation of 1..d
                    values[y] = "".join(op[int(ch) - 1] for ch in values[x])
    return values


@pytest.mark.parametrize(
    ("name", "params", "digits"),
    [
        ("lego_cyclic", {}, None),
        ("lego_symmetry", {}, "12345"),
        ("lego_symmetry", {"degree": 3}, "123"),
        ("lego_symmetry", {"degree": 7}, "1234567"),
    ],
)
def test_lego_final_equals_direct_evaluation(name, params, digits):
    group = name.split("_")[1]
    for ex, size in instances(name, **params):
        names = parse_vec(ex.question.split("vars: ")[1].split("]")[0] + "]")
        assert names == sorted(names) and len(set(names)) == size and "n" not in names
        values = evaluate_lego(ex.question, group)
        assert parse_vec(ex.final) == [values[v] for v in names]
        # each step reveals exactly one more variable, with its final value
        known = 0
        for step in ex.steps:
            vec = parse_vec(step)
            assert sum(t != "n" for t in vec) == known + 1
            known += 1
            assert all(t == "n" or t == values[v] for t, v in zip(vec, names))
        assert len(ex.steps) == size - 1
        if group == "symmetry":  # every value, and every operation, is a permutation of 1..degree
            assert all(sorted(v) == list(digits) for v in values.values())
            ops = re.findall(r"= (\d+) \*", ex.question)
            assert len(ops) == size - 1 and all(sorted(op) == list(digits) for op in ops)


# ---------------------------------------------------------------- golden text


def test_dijkstra_golden_text():
    ex = draw(get_task("dijkstra"), "test", 8, seed=0, size=4)[7]
    assert ex.question == (
        "dijkstra:\n"
        "s: 3, A: [[0.0 0.0 0.79 0.65], [0.0 0.789 0.36 0.0], [0.79 0.36 0.0 0.0], [0.65 0.0 0.0 0.0]], "
        "initial_trace: [0 1 2 3]\n"
        "trace | pi:\n"
    )
    assert ex.answer == "[3 1 2 3], [3 1 0 3], [3 2 0 3] | [3 2 0 3]\n\n"
    assert ex.question_nohint.endswith("\npi:\n")


def test_lego_golden_text():
    ex = draw(get_task("lego_cyclic"), "test", 1, seed=0, size=4)[0]
    assert ex.question == (
        "lego_cyclic:\nvars: [f i s v], clauses: v = s + 2; i = f + 0; f = 3; s = i + 3\ntrace | values:\n"
    )
    assert ex.answer == "[3 n n n], [3 3 n n], [3 3 0 n] | [3 3 0 2]\n\n"


# ---------------------------------------------------------------- commands


def test_tasks_command_lists_every_task(capsys):
    from stabray.cli import main

    assert main(["tasks", "--n", "5"]) == 0
    out = capsys.readouterr().out
    for name in ALL_TASKS:
        assert f"\n{name}" in "\n" + out
    assert "(alias: prim)" in out and "n_vars" in out and "12" in out


def test_data_command_writes_json_lines(tmp_path, capsys):
    import json

    from stabray.cli import main

    out = tmp_path / "d.jsonl"
    assert main(["data", "prim", "--split", "test_long", "--n", "7", "--out", str(out), "--seed", "3"]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 7 and all(r["meta"]["n"] == 11 for r in recs)
    expected = draw(get_task("mst_prim"), "test_long", 7, seed=3, size=11)
    assert [r["answer"] for r in recs] == [e.answer for e in expected]
    assert set(recs[0]) >= {"question", "steps", "final", "answer"}
    assert main(["data", "lego_cyclic", "--n", "3", "--size", "5", "--out", str(out)]) == 2  # exists: no --force
    assert "--force" in capsys.readouterr().err
    assert main(["data", "lego_cyclic", "--n", "3", "--size", "5", "--out", str(out), "--force"]) == 0
    assert all(len(parse_vec(json.loads(line)["final"])) == 5 for line in out.read_text().splitlines())
    assert main(["data", "dfs", "--param", "n_nodes=1", "--out", str(out), "--force"]) == 2
    assert "n_nodes" in capsys.readouterr().err
