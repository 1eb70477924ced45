"""Fault tolerance: a driver killed mid-sweep (SIGINT, SIGKILL) resumes to exactly N finished trials
with no duplicate MLflow runs; a trial whose loss becomes NaN is recorded as failed while the others
complete; a simulated multi-node cluster with fake GPUs spreads trials, honours their GPU request and
survives a lost node; and runs are found through a real MLflow server's REST API."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import free_port

SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"
ROOT = SWEEPS.parent


def spec_file(tmp_path, name="ft", **over):
    spec = {
        "include": str(SWEEPS / "_base.yaml"),
        "name": name,
        "task": {
            "name": "dijkstra",
            "params": {"n_nodes": 4, "decimals": 1},
            "train_size": 48,
            "val_size": 8,
            "test_size": 8,
            "resample_train": False,
        },
        "model": {"preset": "tiny"},
        "train": {"epochs": 3, "batch_size": 16, "warmup_steps": 1},
        "eval": {
            "eaf_examples": 2,
            "eaf_iters": 1,
            "decomposition_examples": 0,
            "long_splits": ["test_long"],
            "loss_gap": False,
        },
        "search": {
            "num_samples": 3,
            "max_concurrent": 1,
            "scheduler": "fifo",
            "searcher": "random",
            "space": {"lr": {"loguniform": [1.0e-3, 3.0e-3]}},
        },
        "device": "cpu",
    }
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def children(uri, experiment):
    from mlflow import MlflowClient

    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(experiment)
    runs = c.search_runs([exp.experiment_id], max_results=1000)
    return (
        [r for r in runs if r.data.tags.get("stabray.role") == "sweep"],
        [r for r in runs if r.data.tags.get("stabray.role") == "trial"],
    )


def env(tmp_path):
    e = dict(os.environ, STABRAY_CACHE=str(tmp_path / "cache"), RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1")
    e.pop("MLFLOW_TRACKING_URI", None)
    return e


def sweep_cmd(spec: Path, uri: str, tmp_path: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "stabray",
        "sweep",
        str(spec),
        "--tracking-uri",
        uri,
        "--storage",
        str(tmp_path / "runs"),
    ]


def start_until_checkpoint(cmd: list[str], tmp_path: Path) -> subprocess.Popen:
    """The sweep in its own process group (output in sweep.log), once a trial has checkpointed."""
    log = open(tmp_path / "sweep.log", "w")
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env(tmp_path), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.time() + 240
    while time.time() < deadline:
        if list((tmp_path / "runs").glob("ft-*/trial_*/checkpoint_*")):
            return proc
        time.sleep(0.5)
    proc.kill()
    pytest.fail(f"no checkpoint appeared; sweep output:\n{(tmp_path / 'sweep.log').read_text()[-3000:]}")


@pytest.mark.parametrize(
    "sig",
    [signal.SIGINT, signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
    ids=["SIGINT", "SIGKILL", "SIGTERM"],
)
def test_killed_driver_resumes_to_exactly_n_trials(tmp_path, sig):
    """SIGINT goes to the whole process group, as Ctrl-C does; SIGTERM to the driver alone, as
    `kill` does. Both end the sweep gracefully: exit 130, the exact --resume command printed, the
    parent and the running trials KILLED in MLflow (none left RUNNING, none FINISHED early)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = sweep_cmd(spec_file(tmp_path), uri, tmp_path)
    proc = start_until_checkpoint(cmd, tmp_path)
    if sig == signal.SIGTERM:
        os.kill(proc.pid, sig)
    else:
        os.killpg(proc.pid, sig)
    rc = proc.wait(timeout=120)
    if sig == signal.SIGKILL:  # the local Ray processes of the dead driver
        subprocess.run(["pkill", "-9", "-f", f"{tmp_path}"], check=False)
    parents, before = children(uri, "ft")
    assert 1 <= len(before) < 3 or any(r.info.status != "FINISHED" for r in before)
    if sig != signal.SIGKILL:
        out = (tmp_path / "sweep.log").read_text()
        assert rc == 130, out[-3000:]
        assert f"stopped by {sig.name}" in out
        assert "  python " + " ".join([*cmd[1:], "--resume"]) in out.splitlines()  # the exact command
        assert [p.info.status for p in parents] == ["KILLED"]
        assert {r.info.status for r in before} <= {"KILLED", "FINISHED"}  # none left RUNNING
    res = subprocess.run(
        [*cmd, "--resume"], cwd=tmp_path, env=env(tmp_path), capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # Runs marked lost are allowed: a SIGKILL while Ray copied its state into the run folder cuts it
    # short, and the resume then runs the trials again (the next test makes that happen every time).
    assert_exactly_n_finished(uri, 3)


def assert_exactly_n_finished(uri: str, n: int) -> list:
    """The sweep's parent FINISHED with exactly n FINISHED trial runs (no duplicates), each epoch logged
    exactly once; returns the runs marked lost (kept for the record, not among the n)."""
    from mlflow import MlflowClient

    parents, runs = children(uri, "ft")
    lost = [r for r in runs if r.data.tags.get("stabray.lost")]
    after = [r for r in runs if not r.data.tags.get("stabray.lost")]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(after) == n, [r.data.tags.get("stabray.trial_id") for r in after]  # no duplicate runs
    assert all(r.info.status == "FINISHED" for r in after)
    assert all(r.info.run_name.endswith(" (lost)") and r.info.status != "RUNNING" for r in lost)
    for r in after:  # each epoch logged exactly once, none missing
        steps = [m.step for m in MlflowClient(uri).get_metric_history(r.info.run_id, "train_loss")]
        assert sorted(steps) == [1, 2, 3]
    return lost


def test_a_resume_whose_ray_state_was_cut_short_runs_the_trials_again(tmp_path):
    """Ray Tune copies its experiment state into the run folder without write-then-rename, so a
    SIGKILL during the copy leaves it cut short (made certain here by cutting it). Ray's own restore
    then fails and starts the experiment again with an empty config: every trial failed with
    KeyError: 'method'. The resume instead says so in one line, moves the state aside (kept), and runs
    the sweep's trials again: exactly N FINISHED runs, the interrupted trial's run kept, marked lost."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = sweep_cmd(spec_file(tmp_path), uri, tmp_path)
    proc = start_until_checkpoint(cmd, tmp_path)
    deadline = time.time() + 60  # (Ray saves its state at its first step, long before a checkpoint)
    while not list((tmp_path / "runs").glob("ft-*/experiment_state-*.json")) and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=120)
    subprocess.run(["pkill", "-9", "-f", f"{tmp_path}"], check=False)
    (state,) = (tmp_path / "runs").glob("ft-*/experiment_state-*.json")
    state.write_bytes(state.read_bytes()[:200])
    dry = subprocess.run(
        [*cmd, "--resume", "--dry-run"], cwd=tmp_path, env=env(tmp_path), capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert f"({state.name}: it is not whole JSON" in dry.stdout and "would be set aside" in dry.stdout
    assert state.exists()  # a dry run moves nothing
    res = subprocess.run(
        [*cmd, "--resume"], cwd=tmp_path, env=env(tmp_path), capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (line,) = [ln for ln in res.stdout.splitlines() if "cannot be read" in ln]
    assert f"{state.name}: it is not whole JSON" in line and "damaged-state-" in line
    assert len(assert_exactly_n_finished(uri, 3)) >= 1  # the run of the trial that was interrupted
    (kept,) = state.parent.glob(f"damaged-state-*/{state.name}")
    assert len(kept.read_bytes()) == 200  # moved aside as it was, not deleted


def test_grid_methods_in_one_tuner_resume_to_exactly_n_trials(tmp_path):
    """A multi-method grid sweep (one Tuner for all methods) stopped by Ctrl-C resumes in the same
    layout: each method's trials exactly once, under that method's group run, every group FINISHED."""
    spec = spec_file(
        tmp_path,
        methods=["sft_cot", {"name": "nso", "space": {"sigma": {"choice": [0.01]}}}],
        search={
            "num_samples": 1,
            "max_concurrent": 1,
            "scheduler": "fifo",
            "searcher": "grid",
            "space": {"lam": None, "bits": None, "lr": None, "seed": {"choice": [0, 1]}},
        },
    )
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = sweep_cmd(spec, uri, tmp_path)
    proc = start_until_checkpoint(cmd, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    rc = proc.wait(timeout=120)
    out = (tmp_path / "sweep.log").read_text()
    assert rc == 130 and "methods sft_cot (2), nso (2): 4 trials, 1 at a time" in out, out[-3000:]
    _, before = children(uri, "ft")
    assert len(before) < 4 or any(r.info.status != "FINISHED" for r in before)
    res = subprocess.run(
        [*cmd, "--resume"], cwd=tmp_path, env=env(tmp_path), capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("ft").experiment_id], max_results=100)
    groups = {r.data.tags["stabray.method"]: r for r in runs if r.data.tags.get("stabray.role") == "method"}
    assert set(groups) == {"sft_cot", "nso"} and all(g.info.status == "FINISHED" for g in groups.values())
    _, after = children(uri, "ft")
    assert sorted((r.data.params["method"], r.data.params["seed"]) for r in after) == [
        ("nso", "0"),
        ("nso", "1"),
        ("sft_cot", "0"),
        ("sft_cot", "1"),
    ]  # no duplicate runs, none missing
    for r in after:
        assert r.info.status == "FINISHED"
        assert r.data.tags["mlflow.parentRunId"] == groups[r.data.params["method"]].info.run_id


def test_nan_trial_fails_while_others_complete(tmp_path, monkeypatch, capsys):
    from stabray.cli import main

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    spec = spec_file(
        tmp_path,
        name="nan",
        search={
            "num_samples": 1,
            "max_concurrent": 2,
            "searcher": "grid",
            "space": {"lr": {"choice": [2.0e-3, 1.0e8]}, "lam": {"choice": [1.0]}, "bits": {"choice": [32]}},
        },
    )
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rc = main(["sweep", str(spec), "--tracking-uri", uri, "--storage", str(tmp_path / "runs")])
    assert rc == 0
    assert "2 trials (1 failed)" in capsys.readouterr().out
    _, runs = children(uri, "nan")
    by_lr = {float(r.data.params["lr"]): r for r in runs}
    assert by_lr[2.0e-3].info.status == "FINISHED" and "test_acc" in by_lr[2.0e-3].data.metrics
    bad = by_lr[1.0e8]
    assert bad.info.status == "FAILED"
    assert "loss became" in bad.data.tags["stabray.error"]


def test_gpu_request_larger_than_cluster_fails_fast(tmp_path, monkeypatch, capsys):
    from stabray.cli import main

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    spec = spec_file(tmp_path, name="gpu", resources={"cpu": 1, "gpu": 4})
    rc = main(
        ["sweep", str(spec), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--storage", str(tmp_path / "runs")]
    )
    assert rc == 2
    assert "resources.gpu" in capsys.readouterr().err
    # joined to a cluster (no local start): its resources, once Ray has joined it
    from stabray.errors import UserError
    from stabray.spec import load_spec
    from stabray.tune import sweep

    monkeypatch.setattr(sweep.ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 2.0})
    monkeypatch.setattr(sweep, "autoscaling", lambda: False)
    spec, _ = load_spec(str(spec))
    with pytest.raises(UserError, match="each trial asks for 4 GPU, but the Ray cluster has 2 in all"):
        sweep.check_resources(spec)
    monkeypatch.setattr(sweep, "autoscaling", lambda: True)  # an autoscaler adds the GPU workers
    sweep.check_resources(spec)
    assert "the autoscaler adds nodes" in capsys.readouterr().out


def start_ui(tmp_path: Path, db: str, port: int) -> subprocess.Popen:
    """`stabray ui` on sqlite `tmp_path/db` in a session of its own (stdout piped: its first line is the
    URL), with SIGINT as a terminal has it: a shell that runs pytest in the background leaves SIGINT
    ignored, and an ignored SIGINT stays ignored in the child (Python raises KeyboardInterrupt only
    when it is not)."""
    return subprocess.Popen(
        [sys.executable, "-m", "stabray", "ui", "--tracking-uri", f"sqlite:///{tmp_path}/{db}", "--port", str(port)],
        cwd=tmp_path,
        env=env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_runs_found_through_mlflow_server_rest_api(tmp_path):
    port = free_port()
    server = start_ui(tmp_path, "srv.db", port)
    try:
        from mlflow import MlflowClient

        # the store must exist for `ui`; it creates it on first use through the server
        line = server.stdout.readline()
        assert f"http://127.0.0.1:{port}" in line
        uri = f"http://127.0.0.1:{port}"
        spec = spec_file(tmp_path, name="rest", search={"num_samples": 2, "max_concurrent": 2})
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "stabray",
                "sweep",
                str(spec),
                "--tracking-uri",
                uri,
                "--storage",
                str(tmp_path / "runs"),
            ],
            cwd=tmp_path,
            env=env(tmp_path),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        exp = MlflowClient(uri).get_experiment_by_name("rest")
        body = json.dumps({"experiment_ids": [exp.experiment_id], "max_results": 100}).encode()
        req = urllib.request.Request(
            f"{uri}/api/2.0/mlflow/runs/search", data=body, headers={"Content-Type": "application/json"}
        )
        runs = json.loads(urllib.request.urlopen(req, timeout=30).read())["runs"]
        tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
        assert sorted(t.get("stabray.role") for t in tags) == ["sweep", "trial", "trial"]
        # on failure: each run's status and error tag, and the sweep's summary (which names a failed trial)
        ended = [
            (t.get("mlflow.runName"), r["info"]["status"], t.get("stabray.error", "")[-600:])
            for r, t in zip(runs, tags)
        ]
        assert all(status == "FINISHED" for _, status, _ in ended), (ended, res.stdout[-3000:])
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_ui_stopped_by_a_signal_stops_every_server_process(tmp_path, sig):
    """`stabray ui` in the foreground, then SIGTERM (a process manager) or SIGINT (Ctrl-C) to it alone:
    it exits 0 and takes down every process the MLflow server started (uvicorn, the job workers), and
    the port stops answering. Before, it died at once and left them serving."""
    import psutil

    port = free_port()
    ui = start_ui(tmp_path, "ui.db", port)
    children = []
    try:
        url = f"http://127.0.0.1:{port}"
        assert url in ui.stdout.readline()
        children = psutil.Process(ui.pid).children(recursive=True)
        assert len(children) >= 2, [c.cmdline() for c in children]  # the server and what it runs
        ui.send_signal(sig)
        assert ui.wait(timeout=60) == 0
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [c.cmdline() for c in alive]
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=2)
    finally:
        for p in [*children, psutil.Process(ui.pid) if ui.poll() is None else None]:
            if p is not None:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass


def test_multinode_fake_gpus_spread_and_survive_lost_node(tmp_path, monkeypatch):
    """ray.cluster_utils.Cluster: a CPU-less head and two nodes with 2 fake GPUs each."""
    import threading

    import ray
    from ray.cluster_utils import Cluster

    from stabray.spec import load_spec
    from stabray.tune.sweep import run_sweep

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    if ray.is_initialized():  # an earlier in-process sweep's local instance
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=2, num_gpus=2) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        spec, path = load_spec(
            str(
                spec_file(
                    tmp_path,
                    name="mn",
                    resources={"cpu": 1, "gpu": 1},
                    search={"num_samples": 4, "max_concurrent": 4, "max_failures": 3},
                    train={"epochs": 4},
                )
            )
        )
        removed, seen = [], set()

        def node_ids():
            ids = set()
            for f in (tmp_path / "runs").glob("mn-*/trial_*/result.json"):
                for line in f.read_text().splitlines():
                    try:
                        ids.add(json.loads(line)["node_id"])
                    except (ValueError, KeyError):
                        pass  # a line being written
            return ids

        def kill_a_node():
            # once trials have reported from both nodes (they spread), take one node away mid-sweep
            deadline = time.time() + 300
            while time.time() < deadline and not {n.node_id for n in nodes} <= node_ids():
                time.sleep(0.3)
            seen.update(node_ids())
            cluster.remove_node(nodes[1])
            removed.append(True)

        t = threading.Thread(target=kill_a_node, daemon=True)
        t.start()
        grid, info = run_sweep(
            spec, path, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", storage=str(tmp_path / "runs")
        )
        t.join(timeout=5)
        assert removed
        assert grid.num_errors == 0 and grid.num_terminated == 4  # lost node's trials retried elsewhere
        assert all(r.metrics["gpus_assigned"] == 1.0 for r in grid)  # each trial got exactly its one GPU
        assert {n.node_id for n in nodes} <= seen  # trials had spread over both nodes before the loss
        _, runs = children(f"sqlite:///{tmp_path}/mlflow.db", "mn")
        assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    finally:
        ray.shutdown()
        cluster.shutdown()
