"""The laptop calibration: why the default profile uses 4-node graphs. The default sweep's trial
(`sweeps/dijkstra.yaml`: embedded `mini` decoder from scratch, a fresh split of 1,000 graphs every
epoch, batch 16, lr 3e-3, cosine) at full precision and full chain (alg1 at λ = 1, 32 bits), trained
with the trainer directly (`make_run`, one thread, no Ray) for `--epochs` epochs at 4 nodes and at 5
nodes; validation accuracy at the end against the best trivial rule on the same validation split.

    python benchmarks/bench_calibrate.py [--smoke] [--json out.json] [--epochs 12] [--seeds 3]

The two sizes run interleaved per training seed (0, 1, ...); reported per size: median and range of
the final val_acc over seeds, the margin over the trivial rule, and the training wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_tracking import trial_config  # noqa: E402
from common import command, figure, loadavg, median  # noqa: E402


def train(nodes: int, epochs: int, seed: int, over: dict) -> dict:
    from stabray.train import make_run

    cfg = trial_config("dijkstra", {"task.params.n_nodes": nodes, "train.epochs": epochs, **over}, seed=seed)
    cfg["method"]["params"].update(lam=1.0, bits=32)
    cfg["eval"]["eaf_examples"] = 0  # accuracy only: the calibration asks whether the model learns the task
    t0 = time.perf_counter()
    run = make_run(cfg)
    while not run.done:
        m = run.epoch()
    wall = time.perf_counter() - t0
    trivial = run.task.baseline_accuracy(run.data["val"]) if run.task.trivial_baselines() else {}
    return {"val_acc": m["val_acc"], "wall_s": wall, "trivial": trivial, "best_trivial": max(trivial.values())}


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny data, 1 epoch, 1 seed")
    p.add_argument("--json", default=None)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="*", default=[4, 5], help="graph sizes (nodes)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    epochs, seeds = (1, 1) if args.smoke else (args.epochs, args.seeds)
    over = {"task.train_size": 64, "task.val_size": 16, "task.test_size": 16} if args.smoke else {}
    cmd = command(__file__, argv)
    res = {n: [] for n in args.sizes}
    for s in range(seeds):
        for n in args.sizes if s % 2 == 0 else list(reversed(args.sizes)):
            t = loadavg()
            r = train(n, epochs, s, over)
            r["load_before"], r["load_after"] = t, loadavg()
            res[n].append(r)
            print(
                f"  {n} nodes, seed {s}: val_acc {r['val_acc']:.3f} after {epochs} epochs ({r['wall_s']:.0f} s) vs "
                f"trivial {r['best_trivial']:.3f}; load {t:.1f}",
                flush=True,
            )
    figs = []
    for n, rs in res.items():
        figs.append(
            figure(
                f"calibration_val_acc_{n}_nodes",
                f"calibration: val_acc after {epochs} epochs at {n} nodes (default trial, λ 1, 32 bits) vs the best "
                "trivial rule",
                [r["val_acc"] for r in rs],
                "acc",
                cmd,
                baselines=[r["best_trivial"] for r in rs],
                compare="difference",
                detail=f"{len(rs)} seeds; training {median(r['wall_s'] for r in rs):.0f} s "
                f"[{min(r['wall_s'] for r in rs):.0f}-{max(r['wall_s'] for r in rs):.0f}]",
            )
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"smoke": args.smoke, "epochs": epochs, "runs": {str(k): v for k, v in res.items()}, "figures": figs},
                indent=2,
            )  # fmt: skip
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
