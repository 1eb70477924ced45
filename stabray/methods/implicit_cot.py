"""Implicit CoT by stepwise internalization (Deng, Choi, Shieber 2024): train on the full chain of
thought, then remove its leading part on a linear schedule until none remains, so the model learns
to answer without writing the chain.

At epoch e, `floor(remove_per_epoch * e)` leading units are removed (epoch 0 = full chain). With
`unit="steps"` a unit is one intermediate step; with `unit="tokens"` it is one task token (a number,
bracket, comma: the pre-tokens of stabray's tokenizer, which equal the embedded model's tokens),
counted over the steps only, so a step can be cut in the middle. Separators disappear with the step
they precede.

Evaluation: the same question prompt as training (output line `trace | pi`) and the chain form
with zero steps, i.e. the model answers "| final" -- the exact shape of the last stage of training.
(The no-hint prompt would ask for a format the model never saw.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stabray.errors import UserError
from stabray.methods.base import METHODS, Method
from stabray.tasks.base import TOKEN_RE


@dataclass(frozen=True)
class ImplicitCoTParams:
    remove_per_epoch: float = 1.0  # units removed per epoch (linear schedule); > 0
    unit: str = "steps"  # steps | tokens (task tokens of the steps)


def removed_units(epoch: int, per_epoch: float) -> int:
    """Leading units removed at `epoch` (0-based): floor(per_epoch * epoch)."""
    return int(math.floor(per_epoch * epoch + 1e-9))


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

    def validate(self) -> None:
        p = self.params
        if not p.remove_per_epoch > 0:
            raise UserError(f"method 'implicit_cot': remove_per_epoch must be > 0, got {p.remove_per_epoch}")
        if p.unit not in ("steps", "tokens"):
            raise UserError(f"method 'implicit_cot': unit must be 'steps' or 'tokens', got {p.unit!r}")

    def train_view(self, ex, epoch, rng):
        n = removed_units(epoch, self.params.remove_per_epoch)
        if self.params.unit == "steps":
            return ex.question, tuple(ex.steps[n:])
        return ex.question, drop_leading_tokens(tuple(ex.steps), n)

    def eval_steps(self, ex):
        return ()  # "| final": every step internalized

    steps_at_eval = False  # no chain at evaluation: the EAF and eq. (4) are not measured (empty sums)
