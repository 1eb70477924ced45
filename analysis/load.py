"""Load logged trials into polars frames: one row per trial, and the per-T stability rows.

Two sources give the same frame (the trial record, `stabray.record`): an MLflow experiment (parent
run + one child run per trial, read through `stabray.tracking.Store`) or a Ray Tune experiment
directory. Tests build frames from synthetic `TrialRecord`s with `stabray.record.trials_frame`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from stabray.record import decomposition_frame, is_run_folder, records_from_ray_dir, trials_frame


@dataclass
class Loaded:
    trials: pl.DataFrame
    decomposition: pl.DataFrame
    parent_run_id: str | None = None  # the sweep's parent run (MLflow only)
    configs: dict[str, dict] = field(default_factory=dict)  # trial_id -> config (Ray dir only)
    objectives: str | None = None  # the sweep's "metric:mode,..." (MLflow parent run param), when it recorded one


def load_mlflow(
    experiment: str, tracking_uri: str | None = None, *, stability: bool = True, parents: set[str] | None = None
) -> Loaded:
    """Read every trial (child run) of the experiment, or only those under `parents` (sweep parent and
    method-group run ids); `stability=False` skips the artifacts."""
    from stabray.tracking import Store

    store = Store.existing(tracking_uri, experiment)
    records, parent_id = store.trial_records(stability=stability, parents=parents)
    objectives = store.params(parent_id).get("objectives") if parent_id else None
    return Loaded(trials_frame(records), decomposition_frame(records), parent_id, objectives=objectives)


def load_trial_config(run_id: str, experiment: str, tracking_uri: str | None = None) -> dict | None:
    """The trainable's config dict logged with a trial (`trial_config.json`), or None."""
    from stabray.tracking import Store

    return Store.existing(tracking_uri, experiment).download_json(run_id, "trial_config.json")


def trial_parents(root: Path, experiment: str | None = None) -> list[Path]:
    """The folders whose subfolders are the trials (`<trial>/params.json`) under `root`: `root` itself
    (a run folder), each method's folder of a multi-method run (`<run>/<method>/<trial>`), or, given
    the storage root (`./stabray_runs`) and the sweep's name, those of the newest run
    `<experiment>-<yyyymmdd-hhmmss>` (or a folder named `<experiment>`) that has trials."""
    if any(root.glob("*/params.json")):
        return [root]
    if experiment:
        runs = sorted(d for d in root.iterdir() if d.is_dir() and is_run_of(d.name, experiment))
        for run in reversed(runs):  # names end in the timestamp: the newest last
            if found := trial_parents(run):
                return found
    # a multi-method run: method folders, not other runs (a storage root holding other sweeps)
    return sorted(
        d for d in root.iterdir() if d.is_dir() and not is_run_folder(d.name) and any(d.glob("*/params.json"))
    )


def is_run_of(name: str, experiment: str) -> bool:
    """A run folder of sweep `experiment`: `<experiment>-<yyyymmdd-hhmmss>` (stabray's), or the name alone."""
    return name == experiment or is_run_folder(name, experiment)


def load_ray(path: str | Path, experiment: str | None = None) -> Loaded:
    """Read the trials (`<trial dir>/{params.json,result.json}`) of a Ray Tune run folder, of every
    method of a multi-method run, or of the newest run of `experiment` under the storage root."""
    from stabray.errors import UserError

    root = Path(path)
    if not root.is_dir():
        raise UserError(f"--ray-dir {path}: " + ("a file, not a directory" if root.exists() else "no such directory"))
    parents = trial_parents(root, experiment)
    if not parents:
        raise UserError(
            f"--ray-dir {path}: no Ray Tune trials in it (no <trial>/params.json, nor a run "
            f"{experiment or '<sweep>'}-<yyyymmdd-hhmmss> with them)"
        )
    records = [r for parent in parents for r in records_from_ray_dir(parent)]
    configs = {r.trial_id: r.config for r in records}
    return Loaded(trials_frame(records), decomposition_frame(records), None, configs)


def load(experiment: str, tracking_uri: str | None = None, ray_dir: str | Path | None = None) -> Loaded:
    """A Ray Tune dir when given, else the MLflow experiment."""
    if not isinstance(experiment, str) or not experiment:
        from stabray.errors import UserError

        raise UserError(f"load: experiment must be an experiment's (or a sweep's) name, got {experiment!r}")
    if ray_dir is not None:
        return load_ray(ray_dir, experiment)
    return load_mlflow(experiment, tracking_uri)
