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

import torch

from stabray.errors import UserError


class RandomPositions(torch.nn.Module):
    """Wraps a rotary-embedding module: in training mode, position p is replaced by `table[p]`."""

    def __init__(self, rotary: torch.nn.Module, span: int, eval_stride: int = 1, span_min: int | None = None):
        super().__init__()
        self.rotary = rotary
        self.span = int(span)
        self.span_min = span_min  # None: every step uses the whole span
        self.eval_stride = int(eval_stride)  # eval mode: position p -> p * eval_stride
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
    model: torch.nn.Module, span: int, eval_stride: int = 1, span_min: int | None = None
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
