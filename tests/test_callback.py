"""The MLflow callback without Ray: what a trial's run holds after its start, results and end, and
that the closing figure plots exactly what MLflow holds (read back from memory for a run this driver
created, from MLflow for one it restored)."""

import json
import math
import pickle
from types import SimpleNamespace

from stabray.tracking import Store
from stabray.tracking.store import NOTE
from stabray.tune import plots
from stabray.tune.callbacks import CURVES, MLflowTuneCallback

CONFIG = {
    "task": {"name": "dijkstra", "params": {"n_nodes": 4}},
    "method": {"name": "alg1", "params": {"lam": 0.5, "bits": 4}},
    "train": {"epochs": 3, "lr": 0.003},
    "seed": 0,
}
# per epoch: a NaN and both infinities among the curves (MLflow keeps NaN, stores +-inf as +-float max)
RESULTS = [
    {"train_loss": 1.5, "val_acc": 0.25, "val_eaf": 2.0, "epoch": 1},
    {"train_loss": math.inf, "val_acc": math.nan, "val_eaf": 3.5, "epoch": 2},
    {"train_loss": 0.5, "val_acc": 0.75, "val_eaf": -math.inf, "epoch": 3, "test_acc": 0.7, "best_val_acc": 0.75},
]


def same(a, b) -> bool:
    """Equal curves, NaN equal to NaN."""
    return a.keys() == b.keys() and all(
        len(a[k]) == len(b[k])
        and all(s == t and (x == y or (math.isnan(x) and math.isnan(y))) for (s, x), (t, y) in zip(a[k], b[k]))
        for k in a
    )


def run_trial(cb, trial, results):
    cb.on_trial_start(0, [trial], trial)
    for i, r in enumerate(results, 1):
        cb.on_trial_result(0, [trial], trial, {**r, "training_iteration": r["epoch"]})
        if i == 2:  # a restarted trial re-reporting an epoch already logged: not logged twice
            cb.on_trial_result(0, [trial], trial, {**results[0], "training_iteration": 1})
    trial.last_result = {**results[-1], "training_iteration": len(results)}
    cb.on_trial_complete(0, [trial], trial)


def test_trial_run_and_closing_figure(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    store = Store(uri, "cb")
    parent = store.start_parent("cb", "cb-run", {})
    drawn = []
    monkeypatch.setattr(plots, "trial_curves", lambda hist, title="": drawn.append((title, hist)))
    cb = MLflowTuneCallback(uri, "cb", parent, ["method.params.lam"])
    trial = SimpleNamespace(trial_id="t1", config=CONFIG, last_result=None)
    run_trial(cb, trial, RESULTS)
    rid = cb.runs["t1"]
    logged = {k: store.history(rid, k) for k in CURVES}
    assert [s for s, _ in logged["train_loss"]] == [1, 2, 3]  # the re-reported epoch 1 was skipped
    assert logged["train_loss"][1][1] == math.copysign(1.7976931348623157e308, 1.0)  # how MLflow keeps inf
    ((title, hist),) = drawn
    assert title == "alg1-lam0.5-s0" and same(hist, logged)
    run = store.client.get_run(rid)
    assert run.info.status == "FINISHED"
    assert run.data.tags["stabray.task"] == "dijkstra" and run.data.tags["stabray.method"] == "alg1"
    note = run.data.tags[NOTE]
    assert note.startswith("One trial of the sweep **cb**: alg1 on dijkstra with lam = 0.5.")
    assert "**Finished** all 3 epochs." in note and "test_acc 0.700" in note
    assert run.data.params["lam"] == "0.5"

    # A trial begun by one driver, which then stopped (its runs ended KILLED); a driver restored from
    # Ray's pickle has no memory of its earlier epochs: it reopens the run and reads MLflow back.
    t2 = SimpleNamespace(trial_id="t2", config={**CONFIG, "seed": 1}, last_result=None)
    cb.on_trial_start(0, [t2], t2)
    for r in RESULTS[:2]:
        cb.on_trial_result(0, [t2], t2, {**r, "training_iteration": r["epoch"]})
    store.end(cb.runs["t2"], "KILLED")
    restored = pickle.loads(pickle.dumps(cb))
    assert restored.fresh == set() and restored.curves == {} and restored.runs == cb.runs
    drawn.clear()
    restored.on_trial_start(0, [t2], t2)
    assert store.status(cb.runs["t2"]) == "RUNNING"
    for r in RESULTS[1:]:  # epoch 2 again (from the checkpoint of epoch 1): skipped, then epoch 3
        restored.on_trial_result(0, [t2], t2, {**r, "training_iteration": r["epoch"]})
    t2.last_result = {**RESULTS[2], "training_iteration": 3}
    restored.on_trial_complete(0, [t2], t2)
    ((_, hist),) = drawn
    logged = {k: store.history(cb.runs["t2"], k) for k in CURVES}
    assert [s for s, _ in logged["val_eaf"]] == [1, 2, 3] and same(hist, logged)
    assert store.status(cb.runs["t2"]) == "FINISHED"


def test_first_result_after_a_start_sets_the_kernel_tags(tmp_path):
    """The trainable's first result after each start or restore names torch and its kernel path: the
    run keeps them as tags, a restore on another path overwrites them and starts stabray.kernels_history
    (which epochs each path computed), and neither is logged as a metric."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    store = Store(uri, "cb")
    parent = store.start_parent("cb", "cb-run", {})
    cb = MLflowTuneCallback(uri, "cb", parent, [])
    trial = SimpleNamespace(trial_id="t1", config=CONFIG, last_result=None)
    cb.on_trial_start(0, [trial], trial)
    first = {**RESULTS[0], "training_iteration": 1, "torch": "2.13.0+cpu", "kernels": "cpu AVX512, X, 1 thread"}
    cb.on_trial_result(0, [trial], trial, first)
    cb.on_trial_result(0, [trial], trial, {**RESULTS[1], "training_iteration": 2})
    rid = cb.runs["t1"]
    tags = store.client.get_run(rid).data.tags
    assert tags["stabray.torch"] == "2.13.0+cpu" and tags["stabray.kernels"] == "cpu AVX512, X, 1 thread"
    cb.on_trial_result(0, [trial], trial, {**RESULTS[1], "training_iteration": 2, "kernels": "cpu AVX2, Y, 1 thread"})
    run = store.client.get_run(rid)
    assert run.data.tags["stabray.kernels"] == "cpu AVX2, Y, 1 thread"  # restored elsewhere: the newest path
    assert (
        run.data.tags["stabray.kernels_history"]
        == "1: 2.13.0+cpu, cpu AVX512, X, 1 thread; 2: 2.13.0+cpu, cpu AVX2, Y, 1 thread"
    )
    cb.on_trial_result(0, [trial], trial, {**RESULTS[1], "training_iteration": 3, "kernels": "cpu AVX2, Y, 1 thread"})
    cb.on_trial_result(0, [trial], trial, {**RESULTS[1], "training_iteration": 4, "kernels": "cpu AVX512, X, 1 thread"})
    history = store.client.get_run(rid).data.tags["stabray.kernels_history"]  # the same path again adds nothing
    assert history.split("; ")[1:] == ["2: 2.13.0+cpu, cpu AVX2, Y, 1 thread", "4: 2.13.0+cpu, cpu AVX512, X, 1 thread"]
    assert not {"torch", "kernels"} & set(run.data.metrics)


def test_a_sqlite_stores_artifacts_sit_beside_its_database_not_in_the_working_directory(tmp_path, monkeypatch):
    """MLflow's default artifact root is ./mlruns of whichever process creates the experiment: a
    sweep started in another folder would leave its artifacts there. stabray puts them beside the
    database (`mlruns/<experiment>`), whatever the working directory."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    db = tmp_path / "study" / "mlflow.db"
    db.parent.mkdir()
    store = Store(f"sqlite:///{db}", "my sweep/1")
    parent = store.start_parent("my sweep/1", "run", {})
    rid = store.start_child(parent, "t1", run_name="t1", params={}, tags={}, config=CONFIG)
    stored = tmp_path / "study" / "mlruns" / "my_sweep_1" / rid / "artifacts" / "trial_config.json"
    assert stored.is_file() and json.loads(stored.read_text())["task"]["name"] == "dijkstra"
    assert list(elsewhere.iterdir()) == []  # no ./mlruns
    from stabray.tracking.store import artifact_location

    for name, folder in (("..", "_"), (".", "_"), ("/", "_"), ("a..b", "a..b"), ("x y", "x_y")):
        assert artifact_location(f"sqlite:///{db}", name) == (db.parent / "mlruns" / folder).as_uri()
    assert artifact_location("http://127.0.0.1:5000", "x") is None  # a server's own default
