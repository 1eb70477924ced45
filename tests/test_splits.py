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
