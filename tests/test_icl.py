"""In-context GD tasks (paper §3.2): Lemma 3.3's construction is one exact GD step; a briefly
trained linear model's step Jacobian matches I - (eta/n) X X^T; the runner works through make_run."""

import json

import numpy as np
import pytest
import torch

from stabray.models.icl import ICLTransformer, construction, pv_scale_for
from stabray.tasks import TASKS, get_task
from stabray.train import make_run


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
    from stabray.train import RUNNERS
    from stabray.train.icl import ICLRun

    assert RUNNERS.get(TASKS.get("icl_quadratic").runner) is ICLRun


def test_bad_params_are_errors():
    from stabray.errors import UserError

    with pytest.raises(UserError):
        get_task("icl_linear", heads="relu")
    with pytest.raises(UserError):
        get_task("icl_linear", nope=1)


def _cfg(tmp_path, name="icl_linear", epochs=5, train_size=1000, **params):
    return {
        "task": {
            "name": name,
            "params": {"T_max": 5, **params},
            "train_size": train_size,
            "val_size": 64,
            "test_size": 64,
            "resample_train": True,
        },
        "method": {"name": "sft_cot"},
        "train": {"epochs": epochs, "batch_size": 64, "lr": 0.03, "weight_decay": 0.0, "warmup_steps": 5},
        "eval": {"eaf_examples": 8, "long_splits": ["test_long"], "decomposition_examples": 8, "weight_noise_seeds": 2},
        "cache_dir": str(tmp_path),
    }


def test_trained_linear_jacobian_matches_theory(tmp_path):
    # every label a GD iterate (last_target=gd): the theory's Jacobian is the GD step's, and with theta*
    # as the last label (the default, the paper's L^CoT) the learned step is pulled toward theta*
    run = make_run(_cfg(tmp_path, epochs=6, train_size=2000, last_target="gd"))
    for _ in range(run.train_cfg.epochs):
        m = run.epoch()
    assert m["val_loss"] < 1e-3
    s = run.stability("test", 16)
    # measured J_{t-1}^(t) vs I - (eta/n) X X^T, per prompt, spectral norm of the difference
    assert max(s["jac_err"]) < 0.05, s["jac_err"]
    assert np.allclose(s["jac_norm"], s["theory_norm"], atol=0.03)
    assert max(s["offdiag_max"]) < 0.05  # earlier iterates barely matter
    assert all(v < 1 for v in s["jac_norm_max"])  # contraction: the EAF is a convergent series


def test_eaf_off_logs_no_test_eaf(tmp_path):
    """eval.eaf_examples 0 turns the EAF off in both runners: no val_eaf, and no test_eaf at the end
    (the figures' curves and jac_err_max are still computed); on, test_eaf is logged."""
    cfg = _cfg(tmp_path, epochs=1, train_size=128)
    cfg["eval"] = {**cfg["eval"], "eaf_examples": 0, "decomposition_examples": 0, "weight_noise_seeds": 0}
    run = make_run(cfg)
    assert "val_eaf" not in run.epoch()
    final = run.final()
    assert "test_eaf" not in final and "jac_err_max" in final
    cfg["eval"]["eaf_examples"] = 4
    run = make_run(cfg)
    run.epoch()
    assert "test_eaf" in run.final()


def test_runner_through_make_run_final_and_checkpoint(tmp_path):
    run = make_run(_cfg(tmp_path, epochs=1))
    m = run.epoch()
    assert {"train_loss", "val_acc", "val_eaf"} <= m.keys()
    m.update(run.final())
    m.update(run.best_epoch())
    m.update(run.final_stability())
    T = run.T
    for k in ("infer_loss", "tf_loss", "infer_star", "step_noise", "weight_noise", "jac_norm", "theory_norm", "eaf"):
        assert f"{k}_T{T}" in m and np.isfinite(m[f"{k}_T{T}"])
    rows = m["stability_table"]
    assert [r["T"] for r in rows] == list(range(1, T + 1))
    assert set(rows[0]) == {
        "T",
        "loss_gap",
        "bound",
        "ratio",
        "first_order",
        "second_order",
        "C1",
        "C2",
        "eaf",
        "sum_eps",
    }
    assert np.isfinite(m["weight_noise_loss_increase"]) and "test_long_acc" in m
    run.save(tmp_path / "ck")
    assert json.loads((tmp_path / "ck" / "icl_curves.json").read_text())["T"] == list(range(1, T + 1))
    from stabray.train import load_run

    again = load_run(tmp_path / "ck")
    assert again.trainer.epoch == 1 and again.curves
    for a, b in zip(again.model.parameters(), run.model.parameters()):
        assert torch.equal(a, b)
    # the stability command on an ICL checkpoint prints the runner's own (exact-Jacobian) table
    from stabray.cli import main

    assert main(["stability", str(tmp_path / "ck"), "--n", "8", "--out", str(tmp_path / "st")]) == 0
    got = json.loads((tmp_path / "st" / "stability.json").read_text())["rows"]
    want = again.decomposition(8)
    assert [r["T"] for r in got] == list(range(1, T + 1))
    assert [r["eaf"] for r in got] == pytest.approx([r["eaf"] for r in want], rel=1e-9)


def test_eaf_of_the_construction_is_a_geometric_series(tmp_path):
    """With Lemma 3.3's weights the model is one exact GD step: J_{t-1}^(t) = M = I - (eta/n) X X^T per
    prompt and J_i^(t) = 0 for i < t-1, so rho_i^(T) = c^(T-i) with c = max over prompts of ||M||_2 and
    EAF(T) = sum_{k=1}^{T-1} c^k (c from numpy here, not the runner); the steps are exact (sum_eps = 0)."""
    run = make_run(_cfg(tmp_path, epochs=1, last_target="gd"))
    p = run.task.params
    kq, v, _ = construction(p.d, p.n, run.task.kind)
    with torch.no_grad():
        run.model.W_kq.copy_(kq)
        run.model.V.copy_(v)
    n = 8
    X = run.data["test"][0][:n].double().numpy()  # (B, d, n)
    M = np.eye(p.d) - p.eta / p.n * X @ X.transpose(0, 2, 1)
    c = max(np.linalg.norm(m, 2) for m in M)
    assert 0.2 < c < 1  # a contraction, and not a trivial one
    rows = run.decomposition(n)
    assert [r["T"] for r in rows] == list(range(1, run.T + 1))
    for r in rows:
        assert r["eaf"] == pytest.approx(sum(c**k for k in range(1, r["T"])), rel=1e-6, abs=1e-12), r
        assert r["sum_eps"] == pytest.approx(0.0, abs=1e-6), r


def test_last_cot_label_is_theta_star(tmp_path):
    """L^CoT (Appendix A.2 / A.3.2): the labels are theta_1..theta_{T-1} and theta* for the last step;
    last_target=gd keeps theta_T. The training loss, val_loss and the loss gap follow the label."""
    from stabray.train.icl import chain_loss

    star = make_run(_cfg(tmp_path, epochs=1))
    gd = make_run(_cfg(tmp_path, epochs=1, last_target="gd"))
    assert star.p.last_target == "star"  # the default
    X, y, ts, th = (a[:16] for a in star.data["val"])
    with torch.no_grad():
        pred = star.model(X, y, th[:, :-1])
        lab = th[:, 1:].clone()
        lab[:, -1] = ts
        want = float(((pred - lab) ** 2).sum(-1).mean())
        assert float(chain_loss(star, X, y, ts, th)) == pytest.approx(want, rel=1e-12)
        assert float(chain_loss(gd, X, y, ts, th)) == pytest.approx(float(((pred - th[:, 1:]) ** 2).sum(-1).mean()))
        assert abs(float(chain_loss(gd, X, y, ts, th)) - want) > 1e-3
    c = star.curves_of("val", 16, noise_draws=0)
    assert star._tf_label_loss(c) == [*c["tf_loss"][:-1], c["tf_star"][-1]]
    assert gd._tf_label_loss(c) == c["tf_loss"]


def test_quadratic_runner_one_epoch(tmp_path):
    run = make_run(_cfg(tmp_path, name="icl_quadratic", epochs=1, n=40, d=4))
    m = run.epoch()
    assert np.isfinite(m["train_loss"]) and np.isfinite(m["val_eaf"])


def test_one_step_chains_log_no_eaf(tmp_path):
    """At T_max 1 the chain has no intermediate step: the EAF is an empty sum, so neither val_eaf,
    test_eaf nor the curve's eaf_T1 is logged (at T_max 2 the same run logs all three, eaf_T1 not:
    a curve's T = 1 point is the empty sum too)."""
    one = make_run(_cfg(tmp_path, epochs=1, train_size=64, T_max=1, d=3, n=6))
    m, f = one.epoch(), one.final()
    assert "val_eaf" not in m and "test_eaf" not in f and "eaf_T1" not in f and "acc_T1" in f
    two = make_run(_cfg(tmp_path, epochs=1, train_size=64, T_max=2, d=3, n=6))
    m, f = two.epoch(), two.final()
    assert m["val_eaf"] > 0 and f["test_eaf"] == f["eaf_T2"] > 0 and "eaf_T1" not in f


def test_icl_figures_from_metrics(tmp_path):
    from analysis.icl_figures import curves_from_metrics, write_figures

    metrics = {
        f"{k}_T{t}": 0.9**t
        for t in range(1, 6)
        for k in (
            "infer_star",
            "tf_star",
            "infer_loss",
            "tf_loss",
            "jac_norm",
            "theory_norm",
            "jac_prod",
            "theory_prod",
            "eaf",
            "jac_err",
        )
    }
    metrics["test_acc"] = 1.0
    curves = curves_from_metrics(metrics, "icl_linear")
    assert curves["T"] == [1, 2, 3, 4, 5] and len(curves["eaf"]) == 5 and "test_acc" not in curves
    paths = write_figures(curves, tmp_path)
    assert all(p.exists() and p.stat().st_size > 1000 for p in paths)


def _trained_checkpoint(tmp_path, name="ck", seed=0):
    run = make_run({**_cfg(tmp_path, epochs=1, train_size=256), "seed": seed})
    m = run.epoch()
    m.update(run.final())
    run.save(tmp_path / name)
    return run, m, tmp_path / name


def _plotted(out):
    data = json.loads((out / "icl_figures.json").read_text())
    f3, f6 = data["figures"]["figure3_icl_losses"], data["figures"]["figure6_icl_jacobians"]
    return data, f3["Figure 3: icl_linear loss vs theta*"], f3["error vs the GD iterate (training target)"], f6


def test_icl_figures_subcommand_plots_the_checkpoint_curves(tmp_path):
    """`icl-figures` on a checkpoint dir and on a Ray trial dir: the PNGs exist and every plotted
    series is the one in the checkpoint's icl_curves.json (overwritten with sentinels first, so
    a re-evaluated or mislabelled curve fails)."""
    import shutil

    from analysis.cli import main as analysis_main
    from stabray.cli import main as stabray_main

    run, _, ck = _trained_checkpoint(tmp_path)
    f = ck / "icl_curves.json"
    curves = json.loads(f.read_text())
    T = run.T
    assert curves["T"] == list(range(1, T + 1))
    sentinel = {
        k: [round((i + 1) * 10.0**-j, 12) for i in range(T)]
        for j, k in enumerate(
            (
                "infer_star",
                "tf_star",
                "infer_loss",
                "tf_loss",
                "jac_norm",
                "theory_norm",
                "jac_prod",
                "theory_prod",
                "eaf",
                "jac_err",
            ),
            1,
        )
    }
    curves.update(sentinel)
    f.write_text(json.dumps(curves))

    out = tmp_path / "figs"
    assert analysis_main(["icl-figures", str(ck), "--out", str(out)]) == 0
    pngs = [out / "figure3_icl_losses.png", out / "figure6_icl_jacobians.png"]
    assert all(p.exists() and p.stat().st_size > 5000 for p in pngs)
    data, left, right, f6 = _plotted(out)
    assert data["T"] == list(range(1, T + 1)) and str(ck) in data["source"]
    assert left["inference (self-generated steps)"] == sentinel["infer_star"]
    assert left["teacher-forced (true steps)"] == sentinel["tf_star"]
    assert left["inference, noise on fed-back iterates"] == curves["step_noise"]  # untouched: the run's own
    assert right["inference"] == sentinel["infer_loss"] and right["teacher-forced"] == sentinel["tf_loss"]
    step = f6["step Jacobian"]
    assert step["theory (mean)"] == sentinel["theory_norm"]
    assert step["measured (max over prompts)"] == curves["jac_norm_max"]
    assert f6["Figure 6: Jacobian product norm"]["theory"] == sentinel["theory_prod"]
    eaf_panel = f6["EAF and Jacobian error"]
    assert list(eaf_panel.values()) == [sentinel["eaf"], sentinel["jac_err"]]

    # a Ray Tune trial dir (its latest checkpoint_*), through `python -m stabray icl-figures`
    trial = tmp_path / "ray" / "trainable_0"
    shutil.copytree(ck, trial / "checkpoint_000001")
    (trial / "checkpoint_000000").mkdir()  # an older, empty one: not picked
    out2 = tmp_path / "figs2"
    assert stabray_main(["icl-figures", str(trial), "--out", str(out2)]) == 0
    assert _plotted(out2)[1] == left
    assert (
        stabray_main(["icl-figures", str(tmp_path / "ray"), "--out", str(tmp_path / "figs2b")]) == 2
    )  # not a trial dir
    assert not (tmp_path / "figs2b").exists()
    png = out2 / "figure3_icl_losses.png"
    png.write_bytes(b"mine")
    assert stabray_main(["icl-figures", str(trial), "--out", str(out2)]) == 2  # the figures are there: kept
    assert png.read_bytes() == b"mine"
    assert stabray_main(["icl-figures", str(trial), "--out", str(out2), "--force"]) == 0
    assert png.read_bytes() != b"mine" and _plotted(out2)[1] == left

    # --experiment with --ray-dir: the best of the sweep dir's trials (params.json + result.json as Ray writes them)
    other = tmp_path / "ray" / "trainable_1"
    (other / "checkpoint_000001").mkdir(parents=True)  # empty: choosing this trial would fail
    for d, tid, val in ((trial, "a", 0.9), (other, "b", 0.4)):
        (d / "params.json").write_text(json.dumps(run.cfg.model_dump()))
        (d / "result.json").write_text(
            json.dumps({"trial_id": tid, "val_acc": val, "training_iteration": 1, "test_acc": val, "done": True}) + "\n"
        )
    out3 = tmp_path / "figs3" / "nested"  # folders still to be created, as the default reports/<task>
    assert (
        analysis_main(
            ["icl-figures", "--experiment", "icl_linear", "--ray-dir", str(tmp_path / "ray"), "--out", str(out3)]
        )
        == 0
    )
    data3 = _plotted(out3)
    assert "best trial a " in data3[0]["source"] and data3[1] == left


def test_icl_figures_best_trial_of_an_mlflow_experiment(tmp_path, monkeypatch):
    """--experiment picks the trial with the best validation accuracy, plots its checkpoint, and
    falls back to the run's `<curve>_T<t>` metrics when the checkpoint is not on this machine."""
    from analysis.cli import main as analysis_main
    from stabray.record import trial_params
    from stabray.tracking import Store
    from stabray.tracking.store import CHECKPOINT

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
    store = Store(uri, "icl_linear")
    parent = store.start_parent("icl_linear", "icl_linear-1", {})
    runs = {}
    for i, val in enumerate((0.25, 0.75, 0.5)):  # trial_1 is the best
        run, m, ck = _trained_checkpoint(tmp_path, f"ck{i}", seed=i)
        rid = store.start_child(
            parent,
            f"trial_{i}",
            f"trial_{i}",
            trial_params(run.cfg.model_dump()),
            {"stabray.task": "icl_linear", "stabray.method": "sft_cot"},
            run.cfg.model_dump(),
        )
        store.log_metrics(rid, {"train_loss": 1.0, "val_acc": val}, step=1)
        store.log_metrics(rid, {**m, "val_acc": val}, step=1)
        store.set_tag(rid, CHECKPOINT, str(ck))
        store.end(rid)
        runs[i] = (rid, run, m, ck)
    store.end(parent)

    out = tmp_path / "best"
    assert analysis_main(["icl-figures", "--experiment", "icl_linear", "--tracking-uri", uri, "--out", str(out)]) == 0
    data, left, right, f6 = _plotted(out)
    rid, run, m, ck = runs[1]
    assert "trial_1" in data["source"] and str(ck) in data["source"]
    assert left["inference (self-generated steps)"] == run.curves["infer_star"]
    assert run.curves["infer_star"] != runs[0][1].curves["infer_star"]  # the trials differ (seeds)

    # the checkpoint moved away: the same curves from the run's logged metrics
    ck.rename(tmp_path / "moved")
    out = tmp_path / "from_metrics"
    assert analysis_main(["icl-figures", rid, "--tracking-uri", uri, "--out", str(out)]) == 0
    data, left, right, f6 = _plotted(out)
    assert "metrics" in data["source"]
    T = run.T
    assert left["inference (self-generated steps)"] == pytest.approx([m[f"infer_star_T{t}"] for t in range(1, T + 1)])
    assert f6["step Jacobian"]["theory (mean)"] == pytest.approx(run.curves["theory_norm"])
    assert analysis_main(["icl-figures", "--experiment", "nope", "--tracking-uri", uri]) == 2

    # the sweep report holds the same figures for an ICL experiment (here from the run's metrics)
    from analysis.report import build_report

    rep = build_report("icl_linear", uri, out=tmp_path / "report", log_to_mlflow=False)
    assert (
        _plotted(rep / "icl_linear")[1]["inference (self-generated steps)"] == left["inference (self-generated steps)"]
    )
    assert "`icl_linear/figure6_icl_jacobians.png`" in (rep / "README.md").read_text()


def test_sweep_summary_speaks_of_icl_metrics(capsys):
    """The closing table of an ICL sweep shows the GD-step metrics and explains val_acc as the 5% rule."""
    from stabray.config import get_path
    from stabray.record import TrialRecord, trial_params
    from stabray.spec import load_spec
    from stabray.tune.summary import print_summary

    spec, _ = load_spec("icl_quadratic")
    records = []
    for i, acc in enumerate((0.5, 1.0)):
        config = {**spec.trial_base(), "seed": 7 + i}
        params = {**trial_params(config), "init_gain": get_path(config, "task.params.init_gain")}
        metrics = {
            "val_acc": acc,
            "best_val_acc": acc,
            "test_acc": acc,
            "test_long_acc": acc,
            "val_loss": 1e-6 * (i + 1),
            "test_infer_loss": 3e-4,
            "val_eaf": 18.4,
            "test_eaf": 18.7,
            "jac_err_max": 0.011,
            "test_loss_gap": 2e-4,
        }
        records.append(TrialRecord(f"t{i}", params, metrics, [(8, acc)], "FINISHED", config=config))
    df = print_summary(spec, records, {"tracking_uri": "sqlite:////x.db", "experiment": "icl_quadratic"}, 60.0)
    out = capsys.readouterr().out
    assert df["trial_id"].to_list() == ["t1", "t0"] and df["val_loss"].to_list() == [2e-6, 1e-6]
    assert df["seed"].to_list() == [8, 7] and df["init_gain"].to_list() == [0.5, 0.5]  # the searched paths
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("trial "))
    for col in ("init_gain", "seed", "val_loss", "test_infer_loss", "jac_err_max", "test_eaf"):
        assert col in header
    assert " 2.00e-06 " in next(line for line in lines if line.startswith("t1 "))  # not 0.000
    assert "lam" not in header and "bits" not in header
    assert "exact match" not in out and "within 5%" in out and "icl-figures --experiment icl_quadratic" in out


def test_block_weights_hold_the_construction_and_train_only_its_blocks():
    """weights=blocks: Lemma 3.3's construction lies inside the trained blocks (one exact GD step),
    and no gradient reaches an entry outside them (those stay exactly 0)."""
    from stabray.models.icl import block_masks, build_icl_model

    task = get_task("icl_quadratic", T_max=4, d=5, n=30)
    p = task.params
    assert (p.weights, p.optimizer) == ("blocks", "lbfgs")  # the quadratic defaults
    a = task.sample_arrays(np.random.default_rng(0), 8)
    X, y, th = (torch.as_tensor(v) for v in (a.X, a.y, a.thetas))
    exact = build_icl_model(
        p.d, p.n, "quadratic", p.eta, task.head_acts, init="aligned", init_scale=0.0, init_gain=1.0, weights="blocks"
    ).double()
    assert torch.allclose(exact(X, y, th[:, :-1]), th[:, 1:], rtol=1e-10, atol=1e-12)
    m = build_icl_model(
        p.d, p.n, "quadratic", p.eta, task.head_acts, init="aligned", init_scale=0.01, weights="blocks", seed=3
    ).double()
    mk, mv = block_masks(p.d, 3)
    assert int(mk.sum()) == 3 * (p.d * p.d + 1) and int(mv.sum()) == 3 * p.d * p.d
    assert not m.W_kq[mk == 0].any() and not m.V[mv == 0].any() and m.W_kq[mk == 1].std() > 0
    ((m(X, y, th[:, :-1]) - th[:, 1:]) ** 2).sum().backward()
    assert not m.W_kq.grad[mk == 0].any() and not m.V.grad[mv == 0].any()
    assert m.W_kq.grad[mk == 1].abs().sum() > 0 and m.V.grad[mv == 1].abs().sum() > 0
    full = build_icl_model(p.d, p.n, "quadratic", p.eta, task.head_acts, init="aligned", init_scale=0.01, seed=3)
    assert full.W_kq[mk == 0].std() > 0  # eq. (5) as written trains every entry


@pytest.mark.slow
def test_trained_quadratic_jacobian_matches_theory(tmp_path):
    """The shipped icl_quadratic recipe (aligned start at gain 0.5, blocks, L-BFGS, 8 epochs of 256
    fresh prompts) learns the GD step: teacher-forced error far below copying theta_{t-1}, every
    self-generated theta_T within 5% of the GD iterate, and J_{t-1}^(t) close to
    I - (2 eta/n) X D(theta_{t-1}) X^T (about 60 s on one core)."""
    run = make_run(
        {
            "task": {
                "name": "icl_quadratic",
                "params": {"T_max": 20, "last_target": "gd"},  # the GD theory's check: every label a GD iterate
                "train_size": 256,
                "val_size": 64,
                "test_size": 64,
                "resample_train": True,
            },
            "method": {"name": "sft_cot"},
            "train": {"epochs": 8, "lr": 1.0, "weight_decay": 0.0},
            "eval": {"eaf_examples": 0, "long_splits": [], "decomposition_examples": 0, "weight_noise_seeds": 0},
            "cache_dir": str(tmp_path),
        }
    )
    for _ in range(run.train_cfg.epochs):
        m = run.epoch()
    X, y, _, th = run.data["val"]
    copy_loss = float(((th[:, 1:] - th[:, :-1]) ** 2).sum(-1).mean())  # predicting theta_{t-1} again
    assert m["val_loss"] < 0.02 * copy_loss, (m["val_loss"], copy_loss)
    c = run.curves_of("test", noise_draws=0)
    th = run.data["test"][3]
    never_moved = float(((th[:, -1] - th[:, 0]) ** 2).sum(-1).mean())  # a chain that stays at theta_0
    assert min(c["acc"]) >= 0.95 and c["infer_loss"][-1] < 0.01 * never_moved, (c["infer_loss"][-1], never_moved)
    s = run.stability("test", 16)
    assert max(s["jac_err"]) < 0.03, s["jac_err"]
    assert np.allclose(s["jac_norm"], s["theory_norm"], atol=0.005)
    assert max(s["offdiag_max"]) < 1e-12  # the blocks read only the last column's theta: J_i^(t) = 0 for i < t-1
