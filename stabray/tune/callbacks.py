"""A restore-safe MLflow callback (runs on the driver).

Ray's own MLflowLoggerCallback sends one request per metric key and opens duplicate runs after
`Tuner.restore` (it keeps no state). This one keeps {trial_id: run_id} in `get_state()`, which Ray
pickles with the experiment, logs each result with one `log_batch`, and logs only the metrics
declared in `stabray.record` (plus the eq. (4) table as artifacts).
"""

from __future__ import annotations

import traceback
from typing import Any

from ray.tune import Callback

from stabray.config import get_path
from stabray.record import STABILITY_TABLE, is_metric, trial_params, unwrap
from stabray.tracking import Store, ended_status
from stabray.tracking.store import CHECKPOINT


class MLflowTuneCallback(Callback):
    def __init__(self, tracking_uri: str, experiment: str, parent_run_id: str, searched: list[str] = ()):
        self.tracking_uri, self.experiment, self.parent_run_id = tracking_uri, experiment, parent_run_id
        self.searched = list(searched)  # searched config paths: each logged as a param under its last name
        self.runs: dict[str, str] = {}  # trial_id -> MLflow run id
        self.ended: set[str] = set()
        self.logged_step: dict[str, int] = {}  # last epoch logged per trial (not pickled: asked of MLflow)
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.tracking_uri, self.experiment)
        return self._store

    def get_state(self) -> dict[str, Any]:
        return {"runs": dict(self.runs), "ended": set(self.ended)}

    def set_state(self, state: dict[str, Any]) -> None:
        self.runs = dict(state.get("runs", {}))
        self.ended = set(state.get("ended", set()))
        self.logged_step = {}

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_store"] = None  # MLflow clients are not picklable; reconnect lazily
        d["logged_step"] = {}
        return d

    def _run_id(self, trial) -> str:
        if trial.trial_id not in self.runs:
            # After a driver crash the restored state may predate a run we created: look it up first.
            found = self.store.find_child(self.parent_run_id, trial.trial_id)
            if found:
                self.runs[trial.trial_id] = found
                return found
            cfg = unwrap(trial.config)
            params = trial_params(cfg)
            for path in self.searched:  # e.g. task.params.init_gain -> init_gain, unless already there
                params.setdefault(path.rsplit(".", 1)[-1], get_path(cfg, path))
            self.runs[trial.trial_id] = self.store.start_child(
                self.parent_run_id,
                trial.trial_id,
                run_name=str(trial),
                params=params,
                tags={"stabray.task": cfg["task"]["name"], "stabray.method": cfg["method"]["name"]},
                config=cfg,
            )
        return self.runs[trial.trial_id]

    def on_trial_start(self, iteration, trials, trial, **info):
        self._run_id(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        rid = self._run_id(trial)
        step = int(result.get("training_iteration", 0))
        if trial.trial_id not in self.logged_step:  # first result since start or restore: ask MLflow
            self.logged_step[trial.trial_id] = self.store.last_step(rid, "train_loss")
        if step <= self.logged_step[trial.trial_id]:
            return  # a resumed trial re-reporting an epoch already logged before the crash
        self.logged_step[trial.trial_id] = step
        self.store.log_metrics(rid, {k: v for k, v in result.items() if is_metric(k)}, step=step)
        table = result.get(STABILITY_TABLE)
        if table:
            log_stability_table(self.store, rid, table)

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        # the latest checkpoint (older ones are deleted: num_to_keep=1), for `stabray stability <run id>`
        self.store.set_tag(self._run_id(trial), CHECKPOINT, checkpoint.path)

    def on_trial_complete(self, iteration, trials, trial, **info):
        rid = self._run_id(trial)
        if trial.trial_id not in self.ended:
            status, tags = ended_status(trial.last_result or {}, error=False)
            for k, v in tags.items():
                self.store.set_tag(rid, k, v)
            self.store.end(rid, status)
            self.ended.add(trial.trial_id)

    def on_trial_error(self, iteration, trials, trial, **info):
        rid = self._run_id(trial)
        path = getattr(trial, "error_file", None)
        err = _read(path) if path else "trial failed (no error file)"
        self.store.set_tag(rid, "stabray.error", err[-4900:])
        self.store.log_text(rid, err, "error.txt")
        self.store.end(rid, "FAILED")
        self.ended.add(trial.trial_id)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return traceback.format_exc()


def log_stability_table(store: Store, run_id: str, rows: list[dict[str, Any]]) -> None:
    """The eq. (4) table as JSON, CSV and a loss-gap/bound-vs-T plot."""
    import polars as pl

    from stabray.stability.plot import plot_bound_vs_T

    store.log_dict(run_id, rows, "stability/decomposition.json")
    store.log_text(run_id, pl.DataFrame(rows).write_csv(), "stability/decomposition.csv")
    store.log_figure(run_id, plot_bound_vs_T(rows), "stability/bound_vs_T.png")
