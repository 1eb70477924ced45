"""Sweep overhead: an 8-trial sweep through stabray (Ray Tune + Optuna + MLflow, FIFO so every trial
runs every epoch) vs the same 8 configurations in a plain process pool; the same sweep on a Ray
instance started beforehand (the floor: what is left without Ray's start); and the cost per logged
result of MLflow logging (one `log_batch` vs one call per metric key).

    python benchmarks/bench_sweep.py [--smoke] [--json out.json] [--epochs 3] [--repeats 3] [--mlflow-results 40]

The sweep is `sweeps/dijkstra.yaml` (the default laptop sweep) with `search.scheduler=fifo` and
`train.epochs=3` (the trial length the overhead target was set at), run by
`stabray.tune.sweep.run_sweep`: Optuna proposes 8 configurations, 2 run at a time, each reports and
checkpoints every epoch, and the MLflow callback logs every result to a sqlite store. The pool runs
the configurations the sweep ran (the first repeat's), with 2 spawned worker processes (1 torch thread
each, like a Ray trial with 1 CPU), each trial being `make_run(config)`: every epoch, then `final()`,
`best_epoch()` and `final_stability()` (what the trainable computes); no checkpoints, reports or
tracking. Per repeat, three arms in a rotating order: "cold" (the timed wall includes starting a
private local Ray instance with 2 CPUs: run_sweep would otherwise join any Ray already running on the
machine), "warm" (the same, Ray started before the clock: the floor), and the pool. Overhead = arm
wall / pool wall - 1 per repeat; reported: median and range over the repeats (target: cold <= 10%).

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

from common import command, figure, loadavg, median  # noqa: E402

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
    "eval.long_splits": ["test_long"],
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
    load_splits(
        get_task(c.name, **c.params),
        {"train": c.train_size, "val": c.val_size, "test": c.test_size},
        seed=c.data_seed,
        splits=("train", "val", "test", *spec.eval.long_splits),
    )


# -- the plain process pool ----------------------------------------------------------------------
def _pool_init() -> None:
    import torch

    torch.set_num_threads(1)  # a Ray trial with 1 CPU runs with 1 torch thread


def pool_trial(config: dict) -> dict:
    """One trial without Ray or MLflow: what the trainable computes, minus reporting/checkpoints."""
    from stabray.train import make_run

    start = time.time()  # the same clock Ray's time_total_s uses, in the trial's own process
    run = make_run(config)
    while not run.done:
        m = run.epoch()
    m.update(run.final())
    m.update(run.best_epoch())
    m.update(run.final_stability())  # the trainable's end-of-trial work: eq. (4) table, weight noise
    end = time.time()  # = the trainable's last report
    return {"val_acc": m["val_acc"], "best_val_acc": m["best_val_acc"], "trial_s": end - start, "span": (start, end)}


def run_pool(configs: list[dict], workers: int) -> dict:
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers, initializer=_pool_init) as pool:
        res = pool.map(pool_trial, configs, chunksize=1)
    return {
        "wall_s": time.perf_counter() - t0,
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


def run_stabray(spec, path, tmp: Path, tag: str, warm_ray: bool) -> dict:
    """One sweep; `warm_ray`: Ray is started before the clock (the floor), else inside it."""
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
    loggers = sweep.ray_loggers
    sweep.ray_loggers = lambda: [*loggers(), tl]  # the timeline rides along with the sweep's callbacks
    try:
        t0, w0 = time.perf_counter(), time.time()
        if not warm_ray:
            private_ray(spec.search.max_concurrent)
        t_init, w_ray = time.perf_counter() - t0, time.time()
        grid, _ = sweep.run_sweep(spec, path, tracking_uri=uri, storage=str(tmp / f"runs-{tag}"))
        wall, w_end = time.perf_counter() - t0, time.time()
    finally:
        sweep.ray_loggers = loggers
        ray.shutdown()
    return {
        "wall_s": wall,
        "ray_init_s": t_init,
        "new_store_s": t_store,
        "trial_s": [(r.metrics or {}).get("time_total_s", 0.0) for r in grid],
        "best_val_acc": max((r.metrics or {}).get("best_val_acc", 0.0) for r in grid),
        "errors": [str(r.error) for r in grid if r.error],
        "where": where_time_goes(w0, w_ray, w_end, tl, spec.search.max_concurrent),
        "configs": [unwrap(r.config) for r in grid],
    }


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny trials (~3 s), 4 of them; 4 logged results")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--spec", default="dijkstra", help="the sweep spec (default: the laptop sweep)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per trial")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="pool processes = the sweep's max_concurrent")
    p.add_argument("--repeats", type=int, default=3, help="rounds of (cold sweep, warm sweep, pool), order rotating")
    p.add_argument("--no-floor", action="store_true", help="skip the sweep on a pre-started Ray")
    p.add_argument("--mlflow-results", type=int, default=40, help="results logged per MLflow variant")
    p.add_argument("--skip-sweep", action="store_true", help="only the MLflow logging cost")
    args = p.parse_args(argv)
    cmd = command(__file__, argv)
    repeats = 1 if args.smoke else args.repeats
    figs = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["STABRAY_CACHE"] = str(tmp / "cache")  # inherited by Ray's and the pool's workers
        ml = bench_mlflow(tmp, 4 if args.smoke else args.mlflow_results)
        rounds, configs = [], None
        if not args.skip_sweep:
            over = {
                "search.scheduler": "fifo",
                "search.num_samples": args.trials,
                "search.max_concurrent": args.workers,
                "train.epochs": args.epochs,
                "device": "cpu",
            }
            if args.smoke:
                over.update(SMOKE_OVERRIDES)
            spec, path = load(args.spec, over)
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
        trial_ratio = [sum(rd["cold"]["trial_s"]) / sum(rd["pool"]["trial_s"]) for rd in rounds]
        print(f"per-trial time, sweep / pool (same clock and span): {median(trial_ratio):.3f}")
        for arm in ("cold", "warm"):
            if arm not in rounds[0]:
                continue
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
