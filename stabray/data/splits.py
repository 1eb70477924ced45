"""Train / validation / test splits and length-generalization splits, with no duplicate questions.

Each split draws from its own RandomState seeded by (seed, split, size), so adding a split or
changing one split's size leaves the others unchanged. Evaluation splits are drawn first; training
examples whose question already appears in any evaluation split at the same size are redrawn.
"""

from __future__ import annotations

import zlib

import numpy as np

from stabray.errors import UserError
from stabray.progress import counted
from stabray.tasks.base import Example, Task

DEFAULT_SIZES = {"train": 2000, "val": 200, "test": 200}  # the paper's sizes
EVAL_SPLITS = ("val", "test", "test_long", "test_longer")


def split_seed(seed: int, split: str, size: int) -> int:
    return int(np.random.SeedSequence([int(seed), zlib.crc32(split.encode()), int(size)]).generate_state(1)[0])


def draw(
    task: Task, split: str, n: int, seed: int, size: int, exclude: set[str] = frozenset(), max_tries_factor: int = 50
) -> list[Example]:
    """n examples with distinct questions, none in `exclude`."""
    if not isinstance(n, (int, np.integer)) or n <= 0:
        raise UserError(f"split {split!r}: the number of examples must be a positive integer, got {n!r}")
    task.check_size(size)
    rng = np.random.RandomState(split_seed(seed, split, size))
    seen: set[str] = set()
    out: list[Example] = []
    tries = 0
    with counted(f"generating {task.name} {split} examples", n) as progress:  # quiet unless it takes seconds
        while len(out) < n:
            tries += 1
            if tries > max_tries_factor * n + 1000:
                raise UserError(
                    f"task {task.name!r} at {task.size_field}={size}: only {len(out)} distinct questions found "
                    f"for split {split!r} after {tries} draws (asked for {n}); ask for fewer examples or larger inputs"
                )
            ex = task.sample(rng, size)
            if ex.question in seen or ex.question in exclude:
                continue
            seen.add(ex.question)
            out.append(ex)
            progress.advance()
    return out


def split_size_of(task: Task, split: str) -> int:
    if split in ("train", "val", "test"):
        return task.size
    longs = task.long_sizes()
    if split in longs:
        return longs[split]
    raise UserError(f"unknown split {split!r}; known: train, val, {', '.join(EVAL_SPLITS[1:])}")


def make_splits(
    task: Task, sizes: dict[str, int] | None = None, seed: int = 0, splits: tuple[str, ...] = ("train", *EVAL_SPLITS)
) -> dict[str, list[Example]]:
    """All requested splits. `sizes` maps split -> number of examples (the eval default for long splits)."""
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    out: dict[str, list[Example]] = {}
    eval_questions: set[str] = set()
    for split in splits:
        if split == "train":
            continue
        n = sizes.get(split, sizes["test"])
        out[split] = draw(task, split, n, seed, split_size_of(task, split))
        eval_questions.update(e.question for e in out[split])
    if "train" in splits:
        out["train"] = draw(task, "train", sizes["train"], seed, task.size, exclude=eval_questions)
    return {s: out[s] for s in splits}
