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
from typing import Callable

import torch

from stabray.data.encode import Encoder
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


def _score(model, seqs: list[list[int]], targets: list[list[int]], batch_size: int = 16, method=None):
    """For each sequence, at its target positions: (mean CE, ||o - y||_F, ||dCE/do||_F).
    `targets` are positions of target tokens (their predictions are at position - 1). With a
    method, the model sees `method.model_inputs` (Coconut: latents filled)."""
    E = embedding_matrix(model)
    head = model.get_output_embeddings()
    W = head.weight.detach() if head is not None else E
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
                lg = logits[b, pos]  # (n, V)
                ce = float(torch.nn.functional.cross_entropy(lg, y))
                o = torch.softmax(lg, -1) @ E.float()  # (n, d)
                err = float((o - E[y].float()).norm())
                q = torch.softmax(o @ W.float().T, -1)  # the loss as a function of o
                q[torch.arange(len(y)), y] -= 1.0
                c1 = float((q @ W.float()).norm() / len(y))  # d mean-CE / d o
                res.append((ce, err, c1))
    return res


# ---------------------------------------------------------------- the decomposition


def decompose(
    model,
    encoder: Encoder,
    examples: list[Example],
    *,
    iters: int = 10,
    token_cap: int = 8,
    aggregation: str = "block",
    include_question: bool = False,
    c2_delta: float = 1e-2,
    max_new_tokens: int | None = None,
    batch_size: int = 8,
    seed: int = 0,
) -> list[dict]:
    """Rows of Table 2 for T = 1 .. T_max (keys `ROW_KEYS`), plus nothing else."""
    encoded = [encoder.encode(e.question, e.steps, e.final) for e in examples]
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
        )
        probes = [probes_of(e, token_cap, "block", include_question) for e in encoded]
        c2_sig = batched_norms(
            model, encoded, probes, iters=iters, batch_size=batch_size, seed=seed, delta_rel=c2_delta
        )
        c2_pairs = torch.nan_to_num(assemble_norms(probes, c2_sig, jac.T), nan=0.0).amax(0)  # (T+1, T+1)

        max_new = max_new_tokens or max(len(e.input_ids) - e.prompt_len for e in encoded) + 8
        gens = _greedy(model, encoder, [e.question for e in examples], max_new)
        seqs, tgts, keys = [], [], []  # keys: (example, block, "true" | "gen")
        for n, (enc, g) in enumerate(zip(encoded, gens)):
            blocks = blocks_of(enc, token_cap)
            T_e = len(blocks) - 1
            gsteps = parse_steps(g, encoder)
            for t in range(1, T_e + 1):
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
                block_ids = [enc.input_ids[p] for p in blocks[t]]
                seqs.append(pre + block_ids)
                tgts.append(list(range(len(pre), len(pre) + len(block_ids))))
                keys.append((n, t, "gen"))
        scores = dict(zip(keys, _score(model, seqs, tgts)))

    T_max = jac.T
    rho = rho_matrix(jac.norms)
    eps = [0.0] * (T_max + 1)
    r = [0.0] * (T_max + 1)
    c1 = [0.0] * (T_max + 1)
    losses: dict[int, list[tuple[float, float]]] = {}
    for (n, t, kind), (ce, err, g) in scores.items():
        if kind == "true":
            eps[t] = max(eps[t], err)
        else:
            r[t] = max(r[t], err)
            losses.setdefault(t, []).append((ce, scores[(n, t, "true")][0]))
        c1[t] = max(c1[t], g)
    rows = []
    for T in range(1, T_max + 1):
        first = c1[T] * sum(float(rho[t, T]) * eps[t] for t in range(1, T))
        C2 = float(c2_pairs[: T + 1, : T + 1].max()) if T > 1 else 0.0
        second = c1[T] * C2 / 2 * sum(float(rho[t, T]) * sum(r[1:t]) ** 2 for t in range(2, T + 1))
        pairs = losses.get(T, [])
        gap = abs(sum(a for a, _ in pairs) / len(pairs) - sum(b for _, b in pairs) / len(pairs)) if pairs else 0.0
        if T == 1:
            gap = 0.0  # identical prefixes; removes float noise
        bound = first + second
        eaf = float(rho[0 if include_question else 1 : T, T].sum())
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


# ---------------------------------------------------------------- weight-noise stability


def inference_loss(
    model, encoder: Encoder, examples: list[Example], max_new_tokens: int | None = None, method=None
) -> float:
    """Mean final-answer cross-entropy (EOS excluded) given the model's own greedy steps. With a
    method: its evaluation prompt, chain form, decoding and inputs (`Method.eval_prompt`,
    `eval_steps`, `generate`, `model_inputs`); without one, the question and the full chain."""
    prompts = [method.eval_prompt(e) for e in examples] if method is not None else [e.question for e in examples]
    encoded = [
        encoder.encode(p, method.eval_steps(e) if method is not None else e.steps, e.final)
        for p, e in zip(prompts, examples)
    ]
    max_new = max_new_tokens or max(len(e.input_ids) - e.prompt_len for e in encoded) + 8
    was = model.training
    model.eval()
    try:
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
        return sum(s[0] for s in _score(model, seqs, tgts, method=method)) / len(seqs)
    finally:
        model.train(was)


@torch.no_grad()
def weight_noise_stability(
    model, eval_fn: Callable[[torch.nn.Module], float], sigma: float = 0.005, seeds: int = 10
) -> float:
    """Mean increase of eval_fn(model) under isotropic Gaussian noise N(0, sigma^2) added to every
    parameter (Appendix B.2: sigma = 0.005, 10 seeds). Weights are restored bit for bit."""
    params = list(model.parameters())
    saved = [p.detach().clone() for p in params]
    base = float(eval_fn(model))
    incs = []
    try:
        for s in range(seeds):
            g = torch.Generator().manual_seed(s)
            for p in params:
                p.add_(torch.randn(p.shape, generator=g).to(p.device, p.dtype) * sigma)
            incs.append(float(eval_fn(model)) - base)
            for p, w in zip(params, saved):
                p.copy_(w)
    finally:
        for p, w in zip(params, saved):
            p.copy_(w)
    return sum(incs) / len(incs)
