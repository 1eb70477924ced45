"""The Pareto front of a sweep's trials as a table (md, tex, csv) and a figure (png).

The dominance test and the knee are `stabray.pareto` (polars; the sweep's end uses them too, and
stabray never imports this package). Objectives are the trial frame's columns (`stabray.record`):
each trial's last reported value of a per-epoch metric, what the sweep's searcher was told. The
default pair is accuracy against stability, val_acc (max) and val_eaf (min); a multi-objective sweep
records its own in the parent run (param `objectives`), which `python -m stabray report` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from analysis.tables import MISSING, Table, fmt_num
from stabray.pareto import FRONT, Objective, front_figure, front_rows, knee_index, mark_front, parse_objectives

DEFAULT_OBJECTIVES: list[Objective] = [("val_acc", "max"), ("val_eaf", "min")]
PARAMS = ["method", "lam", "bits", "lr", "lora_rank", "seed"]  # shown beside each member when logged


def objectives_of(text: str | None, fallback: Sequence[Objective] = DEFAULT_OBJECTIVES) -> list[Objective]:
    """Objectives from "val_acc:max,val_eaf:min" (a UserError naming the bad part); `fallback` for None
    or a single objective (a one-objective sweep records "val_acc:max")."""
    from stabray.errors import UserError

    if not text or "," not in text:
        return list(fallback)
    try:
        return parse_objectives(text)
    except ValueError as e:
        raise UserError(f"objectives {text!r}: {e}") from None


def pareto_table(trials: pl.DataFrame, objectives: Sequence[Objective] = DEFAULT_OBJECTIVES) -> Table:
    """The front's members (best first objective first), with the knee marked."""
    objectives = list(objectives)
    names = ", ".join(f"{m} ({mode})" for m, mode in objectives)
    name, caption = "pareto_front", f"Pareto front of {names}"
    missing = [m for m, _ in objectives if m not in trials.columns]
    if trials.is_empty() or missing:
        why = "No trials logged." if trials.is_empty() else f"No trial logged {missing[0]}."
        return Table(name, caption, pl.DataFrame(), pl.DataFrame(), why)
    params = [c for c in PARAMS if c in trials.columns and trials[c].drop_nulls().len() > 0]
    rows = front_rows(trials, objectives, params)
    if rows.is_empty():
        return Table(name, caption, pl.DataFrame(), pl.DataFrame(), "No trial has every objective.")
    knee = knee_index(trials, objectives) if len(objectives) == 2 else None
    knee_name = trials["name"][knee] if knee is not None else None
    data = rows.with_columns(knee=pl.col("name") == pl.lit(knee_name))
    caption += f": {rows.height} of {_compared(trials, objectives)}; * = this front's knee (report --select knee "
    caption += "chooses among finished trials on best_val_acc and val_eaf, per task and method)"

    def show(v) -> str:
        return MISSING if v is None else fmt_num(v) if isinstance(v, float) else str(v)

    display = pl.DataFrame(
        [[*(show(v) for v in r[:-1]), "*" if r[-1] else ""] for r in data.iter_rows()],
        schema=[*rows.columns, "knee"],
        orient="row",
    )
    return Table(name, caption, display, data)


def _compared(trials: pl.DataFrame, objectives: Sequence[Objective]) -> str:
    """Which trials the front was drawn from and which were left out, and why: "6 trials with every
    objective (2 stopped early, compared at the epoch they stopped); left out: 2 failed without val_acc"."""
    from collections import Counter

    has = pl.all_horizontal(pl.col(m).is_not_null() for m, _ in objectives)
    kept, left = trials.filter(has), trials.filter(~has)
    text = f"{kept.height} trials with every objective"
    stopped = kept.filter(pl.col("status") == "STOPPED").height if "status" in kept.columns else 0
    if stopped:
        text += f" ({stopped} stopped early, compared at the epoch they stopped)"
    if left.height:
        words = {"FINISHED": "finished", "STOPPED": "stopped early", "FAILED": "failed", "KILLED": "killed"}
        why = Counter(
            (words.get(r.get("status"), str(r.get("status") or "without a status").lower()),
             next(m for m, _ in objectives if r.get(m) is None))
            for r in left.iter_rows(named=True)
        )  # fmt: skip
        text += "; left out: " + ", ".join(f"{n} {w} without {m}" for (w, m), n in sorted(why.items()))
    return text


def pareto_figure(trials: pl.DataFrame, path: Path, objectives: Sequence[Objective] = DEFAULT_OBJECTIVES) -> Path:
    """All trials, the front highlighted and connected: `path` (png)."""
    from analysis.figures import _no_data, save_figure

    (mx, _), (my, _) = objectives[:2]
    title = f"Pareto front: {mx} vs {my}"
    if trials.is_empty() or mx not in trials.columns or my not in trials.columns:
        return _no_data(path, title, "no trials with both objectives")
    if not mark_front(trials, objectives)[FRONT].any():
        return _no_data(path, title, "no trial has every objective")
    return save_figure(front_figure(trials, objectives, title=title), path)
