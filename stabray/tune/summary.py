"""The table printed at the end of a sweep: the best trials, the trivial baselines, where to look."""

from __future__ import annotations

from typing import Any

import polars as pl

from stabray.config import get_path

COLS = [
    "trial_id",
    "method",
    "lam",
    "bits",
    "lr",
    "lora_rank",
    "epochs_run",
    "val_acc",
    "best_val_acc",
    "test_acc",
    "test_long_acc",
    "eaf",
    "final_eaf",
    "loss_gap",
    "status",
]
# The in-context GD tasks (icl_linear, icl_quadratic) predict vectors: no compression / QAT columns,
# and their losses and Jacobian error instead of the final-answer loss gap.
ICL_COLS = [
    "trial_id",
    "lr",
    "epochs_run",
    "val_acc",
    "best_val_acc",
    "test_acc",
    "test_long_acc",
    "val_loss",
    "test_infer_loss",
    "eaf",
    "final_eaf",
    "jac_err_max",
    "status",
]
FLOAT_METRICS = (
    "val_acc",
    "best_val_acc",
    "test_acc",
    "test_long_acc",
    "eaf",
    "final_eaf",
    "loss_gap",
    "val_loss",
    "test_infer_loss",
    "jac_err_max",
)

COLUMNS_NOTE = (
    "columns: val_acc = validation exact match of the final answer at the trial's last epoch "
    "(best_val_acc: best epoch); test_acc / test_long_acc = test split at the default size / 10% larger "
    "inputs (trials that ran every epoch only; ASHA stops the rest early); eaf = error amplification "
    "factor sum_i rho_i^(T) on validation examples (final_eaf: on test); loss_gap = final-answer loss "
    "given the model's own chain minus given the correct chain."
)
ICL_COLUMNS_NOTE = (
    "columns: val_acc = share of validation prompts whose self-generated theta_T is within 5% "
    "(relative L2) of the gradient-descent iterate theta_T, at the trial's last epoch (best_val_acc: "
    "best epoch); test_acc / test_long_acc = the same on the test split at T_max / 10% more GD steps "
    "(trials that ran every epoch only); val_loss = teacher-forced squared error "
    "||f_W(true prefix) - theta_t||^2, mean over steps t; test_infer_loss = ||hat theta_T - "
    "theta_T||^2 with the model's own iterates; eaf = sum_i rho_i^(T) from exact Jacobians on "
    "validation prompts (final_eaf: on test); jac_err_max = max over prompts and steps of "
    "||J_{t-1}^(t) - J_theory|| (spectral norm). Figures 3 / 6: python -m analysis icl-figures."
)


def is_icl(task_name: str) -> bool:
    from stabray.tasks import TASKS
    from stabray.tasks.icl import ICLTask

    return issubclass(TASKS.get(task_name), ICLTask)


def searched_columns(spec) -> dict[str, str]:
    """Searched config paths without a column of their own (e.g. task.params.init_gain) -> column name."""
    from stabray.spec import space_path

    known = {"method.params.lam", "method.params.bits", "train.lr", "model.lora.rank"}
    paths = [space_path(k) for k in (spec.search.space or {})]
    return {p: p.rsplit(".", 1)[-1] for p in paths if p not in known}


def trials_frame(grid, extra: dict[str, str] | None = None) -> pl.DataFrame:
    """One row per trial; `extra` maps further config paths to column names."""
    from stabray.tune.trainable import unwrap

    rows: list[dict[str, Any]] = []
    for r in grid:
        cfg = unwrap(r.config or {})
        m = r.metrics or {}
        mp = cfg.get("method", {}).get("params", {})
        rows.append(
            {
                **{name: get_path(cfg, path) for path, name in (extra or {}).items()},
                "trial_id": m.get("trial_id", ""),
                "method": cfg.get("method", {}).get("name", ""),
                "lam": float(mp.get("lam", 1.0)),
                "bits": int(mp.get("bits", 32)),
                "lr": float(cfg.get("train", {}).get("lr", float("nan"))),
                "lora_rank": (cfg.get("model", {}).get("lora") or {}).get("rank"),
                "epochs_run": m.get("training_iteration"),
                **{k: m.get(k) for k in FLOAT_METRICS},
                "status": "error" if r.error else ("done" if m.get("test_acc") is not None else "stopped"),
            }
        )
    df = pl.DataFrame(rows, schema_overrides={k: pl.Float64 for k in FLOAT_METRICS}, strict=False)
    return df


def print_summary(spec, grid, info: dict[str, Any], wall_s: float) -> pl.DataFrame:
    extra = searched_columns(spec)
    df = trials_frame(grid, extra)
    if df.height:
        df = df.sort(["best_val_acc", "val_acc", "final_eaf"], descending=[True, True, False], nulls_last=True)
    n_err = int((df["status"] == "error").sum()) if df.height else 0
    print(f"\n== sweep {spec.name}: {df.height} trials ({n_err} failed) in {wall_s / 60:.1f} min ==")
    drop = {"lora_rank"} if not spec.model.lora else set()
    if not spec.methods:
        drop.add("method")
    icl = is_icl(spec.task.name)
    cols = ICL_COLS if icl else COLS
    cols = [*cols[:1], *(c for c in extra.values() if c not in cols), *cols[1:]]
    show = df.select([c for c in cols if c in df.columns and c not in drop]).head(10)
    # squared errors of the ICL tasks are far below 1e-3: scientific notation, not 0.000
    show = show.with_columns(
        pl.col(c).map_elements(lambda v: f"{v:.2e}", return_dtype=pl.Utf8)
        for c in ("val_loss", "test_infer_loss")
        if c in show.columns
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
    print(ICL_COLUMNS_NOTE if icl else COLUMNS_NOTE)
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
