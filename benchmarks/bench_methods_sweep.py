"""A multi-method sweep's wall time: all methods in one Ray Tune run vs one run per method.

`python -m stabray sweep dijkstra_methods` trains 6 methods x 3 seeds, 2 trials at a time, every
trial to the end (a grid, FIFO). Run one method after another (one Tuner per method, how every
multi-method sweep ran before), each method's third seed trains alone: one of the 2 slots idles in
every method's second round, 12 rounds of trials where 9 would do. A sweep whose methods are
all grids now runs them in one Tuner (`stabray.tune.sweep.one_tuner`), so the next method's trials
fill the free slot.

    python benchmarks/bench_methods_sweep.py [--smoke] [--json out.json] [--repeats 2] [--epochs 2]

Both arms run the same command in a subprocess (a private local Ray instance, `--address local`,
their own MLflow store, one dataset cache made before the clock), interleaved per repeat in a
rotating order; the "per method" arm is the same command with `one_tuner` answering False. The
spec is `dijkstra_methods` at `--epochs` epochs (default 2, with 500 training graphs per epoch: the
18 trials then take minutes, not the full sweep's 23), so the figure is the scheduling effect at
equal trials, not the full sweep's wall time. Reported: wall ratio one Tuner / per method, median
and range over the repeats (target <= 0.85; 9 / 12 rounds = 0.75 if every trial took as long).
`--smoke`: tiny model and data, 2 methods x 3 seeds, 1 repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import command, figure, json_out, loadavg, median, positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOKE_SETS = [
    "task.train_size=48",
    "task.val_size=8",
    "task.test_size=8",
    "model.preset=tiny",
    "eval.eaf_examples=2",
    "eval.decomposition_examples=0",
    "eval.weight_noise_seeds=0",
]
# the per-method arm: the same CLI with the one-Tuner layout switched off
PER_METHOD = (
    "import sys, stabray.tune.sweep as s; s.one_tuner = lambda subs: False; "
    "from stabray.cli import main; sys.exit(main(sys.argv[1:]))"
)


def run_arm(arm: str, sets: list[str], tmp: Path, cache: Path) -> dict:
    env = {**os.environ, "STABRAY_CACHE": str(cache), "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    env.pop("MLFLOW_TRACKING_URI", None)
    head = [sys.executable, "-m", "stabray"] if arm == "one_tuner" else [sys.executable, "-c", PER_METHOD]
    cmd = [*head, "sweep", "dijkstra_methods", "--address", "local", "--tracking-uri",
           f"sqlite:///{tmp}/{arm}.db", "--storage", str(tmp / f"runs_{arm}")]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode:
        raise SystemExit(f"the {arm} sweep failed ({res.returncode}):\n{(res.stdout + res.stderr)[-4000:]}")
    trials = [line for line in res.stdout.splitlines() if " trials (" in line and "failed)" in line]
    return {"wall_s": wall, "summary": trials[-1].strip() if trials else "", "tail": res.stdout[-1500:]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny model and data, 2 methods, 1 repeat")
    p.add_argument("--json", type=json_out, default=None)
    p.add_argument("--repeats", type=positive_int, default=2)
    p.add_argument("--epochs", type=positive_int, default=2)
    args = p.parse_args(argv)
    if args.smoke:
        sets = [*SMOKE_SETS, "train.epochs=1", "methods=[sft_cot, no_cot]"]
        repeats = 1
    else:
        sets, repeats = [f"train.epochs={args.epochs}", "task.train_size=500"], args.repeats
    cmd = command(__file__, argv)
    arms = ["one_tuner", "per_method"]
    runs: dict[str, list[dict]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as d:
        cache = Path(d) / "cache"
        warm = run_arm("one_tuner", [*sets, "search.space.seed={choice: [0]}", "methods=[no_cot]"], Path(d), cache)
        print(f"  warm-up (dataset cache, imports): {warm['wall_s']:.0f} s", flush=True)
        for r in range(repeats):
            for arm in arms[r % 2 :] + arms[: r % 2]:  # rotating order
                with tempfile.TemporaryDirectory(dir=d) as t:
                    load = loadavg()
                    x = run_arm(arm, sets, Path(t), cache)
                    x["load_before"], x["load_after"] = load, loadavg()
                    runs[arm].append(x)
                    print(f"  repeat {r + 1}/{repeats} {arm:10s}: {x['wall_s']:.0f} s  [{x['summary']}]", flush=True)
    one, per = [x["wall_s"] for x in runs["one_tuner"]], [x["wall_s"] for x in runs["per_method"]]
    what = "`python -m stabray sweep dijkstra_methods`" + (
        " (smoke settings: 2 methods)" if args.smoke else f" at {args.epochs} epochs of 500 graphs (18 trials)"
    )
    figs = [
        figure("methods_sweep_one_tuner", f"{what}: wall time, all methods in one Tuner vs one Tuner per method",
               [w / 60 for w in one], "min", cmd, baselines=[w / 60 for w in per], target="<= 0.85"),
    ]  # fmt: skip
    print(
        f"methods sweep: one Tuner {median(one) / 60:.2f} min, per method {median(per) / 60:.2f} min, "
        f"ratio {figs[0]['ratio']:.2f} [{figs[0]['min']:.2f}, {figs[0]['max']:.2f}] over {len(one)} repeats"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"smoke": args.smoke, "runs": runs, "figures": figs}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
