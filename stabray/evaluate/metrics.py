"""Exact-match accuracy of the final answer under greedy decoding, and the final-answer loss gap
(loss given the model's own chain minus loss given the correct chain)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from stabray.data.encode import IGNORE, Encoder
from stabray.evaluate.generate import generate_per_input
from stabray.models.positions import by_input_stride
from stabray.tasks.base import END, FINAL_SEP, STEP_SEP, Example, Task, extract_final, extract_steps, normalize_answer


@dataclass
class EvalResult:
    acc: float  # fraction of examples whose final answer matches exactly
    n: int
    predictions: list[str] = field(default_factory=list)  # generated answer texts
    loss_gap: float | None = None  # mean over examples, nats per final-answer token
    # fraction of answers whose written chain is the example's, token for token; None when the
    # method's evaluation chain is not the whole chain (`writes_whole_chain`)
    steps_acc: float | None = None
    # with steps_acc: the fraction of answers whose written chain first goes off the example's at
    # token k of a step, for every k from 0 to the longest step's end (`departure_shares`)
    departures: dict[int, float] | None = None


def writes_whole_chain(method, examples: list[Example]) -> bool:
    """Whether the method's evaluation chain (`Method.eval_steps`) is each example's whole chain
    (SFT-CoT, QAT, Algorithm 1 at lam = 1, ...) and some example has steps: then the written chain
    can be held against every step. A compressed chain (Algorithm 1 at lam < 1) or a latent one
    (Coconut) has no whole written target, and No CoT writes none."""
    return any(ex.steps for ex in examples) and all(method.eval_steps(ex) == tuple(ex.steps) for ex in examples)


def steps_match(examples: list[Example], texts: list[str]) -> list[bool]:
    """Per example, whether the generated chain (the text before the last '|') is the example's."""
    return [extract_steps(t) == extract_steps(ex.answer) for ex, t in zip(examples, texts)]


def first_departure_token(steps, text: str) -> int | None:
    """Where a written chain first departs from the example's `steps`, as the index of that token
    within its step (normalized tokens, `normalize_answer`); the step separator after a step of m
    tokens, and the end of the chain (the '|' before the final answer), count as token m. A text
    with no '|' is a chain that never ended: all of it is compared, and if it holds the whole chain
    it departs at the missing end. None only when the chain is the example's, '|' included. For a
    LEGO `delta_op` step (`f 2 3`: name, operation, value), 0 is a wrong variable (the clause
    lookup), 1 a wrong operation, 2 a wrong value, 3 a chain that stops, goes on where it should
    not, or never ends."""
    written = extract_steps(text)
    ended = written is not None
    have = (written if ended else normalize_answer(text)).split()
    gold, at = [], []  # the example's chain token by token, and each token's index within its step
    sep = normalize_answer(STEP_SEP).split()
    for j, step in enumerate(steps):
        toks = normalize_answer(step).split()
        tail = sep if j < len(steps) - 1 else []
        gold += toks + tail
        at += list(range(len(toks))) + [len(toks)] * len(tail)
    for k, tok in enumerate(gold):
        if k >= len(have) or have[k] != tok:
            return at[k]
    if len(have) > len(gold) or not ended:
        return len(normalize_answer(steps[-1]).split()) if steps else 0
    return None


def departures(examples: list[Example], texts: list[str]) -> dict[str, int]:
    """Over the written chains that are not the example's (every one `steps_match` calls wrong, a
    chain that never reaches '|' included): how many first depart from it at each token of a step
    ({"0": 12, "1": 40}; `first_departure_token`)."""
    where = [first_departure_token(e.steps, t) for e, t in zip(examples, texts)]
    return {str(i): where.count(i) for i in sorted({w for w in where if w is not None})}


def longest_step(examples: list[Example]) -> int:
    """Tokens of the longest step over the examples' chains (a departure at this index: the chain's end)."""
    return max((len(normalize_answer(s).split()) for ex in examples for s in ex.steps), default=0)


def departure_shares(examples: list[Example], texts: list[str]) -> dict[int, float]:
    """`departures` as fractions of all the examples, with every token index from 0 to the longest
    step's end present (0.0 where no chain goes off), so a per-epoch curve has a point at every
    epoch; they add up to 1 - steps_acc."""
    where = [first_departure_token(e.steps, t) for e, t in zip(examples, texts)]
    last = max([longest_step(examples), *(w for w in where if w is not None)])
    n = max(len(examples), 1)
    return {k: where.count(k) / n for k in range(last + 1)}


def _find_last(seq: list[int], sub: tuple[int, ...]) -> int:
    for p in range(len(seq) - len(sub), -1, -1):
        if tuple(seq[p : p + len(sub)]) == sub:
            return p
    return -1


@torch.no_grad()
def final_answer_loss(
    model, encoder: Encoder, items: list[tuple[list[int], int]], device, batch_size=64, method=None
) -> np.ndarray:
    """Mean CE per example over the tokens from `start` on; items = (ids, start). With a method, the
    model sees the inputs the method gives it (`Method.model_inputs`: Coconut fills its latents)."""
    out = []
    model.eval()
    for b in range(0, len(items), batch_size):
        chunk = items[b : b + batch_size]
        L = max(len(ids) for ids, _ in chunk)
        ids_t = torch.full((len(chunk), L), encoder.pad, dtype=torch.long)
        lab = torch.full((len(chunk), L), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(chunk), L), dtype=torch.long)
        for i, (ids, start) in enumerate(chunk):
            ids_t[i, : len(ids)] = torch.tensor(ids)
            lab[i, start : len(ids)] = torch.tensor(ids[start:])
            mask[i, : len(ids)] = 1
        ids_t, mask = ids_t.to(device), mask.to(device)
        kw = (
            method.model_inputs(model, ids_t, mask)
            if method is not None
            else {"input_ids": ids_t, "attention_mask": mask}
        )
        logits = model(**kw).logits.float()
        ce = F.cross_entropy(
            logits[:, :-1].transpose(1, 2), lab[:, 1:].to(device), ignore_index=IGNORE, reduction="none"
        )
        n = (lab[:, 1:] != IGNORE).sum(1).clamp_min(1).to(device)
        out.extend((ce.sum(1) / n).tolist())
    return np.asarray(out)


def evaluate_split(
    model,
    encoder: Encoder,
    task: Task,
    examples: list[Example],
    method,
    device="cpu",
    loss_gap: bool = False,
    batch_size: int = 64,
    max_new_tokens: int | None = None,
) -> EvalResult:
    """Decode each example from the method's prompt with the method's decoding (greedy to EOS) and
    score the final answer by exact match. A model that picks its evaluation stride per input
    (stabray.models.positions) decodes, and measures the loss gap of, each example at its own."""
    tok = encoder.tok
    prompts = [method.eval_prompt(ex) for ex in examples]
    prompt_ids = [list(encoder.prompt(p)) for p in prompts]
    lens = [len(ids) for ids in prompt_ids]
    if max_new_tokens is None:
        max_new_tokens = (
            max(len(encoder.encode(p, ex.steps, ex.final).input_ids) - n for p, ex, n in zip(prompts, examples, lens))
            + 8
        )
    gen = generate_per_input(
        method, model, encoder, prompts, max_new_tokens, batch_size=batch_size, device=device, prompt_lens=lens
    )
    texts = [tok.decode(g, skip_special_tokens=True) for g in gen]
    correct = [task.is_correct(ex, extract_final(t)) for ex, t in zip(examples, texts)]
    res = EvalResult(acc=float(np.mean(correct)) if correct else 0.0, n=len(examples), predictions=texts)
    if writes_whole_chain(method, examples):
        res.steps_acc = float(np.mean(steps_match(examples, texts)))
        res.departures = departure_shares(examples, texts)
    if loss_gap:
        sep = encoder.ids(FINAL_SEP.strip())
        gold, own = [], []
        for p, ids, ex, g in zip(prompts, prompt_ids, examples, gen):
            e = encoder.encode(p, method.eval_steps(ex), ex.final)
            gold.append((list(e.input_ids), e.final_span[0]))
            pos = _find_last(g, sep) if sep else -1
            prefix = ids + (g[: pos + len(sep)] if pos >= 0 else [])
            tail = list(encoder.ids(ex.final) + encoder.ids(END)) + [encoder.eos]
            own.append((prefix + tail, len(prefix)))

        def gap(idx: list[int]) -> list[float]:
            a = final_answer_loss(model, encoder, [own[i] for i in idx], device, batch_size, method)
            b = final_answer_loss(model, encoder, [gold[i] for i in idx], device, batch_size, method)
            return list(a - b)

        res.loss_gap = float(np.mean(by_input_stride(model, lens, gap)))
    return res
