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
# and where the wrong validation chains go off (val_departure_tok<k>: a family, not in CURVES by name)
RESULTS = [
    {"train_loss": 1.5, "val_acc": 0.25, "val_eaf": 2.0, "epoch": 1, "val_departure_tok0": 0.5,
     "val_departure_tok1": 0.25},
    {"train_loss": math.inf, "val_acc": math.nan, "val_eaf": 3.5, "epoch": 2, "val_departure_tok0": 0.25,
     "val_departure_tok1": 0.25},
    {"train_loss": 0.5, "val_acc": 0.75, "val_eaf": -math.inf, "epoch": 3, "test_acc": 0.7, "best_val_acc": 0.75,
     "val_departure_tok0": 0.0, "val_departure_tok1": 0.25, "test_departure_tok0": 0.3},
]  # fmt: skip
DRAWN = (*CURVES, "val_departure_tok0", "val_departure_tok1")  # what the closing figure plots


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
    logged = {k: store.history(rid, k) for k in DRAWN}
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
    logged = {k: store.history(cb.runs["t2"], k) for k in DRAWN}
    assert [s for s, _ in logged["val_eaf"]] == [1, 2, 3] and same(hist, logged)
    assert [v for _, v in logged["val_departure_tok0"]] == [0.5, 0.25, 0.0]
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


def test_closing_figure_stacks_the_departures_in_one_panel():
    """The val_departure_tok<k> share one stacked panel after the per-metric ones: its layers are the
    shares by token and its top edge their sum (1 - steps_val_acc), an epoch missing a token's point
    counting 0 for it."""
    import numpy as np

    hist = {
        "train_loss": [(1, 2.0), (2, 1.0), (3, 0.5)],
        "steps_val_acc": [(1, 0.25), (2, 0.5), (3, 0.75)],
        "val_departure_tok1": [(1, 0.25), (2, 0.25), (3, 0.25)],
        "val_departure_tok0": [(1, 0.5), (2, 0.25)],
        "val_eaf": [],
    }
    fig = plots.trial_curves(hist, "t")
    try:
        axes = fig.get_axes()
        assert [ax.get_title() for ax in axes] == ["train_loss", "steps_val_acc", "val_departure_tok<k> (stacked)"]
        layers = axes[-1].collections
        assert [c.get_label() for c in layers] == ["token 0", "token 1"]
        top = layers[-1].get_paths()[0].vertices
        tops = {e: max(y for x, y in top if np.isclose(x, e)) for e in (1, 2, 3)}  # the last layer's upper edge
        want = {1: 0.75, 2: 0.5, 3: 0.25}
        assert all(np.isclose(tops[e], v) for e, v in want.items())
        assert [1 - v for _, v in hist["steps_val_acc"]] == list(want.values())
    finally:
        plots.close(fig)
    assert plots.trial_curves({"val_departure_tok0": []}) is None
