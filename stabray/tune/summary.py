"""The table printed at the end of a sweep: the best trials, the trivial baselines, where to look.

It reads the sweep's trials back from MLflow (`Store.trial_records`), so the closing table shows
exactly what the MLflow UI and `python -m stabray report` show: the same params, metric names and
statuses (stabray.record).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from stabray.pareto import FRONT, front_figure, front_rows, mark_front
from stabray.record import (
    TrialRecord,
    acc_metric,
    describe_metric,
    model_positions,
    model_shape,
    one_per_seed,
    trials_frame,
)

# Columns of the closing table, after the trial id and the searched params; each is a metric
# declared in stabray.record (its meaning is printed under the table) or a frame column.
# "test_long_acc" stands for the task's length-generalization accuracy: test_long_acc (10% larger
# inputs) by default, every test_acc_n<k> when the task gives explicit long_sizes (metric_columns).
TEXT_COLS = ["val_acc", "best_val_acc", "test_acc", "test_long_acc", "val_eaf", "test_eaf", "test_loss_gap"]
ICL_COLS = ["val_acc", "best_val_acc", "test_acc", "test_long_acc", "val_loss", "test_infer_loss", "val_eaf",
            "test_eaf", "jac_err_max"]  # fmt: skip
SCIENTIFIC = ("val_loss", "test_infer_loss")  # squared errors far below 1e-3: 2.00e-06, not 0.000
FLOOR_ROW = "(best trivial rule)"  # the closing table's last row: each accuracy's floor on the same examples
# accuracy column -> the metric holding its floor (the sized ones: trivial_<column>)
FLOORS = {"val_acc": "trivial_val_acc", "best_val_acc": "trivial_val_acc", "test_acc": "trivial_test_acc"}


def is_icl(task_name: str) -> bool:
    from stabray.tasks import TASKS

    return TASKS.get(task_name).runner == "icl"


def searched_columns(spec) -> list[str]:
    """Columns for searched config paths other than lam, bits, lr and lora_rank, which the trial's
    name shows (e.g. task.params.init_gain -> init_gain): the MLflow callback logs each under its
    last name."""
    from stabray.spec import space_path

    known = {"method.params.lam", "method.params.bits", "train.lr", "model.lora.rank"}
    return [p.rsplit(".", 1)[-1] for p in map(space_path, spec.search.space or {}) if p not in known]


def columns_note(cols: list[str], runner: str) -> str:
    return "columns: " + "; ".join(f"{c} = {describe_metric(c, runner)}" for c in cols if describe_metric(c)) + "."


def long_columns(spec) -> list[str]:
    """The length-generalization accuracy columns: test_long_acc (the paper's 10% larger inputs), or
    test_acc_n<k> for every explicit size of the task's long_sizes."""
    from stabray.tasks import get_task

    try:
        task = get_task(spec.task.name, **spec.task.params)
    except Exception:  # noqa: BLE001 - a table of trials whose spec no longer builds: the default column
        return ["test_long_acc"]
    if task.explicit_long_sizes is None:
        return ["test_long_acc"]
    return [acc_metric(s) for s in task.long_splits(spec.eval.long_splits)]


def metric_columns(spec) -> list[str]:
    """The closing table's metric columns for a spec (TEXT_COLS or ICL_COLS, long columns filled in)."""
    cols = ICL_COLS if is_icl(spec.task.name) else TEXT_COLS
    i = cols.index("test_long_acc")
    return [*cols[:i], *long_columns(spec), *cols[i + 1 :]]


def floor_of(column: str) -> str | None:
    """The metric holding an accuracy column's trivial-rule floor (None: the column is no accuracy)."""
    if column in FLOORS:
        return FLOORS[column]
    is_test_acc = column.startswith("test_") and (column.endswith("_acc") or "_acc_n" in column)
    return "trivial_" + column if is_test_acc else None


def closing_table(spec, df: pl.DataFrame, rows: int = 10) -> tuple[pl.DataFrame, list[str]]:
    """The best `rows` trials as shown at the end of a sweep and in the parent run's summary.md: the
    trial's run name (its method and searched values, as in MLflow), searched paths without a place in
    the name's usual set, epochs run, the metrics and the status; then a row FLOOR_ROW with the best
    trivial rule's accuracy under every accuracy column (as the trials logged it, trivial_<metric>).
    A multi-objective sweep also shows each objective and a `front` column (* = on the Pareto front).
    Returns (table, metric columns)."""
    metric_cols = metric_columns(spec)
    metric_cols = metric_cols + [m for m, _ in spec.search.objectives() if m not in metric_cols]
    cols = ["name", "front", *searched_columns(spec), "epochs_run", *metric_cols, "status"]
    show = df.select([c for c in cols if c in df.columns]).head(rows).rename({"name": "trial"})
    floor = {}
    for c in metric_cols:
        f = floor_of(c)
        if c in show.columns and f in df.columns and df[f].drop_nulls().len():
            floor[c] = df[f].drop_nulls()[0]  # every trial of a sweep shares the evaluation examples
    if floor and show.height:
        row = {c: floor.get(c) for c in show.columns}
        row["trial"] = FLOOR_ROW
        show = pl.concat([show, pl.DataFrame([row], schema=show.schema)], how="vertical")
    show = show.with_columns(
        pl.col(c).map_elements(lambda v: f"{v:.2e}", return_dtype=pl.Utf8) for c in SCIENTIFIC if c in show.columns
    )
    return show, metric_cols


def method_table(spec, df: pl.DataFrame) -> pl.DataFrame:
    """A multi-method sweep side by side: per method (and configuration, when a method ran several),
    mean ± sample std over its finished trials (the seeds, each counted once) of every accuracy column, n, and a last
    row with the best trivial rule's accuracy on the same examples. Empty for a one-method sweep."""
    if not spec.methods or not df.height:
        return pl.DataFrame()
    accs = [c for c in metric_columns(spec) if c.startswith("test_") and floor_of(c) and c in df.columns]
    done = df.filter(pl.col("status") == "FINISHED")
    if not done.height:
        return pl.DataFrame()
    done = one_per_seed(done)  # a seed drawn twice for one configuration is one sample (as in analysis/)
    order = [m.method.name for m in _method_specs(spec)]
    groups = done.group_by(["method", "config_key"], maintain_order=True).agg(
        pl.len().alias("n"),
        *(pl.col(c).mean().alias(f"{c}_mean") for c in accs),
        *(pl.col(c).std(ddof=1).alias(f"{c}_std") for c in accs),
    )
    groups = groups.sort(pl.col("method").replace_strict(order, list(range(len(order))), default=len(order)))

    def pm(mean, std) -> str:
        if mean is None:
            return "-"
        return f"{mean:.3f} ± {std:.3f}" if std is not None else f"{mean:.3f}"

    rows = [
        {"method": g["method"], "n": str(g["n"]), **{c: pm(g[f"{c}_mean"], g[f"{c}_std"]) for c in accs}}
        for g in groups.iter_rows(named=True)
    ]
    floor = {c: done[floor_of(c)].drop_nulls() for c in accs if floor_of(c) in done.columns}
    if any(len(v) for v in floor.values()):
        rows.append({"method": FLOOR_ROW, "n": "", **{c: f"{v[0]:.3f}" if len(v) else "-" for c, v in floor.items()}})
    return pl.DataFrame(rows, schema={"method": pl.Utf8, "n": pl.Utf8, **{c: pl.Utf8 for c in accs}})


def sorted_trials(records: list[TrialRecord], spec=None) -> pl.DataFrame:
    """Every trial, best first (best_val_acc, then val_acc, then the lower final EAF). For a
    multi-objective sweep the Pareto front's members come first, marked "*" in a `front` column."""
    df = trials_frame(records).rename({"n_epochs": "epochs_run"})
    if df.height:
        df = df.sort(["best_val_acc", "val_acc", "test_eaf"], descending=[True, True, False], nulls_last=True)
    if spec is not None and spec.search.multi and df.height:
        df = mark_front(df, spec.search.objectives())
        df = df.sort(FRONT, descending=True, maintain_order=True).with_columns(
            front=pl.when(pl.col(FRONT)).then(pl.lit("*")).otherwise(pl.lit(""))
        )
    return df


def status_counts(df: pl.DataFrame) -> dict[str, int]:
    return {s: int((df["status"] == s).sum()) if df.height else 0 for s in ("FINISHED", "STOPPED", "FAILED")}


def objectives_text(spec) -> str:
    """The objectives in words, like "val_acc (max), val_eaf (min)"."""
    return ", ".join(f"{m} ({mode})" for m, mode in spec.search.objectives())


def headline(spec, df: pl.DataFrame, wall_s: float | None = None) -> str:
    c = status_counts(df)
    return (
        f"sweep {spec.name}: {df.height} trials ({c['FAILED']} failed), {c['FINISHED']} finished, "
        f"{c['STOPPED']} stopped early" + (f", in {wall_s / 60:.1f} min" if wall_s is not None else "")
    )


TABLE_STYLE = dict(
    tbl_rows=12,
    tbl_cols=24,
    float_precision=3,
    tbl_hide_dataframe_shape=True,
    tbl_hide_column_data_types=True,
    fmt_str_lengths=40,
    tbl_width_chars=250,
    tbl_formatting="ASCII_MARKDOWN",
)


def print_summary(spec, records: list[TrialRecord], info: dict[str, Any], wall_s: float) -> pl.DataFrame:
    """Print the closing table of a sweep from its trial records; returns the full frame."""
    df = sorted_trials(records, spec)
    print(f"\n== {headline(spec, df, wall_s)} ==")
    icl = is_icl(spec.task.name)
    show, metric_cols = closing_table(spec, df)
    print(console_table(show))
    side = method_table(spec, df)
    if side.height:
        print("\nper method, mean ± sample std over its finished trials (n), against the best trivial rule:")
        print(console_table(side))
    base = baselines(spec)
    if base:
        print(wrap(baselines_text(base)))
    print(wrap(columns_note(metric_cols, "icl" if icl else "text")))
    if spec.search.multi:
        n_front = int(df[FRONT].sum()) if FRONT in df.columns else 0
        print(wrap(f"front: * = on the Pareto front of {objectives_text(spec)} ({n_front} of {df.height} trials)."))
    uri = info["tracking_uri"]
    print(f"browse: python -m stabray ui --tracking-uri {uri}")
    print(f"report: python -m stabray report --experiment {info['experiment']} --tracking-uri {uri}")
    if icl:
        print(
            f"figures 3 / 6 of the best trial: python -m stabray icl-figures --experiment {info['experiment']} "
            f"--tracking-uri {uri}"
        )
    return df


def console_table(show: pl.DataFrame) -> str:
    """The closing table as plain text: no borders, one space between columns, numbers right-aligned
    with 3 decimals, so ten columns fit in 120 characters."""
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, padding=(0, 1), collapse_padding=True, pad_edge=False, show_edge=False)
    for name, dtype in show.schema.items():
        table.add_column(name, justify="right" if dtype.is_numeric() else "left", no_wrap=True)
    for row in show.iter_rows():
        table.add_row(*("-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v) for v in row))
    out = io.StringIO()
    Console(file=out, width=400, color_system=None, highlight=False).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def wrap(text: str, width: int = 120) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False))


def baselines(spec) -> dict[str, dict[str, float]]:
    """Each trivial rule's accuracy on each test split of the sweep (the examples its trials were
    evaluated on): {split: {rule: accuracy}}; empty when the task names no rule."""
    from stabray.data.cache import load_splits
    from stabray.tasks import get_task

    task = get_task(spec.task.name, **spec.task.params)
    if not task.trivial_baselines():
        return {}
    c = spec.task
    longs = task.long_splits(spec.eval.long_splits)
    data = load_splits(
        task,
        {"train": c.train_size, "val": c.val_size, "test": c.test_size},
        seed=c.data_seed,
        splits=("train", "val", "test", *longs),
    )
    return {s: task.baseline_accuracy(data[s]) for s in ("test", *longs)}


def baselines_text(base: dict[str, dict[str, float]]) -> str:
    """One line: every trivial rule's accuracy on every test split, by the split's accuracy metric."""
    return "trivial rules (no learning) on the same examples: " + "; ".join(
        f"{acc_metric(split)}: " + ", ".join(f"{rule} {v:.3f}" for rule, v in rules.items())
        for split, rules in base.items()
    )


# ----------------------------------------------------------------------------------- the parent run


def _dist_text(dist) -> str:
    kind = dist.kind()
    v = getattr(dist, kind)
    return f"{kind} {', '.join(map(str, v))}" if kind == "choice" else f"{kind} [{v[0]}, {v[1]}]"


def searched_names(spec) -> list[str]:
    """The param names the searched paths are logged under (lam, bits, lr, init_gain, ...)."""
    from stabray.spec import space_path

    out = []
    for sub_spec in _method_specs(spec):
        for key in sub_spec.search.space:
            name = space_path(key).rsplit(".", 1)[-1]
            name = {"rank": "lora_rank"}.get(name, name)
            if name not in out:
                out.append(name)
    return out


# Parent params derived from another field: searching the field varies them too (`model.preset` sets the
# model's name and shape; `model.positions` decides whether the span and stride are logged at all).
DERIVED_PARAMS = {
    "preset": ("model", "hidden_size", "num_layers"),
    "pretrained": ("model", "hidden_size", "num_layers"),
    "positions": ("position_span", "position_eval_stride"),
}


def derived_names(spec) -> list[str]:
    """The parent params derived from a searched field (see DERIVED_PARAMS): the spec's value of each
    is no trial's, so the parent leaves them out at the start and logs the best trial's at the end."""
    searched = searched_names(spec)
    out: list[str] = []
    for name in searched:
        out += [d for d in DERIVED_PARAMS.get(name, ()) if d not in searched and d not in out]
    return out


def _method_specs(spec) -> list:
    from stabray.spec import method_specs

    return [s for _, s in method_specs(spec)]


def sweep_params(spec) -> dict[str, Any]:
    """The parent run's params at the start: what the sweep studies and how it searches. A field the
    search varies (task.params.n_nodes, model.position_eval_stride, ...) is left out: its spec value is
    no trial's, and at the end the parent logs the best trial's value under that name (MLflow keeps a
    param's first value, so logging the spec's value here would refuse the best one). So is a param
    derived from a searched field (`derived_names`: searching `model.preset` leaves out `model`,
    `hidden_size` and `num_layers`)."""
    s = spec.search
    p: dict[str, Any] = {
        "task": spec.task.name,
        **{k: v for k, v in spec.task.params.items()},
        "model": spec.model.pretrained or f"embedded-{spec.model.preset}",
        **model_shape(spec.model.model_dump()),
        **model_positions(spec.model.model_dump()),
        "epochs": spec.train.epochs,
        "num_samples": s.num_samples,
        "searcher": s.searcher,
        "scheduler": s.scheduler
        if s.scheduler != "asha"
        else f"asha (grace {s.grace_period}, rf {s.reduction_factor})",
        # one "metric:mode" per objective: `python -m stabray report` reads the front's objectives here
        "objectives": ",".join(f"{m}:{mode}" for m, mode in s.objectives()),
    }
    if s.searcher == "optuna":
        p["sampler"] = s.sampler or ("nsga2" if s.multi else "tpe")
    if s.eaf_stop is not None:
        e = s.eaf_stop
        p["eaf_stop"] = f"factor {e.factor:g}, top {e.top_fraction:g}, grace {e.grace}, min_trials {e.min_trials}"
    if s.stop_if:
        p["stop_if"] = "; ".join(r.describe() for r in s.stop_if)
    if spec.methods:
        p["methods"] = ", ".join(m.method.name for m in _method_specs(spec))
    else:
        p["method"] = spec.method.name
    for sub_spec in _method_specs(spec):
        for key, dist in sub_spec.search.space.items():
            prefix = f"space.{sub_spec.method.name}." if spec.methods else "space."
            p[prefix + key] = _dist_text(dist)
    searched = set(searched_names(spec)) | set(derived_names(spec))
    return {k: v for k, v in p.items() if k not in searched}


def sweep_description(spec) -> str:
    """The parent run's description (Markdown): what the sweep studies, which columns matter."""
    runner = "icl" if is_icl(spec.task.name) else "text"
    methods = ", ".join(s.method.name for s in _method_specs(spec))
    s = spec.search
    stop = (
        f"ASHA may stop a weak trial once it has run {s.grace_period} epoch{'s' if s.grace_period != 1 else ''} "
        f"(reduction factor {s.reduction_factor})"
        if s.scheduler == "asha"
        else "every trial runs all epochs"
        if s.eaf_stop is None and not s.stop_if
        else "no scheduler stops trials"
    )
    if s.eaf_stop is not None:
        from stabray.tune.eaf_stop import EafStopper

        stop += "; " + EafStopper.from_cfg(s.eaf_stop).describe()
    if s.stop_if:
        from stabray.tune.stop_rules import RuleStopper

        stop += "; " + RuleStopper(s.stop_if).describe()
    goal = f"the Pareto front of {objectives_text(spec)}" if s.multi else f"the best `{s.metric}` ({s.mode})"
    metric_cols = metric_columns(spec)
    lines = [
        f"**Sweep `{spec.name}`**: {methods} on `{spec.task.name}` "
        f"({', '.join(f'{k}={v}' for k, v in spec.task.params.items()) or 'default size'}), "
        f"{s.n_trials} trials of up to {spec.train.epochs} epochs; {s.searcher} searches "
        f"{', '.join(searched_names(spec)) or 'nothing'} for {goal}; {stop}.",
        "",
        "Each child run is one trial, named after its method and searched values (`alg1-lam0.2-b4-lr0.0031-s0`: "
        "λ 0.2, 4 bits, lr 0.0031, seed 0). A trial stopped early (ASHA, the EAF rule or a search.stop_if "
        "rule) shows *Finished* in MLflow's status column with the tags `stabray.status` = STOPPED, "
        "`stabray.stopped_at_epoch` and `stabray.stopped_by`; it has no test metrics.",
        "",
        "Columns that matter: " + "; ".join(f"`{c}`: {describe_metric(c, runner)}" for c in metric_cols) + ". "
        "Timings and placement are the `sys/` metrics.",
        "",
        "When the sweep ends, this run's own params and metrics are those of the best trial (highest "
        "`best_val_acc`), and it holds `summary.md` (the best trials), `plots/val_acc_per_epoch.png`, "
        "`plots/accuracy_vs_eaf.png` and `sweep_spec.json`"
        + (
            ", and the Pareto front: `pareto/front.md`, `pareto/front.csv`, `plots/pareto_front.png`."
            if s.multi
            else "."
        ),
    ]
    return "\n".join(lines)


def with_floors(metric_cols: list[str]) -> list[str]:
    """The metric columns with each accuracy's trivial-rule floor (`floor_of`) right after it, once:
    val_acc, best_val_acc, trivial_val_acc, test_acc, trivial_test_acc, test_acc_n5, ..."""
    out: list[str] = []
    for i, m in enumerate(metric_cols):
        out.append(m)
        f = floor_of(m)
        nxt = floor_of(metric_cols[i + 1]) if i + 1 < len(metric_cols) else None
        if f is not None and f != nxt and f not in out:
            out.append(f)
    return out


def view_columns(spec) -> list[str]:
    """The runs-table columns the sweep is read in (the `stabray ui` link): searched params, then the
    metrics of the closing table, each accuracy with its trivial-rule floor beside it, then the status
    tag. No floor columns for a task without trivial rules (they would stay empty)."""
    from stabray.tasks import get_task

    metric_cols = metric_columns(spec)
    if get_task(spec.task.name, **spec.task.params).trivial_baselines():
        metric_cols = with_floors(metric_cols)
    cols = [f"params.{n}" for n in searched_names(spec)]
    if spec.methods:
        cols.insert(0, "params.method")
    return (
        cols
        + [f"metrics.{m}" for m in metric_cols]
        + ["tags.stabray.status", "tags.stabray.stopped_at_epoch", "tags.stabray.stopped_by"]
    )


def view_order(spec) -> tuple[str, bool]:
    """The runs-table column the sweep's view is sorted by, best first: its primary objective, and
    whether that is ascending (a metric minimized, e.g. `val_eaf`)."""
    metric, mode = spec.search.objectives()[0]
    return f"metrics.{metric}", mode == "min"


def summary_markdown(spec, df: pl.DataFrame, wall_s: float | None = None) -> str:
    runner = "icl" if is_icl(spec.task.name) else "text"
    show, metric_cols = closing_table(spec, df, rows=50)
    with pl.Config(**{**TABLE_STYLE, "tbl_rows": 60}):
        table = str(show)
    base = baselines(spec)
    lines = [f"# {headline(spec, df, wall_s)}", "", table, ""]
    side = method_table(spec, df)
    if side.height:
        with pl.Config(**TABLE_STYLE):
            lines += ["Per method, mean ± sample std over its finished trials (n):", "", str(side), ""]
    if base:
        lines += [baselines_text(base)[0].upper() + baselines_text(base)[1:], ""]
    lines += [
        "Columns: " + "; ".join(f"`{c}`: {describe_metric(c, runner)}" for c in metric_cols if describe_metric(c))
    ]
    if spec.search.multi:
        lines += ["", f"`front`: * = on the Pareto front of {objectives_text(spec)}."]
    return "\n".join(lines) + "\n"


def trial_line(row: dict[str, Any], metric_cols: list[str]) -> str:
    """One trial in a sentence: name, its numbers, how it ended."""
    numbers = ", ".join(f"{m} {row[m]:.3f}" for m in metric_cols if isinstance(row.get(m), float))
    ended = {
        "FINISHED": f"finished {row.get('epochs_run')} epochs",
        "STOPPED": f"stopped early after epoch {row.get('epochs_run')}",
    }.get(row.get("status"), str(row.get("status")).lower())
    return f"`{row['name']}`: {numbers} ({ended})"


def log_sweep_summary(store, parent_run_id: str, spec, records: list[TrialRecord], wall_s: float | None = None):
    """Write the end of a sweep into its parent run: the best trial's params and metrics, summary.md,
    the two sweep plots and a description with the outcome. Returns the best trial's row (or None)."""
    from stabray.tune import plots

    df = sorted_trials(records)  # the best trial: highest best_val_acc, whatever the objectives
    if not df.height:
        return None
    best = df.row(0, named=True)
    if spec.search.multi:
        log_pareto(store, parent_run_id, spec, df)
    metric_cols = metric_columns(spec)
    names = searched_names(spec) + derived_names(spec)
    params = {n: best.get(n) for n in names if best.get(n) is not None}
    if spec.methods:
        params["method"] = best.get("method")
    try:
        store.log_params(parent_run_id, params)
    except Exception as e:  # noqa: BLE001 - e.g. a resumed sweep whose best trial changed: keep going
        print(f"stabray: the parent run keeps its earlier best params ({type(e).__name__})")
    shown = {m: float(f"{best[m]:.4g}") for m in with_floors(metric_cols) if isinstance(best.get(m), float)}
    store.log_metrics(parent_run_id, shown, step=0)  # a summary, each accuracy with its floor
    store.set_tag(parent_run_id, "stabray.best_run_id", str(best.get("run_id")))
    store.set_tag(parent_run_id, "stabray.best_trial", str(best.get("name")))
    md = summary_markdown(spec, sorted_trials(records, spec), wall_s)  # front members first, marked
    store.log_text(parent_run_id, md, "summary.md")
    by_id = {r.run_id: r for r in records}
    trials = [
        {"name": row["name"], "status": row["status"], "history": sorted(by_id[row["run_id"]].val_history)}
        for row in df.iter_rows(named=True)
        if row["run_id"] in by_id
    ]
    points = []
    for row in df.iter_rows(named=True):
        finished = row["status"] == "FINISHED" and row.get("test_acc") is not None
        points.append(
            {
                "acc": row.get("test_acc") if finished else row.get("best_val_acc"),
                "eaf": row.get("test_eaf") if finished and row.get("test_eaf") is not None else row.get("val_eaf"),
                "status": row["status"] or "FINISHED",
                "label": row["name"],
            }
        )
    for fig, path in (
        (plots.sweep_val_acc(trials, spec.train.epochs), "plots/val_acc_per_epoch.png"),
        (plots.accuracy_vs_eaf(points), "plots/accuracy_vs_eaf.png"),
    ):
        store.log_figure(parent_run_id, fig, path)
        plots.close(fig)
    best_numbers = ", ".join(f"`{m}` {best[m]:.3f}" for m in metric_cols if isinstance(best.get(m), float))
    top = [f"- {trial_line(row, metric_cols)}" for row in df.head(5).iter_rows(named=True)]
    store.set_description(  # the outcome first: the run page shows the first lines of a description
        parent_run_id,
        f"**Result**: {headline(spec, df, wall_s)}. Best trial: **{best['name']}** ({best_numbers}).\n\n"
        + "Best trials (all of them in `summary.md`):\n\n"
        + "\n".join(top)
        + "\n\n"
        + sweep_description(spec),
    )
    return best


def pareto_markdown(spec, df: pl.DataFrame) -> str:
    """The front's members as a Markdown table (the parent run's pareto/front.md)."""
    rows = front_rows(df, spec.search.objectives(), searched_names(spec))
    with pl.Config(**{**TABLE_STYLE, "tbl_rows": 200, "float_precision": 4}):
        table = str(rows)
    return (
        f"# Pareto front of {objectives_text(spec)}: {rows.height} of {df.height} trials\n\n{table}\n\n"
        "Objective values are each trial's last reported ones (what the searcher was told); a trial stopped "
        "early is compared with the values it had then.\n"
    )


def log_pareto(store, parent_run_id: str, spec, df: pl.DataFrame) -> None:
    """The Pareto front into the parent run: pareto/front.md, pareto/front.csv, plots/pareto_front.png."""
    objectives = spec.search.objectives()
    store.log_text(parent_run_id, pareto_markdown(spec, df), "pareto/front.md")
    store.log_text(parent_run_id, front_rows(df, objectives, searched_names(spec)).write_csv(), "pareto/front.csv")
    fig = front_figure(df, objectives, title=f"{spec.name}: Pareto front of {objectives_text(spec)}")
    store.log_figure(parent_run_id, fig, "plots/pareto_front.png")
    from stabray.tune import plots

    plots.close(fig)
