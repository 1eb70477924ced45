"""In-context GD tasks (paper §3.2): Lemma 3.3's construction is one exact GD step; a briefly
trained linear model's step Jacobian matches I - (eta/n) X X^T; the runner works through make_run."""

import json

import numpy as np
import pytest
import torch

from stabray.models.icl import ICLTransformer, construction, pv_scale_for
from stabray.tasks import TASKS, get_task
from stabray.train.run import make_run


def _constructed(task):
    p = task.params
    kq, v, acts = construction(p.d, p.n, task.kind)
    m = ICLTransformer(p.d, p.n, acts, pv_scale_for(task.kind, p.eta)).double()
    with torch.no_grad():
        m.W_kq.copy_(kq)
        m.V.copy_(v)
    return m


@pytest.mark.parametrize("name", ["icl_linear", "icl_quadratic"])
def test_lemma_3_3_construction_is_one_gd_step(name):
    task = get_task(name, T_max=6, d=5)
    a = task.sample_arrays(np.random.default_rng(0), 8)
    X, y, th = (torch.as_tensor(v) for v in (a.X, a.y, a.thetas))
    m = _constructed(task)
    pred = m(X, y, th[:, :-1])  # teacher-forced: every step at once
    assert torch.allclose(pred, th[:, 1:], rtol=1e-10, atol=1e-10)
    gen = m.generate(X, y, th[:, 0], 6)  # and autoregressively, from theta_0 alone
    assert torch.allclose(gen, th, rtol=1e-9, atol=1e-9)


def test_gd_chain_uses_the_paper_defaults_and_converges():
    lin, quad = get_task("icl_linear"), get_task("icl_quadratic")
    assert (lin.params.d, lin.params.n, lin.params.eta) == (10, 20, 0.4)
    assert (quad.params.n, quad.params.eta, quad.head_acts) == (200, 1e-3, ("cube", "square", "square"))
    for task in (lin, quad):
        a = task.sample_arrays(np.random.default_rng(1), 16, 30)
        err = ((a.thetas - a.theta_star[:, None]) ** 2).sum(-1).mean(0)
        assert err[-1] < err[1]  # the ground-truth chain approaches theta*
    ex = lin.sample(np.random.RandomState(0), 3)
    assert len(ex.steps) == 2 and ex.final.startswith("[")
    assert getattr(TASKS.get("icl_quadratic"), "runner") == "stabray.train.icl:ICLRun"


def test_bad_params_are_errors():
    from stabray.errors import UserError
    with pytest.raises(UserError):
        get_task("icl_linear", heads="relu")
    with pytest.raises(UserError):
        get_task("icl_linear", nope=1)


def _cfg(tmp_path, name="icl_linear", epochs=5, train_size=1000, **params):
    return {"task": {"name": name, "params": {"T_max": 5, **params}, "train_size": train_size, "val_size": 64,
                     "test_size": 64, "resample_train": True},
            "method": {"name": "sft_cot"},
            "train": {"epochs": epochs, "batch_size": 64, "lr": 0.03, "weight_decay": 0.0, "warmup_steps": 5},
            "eval": {"eaf_examples": 8, "long_splits": ["test_long"], "decomposition_examples": 8,
                     "weight_noise_seeds": 2},
            "cache_dir": str(tmp_path)}


def test_trained_linear_jacobian_matches_theory(tmp_path):
    run = make_run(_cfg(tmp_path, epochs=6, train_size=2000))
    for _ in range(run.train_cfg.epochs):
        m = run.epoch()
    assert m["val_loss"] < 1e-3
    s = run.stability("test", 16)
    # measured J_{t-1}^(t) vs I - (eta/n) X X^T, per prompt, spectral norm of the difference
    assert max(s["jac_err"]) < 0.05, s["jac_err"]
    assert np.allclose(s["jac_norm"], s["theory_norm"], atol=0.03)
    assert max(s["offdiag_max"]) < 0.05  # earlier iterates barely matter
    assert all(v < 1 for v in s["jac_norm_max"])  # contraction: the EAF is a convergent series


def test_runner_through_make_run_final_and_checkpoint(tmp_path):
    from stabray.tune.trainable import final_stability

    run = make_run(_cfg(tmp_path, epochs=1))
    m = run.epoch()
    assert {"train_loss", "val_acc", "eaf"} <= m.keys()
    m.update(run.final()); m.update(run.best_epoch()); m.update(final_stability(run))
    T = run.T
    for k in ("infer_loss", "tf_loss", "infer_star", "step_noise", "weight_noise", "jac_norm", "theory_norm", "eaf"):
        assert f"{k}_T{T}" in m and np.isfinite(m[f"{k}_T{T}"])
    rows = m["stability_table"]
    assert [r["T"] for r in rows] == list(range(1, T + 1))
    assert set(rows[0]) == {"T", "loss_gap", "bound", "ratio", "first_order", "second_order", "C1", "C2", "eaf", "sum_eps"}
    assert np.isfinite(m["weight_noise_loss_increase"]) and "test_long_acc" in m
    run.save(tmp_path / "ck")
    assert json.loads((tmp_path / "ck" / "icl_curves.json").read_text())["T"] == list(range(1, T + 1))
    from stabray.train.run import load_run
    again = load_run(tmp_path / "ck")
    assert again.trainer.epoch == 1 and again.curves
    for a, b in zip(again.model.parameters(), run.model.parameters()):
        assert torch.equal(a, b)


def test_quadratic_runner_one_epoch(tmp_path):
    run = make_run(_cfg(tmp_path, name="icl_quadratic", epochs=1, n=40, d=4))
    m = run.epoch()
    assert np.isfinite(m["train_loss"]) and np.isfinite(m["eaf"])


def test_icl_figures_from_metrics(tmp_path):
    from analysis.icl_figures import curves_from_metrics, write_figures

    metrics = {f"{k}_T{t}": 0.9 ** t for t in range(1, 6)
               for k in ("infer_star", "tf_star", "infer_loss", "tf_loss", "jac_norm", "theory_norm",
                         "jac_prod", "theory_prod", "eaf", "jac_err")}
    metrics["test_acc"] = 1.0
    curves = curves_from_metrics(metrics, "icl_linear")
    assert curves["T"] == [1, 2, 3, 4, 5] and len(curves["eaf"]) == 5 and "test_acc" not in curves
    paths = write_figures(curves, tmp_path)
    assert all(p.exists() and p.stat().st_size > 1000 for p in paths)
