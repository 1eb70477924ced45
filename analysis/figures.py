"""Figures as PNG (matplotlib, Agg). Every function writes its file, with a "no data" note when
there is nothing to plot, and returns the path."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402

from analysis.select import BEST, Rule, seeds_of, select_best  # noqa: E402
from analysis.tables import HPARAMS, PAPER_METHODS, TASK_ORDER, method_label, ordered, task_label  # noqa: E402
from stabray.record import one_per_seed  # noqa: E402

DPI = 120


def save_figure(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def _no_data(path: Path, title: str, why: str) -> Path:
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True)
    return save_figure(fig, path)


def _colors(keys: list[str]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {k: cycle[i % len(cycle)] for i, k in enumerate(keys)}


def gap_and_bound(trials: pl.DataFrame, decomp: pl.DataFrame, path: Path, rule: Rule = BEST) -> Path:
    """Figure 2 style: loss gap (solid) and bound (dashed) against T on one log axis, one panel per
    task, one colour per method; mean over the selected configuration's finished seeds. Points
    where a value is 0 (T = 1: no step before it) or missing cannot sit on a log axis and are left
    out; the panel's note counts them."""
    title = "Loss gap and bound of eq. (4) against T"
    selected = select_best(trials, rule=rule)
    if decomp.is_empty() or selected.is_empty():
        return _no_data(path, title, "no stability decomposition logged")
    seeds = seeds_of(trials, selected).select(["task", "method", "trial_id"])
    rows = decomp.drop(["task", "method"]).join(seeds, on="trial_id", how="inner")
    if rows.is_empty():
        return _no_data(path, title, "no decomposition for the selected configurations")
    curves = rows.group_by(["task", "method", "T"]).agg(pl.col("loss_gap").mean(), pl.col("bound").mean())
    tasks = ordered(curves["task"].to_list(), TASK_ORDER)
    meths = ordered(curves["method"].to_list(), PAPER_METHODS)
    colors = _colors(meths)
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        left_out, Ts = 0, set()
        for m in meths:
            c = curves.filter((pl.col("task") == task) & (pl.col("method") == m)).sort("T")
            for y, style, alpha in (("loss_gap", "-o", 1.0), ("bound", "--s", 0.7)):
                ok = c.filter(pl.col(y).is_not_null() & pl.col(y).is_not_nan() & (pl.col(y) > 0))
                left_out += c.height - ok.height
                if not ok.is_empty():
                    ax.plot(ok["T"], ok[y], style, color=colors[m], alpha=alpha)
                    Ts.update(ok["T"].to_list())
        ax.set_yscale("log")
        if Ts:  # one tick per T drawn (an integer), half a step of margin either side
            ax.set_xticks(sorted(Ts))
            ax.set_xlim(min(Ts) - 0.5, max(Ts) + 0.5)
        ax.set_title(task_label(task) + (f" ({left_out} zero/missing points left out)" if left_out else ""), fontsize=9)
        ax.set_xlabel("T (reasoning steps)")
        ax.set_ylabel("loss gap (solid), bound (dashed); log")
    handles = [plt.Line2D([], [], color=colors[m], label=method_label(m)) for m in meths]
    handles += [
        plt.Line2D([], [], color="gray", ls="-", marker="o", label="loss gap"),
        plt.Line2D([], [], color="gray", ls="--", marker="s", label="bound, eq. (4)"),
    ]
    fig.legend(
        handles=handles, loc="upper center", ncol=min(len(handles), 4), bbox_to_anchor=(0.5, 1.12), frameon=False
    )
    fig.tight_layout()
    return save_figure(fig, path)


def _one_knob(trials: pl.DataFrame, param: str) -> pl.DataFrame:
    """Per (task, method) that swept `param`: its finished trials with every other swept
    hyperparameter held at the selected configuration's value (Figure 4 varies one knob)."""
    done = trials.filter(pl.col(param).is_not_null() & (pl.col("status").is_null() | (pl.col("status") == "FINISHED")))
    done = one_per_seed(done)  # a seed run twice is one sample
    parts = []
    for r in select_best(done).iter_rows(named=True):
        d = done.filter((pl.col("task") == r["task"]) & (pl.col("method") == r["method"]))
        if d[param].n_unique() < 2:
            continue
        for h in HPARAMS:
            if h != param and h in d.columns and r[h] is not None and d[h].n_unique() > 1:
                d = d.filter(pl.col(h) == r[h])
        parts.append(d)
    return pl.concat(parts, how="diagonal_relaxed") if parts else done.clear()


def eaf_against(trials: pl.DataFrame, param: str, path: Path, xlabel: str) -> Path:
    """Figure 4 style: EAF (left) and loss gap (right) against one swept param, the others held at
    the selected configuration; dots are trials (seeds), lines join the means, one line per
    (task, method) that swept the param."""
    title = f"EAF against {xlabel}"
    df = _one_knob(trials, param)
    panels = [
        (y, lab)
        for y, lab in (
            ("test_eaf", "test EAF Σρ (final model, T_max)"),
            ("test_loss_gap", "test loss gap, nats/token\n(< 0: own chain better)"),
        )
        if df[y].drop_nulls().len() > 0
    ]
    if df.is_empty() or not panels:
        return _no_data(path, title, f"no (task, method) swept `{param}` with an EAF or loss gap logged")
    lines = df.select("task", "method").unique().sort("task", "method").rows()
    colors = _colors([f"{t}/{m}" for t, m in lines])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.4), squeeze=False)
    for ax, (y, ylabel) in zip(axes[0], panels):
        for task, m in lines:
            d = df.filter((pl.col("task") == task) & (pl.col("method") == m) & pl.col(y).is_not_null())
            if d.is_empty():
                continue
            color = colors[f"{task}/{m}"]
            ax.scatter(d[param], d[y], color=color, alpha=0.4, s=14)
            mean = d.group_by(param).agg(pl.col(y).mean()).sort(param)
            ax.plot(mean[param], mean[y], "-o", color=color, label=f"{task_label(task)} · {method_label(m)}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if param == "bits":
            ax.set_xscale("log", base=2)
            ticks = sorted(df[param].unique().to_list())
            ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def accuracy_vs_eaf(trials: pl.DataFrame, path: Path) -> Path:
    """Test accuracy against EAF, one dot per finished trial, one colour per method."""
    title = "Test accuracy against EAF per trial"
    df = trials.filter(pl.col("test_acc").is_not_null() & pl.col("test_eaf").is_not_null())
    if df.is_empty():
        return _no_data(path, title, "no trial logged both test_acc and an EAF")
    meths = ordered(df["method"].to_list(), PAPER_METHODS)
    colors = _colors(meths)
    scale = 1.0 if df["test_acc"].max() > 1.0 else 100.0
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for m in meths:
        d = df.filter(pl.col("method") == m)
        ax.scatter(d["test_eaf"], d["test_acc"] * scale, color=colors[m], label=method_label(m), alpha=0.7, s=18)
    v = df["test_eaf"].filter(df["test_eaf"] > 0)
    if len(v) and v.max() / v.min() > 100:
        ax.set_xscale("log")
    ax.set_xlabel("test EAF Σρ (test_eaf: final model, T_max)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def _selected_rows(trials: pl.DataFrame, decomp: pl.DataFrame, by, rule: Rule) -> pl.DataFrame:
    """The eq. (4) rows of the finished seeds of each group's selected configuration, with the group's
    columns `by`."""
    selected = select_best(trials, by, rule)
    if decomp.is_empty() or selected.is_empty():
        return decomp.clear()
    seeds = seeds_of(trials, selected, by).select([*by, "trial_id"])
    return decomp.drop([c for c in by if c in decomp.columns]).join(seeds, on="trial_id", how="inner")


def _bar(ax, labels: list[str], means: list[float], stds: list[float | None], colors: list[str], ylabel: str) -> None:
    x = list(range(len(labels)))
    ax.bar(x, means, yerr=[0.0 if s is None else s for s in stds], color=colors, capsize=3)
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)


def figure1(trials: pl.DataFrame, decomp: pl.DataFrame, path: Path, rule: Rule = BEST) -> Path:
    """Figure 1 style, one row per task: (a) the loss gap and the eq. (4) bound of SFT-CoT against T
    (separate axes: the bound is a worst-case one and numerically larger), (b) test accuracy and
    (c) the test EAF Σρ at T (`test_eaf_at_T`, the eq. (4) table's row at stability_T) per method;
    bars are means over the selected configuration's finished seeds, whiskers the sample std."""
    from analysis.select import mean_std

    title = "Figure 1: bound and loss gap against T (SFT-CoT), accuracy and EAF per method"
    selected = select_best(trials, rule=rule)
    if selected.is_empty():
        return _no_data(path, title, "no finished trial")
    tasks = ordered(selected["task"].to_list(), TASK_ORDER)
    meths = ordered(selected["method"].to_list(), PAPER_METHODS)
    colors = _colors(meths)
    rows = _selected_rows(trials, decomp, ["task", "method"], rule)
    stats = {
        metric: {(r["task"], r["method"]): r for r in mean_std(trials, selected, metric).iter_rows(named=True)}
        for metric in ("test_acc", "test_eaf_at_T")
        if metric in trials.columns
    }
    scale = 1.0 if "test_acc" in trials.columns and (trials["test_acc"].drop_nulls().max() or 0) > 1 else 100.0
    fig, axes = plt.subplots(len(tasks), 3, figsize=(13, 3.4 * len(tasks)), squeeze=False)
    for row, task in zip(axes, tasks):
        ax = row[0]
        sft = rows.filter((pl.col("task") == task) & (pl.col("method") == "sft_cot")) if rows.height else rows
        if sft.is_empty():
            ax.set_axis_off()
            ax.text(0.5, 0.5, "no SFT-CoT eq. (4) table", ha="center", va="center")
        else:
            c = sft.group_by("T").agg(pl.col("loss_gap").mean(), pl.col("bound").mean()).sort("T")
            ax.plot(c["T"], c["loss_gap"], "-o", color="tab:blue", label="loss gap")
            ax.set_ylabel("loss gap (nats/token)", color="tab:blue")
            twin = ax.twinx()
            twin.plot(c["T"], c["bound"], "--s", color="tab:red", label="bound, eq. (4)")
            twin.set_ylabel("bound, eq. (4)", color="tab:red")
            ax.set_xticks(c["T"].to_list())
            ax.set_xlabel("T (reasoning steps)")
        ax.set_title(f"{task_label(task)}: SFT-CoT", fontsize=9)
        for ax, metric, ylabel, k in (
            (row[1], "test_acc", "test accuracy (%)", scale),
            (row[2], "test_eaf_at_T", "test EAF Σρ at T (stability_T)", 1.0),
        ):
            have = [m for m in meths if (task, m) in stats.get(metric, {})]
            if not have:
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"no {metric} logged", ha="center", va="center")
                continue
            cells = [stats[metric][(task, m)] for m in have]
            _bar(
                ax,
                [method_label(m) for m in have],
                [c["mean"] * k for c in cells],
                [None if c["std"] is None else c["std"] * k for c in cells],
                [colors[m] for m in have],
                ylabel,
            )
            ax.set_title(f"{task_label(task)}: {ylabel.split(' (')[0]} per method", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def figure5(trials: pl.DataFrame, decomp: pl.DataFrame, path: Path, rule: Rule = BEST, methods=("sft_cot",)) -> Path:
    """Figure 5 style: per task, the loss gap (solid, left axis) and the EAF Σρ (dashed, right axis,
    log) of the eq. (4) table against T, one colour per model; mean over the selected configuration's
    finished seeds per (task, method, model), `methods` only (SFT-CoT, as the paper)."""
    title = "Loss gap and EAF against T per model"
    by = ["task", "method", "model"]
    mine = trials.filter(pl.col("method").is_in(list(methods))) if trials.height else trials
    rows = _selected_rows(mine, decomp, by, rule) if mine.height else decomp.clear()
    if rows.is_empty():
        return _no_data(path, title, "no eq. (4) table of the selected configurations")
    curves = rows.group_by([*by, "T"]).agg(pl.col("loss_gap").mean(), pl.col("eaf").mean()).sort([*by, "T"])
    tasks = ordered(curves["task"].to_list(), TASK_ORDER)
    models = sorted(curves["model"].drop_nulls().unique().to_list())
    colors = _colors(models)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        twin = ax.twinx()
        for model in models:
            c = curves.filter((pl.col("task") == task) & (pl.col("model") == model))
            if c.is_empty():
                continue
            ax.plot(c["T"], c["loss_gap"], "-o", color=colors[model])
            pos = c.filter(pl.col("eaf") > 0)
            if not pos.is_empty():
                twin.plot(pos["T"], pos["eaf"], "--s", color=colors[model], alpha=0.7)
        twin.set_yscale("log")
        ax.set_xlabel("T (reasoning steps)")
        ax.set_ylabel("loss gap (solid), nats/token")
        twin.set_ylabel("EAF Σρ (dashed), log")
        ax.set_title(task_label(task), fontsize=9)
    handles = [plt.Line2D([], [], color=colors[m], label=m) for m in models]
    fig.legend(
        handles=handles, loc="upper center", ncol=min(len(handles), 4), bbox_to_anchor=(0.5, 1.08), frameon=False
    )
    fig.suptitle(title, y=1.12)
    fig.tight_layout()
    return save_figure(fig, path)


def all_figures(trials: pl.DataFrame, decomp: pl.DataFrame, out_dir: str | Path, rule: Rule = BEST) -> list[Path]:
    out = Path(out_dir)
    return [
        gap_and_bound(trials, decomp, out / "fig2_gap_bound_vs_T.png", rule),
        eaf_against(trials, "lam", out / "fig4_eaf_vs_lambda.png", "compression factor λ"),
        eaf_against(trials, "bits", out / "fig4_eaf_vs_bits.png", "QAT bit-width"),
        accuracy_vs_eaf(trials, out / "acc_vs_eaf.png"),
    ]
