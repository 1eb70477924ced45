"""Rules that end a trial at a given epoch (spec `search.stop_if`), and the sweep's stoppers together.

A rule judges one epoch's result of each trial on its own (no peers, unlike ASHA or the EAF rule):
`{metric: val_departure_tok0, epoch: 40, when: ">= 0.5"}` stops a trial whose result of epoch 40 has
val_departure_tok0 >= 0.5. The use it was made for: a LEGO run on the clause-lookup plateau (most of
its wrong chains first go off at a step's variable at epoch 40) often never leaves it, and its slot
would be better spent on the next start (another `seed` or `model.init_seed` of the search space; a
grid adds no replacement for a stopped trial). docs/calibration.md ("An early sign of the plateau")
has the runs that threshold was read on and the later runs it was checked against, on which it did
not predict (`scripts/early_sign.py` prints both): the rule is the mechanism, not a tested recipe.
A value that is missing or NaN never stops a trial; a trial restored from a checkpoint past the
rule's epoch is not judged again.

`stoppers(search)` gives Ray Tune one stopper for the sweep (None, one, or `Stoppers`); each stabray
stopper keeps `stopped` (trial_id -> epoch) and a `tag`, which the MLflow callback writes as the
trial's `stabray.stopped_by`.
"""

from __future__ import annotations

import math
from typing import Any

from ray.tune import Stopper

from stabray.config import StopIfCfg


class RuleStopper(Stopper):
    tag = "stop_if"

    def __init__(self, rules: list[StopIfCfg]):
        self.rules = list(rules)
        self.stopped: dict[str, int] = {}  # trial_id -> epoch it was stopped after
        self.why: dict[str, str] = {}  # trial_id -> the rule that stopped it, in words

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        epoch = result.get("epoch") or result.get("training_iteration")
        if epoch is None:
            return False
        for rule in self.rules:
            if int(epoch) != rule.epoch:
                continue
            value = result.get(rule.metric)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                continue
            if rule.holds(float(value)):
                self.stopped[trial_id] = int(epoch)
                self.why[trial_id] = f"{rule.metric} = {value:.4g} at epoch {rule.epoch}, rule {rule.when}"
                return True
        return False

    def stop_all(self) -> bool:
        return False

    def describe(self) -> str:
        return "search.stop_if stops a trial when " + "; or ".join(r.describe() for r in self.rules)


class Stoppers(Stopper):
    """Several stoppers at once: a trial stops when any of them says so. Unlike Ray's CombinedStopper
    every one sees every result (the EAF rule's medians need the results of trials another rule stops)."""

    def __init__(self, *members: Stopper):
        self.members = members

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return any([m(trial_id, result) for m in self.members])  # a list: no short cut

    def stop_all(self) -> bool:
        return any(m.stop_all() for m in self.members)


def stoppers(search) -> Stopper | None:
    """The sweep's stopper from its SearchCfg: the EAF rule and the stop_if rules, as configured."""
    from stabray.tune.eaf_stop import EafStopper

    found: list[Stopper] = []
    if search.eaf_stop is not None:
        found.append(EafStopper.from_cfg(search.eaf_stop))
    if search.stop_if:
        found.append(RuleStopper(search.stop_if))
    if not found:
        return None
    return found[0] if len(found) == 1 else Stoppers(*found)


def members(stopper: Stopper | None) -> list[Stopper]:
    """The stabray stoppers inside what Ray Tune was given."""
    if stopper is None:
        return []
    return list(getattr(stopper, "members", [stopper]))


def stopped_by(stopper: Stopper | None, trial_id: str) -> str:
    """Who stopped an early-stopped trial: the tag of the stabray stopper that did, else "asha"."""
    for m in members(stopper):
        if trial_id in getattr(m, "stopped", {}):
            return getattr(m, "tag", "eaf_stop")
    return "asha"


def stop_detail(stopper: Stopper | None, trial_id: str) -> str:
    """What a search.stop_if rule saw when it stopped the trial ("" for the other stoppers)."""
    for m in members(stopper):
        if trial_id in getattr(m, "why", {}):
            return m.why[trial_id]
    return ""
