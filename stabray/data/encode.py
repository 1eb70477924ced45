"""Turn (prompt, steps, final) into token ids, labels and the token span of every step.

Pieces are tokenized one at a time and concatenated, so each step's span is known exactly (the
stability measure needs "the tokens of step i"). For the word-level tokenizer this equals
tokenizing the whole text; for a pretrained BPE tokenizer it is the tokenization the model is
trained and measured on.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from stabray.tasks.base import END, FINAL_SEP, STEP_SEP

IGNORE = -100  # label of positions that carry no loss


@dataclass(frozen=True)
class Encoded:
    input_ids: tuple[int, ...]  # [bos] prompt answer eos
    labels: tuple[int, ...]  # IGNORE on [bos] and the prompt
    prompt_len: int  # tokens before the answer (bos included)
    step_spans: tuple[tuple[int, int], ...]  # [start, end) of each intermediate step's tokens
    final_span: tuple[int, int]  # [start, end) of the final answer's tokens, eos included


class Encoder:
    """Caches the ids of each text piece: steps repeat across examples and epochs."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        self._ids = lru_cache(maxsize=1 << 16)(self._encode_piece)

    def _encode_piece(self, text: str) -> tuple[int, ...]:
        return tuple(self.tok(text, add_special_tokens=False)["input_ids"])

    def ids(self, text: str) -> tuple[int, ...]:
        return self._ids(text) if text else ()

    def prompt(self, prompt: str) -> list[int]:
        return [*self.bos, *self.ids(prompt)]

    def encode(self, prompt: str, steps: list[str] | tuple[str, ...] | None, final: str) -> Encoded:
        """steps None: answer only (the final); a tuple, even empty: the chain form "s1, s2 | final"."""
        ids = self.prompt(prompt)
        prompt_len = len(ids)
        spans = []
        for k, step in enumerate(steps or ()):
            if k:
                ids += self.ids(STEP_SEP)
            start = len(ids)
            ids += self.ids(step)
            spans.append((start, len(ids)))
        if steps:
            ids += self.ids(FINAL_SEP)
        elif steps is not None:
            ids += self.ids(FINAL_SEP.lstrip())
        start = len(ids)
        ids += self.ids(final) + self.ids(END) + (self.eos,)
        labels = [IGNORE] * prompt_len + ids[prompt_len:]
        return Encoded(tuple(ids), tuple(labels), prompt_len, tuple(spans), (start, len(ids)))


def _find(seq: list[int], sub: tuple[int, ...], start: int = 0) -> int:
    for p in range(start, len(seq) - len(sub) + 1):
        if sub and tuple(seq[p : p + len(sub)]) == sub:
            return p
    return -1


def encode_generated(encoder: "Encoder", prompt: str, generated: list[int]) -> Encoded:
    """The encoding of the model's own answer (token ids after the prompt, EOS removed), with its
    steps and final answer found as `Encoder.encode` lays them out: the steps are the text before
    the first FINAL_SEP split on STEP_SEP, the final answer what follows it. An answer that starts
    with "| " has no steps; one without a separator is all final answer."""
    ids = encoder.prompt(prompt)
    prompt_len = len(ids)
    gen = list(generated)
    fin, lead, sep = encoder.ids(FINAL_SEP), encoder.ids(FINAL_SEP.lstrip()), encoder.ids(STEP_SEP)
    spans: list[tuple[int, int]] = []
    if lead and tuple(gen[: len(lead)]) == lead:
        final_start = len(lead)
    elif (f := _find(gen, fin)) >= 0:
        a = 0
        while True:
            b = _find(gen[:f], sep, a)
            spans.append((prompt_len + a, prompt_len + (b if b >= 0 else f)))
            if b < 0:
                break
            a = b + len(sep)
        final_start = f + len(fin)
    else:
        final_start = 0
    ids += gen + [encoder.eos]
    labels = [IGNORE] * prompt_len + ids[prompt_len:]
    return Encoded(tuple(ids), tuple(labels), prompt_len, tuple(spans), (prompt_len + final_start, len(ids)))


class Batch(dict):
    """A training batch: the model's keyword arguments (input_ids, attention_mask, labels, each
    (B, L)) as a dict, so `model(**batch)` works, plus `encoded`, the examples it was built from
    (their step spans; a method that reads the steps, such as jacreg, needs them)."""

    def __init__(self, tensors: dict[str, torch.Tensor], encoded: tuple[Encoded, ...] = ()):
        super().__init__(tensors)
        self.encoded = tuple(encoded)

    def to(self, device) -> "Batch":
        return Batch({k: v.to(device) for k, v in self.items()}, self.encoded)


def collate(batch: list[Encoded], pad_id: int) -> Batch:
    """Right-padded training batch: input_ids, attention_mask, labels, each (B, L); `.encoded` keeps
    the examples."""
    L = max(len(e.input_ids) for e in batch)
    ids = torch.full((len(batch), L), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), L), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(batch), L), dtype=torch.long)
    for i, e in enumerate(batch):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
        mask[i, :n] = 1
    return Batch({"input_ids": ids, "attention_mask": mask, "labels": labels}, batch)


def left_pad(prompts: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded prompts for batched generation."""
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p) :] = torch.tensor(p)
        mask[i, L - len(p) :] = 1
    return {"input_ids": ids, "attention_mask": mask}


# ---------------------------------------------------------------- the blocks of a chain
# Step i of the stability measure is a block of token positions: block 0 is the question, blocks
# 1..n the intermediate steps, block T = n + 1 the final answer (docs/design.md, "Stability measure").
# The stability measure (stabray.stability) and the Jacobian penalty (stabray.methods.jacreg) read
# the same blocks.


def input_blocks(enc: Encoded) -> list[list[int]]:
    """Token positions of block 0 (the whole question, BOS skipped), 1..n (each whole step) and T
    (the final answer without EOS): the input side of J, never capped."""
    spans = [*enc.step_spans, (enc.final_span[0], enc.final_span[1] - 1)]
    return [list(range(min(1, enc.prompt_len), enc.prompt_len)), *(list(range(a, b)) for a, b in spans)]


def blocks_of(enc: Encoded, token_cap: int) -> list[list[int]]:
    """Token positions of blocks 0..T on the OUTPUT side of J: the first `token_cap` tokens of each
    step and of the final answer (block 0, the question, is never an output and is kept whole).
    The per-step errors eps_t / r_t are measured on these same tokens."""
    blocks = input_blocks(enc)
    return [blocks[0], *(b[:token_cap] for b in blocks[1:])]
