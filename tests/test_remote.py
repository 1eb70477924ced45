"""The cluster path end to end (slow): results on S3 (a moto server on 127.0.0.1) with a driver killed,
its local files deleted and the sweep resumed from S3 alone; and an autoscaling Ray cluster on this
machine (Ray's fake_multinode provider, cluster.local.yaml) that launches GPU workers for a sweep's
trials, loses one mid-sweep and lets the idle ones go afterwards.

Every process these tests start is stopped by its process id or group, never with `ray stop`; Ray's
files go to a private temp dir, never /tmp/ray."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port
from test_faults import children, spec_file

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def wait_for(cond, timeout_s: float, what: str, every: float = 1.0):
    """Poll `cond` until it returns something truthy (the machine is shared and slow: no fixed sleeps)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def pids_with(marker: str) -> list[int]:
    """Processes whose command line names `marker` (a private temp dir of this test)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                if marker in (p / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def kill_group(proc: subprocess.Popen, marker: str) -> None:
    """SIGKILL a process started with start_new_session, its group, and any process naming `marker`."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)
    for pid in pids_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not pids_with(marker), 60, f"the processes of {marker} to end")


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5).close()
        return True
    except OSError:
        return False


def sweep_env(tmp_path, **extra) -> dict:
    e = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1", **extra)
    e.pop("MLFLOW_TRACKING_URI", None)
    return e


def epochs_logged(uri: str, run_id: str) -> list[int]:
    from mlflow import MlflowClient

    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, "train_loss"))


# -- S3 ---------------------------------------------------------------------------------------------


def test_s3_results_resume_from_s3_alone(tmp_path, s3):
    """Kill the driver mid-sweep, delete every local file the sweep wrote (its working directory with
    the Optuna working copy and the dataset cache, Ray's temp dir with the driver's staging folder),
    then `--resume` with only S3 and the MLflow server left: exactly N finished trials, none twice,
    every epoch logged once, the study complete, and artifacts on S3 read through the MLflow server."""
    import optuna
    from mlflow import MlflowClient

    t_start = time.time()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    (tmp_path / "server").mkdir()
    server_log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp_path}/server/mlflow.db",
            "--artifacts-destination",
            f"s3://{s3.bucket}/mlflow",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=tmp_path / "server",
        env=sweep_env(tmp_path, **s3.env),
        stdout=server_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    ray_tmp = tempfile.mkdtemp(prefix="sr21-", dir="/tmp")  # short: Ray's socket paths must fit 108 bytes
    work = tmp_path / "work"
    work.mkdir()
    proc = None
    try:
        wait_for(lambda: answers(f"{uri}/health") or server.poll() is not None, 300, "the MLflow server")
        assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
        spec = spec_file(
            tmp_path,
            name="s3sw",
            # train_loss, not val_acc: this tiny model's accuracy (and its EAF, with no chain written) is 0.0
            # on every trial after 3 epochs, so the study's values below could match the runs' without being
            # theirs; the training losses differ by trial
            search={"num_samples": 3, "max_concurrent": 1, "searcher": "optuna", "scheduler": "fifo"}
            | {"metric": "train_loss", "mode": "min"},
        )
        storage = f"s3://{s3.bucket}/runs"
        cmd = [sys.executable, "-m", "stabray", "sweep", str(spec), "--tracking-uri", uri, "--storage", storage]
        env = sweep_env(tmp_path, **s3.env, STABRAY_CACHE=str(work / "cache"), RAY_TMPDIR=ray_tmp, RAY_ADDRESS="local")
        log = open(tmp_path / "sweep.log", "w")
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def keys(prefix):
            pages = s3.client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
            return [o["Key"] for page in pages for o in page.get("Contents", [])]

        def checkpointed_trials():  # runs/<run>/<trial>/checkpoint_xxxxxx/...
            return {k.split("/")[2] for k in keys("runs/") if "/checkpoint_" in k}

        # The first trial finished and the second one checkpointed: kill the driver and its Ray.
        wait_for(lambda: len(checkpointed_trials()) >= 2 or proc.poll() is not None, 900, "two trials in S3")
        assert proc.poll() is None, (tmp_path / "sweep.log").read_text()[-3000:]
        kill_group(proc, ray_tmp)
        t_killed = time.time()
        parents, before = children(uri, "s3sw")
        assert [p.info.status for p in parents] == ["RUNNING"]
        assert 2 <= len(before) <= 3 and "RUNNING" in {r.info.status for r in before}
        assert (work / "stabray_runs").is_dir()  # the Optuna working copy, about to be lost

        # Every local file the sweep wrote goes; only S3 and the MLflow server (with S3 artifacts) remain.
        shutil.rmtree(work)
        shutil.rmtree(ray_tmp)
        work.mkdir()
        os.makedirs(ray_tmp)
        res = subprocess.run([*cmd, "--resume"], cwd=work, env=env, capture_output=True, text=True, timeout=1200)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        t_resumed = time.time()

        parents, runs = children(uri, "s3sw")
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        # A trial started after Ray's last saved experiment state is lost with the driver: Ray runs another
        # in its place, and its MLflow run is ended KILLED and marked lost (not one of the sweep's trials).
        lost = [r for r in runs if r.data.tags.get("stabray.lost")]
        after = [r for r in runs if not r.data.tags.get("stabray.lost")]
        assert all(r.info.status == "KILLED" and r.info.run_name.endswith(" (lost)") for r in lost)
        tids = [r.data.tags["stabray.trial_id"] for r in after]
        assert len(after) == 3 and len(set(tids)) == 3, tids  # no duplicate run for a trial
        states = [(r.info.run_name, r.info.status, r.data.tags.get("stabray.error", "")[-300:]) for r in runs]
        assert all(r.info.status == "FINISHED" for r in after), (states, res.stdout[-2000:])
        for r in after:  # each epoch exactly once, none missing (the killed trial resumed, not restarted)
            assert epochs_logged(uri, r.info.run_id) == [1, 2, 3]

        # Artifacts: stored in the bucket, read back through the MLflow server.
        client = MlflowClient(uri)
        dst = tmp_path / "downloads"
        dst.mkdir()
        stored = keys("mlflow/")
        for r in after:
            assert r.info.artifact_uri.startswith("mlflow-artifacts:"), r.info.artifact_uri
            cfg = json.loads(Path(client.download_artifacts(r.info.run_id, "trial_config.json", str(dst))).read_text())
            assert cfg["train"]["lr"] == pytest.approx(float(r.data.params["lr"]))
            png = Path(client.download_artifacts(r.info.run_id, "plots/curves.png", str(dst))).read_bytes()
            assert png[:8] == b"\x89PNG\r\n\x1a\n"
            assert any(k.endswith(f"{r.info.run_id}/artifacts/trial_config.json") for k in stored)
            assert r.data.tags["stabray.checkpoint"].startswith(f"s3://{s3.bucket}/runs/s3sw-")
        summary = Path(client.download_artifacts(parents[0].info.run_id, "summary.md", str(dst))).read_text()
        assert all(r.info.run_name in summary for r in after)

        # Ray Tune's results and checkpoints: in S3, one run folder, three trials.
        runs = {k.split("/")[1] for k in keys("runs/")} - {""}  # "runs/" itself: a folder marker
        assert len(runs) == 1
        run = runs.pop()
        assert f"runs/{run}/stabray_sweep.json" in keys(f"runs/{run}/")
        folders = {k.split("/")[2] for k in keys(f"runs/{run}/trial_")}
        assert {f"trial_{t}" for t in tids} <= folders and len(folders) <= 3 + len(lost)
        for t in tids:  # every epoch's checkpoint kept on S3 (none deleted under a state that points to it)
            ckpts = {k.split("/")[3] for k in keys(f"runs/{run}/trial_{t}/checkpoint_")}
            assert len(ckpts) == 3, ckpts

        # The Optuna study, rebuilt from S3 on resume: every trial complete, with the values MLflow has.
        study = optuna.load_study(study_name=run, storage=f"sqlite:///{work / 'stabray_runs' / run / 'optuna.db'}")
        complete = [t for t in study.trials if t.state.name == "COMPLETE"]
        assert len(complete) == 3 and {t.state.name for t in study.trials} <= {"COMPLETE", "FAIL"}
        assert sorted(t.params["train/lr"] for t in complete) == pytest.approx(
            sorted(float(r.data.params["lr"]) for r in after)
        )
        last_val = {float(r.data.params["lr"]): r.data.metrics["train_loss"] for r in after}
        assert len(set(last_val.values())) == 3  # three different values to match
        for t in complete:
            assert t.value == pytest.approx(last_val[min(last_val, key=lambda lr: abs(lr - t.params["train/lr"]))])
        print(
            f"\n[s3 end to end] until killed {t_killed - t_start:.0f} s, resume {t_resumed - t_killed:.0f} s, "
            f"total {time.time() - t_start:.0f} s; runs of lost trials: {len(lost)}"
        )
    finally:
        if proc is not None and proc.poll() is None:  # the test failed mid-sweep
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        for pid in pids_with(ray_tmp):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(ray_tmp, ignore_errors=True)
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


# -- an autoscaling cluster on this machine ----------------------------------------------------------

FAKE_HEAD = "f" * 51 + "00000"  # the fake provider's head node id; its workers are f...00001, f...00002, ...


def fake_cluster():
    spec = importlib.util.spec_from_file_location("fake_cluster", ROOT / "scripts" / "fake_cluster.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (a raylet's workers and agents)."""
    parent = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                parent[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        above = todo.pop()
        kids = [c for c, pp in parent.items() if pp == above]
        out += kids
        todo += kids
    return out


def trial_results(runs: Path) -> dict[str, list[dict]]:
    """{trial folder: its results so far}, from the result.json files of the sweep's run folder."""
    out = {}
    for f in sorted(runs.glob("fc-*/trial_*/result.json")):
        rows = []
        for line in f.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass  # a line being written
        out[f.parent.name] = rows
    return out


def raylets(temp: str) -> int:
    """Raylet processes in the fake cluster's process group: one per live node, the head's included."""
    out = 0
    for pid in fake_cluster().processes(temp):
        try:
            out += Path(f"/proc/{pid}/comm").read_text().strip() == "raylet"
        except OSError:
            pass  # ended meanwhile
    return out


def test_fake_autoscaling_cluster_runs_gpu_trials_and_survives_a_lost_worker(tmp_path):
    """cluster.local.yaml started as a user would (scripts/fake_cluster.py): the head alone, then GPU
    workers launched by the autoscaler for a sweep with `resources: {gpu: 1}` per trial, one worker
    killed (SIGKILL to its raylet) while its trial runs, the sweep ending with every trial finished, no
    MLflow run twice, every epoch logged once and one GPU per trial, then the idle workers gone."""
    from mlflow import MlflowClient

    fc = fake_cluster()
    temp = tempfile.mkdtemp(prefix="sr21c-", dir="/tmp")  # the cluster's own Ray temp dir
    shutil.rmtree(temp)  # fake_cluster.start creates it (and refuses a folder with a running cluster)
    t_start = time.time()
    address = fc.start(port=free_port(), temp_dir=temp)
    seen: dict[str, str] = {}  # phase -> `ray status` text
    proc = None
    try:
        seen["before"] = wait_for(  # the autoscaler reports a few seconds after the head starts
            lambda: (t := fc.status(address)) and fc.active_nodes(t) and t, 300, "the autoscaler's status", every=3
        )
        assert fc.active_nodes(seen["before"]) == {"ray.head.default": 1}, seen["before"]
        procs = {"before": raylets(temp)}  # phase -> raylet processes (nodes actually running)
        assert procs["before"] == 1
        epochs = 6
        spec = spec_file(
            tmp_path,
            name="fc",
            resources={"cpu": 1, "gpu": 1},
            task={"train_size": 800},  # epochs of a few seconds: time to kill a node while a trial runs
            train={"epochs": epochs},
            search={"num_samples": 4, "max_concurrent": 2, "max_failures": 3, "scheduler": "fifo"},
        )
        uri = f"sqlite:///{tmp_path}/mlflow.db"
        runs = tmp_path / "runs"
        env = fc.ray_env(RAY_ADDRESS=address, STABRAY_CACHE=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
        env.pop("MLFLOW_TRACKING_URI", None)
        assert env["RAY_ADDRESS"] == address  # never another Ray instance on this shared machine
        log = open(tmp_path / "sweep.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "stabray", "sweep", str(spec), "--tracking-uri", uri, "--storage", str(runs)]
            + ["--address", address],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        killed, most_workers, last_status = None, -1, 0.0
        deadline = time.time() + 1800
        while proc.poll() is None and time.time() < deadline:
            if time.time() - last_status > 10:  # `ray status` costs a Python start: not too often
                text = fc.status(address)
                workers = fc.active_nodes(text).get("gpu_worker", 0)
                if workers > most_workers:
                    most_workers, seen["during"], procs["during"] = workers, text, raylets(temp)
                last_status = time.time()
            if killed is None:  # a spot node lost mid-trial: kill a node (raylet and workers) while its trial runs
                for trial, rows in trial_results(runs).items():
                    if rows and rows[-1]["training_iteration"] <= epochs - 3:
                        node = rows[-1]["node_id"]
                        pids = [
                            pid
                            for pid in fc.processes(temp)
                            if f"--node_id={node}" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                            and "raylet" in Path(f"/proc/{pid}/comm").read_text()
                        ]
                        assert len(pids) == 1, (node, pids)
                        for pid in [pids[0], *descendants(pids[0])]:  # the raylet and its workers: the node
                            try:
                                os.kill(pid, signal.SIGKILL)
                            except ProcessLookupError:
                                pass
                        killed = (trial, node, rows[-1]["training_iteration"])
                        break
            time.sleep(2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait(timeout=60)
        out = (tmp_path / "sweep.log").read_text()
        assert rc == 0, out[-4000:]
        assert f"joined Ray cluster at {address}" in out
        t_sweep = time.time()
        assert killed is not None, "no trial was seen running on a worker"
        assert most_workers >= 2, seen.get("during")  # the autoscaler launched a worker per concurrent trial

        _, trials = children(uri, "fc")
        assert len(trials) == 4 and len({r.data.tags["stabray.trial_id"] for r in trials}) == 4
        assert all(r.info.status == "FINISHED" for r in trials)
        for r in trials:
            assert epochs_logged(uri, r.info.run_id) == list(range(1, epochs + 1))
            assert r.data.metrics["sys/gpus_assigned"] == 1.0  # each trial saw exactly its one GPU
            history = MlflowClient(uri).get_metric_history(r.info.run_id, "sys/gpus_assigned")
            assert {m.value for m in history} == {1.0}
        results = trial_results(runs)
        nodes = {row["node_id"] for rows in results.values() for row in rows}
        assert FAKE_HEAD not in nodes and all(n.startswith("f" * 51) for n in nodes), nodes  # workers only
        trial, node, at_epoch = killed
        assert results[trial][-1]["node_id"] != node  # the lost node's trial finished on another worker
        assert results[trial][-1]["training_iteration"] == epochs

        # Idle workers go away (idle_timeout_minutes: 1 in cluster.local.yaml): in the autoscaler's view and
        # as processes (only the head's raylet left), not just dropped from the autoscaler's list.
        seen["after"] = wait_for(
            lambda: (t := fc.status(address)) and fc.active_nodes(t) == {"ray.head.default": 1} and t,
            600,
            "the idle workers to be removed",
            every=10,
        )
        wait_for(lambda: raylets(temp) == 1, 120, "the removed workers' raylets to end", every=2)
        procs["after"] = raylets(temp)
        t_down = time.time()
        report = "\n".join(
            f"[fake cluster] {phase}: {fc.active_nodes(text)}, raylet processes {procs.get(phase)}"
            for phase, text in seen.items()
        ) + (
            f"\n[fake cluster] trials ran on workers {sorted(n[-5:] for n in nodes)}"
            f"\n[fake cluster] killed worker {killed[1][-5:]} while {killed[0]} was at epoch {killed[2]}"
            f"\n[fake cluster] start + sweep {t_sweep - t_start:.0f} s, scale-down {t_down - t_sweep:.0f} s"
        )
        print("\n" + report + "\n" + "\n\n".join(f"--- {p}\n{t}" for p, t in seen.items()))
    finally:
        if proc is not None and proc.poll() is None:  # the test failed mid-sweep: the driver goes first
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        members = fc.processes(temp)  # the cluster's process group: head, autoscaler, worker nodes, workers
        fc.stop(temp)
        alive = [pid for pid in members if Path(f"/proc/{pid}").exists()]
        assert not alive and not pids_with(temp), alive
