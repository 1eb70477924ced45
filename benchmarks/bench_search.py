"""Search efficiency: ASHA + Optuna (stabray's default) vs random search with FIFO on the default
Dijkstra space (lam x bits x lr of `sweeps/dijkstra.yaml`), at an equal budget of trial-epochs.

    python benchmarks/bench_search.py [--smoke] [--json out.json] [--epochs 4] [--grace 1] [--random-trials 4]

Both arms run `stabray.tune.sweep.run_sweep` on the laptop sweep with `train.epochs=E`, 2 trials at
a time. Random + FIFO runs `--random-trials` trials to the end: budget B = trials x E. ASHA + Optuna
(grace period g, reduction factor 2, max_t E) gets as many trials as fit B when ASHA stops trials at
the rate it is designed for (half at each rung), B / (expected epochs per trial); since ASHA is
asynchronous, the trial-epochs it really uses are counted and printed next to B. Reported per arm:
best validation accuracy reached (any trial, any epoch), trial-epochs used, wall time. `--smoke`:
tiny model and data, E = 2, g = 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_sweep import SMOKE_OVERRIDES, load, private_ray, warm_cache  # noqa: E402


def expected_epochs(epochs: int, grace: int, rf: int = 2) -> float:
    """Mean epochs per trial when ASHA keeps 1/rf of the trials at every rung (g, g*rf, ... < E)."""
    total, t, share, prev = 0.0, grace, 1.0, 0
    while t < epochs:
        total += share * (t - prev)
        prev, share, t = t, share / rf, t * rf
    return total + share * (epochs - prev)


def run_arm(spec, path, tmp: Path, tag: str) -> dict:
    import ray

    from stabray.tune.sweep import run_sweep

    t0 = time.perf_counter()
    private_ray(spec.search.max_concurrent)
    grid, _ = run_sweep(spec, path, tracking_uri=f"sqlite:///{tmp}/mlflow-{tag}.db", storage=str(tmp / f"runs-{tag}"))
    wall = time.perf_counter() - t0
    ray.shutdown()
    trials = []
    for r in grid:
        df = r.metrics_dataframe
        if df is None or not len(df):
            continue
        p = r.config["method"]["params"]
        trials.append(
            {
                "lam": p.get("lam"),
                "bits": p.get("bits"),
                "lr": r.config["train"]["lr"],
                "epochs": int(df["training_iteration"].max()),
                "best_val_acc": float(df["val_acc"].max()),
            }
        )
    best = max(trials, key=lambda t: t["best_val_acc"]) if trials else {}
    return {
        "wall_s": wall,
        "trials": len(trials),
        "trial_epochs": sum(t["epochs"] for t in trials),
        "best_val_acc": best.get("best_val_acc", 0.0),
        "best": best,
        "per_trial": trials,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny model/data, 2 epochs, budget 4 trial-epochs")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--spec", default="dijkstra")
    p.add_argument("--epochs", type=int, default=4, help="max epochs per trial (ASHA's max_t)")
    p.add_argument("--grace", type=int, default=1, help="ASHA grace period (epochs)")
    p.add_argument("--random-trials", type=int, default=4, help="random + FIFO trials (budget = this x epochs)")
    args = p.parse_args(argv)
    epochs, grace, n_random = (2, 1, 2) if args.smoke else (args.epochs, args.grace, args.random_trials)
    budget = n_random * epochs
    n_asha = max(1, round(budget / expected_epochs(epochs, grace)))
    base = {"train.epochs": epochs, "device": "cpu", "search.max_concurrent": 2, "search.grace_period": grace}
    if args.smoke:
        base.update({k: v for k, v in SMOKE_OVERRIDES.items() if not k.startswith("search.")})
    arms = {
        "asha+optuna": {**base, "search.scheduler": "asha", "search.searcher": "optuna", "search.num_samples": n_asha},
        "random+fifo": {
            **base,
            "search.scheduler": "fifo",
            "search.searcher": "random",
            "search.num_samples": n_random,
        },
    }
    out = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["STABRAY_CACHE"] = str(tmp / "cache")
        for name, over in arms.items():
            spec, path = load(args.spec, over)
            warm_cache(spec)
            out[name] = run_arm(spec, path, tmp, name.replace("+", "-"))
    load_avg = os.getloadavg()[0]
    print(
        f"\nsearch at an equal budget of {budget} trial-epochs (E = {epochs}, ASHA grace {grace}, "
        f"2 trials at a time), load avg {load_avg:.1f}"
    )
    print(f"{'arm':<12} {'trials':>6} {'trial-epochs':>12} {'wall s':>8} {'best val_acc':>13}  best (lam, bits, lr)")
    for name, r in out.items():
        b = r["best"]
        cfg = f"({b.get('lam')}, {b.get('bits')}, {b.get('lr', 0):.2e})" if b else "-"
        print(
            f"{name:<12} {r['trials']:>6} {r['trial_epochs']:>12} {r['wall_s']:>8.1f} {r['best_val_acc']:>13.3f}  {cfg}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "smoke": args.smoke,
                    "epochs": epochs,
                    "grace": grace,
                    "budget_trial_epochs": budget,
                    "asha_trials": n_asha,
                    "load_avg_1min": load_avg,
                    "arms": out,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
