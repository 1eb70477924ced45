"""Datasets cached on disk with Hugging Face `datasets`, keyed by everything that determines them:
the task name, its format version, its generator parameters, the split sizes, the seed and
`FORMAT_VERSION` (the layout of the stored records). A changed key is a new directory; nothing is
overwritten in place, so a cached dataset is never half-written (we write to a temporary directory
and rename it).

Each cached dataset holds FINGERPRINT: the sha256 of every split's records. Loading recomputes it
from the records read back; a mismatch (an edited byte), an unreadable file or a missing one is
reported with a one-line warning naming the path, and the splits are generated again and the
cache replaced: a damaged cache is never used. The fingerprint hashes each column's strings as their
lengths and their concatenated UTF-8 (which together determine the column exactly), not a JSON
rendering of them: on long ICL prompts (~15 kB each) encoding JSON took most of a cached load."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from array import array
from pathlib import Path

from stabray.data.splits import eval_splits, make_splits
from stabray.tasks.base import Example, Task

# 2: FINGERPRINT beside the splits; 3: the fingerprint hashes lengths + UTF-8, not JSON; 4: an evaluation
# split shares no question with an earlier one (test none with val: stabray.data.splits)
FORMAT_VERSION = "4"
FINGERPRINT = "stabray_fingerprint.json"
log = logging.getLogger(__name__)


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


def _from_columns(cols: dict[str, list]) -> list[Example]:
    return [
        Example(question=q, steps=tuple(s), final=f, question_nohint=qn, meta=json.loads(m))
        for q, s, f, qn, m in zip(cols["question"], cols["steps"], cols["final"], cols["question_nohint"], cols["meta"])
    ]


def fingerprint(examples: list[Example]) -> str:
    """sha256 of a split's records, exactly as stored (the columns `_to_columns` writes)."""
    return columns_fingerprint(_to_columns(examples))


def columns_fingerprint(cols: dict[str, list]) -> str:
    """sha256 of stored columns: per column (in name order) its name, then for a column of strings
    their lengths (code points, int64) and their concatenated UTF-8; for a column of string lists
    (steps) the list lengths, then the same for all their strings in order. Lengths and
    concatenation together determine the column, so any changed, added, dropped or moved character
    changes the hash; hashing them costs a copy, not a JSON encoding."""
    h = hashlib.sha256()

    def strings(xs: list[str]) -> None:
        h.update(array("q", [len(x) for x in xs]).tobytes())
        h.update("".join(xs).encode("utf-8", "surrogatepass"))

    for name in sorted(cols):
        col = cols[name]
        h.update(f"\0{name}\0{len(col)}\0".encode())
        if col and isinstance(col[0], (list, tuple)):
            h.update(array("q", [len(x) for x in col]).tobytes())
            strings([x for xs in col for x in xs])
        else:
            strings(col)
    return h.hexdigest()


class DamagedCache(Exception):
    """A cached dataset that must not be used; the message says why."""


def read_cached(path: Path, splits: tuple[str, ...]) -> dict[str, list[Example]]:
    """The splits of a cached dataset, verified against its fingerprint; DamagedCache otherwise."""
    import datasets
    import pyarrow

    fp_file = path / FINGERPRINT
    if not fp_file.is_file():
        raise DamagedCache(f"no {FINGERPRINT} (the fingerprint every cached dataset holds)")
    try:
        expected = json.loads(fp_file.read_text())["splits"]
        dd = datasets.load_from_disk(str(path))
        cols = {s: dd[s].to_dict() for s in splits}
    # what datasets / pyarrow / json raise for a truncated, missing or garbled file
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError, pyarrow.ArrowException) as e:
        raise DamagedCache(f"unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    for s in splits:  # the records as read back, before anything is decoded from them
        if expected.get(s) != columns_fingerprint(cols[s]):
            raise DamagedCache(f"split {s!r} does not match its fingerprint in {FINGERPRINT} (edited or damaged)")
    try:
        return {s: _from_columns(cols[s]) for s in splits}
    except (ValueError, TypeError, KeyError) as e:  # intact but not records of this layout
        raise DamagedCache(f"unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def cached_path(
    task: Task,
    sizes: dict[str, int] | None = None,
    seed: int = 0,
    splits: tuple[str, ...] | None = None,
    cache_dir: str | Path | None = None,
) -> Path:
    """The folder `load_splits` with these arguments reads (it may not exist yet)."""
    splits = ("train", *eval_splits(task)) if splits is None else tuple(splits)
    root = Path(cache_dir).absolute() if cache_dir else default_cache_dir()
    return root / cache_key(task, dict(sizes or {}), seed, splits)


def load_splits(
    task: Task,
    sizes: dict[str, int] | None = None,
    seed: int = 0,
    splits: tuple[str, ...] | None = None,
    cache_dir: str | Path | None = None,
) -> dict[str, list[Example]]:
    """The task's splits (None: train and every evaluation split of the task), from the cache when
    present and intact, else generated and cached."""
    splits = ("train", *eval_splits(task)) if splits is None else tuple(splits)
    sizes = dict(sizes or {})
    root = Path(cache_dir).absolute() if cache_dir else default_cache_dir()
    path = cached_path(task, sizes, seed, splits, root)
    damaged = False
    if path.exists():
        try:
            return read_cached(path, splits)
        except DamagedCache as e:
            log.warning("dataset cache %s: %s; generating the splits again", path, e)
            damaged = True
    data = make_splits(task, sizes, seed, splits)
    try:
        _write(root, path, data, replace=damaged)
    except OSError as e:  # the splits are in memory: the run goes on, only the next one generates again
        log.warning("dataset cache %s: could not be written (%s); continuing without it", path, e.strerror or e)
    return data


def _write(root: Path, path: Path, data: dict[str, list[Example]], replace: bool) -> None:
    """Save to a temporary folder, then rename it into place (a damaged copy is moved aside first)."""
    import datasets

    dd = datasets.DatasetDict({s: datasets.Dataset.from_dict(_to_columns(exs)) for s, exs in data.items()})
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    bars = not datasets.are_progress_bars_disabled()
    old = None
    try:
        datasets.disable_progress_bars()  # a tqdm bar per split ("Saving the dataset"): noise in every log
        dd.save_to_disk(str(tmp))
        (tmp / FINGERPRINT).write_text(json.dumps({"splits": {s: fingerprint(exs) for s, exs in data.items()}}))
        if replace:
            old = Path(tempfile.mkdtemp(dir=root, prefix=".damaged-"))
            try:
                os.rename(path, old / "data")
            except FileNotFoundError:  # another process moved it aside first
                pass
        try:
            os.rename(tmp, path)
        except OSError:
            if not (path / FINGERPRINT).exists():  # not another process's identical copy: a real failure
                raise
    finally:
        if bars:
            datasets.enable_progress_bars()
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
