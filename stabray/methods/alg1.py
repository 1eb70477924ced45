"""Algorithm 1 of Li et al. 2026: chain-of-thought length compression + quantization-aware training.

Compression keeps `max(1, floor(lam * T))` of an example's T intermediate steps, kept in order and
resampled every epoch from a generator seeded by (trial seed, epoch) (Algorithm 1, line 2 sits
inside the epoch loop). Strategies (the paper's ablations): `random` (the method), `drop_first`
(keep the last k), `drop_last` (keep the first k), `equal` (k equally spaced).

Evaluation. Accuracy scores the final answer after the model's own (compressed) chain. The
stability quantities (EAF, loss gap, eq. (4), weight noise) are measured on the gold chain the
model is trained to read and write, not on all T steps (`eval_chain="compressed"`, the default):
the k = max(1, floor(lam * T)) steps the strategy keeps. `drop_first`, `drop_last` and `equal` keep
fixed steps anyway; `random` keeps one draw per example from the training distribution itself,
seeded by the question's text (CRC-32), so every trial, seed and bit-width of a study is measured on
the same chains, a chain the model has been trained on with the same probability as any other, and
the paper's reference code does the same (its test answers are subsampled with a fixed seed).
`eval_chain="full"` measures on every step (a chain a lam < 1 model never saw; for comparison).

QAT fake-quantizes the chosen Linear weights at `bits` (1-4; 32 = off) with straight-through
gradients (stabray.methods.qat): `quantizer="lsq"` (default) is the paper's quantizer with a learned
per-channel step and offset, `"fixed"` a fixed per-row scale (ablation). `noise="gaussian"` replaces
quantization by Gaussian weight noise of the same per-row RMS as the fixed quantizer's error (the
paper's noise-type ablation), resampled at every forward pass in training.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from stabray.errors import UserError
from stabray.methods.base import METHODS, Method
from stabray.methods.qat import (
    QAT_TARGETS,
    QUANTIZERS,
    VALID_BITS,
    apply_qat,
    no_layer_problem,
    quantizable_linears,
    quantize,
    register_rows,
)

STRATEGIES = ("random", "drop_first", "drop_last", "equal")
EVAL_CHAINS = ("compressed", "full")


def keep_count(n_steps: int, lam: float) -> int:
    """Steps kept out of n_steps: max(1, floor(lam * T)); none when there are none."""
    return 0 if n_steps == 0 else max(1, int(np.floor(lam * n_steps + 1e-9)))


def compress_indices(n_steps: int, lam: float, strategy: str, rng: np.random.Generator) -> list[int]:
    k = keep_count(n_steps, lam)
    if k >= n_steps:
        return list(range(n_steps))
    if strategy == "random":
        return sorted(rng.choice(n_steps, size=k, replace=False).tolist())
    if strategy == "drop_first":
        return list(range(n_steps - k, n_steps))
    if strategy == "drop_last":
        return list(range(k))
    if strategy == "equal":  # k positions spread evenly: centre of each of k equal segments
        return [int((j + 0.5) * n_steps / k) for j in range(k)]
    raise UserError(f"unknown compression strategy {strategy!r}; known: {', '.join(STRATEGIES)}")


def eval_indices(n_steps: int, lam: float, strategy: str, question: str, chain: str = "compressed") -> list[int]:
    """The steps of the gold evaluation chain (module docstring): the strategy's choice, a `random`
    draw fixed by the question's text; every step with chain="full"."""
    if chain == "full":
        return list(range(n_steps))
    rng = np.random.default_rng(zlib.crc32(question.encode()))
    return compress_indices(n_steps, lam, strategy, rng)


def check_compression_qat(method: str, p) -> None:
    """lam, bits, strategy, eval_chain, quantizer and quantize of a method that compresses chains
    and quantizes (alg1, mtp)."""
    if not 0.0 < p.lam <= 1.0:
        raise UserError(f"method {method!r}: lam must be in (0, 1], got {p.lam}")
    if p.bits not in VALID_BITS:
        raise UserError(f"method {method!r}: bits must be one of {VALID_BITS}, got {p.bits}")
    if p.strategy not in STRATEGIES:
        raise UserError(f"method {method!r}: strategy must be one of {STRATEGIES}, got {p.strategy!r}")
    if p.eval_chain not in EVAL_CHAINS:
        raise UserError(f"method {method!r}: eval_chain must be one of {EVAL_CHAINS}, got {p.eval_chain!r}")
    if p.quantizer not in QUANTIZERS:
        raise UserError(f"method {method!r}: quantizer must be one of {QUANTIZERS}, got {p.quantizer!r}")
    if p.quantize not in QAT_TARGETS:
        raise UserError(f"method {method!r}: quantize must be one of {', '.join(QAT_TARGETS)}, got {p.quantize!r}")


def qat_model_problem(method: str, p, model) -> str | None:
    """A LoRA target (quantize lora or merged) on a model without LoRA (`model.lora`), where QAT would
    quantize nothing and the run be logged at `bits` while it trains at full precision; or None."""
    if p.bits < 32 and p.quantize in ("lora", "merged") and getattr(model, "lora", None) is None:
        return (
            f"method {method!r}: quantize={p.quantize!r} quantizes LoRA adapters, and the model has none "
            "(model.lora is not set); use quantize auto, base or all_linear"
        )
    return None


class GaussianWeightNoise(nn.Module):
    """Parametrization W -> W + N(0, s^2), s per row = RMS of that row's quantization error at
    `bits` (so the noise matches quantization in scale). Noise only in training mode."""

    def __init__(self, bits: int):
        super().__init__()
        self.bits = bits

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return w
        with torch.no_grad():
            s = (quantize(w, self.bits) - w).pow(2).mean(dim=1, keepdim=True).sqrt()
        return w + torch.randn_like(w) * s


@dataclass(frozen=True)
class Alg1Params:
    lam: float = 0.2  # fraction of intermediate steps kept, in (0, 1]; 1.0 = no compression
    bits: int = 32  # QAT bit-width: 1, 2, 3, 4 (8, 16 allowed); 32 = full precision
    strategy: str = "random"  # which steps are kept: random | drop_first | drop_last | equal
    noise: str = "quant"  # quant = QAT; gaussian = Gaussian weight noise of matched scale
    quantizer: str = "lsq"  # lsq = the paper's (learned per-channel step and offset) | fixed (fixed per-row scale)
    # which weights: auto (LoRA A/B if LoRA, else all Linear but the head) | lora | base | all_linear | merged
    # (LoRA: the merged weight W0 + s B A, as the paper's Q(W^(t)))
    quantize: str = "auto"
    eval_chain: str = "compressed"  # gold chain of the stability measures: compressed (trained on) | full


@METHODS.register("alg1")
class Alg1(Method):
    Params = Alg1Params

    def validate(self) -> None:
        p = self.params
        check_compression_qat(self.name, p)
        if p.noise not in ("quant", "gaussian"):
            raise UserError(f"method {self.name!r}: noise must be 'quant' or 'gaussian', got {p.noise!r}")
        if p.noise == "gaussian" and p.quantize == "merged":
            raise UserError(f"method {self.name!r}: noise='gaussian' perturbs layer weights; quantize='merged' is QAT")

    def model_problem(self, model) -> str | None:
        return qat_model_problem(self.name, self.params, model)

    def prepare(self, model):
        p = self.params
        if p.bits < 32:
            if p.noise == "quant":
                apply_qat(model, p.bits, p.quantize, p.quantizer)
            else:
                mods = quantizable_linears(model, p.quantize)
                if not mods and p.quantize != "lora":  # "lora": refused by the config check (no_layer_problem)
                    raise UserError(no_layer_problem(p.bits, p.quantize))
                for _, mod in mods:
                    register_rows(mod, lambda w: GaussianWeightNoise(p.bits))
        return model

    def train_view(self, ex, epoch, rng):
        idx = compress_indices(len(ex.steps), self.params.lam, self.params.strategy, rng)
        return ex.question, tuple(ex.steps[i] for i in idx)

    def eval_steps(self, ex):
        p = self.params
        return tuple(ex.steps[i] for i in eval_indices(len(ex.steps), p.lam, p.strategy, ex.question, p.eval_chain))
