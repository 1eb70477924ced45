"""Randomized position ids for the embedded RoPE decoder (`model.positions: random`).

A model trained on sequences of at most N tokens has seen rotary phases only for distances below N;
a longer test input brings distances it never saw (Ruoss et al. 2023, "Randomized Positional
Encodings Boost Length Generalization of Transformers"). With `positions: random`, every training
step draws one sorted random subset of `0 .. span-1` (`model.position_span`, default
`model.max_positions`) with as many elements as the batch has tokens, and token t of every sequence
of that step gets the t-th smallest element as its position: token order is kept, the gaps between
positions are random, and distances up to `span - 1` occur in training whatever the training length.
Evaluation, generation and the stability measure (the model in eval mode) use evenly spaced
positions 0, k, 2k, ... (`model.position_eval_stride` k, default 1: the ordinary positions, as
skip-wise position training, PoSE, Zhu et al. 2023, does): every distance a test input of at most
`span / k` tokens brings was seen in training. A stride of about half the mean training gap
(span / training length) or more keeps the evaluation's distances like the training's: on
LEGO-cyclic (2-3 variables, span 128, mean gap about 3) stride 2 scored 0.575 in distribution where
stride 1 scored 0.170, the same trained model; on labelled Dijkstra (span 512, mean gap about 7)
strides 3-4 worked best (docs/calibration.md).

Per-input stride (`model.position_eval_stride: [2, 3, 4]`, a list): a fixed stride k only keeps a test
sequence of at most `span / k` tokens inside the trained positions, so a longer graph runs past them
(on labelled Dijkstra at stride 3, 135 of 200 seven-node sequences did). With a list, each input gets
the largest listed stride at which its *expected* whole sequence still fits the span, decided from
its prompt alone: expected length = ceil(prompt tokens x the length ratio), the ratio being the
largest (whole sequence / prompt) token ratio over the training examples (`set_length_ratio`, which
the trial runner calls), so no gold answer decides; the smallest listed stride when none fits. Short
inputs keep the sparse positions that suit them, long ones get denser positions that fit (Ruoss et
al. likewise draw positions per input). Everything that runs the model on evaluation inputs
(generation, the loss gap, the EAF, the inference loss of weight-noise stability) groups them by
stride (`by_input_stride`) and runs each group at its stride; the eq. (4) decomposition, whose
suprema mix every example's terms, runs at the stride of its set's longest input (`common_stride`).
Between evaluations (and in `model.eval()` outside stabray's evaluation) the smallest listed stride
is in effect.

With `model.position_span_min` m, each step first draws its own span uniformly from
`max(length, m) .. span` and then the subset from `0 .. that span - 1`: the density of positions varies
from step to step, from nearly contiguous (gaps of 1) to spread over the whole span, so that plain
evaluation positions (stride 1) look like some training steps' and a longer test input's distances
like others'.

One table per optimizer step, shared by the rows of the batch and by every forward of that step:
methods that run the model several times per step (Coconut's passes over a growing prefix, the
Jacobian regulariser's cached prefix) see consistent positions. The training loop draws it
(`draw_positions`) before each step from a generator seeded by (seed, step), so a resumed trial
draws the same tables.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import torch

from stabray.errors import UserError

T = TypeVar("T")


class RandomPositions(torch.nn.Module):
    """Wraps a rotary-embedding module: in training mode, position p is replaced by `table[p]`."""

    def __init__(
        self, rotary: torch.nn.Module, span: int, eval_stride: int | Sequence[int] = 1, span_min: int | None = None
    ):
        super().__init__()
        self.rotary = rotary
        self.span = int(span)
        self.span_min = span_min  # None: every step uses the whole span
        strides = (eval_stride,) if isinstance(eval_stride, int) else tuple(sorted({int(k) for k in eval_stride}))
        if not strides or min(strides) < 1:
            raise ValueError(f"evaluation strides must be positive integers (got {eval_stride!r})")
        self.eval_strides = strides  # more than one: per input, the largest that fits (input_strides)
        self.eval_stride = strides[0]  # the stride in effect: eval mode maps position p -> p * eval_stride
        self.length_ratio: float | None = None  # per-input strides: set by set_length_ratio
        self.table: torch.Tensor | None = None  # set by draw_positions before each training step

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        if self.training and self.table is not None:
            need = int(position_ids.max()) + 1
            if need > self.table.numel():
                raise RuntimeError(
                    f"position {need - 1} has no drawn position (the step's table holds {self.table.numel()}); "
                    "draw_positions must be called with the step's longest sequence"
                )
            position_ids = self.table.to(position_ids.device)[position_ids]
        elif not self.training and self.eval_stride != 1:
            position_ids = position_ids * self.eval_stride
        return self.rotary(x, position_ids)


def wrap_random_positions(
    model: torch.nn.Module, span: int, eval_stride: int | Sequence[int] = 1, span_min: int | None = None
) -> torch.nn.Module:
    """Replace the rotary embedding of a transformers Qwen2/Llama-style decoder by RandomPositions."""
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    inner.rotary_emb = RandomPositions(inner.rotary_emb, span, eval_stride, span_min)
    return model


def has_random_positions(model: torch.nn.Module) -> bool:
    return any(isinstance(m, RandomPositions) for m in model.modules())


def draw_positions(model: torch.nn.Module, length: int, generator: torch.Generator) -> torch.Tensor | None:
    """Draw the table of the next training step: a sorted uniform random `length`-subset of
    `0 .. span-1` (with span_min: of `0 .. s-1`, s drawn uniformly from `max(length, span_min) .. span`).
    Returns it (None for a model without random positions)."""
    table = None
    for m in model.modules():
        if isinstance(m, RandomPositions):
            if length > m.span:
                raise UserError(
                    f"a training sequence has {length} tokens, more than model.position_span={m.span}: "
                    f"raise model.position_span to at least {length} (and above the longest test input)"
                )
            if table is None:
                span = m.span
                if m.span_min is not None:
                    span = int(torch.randint(max(length, m.span_min), m.span + 1, (1,), generator=generator))
                table = torch.randperm(span, generator=generator)[:length].sort().values
            m.table = table
    return table


# ---------------------------------------------------------------- per-input evaluation stride


def _per_input(model: torch.nn.Module) -> list[RandomPositions]:
    """The model's RandomPositions modules when they choose a stride per input (several listed)."""
    return [m for m in model.modules() if isinstance(m, RandomPositions) and len(m.eval_strides) > 1]


def length_ratio(pairs: Iterable[tuple[int, int]]) -> float:
    """The largest (whole sequence tokens / prompt tokens) over (sequence, prompt) token counts."""
    ratios = [seq / prompt for seq, prompt in pairs if prompt > 0]
    if not ratios:
        raise ValueError("length_ratio needs at least one (sequence, prompt) pair with a non-empty prompt")
    return max(ratios)


def set_length_ratio(model: torch.nn.Module, pairs: Iterable[tuple[int, int]]) -> float | None:
    """Record, for a model with per-input strides, the length ratio of its training examples
    ((whole sequence tokens, prompt tokens) pairs, both counted as the model reads them). Returns
    the ratio, or None (nothing to do) for a model without per-input strides."""
    mods = _per_input(model)
    if not mods:
        return None
    ratio = length_ratio(pairs)
    for m in mods:
        m.length_ratio = ratio
    return ratio


def fitting_stride(prompt_tokens: int, ratio: float, span: int, strides: Sequence[int]) -> int:
    """The largest of `strides` at which the expected whole sequence, ceil(prompt_tokens x ratio)
    tokens, keeps every position inside the span ((length - 1) x stride < span); the smallest when none
    does."""
    expected = math.ceil(ratio * prompt_tokens)
    return max((k for k in strides if (expected - 1) * k < span), default=min(strides))


def input_strides(model: torch.nn.Module, prompt_lengths: Sequence[int]) -> list[int] | None:
    """Per prompt (its token count, BOS included, as the model reads it), the evaluation stride the
    model uses for it; None for a model with one fixed stride (or none)."""
    mods = _per_input(model)
    if not mods:
        return None
    m = mods[0]
    if m.length_ratio is None:
        raise RuntimeError(
            f"the model chooses its evaluation stride per input (model.position_eval_stride {list(m.eval_strides)}): "
            "call stabray.models.positions.set_length_ratio(model, pairs) with its training examples first"
        )
    return [fitting_stride(n, m.length_ratio, m.span, m.eval_strides) for n in prompt_lengths]


@contextlib.contextmanager
def eval_stride(model: torch.nn.Module, stride: int):
    """Evaluate at one stride inside the block (every RandomPositions module, per-input choice off:
    code inside that groups inputs by stride sees one fixed stride); restored afterwards."""
    mods = [m for m in model.modules() if isinstance(m, RandomPositions)]
    kept = [(m.eval_stride, m.eval_strides) for m in mods]
    for m in mods:
        m.eval_stride, m.eval_strides = int(stride), (int(stride),)
    try:
        yield
    finally:
        for m, (k, ks) in zip(mods, kept):
            m.eval_stride, m.eval_strides = k, ks


def by_input_stride(
    model: torch.nn.Module, prompt_lengths: Sequence[int], run: Callable[[list[int]], list[T]]
) -> list[T]:
    """`run(indexes)` returns one result per index given; with per-input strides it is called once per
    stride, on the indexes of the inputs that get it and at that stride, and the results come back in
    input order. Without, it is called once on every index."""
    strides = input_strides(model, prompt_lengths)
    if strides is None:
        return run(list(range(len(prompt_lengths))))
    out: list = [None] * len(prompt_lengths)
    for k in sorted(set(strides)):
        idx = [i for i, s in enumerate(strides) if s == k]
        with eval_stride(model, k):
            got = run(idx)
        if len(got) != len(idx):
            raise RuntimeError(f"by_input_stride: {len(got)} results for {len(idx)} inputs")
        for i, r in zip(idx, got):
            out[i] = r
    return out


def common_stride(model: torch.nn.Module, prompt_lengths: Sequence[int]):
    """A context for a measure taken over a whole set at once: with per-input strides, the stride of
    the set's longest input (the smallest chosen: every input of the set fits at it); otherwise
    nothing changes."""
    strides = input_strides(model, prompt_lengths)
    return eval_stride(model, min(strides)) if strides else contextlib.nullcontext()
