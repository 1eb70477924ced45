"""An interrupted sweep, without running one: the signal handler's logic (forward the first SIGINT /
SIGTERM to Ray Tune as SIGUSR1 once Ray Tune listens, stop at once on a second one or before Ray
Tune listens), the MLflow statuses an interrupt leaves (KILLED) and `--resume` reopens, the exact
resume command, and metrics that are NaN or infinite kept rather than dropped. The end-to-end
check (a real sweep interrupted, then resumed) is tests/test_faults.py."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import threading

import pytest
import yaml

from stabray.tune.interrupt import GracefulStop


@pytest.fixture
def ray_tune_listening():
    """What Ray Tune's fit() installs: a SIGUSR1 handler that ends the run (here: records it)."""
    got = []
    return got, lambda signum, frame: got.append(signum)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_first_signal_asks_ray_tune_to_stop_second_stops_now(sig, ray_tune_listening):
    got, ray_handler = ray_tune_listening
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    env_before = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    with GracefulStop() as stop:
        assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1"  # Ray Tune leaves SIGINT to us
        with stop.in_fit():
            signal.signal(signal.SIGUSR1, ray_handler)  # fit() has started listening
            signal.raise_signal(sig)
            assert got == [signal.SIGUSR1] and stop.signal == sig and stop.name == sig.name
            with pytest.raises(KeyboardInterrupt):  # a second one: no more waiting
                signal.raise_signal(signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before
    assert os.environ.get("TUNE_DISABLE_SIGINT_HANDLER") == env_before


def test_signal_before_ray_tune_listens_stops_at_once():
    with GracefulStop() as stop:
        with stop.in_fit():  # fit() is still setting up: SIGUSR1 would kill the driver
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGTERM)
        assert stop.signal == signal.SIGTERM
    with GracefulStop() as stop:  # outside fit() (Ray starting, the summary): the same
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)


def test_install_takes_sigterm_back(ray_tune_listening):
    """ray.init replaces the SIGTERM handler with one that aborts the driver; install() undoes that."""
    got, ray_handler = ray_tune_listening
    with GracefulStop() as stop:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as ray.init does, at the C level
        stop.install()
        with stop.in_fit():
            signal.signal(signal.SIGUSR1, ray_handler)
            signal.raise_signal(signal.SIGTERM)
        assert got == [signal.SIGUSR1] and stop.signal == signal.SIGTERM


def test_resume_command_repeats_every_flag():
    from stabray.commands.sweep import resume_command

    args = argparse.Namespace(
        spec="my spec.yaml",
        method="alg1",
        num_samples=4,
        tracking_uri=None,
        storage="/r",
        address="local",
        set=["train.epochs=2", "search.space.lr={choice: [0.001]}"],
        verbose=True,
    )
    assert resume_command(args) == (
        "python -m stabray sweep 'my spec.yaml' --method alg1 --num-samples 4 --storage /r --address local "
        "--set train.epochs=2 --set 'search.space.lr={choice: [0.001]}' --verbose --resume"
    )


@pytest.fixture
def store(tmp_path):
    from stabray.tracking import Store

    return Store(f"sqlite:///{tmp_path}/m.db", "x")


def test_kill_running_marks_the_sweep_and_its_running_trials(store):
    parent = store.start_parent("x", "x-1", {})
    group = store.start_group(parent, "alg1")
    running = [store.start_child(p, f"t{i}", f"t{i}", {"lr": 1}, {}, {}) for i, p in enumerate((parent, group))]
    done = store.start_child(parent, "t9", "t9", {"lr": 1}, {}, {})
    store.end(done, "FINISHED")
    other = store.start_parent("y", "y-1", {})  # another sweep's run: untouched
    killed = store.kill_running({parent, group})
    assert set(killed) == {parent, group, *running}
    assert [store.status(r) for r in (parent, group, *running)] == ["KILLED"] * 4
    assert store.status(done) == "FINISHED" and store.status(other) == "RUNNING"
    records, _ = store.trial_records(stability=False)
    assert sorted(r.status for r in records) == ["FINISHED", "KILLED", "KILLED"]
    for r in (parent, running[0], done):  # --resume: what was KILLED runs again; nothing else changes
        store.reopen(r)
    assert [store.status(r) for r in (parent, running[0], done)] == ["RUNNING", "RUNNING", "FINISHED"]


def test_a_crashed_sweep_ends_failed_and_resume_reopens_it(store):
    from stabray.tune.sweep import end_failed

    parent = store.start_parent("x", "x-1", {})
    group = store.start_group(parent, "alg1")
    trial = store.start_child(group, "t0", "t0", {"lr": 1}, {}, {})
    done = store.start_child(group, "t1", "t1", {"lr": 1}, {}, {})
    store.end(done, "FINISHED")
    end_failed(store, {"parent_run_id": parent, "groups": {"alg1": group}})
    # the sweep's runs FAILED; its running trial KILLED (what --resume continues or marks lost)
    assert [store.status(r) for r in (parent, group, trial, done)] == ["FAILED", "FAILED", "KILLED", "FINISHED"]
    for r in (parent, group, trial):
        store.reopen(r)
    assert [store.status(r) for r in (parent, group, trial)] == ["RUNNING"] * 3
    end_failed(store, {"parent_run_id": "no-such-run", "groups": {}})  # a store error does not hide the first


def test_sweep_driver_crash_ends_the_parent_failed(tmp_path, monkeypatch):
    """An exception in the driver after the parent run exists (here: in place of Ray Tune's fit) ends
    the parent FAILED, not RUNNING for ever, and is raised as it was."""
    import ray

    from stabray.spec import load_spec
    from stabray.tracking import Store
    from stabray.tune import sweep

    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(
        yaml.safe_dump(
            {"name": "crash", "task": {"name": "dijkstra", "params": {"n_nodes": 4}}, "model": {"preset": "tiny"}}
        )
    )
    spec, path = load_spec(str(spec_path))

    def boom(*a, **k):
        raise RuntimeError("driver bug")

    monkeypatch.setattr(sweep, "_fit_all", boom)

    def no_prewarm(*a, **k):
        t = threading.Thread(target=lambda: None)
        t.start()
        return t

    monkeypatch.setattr(sweep, "prewarm", no_prewarm)
    uri = f"sqlite:///{tmp_path}/m.db"
    try:
        with pytest.raises(RuntimeError, match="driver bug"):
            sweep.run_sweep(spec, path, tracking_uri=uri, storage=str(tmp_path / "runs"), address="local")
    finally:
        ray.shutdown()
    (run,) = Store(uri, "crash").client.search_runs([Store(uri, "crash").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["stabray.role"] == "sweep"


def test_nan_and_inf_metrics_are_logged_not_dropped(store):
    parent = store.start_parent("x", "x-1", {})
    rid = store.start_child(parent, "t0", "t0", {"lr": 1}, {}, {})
    n = store.log_metrics(rid, {"val_eaf": math.nan, "test_loss_gap": math.inf, "val_acc": 0.5, "note": "text"}, step=1)
    assert n == 3  # the text is not a number; NaN and inf are results
    (rec,), _ = store.trial_records(stability=False)
    assert (
        math.isnan(rec.metrics["val_eaf"])
        and rec.metrics["test_loss_gap"] == math.inf
        and rec.metrics["val_acc"] == 0.5
    )


def test_outside_a_ray_worker_nothing_starts_ray():
    """assigned_cpus / placement used to call ray.get_runtime_context() inside a bare `except`,
    which starts a Ray instance in a plain process."""
    import ray

    from stabray.tune.report import assigned_cpus, placement

    if ray.is_initialized():
        ray.shutdown()
    assert assigned_cpus(default=3) == 3 and placement() == {}
    assert not ray.is_initialized()


def test_tracking_uris_resolve_as_mlflow_reads_them(tmp_path):
    """A bare path is a sqlite file (absolute, for Ray workers elsewhere); MLflow's own bare URIs and
    file: stores are left alone; a scheme MLflow has no store for is an error naming it."""
    from stabray.errors import UserError
    from stabray.tracking import check_store, resolve_tracking_uri

    assert resolve_tracking_uri("m.db", cwd=tmp_path) == f"sqlite:///{tmp_path / 'm.db'}"
    assert resolve_tracking_uri("/abs/m.db", cwd=tmp_path) == "sqlite:////abs/m.db"
    assert resolve_tracking_uri("sqlite:///m.db", cwd=tmp_path) == f"sqlite:///{tmp_path / 'm.db'}"
    for uri in ("databricks", "databricks-uc", "file:/tmp/mlruns", "http://h:5000", "postgresql+psycopg2://u@h/db"):
        assert resolve_tracking_uri(uri) == uri
    for uri in ("databricks", "file:/tmp/mlruns", "file:///tmp/mlruns", "postgresql+psycopg2://u@h/db", "MySQL://h/d"):
        check_store(uri, create=True)  # schemes MLflow has stores for (no server is asked: not http)
    with pytest.raises(UserError, match="no store for 'foo' URIs"):
        check_store(resolve_tracking_uri("foo://bar"), create=True)


def test_resume_dry_run_names_the_run_it_would_continue(tmp_path, monkeypatch, capsys):
    """`sweep --resume --dry-run` reads the run record as `--resume` does: it names the latest run
    folder of this sweep (not an older one, not another sweep's) and the store that record names."""
    from stabray.cli import main
    from stabray.tune.storage import INFO_FILE

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "sw", "task": {"name": "dijkstra"}}))
    record = {"experiment": "sw-exp", "parent_run_id": "p", "groups": {}}
    runs = [("sw-20260101-000000", "old.db"), ("sw-20260102-000000", "new.db"), ("sw-2x-20260103-000000", "x.db")]
    for run, db in runs:
        (tmp_path / "stabray_runs" / run).mkdir(parents=True)
        uri = f"sqlite:///{tmp_path / db}"
        (tmp_path / "stabray_runs" / run / INFO_FILE).write_text(json.dumps({**record, "tracking_uri": uri}))
    assert main(["sweep", "s.yaml", "--resume", "--dry-run"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (
        f"would continue {tmp_path / 'stabray_runs' / 'sw-20260102-000000'} "
        f"(MLflow experiment 'sw-exp' at sqlite:///{tmp_path / 'new.db'})"
    )
