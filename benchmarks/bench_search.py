"""Search efficiency: ASHA + Optuna (stabray's default) vs random search with FIFO on the default
Dijkstra space (lam x bits x lr of `sweeps/dijkstra.yaml`), at an equal budget of trial-epochs.

    python benchmarks/bench_search.py [--smoke] [--json out.json] [--epochs 4] [--grace 1] [--budget 16] [--repeats 3]

Both arms run `stabray.tune.sweep.run_sweep` on the laptop sweep with `train.epochs=E`, 2 trials at a
time, and the same budget B of trial-epochs, enforced by construction: a Tune stopper ends the whole
sweep once B epochs have been reported in all (random + FIFO gets B / E trials, so it ends exactly
then; ASHA + Optuna gets as many trials as it can start and uses the same B epochs however it
promotes). Only the first B reported epochs count. Each arm then selects a configuration on
validation: the trial with the best val_acc at its last reported epoch (the epoch of its last
checkpoint), and is scored on the *test* split: that checkpoint's test accuracy, evaluated here.
`--repeats` rounds with seeds 0, 1, ... (the spec's seed: Optuna's sampler and the training seeds),
the arms' order alternating; reported: median and range of each arm's test accuracy.
`--smoke`: tiny model and data, E = 2, B = 4, one round.
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
from common import command, figure, json_out, loadavg, positive_int  # noqa: E402


def expected_epochs(epochs: int, grace: int, rf: int = 2) -> float:
    """Mean epochs per trial when ASHA keeps 1/rf of the trials at every rung (g, g*rf, ... < E)."""
    total, t, share, prev = 0.0, grace, 1.0, 0
    while t < epochs:
        total += share * (t - prev)
        prev, share, t = t, share / rf, t * rf
    return total + share * (epochs - prev)


def budget_stopper(budget: int):
    """A Tune stopper that ends the whole sweep once `budget` epochs have been reported in all."""
    from ray.tune import Stopper

    class Budget(Stopper):
        def __init__(self):
            self.seen = set()  # (trial, epoch): Tune may ask about one result more than once

        def __call__(self, trial_id, result):
            self.seen.add((trial_id, result.get("training_iteration")))
            return False

        def stop_all(self):
            return len(self.seen) >= budget

    return Budget()


def select_and_test(grid, budget: int, smoke: bool) -> dict:
    """The arm's choice on validation (best val_acc at a trial's last reported epoch, among the first
    `budget` reported epochs) and that checkpoint's test accuracy."""
    from stabray.train import load_run

    rows = []
    for r in grid:
        df = r.metrics_dataframe
        if df is None or not len(df):
            continue
        for _, row in df.iterrows():
            rows.append((float(row["timestamp"]), float(row.get("time_total_s", 0.0)), r, row))
    rows.sort(key=lambda x: (x[0], x[1]))
    counted = rows[:budget]
    last = {}
    for _, _, r, row in counted:
        last[id(r)] = (r, row)  # the trial's last counted epoch
    trials = [
        {
            "lam": row.get("config/method/params/lam"),
            "bits": row.get("config/method/params/bits"),
            "lr": row.get("config/train/lr"),
            "epochs": int(row["training_iteration"]),
            "val_acc": float(row["val_acc"]),
            "result": r,
        }
        for r, row in last.values()
    ]
    best = max(trials, key=lambda t: t["val_acc"])
    res = best.pop("result")
    ckpt = res.checkpoint
    with ckpt.as_directory() as d:
        run = load_run(d)
        best["checkpoint_epoch"] = run.epochs_done
        best["test_acc"] = run.evaluate("test").acc
    for t in trials:
        t.pop("result", None)
    return {"trial_epochs": len(counted), "reported_epochs": len(rows), "trials": len(trials), "best": best}


def run_arm(spec, path, tmp: Path, tag: str, budget: int, smoke: bool) -> dict:
    import ray

    import stabray.tune.sweep as sweep

    stopper = budget_stopper(budget)
    orig = sweep.tune.RunConfig

    class Budgeted(orig):  # the sweep's own RunConfig, plus the budget
        def __init__(self, *a, **k):
            super().__init__(*a, **{**k, "stop": stopper})

    sweep.tune.RunConfig = Budgeted
    t0 = time.perf_counter()
    try:
        private_ray(spec.search.max_concurrent)
        grid, _ = sweep.run_sweep(
            spec, path, tracking_uri=f"sqlite:///{tmp}/mlflow-{tag}.db", storage=str(tmp / f"runs-{tag}")
        )
        wall = time.perf_counter() - t0
        out = select_and_test(grid, budget, smoke)
    finally:
        sweep.tune.RunConfig = orig
        ray.shutdown()
    out["wall_s"] = wall
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny model/data, 2 epochs, budget 4 trial-epochs, 1 round")
    p.add_argument("--json", type=json_out, default=None, help="write the results here")
    p.add_argument("--spec", default="dijkstra")
    p.add_argument("--epochs", type=positive_int, default=4, help="max epochs per trial (ASHA's max_t)")
    p.add_argument("--grace", type=positive_int, default=1, help="ASHA grace period (epochs)")
    p.add_argument("--budget", type=positive_int, default=16, help="trial-epochs per arm (a multiple of --epochs)")
    p.add_argument("--repeats", type=positive_int, default=3, help="rounds, seeds 0, 1, ...")
    args = p.parse_args(argv)
    epochs, grace, budget, repeats = (
        (2, 1, 4, 1) if args.smoke else (args.epochs, args.grace, args.budget, args.repeats)
    )
    if budget % epochs:
        p.error(f"--budget {budget} is not a multiple of --epochs {epochs}")
    cmd = command(__file__, argv)
    base = {"train.epochs": epochs, "device": "cpu", "search.max_concurrent": 2, "search.grace_period": grace}
    if args.smoke:
        base.update({k: v for k, v in SMOKE_OVERRIDES.items() if not k.startswith("search.")})
    arms = {
        "asha+optuna": {"search.scheduler": "asha", "search.searcher": "optuna", "search.num_samples": budget},
        "random+fifo": {
            "search.scheduler": "fifo",
            "search.searcher": "random",
            "search.num_samples": budget // epochs,
        },
    }
    rounds = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["STABRAY_CACHE"] = str(tmp / "cache")
        for r in range(repeats):
            names = list(arms) if r % 2 == 0 else list(reversed(arms))
            rd = {}
            for name in names:
                spec, path = load(args.spec, {**base, **arms[name], "seed": r})
                warm_cache(spec)
                t = loadavg()
                rd[name] = run_arm(spec, path, tmp, f"{name.replace('+', '-')}-r{r}", budget, args.smoke)
                rd[name]["load_before"], rd[name]["load_after"] = t, loadavg()
                b = rd[name]["best"]
                print(
                    f"  seed {r} {name:<12} {rd[name]['trials']} trials, {rd[name]['trial_epochs']} trial-epochs "
                    f"counted ({rd[name]['reported_epochs']} reported), selected (lam {b['lam']}, bits {b['bits']}, "
                    f"lr {b['lr']:.2e}) val_acc {b['val_acc']:.3f} -> test_acc {b['test_acc']:.3f}; "
                    f"{rd[name]['wall_s']:.0f} s",
                    flush=True,
                )
            rounds.append(rd)
    acc = {a: [rd[a]["best"]["test_acc"] for rd in rounds] for a in arms}
    figs = [
        figure(
            "search_asha_vs_random_test_acc",
            f"search at an equal budget of {budget} trial-epochs (E = {epochs}): test accuracy of the configuration "
            "each arm selects on validation, ASHA + Optuna vs random + FIFO",
            acc["asha+optuna"],
            "acc",
            cmd,
            baselines=acc["random+fifo"],
            compare="difference",
            detail=f"{repeats} seeds; ASHA "
            + ", ".join(f"{x:.3f}" for x in acc["asha+optuna"])
            + "; random "
            + ", ".join(f"{x:.3f}" for x in acc["random+fifo"]),
        )
    ]
    print(f"\nsearch at an equal budget of {budget} trial-epochs (E = {epochs}, ASHA grace {grace}), {repeats} seeds")
    for a in arms:
        print(f"  {a:<12} test_acc of the selected configuration: {', '.join(f'{x:.3f}' for x in acc[a])}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "smoke": args.smoke,
                    "epochs": epochs,
                    "grace": grace,
                    "budget_trial_epochs": budget,
                    "rounds": rounds,
                    "figures": figs,
                },  # fmt: skip
                indent=2,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
