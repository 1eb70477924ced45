"""Sweep overhead: an 8-trial sweep through stabray (Ray Tune + Optuna + MLflow, FIFO so every trial
runs every epoch) vs the same 8 configurations in a plain process pool; the same sweep on a Ray
instance started beforehand (the floor: what is left without Ray's start); and the cost per logged
result of MLflow logging (one `log_batch` vs one call per metric key).

    python benchmarks/bench_sweep.py [--smoke] [--json out.json] [--epochs 3] [--trials 8] [--repeats 5]
    python benchmarks/bench_sweep.py --profile cold      # one sweep, where its wall and CPU time go

The sweep is `sweeps/dijkstra.yaml` (the default laptop sweep) with `search.scheduler=fifo` and
`train.epochs=3` (the trial length the overhead target was set at), run by
`stabray.tune.sweep.run_sweep`: Optuna proposes 8 configurations, 2 run at a time, each reports and
checkpoints every epoch, and the MLflow callback logs every result to a sqlite store. The pool runs
the configurations the sweep ran (the first repeat's), with 2 spawned worker processes (1 torch thread
each, like a Ray trial with 1 CPU), each trial being `make_run(config)`: every epoch, then `final()`,
`best_epoch()` and `final_stability()` (what the trainable computes); no checkpoints, reports or
tracking. Per repeat, three arms in a rotating order: "cold" (the timed wall includes run_sweep
starting a private local Ray instance, as `--address local` does: it would otherwise join any Ray
already running on the machine), "warm" (a private Ray instance started before the clock: the
floor), and the pool. Overhead = arm wall / pool wall - 1 per repeat; reported: median and range over
the repeats (target: cold <= 10%). The same by CPU time: CPU seconds of every process of each side
(the driver, Ray's daemons and workers, read every second while the sweep runs, so that the trial
actors Tune ends before `Tuner.fit` returns count too; the pool's driver and workers), which another
job on the machine slows down but does not add to. The first trial in each process (Ray actor or pool
worker) imports the training code inside its span on both sides.

Per-trial time, on both sides from the same clock (time.time() in the trial's own process) over the
same span (the trial function's start to its last report): Ray's `time_total_s` and the pool's own.
Where the rest goes (one timeline per stabray arm, from a Tune callback on the driver): Ray start,
Tune set-up until the first trial starts, the gaps between one trial's end and the next one's start
on the same slot, and the teardown after the last trial ends. Both use one warm dataset cache, and the
MLflow store exists before the timed sweep, as it does for every sweep after a user's first (creating
a sqlite store runs MLflow's schema migrations once; printed apart).

MLflow: `Store.log_metrics` (one `log_batch` per result) vs `MlflowClient.log_metric` per key, on a
sqlite store in a temporary directory, for results shaped like a trial's per-epoch result (9 keys),
interleaved, after one warm-up. `--smoke`: tiny model and data, 4 trials of ~3 s, 4 results, 1 repeat.

`--profile cold|warm`: one sweep only, its wall split into consecutive phases (Ray start, the driver
before Tuner.fit, Tune's set-up until the first trial starts, the trials, the end), the wall time
spent inside named calls on the driver (each MLflow callback hook and store call, figures, Tune's
experiment-state saves, Optuna), and the CPU seconds of each kind of process.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

from common import command, figure, json_out, loadavg, median, positive_int  # noqa: E402

TARGET = "<= 10"  # % : sweep wall / pool wall - 1
EPOCH_RESULT = {
    "train_loss": 1.234,
    "tokens": 61234.0,
    "tokens_per_s": 9876.5,
    "epoch_time_s": 7.1,
    "val_acc": 0.61,
    "val_time_s": 1.9,
    "val_eaf": 3.21,
    "eaf_time_s": 0.4,
    "epoch": 1,
}

SMOKE_OVERRIDES = {
    "task.train_size": 64,
    "task.val_size": 16,
    "task.test_size": 16,
    "model.preset": "tiny",
    "train.epochs": 2,
    "train.warmup_steps": 1,
    "eval.eaf_examples": 4,
    "eval.eaf_iters": 2,
    "eval.decomposition_examples": 0,
    "search.num_samples": 4,
}


def load(spec_name: str, overrides: dict):
    from stabray.spec import load_spec

    return load_spec(spec_name, overrides)


def warm_cache(spec) -> None:
    """Build the dataset cache once, so neither side pays for generating it."""
    from stabray.data.cache import load_splits
    from stabray.tasks import get_task

    c = spec.task
    task = get_task(c.name, **c.params)
    load_splits(  # the splits (and so the cache key) a trial asks for
        task,
        {"train": c.train_size, "val": c.val_size, "test": c.test_size},
        seed=c.data_seed,
        splits=("train", "val", "test", *task.long_splits(spec.eval.long_splits)),
    )


# -- the plain process pool ----------------------------------------------------------------------
def _pool_init() -> None:
    import torch

    torch.set_num_threads(1)  # a Ray trial with 1 CPU runs with 1 torch thread


def pool_trial(config: dict) -> dict:
    """One trial without Ray or MLflow: what the trainable computes, minus reporting/checkpoints."""
    start = time.time()  # the same clock Ray's time_total_s uses, in the trial's own process
    from stabray.train import make_run  # inside the span, as in the trainable (a first trial imports it)

    run = make_run(config)
    while not run.done:
        m = run.epoch()
    m.update(run.final())
    m.update(run.best_epoch())
    m.update(run.final_stability())  # the trainable's end-of-trial work: eq. (4) table, weight noise
    end = time.time()  # = the trainable's last report
    u = os.times()  # this worker's CPU so far (its start-up and imports included)
    return {
        "val_acc": m["val_acc"],
        "best_val_acc": m["best_val_acc"],
        "trial_s": end - start,
        "span": (start, end),
        "worker": (os.getpid(), u.user + u.system),
    }


def run_pool(configs: list[dict], workers: int) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    with mp.get_context("spawn").Pool(workers, initializer=_pool_init) as pool:
        res = pool.map(pool_trial, configs, chunksize=1)
    wall, driver = time.perf_counter() - t0, time.process_time() - c0
    worker_cpu: dict[int, float] = {}  # each worker's CPU at the end of its last trial
    for r in res:
        pid, cpu = r["worker"]
        worker_cpu[pid] = max(cpu, worker_cpu.get(pid, 0.0))
    return {
        "wall_s": wall,
        "cpu_s": driver + sum(worker_cpu.values()),
        "cpu_by_kind_s": {"driver": driver, "pool workers": sum(worker_cpu.values())},
        "trial_s": [r["trial_s"] for r in res],
        "best_val_acc": max(r["best_val_acc"] for r in res),
        "mean_running": mean_running([r["span"] for r in res]),
    }


def mean_running(spans: list[tuple[float, float]]) -> float:
    """Trials running at once, averaged over the time from the first start to the last end."""
    t0, t1 = min(s for s, _ in spans), max(e for _, e in spans)
    return sum(e - s for s, e in spans) / max(t1 - t0, 1e-9)


# -- the stabray sweep ---------------------------------------------------------------------------
def private_ray(cpus: int) -> None:
    """A Ray instance of our own with `cpus` CPUs. `run_sweep` would otherwise join any Ray cluster
    running on the machine (address="auto"), e.g. another user's, and share its CPUs."""
    import ray

    from stabray.tune.sweep import ray_env

    ray_env()  # what a Ray instance stabray starts gets: the same floor as the cold arm's
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)


def timeline_callback():
    """A Tune callback (on the driver) that notes when each trial starts and ends (time.time())."""
    from ray.tune import Callback

    class Timeline(Callback):
        def __init__(self):
            self.start, self.end = {}, {}

        def on_trial_start(self, iteration, trials, trial, **info):
            self.start.setdefault(trial.trial_id, time.time())

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.end[trial.trial_id] = time.time()

        on_trial_error = on_trial_complete

    return Timeline()


def where_time_goes(t_start: float, t_ray: float, t_end: float, tl, slots: int) -> dict:
    """Split a sweep's wall into Ray start, set-up before the first trial starts, idle slot time
    between trials (a slot waits for the next trial), trial time, and teardown after the last."""
    spans = sorted((tl.start[k], tl.end[k]) for k in tl.start if k in tl.end)
    if not spans:
        return {}
    first, last = spans[0][0], max(e for _, e in spans)
    busy = sum(e - s for s, e in spans)
    return {
        "ray_start_s": t_ray - t_start,
        "setup_s": first - t_ray,
        "trials_s": busy,
        "idle_slot_s": slots * (last - first) - busy,  # slot-seconds no trial ran (between trials)
        "teardown_s": t_end - last,
        "mean_running": mean_running(spans),
    }


def run_stabray(spec, path, tmp: Path, tag: str, warm_ray: bool, prof: Profiler | None = None) -> dict:
    """One sweep; `warm_ray`: Ray is started before the clock (the floor), else inside it. `prof`:
    note where the driver's time goes, and the CPU time of every process of the sweep."""
    import ray

    import stabray.tune.sweep as sweep
    from stabray.record import unwrap
    from stabray.tracking import Store

    uri = f"sqlite:///{tmp}/mlflow-{tag}.db"
    t0 = time.perf_counter()
    Store(uri, spec.mlflow.experiment or spec.name)  # a user's store exists after the first sweep:
    t_store = time.perf_counter() - t0  # creating one (MLflow's schema migrations) is a one-time cost
    if warm_ray:
        private_ray(spec.search.max_concurrent)
    tl = timeline_callback()
    loggers, init = sweep.ray_loggers, sweep.init_ray
    sweep.ray_loggers = lambda: [*loggers(), tl]  # the timeline rides along with the sweep's callbacks
    ray_up = []

    def timed_init(*a, **k):  # when Ray is up (cold: run_sweep starts it, as `--address local` does)
        out = init(*a, **k)
        ray_up.append((time.perf_counter(), time.time()))
        return out

    sweep.init_ray = timed_init
    if prof is not None:
        prof.install()
    try:
        sampler = CpuSampler()  # from here: a warm Ray's daemons and idle workers' start-up is not counted
        t0, w0 = time.perf_counter(), time.time()
        grid, _ = sweep.run_sweep(spec, path, tracking_uri=uri, storage=str(tmp / f"runs-{tag}"), address="local")
        wall, w_end = time.perf_counter() - t0, time.time()
        t_init, w_ray = ray_up[0][0] - t0, ray_up[0][1]
        cpu = sampler.stop()  # before Ray shuts down; trial actors that Tune already ended: last reading
    finally:
        sweep.ray_loggers, sweep.init_ray = loggers, init
        if prof is not None:
            prof.undo()
        ray.shutdown()
    return {
        "wall_s": wall,
        "cpu_s": sum(cpu.values()),
        "cpu_by_kind_s": cpu,
        "ray_init_s": t_init,
        "new_store_s": t_store,
        "trial_s": [(r.metrics or {}).get("time_total_s", 0.0) for r in grid],
        "best_val_acc": max((r.metrics or {}).get("best_val_acc", 0.0) for r in grid),
        "errors": [str(r.error) for r in grid if r.error],
        "where": where_time_goes(w0, w_ray, w_end, tl, spec.search.max_concurrent),
        "configs": [unwrap(r.config) for r in grid],
        **({"profile": profile_table(prof, w0, w_ray, w_end, tl)} if prof is not None else {}),
    }


def profile_table(prof: Profiler, w0: float, w_ray: float, w_end: float, tl) -> dict:
    """The sweep's wall split into consecutive phases (seconds) and the time inside named calls."""
    starts = sorted(tl.start.values())
    ends = sorted(tl.end.values())
    m = prof.marks
    phases = {
        "Ray start (ray.init)": w_ray - w0,
        "driver before Tuner.fit (MLflow store + parent run, Optuna study, Tuner)": m["fit_start"] - w_ray,
        "Tune set-up to the first trial's start (incl. the trial actors' process start and imports)": starts[0]
        - m["fit_start"],
        "first trial start to last trial end": ends[-1] - starts[0],
        "last trial end to Tuner.fit's return": m["fit_end"] - ends[-1],
        "after Tuner.fit (parent run closed)": w_end - m["fit_end"],
    }
    return {"phases_s": phases, "inside_s": dict(prof.spent), "calls": dict(prof.calls)}


# -- where the fixed cost goes (--profile) ------------------------------------------------------
class Profiler:
    """Wall seconds spent inside named driver-side calls during one sweep (nested calls count in both
    their own bucket and their caller's), wall-clock marks of the sweep's phases, and the CPU seconds
    of every process of the sweep's process tree (driver, Ray's daemons, the trial workers), read every
    second (`CpuSampler`). Installed by patching, removed by `undo`."""

    def __init__(self):
        self.spent: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.marks: dict[str, float] = {}
        self._undo: list = []

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, time.time())

    def wrap(self, owner, attr: str, bucket: str, first: str | None = None, last: str | None = None) -> None:
        orig = getattr(owner, attr)

        def timed(*a, **k):
            if first:
                self.mark(first)
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                self.spent[bucket] = self.spent.get(bucket, 0.0) + time.perf_counter() - t0
                self.calls[bucket] = self.calls.get(bucket, 0) + 1
                if last:
                    self.marks[last] = time.time()

        setattr(owner, attr, timed)
        self._undo.append((owner, attr, orig))

    def undo(self) -> None:
        for owner, attr, orig in reversed(self._undo):
            setattr(owner, attr, orig)
        self._undo.clear()

    def install(self) -> None:
        from ray import tune
        from ray.tune.execution.tune_controller import TuneController
        from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

        import stabray.tune.sweep as sweep
        from stabray.tracking import Store
        from stabray.tune.callbacks import MLflowTuneCallback
        from stabray.tune.console import SweepConsole
        from stabray.tune.search import DurableLimiter

        w = self.wrap
        w(sweep, "check_store", "driver: check_store (MLflow store reachable)")
        w(sweep, "init_ray", "driver: init_ray (already started)")
        w(sweep, "check_resources", "driver: check_resources")
        w(Store, "__init__", "MLflow: Store() (connect, experiment)")
        w(Store, "start_parent", "MLflow: parent run (start, params, description)")
        w(Store, "set_runs_view", "MLflow: runs view")
        w(sweep, "make_tuner", "driver: make_tuner (imports, Optuna study)", last="tuner_made")
        w(tune.Tuner, "fit", "Tune: Tuner.fit (whole)", first="fit_start", last="fit_end")
        w(TuneController, "checkpoint", "Tune: experiment-state saves")
        w(DurableLimiter, "suggest", "Optuna: suggest")
        w(DurableLimiter, "on_trial_complete", "Optuna: on_trial_complete")
        for hook in ("on_trial_start", "on_trial_result", "on_checkpoint", "on_trial_complete", "on_step_begin"):
            w(MLflowTuneCallback, hook, f"MLflow callback: {hook}")
        for hook in ("on_trial_result", "on_trial_complete", "on_step_begin"):
            w(SweepConsole, hook, f"console: {hook}") if hasattr(SweepConsole, hook) else None
        import stabray.tune.callbacks as callbacks
        import stabray.tune.plots as plots

        for op in ("log_metrics", "set_tag", "set_description", "history", "last_step", "log_figure", "log_dict",
                   "log_text", "end", "start_child", "reopen", "find_child"):  # fmt: skip
            w(Store, op, f"MLflow store: {op}")
        w(plots, "trial_curves", "figures: trial curves (drawing)")
        w(callbacks, "log_stability_table", "MLflow callback: eq. (4) table (JSON, CSV, figure)")
        for cls in (JsonLoggerCallback, CSVLoggerCallback):
            for hook in ("on_trial_result", "on_trial_complete", "on_trial_start"):
                w(cls, hook, "Tune: JSON/CSV loggers")


def tree_cpu() -> dict[int, tuple[str, float]]:
    """{pid: (kind, CPU seconds user + system so far)} of this process and each living descendant (the
    driver; Ray's daemons and workers, which a private Ray instance starts as its descendants)."""
    import psutil

    me = psutil.Process()
    out: dict[int, tuple[str, float]] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            argv = p.cmdline()
            name = p.name()
        except psutil.Error:
            continue
        cmd = " ".join(argv)
        if p.pid == me.pid:
            kind = "driver"
        elif "ImplicitFunc" in cmd or "default_worker" in cmd or cmd.startswith("ray::IDLE"):
            kind = "Ray workers (the trials' processes)"
        elif cmd.startswith("ray::"):
            kind = f"Ray: {cmd.split()[0][5:]}"
        else:  # gcs_server, raylet, dashboard.py, log_monitor.py, monitor.py
            kind = "Ray: " + next((Path(a).name for a in argv[:3] if a.endswith(".py")), name)
        out[p.pid] = (kind, t.user + t.system + t.children_user + t.children_system)
    return out


def cpu_by_kind(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each kind of process spent between two `tree_cpu` snapshots."""
    out: dict[str, float] = {}
    for pid, (kind, cpu) in after.items():
        out[kind] = out.get(kind, 0.0) + cpu - (before[pid][1] if pid in before else 0.0)
    return out


class CpuSampler:
    """CPU seconds of every process of the sweep, by kind, from construction to `stop()`. A single
    reading at the end misses processes that ended before it: Tune ends its trial actors when the
    last trial finishes, before `Tuner.fit` returns, so they are read every `every` seconds and each
    process counts with its last reading (at most `every` seconds of a process's CPU can be missed)."""

    def __init__(self, every: float = 1.0):
        import threading

        self.before = tree_cpu()
        self.last = dict(self.before)
        self._done = threading.Event()
        self._every = every
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self._every):
            self.last.update(tree_cpu())

    def stop(self) -> dict[str, float]:
        self._done.set()
        self._thread.join()
        self.last.update(tree_cpu())
        return cpu_by_kind(self.before, self.last)


# -- MLflow logging cost ---------------------------------------------------------------------------
def bench_mlflow(tmp: Path, n: int) -> dict:
    from stabray.tracking import Store

    store = Store(f"sqlite:///{tmp}/mlflow-logging.db", "bench-logging")
    c = store.client
    rid_batch = c.create_run(store.experiment_id).info.run_id
    rid_key = c.create_run(store.experiment_id).info.run_id
    store.log_metrics(rid_batch, EPOCH_RESULT, step=0)  # warm-up (schema, connection)
    for k, v in EPOCH_RESULT.items():
        c.log_metric(rid_key, k, float(v), step=0)
    batch, per_key = [], []
    for i in range(1, n + 1):
        t0 = time.perf_counter()
        store.log_metrics(rid_batch, EPOCH_RESULT, step=i)
        batch.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        now = int(time.time() * 1000)
        for k, v in EPOCH_RESULT.items():
            c.log_metric(rid_key, k, float(v), timestamp=now, step=i)
        per_key.append(time.perf_counter() - t0)
    b, k = median(batch), median(per_key)
    return {
        "keys_per_result": len(EPOCH_RESULT),
        "results": n,
        "log_batch_ms_per_result": 1e3 * b,
        "per_key_ms_per_result": 1e3 * k,
        "per_key_over_batch": k / b,
        "batch_ms": [1e3 * x for x in batch],
        "per_key_ms": [1e3 * x for x in per_key],
    }


def sweep_overrides(args) -> dict:
    over = {
        "search.scheduler": "fifo",
        "search.num_samples": args.trials,
        "search.max_concurrent": args.workers,
        "train.epochs": args.epochs,
        "device": "cpu",
    }
    if args.smoke:
        over.update(SMOKE_OVERRIDES)
    return over


def profile(args, tmp: Path) -> int:
    """One sweep with the profiler on: print where its wall and the CPU time of its processes go."""
    spec, path = load(args.spec, sweep_overrides(args))
    warm_cache(spec)
    load0 = loadavg()
    r = run_stabray(spec, path, tmp, "profile", warm_ray=args.profile == "warm", prof=Profiler())
    pr = r["profile"]
    print(f"\none sweep ({args.profile} Ray), wall {r['wall_s']:.1f} s, load {load0:.1f}-{loadavg():.1f}")
    print("phases (wall s, consecutive):")
    for k, v in pr["phases_s"].items():
        print(f"  {v:7.2f}  {k}")
    w = r["where"]
    print(f"  ({w.get('idle_slot_s', 0):.2f} slot-s idle between trials, {sum(r['trial_s']):.1f} s of trials)")
    print("inside named calls (wall s, calls; nested calls count in both):")
    for k, v in sorted(pr["inside_s"].items(), key=lambda kv: -kv[1]):
        print(f"  {v:7.2f}  {pr['calls'][k]:>4}  {k}")
    print(f"CPU s by process, during the sweep ({r['cpu_s']:.1f} in all):")
    for k, v in sorted(r["cpu_by_kind_s"].items(), key=lambda kv: -kv[1]):
        print(f"  {v:7.2f}  {k}")
    if args.json:
        Path(args.json).write_text(json.dumps({"profile": args.profile, **r, "figures": []}, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny trials (~3 s), 4 of them; 4 logged results")
    p.add_argument("--json", type=json_out, default=None, help="write the results here")
    p.add_argument("--spec", default="dijkstra", help="the sweep spec (default: the laptop sweep)")
    p.add_argument("--epochs", type=positive_int, default=3, help="epochs per trial")
    p.add_argument("--trials", type=positive_int, default=8)
    p.add_argument("--workers", type=positive_int, default=2, help="pool processes = the sweep's max_concurrent")
    p.add_argument(
        "--repeats", type=positive_int, default=5, help="rounds of (cold sweep, warm sweep, pool), order rotating"
    )
    p.add_argument("--no-floor", action="store_true", help="skip the sweep on a pre-started Ray")
    p.add_argument("--mlflow-results", type=positive_int, default=40, help="results logged per MLflow variant")
    p.add_argument("--skip-sweep", action="store_true", help="only the MLflow logging cost")
    p.add_argument(
        "--profile",
        choices=("cold", "warm"),
        default=None,
        help="only one sweep (Ray started in the wall, or before it), timed phase by phase; no figures",
    )
    args = p.parse_args(argv)
    cmd = command(__file__, argv)
    repeats = 1 if args.smoke else args.repeats
    figs = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["STABRAY_CACHE"] = str(tmp / "cache")  # inherited by Ray's and the pool's workers
        if args.profile:
            return profile(args, tmp)
        ml = bench_mlflow(tmp, 4 if args.smoke else args.mlflow_results)
        rounds, configs = [], None
        if not args.skip_sweep:
            spec, path = load(args.spec, sweep_overrides(args))
            warm_cache(spec)
            arms = ["cold", "pool"] + ([] if args.no_floor else ["warm"])
            for r in range(repeats):
                order = arms[r % len(arms) :] + arms[: r % len(arms)]
                if configs is None and order[0] == "pool":  # the pool runs the configs the sweep chose
                    order.remove("cold")
                    order.insert(0, "cold")
                rd = {"order": order}
                for arm in order:
                    t = loadavg()
                    if arm == "pool":
                        rd[arm] = run_pool(configs, args.workers)
                    else:
                        rd[arm] = run_stabray(spec, path, tmp, f"r{r}-{arm}", warm_ray=arm == "warm")
                        cf = rd[arm].pop("configs")
                        configs = configs or cf
                    rd[arm]["load_before"], rd[arm]["load_after"] = t, loadavg()
                    print(f"  repeat {r + 1}/{repeats} {arm:<5} {rd[arm]['wall_s']:7.1f} s (load {t:.1f})", flush=True)
                for arm in ("cold", "warm"):
                    if arm in rd:
                        rd[f"overhead_{arm}"] = rd[arm]["wall_s"] / rd["pool"]["wall_s"] - 1
                rounds.append(rd)

    out = {"smoke": args.smoke, "load_avg_1min": loadavg(), "mlflow": ml, "target_overhead": TARGET}
    if rounds:
        n = len(rounds[0]["pool"]["trial_s"])
        pool_w = [rd["pool"]["wall_s"] for rd in rounds]
        print(
            f"\nsweep overhead: {n} trials x {2 if args.smoke else args.epochs} epochs, {args.workers} at a time, "
            f"{len(rounds)} repeat(s) (median [min-max])"
        )
        print(f"{'':<36} {'wall s':>16} {'sum trial s':>12} {'trials at once':>15} {'best val_acc':>13}")
        for arm, name in (("cold", "stabray (Ray start in the wall)"), ("warm", "stabray (Ray started before)"),
                          ("pool", "process pool")):  # fmt: skip
            if arm not in rounds[0]:
                continue
            w = [rd[arm]["wall_s"] for rd in rounds]
            run = [rd[arm].get("mean_running") or rd[arm].get("where", {}).get("mean_running", 0.0) for rd in rounds]
            print(
                f"{name:<36} {median(w):>7.1f} [{min(w):.0f}-{max(w):.0f}] "
                f"{median(sum(rd[arm]['trial_s']) for rd in rounds):>12.1f} {median(run):>15.2f} "
                f"{median(rd[arm]['best_val_acc'] for rd in rounds):>13.3f}"
            )
        trial_ratios = {
            arm: [sum(rd[arm]["trial_s"]) / sum(rd["pool"]["trial_s"]) for rd in rounds]
            for arm in ("cold", "warm")
            if arm in rounds[0]
        }
        print(
            "per-trial time, sweep / pool (same clock and span): "
            + ", ".join(f"{arm} Ray {median(r):.3f}" for arm, r in trial_ratios.items())
        )
        for arm in ("cold", "warm"):
            if arm not in rounds[0]:
                continue
            trial_ratio = trial_ratios[arm]
            ov = [100 * rd[f"overhead_{arm}"] for rd in rounds]
            where = {k: median(rd[arm]["where"].get(k, 0.0) for rd in rounds) for k in rounds[0][arm]["where"]}
            print(
                f"overhead ({arm} Ray): {median(ov):+.1f}% [{min(ov):+.1f}, {max(ov):+.1f}]; where the wall goes "
                f"(median s): Ray start {where.get('ray_start_s', 0):.1f}, set-up to the first trial "
                f"{where.get('setup_s', 0):.1f}, idle slot-s between trials {where.get('idle_slot_s', 0):.1f}, "
                f"teardown after the last {where.get('teardown_s', 0):.1f}"
            )
            wall = [rd[arm]["wall_s"] for rd in rounds]
            figs.append(
                figure(
                    "sweep_overhead" if arm == "cold" else "sweep_overhead_prestarted_ray",
                    f"sweep overhead, {n} trials x {2 if args.smoke else args.epochs} epochs, 2 at a time: stabray "
                    + ("(Ray started in the wall)" if arm == "cold" else "on a pre-started Ray (the floor)")
                    + " vs a 2-process pool",
                    [100 * (w / b - 1) for w, b in zip(wall, pool_w)],
                    "%",
                    cmd,
                    target=TARGET if arm == "cold" else None,
                    detail=(
                        f"wall {median(wall):.1f} s vs {median(pool_w):.1f} s; Ray start "
                        f"{where.get('ray_start_s', 0):.1f} s, set-up {where.get('setup_s', 0):.1f} s, idle slot-s "
                        f"{where.get('idle_slot_s', 0):.1f}, teardown {where.get('teardown_s', 0):.1f} s; per-trial "
                        f"time sweep/pool {median(trial_ratio):.3f}"
                    ),
                )
            )
        # The same comparison by CPU seconds (every process of each side: driver, Ray's daemons and
        # workers vs the pool's driver and workers): what the sweep adds in work, which another job on
        # the machine slows down but does not add to, unlike the wall.
        pool_c = [rd["pool"]["cpu_s"] for rd in rounds]
        for arm in ("cold", "warm"):
            if arm not in rounds[0]:
                continue
            c = [rd[arm]["cpu_s"] for rd in rounds]
            ov = [100 * (a / b - 1) for a, b in zip(c, pool_c)]
            by = [rd[arm]["cpu_by_kind_s"] for rd in rounds]
            kinds = {k: median(b.get(k, 0.0) for b in by) for k in by[0]}
            big = ", ".join(f"{k} {v:.1f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
            print(
                f"CPU overhead ({arm} Ray): {median(ov):+.1f}% [{min(ov):+.1f}, {max(ov):+.1f}]; CPU s "
                f"{median(c):.1f} vs {median(pool_c):.1f}; by process (median s): {big}"
            )
            figs.append(
                figure(
                    "sweep_overhead_cpu" if arm == "cold" else "sweep_overhead_cpu_prestarted_ray",
                    f"sweep overhead by CPU time, {n} trials x {2 if args.smoke else args.epochs} epochs, 2 at a "
                    "time: stabray "
                    + ("(Ray started in the window)" if arm == "cold" else "on a pre-started Ray")
                    + " vs a 2-process pool, CPU seconds of every process of each side",
                    ov,
                    "%",
                    cmd,
                    detail=f"CPU {median(c):.1f} s vs {median(pool_c):.1f} s; by process (median s): {big}",
                )
            )
        if any(rd["cold"]["errors"] for rd in rounds):
            print(f"trial errors: {[rd['cold']['errors'] for rd in rounds]}")
        out.update(epochs=args.epochs, trials=n, workers=args.workers, rounds=rounds, configs=configs)
    print(f"\nMLflow logging, {ml['keys_per_result']} keys per result, {ml['results']} results each (sqlite):")
    print(f"  Store.log_metrics (log_batch): {ml['log_batch_ms_per_result']:7.1f} ms per result")
    print(
        f"  one log_metric per key:        {ml['per_key_ms_per_result']:7.1f} ms per result "
        f"({ml['per_key_over_batch']:.1f}x)"
    )
    figs.append(
        figure(
            "mlflow_log_batch_ms",
            f"MLflow: one `log_batch` per {ml['keys_per_result']}-key result vs one `log_metric` per key "
            "(ms per result)",
            ml["batch_ms"],
            "ms",
            cmd,
            baselines=ml["per_key_ms"],
            detail=f"{ml['results']} results each, interleaved, sqlite store",
        )
    )
    out["figures"] = figs
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
