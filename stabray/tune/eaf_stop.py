"""EAF-aware early stopping: end a trial whose error amplification explodes while its accuracy is
not among the best (a Ray Tune Stopper, so it works beside ASHA or FIFO and with several objectives).

The rule, at each result of epoch e of trial i (spec `search.eaf_stop`, stabray.config.EafStopCfg):
  EAF_e = the EAF values every trial has reported at epoch e so far (trial i's included),
  ACC_e = the val_acc values reported at epoch e so far (trial i's included), n = |ACC_e|;
  stop trial i when  e >= grace,  |EAF_e| >= min_trials,  eaf_i > factor * median(EAF_e),  and
  trial i is not protected: it is protected when fewer than ceil(top_fraction * n) values of ACC_e
  are strictly greater than acc_i (it ranks in the top fraction, ties counted in its favour).
A non-finite EAF (inf from an overflow) counts as exceeding; a missing or NaN EAF never stops a
trial (methods without a chain report none) and is left out of the median.

"Running" median: results arrive in the order Ray delivers them, so the first trials at an epoch
are judged against fewer peers; `min_trials` keeps the first few from being judged at all.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ray.tune import Stopper

ACC = "val_acc"
EAF = "val_eaf"


class EafStopper(Stopper):
    tag = "eaf_stop"  # its stabray.stopped_by (stabray.tune.stop_rules.STOPPER_WORDS)

    def __init__(self, factor: float = 3.0, top_fraction: float = 0.25, grace: int = 2, min_trials: int = 3):
        self.factor, self.top_fraction, self.grace, self.min_trials = factor, top_fraction, grace, min_trials
        self.eafs: dict[int, dict[str, float]] = {}  # epoch -> {trial_id: val_eaf}
        self.accs: dict[int, dict[str, float]] = {}  # epoch -> {trial_id: val_acc}
        self.stopped: dict[str, int] = {}  # trial_id -> epoch it was stopped after

    @classmethod
    def from_cfg(cls, cfg) -> EafStopper:
        return cls(cfg.factor, cfg.top_fraction, cfg.grace, cfg.min_trials)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        epoch = result.get("epoch") or result.get("training_iteration")
        if epoch is None:
            return False
        epoch = int(epoch)
        val_eaf, acc = _num(result.get(EAF)), _num(result.get(ACC))
        if val_eaf is not None and not math.isnan(val_eaf):
            self.eafs.setdefault(epoch, {})[trial_id] = val_eaf
        if acc is not None and not math.isnan(acc):
            self.accs.setdefault(epoch, {})[trial_id] = acc
        if self.should_stop(trial_id, epoch, val_eaf, acc):
            self.stopped[trial_id] = epoch
            return True
        return False

    def should_stop(self, trial_id: str, epoch: int, val_eaf: float | None, acc: float | None) -> bool:
        if epoch < self.grace or val_eaf is None or math.isnan(val_eaf):
            return False
        peers = list(self.eafs.get(epoch, {}).values())
        if len(peers) < self.min_trials:
            return False
        median = statistics.median(peers)
        if not val_eaf > self.factor * median:  # inf > x is True; a median of inf protects everyone
            return False
        if acc is not None and not math.isnan(acc):
            accs = list(self.accs.get(epoch, {}).values())
            better = sum(1 for a in accs if a > acc)
            if better < math.ceil(self.top_fraction * len(accs)):
                return False  # in the top fraction at this epoch
        return True

    def stop_all(self) -> bool:
        return False

    def describe(self) -> str:
        return (
            f"the EAF rule stops a trial after epoch >= {self.grace} when its EAF exceeds {self.factor:g} x the median "
            f"of the EAFs reported at that epoch (at least {self.min_trials}) and its val_acc is not in the top "
            f"{self.top_fraction:.0%} at that epoch"
        )


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)
