"""Load logged trials into polars frames: one row per trial, and the per-T stability rows.

Two sources follow the same schema (see analysis/README.md): an MLflow experiment (parent run +
one child run per trial) or a Ray Tune experiment directory. Both build plain `TrialRecord`s and
`trials_frame` turns them into one typed frame, so tests can build frames from synthetic records.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

# Metrics logged once at the last epoch; missing ones become null columns.
FINAL_METRICS = [
    "test_acc",  # fraction in [0, 1], in-distribution test set
    "test_long_acc",  # inputs 10% longer
    "test_longer_acc",  # inputs 20% longer
    "loss_gap",  # final-answer loss, self-generated minus correct prefix
    "final_eaf",  # sum_i rho_i^(T) of the final model
    "weight_noise_loss_increase",
    # in-context GD tasks (icl_*; null elsewhere): squared errors at T_max on the test split, the
    # worst step-Jacobian error vs the theory; the per-T curves `<curve>_T<t>` stay in the run's
    # metrics (analysis/icl_figures.py reads them)
    "test_infer_loss",  # ||hat theta_T - theta_T||^2, self-generated iterates vs the GD iterate
    "test_infer_star",  # ||hat theta_T - theta*||^2
    "jac_err_max",  # max over prompts and steps of ||J_{t-1}^(t) - J_theory||
]
# last value kept per trial; val_loss / val_infer_loss: the ICL tasks' teacher-forced (mean over
# steps) and inference (at T_max) squared errors on validation
EPOCH_METRICS = ["train_loss", "val_acc", "eaf", "epoch_time_s", "val_loss", "val_infer_loss"]

# Params with a known type; any other param is inferred (int, else float, else string).
PARAM_TYPES: dict[str, pl.DataType] = {
    "task": pl.Utf8,
    "task_version": pl.Utf8,
    "method": pl.Utf8,
    "model": pl.Utf8,
    "lr": pl.Float64,
    "seed": pl.Int64,
    "lam": pl.Float64,  # compression factor; 1.0 = keep all steps
    "bits": pl.Int64,  # QAT bit-width; 32 = full precision
    "lora_rank": pl.Int64,
    "n_nodes": pl.Int64,
    "latent_steps": pl.Int64,
    "sigma": pl.Float64,
}
# Params left out of `config_key`: trials that differ only in these are seeds of one configuration.
SEED_PARAMS = ("seed",)

META_COLUMNS: dict[str, pl.DataType] = {
    "trial_id": pl.Utf8,
    "run_id": pl.Utf8,  # MLflow child run id; null for a Ray dir
    "status": pl.Utf8,  # FINISHED / FAILED / RUNNING
    "config_key": pl.Utf8,  # all params but the seed, as JSON
    "task": pl.Utf8,
    "method": pl.Utf8,
    "seed": pl.Int64,
    "lam": pl.Float64,
    "bits": pl.Int64,
    **{m: pl.Float64 for m in FINAL_METRICS + EPOCH_METRICS},
    "best_val_acc": pl.Float64,  # max val_acc over epochs
    "best_epoch": pl.Int64,  # 1-based epoch of that max (first one on ties)
    "n_epochs": pl.Int64,
    "eaf_value": pl.Float64,  # final_eaf, else the last per-epoch eaf
}

DECOMP_KEYS = ["T", "loss_gap", "bound", "ratio", "first_order", "second_order", "C1", "C2", "eaf", "sum_eps"]
DECOMP_SCHEMA: dict[str, pl.DataType] = {
    "trial_id": pl.Utf8,
    "run_id": pl.Utf8,
    "config_key": pl.Utf8,
    "task": pl.Utf8,
    "method": pl.Utf8,
    "model": pl.Utf8,
    "seed": pl.Int64,
    "bits": pl.Int64,
    "lam": pl.Float64,
    "T": pl.Int64,
    **{k: pl.Float64 for k in DECOMP_KEYS[1:]},
}


@dataclass
class TrialRecord:
    """One trial as read from a source, before typing."""

    trial_id: str
    params: dict[str, Any]
    metrics: dict[str, float]  # final value of every metric the trial logged
    val_history: list[tuple[int, float]] = field(default_factory=list)  # (epoch, val_acc)
    status: str | None = "FINISHED"
    run_id: str | None = None
    decomposition: list[dict] | None = None  # rows of stability/decomposition.json
    config: dict | None = None  # the trainable's config, when the source holds it


@dataclass
class Loaded:
    trials: pl.DataFrame
    decomposition: pl.DataFrame
    parent_run_id: str | None = None  # the sweep's parent run (MLflow only)
    configs: dict[str, dict] = field(default_factory=dict)  # trial_id -> config (Ray dir only)


# ----------------------------------------------------------------------------------- typing


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and v in ("", "None", "null"))


def _parse(v: Any, dtype: pl.DataType) -> Any:
    if _is_missing(v):
        return None
    try:
        if dtype == pl.Int64:
            f = float(v)
            return int(f) if f.is_integer() else None
        if dtype == pl.Float64:
            return float(v)
    except (TypeError, ValueError):
        return None
    return str(v)


def _infer(values: list[Any]) -> pl.DataType:
    present = [str(v) for v in values if not _is_missing(v)]
    if not present:
        return pl.Utf8
    for dtype, parse in ((pl.Int64, int), (pl.Float64, float)):
        try:
            [parse(v) for v in present]
            return dtype
        except ValueError:
            pass
    return pl.Utf8


def config_key(params: dict[str, Any]) -> str:
    """All params except the seed, as canonical JSON: equal keys = seeds of one configuration."""
    return json.dumps({k: str(v) for k, v in sorted(params.items()) if k not in SEED_PARAMS})


def _best_epoch(history: list[tuple[int, float]]) -> tuple[int | None, float | None]:
    hist = [(e, v) for e, v in history if not _is_missing(v)]
    if not hist:
        return None, None
    epoch, val = max(hist, key=lambda ev: (ev[1], -ev[0]))  # first epoch on ties
    return int(epoch), float(val)


def trials_frame(records: list[TrialRecord]) -> pl.DataFrame:
    """One typed row per trial: meta columns, every param, final metrics, best epoch."""
    param_names = sorted({k for r in records for k in r.params})
    rows: list[dict[str, Any]] = []
    for r in records:
        best_epoch, best_val = _best_epoch(r.val_history)
        m = r.metrics
        row: dict[str, Any] = {
            "trial_id": str(r.trial_id),
            "run_id": r.run_id,
            "status": r.status,
            "config_key": config_key(r.params),
            **{k: m.get(k) for k in FINAL_METRICS + EPOCH_METRICS},
            # the history wins over the logged summary; the summary covers a trial without history
            "best_val_acc": best_val if best_val is not None else m.get("best_val_acc"),
            "best_epoch": best_epoch if best_epoch is not None else m.get("best_epoch"),
            "n_epochs": max((e for e, _ in r.val_history), default=None),
        }
        for k in param_names:
            col = k if k not in META_COLUMNS or k in PARAM_TYPES else f"param_{k}"
            row[col] = r.params.get(k)
        rows.append(row)
    schema = dict(META_COLUMNS)
    for k in param_names:
        col = k if k not in META_COLUMNS or k in PARAM_TYPES else f"param_{k}"
        if col not in schema or k in PARAM_TYPES:
            schema[col] = PARAM_TYPES.get(k) or _infer([r.params.get(k) for r in records])
    data = {c: [_parse(row.get(c), t) for row in rows] for c, t in schema.items() if c != "eaf_value"}
    data["eaf_value"] = [None] * len(rows)
    df = pl.DataFrame(data, schema=schema)
    return df.with_columns(eaf_value=pl.coalesce("final_eaf", "eaf")).sort("trial_id")


def decomposition_frame(records: list[TrialRecord]) -> pl.DataFrame:
    """The per-T rows of every trial that has them, joined with the trial's identity."""
    rows = []
    for r in records:
        rows_in = r.decomposition if isinstance(r.decomposition, list) else []  # anything else: malformed
        for d in (d for d in rows_in if isinstance(d, dict)):
            row = {
                "trial_id": str(r.trial_id),
                "run_id": r.run_id,
                "config_key": config_key(r.params),
                **{k: r.params.get(k) for k in ("task", "method", "model", "seed", "bits", "lam")},
                **{k: d.get(k) for k in DECOMP_KEYS},
            }
            rows.append({c: _parse(row.get(c), t) for c, t in DECOMP_SCHEMA.items()})
    return pl.DataFrame(rows, schema=DECOMP_SCHEMA).sort(["trial_id", "T"])


# ----------------------------------------------------------------------------------- MLflow


def _client(tracking_uri: str | None):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=tracking_uri)


def _search_all(client, experiment_id: str):
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _download_json(client, run_id: str, path: str) -> Any | None:
    """An artifact parsed as JSON, or None when the run has no such artifact."""
    parent = str(Path(path).parent) if "/" in path else None
    try:
        names = {a.path for a in client.list_artifacts(run_id, parent)}
        if path not in names:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            local = client.download_artifacts(run_id, path, tmp)
            return json.loads(Path(local).read_text())
    except Exception as e:  # an unreadable artifact is missing data, not a crash
        print(f"warning: run {run_id}: could not read {path}: {e}")
        return None


def load_mlflow(experiment: str, tracking_uri: str | None = None, *, stability: bool = True) -> Loaded:
    """Read every trial (child run) of the experiment; `stability=False` skips the artifacts."""
    client = _client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        from stabray.errors import UserError

        names = [e.name for e in client.search_experiments()]
        raise UserError(f"no MLflow experiment {experiment!r} at {client.tracking_uri}; available: {names}")
    parent_id, parent_start, records = None, 0, []
    for run in _search_all(client, exp.experiment_id):
        tags = run.data.tags
        role = tags.get("stabray.role")
        if role == "sweep":
            # several parents (e.g. a rerun): keep the oldest, which the sweep itself opened
            if parent_id is None or run.info.start_time < parent_start:
                parent_id, parent_start = run.info.run_id, run.info.start_time
            continue
        if role == "method" or (role != "trial" and "mlflow.parentRunId" not in tags):
            continue  # a multi-method sweep's per-method group run holds no trial
        rid = run.info.run_id
        params = dict(run.data.params)
        for key in ("task", "method"):  # the tags name them too, should a param be missing
            if key not in params and tags.get(f"stabray.{key}"):
                params[key] = tags[f"stabray.{key}"]
        history = [(m.step, m.value) for m in client.get_metric_history(rid, "val_acc")]
        records.append(
            TrialRecord(
                trial_id=tags.get("stabray.trial_id") or rid,
                params=params,
                metrics=dict(run.data.metrics),
                val_history=history,
                status=run.info.status,
                run_id=rid,
                decomposition=_download_json(client, rid, "stability/decomposition.json") if stability else None,
            )
        )
    return Loaded(trials_frame(records), decomposition_frame(records), parent_id)


def load_trial_config(run_id: str, tracking_uri: str | None = None) -> dict | None:
    """The trainable's config dict logged with a trial (`trial_config.json`), or None."""
    return _download_json(_client(tracking_uri), run_id, "trial_config.json")


# ----------------------------------------------------------------------------------- Ray Tune


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            out[f"{prefix}{k}"] = v
    return out


def _read_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a trial killed mid-write leaves a torn last line
                pass
    return out


def load_ray(path: str | Path, experiment: str | None = None) -> Loaded:
    """Read `<path>/<trial dir>/{params.json,result.json}`; `path` may also be the storage root."""
    root = Path(path)
    if not any(root.glob("*/params.json")) and experiment and (root / experiment).is_dir():
        root = root / experiment
    records, configs = [], {}
    for params_file in sorted(root.glob("*/params.json")):
        tdir = params_file.parent
        config = json.loads(params_file.read_text())
        params = _flatten(config)
        from stabray.tune.callbacks import trial_params
        from stabray.tune.trainable import unwrap

        trial_cfg = unwrap(config)  # a grid over whole configs nests them (stabray.tune.trainable.BUNDLE)
        if isinstance(trial_cfg.get("task"), dict) and isinstance(trial_cfg.get("method"), dict):
            # a stabray trainable config: the same flat params the MLflow callback logs (task, method, lam, ...)
            params.update(trial_params(trial_cfg))
        results = _read_results(tdir / "result.json")
        metrics: dict[str, float] = {}
        history = []
        for i, res in enumerate(results, start=1):
            for k, v in res.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and not _is_missing(v):
                    metrics[k] = float(v)
            if not _is_missing(res.get("val_acc")):
                history.append((int(res.get("epoch") or res.get("training_iteration") or i), float(res["val_acc"])))
        trial_id = next((str(r["trial_id"]) for r in results if r.get("trial_id")), tdir.name)
        if (tdir / "error.txt").exists() or (tdir / "error.pkl").exists():
            status = "FAILED"
        elif any(r.get("done") for r in results) or "test_acc" in metrics:
            status = "FINISHED"
        else:
            status = "RUNNING"
        decomp_file = tdir / "stability" / "decomposition.json"
        records.append(
            TrialRecord(
                trial_id=trial_id,
                params=params,
                metrics=metrics,
                val_history=history,
                status=status,
                decomposition=json.loads(decomp_file.read_text()) if decomp_file.exists() else None,
                config=config,
            )
        )
        configs[trial_id] = config
    return Loaded(trials_frame(records), decomposition_frame(records), None, configs)


def load(experiment: str, tracking_uri: str | None = None, ray_dir: str | Path | None = None) -> Loaded:
    """A Ray Tune dir when given, else the MLflow experiment."""
    if ray_dir is not None:
        return load_ray(ray_dir, experiment)
    return load_mlflow(experiment, tracking_uri)
