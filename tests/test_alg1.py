"""Algorithm 1's two parts against their formulas: step compression and the QAT quantizer."""

import numpy as np
import pytest
import torch
from torch import nn

from stabray.data.splits import draw
from stabray.errors import UserError
from stabray.methods import get_method
from stabray.methods.alg1 import compress_indices, keep_count
from stabray.methods.qat import apply_qat, quantizable_linears, quantize
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
    assert apply_qat(model, 2, "all_linear") == 1
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
