"""The default sweep end to end, as a user runs it: `python -m stabray sweep dijkstra` (8 trials of up
to 12 epochs, ASHA + Optuna, 2 at a time) in a subprocess, on a private local Ray instance
(`--address local`), a fresh MLflow store and a fresh dataset cache (a user's first sweep: data
generation and MLflow's schema set-up included).

    python benchmarks/bench_default_sweep.py [--smoke] [--json out.json] [--repeats 3]

Reported per repeat: wall time of the command, peak resident memory of its whole process tree (the
driver, Ray's processes and the trial workers, summed, sampled every 0.5 s), and the best test
accuracy of the sweep's finished trials against the best of the task's trivial rules on the same
test split. Median and range over `--repeats` runs. `--smoke`: tiny model and data, 2 trials.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import command, figure, json_out, loadavg, median, positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOKE_SETS = [
    "task.train_size=64",
    "task.val_size=16",
    "task.test_size=16",
    "model.preset=tiny",
    "train.epochs=2",
    "search.num_samples=2",
    "search.grace_period=1",
    "eval.decomposition_examples=0",
    "eval.weight_noise_seeds=0",
]


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_once(spec: str, sets: list[str], tmp: Path) -> dict:
    env = {**os.environ, "STABRAY_CACHE": str(tmp / "cache"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "stabray", "sweep", spec, "--address", "local", "--tracking-uri",
           f"sqlite:///{tmp}/mlflow.db", "--storage", str(tmp / "runs")]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    peak = [0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.5)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - t0
    th.join()
    if proc.returncode:
        raise SystemExit(f"the sweep failed ({proc.returncode}):\n{out[-4000:]}")
    return {"wall_s": wall, "peak_rss_gb": peak[0] / 1e9, "output_tail": out[-3000:], **scores(spec, sets, tmp)}


def scores(spec_name: str, sets: list[str], tmp: Path) -> dict:
    """Best test_acc of the sweep's trials (MLflow) and the task's trivial rules on the same split."""
    from mlflow.tracking import MlflowClient

    from stabray.spec import load_spec
    from stabray.tune.summary import baselines

    overrides = {}
    for s in sets:
        k, v = s.split("=", 1)
        overrides[k] = json.loads(v) if v[:1] in "0123456789[{-" else v
    spec, _ = load_spec(spec_name, overrides)
    os.environ["STABRAY_CACHE"] = str(tmp / "cache")
    from stabray.record import acc_metric

    trivial = baselines(spec)  # {split: {rule: accuracy}} on the sweep's test splits
    c = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    exp = c.get_experiment_by_name(spec.mlflow.experiment or spec.name)
    runs = c.search_runs([exp.experiment_id], "metrics.test_acc >= 0", max_results=1000)
    best = max(runs, key=lambda r: r.data.metrics["test_acc"]) if runs else None
    return {
        "best_test_acc": best.data.metrics["test_acc"] if best else 0.0,
        "best_trial": best.info.run_name if best else None,
        "finished_trials": len(runs),
        "trivial": trivial,
        "best_trivial": max(trivial.get("test", {}).values(), default=0.0),
        # the larger inputs: every finished trial's best accuracy there, beside the split's best rule
        "long": {
            acc_metric(split): {
                "best": max((r.data.metrics.get(acc_metric(split), 0.0) for r in runs), default=0.0),
                "best_trivial": max(rules.values(), default=0.0),
            }
            for split, rules in trivial.items()
            if split != "test"
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny model and data, 2 trials, 1 run")
    p.add_argument("--json", type=json_out, default=None)
    p.add_argument("--spec", default="dijkstra")
    p.add_argument("--repeats", type=positive_int, default=3)
    args = p.parse_args(argv)
    sets, repeats = (SMOKE_SETS, 1) if args.smoke else ([], args.repeats)
    cmd = command(__file__, argv)
    runs = []
    for r in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            t = loadavg()
            x = run_once(args.spec, sets, Path(d))
            x["load_before"], x["load_after"] = t, loadavg()
            runs.append(x)
            print(
                f"  run {r + 1}/{repeats}: {x['wall_s']:.0f} s, peak RSS {x['peak_rss_gb']:.2f} GB, best test_acc "
                f"{x['best_test_acc']:.3f} ({x['best_trial']}, {x['finished_trials']} finished) vs trivial "
                f"{x['best_trivial']:.3f}; load {t:.1f} -> {x['load_after']:.1f}",
                flush=True,
            )
    what = f"`python -m stabray sweep {args.spec}`" + (" (smoke settings)" if args.smoke else "")
    figs = [
        figure("default_sweep_wall", f"{what}: wall time, first sweep (data and store created)",
               [x["wall_s"] / 60 for x in runs], "min", cmd),
        figure("default_sweep_peak_rss", f"{what}: peak resident memory of the process tree (summed over processes)",
               [x["peak_rss_gb"] for x in runs], "GB", cmd),
        figure("default_sweep_best_test_acc", f"{what}: best test accuracy of a finished trial vs best trivial rule",
               [x["best_test_acc"] for x in runs], "acc", cmd, baselines=[x["best_trivial"] for x in runs],
               compare="difference", target="> 0",
               detail="trivial rules: " + ", ".join(f"{k} {v:.3f}" for k, v in runs[0]["trivial"]["test"].items())),
    ]  # fmt: skip
    for metric in runs[0]["long"]:  # inputs larger than any training input (length generalization)
        figs.append(figure(
            f"default_sweep_best_{metric}", f"{what}: best {metric} of a finished trial vs best trivial rule",
            [x["long"][metric]["best"] for x in runs], "acc", cmd,
            baselines=[x["long"][metric]["best_trivial"] for x in runs], compare="difference",
        ))  # fmt: skip
    print(
        f"default sweep: wall {median(x['wall_s'] for x in runs) / 60:.1f} min, peak RSS "
        f"{median(x['peak_rss_gb'] for x in runs):.2f} GB, best test_acc {figs[2]['value']:.3f} vs trivial "
        f"{figs[2]['baseline']:.3f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"smoke": args.smoke, "runs": runs, "figures": figs}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
