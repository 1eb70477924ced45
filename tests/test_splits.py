"""Splits: the paper's sizes, length-generalization sizes, no duplicate questions, clear errors."""

from __future__ import annotations

import pytest

from stabray.data.splits import DEFAULT_SIZES, EVAL_SPLITS, draw, make_splits
from stabray.errors import UserError
from stabray.tasks import TASKS, get_task

SMALL = {"train": 150, "val": 30, "test": 30}


def assert_no_duplicates(splits):
    for name, exs in splits.items():
        qs = [e.question for e in exs]
        assert len(qs) == len(set(qs)), f"duplicate question within {name}"
    train = {e.question for e in splits.get("train", [])}
    for name in EVAL_SPLITS:
        if name in splits:
            assert not train & {e.question for e in splits[name]}, f"train shares a question with {name}"
    evals = [name for name in splits if name != "train"]
    for i, a in enumerate(evals):  # no evaluation split shares a question with another (test none with val)
        for b in evals[i + 1 :]:
            assert not {e.question for e in splits[a]} & {e.question for e in splits[b]}, f"{a} and {b} share"


def test_default_sizes_and_lengths_dijkstra():
    task = get_task("dijkstra")
    splits = make_splits(task, seed=0)
    assert {k: len(v) for k, v in splits.items()} == {**DEFAULT_SIZES, "test_long": 200, "test_longer": 200}
    assert {k: {e.meta["n"] for e in v} for k, v in splits.items()} == {
        "train": {10},
        "val": {10},
        "test": {10},
        "test_long": {11},
        "test_longer": {12},
    }
    assert_no_duplicates(splits)


@pytest.mark.parametrize(
    "name, sizes",
    [
        ("dijkstra", {"test_long": 11, "test_longer": 12}),
        ("bellman_ford", {"test_long": 11, "test_longer": 12}),
        ("mst_prim", {"test_long": 11, "test_longer": 12}),
        ("bfs", {"test_long": 11, "test_longer": 12}),
        ("dfs", {"test_long": 11, "test_longer": 12}),
        ("lego_cyclic", {"test_long": 9, "test_longer": 10}),
        ("lego_symmetry", {"test_long": 9, "test_longer": 10}),
    ],
)
def test_long_sizes_are_the_papers(name, sizes):
    assert get_task(name).long_sizes() == sizes


@pytest.mark.parametrize("name", TASKS.names())
def test_every_task_splits_without_duplicates(name):
    splits = make_splits(get_task(name), SMALL, seed=1)
    assert [len(splits[s]) for s in ("train", "val", "test", "test_long", "test_longer")] == [150, 30, 30, 30, 30]
    assert_no_duplicates(splits)


@pytest.mark.parametrize("name, param", [("bfs", "n_nodes"), ("lego_cyclic", "n_vars")])
def test_dedup_when_collisions_are_common(name, param):
    # 3 nodes / 2 variables: few distinct questions, so duplicates must actually be redrawn
    task = get_task(name, **{param: 3 if param == "n_nodes" else 2})
    splits = make_splits(task, {"train": 80, "val": 20, "test": 20}, seed=0, splits=("train", "val", "test"))
    assert [len(v) for v in splits.values()] == [80, 20, 20]
    assert_no_duplicates(splits)


def test_test_shares_no_question_with_validation_and_a_split_alone_is_the_same():
    """4-node BFS at the default sizes has few distinct questions: drawn independently, 34 of the 200
    test questions were validation ones. Now each evaluation split redraws a question an earlier one
    holds; a split asked for alone (the driver's validation split, a test split on its own) is the
    list the full draw gives; a split without a collision is the independent draw it was."""
    task = get_task("bfs", n_nodes=4)
    full = make_splits(task, seed=0)
    val = {e.question for e in full["val"]}
    assert not val & {e.question for e in full["test"]}
    independent = draw(task, "test", 200, 0, task.in_dist_sizes)
    assert len(val & {e.question for e in independent}) == 34  # what the old draw held
    for alone in (("val",), ("test",), ("test_longer",), ("train", "test")):
        got = make_splits(task, seed=0, splits=alone)
        assert list(got) == list(alone) and all(got[s] == full[s] for s in alone if s != "train"), alone
    assert full["test_long"] == draw(task, "test_long", 200, 0, 5)  # no collision: as drawn alone


def test_other_length_on_request():
    exs = draw(get_task("bellman_ford"), "test", 5, seed=0, size=15)
    assert {e.meta["n"] for e in exs} == {15}
    exs = draw(get_task("lego_symmetry"), "test", 5, seed=0, size=20)
    assert {e.meta["n"] for e in exs} == {20}


@pytest.mark.parametrize(
    "name, params, word",
    [
        ("dijkstra", {"n_nodes": 1}, "n_nodes"),
        ("dfs", {"n_nodes": 0}, "n_nodes"),
        ("bfs", {"n_nodes": "10"}, "n_nodes"),
        ("mst_prim", {"p": 0.0}, "p"),
        ("lego_cyclic", {"n_vars": 1}, "n_vars"),
        ("lego_symmetry", {"n_vars": 26}, "n_vars"),
        ("lego_symmetry", {"degree": 2}, "degree"),
        ("lego_symmetry", {"degree": 10}, "degree"),
        ("lego_symmetry", {"degree": "3"}, "degree"),
        ("lego_cyclic", {"degree": 3}, "degree"),
        ("dijkstra", {"n_node": 10}, "n_node"),
    ],
)
def test_bad_task_params_name_the_parameter(name, params, word):
    with pytest.raises(UserError, match=rf"\b{word}\b"):
        get_task(name, **params)


@pytest.mark.parametrize("size", [0, -5])
def test_bad_split_size_names_the_split(size):
    with pytest.raises(UserError, match="'val'.*positive"):
        make_splits(get_task("dijkstra"), {"val": size}, seed=0)
    with pytest.raises(UserError, match="'train'.*positive"):
        draw(get_task("lego_cyclic"), "train", size, seed=0, size=8)


def test_bad_length_on_request():
    with pytest.raises(UserError, match="n_nodes"):
        draw(get_task("dijkstra"), "test", 5, seed=0, size=1)


def test_unknown_task_suggests():
    with pytest.raises(UserError, match="did you mean 'dijkstra'"):
        get_task("dijkstr")
    with pytest.raises(UserError, match="unknown task 'nope'"):
        get_task("nope")
    assert get_task("prim").name == "mst_prim"


def test_cached_splits_round_trip(tmp_path):
    from stabray.data.cache import load_splits

    task = get_task("lego_symmetry")
    sizes = {"train": 20, "val": 5, "test": 5}
    first = load_splits(task, sizes, seed=2, cache_dir=tmp_path)
    again = load_splits(task, sizes, seed=2, cache_dir=tmp_path)
    assert first == again and len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize("name", ["icl_quadratic", "dijkstra", "lego_cyclic"])
def test_cached_load_is_a_fresh_generation(tmp_path, monkeypatch, name):
    """What a load from the cache returns equals what generating the splits afresh returns (every
    field of every example of every split), and it came from the cache, not from generating again."""
    import stabray.data.cache as cache

    task = get_task(name)
    sizes = {"train": 24, "val": 6, "test": 6}
    splits = ("train", "val", "test", *task.long_splits(None))
    cache.load_splits(task, sizes, seed=3, splits=splits, cache_dir=tmp_path)  # generate + write
    fresh = make_splits(task, sizes, 3, splits)

    def no_generation(*a, **k):
        raise AssertionError("generated again instead of read from the cache")

    monkeypatch.setattr(cache, "make_splits", no_generation)
    loaded = cache.load_splits(task, sizes, seed=3, splits=splits, cache_dir=tmp_path)
    assert list(loaded) == list(fresh)
    for s in splits:
        assert len(loaded[s]) == len(fresh[s]) > 0
        assert loaded[s] == fresh[s]  # question, steps, final, question_nohint, meta
        assert all(type(a.steps) is tuple and type(a.meta) is dict for a in loaded[s])


def test_fingerprint_sees_where_strings_split():
    """Columns with the same characters split differently into strings (or steps into examples)
    hash differently; the same columns hash the same; a reference sha256 of the layout."""
    import hashlib
    import struct

    from stabray.data.cache import columns_fingerprint

    cols = {"question": ["ab", "c"], "steps": [["x", "yz"], []]}
    assert columns_fingerprint(cols) == columns_fingerprint({k: list(v) for k, v in cols.items()})
    assert columns_fingerprint(cols) != columns_fingerprint({**cols, "question": ["a", "bc"]})
    assert columns_fingerprint(cols) != columns_fingerprint({**cols, "steps": [["x"], ["yz"]]})
    assert columns_fingerprint(cols) != columns_fingerprint({**cols, "steps": [["xy", "z"], []]})
    assert columns_fingerprint(cols) != columns_fingerprint({**cols, "question": ["ab", "d"]})
    h = hashlib.sha256()  # the layout, written out: name, count, lengths (int64), UTF-8
    h.update(b"\0question\x002\0" + struct.pack("=2q", 2, 1) + b"abc")
    h.update(b"\0steps\x002\0" + struct.pack("=2q", 2, 0) + struct.pack("=2q", 1, 2) + b"xyz")
    assert columns_fingerprint(cols) == h.hexdigest()
    assert columns_fingerprint({"q": ["é"]}) != columns_fingerprint({"q": ["e"]})


CACHE_SIZES = {"train": 12, "val": 4, "test": 4}


def _cached(tmp_path):
    """A dijkstra dataset cached under tmp_path, its folder, and the same splits generated afresh."""
    from stabray.data.cache import load_splits

    task = get_task("dijkstra", n_nodes=4, decimals=1)
    splits = ("train", "val", "test")
    load_splits(task, CACHE_SIZES, seed=0, splits=splits, cache_dir=tmp_path)
    (key,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    fresh = make_splits(task, CACHE_SIZES, 0, splits)
    return (lambda: load_splits(task, CACHE_SIZES, seed=0, splits=splits, cache_dir=tmp_path)), key, fresh


def test_edited_byte_in_a_cached_split_is_caught_and_regenerated(tmp_path, caplog):
    import datasets

    load, key, fresh = _cached(tmp_path)
    (arrow,) = (key / "test").glob("*.arrow")
    b = bytearray(arrow.read_bytes())
    i = b.index(b"A: [[") + 5  # the first weight of the first test graph: one digit, same length
    b[i] = ord("7") if b[i] != ord("7") else ord("8")
    arrow.write_bytes(bytes(b))
    edited = datasets.load_from_disk(str(key))["test"]["question"]
    assert edited != [e.question for e in fresh["test"]]  # the edit changed the data itself
    with caplog.at_level("WARNING", logger="stabray.data.cache"):
        got = load()
    assert got == fresh  # regenerated, never the edited copy
    (msg,) = [r.getMessage() for r in caplog.records]
    assert str(key) in msg and "fingerprint" in msg and "\n" not in msg
    caplog.clear()
    with caplog.at_level("WARNING", logger="stabray.data.cache"):
        assert load() == fresh  # the cache was replaced by an intact copy
    assert not caplog.records
    assert [p.name for p in tmp_path.iterdir()] == [key.name]  # no damaged copy or temp folder left


def _truncate_arrow(key):
    (f,) = (key / "test").glob("*.arrow")
    f.write_bytes(f.read_bytes()[:200])


@pytest.mark.parametrize(
    "damage",
    [
        _truncate_arrow,
        lambda key: (key / "test" / "state.json").unlink(),
        lambda key: (key / "dataset_dict.json").write_text("{garbage"),
        lambda key: (key / "stabray_fingerprint.json").unlink(),
    ],
    ids=["truncated_arrow", "no_state_json", "garbage_dataset_dict", "no_fingerprint"],
)
def test_damaged_cache_is_reported_and_regenerated(tmp_path, caplog, damage):
    load, key, fresh = _cached(tmp_path)
    damage(key)
    with caplog.at_level("WARNING", logger="stabray.data.cache"):
        assert load() == fresh
    (msg,) = [r.getMessage() for r in caplog.records]
    assert str(key) in msg and "generating the splits again" in msg


def test_cache_that_cannot_be_written_is_a_warning(tmp_path, caplog):
    from stabray.data.cache import load_splits

    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("")
    task = get_task("dijkstra", n_nodes=4, decimals=1)
    with caplog.at_level("WARNING", logger="stabray.data.cache"):
        got = load_splits(task, CACHE_SIZES, seed=0, splits=("train", "val", "test"), cache_dir=not_a_folder)
    assert got == make_splits(task, CACHE_SIZES, 0, ("train", "val", "test"))
    (msg,) = [r.getMessage() for r in caplog.records]
    assert str(not_a_folder) in msg and "could not be written" in msg
