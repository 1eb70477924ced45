"""Laptop-scale variants of the task formats: labelled CLRS graphs (`labels: k`) and named LEGO
states (`named_states: true`), each checked against the default rendering of the same draw and
against independent references (shortest-path distances from scipy, a parser of the text)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy.sparse.csgraph import shortest_path

from stabray.data.splits import draw, make_splits
from stabray.tasks import get_task
from stabray.tasks.base import normalize_answer

CLRS = ("dijkstra", "bellman_ford", "mst_prim", "bfs", "dfs")


def parse_labelled(question: str, weighted: bool) -> tuple[list[int], np.ndarray, int | None]:
    """(labels in node order, adjacency matrix, source node index) read back from a labelled question."""
    adj = re.search(r"A: \{(.*)\}, initial_trace", question).group(1)
    rows = re.findall(r"(\d+): \[([^\]]*)\]", adj)
    labels = [int(lab) for lab, _ in rows]
    index = {lab: i for i, lab in enumerate(labels)}
    A = np.zeros((len(labels), len(labels)))
    for i, (_, body) in enumerate(rows):
        for entry in filter(None, body.split(", ")):
            parts = entry.split()
            A[i, index[int(parts[0])]] = float(parts[1]) if weighted else 1
    s = re.search(r"s: (\d+),", question)
    return labels, A, index[int(s.group(1))] if s else None


def named(text: str) -> dict[int, int]:
    """A labelled pi vector `[2:5 5:5]` as {2: 5, 5: 5}."""
    return {int(a): int(b) for a, b in re.findall(r"(\d+):(\d+)", text)}


@pytest.mark.parametrize("name", CLRS)
def test_labelled_variant_is_the_same_graph_and_algorithm(name):
    """Same seed -> the same graph, source and trace as CLRS-Text, renamed by the drawn labels."""
    plain = get_task(name, n_nodes=5, decimals=1)
    lab = get_task(name, n_nodes=5, decimals=1, labels=12)
    for seed in range(30):
        a = plain.sample(np.random.RandomState(seed), 5)
        b = lab.sample(np.random.RandomState(seed), 5)
        labels, A, s = parse_labelled(b.question, lab.weighted)
        assert labels == sorted(labels) and len(set(labels)) == 5 and all(0 <= x < 12 for x in labels)
        assert labels == b.meta["labels"]
        np.testing.assert_array_equal(A, np.asarray(a.meta["A"]))
        assert s == a.meta["source"]
        assert len(b.steps) == len(a.steps)
        for plain_vec, lab_vec in zip((*a.steps, a.final), (*b.steps, b.final)):
            pi = [int(x) for x in plain_vec.strip("[]").split()]
            assert named(lab_vec) == {labels[v]: labels[p] for v, p in enumerate(pi)}
            assert list(named(lab_vec)) == labels  # entries in label order


def test_labelled_dijkstra_answers_are_shortest_path_trees():
    """Independent of our Dijkstra: with scipy's distances d, every reached node v != s has
    d[pi(v)] + A[pi(v), v] == d[v]; unreached nodes and the source point to themselves."""
    task = get_task("dijkstra", n_nodes=6, decimals=1, labels=16)
    for ex in draw(task, "test", 60, 3, 6):
        labels, A, s = parse_labelled(ex.question, weighted=True)
        pi = named(ex.final)
        graph = np.where(np.eye(len(A), dtype=bool), 0, A)  # self-loops never shorten a path
        d = shortest_path(graph, method="D", directed=False, indices=s)
        for v, lab in enumerate(labels):
            p = labels.index(pi[lab])
            if v == s or not np.isfinite(d[v]):
                assert p == v
            else:
                assert d[p] + A[p, v] == pytest.approx(d[v], abs=1e-9)


def test_every_label_of_the_pool_appears_in_small_graphs():
    """The point of the variant: graphs of 3-4 nodes already use every label a 6-node graph needs."""
    task = get_task("dijkstra", n_nodes=4, decimals=1, labels=12, train_sizes=[3, 4], long_sizes=[5, 6])
    train = make_splits(task, {"train": 200, "val": 10, "test": 10}, seed=0)["train"]
    finals = set()
    for ex in train:
        finals.update(named(ex.answer).values())
    assert finals == set(range(12))


@pytest.mark.parametrize("name", ["dijkstra", "dfs"])
def test_labelled_trivial_rules_match_the_plain_ones(name):
    """Each rule is right on a labelled example exactly when it is right on the same plain one."""
    plain = get_task(name, n_nodes=5, decimals=1)
    lab = get_task(name, n_nodes=5, decimals=1, labels=9)
    for seed in range(40):
        a = plain.sample(np.random.RandomState(seed), 5)
        b = lab.sample(np.random.RandomState(seed), 5)
        assert plain.baseline_accuracy([a]) == lab.baseline_accuracy([b])


def test_labelled_cache_key_and_default_unchanged():
    assert "labels" not in get_task("dijkstra").describe()
    assert get_task("dijkstra", labels=12).describe()["labels"] == 12
    a = get_task("dijkstra", n_nodes=4).sample(np.random.RandomState(0), 4)
    assert "A: [[" in a.question and "labels" not in a.meta


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_labels_must_be_a_pool_size(bad):
    from stabray.errors import UserError

    with pytest.raises(UserError, match="labels"):
        get_task("dijkstra", n_nodes=4, labels=bad)


def parse_state(text: str, labels: list[int], decimals: int) -> tuple[list[int], list[int | None], list[bool]]:
    """A written state `[2:5 1.2; 5:5 0.0 *; 9:9]` as (pred, key in units of the last decimal place
    or None when unreached, extracted) by node index."""
    pred, key, done = [], [], []
    entries = text.strip("[]").split("; ")
    assert [int(e.split(":")[0]) for e in entries] == labels  # every node, in label order
    for e in entries:
        head, *rest = e.split()
        pred.append(labels.index(int(head.split(":")[1])))
        key.append(round(float(rest[0]) * 10**decimals) if rest and rest[0] != "*" else None)
        done.append(rest[-1:] == ["*"])
    return pred, key, done


def one_extraction(state, A_units: np.ndarray, prim: bool):
    """The next state from a written one and the graph alone (None when nothing is queued)."""
    pred, key, done = (list(x) for x in state)
    queued = [i for i in range(len(key)) if key[i] is not None and not done[i]]
    if not queued:
        return None
    u = min(queued, key=lambda i: (key[i], i))
    done[u] = True
    for v in np.flatnonzero(A_units[u]):
        new = A_units[u, v] if prim else key[u] + A_units[u, v]
        if not done[v] and (key[v] is None or new < key[v]):
            pred[v], key[v] = u, int(new)
    return pred, key, done


@pytest.mark.parametrize("name", ["dijkstra", "mst_prim"])
def test_distances_variant_each_step_follows_from_the_one_before(name):
    """The point of `distances: true`: every written state is the previous written state plus one
    extraction, computed from the text and the graph alone; the final pi is the state after the
    last extraction, and nothing is left queued."""
    task = get_task(name, n_nodes=6, decimals=1, labels=12, distances=True)
    prim, steps_seen = name == "mst_prim", 0
    for size in (3, 4, 5, 6):
        for ex in draw(task, "test", 40, 1, size):
            labels, A, s = parse_labelled(ex.question, weighted=True)
            units = np.rint(A * 10).astype(int)
            state = parse_state(re.search(r"initial_trace: (\[.*\])\n", ex.question).group(1), labels, 1)
            assert state[1] == [0 if v == s else None for v in range(size)] and not any(state[2])
            for step in ex.steps:
                state = one_extraction(state, units, prim)
                assert parse_state(step, labels, 1) == state, (ex.question, ex.answer)
                steps_seen += 1
            last = one_extraction(state, units, prim)
            assert last is not None and one_extraction(last, units, prim) is None
            assert named(ex.final) == {labels[v]: labels[p] for v, p in enumerate(last[0])}
    assert steps_seen > 200


def test_distances_variant_keys_against_scipy():
    """Independent of the trace: the last written Dijkstra state holds scipy's shortest-path
    distances for every reached node, and Prim's keys add up to scipy's minimum spanning tree of
    the source's component."""
    from scipy.sparse.csgraph import connected_components, minimum_spanning_tree

    for name in ("dijkstra", "mst_prim"):
        task = get_task(name, n_nodes=6, decimals=1, labels=12, distances=True)
        for ex in draw(task, "test", 60, 2, 6):
            labels, A, s = parse_labelled(ex.question, weighted=True)
            text = ex.steps[-1] if ex.steps else re.search(r"initial_trace: (\[.*\])\n", ex.question).group(1)
            _, key, _ = parse_state(text, labels, 1)
            graph = np.where(np.eye(len(A), dtype=bool), 0, A)  # self-loops never shorten a path
            if name == "dijkstra":
                d = shortest_path(graph, method="D", directed=False, indices=s)
                for v in range(len(A)):
                    assert (key[v] is None) == (not np.isfinite(d[v]))
                    if key[v] is not None:
                        assert key[v] / 10 == pytest.approx(d[v], abs=1e-9)
            else:
                _, comp = connected_components(graph, directed=False)
                inside = np.flatnonzero(comp == comp[s])
                mst = minimum_spanning_tree(graph[np.ix_(inside, inside)]).sum()
                assert [v for v in range(len(A)) if key[v] is not None] == inside.tolist()
                assert sum(key[v] for v in inside) / 10 == pytest.approx(mst, abs=1e-9)


def test_distances_variant_keeps_the_answer_and_rules():
    """Same graph, source and labels as the labelled variant; the final pi (and so every trivial
    rule's score) is the same wherever no displayed tie is broken differently by float sums."""
    lab = get_task("dijkstra", n_nodes=5, decimals=1, labels=9)
    dist = get_task("dijkstra", n_nodes=5, decimals=1, labels=9, distances=True)
    same = 0
    for seed in range(60):
        a = lab.sample(np.random.RandomState(seed), 5)
        b = dist.sample(np.random.RandomState(seed), 5)
        assert a.question.split("initial_trace")[0] == b.question.split("initial_trace")[0]
        assert a.meta == b.meta and len(a.steps) == len(b.steps)
        assert lab.baseline_accuracy([a]) == dist.baseline_accuracy([b])
        same += a.final == b.final
    assert same >= 57  # ties of float sums (0.1 + 0.2 vs 0.3) are rare
    assert "distances" not in lab.describe() and dist.describe()["distances"] is True


@pytest.mark.parametrize(
    "params, match",
    [
        ({"name": "dijkstra", "distances": True}, "needs the labelled variant"),
        ({"name": "bfs", "labels": 8, "distances": True}, "not bfs"),
        ({"name": "dijkstra", "labels": 8, "distances": "yes"}, "distances must be true or false"),
    ],
)
def test_distances_bad_input(params, match):
    from stabray.errors import UserError

    with pytest.raises(UserError, match=match):
        get_task(params.pop("name"), n_nodes=4, **params)


@pytest.mark.parametrize("name", ["lego_cyclic", "lego_symmetry"])
def test_named_lego_states_carry_the_same_values(name):
    plain = get_task(name, n_vars=4)
    nm = get_task(name, n_vars=4, named_states=True)
    for seed in range(20):
        a = plain.sample(np.random.RandomState(seed), 4)
        b = nm.sample(np.random.RandomState(seed), 4)
        assert a.question == b.question and len(a.steps) == len(b.steps)
        names = sorted(a.meta["chain"])
        for va, vb in zip((*a.steps, a.final), (*b.steps, b.final)):
            tokens = vb.strip("[]").split()
            assert tokens[0::2] == names and tokens[1::2] == va.strip("[]").split()
        rule = nm.trivial_baselines()["every value = the root's constant"](b)
        assert normalize_answer(rule) == normalize_answer(
            "[" + " ".join(f"{u} {a.meta['values'][0]}" for u in names) + "]"
        )
        assert plain.baseline_accuracy([a]) == nm.baseline_accuracy([b])
    assert "named_states" not in plain.describe() and nm.describe()["named_states"] is True


def resolve_lego(question: str, group: str, name_last: bool = False) -> list[tuple[str, str]]:
    """The chain of (variable, value) read back from a LEGO question's clauses: the root first, then
    each variable whose clause names the one before (an independent solver of the text).
    `name_last`: clauses written `d + 2 = f` (the defined name after the expression)."""
    clauses = re.search(r"clauses: (.*)\n", question).group(1).split("; ")
    root, rules = None, {}
    for c in clauses:
        lhs, rhs = c.split(" = ")
        if name_last:
            lhs, rhs = rhs, lhs
        parts = rhs.split()
        if len(parts) == 1:
            root = (lhs, parts[0])
        elif group == "lego_cyclic":  # "y = x + a"
            rules[parts[0]] = (lhs, lambda v, a=int(parts[2]): str((int(v) + a) % 6))
        else:  # "y = s * x": y(i) = s(x(i))
            rules[parts[2]] = (lhs, lambda v, s=parts[0]: "".join(s[int(d) - 1] for d in v))
    chain = [root]
    while chain[-1][0] in rules:
        name, op = rules[chain[-1][0]]
        chain.append((name, op(chain[-1][1])))
    return chain


@pytest.mark.parametrize("name", ["lego_cyclic", "lego_symmetry"])
@pytest.mark.parametrize("named", [False, True])
def test_delta_trace_resolves_one_variable_per_step(name, named):
    state = get_task(name, n_vars=6, named_states=named)
    delta = get_task(name, n_vars=6, named_states=named, trace="delta")
    for seed in range(20):
        for k in (2, 4, 6):
            a = state.sample(np.random.RandomState(seed), k)
            b = delta.sample(np.random.RandomState(seed), k)
            assert b.question == a.question and b.final == a.final  # the same draw, the same answer
            chain = resolve_lego(b.question, name)
            assert len(chain) == k and list(b.steps) == [f"{v} {x}" for v, x in chain]
            assert len(a.steps) == k - 1
            values = dict(chain)
            names = sorted(values)
            expect = " ".join(f"{u} {values[u]}" if named else values[u] for u in names)
            assert normalize_answer(b.final) == normalize_answer(f"[{expect}]")
            assert delta.baseline_accuracy([b]) == state.baseline_accuracy([a])
            assert b.answer.startswith(", ".join(b.steps) + " | ")
    assert "trace" not in state.describe() and delta.describe()["trace"] == "delta"


@pytest.mark.parametrize("name", ["lego_cyclic", "lego_symmetry"])
def test_delta_op_trace_writes_each_clause_operation_and_applies_it(name):
    """`trace: delta_op` writes, per variable in chain order, its name, its clause's operation read
    back from the question text (`=` for the root) and its value; each value is that operation
    applied to the value one step before (computed here, not by the task), and question, chain and
    answer are the delta trace's on the same draw."""
    extra = {"degree": 3} if name == "lego_symmetry" else {}
    delta = get_task(name, n_vars=6, named_states=True, trace="delta", **extra)
    op = get_task(name, n_vars=6, named_states=True, trace="delta_op", **extra)
    for seed in range(20):
        for k in (2, 4, 6):
            a = delta.sample(np.random.RandomState(seed), k)
            b = op.sample(np.random.RandomState(seed), k)
            assert (b.question, b.final, b.meta) == (a.question, a.final, a.meta)
            clauses = dict(c.split(" = ") for c in re.search(r"clauses: (.*)\n", b.question).group(1).split("; "))
            prev = None
            for step, short in zip(b.steps, a.steps, strict=True):
                var, written, value = step.split()
                assert f"{var} {value}" == short
                rhs = clauses[var].split()
                if prev is None:
                    assert written == "=" and rhs == [value]
                elif name == "lego_cyclic":  # "y = x + a"
                    assert rhs[1:] == ["+", written] and value == str((int(prev) + int(written)) % 6)
                else:  # "y = s * x": y(i) = s(x(i))
                    assert rhs[:2] == [written, "*"] and value == "".join(written[int(d) - 1] for d in prev)
                prev = value
            assert b.answer.startswith(", ".join(b.steps) + " | ")
    assert op.describe()["trace"] == "delta_op"


@pytest.mark.parametrize("name", ["lego_cyclic", "lego_symmetry"])
@pytest.mark.parametrize("trace", ["state", "delta_op"])
def test_name_last_clauses_are_the_same_equations_written_the_other_way(name, trace):
    """`clause: name_last` writes every clause as `d + 2 = f` (the root `1 = d`): the same draw as the
    default, each clause its default clause with the two sides swapped, in the same shown order, so
    an independent resolver reading it that way finds the chain and values the steps and answer hold;
    every clause ends with the name it defines."""
    extra = {"degree": 3} if name == "lego_symmetry" else {}
    first = get_task(name, n_vars=6, named_states=True, trace=trace, **extra)
    last = get_task(name, n_vars=6, named_states=True, trace=trace, clause="name_last", **extra)
    swapped = 0
    for seed in range(20):
        for k in (2, 4, 6):
            a = first.sample(np.random.RandomState(seed), k)
            b = last.sample(np.random.RandomState(seed), k)
            assert (b.steps, b.final, b.meta) == (a.steps, a.final, a.meta)
            head_a, clauses_a = re.search(r"^(.*clauses: )([^\n]*)\n", a.question, re.S).groups()
            head_b, clauses_b = re.search(r"^(.*clauses: )([^\n]*)\n", b.question, re.S).groups()
            assert head_b == head_a and b.question.endswith("trace | values:\n")
            for ca, cb in zip(clauses_a.split("; "), clauses_b.split("; "), strict=True):
                lhs, rhs = ca.split(" = ")
                assert cb == f"{rhs} = {lhs}" and cb.split()[-1] in b.meta["chain"]
                swapped += cb != ca
            chain = resolve_lego(b.question, name, name_last=True)
            assert [v for v, _ in chain] == b.meta["chain"] and [x for _, x in chain] == b.meta["values"]
            assert last.baseline_accuracy([b]) == first.baseline_accuracy([a])
    assert swapped == 20 * (2 + 4 + 6)  # no clause reads the same both ways
    assert "clause" not in first.describe() and last.describe()["clause"] == "name_last"


def test_lego_clause_order_must_be_known():
    from stabray.errors import UserError

    with pytest.raises(UserError, match="clause must be one of name_first, name_last, got 'last'"):
        get_task("lego_cyclic", n_vars=4, clause="last")


def test_lego_trace_must_be_known():
    from stabray.errors import UserError

    with pytest.raises(UserError, match="trace must be one of state, delta, delta_op, got 'deltas'"):
        get_task("lego_cyclic", n_vars=4, trace="deltas")


@pytest.mark.parametrize("name", ["lego_cyclic", "lego_symmetry"])
@pytest.mark.parametrize("named", [False, True])
@pytest.mark.parametrize("trace", ["state", "delta", "delta_op"])
def test_lego_answer_lists_the_chain_in_order_or_its_last_variable(name, named, trace):
    """`answer: chain` lists every variable in the order the clauses resolve them and `answer: last`
    the chain's last variable, both read back from the question by an independent resolver; the
    question and the steps are the default's, and the root-constant rule follows the format."""
    base = get_task(name, n_vars=5, named_states=named, trace=trace)
    forms = {a: get_task(name, n_vars=5, named_states=named, trace=trace, answer=a) for a in ("chain", "last")}
    hits = {a: 0 for a in forms}
    differ = {a: 0 for a in forms}
    for seed in range(20):
        for k in (2, 3, 5):
            ref = base.sample(np.random.RandomState(seed), k)
            chain = resolve_lego(ref.question, name)
            root = chain[0][1]
            for a, task in forms.items():
                ex = task.sample(np.random.RandomState(seed), k)
                assert ex.question == ref.question and ex.steps == ref.steps
                differ[a] += ex.final != ref.final
                entries = chain if a == "chain" else chain[-1:]
                expect = " ".join(f"{v} {x}" if named else x for v, x in entries)
                assert normalize_answer(ex.final) == normalize_answer(f"[{expect}]")
                rule = task.trivial_baselines()["every value = the root's constant"](ex)
                expect_rule = " ".join(f"{v} {root}" if named else root for v, _ in entries)
                assert normalize_answer(rule) == normalize_answer(f"[{expect_rule}]")
                hits[a] += task.is_correct(ex, rule)
    # the answer is not the default's (on most draws: unnamed values can read the same in either order)
    assert min(differ.values()) > 40
    # the last variable equals the root's constant more often than the whole chain does
    assert hits["last"] > hits["chain"]
    assert "answer" not in base.describe() and forms["chain"].describe()["answer"] == "chain"


def test_lego_answer_must_be_known():
    from stabray.errors import UserError

    with pytest.raises(UserError, match="answer must be one of state, chain, last, got 'sorted'"):
        get_task("lego_cyclic", n_vars=4, answer="sorted")
