"""What a resume needs: results in a local folder or S3 (a moto server on 127.0.0.1), an Optuna study
that survives the loss of every local file through Ray Tune's searcher checkpoint, a concurrency limit
that remembers its running trials, and MLflow runs of trials Ray lost with a killed driver."""

import pickle
import shutil
from pathlib import Path

import pytest

from stabray.errors import UserError
from stabray.tune.storage import INFO_FILE, open_storage


def test_s3_storage_finds_the_latest_run_and_round_trips_json(s3, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    st = open_storage(f"s3://{s3.bucket}/runs/")
    assert st.remote and st.uri == f"s3://{s3.bucket}/runs"
    assert st.latest_run("sw") is None  # nothing there yet: an empty prefix is not an error
    for run, n in (("sw-20260101-000000", 1), ("sw-20260102-000000", 2), ("sw2-20270101-000000", 3)):
        st.write_json(f"{run}/{INFO_FILE}", {"n": n})
    assert st.runs("sw") == ["sw-20260101-000000", "sw-20260102-000000"]  # not sw2's
    assert st.latest_run("sw") == "sw-20260102-000000"
    assert st.read_json(f"sw-20260102-000000/{INFO_FILE}") == {"n": 2}
    assert st.exists(f"sw-20260101-000000/{INFO_FILE}") and not st.exists("sw-20260101-000000/tuner.pkl")
    keys = [o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="runs/")["Contents"]]
    assert f"runs/sw-20260102-000000/{INFO_FILE}" in keys  # really in the bucket
    assert st.run_uri("sw-20260102-000000") == f"s3://{s3.bucket}/runs/sw-20260102-000000"
    assert st.local_dir("sw-20260102-000000") == tmp_path / "stabray_runs" / "sw-20260102-000000"
    assert not (tmp_path / "stabray_runs").exists()  # nothing written locally


def test_local_storage_is_the_folder(tmp_path):
    st = open_storage(str(tmp_path / "runs"))
    assert not st.remote and st.uri == str(tmp_path / "runs")
    st.write_json(f"a-20260101-000000/{INFO_FILE}", {"x": 1})
    assert (tmp_path / "runs" / "a-20260101-000000" / INFO_FILE).exists()
    assert st.latest_run("a") == "a-20260101-000000"
    assert st.local_dir("a-20260101-000000") == tmp_path / "runs" / "a-20260101-000000"
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match="a file, not a directory"):
        open_storage(str(tmp_path / "f"))


def test_missing_bucket_fails_before_anything_starts(s3):
    with pytest.raises(UserError, match="there is no bucket 'no-such-bucket-21'"):
        open_storage("s3://no-such-bucket-21/runs")


def make_searcher(db, n_startup_trials: int = 10):
    import optuna
    from ray import tune

    from stabray.tune.search import DurableOptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=n_startup_trials)
    s = DurableOptunaSearch(db=db, metric="val_acc", mode="max", sampler=sampler, study_name="sweep-1")
    space = {"train": {"lr": tune.loguniform(1e-4, 1e-2)}, "method": {"bits": tune.choice([2, 4, 32])}}
    return s, space


def run_trials(s, space, ids, done):
    """Suggest `ids`; report one epoch each; complete those in `done` (val_acc = 0.1 * index)."""
    configs = {}
    for i, tid in enumerate(ids):
        configs[tid] = s.suggest(tid)
        s.on_trial_result(tid, {"val_acc": 0.05 * i, "training_iteration": 1})
        if tid in done:
            s.on_trial_complete(tid, {"val_acc": 0.1 * i, "training_iteration": 2})
    return configs


def restored(db, space, ckpt):
    """What Tuner.restore does with a searcher: unpickle it from the Tuner's pickle (made before the
    sweep ran), set the search space, then restore the searcher checkpoint."""
    s, _ = make_searcher(db)
    s = pickle.loads(pickle.dumps(s))
    s.set_search_properties("val_acc", "max", space)
    s.restore(str(ckpt))
    return s


def study_rows(study):
    return [(t.number, t.state.name, t.value, t.params) for t in study.get_trials(deepcopy=False)]


def test_optuna_study_survives_losing_its_sqlite_file(tmp_path):
    """The checkpoint (which Ray Tune keeps in the storage) rebuilds the study when every local file is gone."""
    db = tmp_path / "local" / "sweep-1" / "optuna.db"
    s, space = make_searcher(db)
    s.set_search_properties("val_acc", "max", space)
    configs = run_trials(s, space, ["t0", "t1", "t2"], done={"t0", "t1"})
    before = study_rows(s._ot_study)
    ckpt = tmp_path / "storage" / "searcher-state.pkl"
    ckpt.parent.mkdir()
    s.save(str(ckpt))
    shutil.rmtree(tmp_path / "local")  # the driver's disk is gone

    r = restored(db, space, ckpt)
    assert db.exists()  # the working copy is back, for optuna-dashboard
    assert study_rows(r._ot_study) == before  # same trials, states, values and params
    assert [t.state.name for t in r._ot_study.trials] == ["COMPLETE", "COMPLETE", "RUNNING"]
    # the running trial continues and completes; the sampler goes on with the study's history
    r.on_trial_result("t2", {"val_acc": 0.3, "training_iteration": 2})
    r.on_trial_complete("t2", {"val_acc": 0.4, "training_iteration": 3})
    new = r.suggest("t3")
    assert new["method"]["bits"] in (2, 4, 32) and new not in configs.values()
    rows = study_rows(r._ot_study)
    assert [(n, state, v) for n, state, v, _ in rows] == [
        (0, "COMPLETE", 0.0),
        (1, "COMPLETE", 0.1),
        (2, "COMPLETE", 0.4),
        (3, "RUNNING", None),
    ]
    assert r._ot_study.trials[2].intermediate_values == {1: 0.1, 2: 0.3}


def test_restored_searcher_suggests_what_an_uninterrupted_one_does(tmp_path):
    """TPE past its random start-up trials suggests from the study's history: a searcher restored from
    its checkpoint alone (every local file gone) goes on to suggest the same four configurations as
    one that was never interrupted. The control: the same restore with one result changed suggests
    other ones, so the comparison sees the history."""

    def sweep(db, ckpt=None):
        s, space = make_searcher(db, n_startup_trials=2)
        s.set_search_properties("val_acc", "max", space)
        run_trials(s, space, ["t0", "t1", "t2"], done={"t0", "t1"})
        if ckpt is None:
            return s
        s.save(str(ckpt))
        shutil.rmtree(Path(db).parent)  # the driver's disk is gone
        return restored(db, space, ckpt)

    def go_on(s, last: float):
        s.on_trial_result("t2", {"val_acc": 0.3, "training_iteration": 2})
        s.on_trial_complete("t2", {"val_acc": last, "training_iteration": 3})
        return [s.suggest(f"t{k}") for k in range(3, 7)]

    straight = go_on(sweep(tmp_path / "u" / "optuna.db"), 0.4)
    ckpt = tmp_path / "searcher-state.pkl"
    assert go_on(sweep(tmp_path / "r" / "optuna.db", ckpt), 0.4) == straight
    other = go_on(sweep(tmp_path / "c" / "optuna.db", ckpt), -1.0)
    assert all(a != b for a, b in zip(other, straight))


def test_optuna_study_keeps_a_newer_sqlite_file_and_fails_its_orphans(tmp_path):
    """Local resume: the sqlite file is further along than the checkpoint (a trial started after Ray's
    last experiment checkpoint); it is kept, and that trial, which no one will finish, is FAIL."""
    db = tmp_path / "run" / "optuna.db"
    s, space = make_searcher(db)
    s.set_search_properties("val_acc", "max", space)
    run_trials(s, space, ["t0", "t1"], done={"t0"})
    ckpt = tmp_path / "searcher-state.pkl"
    s.save(str(ckpt))
    run_trials(s, space, ["t2"], done=set())  # after the checkpoint, then the driver dies
    r = restored(db, space, ckpt)
    assert [t.state.name for t in r._ot_study.trials] == ["COMPLETE", "RUNNING", "FAIL"]
    r.on_trial_complete("t1", {"val_acc": 0.7, "training_iteration": 2})
    assert r._ot_study.trials[1].value == 0.7


def test_limiter_checkpoint_keeps_the_running_trials(tmp_path):
    """After a restore the trials that were running still count against max_concurrent, and their
    completion reaches Optuna (Ray's ConcurrencyLimiter saves neither)."""
    from stabray.tune.search import DurableLimiter

    s, space = make_searcher(tmp_path / "run" / "optuna.db")
    lim = DurableLimiter(s, max_concurrent=2)
    before_fit = pickle.dumps(lim)
    lim.set_search_properties("val_acc", "max", space)
    assert lim.suggest("t0") and lim.suggest("t1")
    assert lim.suggest("t2") is None  # two running: the limit
    ckpt = tmp_path / "searcher-state.pkl"
    lim.save(str(ckpt))
    shutil.rmtree(tmp_path / "run")

    r = pickle.loads(before_fit)
    r.set_search_properties("val_acc", "max", space)
    r.restore(str(ckpt))
    assert r.suggest("t2") is None  # t0 and t1 are still running
    r.on_trial_complete("t0", {"val_acc": 0.9, "training_iteration": 1})
    trial0 = r.searcher._ot_study.trials[0]
    assert (trial0.state.name, trial0.value) == ("COMPLETE", 0.9)
    assert r.suggest("t2") is not None


def test_runs_of_trials_ray_lost_are_marked_and_left_out(tmp_path):
    """A driver killed after a trial's run was created but before Ray saved the trial: on resume Ray
    does not know that trial, so its still-RUNNING run is ended KILLED, renamed, tagged lost, and left
    out of the sweep's trials; the runs of the trials Ray restored are untouched."""
    from types import SimpleNamespace

    from stabray.tracking import Store
    from stabray.tune.callbacks import MLflowTuneCallback

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    store = Store(uri, "lost")
    parent = store.start_parent("lost", "lost-1", {})
    cfg = {"task": {"name": "dijkstra"}, "method": {"name": "alg1"}}
    ids = {t: store.start_child(parent, t, f"run-{t}", {"lr": 0.001}, {}, cfg) for t in ("kept", "done", "gone")}
    store.end(ids["done"], "FINISHED")
    cb = pickle.loads(pickle.dumps(MLflowTuneCallback(uri, "lost", parent)))  # as Tuner.restore gets it
    cb.on_step_begin(0, [SimpleNamespace(trial_id="kept"), SimpleNamespace(trial_id="done")])
    cb.on_step_begin(1, [])  # only once per session: later steps change nothing
    runs = {t: store.client.get_run(r) for t, r in ids.items()}
    assert [runs[t].info.status for t in ("kept", "done", "gone")] == ["RUNNING", "FINISHED", "KILLED"]
    assert runs["gone"].data.tags["stabray.lost"] == "true" and runs["gone"].info.run_name == "run-gone (lost)"
    assert "stabray.lost" not in runs["kept"].data.tags
    records, _ = store.trial_records(stability=False, parents={parent})
    assert sorted(r.trial_id for r in records) == ["done", "kept"]


def _ray_state(folder, trials=1, session="2026-01-01_00-00-00"):
    """A run folder as Ray Tune leaves it: its experiment state (JSON), searcher and callback state
    (pickles), tuner.pkl, and a trial's folder."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    state = {"trial_data": [["{}", "{}"]] * trials, "runner_data": {}, "stats": {}}
    (folder / f"experiment_state-{session}.json").write_text(json.dumps(state))
    (folder / f"basic-variant-state-{session}.json").write_bytes(pickle.dumps({"counter": 1}))
    (folder / f"callback-states-{session}.pkl").write_bytes(pickle.dumps([{"runs": {}}]))
    (folder / "tuner.pkl").write_bytes(pickle.dumps({"x": 1}))
    (folder / "trial_a_00000").mkdir(exist_ok=True)


@pytest.mark.parametrize(
    "cut, found",
    [
        ("experiment_state-2026-01-01_00-00-00.json", ": it is not whole JSON"),
        ("basic-variant-state-2026-01-01_00-00-00.json", r" \(searcher state\): it is not a whole pickle"),
        ("callback-states-2026-01-01_00-00-00.pkl", r" \(callback state\): it is not a whole pickle"),
    ],
)
def test_ray_state_cut_short_by_a_killed_driver_is_found_and_set_aside(tmp_path, cut, found):
    """Ray Tune copies its state files into the run folder without write-then-rename, so a SIGKILL can
    leave one cut short; Ray's restore would then start the experiment again with an empty config.
    `damage` names the file (the newest of its kind, as Ray picks it), without unpickling anything, and
    `set_aside` moves every state file (all sessions', and tuner.pkl) and the Optuna study out of Ray's
    way, leaving the trials' folders."""
    import re

    from stabray.tune import ray_state

    st = open_storage(str(tmp_path / "runs"))
    run = tmp_path / "runs" / "sw-20260101-000000"
    _ray_state(run, session="2025-12-31_00-00-00")  # an earlier session's state: older, intact
    _ray_state(run)
    (run / "optuna.db").write_bytes(b"study")
    assert ray_state.damage(st, run.name) is None  # whole: Ray can restore it
    data = (run / cut).read_bytes()
    (run / cut).write_bytes(data[: len(data) // 2])
    assert re.match(re.escape(cut) + found, ray_state.damage(st, run.name))
    (run / cut).write_bytes(b"")
    assert ray_state.damage(st, run.name).endswith("it is empty")
    names = sorted(p.name for p in run.iterdir())
    aside = ray_state.set_aside(st, run.name)
    assert aside.startswith(f"{run.name}/damaged-state-")
    moved = sorted(p.name for p in (tmp_path / "runs" / aside).iterdir())
    assert moved == sorted(n for n in names if n != "trial_a_00000")  # 7 files, none lost
    assert sorted(p.name for p in run.iterdir()) == sorted(["trial_a_00000", aside.rsplit("/", 1)[1]])


def test_ray_state_in_s3_is_read_and_set_aside_in_the_bucket(s3, tmp_path, monkeypatch):
    """The same check on an object store, where --resume reads Ray's state from the bucket alone: the
    cut file is named, and setting aside moves the objects within the bucket (copy, then delete)."""
    from stabray.tune import ray_state

    monkeypatch.chdir(tmp_path)
    _ray_state(tmp_path / "local")
    st = open_storage(f"s3://{s3.bucket}/runs")
    run = "sw-20260101-000000"
    for f in (tmp_path / "local").iterdir():
        if f.is_file():
            s3.client.put_object(Bucket=s3.bucket, Key=f"runs/{run}/{f.name}", Body=f.read_bytes())
    s3.client.put_object(Bucket=s3.bucket, Key=f"runs/{run}/trial_a_00000/result.json", Body=b"{}")
    assert ray_state.damage(st, run) is None
    name = "callback-states-2026-01-01_00-00-00.pkl"
    s3.client.put_object(Bucket=s3.bucket, Key=f"runs/{run}/{name}", Body=b"\x80\x05")
    assert ray_state.damage(st, run).startswith(f"{name} (callback state): it is not a whole pickle")
    aside = ray_state.set_aside(st, run)
    keys = {o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="runs/")["Contents"]}
    assert f"runs/{aside}/{name}" in keys and f"runs/{aside}/tuner.pkl" in keys
    left = {k for k in keys if not k.startswith(f"runs/{aside}/") and not k.endswith("/")}  # (pyarrow's folder markers)
    assert left == {f"runs/{run}/trial_a_00000/result.json"}


def test_ray_state_without_a_trial_or_an_experiment_state_is_damage(tmp_path):
    """Ray's restore fails on both (no state file; `trials[0]` of an empty list), and would restart; a
    tuner.pkl cut short would make `Tuner.restore` itself raise."""
    from stabray.tune import ray_state

    st = open_storage(str(tmp_path))
    _ray_state(tmp_path / "a", trials=0)
    assert ray_state.damage(st, "a") == "experiment_state-2026-01-01_00-00-00.json: it names no trial"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "tuner.pkl").write_bytes(pickle.dumps({}))
    assert ray_state.damage(st, "b") == "Ray Tune saved no experiment state there"
    (tmp_path / "b" / "tuner.pkl").write_bytes(pickle.dumps({"x": 1})[:-1])  # no STOP: Tuner.restore would raise
    assert ray_state.damage(st, "b").startswith("tuner.pkl: it is not a whole pickle")


def test_a_restarted_sweep_marks_every_earlier_trial_run_lost_once(tmp_path):
    """When the sweep starts its trials again, the runs already under the parent (RUNNING or ended)
    belong to trials nobody will resume: each is tagged lost with the reason, and keeps its status once
    ended. The flag is not pickled, so a later --resume of this Tuner keeps the runs of its own trials."""
    from types import SimpleNamespace

    from stabray.tracking import Store
    from stabray.tune.callbacks import MLflowTuneCallback

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    store = Store(uri, "re")
    parent = store.start_parent("re", "re-1", {})
    cfg = {"task": {"name": "dijkstra"}, "method": {"name": "alg1"}}
    ids = {t: store.start_child(parent, t, f"run-{t}", {"lr": 0.001}, {}, cfg) for t in ("running", "done")}
    store.end(ids["done"], "FINISHED")
    cb = MLflowTuneCallback(uri, "re", parent, restarted="the state was cut short")
    assert pickle.loads(pickle.dumps(cb)).restarted is None
    cb.on_step_begin(0, [SimpleNamespace(trial_id="new")])
    runs = {t: store.client.get_run(r) for t, r in ids.items()}
    assert [runs[t].info.status for t in ("running", "done")] == ["KILLED", "FINISHED"]
    for r in runs.values():
        assert r.data.tags["stabray.lost"] == "true" and r.info.run_name.endswith(" (lost)")
        assert "the state was cut short" in r.data.tags["mlflow.note.content"]
    assert store.trial_children(parent) == {}


def test_a_tracking_server_that_never_answers_is_unreachable_within_the_timeout():
    """A server that accepts the connection and then says nothing (a hung MLflow, a wrong port
    behind a proxy): a UserError naming the URI after REACH_TIMEOUT_S, not MLflow's minutes of retries."""
    import socket

    from stabray.tracking import check_store

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)  # the kernel completes the handshake; nobody ever reads or writes
    uri = f"http://127.0.0.1:{srv.getsockname()[1]}"
    try:
        with pytest.raises(UserError, match=f"cannot reach the MLflow tracking server at {uri} .*timed out"):
            check_store(uri, create=True)
    finally:
        srv.close()


def test_runs_of_a_sweep_are_only_its_own_run_folders(tmp_path):
    """`--resume dijkstra` must not pick the run of a sweep named `dijkstra-2x` (whose folder also starts
    with `dijkstra-2`), nor a folder that only looks like a run."""
    from stabray.record import is_run_folder, run_folder

    st = open_storage(str(tmp_path))
    for name in (
        "dijkstra-20260101-000000",
        "dijkstra-2x-20270101-000000",
        "dijkstra-2026",
        "dijkstra-20260102-000000",
    ):
        (tmp_path / name).mkdir()
    assert st.runs("dijkstra") == ["dijkstra-20260101-000000", "dijkstra-20260102-000000"]
    assert st.runs("dijkstra-2x") == ["dijkstra-2x-20270101-000000"]
    made = run_folder("dijkstra", 0.0)
    assert is_run_folder(made, "dijkstra") and not is_run_folder(made, "dijkstra-2")
    assert is_run_folder(made) and not is_run_folder("dijkstra")


@pytest.mark.parametrize("quiet", [True, False])
def test_a_list_valued_choice_is_stored_and_read_back_quietly(tmp_path, monkeypatch, quiet):
    """A choice among lists (position_eval_stride [2, 3, 4], long_sizes) goes through the sqlite study and
    comes back as the list it was; Optuna's warning about non-scalar choices stays off the console, and
    without stabray's filter (quiet=False, the control) it would be there."""
    import warnings

    import optuna
    from ray import tune

    from stabray.tune import search

    if not quiet:
        monkeypatch.setattr(search, "quiet_list_choices", lambda: None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # every warning shown; the searcher's filter goes in front of it
        s, _ = make_searcher(tmp_path / "optuna.db")
        s.set_search_properties("val_acc", "max", {"model": {"position_eval_stride": tune.choice([3, [2, 3, 4]])}})
        got = [s.suggest(f"t{i}")["model"]["position_eval_stride"] for i in range(6)]
        for i in range(6):
            s.on_trial_complete(f"t{i}", {"val_acc": 0.1 * i, "training_iteration": 1})
        back = optuna.load_study(study_name="sweep-1", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
        stored = [t.params["model/position_eval_stride"] for t in back.get_trials(deepcopy=False)]
    assert all(g in (3, [2, 3, 4]) for g in got) and [2, 3, 4] in got
    assert bool([w for w in seen if "categorical distribution" in str(w.message)]) is not quiet
    assert stored == got  # read back from the sqlite study as the lists they were
