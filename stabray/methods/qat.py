"""Quantization-aware training: weights fake-quantized in the forward pass, straight-through
gradients (docs/design.md, "Quantization-aware training").

Uniform, symmetric, one scale per output channel (row of W):
- 1 bit: `sign(W) * alpha`, alpha = mean|W| of the row, sign(0) = +1 (the XNOR-Net scale).
- b >= 2 bits: `clamp(round(W / alpha), -2^(b-1), 2^(b-1) - 1) * alpha`, alpha = max|W| of the row
  / (2^(b-1) - 1), so the largest weight lands on the top level.
- 32 bits: off.
The straight-through estimator passes the gradient to W unchanged and treats alpha as a constant
(the clip range never binds with this alpha, so no weight's gradient is masked).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

VALID_BITS = (1, 2, 3, 4, 8, 16, 32)


def quantize(w: torch.Tensor, bits: int) -> torch.Tensor:
    """The quantized weight (no gradient logic); w is (out_features, in_features)."""
    if bits >= 32:
        return w
    if bits == 1:
        alpha = w.abs().mean(dim=1, keepdim=True)
        return torch.where(w >= 0, alpha, -alpha)
    qmax = 2 ** (bits - 1) - 1
    alpha = (w.abs().amax(dim=1, keepdim=True) / qmax).clamp_min(torch.finfo(w.dtype).tiny)
    return torch.clamp(torch.round(w / alpha), -qmax - 1, qmax) * alpha


class FakeQuantize(nn.Module):
    """A `torch.nn.utils.parametrize` parametrization: W -> quantize(W) with straight-through grads."""

    def __init__(self, bits: int):
        super().__init__()
        self.bits = int(bits)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        # straight-through: the forward value is quantize(w), the gradient passes to w unchanged
        # (with alpha = max|w| / qmax no weight lies outside the clip range, so no mask is needed)
        return w + (quantize(w, self.bits) - w).detach()


def quantizable_linears(model: nn.Module, target: str) -> list[tuple[str, nn.Linear]]:
    """Linear layers to quantize. target: "auto" (LoRA A/B if the model has LoRA, else every Linear
    but the output head), "lora", "base" (every non-LoRA Linear but the head), "all_linear"."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    out = []
    has_lora = any("lora_" in n for n, _ in model.named_modules())
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or mod is head:
            continue
        parts = name.split(".")
        is_lora = "lora_A" in parts or "lora_B" in parts
        if (
            target == "all_linear"
            or (target == "auto" and (is_lora if has_lora else True))
            or (target == "lora" and is_lora)
            or (target == "base" and not is_lora)
        ):
            out.append((name, mod))
    return out


def apply_qat(model: nn.Module, bits: int, target: str = "auto") -> int:
    """Register fake quantization on the chosen Linear weights; returns how many were wrapped."""
    if bits >= 32:
        return 0
    mods = quantizable_linears(model, target)
    for _, mod in mods:
        parametrize.register_parametrization(mod, "weight", FakeQuantize(bits))
    return len(mods)
