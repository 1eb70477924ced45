"""Per-step input-Jacobian spectral norms, rho and the error amplification factor (paper §3.1).

Steps. Block 0 is the question (only used with `include_question=True`), blocks 1..n are the
intermediate steps (`Encoded.step_spans`) and block T = n + 1 is the final answer (`final_span`
without its EOS token: EOS ends every answer and carries no content). The model's output for block
t is the EXPECTED EMBEDDING `softmax(logits) @ E` (E = the input embedding matrix) at the positions
that predict block t's tokens (start-1 .. end-2). `J_i^(t)` is its Jacobian with respect to the
input embeddings of block i's tokens at the ground-truth prefix (the model is fed `inputs_embeds`).

Estimator. One spectral norm per (i, t) pair, t > i, by power iteration on J^T J with
`torch.func.vjp` (J^T u) and a JVP (J v; the batched path takes it as the vjp of the linear vjp
function, which reuses the saved forward graph and measured faster here than `torch.func.jvp`); the
estimate after the last iteration is ||J^T J v|| / ||J v||,
a lower bound of sigma_max that is at least as tight as ||J v||. All pairs of all examples in a
batch run at once: the forward is done once per batch, `vjp`'s saved graph is reused across all
iterations, and `vmap` carries one tangent per (pair, example) (a "probe"). The probes of one
input block i share a window: every tangent is zero before block i, so that prefix runs once as a
KV cache, and the sequence is cut after the last output read (both exact; `prefix_cache=False`
differentiates from position 0). Vectors live in a
compact (probe, token, hidden) layout, so an `EAFTracker` can keep them between calls and
warm-start the next evaluation (during training, every epoch).

Defaults and why:
- `iters=10`: the paper's setting; with a warm start (`EAFTracker`) 3 iterations per epoch are
  enough because the top singular vector moves little between epochs (`EAFTracker.warm_iters`).
  The dense-oracle test uses 50 iterations to reach 1% on a cold start.
- `token_cap=8`: the OUTPUT side of J_i^(t) is the first 8 tokens of block t, as in the paper's
  code (its `--max_target_tokens_for_jacobian 8`); the INPUT side is every token of block i: the
  paper aggregates over the tokens of a step, and an uncapped input side perturbs the whole step
  (at 10 nodes a Dijkstra step is 12 tokens, so a capped input would never perturb a third of it).
  Cost: the tangents grow with the input block's length; the forward and backward passes, which
  dominate, do not (benchmarks/bench_eaf.py).
- `aggregation="block"`: one spectral norm of the whole (tokens x hidden) block, the quantity
  Lemma 3.1 uses (J_i^(t) maps the whole step y^(i) to the whole output for step t).
  `"token_mean"` is the mean over (input token, output token) pairs of the d x d per-token
  Jacobians' spectral norms, which is how the paper's text says it aggregates token by token.
- `include_question=False`: the question is given exactly at inference, so it is never a source
  of error; EAF = sum_{i=1}^{T-1} rho_i^(T) as in eq. (4). With True, block 0 enters the sum.

Examples with different numbers of steps: the norm matrix is indexed by block position, T_max is
the largest T in the set, and entry (i, t) is the max over the examples that have both blocks i
and t (an example's final answer is its own block T_e). Pairs that no example has stay 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.func import jvp, vjp, vmap

from stabray.data.encode import Encoded, blocks_of, input_blocks
from stabray.models.outputs import embedding_matrix, expected_embedding_fn, prefix_kv
from stabray.models.positions import by_input_stride

AGGREGATIONS = ("block", "token_mean")


# ---------------------------------------------------------------- model access


@contextlib.contextmanager
def measuring(model):
    """Eval mode (dropout off), parameters frozen, parametrized weights (e.g. QAT) computed once
    outside the torch.func transforms; everything restored afterwards."""
    from torch.nn.utils import parametrize

    was_training = model.training
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        with parametrize.cached():
            for m in model.modules():  # fill the cache here, not inside jvp/vmap: a custom
                if parametrize.is_parametrized(m):  # autograd.Function (STE) may not support them
                    for name in m.parametrizations:
                        getattr(m, name)
            yield model
    finally:
        for p, rg in flags:
            p.requires_grad_(rg)
        model.train(was_training)


# ---------------------------------------------------------------- blocks and probes


@dataclass
class _Probes:
    """The probes of one example: each is (key, input positions, output positions)."""

    keys: list[tuple]  # (i, t) for block, (i, t, a, b) for token_mean
    ins: list[list[int]]
    outs: list[list[int]]  # positions whose prediction is compared (block start-1 ..)
    T: int
    length: int  # tokens needed: last output position + 1


def probes_of(
    enc: Encoded, token_cap: int, aggregation: str, include_question: bool, max_t: int | None = None
) -> _Probes:
    """The (i, t) probes of one example: input = every token of block i, output = the positions
    predicting the first `token_cap` tokens of block t. `max_t` keeps only t <= max_t (a chain
    evaluated at a fixed T needs no later block)."""
    ins_b, outs_b = input_blocks(enc), blocks_of(enc, token_cap)
    T = len(ins_b) - 1
    last = T if max_t is None else min(T, max_t)
    keys, ins, outs = [], [], []
    for i in range(0 if include_question else 1, last):
        for t in range(i + 1, last + 1):
            if not ins_b[i] or not outs_b[t]:
                continue
            pred = [p - 1 for p in outs_b[t]]
            if aggregation == "block":
                keys.append((i, t))
                ins.append(ins_b[i])
                outs.append(pred)
            else:
                for a in ins_b[i]:
                    for b in pred:
                        keys.append((i, t, a, b))
                        ins.append([a])
                        outs.append([b])
    length = max((o[-1] + 1 for o in outs), default=len(enc.input_ids) - 1)
    return _Probes(keys, ins, outs, T, length)


# ---------------------------------------------------------------- batched power iteration


def _index(lists: list[list[list[int]]], P: int, C: int, offset: list[int] | int = 0):
    """(P, B, C) long index and validity mask from [example][probe] -> positions."""
    B = len(lists)
    idx = torch.zeros(P, B, C, dtype=torch.long)
    ok = torch.zeros(P, B, C, dtype=torch.bool)
    for b, probes in enumerate(lists):
        off = offset[b] if isinstance(offset, list) else offset
        for p, pos in enumerate(probes):
            idx[p, b, : len(pos)] = torch.tensor(pos) - off
            ok[p, b, : len(pos)] = True
    return idx, ok


def _scatter(v, idx, ok, L):
    """(P, B, C, d) compact -> (P, B, L, d) tangent, zero outside the probe's positions."""
    P, B, C, d = v.shape
    full = v.new_zeros(P, B, L, d)
    return full.scatter_add_(2, idx[..., None].expand(P, B, C, d), v * ok[..., None])


def _gather(y, idx, ok):
    P, B, C = idx.shape
    return y.gather(2, idx[..., None].expand(P, B, C, y.shape[-1])) * ok[..., None]


def _norm(x):  # per (probe, example) norm of (P, B, C, d)
    return x.flatten(2).norm(dim=-1)


def power_iteration(
    f,
    x: torch.Tensor,
    in_idx,
    in_ok,
    out_idx,
    out_ok,
    v0: torch.Tensor,
    iters: int,
    keep: int,
    x_minus: torch.Tensor | None = None,
):
    """Top singular value of every probe's block of df/dx at x (of df(x) - df(x_minus) when given).

    x: (B, L, d); in_idx/in_ok: (P, B, C) positions in L; out_idx/out_ok: (P, B, Co) positions in
    f's output window of `keep` positions; v0: (P, B, C, d) start vectors. Returns (sigma (P, B), v (P, B, C, d)).
    """
    L = x.shape[1]
    primals = [x] if x_minus is None else [x, x_minus]
    signs = [1.0] if x_minus is None else [1.0, -1.0]
    fs = list(f) if isinstance(f, (list, tuple)) else [f] * len(primals)  # one f per primal, or shared
    # One forward per primal; its graph serves every iteration. J v comes from the vjp of the
    # (linear) vjp function, "double vjp": measured ~1.6x faster than vmap over jvp here.
    vjp_fns, jvp_fns = [], []
    for fp, xp in zip(fs, primals):
        out, fn = vjp(fp, xp)
        vjp_fns.append(fn)
        jvp_fns.append(vjp(fn, torch.zeros_like(out))[1])

    def J(v):
        t = _scatter(v, in_idx, in_ok, L)
        ys = [vmap(fn)((t,))[0] for fn in jvp_fns]
        return _gather(sum(s * y for s, y in zip(signs, ys)), out_idx, out_ok)

    def Jt(u):
        c = _scatter(u, out_idx, out_ok, keep)
        ws = [vmap(fn)(c)[0] for fn in vjp_fns]
        return _gather(sum(s * w for s, w in zip(signs, ws)), in_idx, in_ok)

    v = v0 * in_ok[..., None]
    v = v / _norm(v).clamp_min(1e-30)[..., None, None]
    sigma = torch.zeros(v.shape[:2], dtype=v.dtype)
    for _ in range(max(1, iters)):
        u = J(v)
        w = Jt(u)
        sigma = _norm(w) / _norm(u).clamp_min(1e-30)  # ||J^T J v|| / ||J v||
        v = w / _norm(w).clamp_min(1e-30)[..., None, None]
    return sigma, v


# ---------------------------------------------------------------- public API


@dataclass
class EAFTracker:
    """Keeps power-iteration vectors between calls, keyed by the example's index in `encoded`, so
    an evaluation set measured every epoch warm-starts from the previous epoch's vectors.
    `warm_iters` replaces `iters` for a batch whose examples all have stored vectors."""

    warm_iters: int = 3
    vectors: dict[int, torch.Tensor] = field(default_factory=dict)  # index -> (P_e, C, d), CPU

    groups: dict[tuple[int, ...], "EAFTracker"] = field(default_factory=dict)  # per subset of examples

    def get(self, index: int, shape: tuple[int, ...]) -> torch.Tensor | None:
        v = self.vectors.get(index)
        return v if v is not None and tuple(v.shape) == tuple(shape) else None

    def group(self, indexes: list[int]) -> "EAFTracker":
        """The tracker of a subset of the examples (measured apart, e.g. at its own evaluation
        stride), kept between calls under the subset's indexes."""
        return self.groups.setdefault(tuple(indexes), EAFTracker(self.warm_iters))


@dataclass
class EAFResult:
    eaf: float  # sum_{i<T} rho_i^(T) for T = T_max
    norms: torch.Tensor  # (T+1, T+1): [i, t] = sup over examples of ||J_i^(t)||
    rho: torch.Tensor  # (T+1, T+1): [i, t] = rho_i^(t)
    per_example: torch.Tensor  # (N, T+1, T+1): each example's norms, NaN where it lacks the pair
    T: int

    @property
    def measured(self) -> bool:
        """Whether the sum has a term: some example has a measured pair (i, T), 1 <= i < T (with
        include_question the question counts too, but stabray's runs leave it out). False where no
        example has an intermediate step (T < 2), or where none that does has a measured pair at T
        (a generated chain with steps and an empty final answer): an empty sum, 0 by definition."""
        return self.T >= 2 and bool(torch.isfinite(self.per_example[:, 1 : self.T, self.T]).any())


def rho_matrix(norms: torch.Tensor) -> torch.Tensor:
    """rho_i^(t) = ||J_i^(t)|| + sum_{k=i+1}^{t-1} ||J_k^(t)|| rho_i^(k), rho_t^(t) = 1; 0 for t < i."""
    n = norms.shape[0]
    rho = torch.zeros(n, n, dtype=torch.float64)
    N = norms.double()
    for i in range(n):
        rho[i, i] = 1.0
        for t in range(i + 1, n):
            rho[i, t] = N[i, t] + sum(N[k, t] * rho[i, k] for k in range(i + 1, t))
    return rho


def eaf_from_norms(norms: torch.Tensor, T: int | None = None, include_question: bool = False) -> float:
    """EAF = sum_{i<T} rho_i^(T) (i from 1, or 0 with the question), for the chain truncated to T."""
    if norms.ndim != 2 or norms.shape[0] != norms.shape[1]:
        raise ValueError(f"norms must be a square (T+1) x (T+1) matrix, got shape {tuple(norms.shape)}")
    T = norms.shape[0] - 1 if T is None else T
    if not 0 <= T <= norms.shape[0] - 1:  # T = 0: a chain without steps (an empty sum, EAF 0)
        raise ValueError(f"T must be in 0..{norms.shape[0] - 1} for these norms, got {T}")
    rho = rho_matrix(norms[: T + 1, : T + 1])
    return float(rho[0 if include_question else 1 : T, T].sum())


def _check(aggregation: str, iters: int, token_cap: int, batch_size: int = 1, n_examples: int = 1):
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if iters < 1 or token_cap < 1:
        raise ValueError(f"iters and token_cap must be >= 1, got {iters}, {token_cap}")
    if batch_size < 1:  # a batch of -1 examples would measure none and report an EAF of 0
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if n_examples < 1:
        raise ValueError("no examples to measure (an empty list)")


def _start_vectors(seed: int, index: int, P: int, C: int, d: int) -> torch.Tensor:
    """Deterministic per-example start vectors, so the batched and the loop estimator agree."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return torch.randn(P, C, d, generator=g)


def assemble_norms(probes: list[_Probes], sig: list[torch.Tensor], T: int) -> torch.Tensor:
    """Per-example (N, T+1, T+1) norms; token_mean probes are averaged into their (i, t) block."""
    out = torch.full((len(probes), T + 1, T + 1), float("nan"), dtype=torch.float64)
    for n, (pr, s) in enumerate(zip(probes, sig)):
        acc: dict[tuple[int, int], list[float]] = {}
        for key, val in zip(pr.keys, s.tolist()):
            acc.setdefault(key[:2], []).append(val)
        for (i, t), vals in acc.items():
            out[n, i, t] = sum(vals) / len(vals)
    return out


def _result(per_example: torch.Tensor, T: int, include_question: bool) -> EAFResult:
    norms = (
        torch.nan_to_num(per_example, nan=-math.inf).amax(0)
        if len(per_example)
        else torch.zeros(T + 1, T + 1, dtype=torch.float64)
    )
    norms = torch.where(torch.isfinite(norms), norms, torch.zeros_like(norms))
    return EAFResult(eaf_from_norms(norms, T, include_question), norms, rho_matrix(norms), per_example, T)


def estimate_eaf(
    model,
    encoded: list[Encoded],
    *,
    iters: int = 10,
    token_cap: int = 8,
    aggregation: str = "block",
    include_question: bool = False,
    tracker: EAFTracker | None = None,
    batch_size: int = 8,
    max_tangent_elems: int = 1 << 24,
    seed: int = 0,
    prefix_cache: bool = True,
    method=None,
    max_t: int | None = None,
    inputs: list[torch.Tensor] | None = None,
) -> EAFResult:
    """EAF and the per-pair spectral norms over `encoded` (see the module docstring).

    method: a method with latent thoughts (Coconut) feeds the model its filled latents
    (`Method.model_inputs`), and each latent slot is a step: its output is the last hidden state of
    the position before it (the vector fed back into the slot), its input the slot's embedding.
    inputs: per example, the input embeddings (L_e, d) to differentiate at instead (e.g. latent slots
    holding given values); positions and latent slots still come from `encoded` and `method`.
    max_t: measure the chain only up to block max_t (the EAF at T = min(max_t, T_max)).

    batch_size: examples per forward; max_tangent_elems bounds probes x examples x window x d held
    at once (probes beyond it run in further chunks).
    """
    _check(aggregation, iters, token_cap, batch_size)
    if method is not None and method.latent_thoughts:
        encoded = [with_latent_steps(e, method.latent_slots(e.input_ids)) for e in encoded]
    else:
        method = None
    probes = [probes_of(e, token_cap, aggregation, include_question, max_t) for e in encoded]
    T = max((p.T for p in probes), default=0)
    T = T if max_t is None else min(T, max_t)

    def norms(idx: list[int]) -> list[torch.Tensor]:
        # a group of examples measured at one evaluation stride keeps its own warm-start vectors
        # (the tracker's are keyed by the index in the group)
        sub = tracker if tracker is None or len(idx) == len(encoded) else tracker.group(idx)
        return batched_norms(
            model,
            [encoded[i] for i in idx],
            [probes[i] for i in idx],
            iters=iters,
            tracker=sub,
            batch_size=batch_size,
            max_tangent_elems=max_tangent_elems,
            seed=seed,
            prefix_cache=prefix_cache,
            method=method,
            inputs=None if inputs is None else [inputs[i] for i in idx],
        )

    # a model that picks its evaluation stride per input measures each example at its own
    sig = by_input_stride(model, [e.prompt_len for e in encoded], norms)
    return _result(assemble_norms(probes, sig, T), T, include_question)


def _chunks(probes: list[_Probes], idxs: list[int], Pmax: int, prefix_cache: bool, max_rows: int):
    """Probe-index ranges (p0, p1, split, end) of one batch: consecutive probes whose input block
    starts at the same position share a chunk (probes are ordered by input block i), so each
    chunk differentiates only from its own block i on (`split`; 0 without the prefix cache) up to its
    last output position (`end`). `max_rows` bounds probes x (end - split) per chunk."""

    def start(p):
        return min(probes[n].ins[p][0] for n in idxs if p < len(probes[n].ins))

    def stop(p0, p1):
        return max(o[-1] for n in idxs for o in probes[n].outs[p0:p1]) + 1

    out, p0 = [], 0
    while p0 < Pmax:
        p1, s0 = p0 + 1, start(p0)
        while p1 < Pmax and start(p1) == s0 and (p1 + 1 - p0) * (stop(p0, p1 + 1) - s0) <= max(max_rows, 1):
            p1 += 1
        split = s0 if prefix_cache else 0
        out.append((p0, p1, split, stop(p0, p1)))
        p0 = p1
    return out


def with_latent_steps(enc: Encoded, slots: list[int]) -> Encoded:
    """`enc` with each latent slot (a one-position block) among its steps, in sequence order."""
    if not slots:
        return enc
    return dataclasses.replace(enc, step_spans=tuple(sorted([*enc.step_spans, *((p, p + 1) for p in slots)])))


def batched_norms(
    model,
    encoded: list[Encoded],
    probes: list[_Probes],
    *,
    iters: int,
    tracker: EAFTracker | None = None,
    batch_size: int = 8,
    max_tangent_elems: int = 1 << 24,
    seed: int = 0,
    delta_rel: float | None = None,
    prefix_cache: bool = True,
    method=None,
    inputs: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Spectral norm of every probe of every example: a list of (P_e,) tensors.
    `inputs`: per example, input embeddings (L_e, d) used instead of the tokens' (or the method's).

    With `delta_rel`, each example's input embeddings at its probes' input positions are perturbed
    by Gaussian delta with ||delta|| = delta_rel * ||x there||, and the result is
    ||J(x + delta) - J(x)|| / ||delta|| (the finite-difference Lipschitz ratio behind C2).
    prefix_cache: run the tokens before each chunk's input block once as a KV cache (exact; falls
    back to differentiating from position 0 for a model without a cache).
    """
    sig: list[torch.Tensor] = [torch.zeros(0)] * len(encoded)
    E = embedding_matrix(model)
    d, dev = E.shape[1], E.device
    order = sorted(range(len(encoded)), key=lambda n: probes[n].length)  # similar lengths together
    with measuring(model):
        for b0 in range(0, len(order), batch_size):
            idxs = [n for n in order[b0 : b0 + batch_size] if probes[n].keys]
            if not idxs:
                continue
            L = max(probes[n].length for n in idxs)
            ids = [list(encoded[n].input_ids[:L]) for n in idxs]
            ids_t = torch.tensor([r + [r[-1]] * (L - len(r)) for r in ids], device=dev)  # right-padded (B, L)
            if inputs is not None:  # given embeddings, right-padded with zeros (after every output read)
                x = torch.zeros(len(idxs), L, d, dtype=E.dtype, device=dev)
                for b, n in enumerate(idxs):
                    xe = inputs[n][:L].detach().to(dev, E.dtype)
                    x[b, : len(xe)] = xe
            elif method is None:
                x = E[ids_t]  # (B, L, d)
            else:  # the method's inputs (latent slots filled); positions 0..L-1 as without it
                with torch.no_grad():
                    kw = method.model_inputs(model, ids_t, torch.ones_like(ids_t))
                x = kw["inputs_embeds"].detach() if "inputs_embeds" in kw else E[ids_t]
            x_minus, scale = None, None
            if delta_rel is not None:
                g = torch.Generator().manual_seed(seed + 7919 * b0)
                mask = torch.zeros(len(idxs), L, 1)
                for b, n in enumerate(idxs):
                    mask[b, sorted({q for p in probes[n].ins for q in p})] = 1.0
                mask = mask.to(dev, x.dtype)
                delta = torch.randn(x.shape, generator=g).to(dev, x.dtype) * mask
                size = (x * mask).flatten(1).norm(dim=1) * delta_rel  # (B,)
                delta = delta * (size / delta.flatten(1).norm(dim=1).clamp_min(1e-30))[:, None, None]
                x_minus, x, scale = x, x + delta, size.float().cpu()
            latent = [method.latent_slots(r) for r in ids] if method is not None else None
            C = max(len(p) for n in idxs for p in probes[n].ins)
            Co = max(len(p) for n in idxs for p in probes[n].outs)
            Pmax = max(len(probes[n].keys) for n in idxs)
            warm = [tracker.get(n, (len(probes[n].keys), C, d)) if tracker is not None else None for n in idxs]
            starts = [
                w if w is not None else _start_vectors(seed, n, len(probes[n].keys), C, d) for w, n in zip(warm, idxs)
            ]
            k_iters = tracker.warm_iters if tracker is not None and all(w is not None for w in warm) else iters
            sig_b = torch.zeros(Pmax, len(idxs))
            v_b = torch.zeros(Pmax, len(idxs), C, d)
            kv_cache: dict[tuple[int, int], Any] = {}
            for p0, p1, split, end in _chunks(probes, idxs, Pmax, prefix_cache, max_tangent_elems // (len(idxs) * d)):
                # Window [split, end): every tangent of the chunk is zero before `split` (that prefix
                # runs once as a KV cache and is a constant) and no output after `end` is read.
                first_out = min(o[0] for n in idxs for o in probes[n].outs[p0:p1])
                keep = end - first_out
                hidden = None  # (B, keep): outputs that are fed-back hidden states (before a latent slot)
                if latent is not None:
                    hidden = torch.zeros(len(idxs), keep, dtype=torch.bool, device=dev)
                    for b, slots in enumerate(latent):
                        for q in slots:
                            if first_out <= q - 1 < end:
                                hidden[b, q - 1 - first_out] = True
                prim = [x] if x_minus is None else [x, x_minus]  # C2: each primal has its own prefix
                kvs = [None] * len(prim)
                if split > 0:
                    for k, xp in enumerate(prim):
                        if (k, split) not in kv_cache:  # chunks capped by max_rows share a split
                            kv_cache[(k, split)] = prefix_kv(model, xp[:, :split])
                        kvs[k] = kv_cache[(k, split)]
                    if any(kv is None for kv in kvs):  # a model without a KV cache: whole sequence
                        split, kvs = 0, [None] * len(prim)
                fs = [expected_embedding_fn(model, keep, hidden, kv) for kv in kvs]
                xs = [xp[:, split:end] for xp in prim]
                in_idx, in_ok = _index([probes[n].ins[p0:p1] for n in idxs], p1 - p0, C, offset=split)
                out_idx, out_ok = _index([probes[n].outs[p0:p1] for n in idxs], p1 - p0, Co, offset=first_out)
                v0 = torch.zeros(p1 - p0, len(idxs), C, d)
                for b, s0 in enumerate(starts):
                    v0[: s0[p0:p1].shape[0], b] = s0[p0:p1]
                s_, v_ = power_iteration(
                    fs,
                    xs[0],
                    in_idx.to(dev),
                    in_ok.to(dev),
                    out_idx.to(dev),
                    out_ok.to(dev),
                    v0.to(dev, E.dtype),
                    k_iters,
                    keep,
                    x_minus=xs[1] if len(xs) > 1 else None,
                )
                sig_b[p0:p1], v_b[p0:p1] = s_.float().cpu(), v_.float().cpu()
            if scale is not None:
                sig_b = sig_b / scale.clamp_min(1e-30)[None]
            for b, n in enumerate(idxs):
                P = len(probes[n].keys)
                sig[n] = sig_b[:P, b]
                if tracker is not None:
                    tracker.vectors[n] = v_b[:P, b].clone()
    return sig


def estimate_eaf_loop(
    model,
    encoded: list[Encoded],
    *,
    iters: int = 10,
    token_cap: int = 8,
    aggregation: str = "block",
    include_question: bool = False,
    seed: int = 0,
) -> EAFResult:
    """Reference: a Python loop over examples and pairs, one jvp and one vjp (each with its own
    forward) per iteration, as in the paper's code. Same start vectors as `estimate_eaf`."""
    _check(aggregation, iters, token_cap)
    probes = [probes_of(e, token_cap, aggregation, include_question) for e in encoded]
    T = max((p.T for p in probes), default=0)
    E = embedding_matrix(model)
    d, dev = E.shape[1], E.device
    sig = []
    with measuring(model):
        for n, (enc, pr) in enumerate(zip(encoded, probes)):
            if not pr.keys:
                sig.append(torch.zeros(0))
                continue
            x = E[torch.tensor(enc.input_ids[: pr.length], device=dev)][None]  # (1, L, d)
            keep = pr.length - min(o[0] for o in pr.outs)
            f = expected_embedding_fn(model, keep)
            C = max(len(p) for p in pr.ins)
            starts = _start_vectors(seed, n, len(pr.keys), C, d)
            out = []
            for p, (ins, outs) in enumerate(zip(pr.ins, pr.outs)):
                ii = torch.tensor(ins, device=dev)
                oo = torch.tensor(outs, device=dev) - (pr.length - keep)
                v = starts[p, : len(ins)].to(dev, E.dtype)
                v = v / v.norm()
                s = 0.0
                for _ in range(iters):
                    t = torch.zeros_like(x)
                    t[0, ii] = v
                    u = jvp(f, (x,), (t,))[1][0, oo]
                    c = torch.zeros(1, keep, d, dtype=x.dtype, device=dev)
                    c[0, oo] = u
                    w = vjp(f, x)[1](c)[0][0, ii]
                    s = float(w.norm() / u.norm().clamp_min(1e-30))
                    v = w / w.norm().clamp_min(1e-30)
                out.append(s)
            sig.append(torch.tensor(out))
    return _result(assemble_norms(probes, sig, T), T, include_question)
