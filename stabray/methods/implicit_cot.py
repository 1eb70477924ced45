"""Implicit CoT by stepwise internalization (Deng, Choi, Shieber 2024): train on the full chain of
thought, then remove its leading part on a linear schedule until none remains, so the model learns
to answer without writing the chain.

Schedule (as Deng et al.'s `train.py`): linear in optimizer steps, `floor(remove_per_epoch * s / S)`
leading units removed at global step s (S = steps per epoch; step 0 = the full chain). With
`unit="tokens"` (the default, as Deng et al.) a unit is one task token (a number, bracket, comma:
the pre-tokens of stabray's tokenizer, which equal the embedded model's tokens), counted over the
steps only, so a step can be cut in the middle; with `unit="steps"` a unit is one intermediate step
(the paper's reference code). Separators disappear with the step they precede.

Removal smoothing (Deng et al., λ = 4 in their README): each example removes `scheduled + o` units,
o drawn from P(o) = (1 - e^-λ) e^(-λ o), o = 0, 1, ... (a geometric law: o = 0 with probability
0.98 at λ = 4), from the training loop's per-epoch generator, so it repeats under a seed.
`removal_smoothing = 0` turns it off.

Optimizer reset (Deng et al.'s `--reset_optimizer`, on in their README): a fresh AdamW each time the
scheduled count grows, while some chain is left; the learning-rate schedule keeps its place (they
use a constant rate).

Evaluation: the same question prompt as training (output line `trace | pi`) and the chain form
with zero steps, i.e. the model answers "| final" -- the exact shape of the last stage of training.
(The no-hint prompt would ask for a format the model never saw.) No chain is left at evaluation, so
the EAF and the eq. (4) table are not measured (`steps_at_eval = False`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stabray.errors import UserError
from stabray.methods.base import METHODS, Method
from stabray.tasks.base import TOKEN_RE


@dataclass(frozen=True)
class ImplicitCoTParams:
    remove_per_epoch: float = 8.0  # units removed per epoch (linear in optimizer steps); > 0. Deng et al.: 8 tokens
    unit: str = "tokens"  # tokens (task tokens of the steps, Deng et al.) | steps (whole steps)
    removal_smoothing: float = 4.0  # lambda of P(o) ~ exp(-lambda o) for the extra units removed per example; 0 = off
    reset_optimizer: bool = True  # a fresh optimizer each time the scheduled removal grows


def removed_units(epoch: float, per_epoch: float) -> int:
    """Leading units scheduled for removal after `epoch` epochs (fractional: s / S): floor(per_epoch * epoch)."""
    return int(math.floor(per_epoch * epoch + 1e-9))


def smoothing_offset(rng: np.random.Generator, lam: float) -> int:
    """o ~ P(o) = (1 - e^-lam) e^(-lam o), o >= 0 (geometric); 0 when lam = 0 (off)."""
    if lam <= 0:
        return 0
    return int(rng.geometric(1.0 - math.exp(-lam))) - 1


def drop_leading_tokens(steps: tuple[str, ...], n: int) -> tuple[str, ...]:
    """The steps with their first n task tokens removed; a partly removed step keeps its tail text."""
    out = list(steps)
    while out and n > 0:
        toks = list(TOKEN_RE.finditer(out[0]))
        if n >= len(toks):
            n -= len(toks)
            out.pop(0)
        else:
            out[0] = out[0][toks[n].start() :]
            n = 0
    return tuple(out)


@METHODS.register("implicit_cot")
class ImplicitCoT(Method):
    Params = ImplicitCoTParams

    def __init__(self, **params):
        self.progress: float | None = None  # epochs of training done (fractional), set by on_train_step
        self._chain_seen = True  # whether the last batch still had some chain (Deng et al.'s reset guard)
        super().__init__(**params)

    def validate(self) -> None:
        p = self.params
        if not p.remove_per_epoch > 0:
            raise UserError(f"method 'implicit_cot': remove_per_epoch must be > 0, got {p.remove_per_epoch}")
        if p.unit not in ("steps", "tokens"):
            raise UserError(f"method 'implicit_cot': unit must be 'steps' or 'tokens', got {p.unit!r}")
        if not p.removal_smoothing >= 0:
            raise UserError(f"method 'implicit_cot': removal_smoothing must be >= 0, got {p.removal_smoothing}")

    def scheduled(self, epoch: int) -> int:
        """Units scheduled for removal now: at the current optimizer step when the training loop
        drives the method (`on_train_step`), else at the start of `epoch`."""
        return removed_units(epoch if self.progress is None else self.progress, self.params.remove_per_epoch)

    def on_train_step(self, step, steps_per_epoch):
        had_chain, self._chain_seen = self._chain_seen, False
        self.progress = step / steps_per_epoch
        if step == 0 or not self.params.reset_optimizer:
            return None
        per = self.params.remove_per_epoch
        grew = removed_units(self.progress, per) > removed_units((step - 1) / steps_per_epoch, per)
        # as Deng et al.: no more resets once the previous batch had no chain left at all
        return "optimizer" if grew and had_chain else None

    def train_view(self, ex, epoch, rng):
        n = self.scheduled(epoch) + smoothing_offset(rng, self.params.removal_smoothing)
        if self.params.unit == "steps":
            steps = tuple(ex.steps[n:])
        else:
            steps = drop_leading_tokens(tuple(ex.steps), n)
        self._chain_seen = self._chain_seen or bool(steps)
        return ex.question, steps

    def eval_steps(self, ex):
        return ()  # "| final": every step internalized

    steps_at_eval = False  # no chain at evaluation: the EAF and eq. (4) are not measured (empty sums)
