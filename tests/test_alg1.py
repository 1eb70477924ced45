"""Algorithm 1's two parts against their formulas: step compression (training and the gold
evaluation chain) and the QAT quantizers (the paper's LSQ quantizer against its formula and LSQ's
gradients by hand; the fixed-scale ablation)."""

import numpy as np
import pytest
import torch
from torch import nn

from stabray.data.splits import draw
from stabray.errors import UserError
from stabray.methods import get_method
from stabray.methods.alg1 import compress_indices, eval_indices, keep_count
from stabray.methods.qat import (
    LSQQuantize,
    apply_qat,
    lsq_init,
    lsq_quantize,
    lsq_quantize_fused,
    quantizable_linears,
    quantize,
)
from stabray.tasks import get_task


def ref_quantize(w: np.ndarray, bits: int) -> np.ndarray:
    """Independent numpy statement of the quantizer in docs/design.md, row by row."""
    out = np.empty_like(w)
    for r, row in enumerate(w):
        if bits == 1:
            a = np.abs(row).mean()
            out[r] = np.where(row >= 0, a, -a)
        else:
            levels = 2 ** (bits - 1)
            a = np.abs(row).max() / (levels - 1)
            out[r] = np.clip(np.round(row / a), -levels, levels - 1) * a
    return out


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_quantizer_matches_formula(bits):
    g = torch.Generator().manual_seed(bits)
    w = torch.randn(7, 13, generator=g, dtype=torch.float64)
    w[0, 0] = 0.0  # sign(0) -> +1 at 1 bit
    q = quantize(w, bits)
    np.testing.assert_allclose(q.numpy(), ref_quantize(w.numpy(), bits), rtol=0, atol=1e-12)
    # at most 2^bits distinct values per row
    assert all(len(torch.unique(row)) <= 2**bits for row in q)
    if bits == 1:
        assert q[0, 0] > 0


def test_full_precision_is_identity():
    w = torch.randn(4, 4)
    assert torch.equal(quantize(w, 32), w)


def test_ste_passes_gradient_and_quantizes_forward():
    lin = nn.Linear(6, 5, bias=False)
    model = nn.Sequential(lin)
    assert apply_qat(model, 2, "all_linear", "fixed") == 1
    x = torch.randn(3, 6)
    w_orig = lin.parametrizations.weight.original
    y = model(x)
    torch.testing.assert_close(y, x @ quantize(w_orig.detach(), 2).T)
    y.sum().backward()
    # straight-through: d/dW of sum(x @ Wq^T) passed to W unchanged (inside the clip range)
    torch.testing.assert_close(w_orig.grad, x.sum(0).expand(5, 6))


def test_qat_targets_skip_output_head(tiny_model):
    names = [n for n, _ in quantizable_linears(tiny_model, "auto")]
    assert names and all("lm_head" not in n for n in names)
    assert len(names) == sum(isinstance(m, nn.Linear) for m in tiny_model.modules()) - 1


@pytest.mark.parametrize("quantizer", ["fixed", "lsq"])
def test_gpt2_conv1d_layers_are_quantized_per_output_channel(quantizer):
    """GPT-2's attention and MLP layers are transformers' Conv1D (a linear map stored (in, out)), not
    nn.Linear: they are quantized too, each output channel (a column of the stored weight) on its own
    levels, and the layer computes x @ Q(W^T)^T; the same layer as an nn.Linear gives the same output.
    The output head is left out; a target with no layer is refused rather than trained at full
    precision under a `bits` label."""
    from transformers.pytorch_utils import Conv1D

    from stabray.data.tokenizer import build_tokenizer
    from stabray.models import ModelSpec, build_model

    tok = build_tokenizer(["a b c [ ] 0.5 |"])
    model = build_model(ModelSpec(preset="tiny", family="gpt2", max_positions=32), tok)
    convs = [m for m in model.modules() if isinstance(m, Conv1D)]
    assert convs and apply_qat(model, 2, "auto", quantizer) == len(convs)
    torch.manual_seed(0)
    for conv in convs:
        w = conv.parametrizations.weight.original.detach()  # (in, out)
        lin = nn.Linear(w.shape[0], w.shape[1], bias=False)
        with torch.no_grad():
            lin.weight.copy_(w.t())
        apply_qat(nn.Sequential(lin), 2, "all_linear", quantizer)
        if quantizer == "lsq":  # the same learned step and offset as the Conv1D's quantizer
            inner = conv.parametrizations.weight[0].inner
            lin.parametrizations.weight[0].step.data.copy_(inner.step.data)
        x = torch.randn(3, w.shape[0])
        torch.testing.assert_close(conv(x), lin(x) + conv.bias)
        q = conv.weight.detach()
        assert all(len(torch.unique(q[:, j])) <= 4 for j in range(q.shape[1]))
        if quantizer == "fixed":
            torch.testing.assert_close(q, quantize(w.t(), 2).t())
    head = model.get_output_embeddings()
    assert not hasattr(head, "parametrizations")
    with pytest.raises(UserError, match="bits=2 with quantize='base': the model has no linear layer to quantize"):
        apply_qat(nn.Sequential(nn.ReLU()), 2, "base")


@pytest.mark.parametrize(
    "T,lam,k",
    [(10, 0.1, 1), (10, 0.2, 2), (10, 0.5, 5), (10, 1.0, 10), (7, 0.2, 1), (3, 0.1, 1), (0, 0.5, 0), (28, 0.2, 5)],
)
def test_keep_count_formula(T, lam, k):
    assert keep_count(T, lam) == k == (0 if T == 0 else max(1, int(np.floor(lam * T))))


def test_compression_strategies():
    rng = np.random.default_rng(0)
    assert compress_indices(10, 0.3, "drop_first", rng) == [7, 8, 9]
    assert compress_indices(10, 0.3, "drop_last", rng) == [0, 1, 2]
    assert compress_indices(10, 0.2, "equal", rng) == [2, 7]
    idx = compress_indices(10, 0.5, "random", rng)
    assert len(idx) == 5 and idx == sorted(idx) and len(set(idx)) == 5


def test_random_compression_resampled_each_epoch_and_seeded():
    task = get_task("dijkstra", n_nodes=10)
    ex = next(e for e in draw(task, "t", 50, 0, 10) if len(e.steps) >= 6)
    m = get_method("alg1", lam=0.5)
    views = [m.train_view(ex, epoch, np.random.default_rng([0, epoch]))[1] for epoch in range(6)]
    assert len({v for v in views}) > 1  # resampled across epochs
    again = [m.train_view(ex, epoch, np.random.default_rng([0, epoch]))[1] for epoch in range(6)]
    assert views == again  # identical under the same seed
    for v in views:  # kept steps are a subsequence of the true chain, in order
        it = iter(ex.steps)
        assert all(s in it for s in v) and len(v) == keep_count(len(ex.steps), 0.5)


@pytest.mark.parametrize("params", [{"lam": 0.0}, {"lam": 1.5}, {"bits": 5}, {"strategy": "middle"}, {"lamda": 0.2}])
def test_bad_alg1_params(params):
    with pytest.raises(UserError) as e:
        get_method("alg1", **params)
    assert list(params)[0] in str(e.value)


# -- the paper's quantizer (LSQ) -------------------------------------------------------------------
def ref_lsq(w, step, offset, bits):
    """Q(W) = Delta Round(Clamp((W - b) / Delta, Q_N, Q_P)) + b per row; 1 bit: Delta sign(W - b) + b."""
    u = w - offset
    if bits == 1:
        return np.where(u >= 0, 1.0, -1.0) * step + offset
    qn, qp = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return np.round(np.clip(u / step, qn, qp)) * step + offset


def _lsq_case(bits, seed=0):
    g = torch.Generator().manual_seed(seed + bits)
    w = torch.randn(6, 40, generator=g, dtype=torch.float64)
    # the code range is about +-(1..3) standard deviations: some weights clip, most do not
    step = (0.5 + torch.rand(6, 1, generator=g, dtype=torch.float64)) * 2.0 / 2 ** (bits - 1)
    offset = 0.1 * torch.randn(6, 1, generator=g, dtype=torch.float64)
    return w, step, offset


LSQ_IMPLS = [lsq_quantize, lsq_quantize_fused]  # traced elementwise ops; one autograd node (training)


@pytest.mark.parametrize("impl", LSQ_IMPLS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_lsq_matches_formula(bits, impl):
    w, step, offset = _lsq_case(bits)
    q = impl(w, step, offset, bits)
    np.testing.assert_allclose(q.numpy(), ref_lsq(w.numpy(), step.numpy(), offset.numpy(), bits), rtol=0, atol=1e-12)
    levels = ((q - offset) / step).round()
    assert all(len(torch.unique(row)) <= 2**bits for row in levels)
    assert torch.equal(impl(w, step, offset, 32), w)


@pytest.mark.parametrize("impl", LSQ_IMPLS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_lsq_gradients_by_hand(bits, impl):
    """Autograd through lsq_quantize against LSQ's gradients written out: straight-through to w inside
    the range; step: round(v) - v inside, Q_N / Q_P outside (1 bit: sign(w - b)); offset: 0 inside, 1
    outside; step and offset gradients times g = 1 / sqrt(in_features * Q_P)."""
    w, step, offset = _lsq_case(bits, seed=1)
    w, step, offset = (t.clone().requires_grad_(True) for t in (w, step, offset))
    G = torch.randn(w.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    (impl(w, step, offset, bits) * G).sum().backward()

    W, S, B, Gn = (t.detach().numpy() for t in (w, step, offset, G))
    v = (W - B) / S
    qn, qp = (-1, 1) if bits == 1 else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    inside = (v >= qn) & (v <= qp)
    assert 0 < inside.mean() < 1  # both cases occur
    g = 1 / np.sqrt(W.shape[1] * qp)
    if bits == 1:
        dstep = np.where(v >= 0, 1.0, -1.0)
    else:
        dstep = np.where(inside, np.round(v) - v, np.where(v < qn, qn, qp))
    np.testing.assert_allclose(w.grad.numpy(), Gn * inside, atol=1e-12)
    np.testing.assert_allclose(step.grad.numpy(), g * (Gn * dstep).sum(1, keepdims=True), atol=1e-10)
    np.testing.assert_allclose(offset.grad.numpy(), g * (Gn * ~inside).sum(1, keepdims=True), atol=1e-10)


def test_lsq_init_and_parametrization():
    w = torch.randn(5, 30, dtype=torch.float64)
    m = abs(w).mean(1, keepdim=True)
    torch.testing.assert_close(lsq_init(w, 1), m)
    torch.testing.assert_close(lsq_init(w, 4), 2 * m / 7**0.5)
    lin = nn.Linear(30, 5, bias=False).double()
    apply_qat(nn.Sequential(lin), 3, "all_linear")  # lsq is the default quantizer
    q = lin.parametrizations.weight[0]
    assert isinstance(q, LSQQuantize) and {n for n, _ in lin.named_parameters()} == {
        "parametrizations.weight.original",
        "parametrizations.weight.0.step",
        "parametrizations.weight.0.offset",
    }
    torch.testing.assert_close(lin.weight, lsq_quantize(lin.parametrizations.weight.original, q.step, q.offset, 3))
    assert lin.weight.grad_fn.name() == "_LSQBackward"  # training uses the one-node form


def test_lsq_parametrization_inside_torch_func():
    """Inside a torch.func transform the parametrization falls back to the traced form (the one-node
    form has no vmap / jvp rule): a JVP through a quantized layer equals Q(W) v."""
    from torch.func import jvp

    lin = nn.Linear(30, 5, bias=False).double()
    apply_qat(nn.Sequential(lin), 2, "all_linear")
    q = lin.parametrizations.weight[0]
    x, v = torch.randn(30, dtype=torch.float64), torch.randn(30, dtype=torch.float64)
    _, jv = jvp(lin, (x,), (v,))
    torch.testing.assert_close(jv, lsq_quantize(lin.parametrizations.weight.original, q.step, q.offset, 2) @ v)


# -- the gold evaluation chain ---------------------------------------------------------------------
def test_eval_chain_is_the_compressed_chain():
    task = get_task("dijkstra", n_nodes=10)
    exs = [e for e in draw(task, "t", 40, 0, 10) if len(e.steps) >= 6][:10]
    for strategy in ("random", "drop_first", "drop_last", "equal"):
        m = get_method("alg1", lam=0.3, strategy=strategy)
        for ex in exs:
            k = keep_count(len(ex.steps), 0.3)
            chain = m.eval_steps(ex)
            assert len(chain) == k < len(ex.steps)
            it = iter(ex.steps)
            assert all(s in it for s in chain)  # a subsequence, in order
            assert chain == m.eval_steps(ex)  # deterministic
            if strategy != "random":  # the strategy's own choice, as in training
                assert chain == m.train_view(ex, 0, np.random.default_rng(5))[1]
    rnd = get_method("alg1", lam=0.3)
    picks = {tuple(eval_indices(len(ex.steps), 0.3, "random", ex.question)) for ex in exs}
    assert len(picks) > 1  # a draw per example (fixed by its question), not one subset for all
    assert get_method("alg1", lam=0.3, eval_chain="full").eval_steps(exs[0]) == exs[0].steps
    assert get_method("alg1", lam=1.0).eval_steps(exs[0]) == exs[0].steps
    assert get_method("mtp", lam=0.3).eval_steps(exs[0]) == rnd.eval_steps(exs[0])
    with pytest.raises(UserError, match="eval_chain"):
        get_method("alg1", eval_chain="gold")
    with pytest.raises(UserError, match="quantizer"):
        get_method("alg1", quantizer="seq")
