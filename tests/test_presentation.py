"""What a researcher sees: the live console view of a sweep, the MLflow runs (names, ASHA-stopped
status, system metrics apart, the parent run's summary) and the command line's help and listings."""

import json
import re
from pathlib import Path

import pytest

from stabray.cli import main
from stabray.record import logged_name, record_name, run_name

SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"


def test_run_names_are_readable_and_unique():
    cfg = {
        "task": {"name": "dijkstra", "params": {"n_nodes": 4}},
        "method": {"name": "alg1", "params": {"lam": 0.2, "bits": 4}},
        "train": {"lr": 0.0031234},
        "seed": 0,
    }
    searched = ["method.params.lam", "method.params.bits", "train.lr"]
    assert run_name(cfg, searched) == "alg1-lam0.2-b4-lr0.0031-s0"
    assert run_name({**cfg, "seed": 3}, []) == "alg1-s3"
    assert run_name({**cfg, "method": {"name": "sft_cot"}}, ["train.lr"]) == "sft_cot-lr0.0031-s0"
    strided = {**cfg, "model": {"position_eval_stride": [2, 3, 4]}}
    assert run_name(strided, ["model.position_eval_stride"]) == "alg1-stride2,3,4-s0"  # as its param reads

    from stabray.tune.callbacks import MLflowTuneCallback

    class Trial:  # what the callback reads of a Ray trial
        def __init__(self, trial_id):
            self.trial_id, self.config = trial_id, cfg

    cb = MLflowTuneCallback("sqlite:////nowhere.db", "x", "parent", searched)
    names = [cb.name_of(Trial(t)) for t in ("a", "b", "c", "a")]
    assert names == ["alg1-lam0.2-b4-lr0.0031-s0", "alg1-lam0.2-b4-lr0.0031-s0-2", "alg1-lam0.2-b4-lr0.0031-s0-3"] + [
        "alg1-lam0.2-b4-lr0.0031-s0"
    ]
    assert cb.get_state()["names"]["b"] == names[1]  # survives a driver restart with the experiment


def test_system_metrics_are_logged_apart():
    assert logged_name("epoch_time_s") == "sys/epoch_time_s" and logged_name("tokens_per_s") == "sys/tokens_per_s"
    assert logged_name("val_acc") == "val_acc" and logged_name("infer_loss_T3") == "infer_loss_T3"
    assert record_name("sys/epoch_time_s") == "epoch_time_s" and record_name("val_acc") == "val_acc"


def test_asha_stopped_trials_in_mlflow_and_console(tmp_path, capsys):
    """A real Ray Tune run with ASHA (grace 1, 3 epochs, reduction factor 2, one trial at a time, lam
    from best to worst): the first trial finishes, every later one is stopped after epoch 1. MLflow
    must say so (tag and epoch), name the runs, keep sys/ metrics apart, and the console must show it."""
    import ray
    from mlflow import MlflowClient
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from stabray.tracking import Store
    from stabray.tune.callbacks import MLflowTuneCallback
    from stabray.tune.console import WIDTH, SweepConsole
    from stabray.tune.sweep import init_ray, quiet_logs, ray_loggers

    val_acc = {1.0: 0.9, 0.5: 0.7, 0.2: 0.5, 0.1: 0.3}  # per lam

    def fake_trainable(config):  # nested, so Ray ships it by value (workers cannot import this file)
        """Reports like stabray's trainable, with val_acc set by lam, so ASHA's decisions are known."""
        from ray import tune

        acc, epochs = val_acc[config["method"]["params"]["lam"]], config["train"]["epochs"]
        for epoch in range(1, epochs + 1):
            m = {
                "val_acc": acc,
                "val_eaf": 1.0 + epoch,
                "train_loss": 1.0 / epoch,
                "epoch": epoch,
                "epoch_time_s": 0.01,
            }
            if epoch == epochs:
                m.update(test_acc=acc, test_eaf=2.5, best_val_acc=acc)
            tune.report(m)

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    store = Store(uri, "asha")
    parent = store.start_parent("asha", "asha-run", {})
    searched = ["method.params.lam"]
    cb = MLflowTuneCallback(uri, "asha", parent, searched)
    console = SweepConsole("asha", 4, 3, searched, cb.name_of)
    quiet_logs(False)
    init_ray("local")
    try:
        tuner = tune.Tuner(
            tune.with_resources(fake_trainable, {"cpu": 1}),
            param_space={
                "task": {"name": "dijkstra", "params": {"n_nodes": 4}},
                "method": {"name": "alg1", "params": {"lam": tune.grid_search([1.0, 0.5, 0.2, 0.1]), "bits": 4}},
                "train": {"epochs": 3, "lr": 0.003},
                "seed": 0,
            },
            tune_config=tune.TuneConfig(
                metric="val_acc",
                mode="max",
                scheduler=ASHAScheduler(time_attr="training_iteration", max_t=3, grace_period=1, reduction_factor=2),
                max_concurrent_trials=1,
            ),
            run_config=tune.RunConfig(
                storage_path=str(tmp_path / "runs"), callbacks=[cb, console, *ray_loggers()], verbose=0
            ),
        )
        tuner.fit()
    finally:
        ray.shutdown()
    out = capsys.readouterr().out

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("asha")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # opens as model training
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id]) if r.info.run_id != parent}
    assert set(runs) == {"alg1-lam1-s0", "alg1-lam0.5-s0", "alg1-lam0.2-s0", "alg1-lam0.1-s0"}
    finished = runs.pop("alg1-lam1-s0")
    assert "stabray.status" not in finished.data.tags
    assert finished.data.metrics.get("test_acc") == 0.9, (finished.data.metrics, out)
    assert "Finished" in finished.data.tags["mlflow.note.content"]
    for name, r in runs.items():
        assert r.data.tags["stabray.status"] == "STOPPED", name
        assert r.data.tags["stabray.stopped_at_epoch"] == "1", name
        assert "Stopped by ASHA** after epoch 1 of 3" in r.data.tags["mlflow.note.content"]
        assert "test_acc" not in r.data.metrics
        assert "plots/curves.png" in {a.path for a in client.list_artifacts(r.info.run_id, "plots")}
    # timings under sys/ in MLflow, read back under their declared names
    assert "sys/epoch_time_s" in finished.data.metrics and "epoch_time_s" not in finished.data.metrics
    records, _ = store.trial_records(stability=False)
    by_name = {r.name: r for r in records}
    assert by_name["alg1-lam1-s0"].metrics["epoch_time_s"] == 0.01
    assert sorted(r.status for r in records) == ["FINISHED", "STOPPED", "STOPPED", "STOPPED"]

    lines = out.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    assert sum("stopped by ASHA at epoch 1" in line for line in lines) == 3
    assert any("alg1-lam1-s0  finished" in line for line in lines)
    assert not any("Trial status" in line or "Checkpoint" in line for line in lines)  # Ray's own output is off


def test_parent_run_holds_the_sweep_summary(tmp_path, monkeypatch):
    """The parent run: the spec's search space as params at the start, then the best trial's params
    and metrics, summary.md, the two plots, a description leading with the result, and the saved
    runs-table view with the searched params and metrics."""
    from mlflow import MlflowClient

    from stabray.spec import load_spec
    from stabray.tracking import Store, experiment_links
    from stabray.tune.summary import log_sweep_summary, sweep_description, sweep_params, view_columns, view_order

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    spec, _ = load_spec("dijkstra", {"task.test_size": 20, "task.val_size": 20})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    store = Store(uri, "dijkstra")
    parent = store.start_parent(
        "dijkstra", "dijkstra-1", spec.model_dump(), sweep_params(spec), sweep_description(spec)
    )
    order_by, ascending = view_order(spec)
    assert (order_by, ascending) == ("metrics.val_acc", False)  # accuracy: highest first
    store.set_runs_view(view_columns(spec), order_by=order_by, ascending=ascending)
    trials = [  # (lam, bits, lr, val_acc per epoch, final metrics or None when ASHA stopped it)
        (0.2, 4, 0.003, [0.3, 0.5, 0.8], {"test_acc": 0.75, "test_eaf": 3.2, "trivial_test_acc": 0.72}),
        (1.0, 32, 0.002, [0.2, 0.1], None),
        (0.5, 2, 0.005, [0.4, 0.6, 0.7], {"test_acc": 0.65, "test_eaf": 4.1, "trivial_test_acc": 0.72}),
    ]
    for i, (lam, bits, lr, accs, final) in enumerate(trials):
        params = {"task": "dijkstra", "method": "alg1", "lam": lam, "bits": bits, "lr": lr, "seed": 0}
        rid = store.start_child(parent, f"t{i}", f"alg1-lam{lam}-b{bits}-s0", params, {}, {})
        for e, acc in enumerate(accs, start=1):
            store.log_metrics(rid, {"val_acc": acc, "val_eaf": 1.0 + e, "epoch_time_s": 1.0}, step=e)
        if final:
            store.log_metrics(rid, {**final, "best_val_acc": max(accs)}, step=len(accs))
            store.end(rid)
        else:
            store.set_tag(rid, "stabray.status", "STOPPED")
            store.end(rid)
    records, _ = store.trial_records(stability=False)
    best = log_sweep_summary(store, parent, spec, records, wall_s=90.0)
    assert best["name"] == "alg1-lam0.2-b4-s0"

    client = MlflowClient(uri)
    run = client.get_run(parent)
    p, m, tags = run.data.params, run.data.metrics, run.data.tags
    assert p["space.lam"] == "choice 0.1, 0.2, 0.5, 1.0" and p["space.lr"].startswith("loguniform")
    assert p["task"] == "dijkstra" and p["n_nodes"] == "4" and p["epochs"] == "12"
    assert (p["lam"], p["bits"], p["lr"]) == ("0.2", "4", "0.003")  # the best trial's values
    assert m["val_acc"] == 0.8 and m["test_acc"] == 0.75 and m["test_eaf"] == 3.2
    assert m["trivial_test_acc"] == 0.72  # each accuracy's floor beside it
    assert tags["stabray.best_trial"] == "alg1-lam0.2-b4-s0"
    note = tags["mlflow.note.content"]
    assert note.startswith("**Result**: sweep dijkstra: 3 trials (0 failed), 2 finished, 1 stopped early")
    assert "Best trial: **alg1-lam0.2-b4-s0**" in note and "stabray.status" in note and "`sys/`" in note
    md = Path(client.download_artifacts(parent, "summary.md", str(tmp_path))).read_text()
    rows = [line for line in md.splitlines() if line.startswith("| alg1")]
    assert [r.split("|")[1].strip() for r in rows] == ["alg1-lam0.2-b4-s0", "alg1-lam0.5-b2-s0", "alg1-lam1.0-b32-s0"]
    assert "| STOPPED" in rows[2] and "| 0.750 " in rows[0]  # rounded to 3 decimals
    assert "Trivial rules (no learning) on the same examples: test_acc: pi=s if adjacent" in md
    plots = {a.path for a in client.list_artifacts(parent, "plots")}
    assert plots == {"plots/val_acc_per_epoch.png", "plots/accuracy_vs_eaf.png"}

    exp = client.get_experiment_by_name("dijkstra")
    view = json.loads(exp.tags["mlflow.sharedViewState.stabray"])
    assert view["selectedColumns"][:4] == ["params.`lam`", "params.`bits`", "params.`lr`", "metrics.`val_acc`"]
    assert "tags.`stabray.status`" in view["selectedColumns"] and view["orderByKey"] == "metrics.`val_acc`"
    assert view["orderByAsc"] is False
    metrics = [c for c in view["selectedColumns"] if c.startswith("metrics.")]
    assert metrics[:9] == [  # every accuracy with its trivial-rule floor right after it
        f"metrics.`{m}`"
        for m in (
            "val_acc",
            "best_val_acc",
            "trivial_val_acc",
            "test_acc",
            "trivial_test_acc",
            "test_acc_n5",
            "trivial_test_acc_n5",
            "test_acc_n6",
            "trivial_test_acc_n6",
        )
    ]
    ((name, link),) = experiment_links(uri, "http://127.0.0.1:5000")
    assert name == "dijkstra" and link.endswith("/runs?workflowType=machine_learning&viewStateShareKey=stabray")


def _output(capsys, argv) -> list[str]:
    try:
        rc = main(argv)
    except SystemExit as e:  # --help and --version exit through argparse
        rc = e.code
    assert rc == 0
    return capsys.readouterr().out.splitlines()


def test_help_version_and_listings_fit_the_screen(capsys):
    from stabray import __version__

    assert _output(capsys, ["--version"]) == [f"stabray {__version__}"]
    help_lines = _output(capsys, ["--help"])
    text = "\n".join(help_lines)
    assert "stability of multi-step reasoning" in text and "examples:" in text
    assert "dijkstra_methods" in text and "paper/dijkstra" in text  # the shipped specs
    assert all(len(line) <= 120 for line in help_lines)

    methods = _output(capsys, ["methods"])
    assert all(len(line) <= 120 for line in methods)
    text = " ".join(line.strip() for line in methods)
    assert "inference is ordinary next-token decoding." in text  # mtp's description, not cut mid-sentence
    assert "{" not in text and "choice of 0.1, 0.2, 0.5, 1.0" in text  # spaces readable, not dicts

    tasks = _output(capsys, ["tasks"])
    assert max(map(len, tasks)) <= 200
    dijkstra = tasks.index(next(line for line in tasks if line.startswith("dijkstra ")))
    assert "n_nodes=4" in tasks[dijkstra + 2] and "sweeps/dijkstra.yaml" in tasks[dijkstra + 2]
    assert "example (test split, n_nodes=4" in " ".join(tasks[dijkstra + 3 : dijkstra + 5])  # after wrapped params
    quad = tasks.index(next(line for line in tasks if line.startswith("icl_quadratic ")))
    assert re.match(r"  \w", tasks[quad + 1]) and "quadratic" in tasks[quad + 1]  # a description, not empty


@pytest.mark.parametrize("command", ["sweep", "tasks", "data", "methods", "stability", "ui", "report"])
def test_command_help_fits(capsys, command):
    lines = _output(capsys, [command, "--help"])
    assert all(len(line) <= 200 for line in lines)


def test_ui_optuna_finds_the_study(tmp_path):
    import os
    import sqlite3

    from stabray.commands.ui import optuna_study
    from stabray.errors import UserError

    with pytest.raises(UserError, match="no sweep with an Optuna study"):
        optuna_study("latest", str(tmp_path))
    old, new = tmp_path / "dijkstra-20260101-000000", tmp_path / "multi-20260102-000000" / "alg1"
    for d in (old, new):
        d.mkdir(parents=True)
        with sqlite3.connect(d / "optuna.db") as con:  # what the check reads: SQLite with Optuna's table
            con.execute("create table studies (study_id integer primary key)")
        con.close()
    os.utime(old / "optuna.db", (1, 1))  # older
    assert optuna_study("latest", str(tmp_path)) == new / "optuna.db"  # the newest, one level down too
    assert optuna_study(str(old), "unused") == old / "optuna.db"  # a run directory
    assert optuna_study(str(new.parent), "unused") == new / "optuna.db"  # a multi-method run: its first method
    with pytest.raises(UserError, match="no Optuna study"):
        optuna_study(str(tmp_path / "nope"), "unused")
    (old / "optuna.db").write_bytes(b"")  # an empty file: no study in it
    with pytest.raises(UserError, match="an empty file"):
        optuna_study(str(old), "unused")


def test_ui_links_name_how_many_experiments_they_leave_out(monkeypatch, capsys):
    """The start-up links stop at the newest SHOWN experiments and say how many more the list holds."""
    import stabray.tracking as tracking
    from stabray.commands import ui

    links = [(f"exp{i}", f"http://h/#/experiments/{i}/runs") for i in range(ui.SHOWN + 3)]
    monkeypatch.setattr(tracking, "experiment_links", lambda uri, url: links)
    ui.print_links("sqlite:///x.db", "http://h/")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in lines[:-1]] == [n for n, _ in links[: ui.SHOWN]]
    assert lines[-1] == "  ... and 3 older experiments: http://h/#/experiments"
    monkeypatch.setattr(tracking, "experiment_links", lambda uri, url: links[:2])
    ui.print_links("sqlite:///x.db", "http://h")
    assert len(capsys.readouterr().out.splitlines()) == 2  # all shown, no tail line


def test_ui_waits_for_an_answer_and_names_a_server_that_never_gives_one():
    """Both servers (MLflow's, optuna-dashboard) share this wait: a server that exits, or one that
    never answers, is a UserError naming it, not a URL printed as if it served."""
    import http.server
    import subprocess
    import sys
    import threading

    from conftest import free_port

    from stabray.commands.ui import wait_until_answers
    from stabray.errors import UserError

    free = free_port()  # nothing listens there once it is returned
    exits = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exits.wait()
    with pytest.raises(UserError, match=r"the test server exited with code 3"):
        wait_until_answers(exits, f"http://127.0.0.1:{free}", "the test server")
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(UserError, match=rf"the test server did not answer at http://127.0.0.1:{free} within 1 s"):
            wait_until_answers(silent, f"http://127.0.0.1:{free}", "the test server", timeout_s=1.0)
        server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            wait_until_answers(silent, f"http://127.0.0.1:{server.server_port}", "the test server")  # returns
        finally:
            server.shutdown()
    finally:
        silent.kill()
        silent.wait()


def test_floor_columns_only_where_the_task_has_trivial_rules():
    from stabray.spec import load_spec
    from stabray.tune.summary import view_columns, with_floors

    assert with_floors(["val_acc", "best_val_acc", "test_acc", "test_acc_n7", "val_eaf"]) == [
        "val_acc",
        "best_val_acc",
        "trivial_val_acc",
        "test_acc",
        "trivial_test_acc",
        "test_acc_n7",
        "trivial_test_acc_n7",
        "val_eaf",
    ]
    icl, _ = load_spec("icl_linear", {})  # no trivial rules: no empty floor columns
    assert not [c for c in view_columns(icl) if "trivial_" in c]
    lego, _ = load_spec("lego_cyclic", {})
    assert "metrics.trivial_test_acc_n4" in view_columns(lego)


def test_the_runs_view_puts_a_minimized_objective_lowest_first(tmp_path):
    """A sweep whose primary objective is minimized (the EAF) opens its runs table lowest first."""
    from mlflow import MlflowClient

    from stabray.spec import load_spec
    from stabray.tracking import Store
    from stabray.tune.summary import view_columns, view_order

    spec, _ = load_spec(
        "dijkstra",
        {"search.metrics": ["val_eaf", "val_acc"], "search.modes": ["min", "max"], "search.scheduler": "fifo"},
    )
    assert view_order(spec) == ("metrics.val_eaf", True)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    store = Store(uri, "dijkstra")
    store.set_runs_view(view_columns(spec), *view_order(spec))
    view = json.loads(MlflowClient(uri).get_experiment_by_name("dijkstra").tags["mlflow.sharedViewState.stabray"])
    assert view["orderByKey"] == "metrics.`val_eaf`" and view["orderByAsc"] is True
