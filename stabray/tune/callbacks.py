"""A restore-safe MLflow callback (runs on the driver).

Ray's own MLflowLoggerCallback sends one request per metric key and opens duplicate runs after
`Tuner.restore` (it keeps no state). This one keeps {trial_id: run_id} in `get_state()`, which Ray
pickles with the experiment, logs each result with one `log_batch`, and logs only stabray's keys.
"""

from __future__ import annotations

import traceback
from typing import Any

from ray.tune import Callback

from stabray.tracking import Store
from stabray.tracking.store import CHECKPOINT
from stabray.tune.trainable import unwrap

# result keys that are Ray's bookkeeping, not metrics
RAY_KEYS = {
    "training_iteration",
    "time_this_iter_s",
    "time_total_s",
    "timestamp",
    "pid",
    "time_since_restore",
    "iterations_since_restore",
    "timesteps_total",
    "episodes_total",
    "timesteps_since_restore",
    "done",
    "config",
    "trial_id",
    "experiment_id",
    "date",
    "hostname",
    "node_ip",
    "checkpoint_dir_name",
    "should_checkpoint",
    "experiment_tag",
}


def trial_params(config: dict[str, Any]) -> dict[str, Any]:
    """The flat parameters logged for a trial (analysis/ reads these names)."""
    from stabray.tasks import TASKS

    task, method, model, train = config["task"], config["method"], config.get("model", {}), config.get("train", {})
    p: dict[str, Any] = {
        "task": TASKS.canonical(task["name"]),
        "task_version": TASKS.get(task["name"]).version,
        "method": method["name"],
        "model": model.get("pretrained") or f"embedded-{model.get('preset', 'small')}",
        "lr": train.get("lr"),
        "seed": config.get("seed", 0),
        "epochs": train.get("epochs"),
        "batch_size": train.get("batch_size"),
        "train_size": task.get("train_size"),
    }
    if method["name"] in ("sft_cot",):
        p.update(lam=1.0, bits=32)
    p.update(method.get("params", {}))
    p.update(task.get("params", {}))
    if model.get("lora"):
        p["lora_rank"] = model["lora"].get("rank")
    return p


class MLflowTuneCallback(Callback):
    def __init__(self, tracking_uri: str, experiment: str, parent_run_id: str):
        self.tracking_uri, self.experiment, self.parent_run_id = tracking_uri, experiment, parent_run_id
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
            self.runs[trial.trial_id] = self.store.start_child(
                self.parent_run_id,
                trial.trial_id,
                run_name=str(trial),
                params=trial_params(cfg),
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
        metrics = {k: v for k, v in result.items() if k not in RAY_KEYS}
        table = metrics.pop("stability_table", None)
        self.store.log_metrics(rid, metrics, step=step)
        if table:
            log_stability_table(self.store, rid, table)

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        # the latest checkpoint (older ones are deleted: num_to_keep=1), for `stabray stability <run id>`
        self.store.set_tag(self._run_id(trial), CHECKPOINT, checkpoint.path)

    def on_trial_complete(self, iteration, trials, trial, **info):
        rid = self._run_id(trial)
        if trial.trial_id not in self.ended:
            self.store.end(rid, "FINISHED")
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

    store.log_dict(run_id, rows, "stability/decomposition.json")
    store.log_text(run_id, pl.DataFrame(rows).write_csv(), "stability/decomposition.csv")
    try:
        from stabray.stability.plot import plot_bound_vs_T

        fig = plot_bound_vs_T(rows)
        store.log_figure(run_id, fig, "stability/bound_vs_T.png")
    except ImportError:
        pass
