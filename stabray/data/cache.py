"""Datasets cached on disk with Hugging Face `datasets`, keyed by everything that determines them:
the task name, its format version, its generator parameters, the split sizes, the seed and
`FORMAT_VERSION` (the layout of the stored records). A changed key is a new directory; nothing is
overwritten in place, so a cached dataset is never half-written (we write to a temporary directory
and rename it)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from stabray.data.splits import EVAL_SPLITS, make_splits
from stabray.tasks.base import Example, Task

FORMAT_VERSION = "1"


def default_cache_dir() -> Path:
    return Path(os.environ.get("STABRAY_CACHE", Path.home() / ".cache" / "stabray" / "datasets")).absolute()


def cache_key(task: Task, sizes: dict[str, int], seed: int, splits: tuple[str, ...]) -> str:
    blob = json.dumps(
        {"format": FORMAT_VERSION, **task.describe(), "sizes": sizes, "seed": seed, "splits": list(splits)},
        sort_keys=True,
    )
    return f"{task.name}-v{task.version}-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def _to_columns(examples: list[Example]) -> dict[str, list]:
    return {
        "question": [e.question for e in examples],
        "steps": [list(e.steps) for e in examples],
        "final": [e.final for e in examples],
        "question_nohint": [e.question_nohint for e in examples],
        "meta": [json.dumps(e.meta) for e in examples],
    }


def _from_dataset(ds) -> list[Example]:
    cols = ds.to_dict()
    return [
        Example(question=q, steps=tuple(s), final=f, question_nohint=qn, meta=json.loads(m))
        for q, s, f, qn, m in zip(cols["question"], cols["steps"], cols["final"], cols["question_nohint"], cols["meta"])
    ]


def load_splits(
    task: Task,
    sizes: dict[str, int] | None = None,
    seed: int = 0,
    splits: tuple[str, ...] = ("train", *EVAL_SPLITS),
    cache_dir: str | Path | None = None,
) -> dict[str, list[Example]]:
    """The task's splits, from the cache when present, else generated and cached."""
    import datasets

    sizes = dict(sizes or {})
    root = Path(cache_dir).absolute() if cache_dir else default_cache_dir()
    path = root / cache_key(task, sizes, seed, splits)
    if path.exists():
        dd = datasets.load_from_disk(str(path))
        return {s: _from_dataset(dd[s]) for s in splits}
    data = make_splits(task, sizes, seed, splits)
    dd = datasets.DatasetDict({s: datasets.Dataset.from_dict(_to_columns(exs)) for s, exs in data.items()})
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    bars = not datasets.are_progress_bars_disabled()
    try:
        datasets.disable_progress_bars()  # a tqdm bar per split ("Saving the dataset"): noise in every log
        dd.save_to_disk(str(tmp))
        try:
            os.rename(tmp, path)
        except OSError:  # another process cached the same key first: theirs is identical
            pass
    finally:
        if bars:
            datasets.enable_progress_bars()
        shutil.rmtree(tmp, ignore_errors=True)
    return data
