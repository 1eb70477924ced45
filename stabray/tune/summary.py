"""The table printed at the end of a sweep: the best trials, the trivial baselines, where to look.

It reads the sweep's trials back from MLflow (`Store.trial_records`), so the closing table shows
exactly what the MLflow UI and `python -m stabray report` show: the same params, metric names and
statuses (stabray.record).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from stabray.record import METRICS, TrialRecord, trials_frame

# Columns of the closing table, after the trial id and the searched params; each is a metric
# declared in stabray.record (its meaning is printed under the table) or a frame column.
TEXT_COLS = ["val_acc", "best_val_acc", "test_acc", "test_long_acc", "eaf", "final_eaf", "loss_gap"]
ICL_COLS = ["val_acc", "best_val_acc", "test_acc", "test_long_acc", "val_loss", "test_infer_loss", "eaf",
            "final_eaf", "jac_err_max"]  # fmt: skip
PARAM_COLS = ["method", "lam", "bits", "lr", "lora_rank"]
SCIENTIFIC = ("val_loss", "test_infer_loss")  # squared errors far below 1e-3: 2.00e-06, not 0.000


def is_icl(task_name: str) -> bool:
    from stabray.tasks import TASKS

    return TASKS.get(task_name).runner == "icl"


def searched_columns(spec) -> list[str]:
    """Columns for searched config paths without a column of their own (e.g. task.params.init_gain
    -> init_gain): the MLflow callback logs each under its last name."""
    from stabray.spec import space_path

    known = {"method.params.lam", "method.params.bits", "train.lr", "model.lora.rank"}
    return [p.rsplit(".", 1)[-1] for p in map(space_path, spec.search.space or {}) if p not in known]


def columns_note(cols: list[str], runner: str) -> str:
    return "columns: " + "; ".join(f"{c} = {METRICS[c].describe(runner)}" for c in cols if c in METRICS) + "."


def print_summary(spec, records: list[TrialRecord], info: dict[str, Any], wall_s: float) -> pl.DataFrame:
    """Print the closing table of a sweep from its trial records; returns the full frame."""
    df = trials_frame(records).rename({"n_epochs": "epochs_run"})
    if df.height:
        df = df.sort(["best_val_acc", "val_acc", "final_eaf"], descending=[True, True, False], nulls_last=True)
    counts = {s: int((df["status"] == s).sum()) for s in ("FINISHED", "STOPPED", "FAILED")} if df.height else {}
    print(
        f"\n== sweep {spec.name}: {df.height} trials ({counts.get('FAILED', 0)} failed), "
        f"{counts.get('FINISHED', 0)} finished, {counts.get('STOPPED', 0)} stopped early, in {wall_s / 60:.1f} min =="
    )
    icl = is_icl(spec.task.name)
    drop = set() if spec.model.lora else {"lora_rank"}
    if not spec.methods:
        drop.add("method")
    params = [] if icl else PARAM_COLS
    metric_cols = ICL_COLS if icl else TEXT_COLS
    extra = [c for c in searched_columns(spec) if c not in params]
    cols = ["trial_id", *extra, *params, "epochs_run", *metric_cols, "status"]
    show = df.select([c for c in cols if c in df.columns and c not in drop]).head(10)
    show = show.with_columns(
        pl.col(c).map_elements(lambda v: f"{v:.2e}", return_dtype=pl.Utf8) for c in SCIENTIFIC if c in show.columns
    )
    with pl.Config(
        tbl_rows=12,
        tbl_cols=24,
        float_precision=3,
        tbl_hide_dataframe_shape=True,
        tbl_hide_column_data_types=True,
        fmt_str_lengths=16,
        tbl_width_chars=250,
        tbl_formatting="ASCII_MARKDOWN",
    ):
        print(show)
    base = baselines(spec)
    if base:
        print("trivial rules on the same test split: " + "; ".join(f"{k}: {v:.3f}" for k, v in base.items()))
    print(columns_note(metric_cols, "icl" if icl else "text"))
    uri = info["tracking_uri"]
    print(f"browse: python -m stabray ui --tracking-uri {uri}   (or: mlflow ui --backend-store-uri {uri})")
    print(f"report: python -m stabray report --experiment {info['experiment']} --tracking-uri {uri}")
    if icl:
        print(
            f"figures 3 / 6 of the best trial: python -m stabray icl-figures --experiment {info['experiment']} "
            f"--tracking-uri {uri}"
        )
    return df


def baselines(spec) -> dict[str, float]:
    from stabray.data.cache import load_splits
    from stabray.tasks import get_task

    task = get_task(spec.task.name, **spec.task.params)
    if not task.trivial_baselines():
        return {}
    c = spec.task
    test = load_splits(
        task,
        {"train": c.train_size, "val": c.val_size, "test": c.test_size},
        seed=c.data_seed,
        splits=("train", "val", "test", *spec.eval.long_splits),
    )["test"]
    return task.baseline_accuracy(test)
