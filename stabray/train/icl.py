"""The "icl" trial runner: the in-context gradient-descent tasks (icl_linear, icl_quadratic; paper
§3.2), behind the same `stabray.train.runner.Runner` protocol as the text runner.

Training: the paper's L^CoT, squared loss ||f_W(z^(t-1)) - theta_bar_t||^2 on every teacher-forced
step of a chain (the `sft_cot` method; one forward per chain), with labels theta_bar_t = theta_t for
t < T and theta_bar_T = theta* (task param last_target=star, the default; last_target=gd labels the
last step with the GD iterate theta_T too), AdamW with the trial's schedule. With task param
loss=step each term is divided by the squared step ||theta_bar_t - theta_{t-1}||^2 (the relative step
error), so every prompt and step weighs the same whatever the size of its step. With task param
optimizer=lbfgs each epoch is lbfgs_iters iterations of torch.optim.LBFGS on the epoch's whole
training split (deterministic full-batch descent, as the gradient flow of Theorem 3.4). Float64 throughout: the
model is tiny, and the Jacobian checks want the precision.

Losses. `loss(a, b)` is the squared error ||a - b||^2, averaged over examples. At step T:
- infer_loss_T     : self-generated chain hat theta_T vs the GD iterate theta_T (what training targets)
- tf_loss_T        : f_W(ground-truth prefix) vs theta_T (the training loss at step T)
- infer_star_T / tf_star_T : the same against theta* (Figure 3: the chain converges to theta*)
- step_noise_T     : infer_star_T with N(0, input_sigma^2) added to every fed-back iterate
- weight_noise_T   : infer_star_T with N(0, weight_sigma^2) added to W^KQ and V (mean over 3 draws)

Jacobians (exact, `torch.func.jacrev`): J_i^(t) = d hat theta_t / d theta_i at the ground-truth
prefix, 0 <= i < t. theta_0 is part of the prompt (given exactly), so, as in eq. (4), the EAF at T
is sum_{i=1}^{T-1} rho_i^(T) from the sup-over-examples norms (stabray.stability.jacobian).
Theory (§3.2): J_{t-1}^(t) = I - (eta/n) X X^T (linear), I - (2 eta/n) X D(theta_{t-1}) X^T with
D(theta) = diag(3 (X^T theta)^2 - y) (quadratic), and J_i^(t) = 0 for i < t-1.
Figure 6's "Jacobian matrix product norm": sum_{i=1}^T ||P_i||^2 with P_i = J_{i-1}^(i) ... J_0^(1),
measured and from the theory's matrices.
"""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.func import jacrev, vmap

from stabray.config import TrialConfig, parse_trial_config
from stabray.errors import UserError
from stabray.models.icl import build_icl_model
from stabray.stability.jacobian import eaf_from_norms, rho_matrix
from stabray.tasks import get_task
from stabray.tasks.base import SIZE_OPTIONS
from stabray.train.loop import lr_schedule
from stabray.train.runner import CONFIG, RUNNERS, Runner, StabilityOptions, StabilityTable, read_state, save_state

DTYPE = torch.float64
SPLIT_IDS = {"train": 0, "val": 1, "test": 2, "test_long": 3, "test_longer": 4}
ACC_TOL = 0.05  # val_acc / test_acc: share of prompts whose hat theta_T is within 5% (relative) of theta_T


def sq(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b) ** 2).sum(-1).mean())


def labels(run: "ICLRun", ts: torch.Tensor, th: torch.Tensor) -> torch.Tensor:
    """theta_bar_1..theta_bar_T (B, T, d): the GD iterates, the last replaced by theta* (last_target=star)."""
    lab = th[:, 1:]
    if run.p.last_target == "star":
        lab = torch.cat([lab[:, :-1], ts[:, None]], 1)
    return lab


def chain_loss(run: "ICLRun", X, y, ts, th) -> torch.Tensor:
    """The training loss on teacher-forced chains (task param `loss`: abs or step; `last_target`)."""
    pred = run.model(X, y, th[:, :-1])  # (B, T, d): teacher-forced predictions of steps 1..T
    lab = labels(run, ts, th)
    err = ((pred - lab) ** 2).sum(-1)  # (B, T)
    if run.p.loss == "step":
        err = err / ((lab - th[:, :-1]) ** 2).sum(-1).clamp_min(1e-30)
    return err.mean()


class ICLTrainer:
    """Optimizer, schedule and epoch counter (the trainable reads `.epoch`). AdamW on minibatches, or
    full-batch L-BFGS (task param optimizer=lbfgs)."""

    def __init__(self, run: "ICLRun"):
        self.run, cfg = run, run.train_cfg
        self.epoch = 0
        self.lbfgs = run.p.optimizer == "lbfgs"
        if self.lbfgs:
            self.optimizer = torch.optim.LBFGS(
                run.model.parameters(),
                lr=cfg.lr,
                max_iter=run.p.lbfgs_iters,
                history_size=50,
                line_search_fn="strong_wolfe",
                tolerance_grad=1e-12,
                tolerance_change=1e-14,
            )
            self.steps_per_epoch, self.scheduler = 1, None
            return
        self.optimizer = torch.optim.AdamW(run.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        steps = math.ceil(run.cfg.task.train_size / cfg.batch_size)
        self.steps_per_epoch = min(steps, cfg.max_steps_per_epoch) if cfg.max_steps_per_epoch else steps
        self.scheduler = lr_schedule(self.optimizer, cfg, self.steps_per_epoch * cfg.epochs)  # the text trainer's

    def _lbfgs_epoch(self, data) -> dict[str, float]:
        """lbfgs_iters L-BFGS iterations on the whole split. The objective is the training loss divided
        by the split's mean squared GD step (a constant: same minimizer, O(1) values for the line search
        and the tolerances); train_loss reports the loss itself."""
        run = self.run
        X, y, ts, th = data
        scale = float(((th[:, 1:] - th[:, :-1]) ** 2).sum(-1).mean()) if run.p.loss == "abs" else 1.0
        run.model.train()
        t0 = time.perf_counter()

        def closure():
            self.optimizer.zero_grad(set_to_none=True)
            loss = chain_loss(run, X, y, ts, th) / scale
            if not torch.isfinite(loss):
                raise FloatingPointError(f"training loss became {float(loss)} at epoch {self.epoch + 1}")
            loss.backward()
            return loss

        self.optimizer.step(closure)
        with torch.no_grad():
            final = float(chain_loss(run, X, y, ts, th))
        self.epoch += 1
        return {"train_loss": final, "epoch_time_s": time.perf_counter() - t0}

    def train_epoch(self) -> dict[str, float]:
        run, cfg = self.run, self.run.train_cfg
        data = run.train_split(self.epoch)
        if self.lbfgs:
            return self._lbfgs_epoch(data)
        order = np.random.default_rng([run.cfg.seed, self.epoch]).permutation(len(data[0]))
        run.model.train()
        losses, t0 = [], time.perf_counter()
        for b in range(self.steps_per_epoch):
            idx = torch.as_tensor(order[b * cfg.batch_size : (b + 1) * cfg.batch_size])
            if len(idx) == 0:
                break
            X, y, ts, th = (a[idx] for a in data)
            loss = chain_loss(run, X, y, ts, th)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"training loss became {float(loss)} at epoch {self.epoch + 1}, step {b + 1}")
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            losses.append(float(loss.detach()))
        self.epoch += 1
        return {"train_loss": float(np.mean(losses)), "epoch_time_s": time.perf_counter() - t0}

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.epoch = int(state["epoch"])


@RUNNERS.register("icl")
class ICLRun(Runner):
    def __init__(self, config: dict[str, Any] | TrialConfig, tokenizer_dir=None):  # no tokenizer: vectors
        self.cfg = config if isinstance(config, TrialConfig) else parse_trial_config(config)
        c = self.cfg
        if c.method.name not in ("sft_cot",) or c.method.params:
            raise UserError(
                f"task {c.task.name!r} trains on teacher-forced GD steps: method must be "
                f"sft_cot without params, got {c.method.name!r} {c.method.params or ''}"
            )
        if c.train.threads:
            torch.set_num_threads(c.train.threads)
        self.task = get_task(c.task.name, **c.task.params)
        self.p = self.task.params
        self.train_cfg = c.train
        self.T = self.p.T_max
        for opt in SIZE_OPTIONS:
            if opt in c.task.params:
                raise UserError(f"task {c.task.name!r}: {opt} is not supported by the in-context GD runner")
        longs = self.task.long_sizes()
        self.long_splits = self.task.long_splits(c.eval.long_splits)
        self.splits_T = {"val": self.T, "test": self.T, **{s: longs[s] for s in self.long_splits}}
        self.sizes = {
            "val": c.task.val_size,
            "test": c.task.test_size,
            **{s: c.task.test_size for s in self.long_splits},
        }
        self.data = {s: self._draw(s, self.sizes[s], self.splits_T[s]) for s in self.splits_T}
        self._train = self._draw("train", c.task.train_size, self.T) if not c.task.resample_train else None
        self.model = build_icl_model(
            self.p.d,
            self.p.n,
            self.task.kind,
            self.p.eta,
            self.task.head_acts,
            init=self.p.init,
            init_scale=self.p.init_scale,
            init_gain=self.p.init_gain,
            seed=c.weights_seed,
            weights=self.p.weights,
        ).to(DTYPE)
        self.trainer = ICLTrainer(self)
        self.history: list[dict[str, float]] = []
        self.curves: dict[str, Any] = {}  # per-T curves of the last final() (saved as icl_curves.json)

    # -- data ----------------------------------------------------------------------------------
    def _draw(self, split: str, N: int, T: int, epoch: int = 0):
        rng = np.random.default_rng([self.cfg.task.data_seed, SPLIT_IDS[split], epoch])
        a = self.task.sample_arrays(rng, N, T)
        return tuple(torch.as_tensor(v, dtype=DTYPE) for v in (a.X, a.y, a.theta_star, a.thetas))

    def train_split(self, epoch: int):
        """(X, y, theta_star, thetas); with task.resample_train fresh prompts every epoch."""
        if self._train is not None:
            return self._train
        if getattr(self, "_fresh", (None,))[0] != epoch:
            self._fresh = (epoch, self._draw("train", self.cfg.task.train_size, self.T, epoch))
        return self._fresh[1]

    # -- evaluation ----------------------------------------------------------------------------
    @torch.no_grad()
    def curves_of(self, split: str, n: int = 0, noise_draws: int = 3) -> dict[str, list[float]]:
        """Per-T losses (index t-1 holds step t) on the first n prompts of a split (0 = all)."""
        X, y, ts, th = (a[:n] if n else a for a in self.data[split])
        T = th.shape[1] - 1
        self.model.eval()
        gen = self.model.generate(X, y, th[:, 0], T)
        tf = torch.cat([th[:, :1], self.model(X, y, th[:, :-1])], 1)
        g = torch.Generator().manual_seed(self.cfg.seed + 1)
        noisy = (
            self.model.generate(X, y, th[:, 0], T, step_sigma=self.p.input_sigma, generator=g) if noise_draws else None
        )
        wn = []
        for k in range(noise_draws if self.p.weight_sigma > 0 else 0):
            m = self._noisy_model(self.p.weight_sigma, 1000 + k)
            wn.append(m.generate(X, y, th[:, 0], T))
        out = {k: [] for k in ("infer_loss", "tf_loss", "infer_star", "tf_star", "step_noise", "weight_noise", "acc")}
        for t in range(1, T + 1):
            out["infer_loss"].append(sq(gen[:, t], th[:, t]))
            out["tf_loss"].append(sq(tf[:, t], th[:, t]))
            out["infer_star"].append(sq(gen[:, t], ts))
            out["tf_star"].append(sq(tf[:, t], ts))
            if noisy is not None:
                out["step_noise"].append(sq(noisy[:, t], ts))
            if wn:
                out["weight_noise"].append(float(np.mean([sq(w[:, t], ts) for w in wn])))
            rel = (gen[:, t] - th[:, t]).norm(dim=-1) / th[:, t].norm(dim=-1).clamp_min(1e-12)
            out["acc"].append(float((rel < ACC_TOL).double().mean()))
        return {k: v for k, v in out.items() if v}

    def _tf_label_loss(self, c: dict[str, list[float]]) -> list[float]:
        """Teacher-forced squared error per step against the training labels (theta* at the last step
        with last_target=star)."""
        last = c["tf_star"][-1] if self.p.last_target == "star" else c["tf_loss"][-1]
        return [*c["tf_loss"][:-1], last]

    def _infer_tf_last(self, c: dict[str, list[float]]) -> tuple[float, float]:
        """(inference, teacher-forced) loss at T_max against the last label (theta* or theta_T)."""
        if self.p.last_target == "star":
            return c["infer_star"][-1], c["tf_star"][-1]
        return c["infer_loss"][-1], c["tf_loss"][-1]

    def _noisy_model(self, sigma: float, seed: int):
        m = copy.deepcopy(self.model)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(sigma * torch.randn(p.shape, generator=g, dtype=p.dtype))
        return m

    def jacobians(self, split: str, n: int, prefix: str = "truth") -> torch.Tensor:
        """Exact J[b, t-1, i] = d hat theta_t / d theta_i (d x d), 0 <= i < t <= T: (B, T, T, d, d).
        prefix = truth (ground-truth iterates) or generated (the model's own chain)."""
        X, y, _, th = (a[:n] for a in self.data[split])
        if prefix == "generated":
            with torch.no_grad():
                th = self.model.generate(X, y, th[:, 0], th.shape[1] - 1)
        self.model.eval()

        def f(Xb, yb, thb):  # one prompt: (T, d) prefix -> (T, d) predictions
            return self.model(Xb[None], yb[None], thb[None])[0]

        J = vmap(jacrev(f, argnums=2))(X, y, th[:, :-1])  # (B, T, d, T, d)
        return J.permute(0, 1, 3, 2, 4).detach()  # (B, t-1, i, out, in)

    def theory_jacobians(self, split: str, n: int) -> torch.Tensor:
        """The theory's J_{t-1}^(t) at the ground-truth theta_{t-1}: (B, T, d, d)."""
        X, y, _, th = (a[:n] for a in self.data[split])
        p = self.p
        eye = torch.eye(p.d, dtype=DTYPE)
        if self.task.kind == "linear":
            M = eye - p.eta / p.n * X @ X.transpose(1, 2)
            return M[:, None].expand(-1, th.shape[1] - 1, -1, -1)
        a = torch.einsum("btd,bdn->btn", th[:, :-1], X)  # (B, T, n)
        Dg = 3 * a**2 - y[:, None, :]
        return eye - 2 * p.eta / p.n * torch.einsum("bdn,btn,ben->btde", X, Dg, X)

    def stability(self, split: str, n: int) -> dict[str, Any]:
        """Norms, rho and EAF(T) from exact Jacobians, next to the theory (Figure 6)."""
        J = self.jacobians(split, n)  # (B, T, T, d, d)
        B, T = J.shape[:2]
        norms_b = torch.linalg.matrix_norm(J, ord=2)  # (B, T, T): [b, t-1, i]
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))  # i <= t-1
        norms = torch.zeros(T + 1, T + 1, dtype=DTYPE)  # [i, t] = sup_b ||J_i^(t)||, i < t
        norms[:T, 1:] = (norms_b * causal).amax(0).T
        Jth = self.theory_jacobians(split, n)
        diag = J[:, torch.arange(T), torch.arange(T)]  # (B, T, d, d): J_{t-1}^(t)
        prod_m, prod_t = [], []
        Pm = Pt = torch.eye(self.p.d, dtype=DTYPE).expand(B, -1, -1)
        sm = st = torch.zeros(B, dtype=DTYPE)
        for t in range(T):
            Pm, Pt = diag[:, t] @ Pm, Jth[:, t] @ Pt
            sm = sm + torch.linalg.matrix_norm(Pm, ord=2) ** 2
            st = st + torch.linalg.matrix_norm(Pt, ord=2) ** 2
            prod_m.append(float(sm.mean()))
            prod_t.append(float(st.mean()))
        off = norms_b * torch.tril(torch.ones(T, T, dtype=torch.bool), -1)
        return {
            "norms": norms,
            "rho": rho_matrix(norms),
            "eaf": [eaf_from_norms(norms, t) for t in range(1, T + 1)],
            "jac_norm": torch.linalg.matrix_norm(diag, ord=2).mean(0).tolist(),
            "jac_norm_max": torch.linalg.matrix_norm(diag, ord=2).amax(0).tolist(),
            "theory_norm": torch.linalg.matrix_norm(Jth, ord=2).mean(0).tolist(),
            "jac_err": torch.linalg.matrix_norm(diag - Jth, ord=2).amax(0).tolist(),  # max_b ||J - J_theory||
            "offdiag_max": off.amax((0, 2)).tolist(),  # max_{b, i < t-1} ||J_i^(t)||, per t
            "jac_prod": prod_m,
            "theory_prod": prod_t,
        }

    def epoch(self) -> dict[str, float]:
        self.check_more_epochs()
        m = self.trainer.train_epoch()
        ev = self.cfg.eval
        t0 = time.perf_counter()
        c = self.curves_of("val", ev.val_examples, noise_draws=0)
        m.update(
            val_acc=c["acc"][-1],
            val_loss=float(np.mean(self._tf_label_loss(c))),
            val_infer_loss=c["infer_loss"][-1],
            val_infer_star=c["infer_star"][-1],
            val_time_s=time.perf_counter() - t0,
        )
        if ev.eaf_examples and self.eaf_due and self.T >= 2:  # T_max 1: an empty sum, not logged
            t0 = time.perf_counter()
            m["val_eaf"] = self.stability("val", ev.eaf_examples)["eaf"][-1]
            m["eaf_time_s"] = time.perf_counter() - t0
        m["epoch"] = self.trainer.epoch
        self.history.append({k: float(v) for k, v in m.items()})
        return m

    def final(self) -> dict[str, float]:
        """Test metrics plus every per-T curve as numeric metrics `<curve>_T<t>`."""
        ev = self.cfg.eval
        c = self.curves_of("test")
        s = self.stability("test", ev.eaf_examples or 32)
        curves = {**c, **{k: v for k, v in s.items() if isinstance(v, list)}}
        self.curves = {
            "task": self.task.name,
            "T": list(range(1, self.T + 1)),
            **curves,
            "norms": s["norms"].tolist(),
            "rho": s["rho"].tolist(),
        }
        out: dict[str, float] = {
            "test_acc": c["acc"][-1],
            "test_loss_gap": self._infer_tf_last(c)[0] - self._infer_tf_last(c)[1],
            "test_infer_loss": c["infer_loss"][-1],
            "test_infer_star": c["infer_star"][-1],
            "jac_err_max": max(s["jac_err"]),
        }
        # at T_max 1 the EAF is an empty sum (0 by definition): not logged; nor with eval.eaf_examples 0
        # (the EAF off, as in the text runner; the figures' curves still use 32 prompts)
        if self.T >= 2 and ev.eaf_examples:
            out["test_eaf"] = s["eaf"][-1]
        for k, vals in curves.items():
            for t, v in enumerate(vals, 1):
                if not (k == "eaf" and t == 1):  # the curve's T = 1 point: the empty sum again
                    out[f"{k}_T{t}"] = float(v)
        for split in self.long_splits:
            cl = self.curves_of(split, noise_draws=0)
            out[f"{split}_acc"] = cl["acc"][-1]
            out[f"{split}_infer_star"] = cl["infer_star"][-1]
            self.curves[split] = cl
        return out

    def decomposition(self, n: int, split: str = "test", max_T: int | None = None) -> list[dict[str, float]]:
        """eq. (4) per T (Table 2 columns) with exact Jacobians. eps_t / r_t = max over prompts of the
        step-t error given the true / generated prefix (against theta_t); the loss at T is against the
        last label (theta* with last_target=star, as the paper's test loss; theta_T with gd), so
        C1 = max ||d loss / d output|| = 2 max ||hat theta_T - label||; C2 = max over prompts of
        ||J(x + delta) - J(x)|| / ||delta|| (largest block), delta = 1% of the prefix norm."""
        self.check_eval_args(split, n=n)
        X, y, ts, th = (a[:n] for a in self.data[split])
        with torch.no_grad():
            gen = self.model.generate(X, y, th[:, 0], self.T)
            tf = self.model(X, y, th[:, :-1])
        eps = (tf - th[:, 1:]).norm(dim=-1).amax(0)  # (T,)  step t at index t-1
        r = (gen[:, 1:] - th[:, 1:]).norm(dim=-1).amax(0)
        s = self.stability(split, n)
        rho = s["rho"]
        J0 = self.jacobians(split, n)
        saved = self.data[split]
        g = torch.Generator().manual_seed(self.cfg.seed + 7)
        delta = torch.randn(th.shape, generator=g, dtype=DTYPE)
        delta[:, 0] = 0  # theta_0 is given exactly
        delta = delta * (0.01 * th[:, 1:].flatten(1).norm(dim=1) / delta.flatten(1).norm(dim=1))[:, None, None]
        try:
            self.data = {**self.data, split: (X, y, saved[2][:n], th + delta)}
            J1 = self.jacobians(split, n)
        finally:
            self.data = {**self.data, split: saved}
        C2 = float((torch.linalg.matrix_norm(J1 - J0, ord=2).flatten(1).amax(1) / delta.flatten(1).norm(dim=1)).amax())
        rows = []
        for T in range(1, (self.T if max_T is None else min(max_T, self.T)) + 1):
            target = ts if self.p.last_target == "star" else th[:, T]
            C1 = 2 * float((gen[:, T] - target).norm(dim=-1).amax())
            first = C1 * sum(float(rho[t, T] * eps[t - 1]) for t in range(1, T))
            second = C1 * C2 / 2 * sum(float(rho[t, T]) * float(r[: t - 1].sum()) ** 2 for t in range(2, T + 1))
            gap = abs(sq(gen[:, T], target) - sq(tf[:, T - 1], target))
            bound = first + second
            rows.append(
                {
                    "T": T,
                    "loss_gap": gap,
                    "bound": bound,
                    "ratio": bound / gap if gap > 0 else float("nan"),
                    "first_order": first,
                    "second_order": second,
                    "C1": C1,
                    "C2": C2,
                    "eaf": s["eaf"][T - 1],
                    "sum_eps": float(eps[: T - 1].sum()),
                }
            )
        return rows

    def stability_table(self, opts: StabilityOptions) -> StabilityTable:
        """The exact-Jacobian eq. (4) table (the estimator options do not apply: J is exact here)."""
        return StabilityTable(self.decomposition(opts.n, max_T=opts.T or None), min(opts.n, len(self.data["test"][0])))

    def weight_noise(self, seeds: int, sigma: float | None = None) -> float:
        """Mean increase of the T_max inference loss (vs theta_T) under N(0, sigma^2) weight noise."""
        self.check_eval_args("test", seeds=seeds)
        sigma = self.p.weight_sigma if sigma is None else sigma
        X, y, _, th = self.data["test"]
        with torch.no_grad():
            base = sq(self.model.generate(X, y, th[:, 0], self.T)[:, -1], th[:, -1])
            noisy = [
                sq(self._noisy_model(sigma, 2000 + k).generate(X, y, th[:, 0], self.T)[:, -1], th[:, -1])
                for k in range(seeds)
            ]
        return float(np.mean(noisy) - base)

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_state(path, self.model.state_dict(), self.trainer.state_dict(), self.history)
        (path / CONFIG).write_text(json.dumps(self.cfg.model_dump(), indent=1))
        if self.curves:
            (path / "icl_curves.json").write_text(json.dumps(self.curves))

    def load(self, path: str | Path) -> None:
        path = Path(path)
        state, self.history = read_state(path, map_location="cpu")
        self.model.load_state_dict(state["model"])
        self.trainer.load_state_dict(state["trainer"])
        if (path / "icl_curves.json").exists():
            self.curves = json.loads((path / "icl_curves.json").read_text())
