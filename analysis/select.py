"""Configuration selection and aggregation over seeds.

A trial's validation score is `best_val_acc` (max over epochs), else its last `val_acc`. Per group
(default (task, method)) the best FINISHED trial wins (a trial ASHA stopped, that failed or was
killed never does: its final metrics are missing or from a shorter run); equal scores go to the lower
validation EAF of the last epoch (`eaf`: selection reads validation numbers only), then to the lower
trial id so the choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

GROUP = ("task", "method")


def _finished(trials: pl.DataFrame) -> pl.DataFrame:
    # a null status (hand-built records) counts as finished
    return trials.filter(pl.col("status").is_null() | (pl.col("status") == "FINISHED"))


def select_best(trials: pl.DataFrame, by: Sequence[str] = GROUP) -> pl.DataFrame:
    """One row per group: the selected trial, with its `score` column."""
    by = list(by)
    df = _finished(trials).with_columns(score=pl.coalesce("best_val_acc", "val_acc"))
    df = df.filter(pl.col("score").is_not_null() & pl.all_horizontal(pl.col(c).is_not_null() for c in by))
    df = df.sort(
        [*by, "score", "eaf", "trial_id"],
        descending=[False] * len(by) + [True, False, False],
        nulls_last=True,
    )
    return df.unique(subset=by, keep="first", maintain_order=True)


def seeds_of(trials: pl.DataFrame, selected: pl.DataFrame, by: Sequence[str] = GROUP) -> pl.DataFrame:
    """Every finished trial sharing a selected configuration (all params but the seed)."""
    keys = selected.select([*by, "config_key"])
    return _finished(trials).drop([c for c in by]).join(keys, on="config_key", how="inner")


def mean_std(trials: pl.DataFrame, selected: pl.DataFrame, metric: str, by: Sequence[str] = GROUP) -> pl.DataFrame:
    """Per group: mean, sample std (ddof=1; null with one seed) and n of `metric` over the seeds
    of the selected configuration. Trials where the metric is missing do not count."""
    by = list(by)
    rows = seeds_of(trials, selected, by).filter(pl.col(metric).is_not_null())
    return rows.group_by(by, maintain_order=True).agg(
        mean=pl.col(metric).mean(),
        std=pl.col(metric).std(ddof=1),
        n=pl.col(metric).count().cast(pl.Int64),
    )
