"""EAF-aware stopping: the laptop Dijkstra sweep with and without `search.eaf_stop`, same budget.

    python benchmarks/bench_eaf_stop.py [--smoke] [--json out.json] [--seeds 0 1 2] [--num-samples 6] [--epochs 6]

Both arms run `stabray.tune.sweep.run_sweep` on `sweeps/dijkstra.yaml` with FIFO scheduling (so the
EAF rule is the only thing that stops trials; ASHA would stop trials in both arms), the same
`--num-samples` trials of up to `--epochs` epochs, 2 at a time, Optuna TPE seeded with the sweep's
seed, which is also every trial's training seed. One sweep per arm and seed, interleaved (off, on,
off, on, ...). Per sweep: trial-epochs run (budget = num_samples x epochs), trial-epochs saved (the
budget minus those run), trials stopped, best validation accuracy reached (any trial, any epoch),
the best finished trial's test accuracy, wall time. Summary: mean ± sample std over seeds.
`--smoke`: tiny model and data, 3 trials of 2 epochs, one seed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_sweep import SMOKE_OVERRIDES, load, private_ray, warm_cache  # noqa: E402
from common import command, figure, json_out, positive_int  # noqa: E402

EAF_STOP = {"factor": 3.0, "top_fraction": 0.25, "grace": 2, "min_trials": 3}  # the spec defaults


def run_arm(spec, path, tmp: Path, tag: str) -> dict:
    import ray

    from stabray.tune.sweep import run_sweep

    t0 = time.perf_counter()
    private_ray(spec.search.max_concurrent)
    uri = f"sqlite:///{tmp}/mlflow-{tag}.db"
    grid, info = run_sweep(spec, path, tracking_uri=uri, storage=str(tmp / f"runs-{tag}"))
    wall = time.perf_counter() - t0
    ray.shutdown()
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(info["experiment"]).experiment_id], max_results=500)
    stopped_by = dict(Counter(r.data.tags["stabray.stopped_by"] for r in runs if "stabray.stopped_by" in r.data.tags))
    trials = []
    for r in grid:
        df = r.metrics_dataframe
        if df is None or not len(df):
            continue
        last = r.metrics or {}
        trials.append(
            {
                "bits": r.config["method"]["params"].get("bits"),
                "lam": r.config["method"]["params"].get("lam"),
                "epochs": int(df["training_iteration"].max()),
                "best_val_acc": float(df["val_acc"].max()),
                "max_eaf": float(df["val_eaf"].max()) if "val_eaf" in df else None,
                "test_acc": last.get("test_acc"),
            }
        )
    budget = spec.search.num_samples * spec.train.epochs
    run = sum(t["epochs"] for t in trials)
    finished = [t for t in trials if t["test_acc"] is not None]
    best_fin = max(finished, key=lambda t: t["best_val_acc"]) if finished else None
    return {
        "wall_s": wall,
        "trials": len(trials),
        "stopped": len(trials) - len(finished),
        "stopped_by": stopped_by,  # the MLflow tag stabray.stopped_by of each stopped trial, counted
        "trial_epochs": run,
        "saved": budget - run,
        "best_val_acc": max((t["best_val_acc"] for t in trials), default=0.0),
        "best_test_acc": best_fin["test_acc"] if best_fin else None,
        "per_trial": trials,
    }


def mean_std(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):.3f} ± {sd:.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny model/data, 3 trials of 2 epochs, one seed")
    p.add_argument("--json", type=json_out, default=None, help="write the results here")
    p.add_argument("--spec", default="dijkstra")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--num-samples", type=positive_int, default=6)
    p.add_argument("--epochs", type=positive_int, default=6)
    args = p.parse_args(argv)
    seeds, n, epochs = ([0], 3, 2) if args.smoke else (args.seeds, args.num_samples, args.epochs)
    base = {
        "train.epochs": epochs,
        "device": "cpu",
        "search.max_concurrent": 2,
        "search.num_samples": n,
        "search.scheduler": "fifo",
    }
    if args.smoke:
        base.update({k: v for k, v in SMOKE_OVERRIDES.items() if not k.startswith("search.")})
    out: dict[str, list[dict]] = {"off": [], "eaf_stop": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["STABRAY_CACHE"] = str(tmp / "cache")
        for seed in seeds:
            for arm in out:
                over = {**base, "seed": seed, **({"search.eaf_stop": dict(EAF_STOP)} if arm == "eaf_stop" else {})}
                spec, path = load(args.spec, over)
                warm_cache(spec)
                r = run_arm(spec, path, tmp, f"{arm}-s{seed}")
                r["seed"] = seed
                out[arm].append(r)
                print(
                    f"seed {seed} {arm:<8}: {r['trial_epochs']} trial-epochs ({r['stopped']} stopped: "
                    f"{r['stopped_by']}), best val_acc "
                    f"{r['best_val_acc']:.3f}, best finished test_acc {r['best_test_acc']}, {r['wall_s']:.0f} s",
                    flush=True,
                )
    load_avg = os.getloadavg()[0]
    print(
        f"\n{args.spec}: {n} trials x {epochs} epochs = {n * epochs} trial-epochs per sweep, FIFO, 2 at a time; "
        f"seeds {seeds}; eaf_stop {EAF_STOP}; load avg {load_avg:.1f}"
    )
    head = ("arm", "trial-epochs saved", "stopped", "best val_acc", "best test_acc", "wall s")
    print(f"{head[0]:<9} {head[1]:>20} {head[2]:>14} {head[3]:>16} {head[4]:>16} {head[5]:>8}")
    for arm, rs in out.items():
        print(
            f"{arm:<9} {mean_std([r['saved'] for r in rs]):>20} {mean_std([r['stopped'] for r in rs]):>14} "
            f"{mean_std([r['best_val_acc'] for r in rs]):>16} {mean_std([r['best_test_acc'] for r in rs]):>16} "
            f"{statistics.mean(r['wall_s'] for r in rs):>8.0f}"
        )
    cmd = command(__file__, argv)
    on, off = out["eaf_stop"], out["off"]
    what = f"{n} trials x {epochs} epochs, FIFO"
    figs = [
        figure("eaf_stop_trial_epochs_saved", f"EAF-aware stopping: trial-epochs saved of {n * epochs} ({what})",
               [float(r["saved"]) for r in on], "trial-epochs", cmd,
               detail=f"trials stopped per seed: {', '.join(str(r['stopped']) for r in on)}"),
        figure("eaf_stop_best_test_acc", f"EAF-aware stopping: best finished trial's test accuracy, on vs off ({what})",
               [r["best_test_acc"] for r in on], "acc", cmd, baselines=[r["best_test_acc"] for r in off],
               compare="difference", detail=f"seeds {', '.join(map(str, seeds))}, each arm with the same seed"),
        figure("eaf_stop_wall", f"EAF-aware stopping: sweep wall time, on / off ({what})",
               [r["wall_s"] for r in on], "s", cmd, baselines=[r["wall_s"] for r in off]),
    ]  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "figures": figs,
                    "smoke": args.smoke,
                    "num_samples": n,
                    "epochs": epochs,
                    "seeds": seeds,
                    "eaf_stop": EAF_STOP,
                    "load_avg_1min": load_avg,
                    "arms": out,
                },
                indent=2,
            )  # fmt: skip
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
