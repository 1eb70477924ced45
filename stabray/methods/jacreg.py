"""jacreg: SFT-CoT's loss plus beta times an unbiased random-projection estimate of the squared
Frobenius norm of the step-to-step input Jacobians (after Hoffman, Roberts, Yaida 2019).

The Jacobians are the stability measure's (docs/design.md, "Stability measure"), on the chain the
method trains on: for an example with intermediate steps 1..n and final answer T = n + 1,
J_i^(t) (1 <= i < t <= T) is the Jacobian of the model's output for block t (the expected embedding
`softmax(logits) @ E`, E detached, at the positions predicting the first `token_cap` tokens of block
t) with respect to the input embeddings of every token of block i, at the teacher-forced chain. The
question (block 0) is not an input, as in the EAF. Blocks come from
`stabray.data.encode.input_blocks` / `blocks_of`, the output map from
`stabray.models.outputs.expected_embedding_fn`: the same code the EAF is measured with. Per example,

    R = sum_{1 <= i < t <= T} ||J_i^(t)||_F^2,

the squared Frobenius norm of the chain's Jacobian from step inputs to later step outputs (its
strictly block-lower-triangular part). The loss is CE + beta * mean over the batch's examples of R.

What is sampled, and why the estimate is unbiased. Per batch of B examples, B' of which have a pair
(an example without intermediate steps has none; its R is 0): m = min(`samples`, B') of those B'
examples, uniformly without replacement; per sampled example r and projection k = 1..K
(`projections`), one input block i, uniform over the example's n_r blocks that have a later output,
and one vector v ~ N(0, I) on the input embeddings of block i's tokens (zero on every other
position). One forward-mode JVP gives J v at every later output at once, so all t > i are read from
it. The estimate is

    R_hat = (B' / B) * (1 / (m K)) * sum_{r, k} n_r * sum_{t > i} ||J_i^(t) v||^2.

E_v ||J v||^2 = tr(J^T J) = ||J||_F^2 for any matrix J, so for one (r, i) the expectation over v is
n_r * sum_{t > i} ||J_i^(t)||_F^2; the uniform i (probability 1 / n_r) turns that into R_r; the mean
over a uniform subset of the B' examples is unbiased for their mean, and B' / B turns that into the
mean over all B (the others contribute 0). So E R_hat = (1 / B) * sum_b R_b: unbiased, and the
scales n_r and B' / B are exactly the inverse sampling probabilities. Why sample: the penalty's cost
grows with the examples it reads (a JVP through the network and the backward through it), so a few
examples keep a step within about twice SFT-CoT's (benchmarks/bench_methods.py) at any batch size;
the price is variance, which SGD averages over steps like the minibatch noise itself.

Cost per batch: the CE forward, one JVP of the m sampled examples over the window from their
earliest chosen block to the last output read (K tangents share its primal, under vmap), and the
backward through both; the tokens before the window enter as the CE forward's own key/value cache,
which carries the weights' gradient (the Jacobian depends on the prefix through attention).

Gradient. The penalty's gradient reaches every trainable weight through the evaluation point (the
input embeddings of the window's tokens are E[ids], live) and the network; not through the random
vectors (constants) and not through the E of the output map (detached, as in the measure). Under
LoRA only the adapters train (the base weights are frozen by the model builder).

Combinable with Algorithm 1 as `alg1` composes it (the same code, by inheritance): `lam` compresses
the chain the model trains on (the penalty then acts on the compressed chain, the method's own),
`bits` fake-quantizes weights (QAT; the parametrized weights are computed once per step, so the CE
and the penalty see the same quantized, or noised, weights), and the stability measures use the
compressed gold chain (`eval_chain`). Defaults lam = 1, bits = 32: SFT-CoT plus the penalty.
beta = 0 is SFT-CoT's loss exactly (the penalty is not computed), and so is the loss of a model in
eval mode (`model.eval()`): the penalty is a training regularizer, and its draws come from torch's
global RNG, which the trainer seeds and checkpoints, so an evaluation must not consume them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.func import jvp, vmap
from torch.nn.utils import parametrize

from stabray.data.encode import Encoded, blocks_of, input_blocks
from stabray.errors import UserError
from stabray.methods.alg1 import Alg1, Alg1Params
from stabray.methods.base import METHODS
from stabray.models.outputs import expected_embedding_fn


@dataclass(frozen=True)
class JacRegParams(Alg1Params):
    lam: float = 1.0  # Algorithm 1 compression: fraction of steps kept (1.0 = all, SFT-CoT's chain)
    bits: int = 32  # QAT bit-width (32 = off)
    beta: float = 0.03  # weight of the penalty (>= 0; 0 = SFT-CoT's loss); spaces.yaml says why this value
    samples: int = 4  # m: examples per batch the penalty is estimated on (drawn among those with a pair)
    projections: int = 1  # K: random vectors per sampled example, each with its own input block
    token_cap: int = 8  # output side of J_i^(t): the first token_cap tokens of block t (as eval.eaf_token_cap)


@dataclass
class Pairs:
    """What one batch's estimate reads: the sampled examples (`rows`, indices into the batch) and,
    per projection k and sampled example r, the positions of its input block i and the output
    positions read (those predicting the first token_cap tokens of every block t > i)."""

    rows: list[int]  # the sampled examples, m of them
    ins: list[list[list[int]]]  # [k][r] -> positions of block i
    outs: list[list[list[int]]]  # [k][r] -> output positions read
    n: list[int]  # [r] -> n_r, the example's input blocks with a later output
    scale: float  # B' / B: the share of the batch's examples that have a pair at all


def candidate_blocks(enc: Encoded, token_cap: int) -> list[tuple[list[int], list[int]]]:
    """(input positions of block i, output positions for every block t > i) for each step i = 1..n
    that has a later output; the same blocks as the stability measure (question excluded)."""
    ins, outs = input_blocks(enc), blocks_of(enc, token_cap)
    T = len(ins) - 1
    cands = []
    for i in range(1, T):
        read = [q - 1 for t in range(i + 1, T + 1) for q in outs[t]]  # position q-1 predicts token q
        if ins[i] and read:
            cands.append((ins[i], read))
    return cands


def sample_pairs(
    encoded: tuple[Encoded, ...],
    token_cap: int,
    samples: int,
    projections: int,
    rows: list[int] | None = None,
    choice: list[list[int]] | None = None,
) -> Pairs:
    """Draw `samples` examples uniformly without replacement among those with a pair, and for each
    projection and example one input block uniformly (torch's global RNG, which the trainer seeds
    and checkpoints). `rows` and `choice` ([k][r] -> index into `candidate_blocks`) fix the draws."""
    cands = [candidate_blocks(e, token_cap) for e in encoded]
    have = [b for b, c in enumerate(cands) if c]
    if rows is None:
        perm = torch.randperm(len(have))[: min(samples, len(have))]
        rows = sorted(have[int(j)] for j in perm)
    if choice is None:
        u = torch.rand(projections, len(rows))
        choice = [[int(u[k, r] * len(cands[b])) for r, b in enumerate(rows)] for k in range(projections)]
    ins = [[cands[b][choice[k][r]][0] for r, b in enumerate(rows)] for k in range(len(choice))]
    outs = [[cands[b][choice[k][r]][1] for r, b in enumerate(rows)] for k in range(len(choice))]
    return Pairs(list(rows), ins, outs, [len(cands[b]) for b in rows], len(have) / max(len(encoded), 1))


def _prefix_cache(res, rows: list[int], split: int):
    """Per-layer (key, value) of the sampled rows' first `split` positions from a forward's cache
    (None without one)."""
    cache = getattr(res, "cache", None) or getattr(res, "past_key_values", None)
    layers = getattr(cache, "layers", None)
    if not layers or any(getattr(la, "keys", None) is None for la in layers):
        return None
    return [(la.keys[rows, :, :split], la.values[rows, :, :split]) for la in layers]


def jacobian_penalty(
    model,
    batch,
    pairs: Pairs,
    vectors: torch.Tensor | None = None,
    forward=None,
) -> torch.Tensor:
    """The unbiased estimate of the batch's mean R (module docstring): scale * mean over the sampled
    examples r and the K projections of n_r * ||J_i^(>i) v||^2.

    batch: input_ids (B, L); pairs: from `sample_pairs`; vectors: (K, m, L, d) to use instead of
    N(0, I) draws (only the chosen block's positions are read); forward: the model's output on the
    batch with `use_cache=True` (its cache supplies the prefix before the window; without it the
    JVP runs from position 0). Returns a scalar tensor with the autograd graph of the weights."""
    K, rows = len(pairs.ins), pairs.rows
    if not rows:  # no example has a step followed by a later output: nothing to penalize
        return model.get_input_embeddings().weight.sum() * 0.0
    split = min(p[0] for row in pairs.ins for p in row)
    end = max(p[-1] for row in pairs.outs for p in row) + 1
    first_out = min(p[0] for row in pairs.outs for p in row)
    kv = _prefix_cache(forward, rows, split) if forward is not None and split > 0 else None
    if kv is None:
        split = 0
    W, keep, m = end - split, end - first_out, len(rows)
    ids = batch["input_ids"][rows, split:end]
    x = model.get_input_embeddings()(ids)  # (m, W, d): the evaluation point, live
    d = x.shape[-1]
    in_mask = torch.zeros(K, m, W, 1, dtype=x.dtype, device=x.device)
    out_mask = torch.zeros(K, m, keep, 1, dtype=x.dtype, device=x.device)
    for k in range(K):
        for r in range(m):
            in_mask[k, r, [q - split for q in pairs.ins[k][r]]] = 1.0
            out_mask[k, r, [q - first_out for q in pairs.outs[k][r]]] = 1.0
    if vectors is None:
        v = torch.randn(K, m, W, d, device=x.device, dtype=x.dtype)
    else:
        v = vectors[:, :, split:end].to(x.device, x.dtype)
    v = v.detach() * in_mask  # a constant: no gradient through the random vectors
    f = expected_embedding_fn(model, keep, None, kv)  # (m, W, d) -> (m, keep, d)

    def jv(t):
        return jvp(f, (x,), (t,))[1]

    Jv = jv(v[0])[None] if K == 1 else vmap(jv, randomness="same")(v)  # (K, m, keep, d)
    sq = (Jv * out_mask).pow(2).sum(dim=(2, 3))  # (K, m): ||J_i^(>i) v||^2
    n = torch.tensor(pairs.n, dtype=sq.dtype, device=sq.device)
    return pairs.scale * (sq * n).mean()


@METHODS.register("jacreg")
class JacReg(Alg1):
    Params = JacRegParams

    def validate(self) -> None:
        super().validate()
        p = self.params
        if not (math.isfinite(p.beta) and p.beta >= 0):
            raise UserError(f"method 'jacreg': beta must be a finite number >= 0, got {p.beta}")
        if not (isinstance(p.samples, int) and p.samples >= 1):
            raise UserError(f"method 'jacreg': samples must be an integer >= 1, got {p.samples!r}")
        if not (isinstance(p.projections, int) and p.projections >= 1):
            raise UserError(f"method 'jacreg': projections must be an integer >= 1, got {p.projections!r}")
        if not (isinstance(p.token_cap, int) and p.token_cap >= 1):
            raise UserError(f"method 'jacreg': token_cap must be an integer >= 1, got {p.token_cap!r}")

    def loss(self, model, batch):
        p = self.params
        if p.beta == 0 or not model.training:
            # SFT-CoT's loss, nothing else computed. In eval mode too: the penalty regularizes
            # training, and drawing its random vectors there would move the training RNG stream
            return super().loss(model, batch)
        encoded = getattr(batch, "encoded", ())
        if len(encoded) != batch["input_ids"].shape[0]:
            raise UserError(
                "method 'jacreg' reads each example's steps: build the batch with stabray.data.encode.collate"
            )
        pairs = sample_pairs(encoded, p.token_cap, p.samples, p.projections)
        with parametrize.cached():  # QAT / noised weights once per step: the CE and the JVP share them
            res = model(**batch, use_cache=True)
            penalty = jacobian_penalty(model, batch, pairs, forward=res)
        return res.loss + p.beta * penalty
