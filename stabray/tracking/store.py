"""A thin layer over `mlflow.MlflowClient`: one experiment per sweep, a parent run per sweep, a
child run per trial (tag `mlflow.parentRunId`), metrics sent with `log_batch` (one request per
result, not one per key).

The default store is a sqlite database at an absolute path (`<cwd>/mlflow.db`): MLflow resolves a
relative sqlite path against each process's working directory, and Ray workers run elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

ROLE, SWEEP, TRIAL_ID = "stabray.role", "stabray.sweep", "stabray.trial_id"
PARENT = "mlflow.parentRunId"


def resolve_tracking_uri(flag: str | None = None, spec: str | None = None, cwd: str | Path | None = None) -> str:
    """--tracking-uri flag, else $MLFLOW_TRACKING_URI, else the spec's, else sqlite at ./mlflow.db."""
    uri = flag or os.environ.get("MLFLOW_TRACKING_URI") or spec
    if not uri:
        return "sqlite:///" + str((Path(cwd or os.getcwd()) / "mlflow.db").absolute())
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///") :]
        uri = "sqlite:///" + str((Path(cwd or os.getcwd()) / rel).absolute())
    elif "://" not in uri:  # a bare path to a database file
        uri = "sqlite:///" + str(Path(uri).absolute())
    return uri


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(float(v)):
            out[k] = float(v)
    return out


class Store:
    """Runs of one experiment in one tracking store."""

    def __init__(self, tracking_uri: str, experiment: str):
        self.uri, self.experiment = tracking_uri, experiment
        self.client = _client(tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        self.experiment_id = exp.experiment_id if exp else self.client.create_experiment(experiment)

    def start_parent(self, sweep: str, run_name: str, spec: dict[str, Any]) -> str:
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={ROLE: "sweep", SWEEP: sweep})
        self.client.log_dict(run.info.run_id, spec, "sweep_spec.json")
        return run.info.run_id

    def start_group(self, parent_id: str, method: str) -> str:
        """A run that groups one method's trials inside a multi-method sweep."""
        run = self.client.create_run(
            self.experiment_id, run_name=method, tags={PARENT: parent_id, ROLE: "method", "stabray.method": method}
        )
        return run.info.run_id

    def start_child(
        self,
        parent_id: str,
        trial_id: str,
        run_name: str,
        params: dict[str, Any],
        tags: dict[str, str],
        config: dict[str, Any],
    ) -> str:
        from mlflow.entities import Param

        run = self.client.create_run(
            self.experiment_id, run_name=run_name, tags={PARENT: parent_id, ROLE: "trial", TRIAL_ID: trial_id, **tags}
        )
        rid = run.info.run_id
        self.client.log_batch(rid, params=[Param(k, str(v)[:6000]) for k, v in params.items() if v is not None])
        self.client.log_dict(rid, config, "trial_config.json")
        return rid

    def log_metrics(self, run_id: str, metrics: dict[str, Any], step: int) -> int:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        ms = [Metric(k, v, now, int(step)) for k, v in _finite(metrics).items()]
        if ms:
            self.client.log_batch(run_id, metrics=ms)
        return len(ms)

    def log_dict(self, run_id: str, obj: Any, path: str) -> None:
        self.client.log_dict(run_id, obj, path)

    def log_text(self, run_id: str, text: str, path: str) -> None:
        self.client.log_text(run_id, text, path)

    def log_figure(self, run_id: str, fig, path: str) -> None:
        self.client.log_figure(run_id, fig, path)

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, value)

    def end(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def children(self, parent_id: str) -> list:
        return self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{PARENT}` = '{parent_id}'", max_results=10000
        )

    def find_child(self, parent_id: str, trial_id: str) -> str | None:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=(f"tags.`{PARENT}` = '{parent_id}' and tags.`{TRIAL_ID}` = '{trial_id}'"),
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def last_step(self, run_id: str, key: str) -> int:
        """The largest step logged for a metric (0 when none)."""
        hist = self.client.get_metric_history(run_id, key)
        return max((m.step for m in hist), default=0)

    def latest_parent(self, sweep: str):
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{ROLE}` = 'sweep' and tags.`{SWEEP}` = '{sweep}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return runs[0] if runs else None


def log_artifacts(
    run_id: str, local_dir: str | Path, artifact_path: str | None = None, tracking_uri: str | None = None
) -> None:
    """Upload a folder's files to a run (stability tables, reports)."""
    _client(resolve_tracking_uri(tracking_uri)).log_artifacts(run_id, str(local_dir), artifact_path)


CHECKPOINT = "stabray.checkpoint"  # tag: the trial's last checkpoint directory


def checkpoint_dir_of(run_id: str, tracking_uri: str | None = None) -> str:
    """The last checkpoint directory a trial's run recorded (the `stability` command's input)."""
    from stabray.errors import UserError

    client = _client(resolve_tracking_uri(tracking_uri))
    try:
        run = client.get_run(run_id)
    except Exception as e:  # noqa: BLE001 - MLflow raises its own exception types per backend
        raise UserError(f"no MLflow run {run_id!r} at {client.tracking_uri}: {e}") from None
    path = run.data.tags.get(CHECKPOINT)
    if not path:
        raise UserError(f"run {run_id} recorded no checkpoint (tag {CHECKPOINT}); is it a stabray trial?")
    if not Path(path).exists():
        raise UserError(
            f"run {run_id}'s checkpoint {path} is not on this machine (copy it here, then pass the directory)"
        )
    return path


def run_artifact_uri(run_id: str, tracking_uri: str | None = None) -> str:
    return _client(resolve_tracking_uri(tracking_uri)).get_run(run_id).info.artifact_uri


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)
