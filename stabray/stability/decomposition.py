"""The decomposition of eq. (4) (Lemma 3.1, Appendix B.1 Table 2) for T = 1 .. T_max, and
weight-noise stability (Appendix B.2).

Prefix truncation (Figure 2): for each T the chain is cut after block T, and block T is the
target (an intermediate step, or the final answer for an example whose T_e = T). Examples enter
the row for T only if they have a block T. Blocks and the token cap are those of `jacobian.py`:
every per-step quantity (J, errors, losses) uses the same first `token_cap` tokens of a block, so
the terms of the bound live in one space.

Definitions, per example x and block t (sup over x = max over the evaluation set):
- output o_t = expected embedding softmax(logits) @ E at the positions predicting block t;
  y_t = input embeddings of block t's true tokens. ||.|| over a block is the Frobenius norm of
  the (tokens x hidden) matrix, matching the block spectral norm of J.
- eps_t = sup ||o_t(true prefix) - y_t||; r_t = sup ||o_t(self-generated prefix) - y_t||.
- Self-generated prefix for block t: greedy generation of the whole answer once per example,
  split on the STEP_SEP / FINAL_SEP token ids; the prefix is the prompt, the first t-1 generated
  steps (as generated, token for token) and the separator before block t, after which block t's
  TRUE tokens are teacher-forced. So r_t is always measured on the true step's tokens whatever
  length the generated step had; if the model generated fewer than t-1 steps, all its steps are
  used (it skipped steps, and that is what it conditions on).
- loss = mean token cross-entropy over block t's tokens. loss_gap(T) = |mean loss given the
  self-generated prefix - mean loss given the true prefix| over the examples with block T (the
  |L - L*| of Table 2); 0 at T = 1 where both prefixes are the prompt.
- C1(T) = sup ||d loss / d o_T||, with the loss read as a function of the output vector through
  the output embedding (logits = o W_out^T), at both prefixes: the Lipschitz constant of the
  loss in its first argument, as Appendix B.1 estimates it.
- C2(T) = max over pairs (i, t), t <= T, of ||J_i^(t)(x + delta) - J_i^(t)(x)|| / ||delta||
  (power iteration on the difference), delta Gaussian on the Jacobian's input tokens with
  ||delta|| = c2_delta * ||x there||: the finite-difference Lipschitz constant of the Jacobian.
- first_order = C1 sum_{t=1}^{T-1} rho_t^(T) eps_t; second_order = C1 C2 / 2 sum_{t=2}^{T}
  rho_t^(T) (sum_{i<t} r_i)^2; bound = their sum; ratio = bound / loss_gap (NaN when the gap is 0);
  eaf = sum_{i<T} rho_i^(T); sum_eps = sum_{t<T} eps_t (Table 3's column).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from stabray.data.encode import Encoder
from stabray.models.positions import by_input_stride, common_stride
from stabray.record import DECOMP_KEYS
from stabray.stability.jacobian import (
    assemble_norms,
    batched_norms,
    blocks_of,
    embedding_matrix,
    estimate_eaf,
    measuring,
    probes_of,
    rho_matrix,
    with_latent_steps,
)
from stabray.tasks.base import FINAL_SEP, STEP_SEP, Example

ROW_KEYS = tuple(DECOMP_KEYS)  # the row layout is the trial record's (stabray.record)


# ---------------------------------------------------------------- generation


def _greedy(model, encoder: Encoder, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    from stabray.evaluate.generate import greedy

    return greedy(model, encoder, prompts, max_new_tokens, device=embedding_matrix(model).device)


def _split(seq: list[int], sep: tuple[int, ...]) -> list[list[int]]:
    parts, cur, i = [], [], 0
    while i < len(seq):
        if sep and tuple(seq[i : i + len(sep)]) == sep:
            parts.append(cur)
            cur = []
            i += len(sep)
        else:
            cur.append(seq[i])
            i += 1
    parts.append(cur)
    return parts


def parse_steps(generated: list[int], encoder: Encoder) -> list[list[int]]:
    """The generated intermediate steps' token ids: the part before the first FINAL_SEP split on
    STEP_SEP; without a FINAL_SEP only the steps closed by a STEP_SEP count."""
    fin, sep = tuple(encoder.ids(FINAL_SEP)), tuple(encoder.ids(STEP_SEP))
    parts = _split(generated, fin)
    if len(parts) > 1:
        return _split(parts[0], sep) if parts[0] else []
    return _split(generated, sep)[:-1]


# ---------------------------------------------------------------- per-block errors and losses


def _block_score(logits: torch.Tensor, y: torch.Tensor, E: torch.Tensor, W: torch.Tensor):
    """(mean CE, ||o - y||_F, ||dCE/do||_F) of one block: logits (n, V) at the positions predicting
    its tokens y (n,); o = softmax(logits) @ E, the expected embedding."""
    ce = float(torch.nn.functional.cross_entropy(logits, y))
    o = torch.softmax(logits, -1) @ E.float()  # (n, d)
    err = float((o - E[y].float()).norm())
    q = torch.softmax(o @ W.float().T, -1)  # the loss as a function of o
    q[torch.arange(len(y)), y] -= 1.0
    c1 = float((q @ W.float()).norm() / len(y))  # d mean-CE / d o
    return ce, err, c1


def _head(model, E):
    head = model.get_output_embeddings()
    return head.weight.detach() if head is not None else E


def _score(model, seqs: list[list[int]], targets: list[list[int]], batch_size: int = 16, method=None):
    """For each sequence, at its target positions: (mean CE, ||o - y||_F, ||dCE/do||_F).
    `targets` are positions of target tokens (their predictions are at position - 1). With a
    method, the model sees `method.model_inputs` (Coconut: latents filled)."""
    E = embedding_matrix(model)
    W = _head(model, E)
    dev = E.device
    res = []
    with torch.no_grad():
        for b0 in range(0, len(seqs), batch_size):
            S, Tg = seqs[b0 : b0 + batch_size], targets[b0 : b0 + batch_size]
            L = max(len(s) for s in S)
            ids = torch.tensor([s + [s[-1]] * (L - len(s)) for s in S], device=dev)
            kw = method.model_inputs(model, ids, torch.ones_like(ids)) if method is not None else {"input_ids": ids}
            logits = model(use_cache=False, **kw).logits[..., : E.shape[0]].float()
            for b, (s, tg) in enumerate(zip(S, Tg)):
                pos = torch.tensor([p - 1 for p in tg], device=dev)
                y = torch.tensor([s[p] for p in tg], device=dev)
                res.append(_block_score(logits[b, pos], y, E, W))
    return res


def _c2_pairs(model, encoded, T, token_cap, include_question, iters, batch_size, seed, c2_delta, **kw):
    """(T+1, T+1): per pair (i, t), the max over examples of the finite-difference Lipschitz ratio."""
    probes = [probes_of(e, token_cap, "block", include_question, T) for e in encoded]
    if kw.get("method") is not None:
        probes = [
            probes_of(with_latent_steps(e, kw["method"].latent_slots(e.input_ids)), token_cap, "block", False, T)
            for e in encoded
        ]
    sig = batched_norms(model, encoded, probes, iters=iters, batch_size=batch_size, seed=seed, delta_rel=c2_delta, **kw)
    return torch.nan_to_num(assemble_norms(probes, sig, T), nan=0.0).amax(0)


def _rows(T_used, rho, eps, r, c1, c2_pairs, losses, include_question, loss_from: int = 1) -> list[dict]:
    """Table rows for T = 1..T_used from per-block sup errors eps[t], r[t], C1 c1[t] and losses[t]
    (pairs (self-generated, true) per example). Rows with T < loss_from have no loss of their own
    (a latent thought): loss_gap, C1, the bound terms and the ratio are NaN there."""
    rows = []
    for T in range(1, T_used + 1):
        eaf = float(rho[0 if include_question else 1 : T, T].sum())
        C2 = float(c2_pairs[: T + 1, : T + 1].max()) if T > 1 else 0.0
        if T < loss_from:
            nan = math.nan
            rows.append(
                dict(T=T, loss_gap=nan, bound=nan, ratio=nan, first_order=nan, second_order=nan, C1=nan, C2=C2)
                | dict(eaf=eaf, sum_eps=float(sum(eps[1:T])))
            )
            continue
        first = c1[T] * sum(float(rho[t, T]) * eps[t] for t in range(1, T))
        second = c1[T] * C2 / 2 * sum(float(rho[t, T]) * sum(r[1:t]) ** 2 for t in range(2, T + 1))
        pairs = losses.get(T, [])
        gap = abs(sum(a for a, _ in pairs) / len(pairs) - sum(b for _, b in pairs) / len(pairs)) if pairs else 0.0
        if T == 1:
            gap = 0.0  # identical prefixes; removes float noise
        bound = first + second
        rows.append(
            dict(
                T=T,
                loss_gap=gap,
                bound=bound,
                ratio=bound / gap if gap > 0 else math.nan,
                first_order=first,
                second_order=second,
                C1=c1[T],
                C2=C2,
                eaf=eaf,
                sum_eps=float(sum(eps[1:T])),
            )
        )
    return rows


# ---------------------------------------------------------------- the decomposition


def decompose(model, encoder: Encoder, examples: list[Example], *, method=None, **kw) -> list[dict]:
    """Rows of Table 2 (`_decompose`, whose keywords `kw` takes). Its suprema are taken over the
    whole set at once, so a model that picks its evaluation stride per input is measured at one: the
    stride of the set's longest input (stabray.models.positions.common_stride)."""
    prompts = [method.eval_prompt(e) for e in examples] if method is not None else [e.question for e in examples]
    with common_stride(model, [len(encoder.prompt(p)) for p in prompts]):
        return _decompose(model, encoder, examples, method=method, **kw)


def _decompose(
    model,
    encoder: Encoder,
    examples: list[Example],
    *,
    method=None,
    iters: int = 10,
    token_cap: int = 8,
    aggregation: str = "block",
    include_question: bool = False,
    c2_delta: float = 1e-2,
    max_new_tokens: int | None = None,
    batch_size: int = 8,
    seed: int = 0,
    max_T: int | None = None,
) -> list[dict]:
    """Rows of Table 2 for T = 1 .. min(max_T, T_max) (keys `ROW_KEYS`).

    method: the trial's method; its evaluation prompt and gold chain (`Method.eval_prompt`,
    `eval_steps`: Alg. 1 / MTP with lam < 1 their compressed chain) and its decoding are used, so
    every term is measured on the chain the model is trained to read and write. None: the question
    and every step. A method with latent thoughts goes to `decompose_latent`."""
    if not examples:
        raise ValueError("decompose: no examples (an empty list)")
    if not (math.isfinite(c2_delta) and c2_delta > 0):  # the size of C2's finite difference
        raise ValueError(f"decompose: c2_delta must be a finite number > 0, got {c2_delta}")
    if method is not None and method.latent_thoughts:
        return decompose_latent(
            model,
            encoder,
            examples,
            method,
            iters=iters,
            token_cap=token_cap,
            aggregation=aggregation,
            c2_delta=c2_delta,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            seed=seed,
            max_T=max_T,
        )
    prompts = [method.eval_prompt(e) for e in examples] if method is not None else [e.question for e in examples]
    chains = [method.eval_steps(e) for e in examples] if method is not None else [e.steps for e in examples]
    encoded = [encoder.encode(p, c, e.final) for p, c, e in zip(prompts, chains, examples)]
    with measuring(model):
        jac = estimate_eaf(
            model,
            encoded,
            iters=iters,
            token_cap=token_cap,
            aggregation=aggregation,
            include_question=include_question,
            batch_size=batch_size,
            seed=seed,
            max_t=max_T,
        )
        T_used = jac.T
        c2_pairs = _c2_pairs(model, encoded, T_used, token_cap, include_question, iters, batch_size, seed, c2_delta)

        max_new = max_new_tokens or max(len(e.input_ids) - e.prompt_len for e in encoded) + 8
        dev = embedding_matrix(model).device
        if method is not None:
            gens = method.generate(model, encoder, prompts, max_new, device=dev)
        else:
            gens = _greedy(model, encoder, prompts, max_new)
        seqs, tgts, keys = [], [], []  # keys: (example, block, "true" | "gen")
        for n, (enc, g) in enumerate(zip(encoded, gens)):
            blocks = blocks_of(enc, token_cap)
            T_e = len(blocks) - 1
            gsteps = parse_steps(g, encoder)
            for t in range(1, min(T_e, T_used) + 1):
                if not blocks[t]:
                    continue
                true_ids = list(enc.input_ids[: blocks[t][-1] + 1])
                seqs.append(true_ids)
                tgts.append(blocks[t])
                keys.append((n, t, "true"))
                k = min(t - 1, len(gsteps))
                pre = list(enc.input_ids[: enc.prompt_len])
                for j in range(k):
                    pre += gsteps[j] + (list(encoder.ids(STEP_SEP)) if j < k - 1 else [])
                if k:
                    pre += list(encoder.ids(STEP_SEP if t < T_e else FINAL_SEP))
                elif t == T_e and enc.final_span[0] > enc.prompt_len:  # a chain answer without steps: "| final"
                    pre += list(encoder.ids(FINAL_SEP.lstrip()))
                block_ids = [enc.input_ids[p] for p in blocks[t]]
                seqs.append(pre + block_ids)
                tgts.append(list(range(len(pre), len(pre) + len(block_ids))))
                keys.append((n, t, "gen"))
        scores = dict(zip(keys, _score(model, seqs, tgts)))

    rho = rho_matrix(jac.norms)
    eps = [0.0] * (T_used + 1)
    r = [0.0] * (T_used + 1)
    c1 = [0.0] * (T_used + 1)
    losses: dict[int, list[tuple[float, float]]] = {}
    for (n, t, kind), (ce, err, g) in scores.items():
        if kind == "true":
            eps[t] = max(eps[t], err)
        else:
            r[t] = max(r[t], err)
            losses.setdefault(t, []).append((ce, scores[(n, t, "true")][0]))
        c1[t] = max(c1[t], g)
    return _rows(T_used, rho, eps, r, c1, c2_pairs, losses, include_question)


# ---------------------------------------------------------------- latent thoughts (Coconut)


@dataclass
class LatentErrors:
    """Per example: the latent slots, their true values, eps and r per step, the answer's scores."""

    slots: list[int]  # positions of the latent slots in the evaluation encoding
    gold: torch.Tensor  # (L, d): the true value of each latent slot (its step's text proxy)
    gold_inputs: torch.Tensor  # (len, d): input embeddings with the latent slots holding `gold`
    eps: list[float]  # eps_t, t = 1..L+1 (index t-1); the last is the answer's
    r: list[float]  # r_t, same layout
    answer_true: tuple[float, float, float]  # (CE, err, C1) of the answer given the true latents
    answer_gen: tuple[float, float, float]  # the same given the model's own latents


def latent_errors(model, encoder: Encoder, example: Example, method, token_cap: int = 8) -> LatentErrors:
    """eps_t and r_t over the latent slots of one example (eq. (3) with latent thoughts as steps).

    The true value of latent slot j (1-based) is the TEXT PROXY of the step it replaces: the model's
    last-layer hidden state at the last token of gold step ceil(j / c) (c = latents per step) when
    the same model reads the whole chain as text, in the format of the curriculum's stage 0
    (question, `<bot><eot>`, "s1, s2 | final"). A slot beyond the example's last step (the final
    stage pads to max_stage * c latents) takes the last step's proxy (the chain is complete; nothing
    is left to think), and an example without steps the hidden state at the end of its prompt. This
    is the paper's reference code's definition (its latent evaluator's text proxy), and it lives in
    the latent's own space: a latent is a last hidden state fed back as an input embedding.
    - eps_j = ||h_{slot_j - 1}(slots 1..j-1 hold true values) - true_j|| (the thought given true
      earlier thoughts); r_j = ||model's own latent j - true_j|| (free-running, as at inference).
    - The answer (step L+1): eps / r = ||o - y||_F of the expected embeddings of its first token_cap
      tokens given the true / the model's own latents, as for a text step.
    """
    E = embedding_matrix(model)
    W = _head(model, E)
    dev = E.device
    enc = encoder.encode(method.eval_prompt(example), method.eval_steps(example), example.final)
    ids = torch.tensor([enc.input_ids], device=dev)
    slots = method.latent_slots(enc.input_ids)
    text = encoder.encode(example.question + method.markers(0), example.steps, example.final)
    c = method.params.latents_per_step
    with torch.no_grad():
        h_text = model(input_ids=torch.tensor([text.input_ids], device=dev), output_hidden_states=True)
        h_text = h_text.hidden_states[-1][0]  # (len, d)
        ends = [b - 1 for _, b in text.step_spans] or [text.prompt_len - 1]
        gold = torch.stack([h_text[ends[min(j // c, len(ends) - 1)]] for j in range(len(slots))])  # (L, d)
        x_gold = E[ids[0]].clone()
        for j, p in enumerate(slots):
            x_gold[p] = gold[j].to(x_gold.dtype)
        x_gen, pos = method.fill_latents(model, ids, torch.ones_like(ids))
        out = {}
        for kind, x in (("true", x_gold[None]), ("gen", x_gen)):
            res = model(inputs_embeds=x, position_ids=pos, output_hidden_states=True, use_cache=False)
            out[kind] = (res.hidden_states[-1][0], res.logits[0, :, : E.shape[0]].float())
        a, b = enc.final_span[0], enc.final_span[1] - 1  # the answer without EOS, first token_cap tokens
        tgt = list(range(a, b))[:token_cap]
        y = ids[0, tgt]
        answer = {k: _block_score(lg[[p - 1 for p in tgt]], y, E, W) for k, (_, lg) in out.items()}
        h_true = out["true"][0]
        eps = [float((h_true[p - 1] - gold[j]).norm()) for j, p in enumerate(slots)] + [answer["true"][1]]
        r = [float((x_gen[0, p] - gold[j]).norm()) for j, p in enumerate(slots)] + [answer["gen"][1]]
    return LatentErrors(slots, gold, x_gold, eps, r, answer["true"], answer["gen"])


def decompose_latent(
    model,
    encoder: Encoder,
    examples: list[Example],
    method,
    *,
    iters: int = 10,
    token_cap: int = 8,
    aggregation: str = "block",
    c2_delta: float = 1e-2,
    max_new_tokens: int | None = None,
    batch_size: int = 8,
    seed: int = 0,
    max_T: int | None = None,
) -> list[dict]:
    """Eq. (4) over latent thoughts: steps 1..L are the latent slots, step L+1 the answer.

    eps_t, r_t as in `latent_errors`; J_i^(t) (and C2) at the TRUE latents (the slots holding their
    text proxies), as a text chain's Jacobians are taken at the gold prefix; C1 and the loss at the
    answer. The loss gap is |CE(answer | own latents) - CE(answer | true latents)|, averaged over
    examples. Rows T <= L (a latent has no loss of its own) give eaf and sum_eps only."""
    del max_new_tokens  # the latents are computed, not decoded
    encoded = [encoder.encode(method.eval_prompt(e), method.eval_steps(e), e.final) for e in examples]
    with measuring(model):
        errs = [latent_errors(model, encoder, e, method, token_cap) for e in examples]
        inputs = [le.gold_inputs for le in errs]
        jac = estimate_eaf(
            model,
            encoded,
            iters=iters,
            token_cap=token_cap,
            aggregation=aggregation,
            batch_size=batch_size,
            seed=seed,
            method=method,
            max_t=max_T,
            inputs=inputs,
        )
        T_used = jac.T
        c2_pairs = _c2_pairs(
            model, encoded, T_used, token_cap, False, iters, batch_size, seed, c2_delta, method=method, inputs=inputs
        )
    rho = rho_matrix(jac.norms)
    eps = [0.0] * (T_used + 1)
    r = [0.0] * (T_used + 1)
    c1 = [0.0] * (T_used + 1)
    losses: dict[int, list[tuple[float, float]]] = {}
    for le in errs:
        T_e = len(le.slots) + 1
        for t in range(1, min(T_e, T_used) + 1):
            eps[t] = max(eps[t], le.eps[t - 1])
            r[t] = max(r[t], le.r[t - 1])
        if T_e <= T_used:
            c1[T_e] = max(c1[T_e], le.answer_true[2], le.answer_gen[2])
            losses.setdefault(T_e, []).append((le.answer_gen[0], le.answer_true[0]))
    L = min(len(le.slots) for le in errs) if errs else 0
    return _rows(T_used, rho, eps, r, c1, c2_pairs, losses, False, loss_from=L + 1)


# ---------------------------------------------------------------- weight-noise stability


def inference_loss(
    model, encoder: Encoder, examples: list[Example], max_new_tokens: int | None = None, method=None
) -> float:
    """Mean final-answer cross-entropy (EOS excluded) given the model's own greedy steps. With a
    method: its evaluation prompt, chain form, decoding and inputs (`Method.eval_prompt`,
    `eval_steps`, `generate`, `model_inputs`); without one, the question and the full chain."""
    if not examples:
        raise ValueError("inference_loss: no examples (an empty list)")
    prompts = [method.eval_prompt(e) for e in examples] if method is not None else [e.question for e in examples]
    encoded = [
        encoder.encode(p, method.eval_steps(e) if method is not None else e.steps, e.final)
        for p, e in zip(prompts, examples)
    ]
    max_new = max_new_tokens or max(len(e.input_ids) - e.prompt_len for e in encoded) + 8
    was = model.training
    model.eval()
    try:  # a model that picks its evaluation stride per input: each example at its own
        losses = by_input_stride(
            model,
            [e.prompt_len for e in encoded],
            lambda idx: _own_chain_losses(
                model, encoder, [prompts[i] for i in idx], [encoded[i] for i in idx], max_new, method
            ),
        )
        return sum(losses) / len(losses)
    finally:
        model.train(was)


def _own_chain_losses(model, encoder: Encoder, prompts: list[str], encoded: list, max_new: int, method) -> list[float]:
    """inference_loss's per-example final-answer losses, given the model's own greedy steps."""
    if method is not None:
        gens = method.generate(model, encoder, prompts, max_new, device=embedding_matrix(model).device)
    else:
        gens = _greedy(model, encoder, prompts, max_new)
    seqs, tgts = [], []
    for enc, g in zip(encoded, gens):
        gsteps = parse_steps(g, encoder)
        pre = list(enc.input_ids[: enc.prompt_len])
        for j, st in enumerate(gsteps):
            pre += st + list(encoder.ids(STEP_SEP if j < len(gsteps) - 1 else FINAL_SEP))
        if not gsteps and enc.final_span[0] > enc.prompt_len:  # a chain answer without steps: "| final"
            pre += list(encoder.ids(FINAL_SEP))
        final = list(enc.input_ids[enc.final_span[0] : enc.final_span[1] - 1])
        seqs.append(pre + final)
        tgts.append(list(range(len(pre), len(pre) + len(final))))
    return [float(s[0]) for s in _score(model, seqs, tgts, method=method)]


class _AddDelta(torch.nn.Module):
    """A parametrization W -> W + delta (a fixed tensor), appended after a layer's own ones."""

    def __init__(self, delta: torch.Tensor):
        super().__init__()
        self.delta = delta

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w + self.delta


@torch.no_grad()
def weight_noise_stability(
    model, eval_fn: Callable[[torch.nn.Module], float], sigma: float = 0.005, seeds: int = 10
) -> float:
    """Mean increase of eval_fn(model) under isotropic Gaussian noise N(0, sigma^2) added to every
    weight the model computes with (Appendix B.2: sigma = 0.005, 10 seeds). A parametrized weight (QAT's
    fake quantization) gets its noise after its parametrizations, on the quantized weight the layer
    uses, and its latent weight and the quantizer's own step and offset get none: noise on the latent
    weight would mostly round away, and on a learned step it moves every weight of a row (about 4x
    sigma at 4 bits). A model without parametrizations draws the same noise as before this rule.
    Weights are restored bit for bit."""
    from torch.nn.utils import parametrize

    params = [p for n, p in model.named_parameters() if ".parametrizations." not in n]
    weights = [  # (module, name, shape) of every parametrized weight
        (m, name, getattr(m.parametrizations, name).original.shape)
        for m in model.modules()
        if parametrize.is_parametrized(m)
        for name in m.parametrizations
    ]
    if weights and parametrize._cache_enabled:  # cached weights would not see the noise
        raise RuntimeError("weight_noise_stability: called inside torch's parametrize.cached()")
    saved = [p.detach().clone() for p in params]
    base = float(eval_fn(model))
    incs = []
    try:
        for s in range(seeds):
            g = torch.Generator().manual_seed(s)
            for p in params:
                p.add_(torch.randn(p.shape, generator=g).to(p.device, p.dtype) * sigma)
            try:
                for m, name, shape in weights:
                    ref = getattr(m.parametrizations, name).original
                    delta = torch.randn(shape, generator=g).to(ref.device, ref.dtype) * sigma
                    parametrize.register_parametrization(m, name, _AddDelta(delta))
                incs.append(float(eval_fn(model)) - base)
            finally:
                for m, name, _ in weights:
                    if isinstance(getattr(m.parametrizations, name)[-1], _AddDelta):
                        del getattr(m.parametrizations, name)[-1]
            for p, w in zip(params, saved):
                p.copy_(w)
    finally:
        for p, w in zip(params, saved):
            p.copy_(w)
    return sum(incs) / len(incs)
