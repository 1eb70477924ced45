"""In-context weight prediction with gradient-descent steps (paper §3.2, eq. 5, Figures 3 and 6).

A prompt holds n examples (x_k, y_k) with x_k, theta* ~ N(0, I_d) and y_k = g_theta*(x_k); the
reasoning steps are the gradient-descent iterates on the squared loss (1/2n) sum_k (g_theta(x_k) - y_k)^2

    theta_{i+1} = theta_i - (eta/n) sum_k (g_theta_i(x_k) - y_k) grad_theta g_theta_i(x_k)

- icl_linear:    g_theta(x) = theta^T x;     step Jacobian I - (eta/n) X X^T;       theta_0 = 0
- icl_quadratic: g_theta(x) = (theta^T x)^2; step Jacobian I - (2 eta/n) X D(theta_i) X^T with
  D(theta) = diag(3 (X^T theta)^2 - y);   theta_0 = alpha0 * theta* (Theorem 3.4)

The data are continuous vectors: `sample_arrays` draws a whole split at once and the runner
(the icl runner, stabray.train.icl.ICLRun) trains on them directly. `sample()` still returns an
Example (the vectors rendered as text, 3 decimals) so `python -m stabray tasks / data` work.

The parameters of the model and the evaluation live here too (a TrialConfig's task.params is the
one place for task-specific knobs): heads, init, noise sigmas. The "longer input" for length
generalization is more gradient-descent steps: size_field = T_max, long splits run 10% / 20% more
steps than training saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from stabray.errors import UserError
from stabray.tasks.base import TASKS, Example, Task


@dataclass(frozen=True)
class ICLArrays:
    """One split. Shapes: X (N, d, n), y (N, n), theta_star (N, d), thetas (N, T+1, d) = theta_0..theta_T."""

    X: np.ndarray
    y: np.ndarray
    theta_star: np.ndarray
    thetas: np.ndarray


@dataclass(frozen=True)
class ICLParams:
    d: int = 10  # input / weight dimension (Figure 3: 10)
    n: int = 20  # in-context examples per prompt
    eta: float = 0.4  # gradient-descent step size
    T_max: int = 20  # GD steps per training chain (the long splits run 10% / 20% more)
    alpha0: float = 0.0  # theta_0 = alpha0 * theta* (0: start at the origin)
    heads: str = "linear"  # comma-separated activations of the heads: linear, cube, square
    init: str = (
        "random"  # model init: random (N(0, init_scale^2) entries) or aligned (Lemma 3.3 weights x init_gain + noise)
    )
    init_scale: float = 0.05  # std of the random init entries (or of the noise added to the aligned init)
    init_gain: float = 0.5  # aligned init: the construction scaled by this (the paper's lambda_K = lambda_V start)
    input_sigma: float = 0.002  # Figure 3: std of the Gaussian noise added to each fed-back iterate
    weight_sigma: float = 0.002  # std of the Gaussian noise added to the model's weights (Figure 3, right)
    # training loss per teacher-forced step: "abs" = ||f_W(z) - theta_t||^2; "step" = the same divided by the
    # squared GD step ||theta_t - theta_{t-1}||^2 (the relative step error; copying theta_{t-1} scores 1)
    loss: str = "abs"
    # label of the last step of a training chain: "star" = theta* (the paper's L^CoT, Appendix A.2 / A.3.2:
    # theta_bar_T = theta*), "gd" = the gradient-descent iterate theta_T (every label a GD step)
    last_target: str = "star"
    weights: str = "full"  # trained entries of W^KQ / W^PV: full (eq. 5) or blocks (those of Lemma 3.3; models/icl.py)
    # adamw: minibatches of train.batch_size with the trial's lr schedule; lbfgs: each epoch runs lbfgs_iters
    # L-BFGS iterations (strong-Wolfe line search, step train.lr) on the epoch's whole training split, i.e.
    # deterministic full-batch descent on the training loss as in Theorem 3.4 (batch size / schedule unused)
    optimizer: str = "adamw"
    lbfgs_iters: int = 20


@dataclass(frozen=True)
class ICLQuadraticParams(ICLParams):
    n: int = 200
    eta: float = 1e-3
    alpha0: float = 0.75  # Theorem 3.4: alpha0 in [3/4, 1)
    heads: str = "cube,square,square"  # Lemma 3.3: one cubic and two square heads
    init: str = "aligned"
    init_scale: float = 1e-3  # cube heads amplify init noise: 0.05 made the first epoch's chains overflow
    # Adam on all of eq. (5) stayed at the copy-theta_{t-1} loss level (README, ICL section): train the
    # construction's blocks with full-batch L-BFGS
    weights: str = "blocks"
    optimizer: str = "lbfgs"


ACTIVATIONS = ("linear", "cube", "square")


class ICLTask(Task):
    """Shared generator; subclasses set `kind`."""

    kind: ClassVar[str]
    size_field = "T_max"
    min_size = 1
    runner = "icl"  # continuous vectors: stabray.train.icl.ICLRun

    def __init__(self, **params):
        super().__init__(**params)
        p = self.params
        if p.d < 1 or p.n < 1:
            raise UserError(f"task {self.name!r}: d and n must be >= 1, got d={p.d}, n={p.n}")
        if not p.eta > 0:
            raise UserError(f"task {self.name!r}: eta must be > 0, got {p.eta}")
        bad = [h for h in self.head_acts if h not in ACTIVATIONS]
        if bad or not self.head_acts:
            raise UserError(
                f"task {self.name!r}: heads must be a comma-separated list of {ACTIVATIONS}, got {p.heads!r}"
            )
        if p.weights not in ("full", "blocks"):
            raise UserError(f"task {self.name!r}: weights must be 'full' or 'blocks', got {p.weights!r}")
        if p.optimizer not in ("adamw", "lbfgs") or p.lbfgs_iters < 1:
            raise UserError(
                f"task {self.name!r}: optimizer must be 'adamw' or 'lbfgs' (lbfgs_iters >= 1), "
                f"got {p.optimizer!r} / {p.lbfgs_iters}"
            )
        if p.last_target not in ("star", "gd"):
            raise UserError(f"task {self.name!r}: last_target must be 'star' or 'gd', got {p.last_target!r}")
        if p.loss not in ("abs", "step"):
            raise UserError(f"task {self.name!r}: loss must be 'abs' or 'step', got {p.loss!r}")
        if p.init not in ("random", "aligned"):
            raise UserError(f"task {self.name!r}: init must be 'random' or 'aligned', got {p.init!r}")
        for k in ("init_scale", "input_sigma", "weight_sigma"):
            if getattr(p, k) < 0:
                raise UserError(f"task {self.name!r}: {k} must be >= 0")

    @property
    def head_acts(self) -> tuple[str, ...]:
        return tuple(h.strip() for h in self.params.heads.split(",") if h.strip())

    # -- the function class -----------------------------------------------------------------
    def g(self, theta: np.ndarray, X: np.ndarray) -> np.ndarray:
        """g_theta(x_k) for every k: theta (N, d), X (N, d, n) -> (N, n)."""
        a = np.einsum("bd,bdn->bn", theta, X)
        return a if self.kind == "linear" else a**2

    def gd_step(self, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        p = self.params
        a = np.einsum("bd,bdn->bn", theta, X)
        r = self.g(theta, X) - y  # residuals (N, n)
        coef = r if self.kind == "linear" else 2 * r * a  # d/dtheta of (1/2) r^2 = coef * x
        return theta - p.eta / p.n * np.einsum("bn,bdn->bd", coef, X)

    def sample_arrays(self, rng: np.random.Generator, N: int, T: int | None = None) -> ICLArrays:
        """N prompts with T GD steps each (default T_max)."""
        p = self.params
        T = p.T_max if T is None else T
        X = rng.standard_normal((N, p.d, p.n))
        theta_star = rng.standard_normal((N, p.d))
        y = self.g(theta_star, X)
        thetas = [p.alpha0 * theta_star]
        for _ in range(T):
            thetas.append(self.gd_step(thetas[-1], X, y))
        return ICLArrays(X, y, theta_star, np.stack(thetas, 1))

    def sample(self, rng: np.random.RandomState, size: int) -> Example:
        gen = np.random.default_rng(rng.randint(2**31))
        a = self.sample_arrays(gen, 1, size)
        vec = lambda v: "[" + " ".join(f"{x:.3f}" for x in v) + "]"  # noqa: E731
        ctx = ", ".join(f"{vec(a.X[0, :, k])} -> {a.y[0, k]:.3f}" for k in range(self.params.n))
        q = f"{self.name}:\nexamples: {ctx}, theta_0: {vec(a.thetas[0, 0])}\n"
        steps = tuple(vec(t) for t in a.thetas[0, 1:-1])
        return Example(
            question=q + "trace | theta:\n",
            steps=steps,
            final=vec(a.thetas[0, -1]),
            question_nohint=q + "theta:\n",
            meta={"theta_star": a.theta_star[0].tolist()},
        )


@TASKS.register("icl_linear")
class ICLLinear(ICLTask):
    """In-context linear regression solved by gradient descent (paper section 3.2): a one-layer
    transformer reads n examples (x_k, y_k) with y = theta*^T x, and each reasoning step is one GD
    iterate theta_{i+1} = theta_i - (eta/n) sum_k grad loss_k; steps are continuous vectors.

    The check of the stability machinery where everything is known: the exact Jacobians of the
    steps, their norms and the EAF against the theory's ||I - (eta/n) X X^T||."""

    kind = "linear"
    Params = ICLParams


@TASKS.register("icl_quadratic")
class ICLQuadratic(ICLTask):
    """In-context regression with a quadratic link, y = (theta*^T x)^2, solved by gradient descent
    (paper section 3.2, Theorem 3.4): as icl_linear, with Jacobians I - (2 eta/n) X D(theta_i) X^T
    that depend on the iterate (the shipped spec starts the model near Lemma 3.3's construction).

    The nonlinear case of Figures 3 and 6."""

    kind = "quadratic"
    Params = ICLQuadraticParams
