"""A task's generated text is pinned to its `version`.

Cached datasets are keyed by the task's name, `version` and parameters (`stabray.data.cache`), not by
its generator's code. A change to a generator, or to how `make_splits` draws, that alters the text
without bumping `version` (or `cache.FORMAT_VERSION` for a change shared by every task) would let a
cache written before the change be read back as if it were the new data, silently. Each entry below
is the sha256 (first 16 hex digits, `cache.fingerprint`) of a few examples of every split, seed 0,
for one task configuration, recorded with the version it was generated under. When this test fails:
if the text change is intended, bump the task's `version` (or FORMAT_VERSION) and record the new
fingerprint with the new version; if not, the change broke the generator's determinism."""

from __future__ import annotations

import pytest

from stabray.data.cache import FORMAT_VERSION, fingerprint
from stabray.data.splits import make_splits
from stabray.tasks import TASKS, get_task

SIZES = {"train": 4, "val": 2, "test": 2}
# (task, params, task version, cache FORMAT_VERSION, fingerprint of all splits' examples)
PINNED: list[tuple[str, dict, str, str, str]] = [
    ("bellman_ford", {}, "1", "4", "a7e7ff7a8c20944a"),
    ("bfs", {}, "1", "4", "4e2d2659d9cf0e2f"),
    ("binary_tree_path", {}, "1", "4", "32f189b019387a0c"),
    ("countdown", {}, "1", "4", "8868b51b0a9f0aa3"),
    ("dfs", {}, "1", "4", "4570d03ea11211d0"),
    ("dijkstra", {}, "1", "4", "065575dd60e1d840"),
    ("icl_linear", {}, "1", "4", "118ccddd6f9fb892"),
    ("icl_quadratic", {}, "1", "4", "f69db1251e79532a"),
    ("lego_cyclic", {}, "1", "4", "a320c6d79e8d2950"),
    ("lego_symmetry", {}, "1", "4", "551c3ec6975bb884"),
    ("mst_prim", {}, "1", "4", "e6c3772bc90f2962"),
    ("sat3", {}, "1", "4", "9cd54af7c9f1f8f5"),
    ("star_graph", {}, "1", "4", "806271ab2145e488"),
    ("tree_path_backward", {}, "1", "4", "f552dd09cca55c40"),
    ("tree_path_forward", {}, "1", "4", "e207f8f4f73e746e"),
    # the options the laptop calibration profiles and specs use
    (
        "dijkstra",
        {"labels": 12, "decimals": 1, "train_sizes": [3, 4], "train_size_weights": [1, 3], "long_sizes": [5, 6]},
        "1",
        "4",
        "ba1df73471b1771c",
    ),
    ("dijkstra", {"labels": 12, "decimals": 1, "distances": True}, "1", "4", "b294ce157011b9fe"),
    ("lego_cyclic", {"named_states": True, "trace": "delta", "train_sizes": [2, 3]}, "1", "4", "ca15e67f82efa3af"),
    ("lego_cyclic", {"named_states": True, "trace": "delta_op", "train_sizes": [2, 3]}, "1", "4", "6e2a343466919fcb"),
    (
        "lego_cyclic",
        {"named_states": True, "trace": "delta_op", "clause": "name_last", "train_sizes": [2, 3]},
        "1",
        "4",
        "3a519f28387618c4",
    ),
    ("lego_symmetry", {"degree": 3, "named_states": True}, "1", "4", "e4fcd99beaf35760"),
]


def generated_fingerprint(name: str, params: dict) -> str:
    data = make_splits(get_task(name, **params), SIZES, seed=0)
    return fingerprint([e for split in data for e in data[split]])[:16]


def test_every_registered_task_is_pinned():
    assert {entry[0] for entry in PINNED} == set(TASKS.names())


@pytest.mark.parametrize(("name", "params", "version", "fmt", "pinned"), PINNED, ids=[f"{e[0]}-{e[1]}" for e in PINNED])
def test_generated_text_matches_its_version(name, params, version, fmt, pinned):
    task_version = TASKS.get(name).version
    if (task_version, FORMAT_VERSION) != (version, fmt):  # bumped on purpose: the new text needs recording
        pytest.fail(
            f"{name} is at version {task_version} (cache format {FORMAT_VERSION}); PINNED records version {version} "
            f"(format {fmt}): record {generated_fingerprint(name, params)!r} with the new versions"
        )
    got = generated_fingerprint(name, params)
    assert got == pinned, (
        f"{name} {params}: the generated text changed ({got} != {pinned}) while its version stayed {version}; "
        f"caches written before the change would be reused as this data. Bump {TASKS.get(name).__name__}.version "
        "(or stabray.data.cache.FORMAT_VERSION if every task changed) and record the new fingerprint"
    )
