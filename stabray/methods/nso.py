"""NSO, noise stability optimization (Zhang, Li, Ju 2024): minimise E_U[L(W + U)], U ~ N(0, sigma^2 I)
on the trainable weights, with the two-point symmetric estimator

    g = 1/(2m) * sum_{i=1..m} [grad L(W + U_i) + grad L(W - U_i)]

which cancels the odd-order terms of the noise and keeps the Hessian-trace regulariser
(sigma^2 / 2) tr(H). One batch costs 2m forward/backward passes (the benchmark checks ~2m x SFT).
The weights are restored exactly after each perturbation (copied back, not subtracted). The loss
reported for the step is the mean of the 2m perturbed losses. U is drawn from torch's global RNG,
which the trainer seeds and checkpoints, so runs repeat exactly and resume exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stabray.errors import UserError
from stabray.methods.base import METHODS, Method


@dataclass(frozen=True)
class NSOParams:
    sigma: float = 0.01  # standard deviation of the weight noise U (absolute, weight units)
    samples: int = 1  # m: noise samples per batch, each used at +U and -U


@METHODS.register("nso")
class NSO(Method):
    Params = NSOParams

    def validate(self) -> None:
        if not self.params.sigma >= 0:
            raise UserError(f"method 'nso': sigma must be >= 0, got {self.params.sigma}")
        if self.params.samples < 1:
            raise UserError(f"method 'nso': samples must be >= 1, got {self.params.samples}")

    def step(self, model, batch) -> float:
        params = self.trainable_parameters(model)
        m, sigma = self.params.samples, self.params.sigma
        with torch.no_grad():
            orig = [p.detach().clone() for p in params]
        total = 0.0
        try:
            for _ in range(m):
                noise = [torch.randn_like(p) * sigma for p in params]
                for sign in (1.0, -1.0):
                    with torch.no_grad():
                        for p, w, u in zip(params, orig, noise):
                            p.copy_(w + sign * u)
                    loss = self.loss(model, batch) / (2 * m)  # gradients accumulate into .grad
                    loss.backward()
                    total += float(loss.detach())
        finally:
            with torch.no_grad():
                for p, w in zip(params, orig):
                    p.copy_(w)
        return total
