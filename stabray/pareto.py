"""The Pareto front of a sweep's trials over several objectives (e.g. val_acc up, val_eaf down).

A trial dominates another when it is at least as good in every objective and strictly better in
one; the front is the set of trials no other trial dominates. Equal points do not dominate each
other, so duplicates on the front are all members. A trial missing an objective (null or NaN: e.g.
a method without a chain has no EAF) is neither on the front nor counted as dominating anything.

The objective values are the trial frame's columns of the same name (`stabray.record.trials_frame`):
the last value a trial reported, which is also what the sweep's searcher was told.

Polars and matplotlib only (no Ray, no MLflow): the sweep's end (stabray.tune.summary) and
`analysis` (its table, the report, the knee selection rule) both use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import polars as pl

Objective = tuple[str, str]  # (metric column, "max" | "min")

FRONT = "on_front"  # boolean column added by `mark_front`


def parse_objectives(text: str) -> list[Objective]:
    """ "val_acc:max,val_eaf:min" -> [("val_acc", "max"), ("val_eaf", "min")]; a ValueError naming the bad part."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        name, sep, mode = part.partition(":")
        if not sep or not name or mode not in ("max", "min"):
            raise ValueError(f"{part!r}: expected METRIC:max or METRIC:min (e.g. val_acc:max,val_eaf:min)")
        out.append((name, mode))
    if len(out) < 2:
        raise ValueError("a Pareto front needs at least two objectives")
    return out


def _gains(df: pl.DataFrame, objectives: Sequence[Objective]) -> list[pl.Expr]:
    """Each objective as a float to maximise (min objectives negated), NaN as null."""
    return [
        (pl.col(m).cast(pl.Float64).fill_nan(None) * (1.0 if mode == "max" else -1.0)).alias(f"_g{i}")
        for i, (m, mode) in enumerate(objectives)
    ]


def front_mask(df: pl.DataFrame, objectives: Sequence[Objective]) -> pl.Series:
    """A boolean Series (one per row of `df`): whether the row is on the Pareto front.

    Two objectives: sort by the first (best first) and compare each row with the best second
    objective among rows strictly better in the first (a cumulative max over the distinct values of the
    first), and with the best second objective among rows equal in the first: O(n log n). More
    objectives: every pair (a polars cross join), O(n^2)."""
    missing = [m for m, _ in objectives if m not in df.columns]
    if missing:
        raise KeyError(f"no column {missing[0]!r} in the trials")
    k = len(objectives)
    g = df.select(_gains(df, objectives)).with_row_index("_row")
    valid = g.filter(pl.all_horizontal(pl.col(f"_g{i}").is_not_null() for i in range(k)))
    if valid.height == 0:
        return pl.Series(FRONT, [False] * df.height)
    if k == 2:
        # per distinct first gain: the best second gain in that group; then the best over strictly better groups
        groups = (
            valid.group_by("_g0")
            .agg(pl.col("_g1").max().alias("_same"))
            .sort("_g0", descending=True)
            .with_columns(pl.col("_same").cum_max().shift(1).alias("_above"))
        )
        v = valid.join(groups, on="_g0", how="left")
        dominated = (pl.col("_above").is_not_null() & (pl.col("_above") >= pl.col("_g1"))) | (
            pl.col("_same") > pl.col("_g1")
        )
        on = v.filter(~dominated)["_row"]
    else:
        other = valid.rename({c: f"{c}_o" for c in valid.columns})
        pairs = valid.join(other, how="cross")
        ge = pl.all_horizontal(pl.col(f"_g{i}_o") >= pl.col(f"_g{i}") for i in range(k))
        gt = pl.any_horizontal(pl.col(f"_g{i}_o") > pl.col(f"_g{i}") for i in range(k))
        beaten = pairs.filter(ge & gt)["_row"].unique()
        on = valid.filter(~pl.col("_row").is_in(beaten.implode()))["_row"]
    rows = set(on.to_list())
    return pl.Series(FRONT, [i in rows for i in range(df.height)])


def mark_front(df: pl.DataFrame, objectives: Sequence[Objective]) -> pl.DataFrame:
    """`df` with a boolean `on_front` column."""
    return df.with_columns(front_mask(df, objectives))


def knee_index(df: pl.DataFrame, objectives: Sequence[Objective]) -> int | None:
    """Row index (in `df`) of the front's knee, or None without a front.

    The knee is the front member farthest from the straight line joining the front's two extremes
    (its best and worst member in the first objective), after normalising each objective to [0, 1]
    over the front (min-max, the better end at 1). Two objectives only (with more the line has no
    single meaning). A front of one or two distinct points has no interior: the knee is then the
    member best in the first objective. Ties go to the lower row index."""
    if len(objectives) != 2:
        raise ValueError("the knee is defined for two objectives")
    mask = front_mask(df, objectives)
    g = df.select(_gains(df, objectives)).with_row_index("_row").filter(mask)
    if g.height == 0:
        return None
    x, y = g["_g0"].to_list(), g["_g1"].to_list()
    rows = g["_row"].to_list()

    def norm(v: list[float]) -> list[float]:
        lo, hi = min(v), max(v)
        return [0.0 if hi == lo else (a - lo) / (hi - lo) for a in v]

    nx, ny = norm(x), norm(y)
    # extremes: best and worst in the first objective (on a 2-D front, the worst in the second is the best first)
    a = max(range(len(rows)), key=lambda i: (nx[i], -rows[i]))
    b = min(range(len(rows)), key=lambda i: (nx[i], rows[i]))
    dx, dy = nx[b] - nx[a], ny[b] - ny[a]
    length = math.hypot(dx, dy)
    if length == 0:
        return rows[a]
    dist = [abs(dx * (ny[i] - ny[a]) - dy * (nx[i] - nx[a])) / length for i in range(len(rows))]
    best = max(range(len(rows)), key=lambda i: (round(dist[i], 12), -rows[i]))
    return rows[best] if dist[best] > 1e-12 else rows[a]


def front_figure(df: pl.DataFrame, objectives: Sequence[Objective], title: str = "", label_col: str = "name"):
    """All trials (grey) and the front (highlighted, connected in the order of the first objective);
    the x axis is the first objective, the y axis the second, each labelled with its name and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (mx, xmode), (my, ymode) = objectives[:2]
    d = mark_front(df, objectives).with_columns(
        pl.col(mx).cast(pl.Float64).fill_nan(None).alias("_x"), pl.col(my).cast(pl.Float64).fill_nan(None).alias("_y")
    )
    d = d.filter(pl.col("_x").is_not_null() & pl.col("_y").is_not_null())
    fig, ax = plt.subplots(figsize=(6.0, 4.4))
    rest, front = d.filter(~pl.col(FRONT)), d.filter(pl.col(FRONT)).sort(["_x", "_y"])
    ax.scatter(rest["_x"], rest["_y"], c="tab:gray", alpha=0.6, s=28, label=f"other trials ({rest.height})")
    ax.plot(front["_x"], front["_y"], "-", color="tab:red", alpha=0.6, zorder=2)
    ax.scatter(front["_x"], front["_y"], c="tab:red", s=44, zorder=3, label=f"Pareto front ({front.height})")
    if label_col in front.columns:  # one label per distinct point: equal trials as "name (x3)"
        points = front.group_by(["_x", "_y"], maintain_order=True).agg(pl.col(label_col).first(), pl.len())
        for row in points.iter_rows(named=True):
            text = str(row[label_col]) + (f" (x{row['len']})" if row["len"] > 1 else "")
            ax.annotate(text, (row["_x"], row["_y"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    arrow = {"max": "higher is better", "min": "lower is better"}
    ax.set_xlabel(f"{mx} ({arrow[xmode]})")
    ax.set_ylabel(f"{my} ({arrow[ymode]})")
    ax.set_title(title or f"{len(d)} trials: {mx} vs {my}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def front_rows(df: pl.DataFrame, objectives: Sequence[Objective], extra: Sequence[str] = ()) -> pl.DataFrame:
    """The front's members, best first objective first: `name`, the `extra` columns present (searched
    params), the objective columns, and `status`."""
    d = mark_front(df, objectives).filter(pl.col(FRONT))
    (m0, mode0), (m1, mode1) = objectives[0], objectives[1]
    d = d.sort([m0, m1], descending=[mode0 == "max", mode1 == "max"])
    cols = ["name", *extra, *(m for m, _ in objectives), "status"]
    seen: list[str] = []
    for c in cols:
        if c in d.columns and c not in seen:
            seen.append(c)
    return d.select(seen)
