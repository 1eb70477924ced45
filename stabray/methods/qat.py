"""Quantization-aware training: weights fake-quantized in the forward pass, straight-through
gradients (docs/design.md, "Quantization-aware training").

`quantizer="lsq"` (the default): the paper's quantizer (§4, after its ref. [79]),

    Q(W) = Delta * Round(Clamp((W - b) / Delta, Q_N, Q_P)) + b

(the paper prints Clamp(W - b, W_min, W_max) / Delta with W_min = Delta Q_N, W_max = Delta Q_P: the
same map), with a learned step Delta and offset b per output channel (row of W), trained by LSQ
(Esser et al., ICLR 2020). With v = (w - b) / Delta:
- b >= 2 bits: Q_N = -2^(b-1), Q_P = 2^(b-1) - 1 (2 bits: levels -2..1). Forward
  Delta * round(clamp(v, Q_N, Q_P)) + b. Backward (round passes the gradient straight through):
  dQ/dw = 1 if Q_N <= v <= Q_P else 0; dQ/dDelta = round(v) - v inside, Q_N below, Q_P above;
  dQ/db = 0 inside, 1 outside.
- 1 bit: a learned scale times the sign, Delta * sign(w - b) + b, sign(0) = +1. dQ/dw = 1 if |v| <= 1
  else 0 (the straight-through clip); dQ/dDelta = sign(w - b) (exact: the sign does not depend on
  Delta); dQ/db = 0 inside, 1 outside.
- LSQ's gradient scale: the Delta and b gradients are multiplied by g = 1 / sqrt(N * Q_P), N = the
  number of weights one step scales (in_features: the step is per channel; LSQ's per-layer step
  scales the whole layer). Under Adam, which normalizes each parameter's update, g changes little.
- Init: Delta = 2 mean|w| / sqrt(Q_P) per row (LSQ's), at 1 bit mean|w| per row (XNOR-Net's
  L2-optimal scale for sign(w)); b = 0. Delta is floored at 1e-8 in the forward.
Delta and b are `nn.Parameter`s inside the parametrization (`<layer>.parametrizations.weight.0.step`,
`.offset`), so the optimizer trains them and checkpoints hold them. The paper's reference code
differs in details: its g uses the whole tensor's numel, it initializes Delta from max|w|, and uses
"stretched elastic" levels at 2 bits; none of this is implemented here.

`quantizer="fixed"` (ablation): uniform, symmetric, one fixed scale per row, no offset:
- 1 bit: `sign(W) * alpha`, alpha = mean|W| of the row, sign(0) = +1 (the XNOR-Net scale).
- b >= 2 bits: `clamp(round(W / alpha), -2^(b-1), 2^(b-1) - 1) * alpha`, alpha = max|W| of the row
  / (2^(b-1) - 1), so the largest weight lands on the top level; the gradient passes to W unchanged.

32 bits: off. Targets (`quantize`): "auto" (LoRA A/B if the model has LoRA, else every Linear but the
output head), "lora", "base" (every non-LoRA Linear but the head), "all_linear", and "merged" (a LoRA
model: the merged weight W0 + s B A of every adapted layer, as the paper's Q(W^(t)) of the
full-precision weights; the frozen W0 and the adapters stay full precision, the layer computes with
Q(W0 + s B A)).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils import parametrize

from stabray.errors import UserError

VALID_BITS = (1, 2, 3, 4, 8, 16, 32)
QUANTIZERS = ("lsq", "fixed")
QAT_TARGETS = ("auto", "lora", "base", "all_linear", "merged")
STEP_FLOOR = 1e-8


# ---------------------------------------------------------------- the fixed-scale quantizer


def quantize(w: torch.Tensor, bits: int) -> torch.Tensor:
    """The fixed-scale quantized weight (no gradient logic); w is (out_features, in_features)."""
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


# ---------------------------------------------------------------- the paper's quantizer (LSQ)


def qrange(bits: int) -> tuple[int, int]:
    """(Q_N, Q_P): the integer range of a signed b-bit code; (-1, 1) at 1 bit (the sign)."""
    return (-1, 1) if bits == 1 else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def grad_scale(x: torch.Tensor, g: float) -> torch.Tensor:
    """Value x, gradient g * (incoming gradient): LSQ's step-size gradient scale."""
    return (x - x * g).detach() + x * g


def round_ste(x: torch.Tensor) -> torch.Tensor:
    """round(x) forward, identity backward."""
    return (torch.round(x) - x).detach() + x


def lsq_init(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Initial per-row step (out_features, 1): 2 mean|w| / sqrt(Q_P), at 1 bit mean|w|."""
    mean_abs = w.detach().abs().mean(dim=1, keepdim=True)
    step = mean_abs if bits == 1 else 2 * mean_abs / math.sqrt(qrange(bits)[1])
    return step.clamp_min(STEP_FLOOR)


def lsq_quantize(w: torch.Tensor, step: torch.Tensor, offset: torch.Tensor, bits: int) -> torch.Tensor:
    """Q(w) with LSQ's gradients (module docstring); w (out, in), step and offset (out, 1). Plain
    differentiable operations, so it also runs inside torch.func transforms."""
    if bits >= 32:
        return w
    qn, qp = qrange(bits)
    g = 1.0 / math.sqrt(w.shape[1] * qp)
    s = grad_scale(step, g).clamp_min(STEP_FLOOR)
    b = grad_scale(offset, g)
    u = w - b
    if bits == 1:
        c = torch.clamp(u / s.detach(), -1.0, 1.0)  # the straight-through clip; the sign ignores s
        sign = torch.where(u >= 0, torch.ones_like(u), -torch.ones_like(u))
        return s * ((sign - c).detach() + c) + b
    return s * round_ste(torch.clamp(u / s, qn, qp)) + b


class _LSQ(torch.autograd.Function):
    """`lsq_quantize` as one autograd node: the same value, and its gradients written out (module
    docstring) instead of traced through ~14 elementwise operations. On the embedded model's small
    matrices each traced operation costs more in dispatch than in arithmetic: a QAT step took
    1.21-1.40x full precision's with the traced form, 1.20-1.27x with this (benchmarks/bench_qat.py,
    two runs on a quiet machine, README "Performance"). Not for torch.func transforms (no
    setup_context / vmap rule): the stability measures compute parametrized weights outside them
    (`stabray.stability.jacobian.measuring`), and `lsq_quantize` remains for any code that needs them."""

    @staticmethod
    def forward(ctx, w, step, offset, bits: int, g: float):
        qn, qp = qrange(bits)
        s = step.clamp_min(STEP_FLOOR)
        u = w - offset
        v = u / s
        if bits == 1:
            sign = torch.where(u >= 0, 1.0, -1.0).to(w.dtype)
            out = s * sign + offset
            ctx.save_for_backward(v.abs() <= 1.0, sign, step)
        else:
            r = torch.round(torch.clamp(v, qn, qp))
            out = s * r + offset
            inside = (v >= qn) & (v <= qp)
            ctx.save_for_backward(inside, r - torch.where(inside, v, 0.0), step)
        ctx.g = g
        return out

    @staticmethod
    def backward(ctx, grad):
        inside, dq_dstep, step = ctx.saved_tensors  # dQ/dDelta: round(v) - v inside, Q_N / Q_P outside; sign at 1 bit
        g = ctx.g
        gw = torch.where(inside, grad, 0.0)
        gs = (grad * dq_dstep).sum(dim=1, keepdim=True) * g * (step >= STEP_FLOOR)
        gb = (grad - gw).sum(dim=1, keepdim=True) * g  # dQ/db = 1 outside the clip range
        return gw, gs, gb, None, None


class LSQQuantize(nn.Module):
    """A parametrization W -> Q(W) with a learned per-row step and offset (module docstring)."""

    def __init__(self, w: torch.Tensor, bits: int):
        super().__init__()
        self.bits = int(bits)
        self.step = nn.Parameter(lsq_init(w, bits))
        self.offset = nn.Parameter(torch.zeros_like(self.step))

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        if torch._C._are_functorch_transforms_active():  # inside a torch.func transform
            return lsq_quantize(w, self.step, self.offset, self.bits)
        return lsq_quantize_fused(w, self.step, self.offset, self.bits)


def lsq_quantize_fused(w: torch.Tensor, step: torch.Tensor, offset: torch.Tensor, bits: int) -> torch.Tensor:
    """`lsq_quantize` as one autograd node (`_LSQ`): equal values and gradients up to float rounding;
    not inside torch.func transforms."""
    if bits >= 32:
        return w
    return _LSQ.apply(w, step, offset, bits, 1.0 / math.sqrt(w.shape[1] * qrange(bits)[1]))


def make_quantizer(kind: str, w: torch.Tensor, bits: int) -> nn.Module:
    if kind == "lsq":
        return LSQQuantize(w, bits)
    if kind == "fixed":
        return FakeQuantize(bits)
    raise UserError(f"quantizer must be one of {QUANTIZERS}, got {kind!r}")


# ---------------------------------------------------------------- which weights


def linear_types() -> tuple[type, ...]:
    """The layer types that are linear maps with a weight matrix: `nn.Linear` (out, in) and
    transformers' `Conv1D` (GPT-2's attention and MLP layers: a linear map whose weight is stored
    (in, out))."""
    from transformers.pytorch_utils import Conv1D

    return (nn.Linear, Conv1D)


def is_transposed(mod: nn.Module) -> bool:
    """Whether `mod` stores its weight (in, out) (transformers' Conv1D) rather than (out, in)."""
    return not isinstance(mod, nn.Linear)


class OutputRows(nn.Module):
    """A parametrization written for (out, in) weights (per-row steps, offsets and scales: one per
    output channel) applied to a layer that stores its weight (in, out): W -> inner(W^T)^T."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return self.inner(w.t()).t()


def register_rows(mod: nn.Module, make) -> None:
    """Register `make(W)` (a parametrization of an (out, in) weight W, built from it) on `mod`'s weight,
    through `OutputRows` where the layer stores it transposed."""
    if is_transposed(mod):
        parametrize.register_parametrization(mod, "weight", OutputRows(make(mod.weight.detach().t())))
    else:
        parametrize.register_parametrization(mod, "weight", make(mod.weight))


def quantizable_linears(model: nn.Module, target: str) -> list[tuple[str, nn.Module]]:
    """Linear layers to quantize (`linear_types`: GPT-2's Conv1D layers too). target: "auto" (LoRA A/B
    if the model has LoRA, else every linear layer but the output head), "lora", "base" (every
    non-LoRA linear layer but the head), "all_linear"."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    out = []
    has_lora = any("lora_" in n for n, _ in model.named_modules())
    kinds = linear_types()
    for name, mod in model.named_modules():
        if not isinstance(mod, kinds) or mod is head:
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


def lora_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """peft's LoRA-adapted layers (a `base_layer` plus `lora_A` / `lora_B` / `scaling`)."""
    return [
        (n, m)
        for n, m in model.named_modules()
        if all(hasattr(m, a) for a in ("base_layer", "lora_A", "lora_B", "scaling")) and len(m.lora_A) > 0
    ]


class MergedLoRAQuantize(nn.Module):
    """A parametrization of a LoRA layer's frozen base weight W0 such that the layer computes with
    Q(W0 + s B A): base(x) + s B A x = (Q(W0 + s B A) - s B A) x + s B A x. Gradients reach A and B
    through Q's straight-through estimator; the quantizer's step trains as usual."""

    def __init__(self, layer: nn.Module, kind: str, bits: int):
        super().__init__()
        object.__setattr__(self, "layer", layer)  # a reference, not a submodule (no duplicate parameters)
        self.quant = make_quantizer(kind, layer.base_layer.weight.detach() + self.delta(), bits)

    def delta(self) -> torch.Tensor:
        lay = self.layer
        return sum(lay.scaling[a] * (lay.lora_B[a].weight @ lay.lora_A[a].weight) for a in lay.active_adapters)

    def forward(self, w0: torch.Tensor) -> torch.Tensor:
        d = self.delta()
        return self.quant(w0 + d) - d


def apply_qat(model: nn.Module, bits: int, target: str = "auto", quantizer: str = "lsq") -> int:
    """Register fake quantization on the chosen weights; returns how many layers were wrapped. A model
    with no layer to quantize is refused (it would train at full precision under a `bits` label)."""
    if bits >= 32:
        return 0
    if target == "merged":
        layers = lora_layers(model)
        if not layers:
            raise UserError("quantize='merged' quantizes W0 + s B A of LoRA layers, and the model has no LoRA")
        for name, lay in layers:
            if is_transposed(lay.base_layer):
                raise UserError(
                    f"quantize='merged': {name} is a Conv1D layer (GPT-2), whose merged weight is not "
                    "implemented; use quantize auto, lora or base"
                )
            if any(getattr(d, "p", 0.0) > 0 for d in lay.lora_dropout.values()):
                raise UserError(
                    f"quantize='merged': {name} has LoRA dropout, which a merged weight cannot express; set "
                    "model.lora.dropout: 0"
                )
            parametrize.register_parametrization(lay.base_layer, "weight", MergedLoRAQuantize(lay, quantizer, bits))
        return len(layers)
    mods = quantizable_linears(model, target)
    if not mods and target != "lora":
        raise UserError(no_layer_problem(bits, target))
    for _, mod in mods:
        register_rows(mod, lambda w: make_quantizer(quantizer, w, bits))
    return len(mods)


def no_layer_problem(bits: int, target: str) -> str:
    """The refusal of a QAT target with no layer in the model. Not raised for "lora" on a model without
    LoRA: the config check (`qat_model_problem`) refuses that before a model is built, and a checkpoint
    trained that way before the check existed still loads (`load_run`)."""
    return (
        f"bits={bits} with quantize={target!r}: the model has no linear layer to quantize there, so it "
        "would train at full precision under that label"
    )
