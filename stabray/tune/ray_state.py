"""Whether Ray Tune can restore a run folder, checked before `--resume` calls `Tuner.restore`.

Ray Tune saves its experiment state (the trials and their statuses), its searcher's state and its
callbacks' state as files in the run's folder, and copies them there from the driver one by one,
without write-then-rename. A driver killed during that copy (SIGKILL, a lost head node) leaves one
of them cut short. Ray's restore then fails, and Ray does not stop: it logs the error and starts the
experiment again with the `param_space` it was restored with, which is empty, so every new trial
would run with an empty config.

`damage` reads those files the way Ray's restore will (the newest of each kind, picked by name as Ray
picks it), and tuner.pkl, without running them: the JSON parses and names at least one trial, and
each pickle's opcodes run through to STOP (`pickletools`, which executes nothing). `set_aside` moves a damaged
state into a folder beside the trials, so the sweep can start its trials again while the record of
the interrupted ones is kept.
"""

from __future__ import annotations

import fnmatch
import json
import pickletools
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stabray.tune.storage import Storage

# Ray Tune's state files, by what they hold (the templates of TuneController, SearchGenerator,
# BasicVariantGenerator, Searcher and CallbackList; the `*` is the driver session's start time).
EXPERIMENT = "experiment_state-*.json"
PICKLED = {
    "searcher state": ("search_gen_state-*.json", "basic-variant-state-*.json", "searcher-state-*.pkl"),
    "callback state": ("callback-states-*.pkl",),
}
TUNER = "tuner.pkl"
ASIDE = "damaged-state-"  # + yyyymmdd-hhmmss: a folder of the run holding a state Ray could not read
STUDY = "optuna.db"  # the live Optuna study (beside the state when the results are local)


def _newest(names: list[str], pattern: str) -> str | None:
    found = fnmatch.filter(names, pattern)
    return max(found) if found else None  # Ray's choice: the largest name (the newest session)


def _pickle_problem(data: bytes) -> str | None:
    if not data:
        return "it is empty"
    try:
        for _ in pickletools.genops(data):
            pass
    except Exception as e:  # ValueError: "pickle exhausted before seeing STOP", unknown opcodes
        return f"it is not a whole pickle ({e})"
    return None


def _experiment_problem(data: bytes) -> str | None:
    if not data:
        return "it is empty"
    try:
        state = json.loads(data)
    except ValueError as e:
        return f"it is not whole JSON ({e})"
    trials = state.get("trial_data") if isinstance(state, dict) else None
    if not trials:
        return "it names no trial"
    return None


def damage(storage: Storage, run: str) -> str | None:
    """Why Ray Tune could not restore the run folder `run` (a run, or `run/<method>`), or None when its
    state reads whole. Only for a folder that holds `tuner.pkl` (one that Ray started)."""
    names = storage.files(run)
    problem = _pickle_problem(storage.read_bytes(f"{run}/{TUNER}"))  # written once, when the Tuner starts
    if problem:
        return f"{TUNER}: {problem}"
    newest = _newest(names, EXPERIMENT)
    if newest is None:
        return "Ray Tune saved no experiment state there"
    problem = _experiment_problem(storage.read_bytes(f"{run}/{newest}"))
    if problem:
        return f"{newest}: {problem}"
    for what, patterns in PICKLED.items():
        for pattern in patterns:
            name = _newest(names, pattern)
            if name is None:
                continue
            problem = _pickle_problem(storage.read_bytes(f"{run}/{name}"))
            if problem:
                return f"{name} ({what}): {problem}"
    return None


def set_aside(storage: Storage, run: str) -> str:
    """Move Ray Tune's state files of `run` (every session's, and tuner.pkl) and the local Optuna
    study into `<run>/damaged-state-<now>/`; return that folder's path relative to the storage. The
    trials' folders stay where they are."""
    aside = f"{run}/{ASIDE}{time.strftime('%Y%m%d-%H%M%S')}"
    patterns = (EXPERIMENT, TUNER, *(p for ps in PICKLED.values() for p in ps))
    for name in storage.files(run):
        if any(fnmatch.fnmatch(name, p) for p in patterns):
            storage.move(f"{run}/{name}", f"{aside}/{name}")
    study = storage.local_dir(run) / STUDY
    if study.exists():
        target = storage.local_dir(run) / aside.rsplit("/", 1)[1]
        target.mkdir(parents=True, exist_ok=True)
        study.rename(target / STUDY)
    return aside
