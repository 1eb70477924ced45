"""`reproduce <study> --profile laptop|paper`: the study registry (every spec it names validates),
the dry-run plan (trial and trial-epoch counts against hand-computed ones, reuse from the store),
bad input, and one tiny study end to end (sweep, rerun, table, parent run, reuse on a second call)."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from analysis.cli import main
from analysis.studies import OUTPUTS, PROFILES, STUDIES, Plan, Study, finished_sweep, reproduce, resolve_spec

SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"
STUDY_PROFILES = [(s, p) for s in STUDIES for p in PROFILES]


@pytest.fixture
def no_runs(monkeypatch):
    """Fail the test should anything try to run a sweep or a rerun."""
    import analysis.rerun
    import analysis.studies

    def boom(*a, **k):
        raise AssertionError("a dry run / bad input started work")

    monkeypatch.setattr(analysis.studies, "run_sweep_spec", boom)
    monkeypatch.setattr(analysis.rerun, "rerun", boom)


@pytest.mark.parametrize("study,profile", STUDY_PROFILES, ids=[f"{s}-{p}" for s, p in STUDY_PROFILES])
def test_dry_run_of_every_study_exits_0(study, profile, tmp_path, capsys, no_runs):
    rc = main(["reproduce", study, "--profile", profile, "--dry-run", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    out = capsys.readouterr().out
    assert rc == 0
    plan = STUDIES[study].plan(profile)
    for name in plan.specs:
        assert f"spec {name} " in out and "would run (no store yet)" in out
    assert out.rstrip().splitlines()[-1].startswith("  to run: ")
    assert not (tmp_path / "m.db").exists()  # a dry run creates no store
    assert not Path(f"reports/reproduce-{study}-{profile}").exists()


def test_every_spec_a_study_names_validates_and_every_output_exists():
    from stabray.spec import load_spec

    for study in STUDIES.values():
        for profile in PROFILES:
            plan = study.plan(profile)
            assert plan.specs and plan.outputs
            assert set(plan.outputs) <= set(OUTPUTS), (study.name, profile)
            for name in plan.specs:
                spec, path = load_spec(name)  # raises on any problem
                assert path.is_file()


def test_trial_counts_match_hand_computed_ones(tmp_path, capsys, no_runs):
    uri = f"sqlite:///{tmp_path}/m.db"
    # dijkstra_methods: 6 methods x seeds {0,1,2} x num_samples 1, 12 epochs, FIFO
    sp = resolve_spec("dijkstra_methods", 3, uri)
    assert (sp.trials, sp.epochs, sp.trial_epochs, sp.asha) == (6 * 3, 12, 6 * 3 * 12, False)
    # table3_dijkstra: lam {1, 0.1} x bits {1,2,3,4,32} x seeds; --seeds 5 widens the seed axis
    sp = resolve_spec("table3_dijkstra", 5, uri)
    assert (sp.trials, sp.trial_epochs) == (2 * 5 * 5, 2 * 5 * 5 * 12)
    # a paper method search: 6 methods x num_samples 16, 10 epochs, ASHA (an upper bound)
    sp = resolve_spec("studies/paper/dijkstra_methods", 3, uri)
    assert (sp.trials, sp.trial_epochs, sp.asha) == (6 * 16, 6 * 16 * 10, True)
    # appendix-b2: 3 methods x train sizes {500, 2000} x seeds
    sp = resolve_spec("studies/appendix_b2", 2, uri)
    assert sp.trials == 3 * 2 * 2 and sp.spec.search.space["seed"].choice == [0, 1]

    assert main(["reproduce", "table3", "--dry-run", "--seeds", "5", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "50 trials (grid of 50 x num_samples 1), 12 epochs, FIFO: 600 trial-epochs" in out
    assert "to run: 50 trials, 600 trial-epochs" in out and "upper bound" not in out
    assert main(["reproduce", "table1", "--profile", "paper", "--dry-run", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    # 7 tasks x 96 trials x 10 epochs, plus 7 x 6 selected configurations x 2 more seeds x 10 epochs
    assert "at most 960 trial-epochs (upper bound: ASHA" in out
    assert f"to run: {7 * 96 + 7 * 12} trials, {7 * 960 + 7 * 120} trial-epochs (upper bound)" in out


@pytest.mark.parametrize(
    "argv,words",
    [
        (["reproduce", "tabel1"], ["unknown study 'tabel1'", "did you mean table1"]),
        (["reproduce", "table1", "--profile", "desktop"], ["--profile desktop", "laptop, paper"]),
        (["reproduce", "table1", "--seeds", "0"], ["--seeds 0", "at least 1"]),
    ],
)
def test_bad_input_is_one_line_exit_2_before_any_work(argv, words, tmp_path, capsys, no_runs):
    out_dir = tmp_path / "out"
    rc = main([*argv, "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--out", str(out_dir)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert all(w in err for w in words), err
    assert not out_dir.exists() and not (tmp_path / "m.db").exists()


def test_reuse_needs_a_finished_parent_without_running_trials(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/m.db"
    assert finished_sweep(uri, "exp", "sw", 2) == (None, "no store yet")
    client = MlflowClient(uri)
    eid = client.create_experiment("exp")

    def sweep(status, trial_states, name="sw"):
        p = client.create_run(eid, tags={"stabray.role": "sweep", "stabray.sweep": name}).info.run_id
        for st in trial_states:
            c = client.create_run(eid, tags={"stabray.role": "trial", "mlflow.parentRunId": p}).info.run_id
            if st != "RUNNING":
                client.set_terminated(c, st)
        if status != "RUNNING":
            client.set_terminated(p, status)
        return p

    sweep("RUNNING", ["FINISHED", "RUNNING"])
    assert finished_sweep(uri, "exp", "sw", 2)[0] is None
    sweep("FINISHED", ["FINISHED", "RUNNING"])  # the parent ended, a trial did not
    assert finished_sweep(uri, "exp", "sw", 2)[0] is None
    sweep("FINISHED", ["FINISHED"])  # fewer trials than the spec asks for
    assert finished_sweep(uri, "exp", "sw", 2)[0] is None
    sweep("FINISHED", ["FINISHED", "FAILED"], name="other")  # another sweep's
    assert finished_sweep(uri, "exp", "sw", 2)[0] is None
    good = sweep("FINISHED", ["FINISHED", "FAILED"])
    found, note = finished_sweep(uri, "exp", "sw", 2)
    assert found["run_id"] == good and found["trials"] == 2 and good in note


def tiny_spec(tmp_path) -> Path:
    spec = {
        "include": str(SWEEPS / "_base.yaml"),
        "name": "tiny-study",
        "task": {
            "name": "dijkstra",
            "params": {"n_nodes": 3, "decimals": 1},  # learnt in part within 10 epochs
            "train_size": 64,
            "resample_train": False,
            "val_size": 8,
            "test_size": 32,
        },
        "model": {"preset": "tiny"},
        "method": {"name": "sft_cot"},
        "train": {"epochs": 10, "batch_size": 16, "lr": 1e-2, "warmup_steps": 1, "threads": 1},
        "eval": {
            "eaf_examples": 2,
            "eaf_iters": 2,
            "decomposition_examples": 0,
            "weight_noise_seeds": 0,
            "long_splits": [],
        },
        "search": {
            "searcher": "random",
            "scheduler": "fifo",
            "num_samples": 1,
            "max_concurrent": 1,
            "space": {"lam": None, "bits": None, "lr": None},
        },
        "device": "cpu",
    }
    p = tmp_path / "tiny_study.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


@pytest.mark.slow
def test_tiny_study_end_to_end_then_reused(tmp_path, monkeypatch, capsys):
    """One sweep trial, one rerun to 2 seeds, Table 1 from both; the second call runs nothing."""
    from mlflow import MlflowClient

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    plan = Plan((str(tiny_spec(tmp_path)),), ("table1",), rerun=True)
    study = Study("tiny", "a tiny study", plan, plan)
    kw = dict(seeds=2, tracking_uri=uri, storage=str(tmp_path / "ray"), address="local")

    reproduce(study, "laptop", dry_run=True, **kw)
    printed = capsys.readouterr().out
    assert "1 trials (random, num_samples 1), 10 epochs, FIFO: 10 trial-epochs" in printed
    assert "about 1 configuration -> at most 1 reruns x 10 epochs" in printed and "to run: 2 trials" in printed
    out = reproduce(study, "laptop", out=tmp_path / "out", **kw)
    printed = capsys.readouterr().out
    assert "reproduce: running" in printed and "wall time" in printed

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("tiny-study")
    trials = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("stabray.role") == "trial"]
    assert len(trials) == 2 and {r.data.params["seed"] for r in trials} == {"0", "1"}
    acc = np.array([r.data.metrics["test_acc"] for r in trials]) * 100
    assert acc.max() > 0  # not 0 against 0 (the two seeds scored 43.75% and 6.25% when written)
    row = pl.read_csv(out / "table1_accuracy.csv").filter(pl.col("method") == "sft_cot").row(0, named=True)
    assert row["n_seeds"] == 2
    assert row["mean_pct"] == pytest.approx(acc.mean()) and row["std_pct"] == pytest.approx(acc.std(ddof=1))
    assert (out / "table1_accuracy.md").read_text().count("(n=2)") == 1

    rexp = client.get_experiment_by_name("reproduce")
    (parent,) = client.search_runs([rexp.experiment_id])
    assert parent.info.run_name == "tiny-laptop" and parent.info.status == "FINISHED"
    assert parent.data.params["seeds"] == "2" and parent.data.tags["stabray.ran"].endswith("tiny_study.yaml")
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"table1_accuracy.md", "table1_accuracy.tex", "table1_accuracy.csv", "README.md", "trials.csv"} <= names

    before = len(client.search_runs([exp.experiment_id]))
    assert reproduce(study, "laptop", dry_run=True, **kw) is None
    printed = capsys.readouterr().out
    assert "store: reused: finished sweep" in printed and "0 reruns, 0 trial-epochs (from the stored sweep)" in printed
    assert "to run: 0 trials, 0 trial-epochs" in printed
    reproduce(study, "laptop", out=tmp_path / "out2", **kw)
    printed = capsys.readouterr().out
    assert "reusing" in printed and "reproduce: running" not in printed
    assert "every selected configuration already has 2 seeds" in printed
    assert len(client.search_runs([exp.experiment_id])) == before  # no trial, no rerun parent
    again = pl.read_csv(tmp_path / "out2" / "table1_accuracy.csv")
    assert again.equals(pl.read_csv(out / "table1_accuracy.csv"))
    runs = client.search_runs([rexp.experiment_id], order_by=["attributes.start_time DESC"])
    assert runs[0].data.tags["stabray.reused"].endswith("tiny_study.yaml") and runs[0].data.tags["stabray.ran"] == ""


# ----------------------------------------------------------------------------------- the study tables


def record(
    tid, method="sft_cot", model="embedded-mini", seed=0, status="FINISHED", metrics=None, decomp=None, **params
):
    from stabray.record import TrialRecord

    p = {
        "task": "dijkstra",
        "method": method,
        "model": model,
        "seed": str(seed),
        "lr": "0.003",
        "bits": "32",
        "lam": "1.0",
        **{k: str(v) for k, v in params.items()},
    }
    m = {"val_acc": 0.5, "test_acc": 0.5, **(metrics or {})}
    return TrialRecord(tid, p, m, [(1, m["val_acc"])], status, run_id=f"run-{tid}", decomposition=decomp)


def test_table2_is_the_seed_mean_per_model_and_T():
    """Per (model, T): the mean over the seeds of every eq. (4) term; ratio = bound / gap of the
    means (none at T = 1, where the gap is 0); other methods and stopped trials do not count."""
    from analysis.tables import TABLE2_KEYS, table2
    from stabray.record import decomposition_frame, trials_frame

    rng = np.random.default_rng(1)
    recs, rows = [], {}
    for model in ("embedded-mini", "embedded-small"):
        for seed in range(3):
            d = [
                {
                    "T": t,
                    **{
                        k: (0.0 if t == 1 and k in ("loss_gap", "bound") else float(rng.uniform(0.1, 9)))
                        for _, k in TABLE2_KEYS
                    },
                }
                for t in (1, 2, 3)
            ]
            recs.append(record(f"{model}-{seed}", model=model, seed=seed, decomp=d))
            for row in d:
                rows.setdefault((model, row["T"]), []).append(row)
    noise = [{"T": t, **{k: 1e6 for _, k in TABLE2_KEYS}} for t in (1, 2, 3)]
    recs += [record("alg1", method="alg1", decomp=noise), record("stop", status="STOPPED", seed=7, decomp=noise)]
    t = table2(trials_frame(recs), decomposition_frame(recs))
    assert t.data.height == 6 and set(t.data["n"].to_list()) == {3}
    for r in t.data.iter_rows(named=True):
        vs = rows[(r["model"], r["T"])]
        for _, k in TABLE2_KEYS:
            x = np.array([v[k] for v in vs])
            assert r[k] == pytest.approx(x.mean()) and r[f"{k}_std"] == pytest.approx(x.std(ddof=1))
        gap, bound = np.mean([v["loss_gap"] for v in vs]), np.mean([v["bound"] for v in vs])
        assert r["ratio"] is None if r["T"] == 1 else r["ratio"] == pytest.approx(bound / gap)
    assert t.display.columns[:4] == ["Task", "Method", "Model", "T"] and t.display["Ratio"][0] == "–"


def test_study_table_groups_a_grid_and_names_missing_metrics():
    from analysis.tables import study_table
    from stabray.record import trials_frame

    rng = np.random.default_rng(2)
    recs, vals = [], {}
    for strategy in ("random", "drop_first"):
        for seed in range(3):
            m = {"test_acc": float(rng.uniform(0.2, 0.9)), "test_eaf_at_T": float(rng.uniform(1, 20))}
            recs.append(record(f"{strategy}{seed}", method="alg1", seed=seed, strategy=strategy, metrics=m))
            vals.setdefault(strategy, []).append(m)
    recs.append(record("x", method="alg1", seed=5, strategy="random", status="FAILED", metrics={"test_acc": 0.0}))
    metrics = [("Acc", "test_acc", True), ("Σρ", "test_eaf_at_T", False), ("WN", "weight_noise_loss_increase", False)]
    t = study_table(trials_frame(recs), ("task", "method", "strategy"), metrics, "abl", "caption", {"strategy": "S"})
    assert t.data["n"].to_list() == [3, 3] and "weight_noise_loss_increase" in t.note
    for r in t.data.iter_rows(named=True):
        acc = np.array([v["test_acc"] for v in vals[r["strategy"]]])
        assert r["test_acc_mean"] == pytest.approx(acc.mean()) and r["test_acc_std"] == pytest.approx(acc.std(ddof=1))
    assert t.display.columns == ["Task", "Method", "S", "n", "Acc", "Σρ"]
    shown = dict(zip(t.display["S"], t.display["Acc"]))
    a = np.array([v["test_acc"] for v in vals["random"]]) * 100
    assert shown["random"] == f"{a.mean():.1f} ± {a.std(ddof=1):.1f}"


def test_every_output_writes_its_files(tmp_path):
    """Every table and figure a study can ask for builds from one synthetic frame (with eq. (4)
    rows, two models, two strategies) and writes what the plan says it writes."""
    from analysis.studies import Context
    from analysis.tables import Table
    from stabray.record import decomposition_frame, trials_frame

    d = [
        {
            "T": t,
            "loss_gap": 0.1 * t,
            "bound": 1.0 * t,
            "first_order": 0.5 * t,
            "second_order": 0.1 * t,
            "C1": 0.02,
            "C2": 3.0,
            "eaf": 2.0 * t,
            "sum_eps": 0.1,
        }
        for t in (1, 2, 3)
    ]
    m = {
        "test_acc_n5": 0.1,
        "test_eaf_at_T": 3.0,
        "test_loss_gap_at_T": 0.2,
        "test_bound_at_T": 1.0,
        "test_sum_eps_at_T": 0.1,
        "stability_T": 3.0,
        "weight_noise_loss_increase": 0.01,
    }
    recs = [
        record(
            f"{meth}{model}{seed}",
            method=meth,
            model=model,
            seed=seed,
            decomp=d,
            metrics=m,
            strategy="random",
            noise="quant",
            train_size=500,
        )
        for meth in ("sft_cot", "alg1")
        for model in ("embedded-mini", "embedded-small")
        for seed in (0, 1)
    ]
    ctx = Context(trials_frame(recs), decomposition_frame(recs), tmp_path)
    for key, output in OUTPUTS.items():
        items = output.build(ctx)
        assert items, key
        for item in items:
            if isinstance(item, Table):
                paths = item.write(tmp_path)
                assert all(p.stat().st_size > 0 for p in paths[:2]) and not item.display.is_empty(), key
            else:
                assert item.suffix == ".png" and item.stat().st_size > 0 and item.name in output.files, key


def test_mounted_on_stabray_through_the_entry_point_group(monkeypatch, tmp_path, capsys, no_runs):
    """`python -m stabray reproduce` is analysis's register function, found through the entry points
    that pyproject.toml declares (stabray itself never imports analysis)."""
    import re
    from importlib.metadata import EntryPoint

    import stabray.cli

    text = (SWEEPS.parent / "pyproject.toml").read_text()
    group = text.split('[project.entry-points."stabray.commands"]', 1)[1].split("\n[", 1)[0]
    value = re.search(r'^reproduce = "([^"]+)"', group, re.M).group(1)
    assert value == "analysis.cli:register_reproduce"
    monkeypatch.setattr(stabray.cli, "entry_points", lambda group: [EntryPoint("reproduce", value, group)])
    argv = ["reproduce", "figure4", "--dry-run", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]
    assert stabray.cli.main(argv) == 0
    assert "spec table3_dijkstra " in capsys.readouterr().out
    assert stabray.cli.main(["reproduce", "figure9"]) == 2
    assert "unknown study 'figure9'" in capsys.readouterr().err
