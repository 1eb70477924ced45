"""Configuration selection and aggregation over seeds.

A trial's validation score is `best_val_acc` (max over epochs), else its last `val_acc`; its EAF is
the validation EAF of its last epoch (`val_eaf`: selection reads validation numbers only; none where
the last epoch measured none, not an earlier epoch's, `stabray.record.LAST_EPOCH_ONLY`). Per group
(default (task, method)) one FINISHED trial is selected (a trial stopped early by ASHA, the EAF rule
or a search.stop_if rule, that failed or was killed never is: its final metrics are missing or from
a shorter run) by a rule (`Rule`, `python -m stabray report --select`):

- `best_acc` (default): the highest score; equal scores go to the lower EAF, then to the lower trial
  id so the choice is deterministic.
- `eaf_within`: among trials whose score is within `delta` (absolute, e.g. 0.01 = one point of
  accuracy) of the group's best score, the lowest EAF; ties go to the higher score, then the lower
  trial id. A trial without an EAF is chosen only when no trial within delta has one.
- `knee`: the knee of the group's Pareto front of (score, max) and (EAF, min)
  (`stabray.pareto.knee_index`: the front member farthest from the line joining the front's two
  extremes, each objective min-max normalised over the front). Without a front (no trial has an
  EAF), the best score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from stabray.record import one_per_seed

GROUP = ("task", "method")
RULES = ("best_acc", "eaf_within", "knee")


@dataclass(frozen=True)
class Rule:
    """How one configuration is selected per group (see the module docstring)."""

    name: str = "best_acc"
    delta: float = 0.01  # eaf_within: score tolerance, absolute (accuracy as a fraction)

    def __post_init__(self):
        from stabray.errors import UserError

        if self.name not in RULES:  # the CLI's --select and --delta are these two fields
            raise UserError(f"selection rule {self.name!r} (--select): unknown rule; use one of {', '.join(RULES)}")
        if not (isinstance(self.delta, int | float) and not isinstance(self.delta, bool) and self.delta >= 0):
            raise UserError(f"selection rule delta (--delta) {self.delta!r}: must be a number >= 0")

    def describe(self) -> str:
        return {
            "best_acc": "the best validation accuracy (ties: the lower EAF)",
            "eaf_within": f"the lowest EAF among trials within {self.delta:g} of the best validation accuracy",
            "knee": "the knee of the Pareto front of validation accuracy (max) and EAF (min): the front member "
            "farthest from the line joining the front's extremes, objectives min-max normalised over the front",
        }[self.name]


BEST = Rule()


def _finished(trials: pl.DataFrame) -> pl.DataFrame:
    # a null status (hand-built records) counts as finished
    return trials.filter(pl.col("status").is_null() | (pl.col("status") == "FINISHED"))


def select_best(trials: pl.DataFrame, by: Sequence[str] = GROUP, rule: Rule | None = None) -> pl.DataFrame:
    """One row per group: the trial `rule` selects (default: best_acc; a Rule, or a rule's name), with
    its `score` column. `by`: the columns that make a group (one name or several)."""
    rule = Rule(rule) if isinstance(rule, str) else rule or BEST
    by = [by] if isinstance(by, str) else list(by)
    df = _finished(trials).with_columns(score=pl.coalesce("best_val_acc", "val_acc"))
    df = df.filter(pl.col("score").is_not_null() & pl.all_horizontal(pl.col(c).is_not_null() for c in by))
    df = df.sort(
        [*by, "score", "val_eaf", "trial_id"],
        descending=[False] * len(by) + [True, False, False],
        nulls_last=True,
    )
    if rule.name == "eaf_within":
        near = df.filter(pl.col("score") >= pl.col("score").max().over(by) - rule.delta - 1e-12)
        df = near.sort(
            [*by, "val_eaf", "score", "trial_id"],
            descending=[False] * len(by) + [False, True, False],
            nulls_last=True,
        )
    elif rule.name == "knee":
        return _knees(df, by)
    return df.unique(subset=by, keep="first", maintain_order=True)


def _knees(df: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Per group (df sorted best score first): the knee of its (score max, val_eaf min) front."""
    from stabray.pareto import knee_index

    parts = []
    for _, g in df.group_by(by, maintain_order=True):
        k = knee_index(g, [("score", "max"), ("val_eaf", "min")])
        parts.append(g[k if k is not None else 0])
    return pl.concat(parts) if parts else df.head(0)


def seeds_of(
    trials: pl.DataFrame, selected: pl.DataFrame, by: Sequence[str] = GROUP, metric: str | None = None
) -> pl.DataFrame:
    """The finished trials of each selected configuration (all params but the seed), one per seed
    (`stabray.record.one_per_seed`: the selected trial stands for its own seed); with `metric`, only trials that
    logged it, before a repeated seed is reduced to one."""
    keys = selected.select([*by, "config_key"])
    rows = _finished(trials).drop([c for c in by]).join(keys, on="config_key", how="inner")
    if metric is not None:
        rows = rows.filter(pl.col(metric).is_not_null())
    return one_per_seed(rows, prefer=set(selected["trial_id"].to_list()) if "trial_id" in selected.columns else None)


def repeated_seeds(trials: pl.DataFrame) -> int:
    """Finished trials that repeat another's configuration and seed (counted once in every table)."""
    done = _finished(trials)
    return done.height - one_per_seed(done).height


def mean_std(trials: pl.DataFrame, selected: pl.DataFrame, metric: str, by: Sequence[str] = GROUP) -> pl.DataFrame:
    """Per group: mean, sample std (ddof=1; null with one seed) and n of `metric` over the seeds
    of the selected configuration. Trials where the metric is missing do not count."""
    by = list(by)
    rows = seeds_of(trials, selected, by, metric)
    return rows.group_by(by, maintain_order=True).agg(
        mean=pl.col(metric).mean(),
        std=pl.col(metric).std(ddof=1),
        n=pl.col(metric).count().cast(pl.Int64),
    )
