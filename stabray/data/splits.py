"""Train / validation / test splits and length-generalization splits, with no duplicate questions.

Each split draws from its own RandomState seeded by (seed, split, sizes), so adding a split or
changing a split's size leaves the splits drawn before it (below) unchanged; a later evaluation split
can change where it met a question of the changed one (a test split depends on the validation
split's size: `stabray data --split test` draws the validation split at the size it is given).
A split drawn at a mix of sizes (a task's
`train_sizes`) draws each example's size uniformly from the mix with that same RandomState (the
training split with the task's weights when it has them: `train_size_weights`, or the
`train_size_schedule` entry for epoch 0; a resampled training split takes each epoch's entry).
Evaluation splits are drawn first, in the order `eval_splits` gives (val, test, the length splits):
an example whose question already appears in an earlier evaluation split is redrawn (so test never
shares a question with the validation split selection reads), and a split asked for alone is drawn
after the splits before it, so it is the same list either way. Training examples whose question
appears in any evaluation split are redrawn. (Before data format 4 the evaluation splits were drawn
independently and could share questions: 8 of the default Dijkstra spec's 200 test questions were
validation questions, 34 of BFS's; a split without such a question is drawn as it was.)
"""

from __future__ import annotations

import zlib

import numpy as np

from stabray.errors import UserError
from stabray.progress import counted
from stabray.tasks.base import Example, Task

DEFAULT_SIZES = {"train": 2000, "val": 200, "test": 200}  # the paper's sizes
EVAL_SPLITS = ("val", "test", "test_long", "test_longer")  # the default splits (a task may name others)


def split_seed(seed: int, split: str, size: int | tuple[int, ...]) -> int:
    sizes = [int(s) for s in size] if isinstance(size, (tuple, list)) else [int(size)]
    return int(np.random.SeedSequence([int(seed), zlib.crc32(split.encode()), *sizes]).generate_state(1)[0])


def _size_field(split: str) -> str:
    """The spec field that sets a split's number of examples (a resampled epoch's, `train-epoch<k>`, is
    train_size's; a length split's test_size's)."""
    return "train_size" if split.startswith("train") else "val_size" if split == "val" else "test_size"


def draw(
    task: Task,
    split: str,
    n: int,
    seed: int,
    size: int | tuple[int, ...],
    exclude: set[str] = frozenset(),
    max_tries_factor: int = 50,
    probs: tuple[float, ...] | None = None,
) -> list[Example]:
    """n examples with distinct questions, none in `exclude`. `size` is one size, or a tuple of
    sizes to mix (each example's size drawn uniformly, or with probabilities `probs`, one per size;
    a 1-tuple is the same as its size)."""
    if not isinstance(n, (int, np.integer)) or n <= 0:
        raise UserError(f"split {split!r}: the number of examples must be a positive integer, got {n!r}")
    sizes = tuple(size) if isinstance(size, (tuple, list)) else (size,)
    for s in sizes:
        task.check_size(s)
    if probs is not None and len(probs) != len(sizes):
        raise ValueError(f"draw: {len(probs)} probabilities for {len(sizes)} sizes")
    size = sizes[0] if len(sizes) == 1 else sizes  # a single size keeps its seed (and its examples)
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
                    f"for split {split!r} after {tries} draws (asked for {n}); ask for fewer examples "
                    f"(task.{_size_field(split)}) or larger inputs"
                )
            if len(sizes) == 1:
                pick = sizes[0]
            elif probs is None:
                pick = sizes[rng.randint(len(sizes))]
            else:
                pick = sizes[rng.choice(len(sizes), p=probs)]
            ex = task.sample(rng, pick)
            if ex.question in seen or ex.question in exclude:
                continue
            seen.add(ex.question)
            out.append(ex)
            progress.advance()
    return out


def eval_splits(task: Task) -> tuple[str, ...]:
    """The task's evaluation splits: val, test and its length-generalization splits."""
    return ("val", "test", *task.long_sizes())


def split_size_of(task: Task, split: str) -> int | tuple[int, ...]:
    if split in ("train", "val", "test"):
        return task.in_dist_sizes
    longs = task.long_sizes()
    if split in longs:
        return longs[split]
    raise UserError(f"unknown split {split!r}; known: train, {', '.join(eval_splits(task))}")


def make_splits(
    task: Task, sizes: dict[str, int] | None = None, seed: int = 0, splits: tuple[str, ...] | None = None
) -> dict[str, list[Example]]:
    """All requested splits (None: train and every evaluation split of the task). `sizes` maps
    split -> number of examples (a length-generalization split gets the test split's number)."""
    splits = ("train", *eval_splits(task)) if splits is None else splits
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    out: dict[str, list[Example]] = {}
    eval_questions: set[str] = set()
    order = eval_splits(task)
    wanted = [s for s in splits if s != "train"]
    for s in wanted:
        if s not in order:
            split_size_of(task, s)  # an unknown split: a UserError naming the known ones
    last = max((order.index(s) for s in wanted), default=-1)
    for split in order[: last + 1]:  # every evaluation split up to the last one asked for, in order
        n = sizes.get(split, sizes["test"])
        out[split] = draw(task, split, n, seed, split_size_of(task, split), exclude=eval_questions)
        eval_questions.update(e.question for e in out[split])
    eval_questions = {e.question for s in wanted for e in out[s]}  # what training must not hold
    if "train" in splits:
        out["train"] = draw(
            task, "train", sizes["train"], seed, task.in_dist_sizes, exclude=eval_questions, probs=task.train_size_probs
        )
    return {s: out[s] for s in splits}
