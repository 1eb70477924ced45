"""The one-layer multi-head non-linear attention model of the paper's eq. (5), and Lemma 3.3's weights.

    f_W(Z) = Z[:, -1] + sum_h W^PV_h Z phi_h(Z^T W^KQ_h Z[:, -1] / n)

over the embedding (D = 2d + 2 rows, n + i + 1 columns)

    Z = [[X, 0_d .. 0_d], [y, 0 .. 0], [0_{d x n}, theta_0 .. theta_i], [0 .. 0, 1 .. 1]].

The prediction of theta_{i+1} is rows d+1 .. 2d of f_W(Z). Every column after the n examples is a
query in one causal pass (column q attends to columns 0 .. q), so the teacher-forced predictions of
a whole chain cost one forward; the attention is not normalized, so masked scores are zeroed after phi.

Non-linearity: phi_h(s) = act_h(n s) / n with act in {linear, cube, square}. For a linear head this is
eq. (5) exactly; for the others it fixes the scale of phi so that Lemma 3.3's weights are O(1).
The value matrices are stored in units of `pv_scale` (the step size, or 2x it for the quadratic
task): W^PV = pv_scale * V, so Adam's per-parameter step fits their size. Neither choice restricts
the function class.

weights = "full" trains every entry of W^KQ_h and W^PV_h (eq. 5 as written). weights = "blocks"
trains only the blocks Lemma 3.3's construction uses, per head: W^KQ[x rows, theta columns] (d x d),
W^KQ[y row, one column] and W^PV[theta rows, x columns] (d x d); every other entry is fixed at 0.
The construction, and every per-head rescaling of it, lies inside (Theorem 3.4's proof restricts the
dynamics further, to the two scalars lambda_K, lambda_V of the aligned start). Why the option exists: for the
quadratic task some entries outside the blocks have a curvature ~1e4 times that of the blocks
(W^PV[theta, y] of a square head multiplies y_k (a_k +- y_k)^2), so finite-batch gradient noise there
swamps the fit (see the README's ICL section for the measurements).
"""

from __future__ import annotations

import torch
from torch import nn

ACTS = {"linear": lambda s: s, "cube": lambda s: s**3, "square": lambda s: s**2}


def embed(X: torch.Tensor, y: torch.Tensor, thetas: torch.Tensor) -> torch.Tensor:
    """X (B, d, n), y (B, n), thetas (B, k, d) -> Z (B, 2d+2, n+k)."""
    B, d, n = X.shape
    k = thetas.shape[1]
    top = torch.cat([X, y[:, None, :], X.new_zeros(B, d + 1, n)], 1)  # (B, D, n)
    bottom = torch.cat([X.new_zeros(B, d + 1, k), thetas.transpose(1, 2), X.new_ones(B, 1, k)], 1)  # (B, D, k)
    return torch.cat([top, bottom], 2)


WEIGHTS = ("full", "blocks")


def block_masks(d: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """0/1 masks (h, D, D) of the trainable entries of W^KQ and V for weights="blocks"."""
    D = 2 * d + 2
    xs, yr, ths, one = slice(0, d), d, slice(d + 1, 2 * d + 1), 2 * d + 1
    mk, mv = torch.zeros(h, D, D), torch.zeros(h, D, D)
    mk[:, xs, ths] = 1
    mk[:, yr, one] = 1
    mv[:, ths, xs] = 1
    return mk, mv


class ICLTransformer(nn.Module):
    def __init__(self, d: int, n: int, acts: tuple[str, ...], pv_scale: float = 1.0, weights: str = "full"):
        super().__init__()
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
        self.d, self.n, self.acts, self.pv_scale, self.weights = d, n, tuple(acts), float(pv_scale), weights
        D, h = 2 * d + 2, len(acts)
        self.W_kq = nn.Parameter(torch.zeros(h, D, D))  # merged key-query, one per head
        self.V = nn.Parameter(torch.zeros(h, D, D))  # merged projection-value in units of pv_scale
        mk, mv = block_masks(d, h) if weights == "blocks" else (torch.ones(h, D, D), torch.ones(h, D, D))
        self.register_buffer("mask_kq", mk, persistent=False)  # derived from `weights`, not saved
        self.register_buffer("mask_v", mv, persistent=False)

    @property
    def kq(self) -> torch.Tensor:
        """The effective W^KQ (entries outside the blocks are 0 with weights="blocks")."""
        return self.W_kq * self.mask_kq if self.weights == "blocks" else self.W_kq

    @property
    def W_pv(self) -> torch.Tensor:
        return self.pv_scale * (self.V * self.mask_v if self.weights == "blocks" else self.V)

    def forward_Z(self, Z: torch.Tensor) -> torch.Tensor:
        """Z (B, D, n+k) -> f_W at every theta column: (B, D, k)."""
        n = self.n
        N = Z.shape[2]
        Zq = Z[:, :, n:]  # (B, D, k) queries
        Zt = Z.transpose(1, 2)[:, None]  # (B, 1, N, D)
        S = Zt @ (self.kq @ Zq[:, None])  # (B, h, N, k) scores without the 1/n
        keys = torch.arange(N, device=Z.device)[:, None]
        mask = (keys <= n + torch.arange(N - n, device=Z.device)[None, :]).to(Z.dtype)  # (N, k) causal
        phi = torch.stack([ACTS[a](S[:, i]) for i, a in enumerate(self.acts)], 1) * (mask / n)  # act(n s)/n
        return Zq + (self.W_pv @ (Z[:, None] @ phi)).sum(1)  # (B, D, k)

    def forward(self, X: torch.Tensor, y: torch.Tensor, thetas: torch.Tensor) -> torch.Tensor:
        """Teacher-forced predictions: thetas (B, k, d) = theta_0..theta_{k-1} -> predicted
        theta_1..theta_k (B, k, d)."""
        d = self.d
        return self.forward_Z(embed(X, y, thetas))[:, d + 1 : 2 * d + 1, :].transpose(1, 2)

    def next_theta(self, X, y, thetas) -> torch.Tensor:
        """The prediction from the last column only: (B, d)."""
        return self.forward(X, y, thetas)[:, -1]

    @torch.no_grad()
    def generate(
        self, X, y, theta0: torch.Tensor, T: int, step_sigma: float = 0.0, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Autoregressive chain from theta0 (B, d): (B, T+1, d) = theta_0, hat theta_1 .. hat theta_T.
        step_sigma > 0 adds N(0, sigma^2) to each generated iterate before it is fed back."""
        seq = theta0[:, None, :]
        for _ in range(T):
            nxt = self.next_theta(X, y, seq)
            if step_sigma > 0:
                nxt = nxt + step_sigma * torch.randn(nxt.shape, generator=generator, dtype=nxt.dtype).to(nxt.device)
            seq = torch.cat([seq, nxt[:, None]], 1)
        return seq


def pv_scale_for(kind: str, eta: float) -> float:
    return eta if kind == "linear" else 2 * eta


def construction(d: int, n: int, kind: str) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
    """Lemma 3.3 (and its linear analogue): W_kq (h, D, D) and V (h, D, D) (W^PV = pv_scale * V) such
    that f_W(Z) is exactly one gradient-descent step.

    Rows: x = 0..d-1, y = d, theta = d+1..2d, one = 2d+1; a_k = x_k^T theta.
    - linear: one linear head, score x_k^T theta - y_k, value -x_k:  theta - (eta/n) sum (a_k - y_k) x_k.
    - quadratic: cube head on a_k with value -x_k, square heads on a_k + y_k and a_k - y_k with values
      +x_k/4 and -x_k/4; since ((a+y)^2 - (a-y)^2)/4 = a y, the sum is -(a_k^3 - y_k a_k) x_k, and with
      pv_scale = 2 eta:  theta - (2 eta/n) sum (a_k^2 - y_k) a_k x_k.
    """
    D = 2 * d + 2
    xs, yr, ths, one = slice(0, d), d, slice(d + 1, 2 * d + 1), 2 * d + 1
    eye = torch.eye(d)

    def head(y_sign: float, value: float):
        kq, v = torch.zeros(D, D), torch.zeros(D, D)
        kq[xs, ths] = eye
        kq[yr, one] = y_sign
        v[ths, xs] = value * eye
        return kq, v

    if kind == "linear":
        heads, acts = [head(-1.0, -1.0)], ("linear",)
    else:
        heads, acts = [head(0.0, -1.0), head(1.0, 0.25), head(-1.0, -0.25)], ("cube", "square", "square")
    return torch.stack([h[0] for h in heads]), torch.stack([h[1] for h in heads]), acts


def build_icl_model(
    d: int,
    n: int,
    kind: str,
    eta: float,
    acts: tuple[str, ...],
    init: str = "random",
    init_scale: float = 0.05,
    init_gain: float = 0.5,
    seed: int = 0,
    weights: str = "full",
) -> ICLTransformer:
    model = ICLTransformer(d, n, acts, pv_scale_for(kind, eta), weights)
    g = torch.Generator().manual_seed(seed)
    D, h = 2 * d + 2, len(acts)
    with torch.no_grad():
        model.W_kq.copy_(init_scale * torch.randn(h, D, D, generator=g))
        model.V.copy_(init_scale * torch.randn(h, D, D, generator=g))
        if init == "aligned":
            kq, v, cacts = construction(d, n, kind)
            if cacts != tuple(acts):
                raise ValueError(f"aligned init needs heads {cacts}, got {tuple(acts)}")
            model.W_kq.add_(init_gain * kq)
            model.V.add_(init_gain * v)
        model.W_kq.mul_(model.mask_kq)  # entries outside the trained blocks stay exactly 0
        model.V.mul_(model.mask_v)
    return model
