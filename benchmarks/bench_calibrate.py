"""The laptop calibration: what the default profile learns, and why it mixes graph sizes. The default
sweep's trial (`sweeps/dijkstra.yaml`: embedded `mini` decoder from scratch, init std 0.1, a fresh
split of 2,000 graphs every epoch, batch 16, lr 3e-3, cosine) at full precision and full chain (alg1
at λ = 1, 32 bits), trained with the trainer directly (`make_run`, one thread, no Ray) for `--epochs`
epochs in two arms: trained on the default mix of 3- and 4-node graphs, and on 4-node graphs only;
both then tested in distribution (validation split) and at 5 and 6 nodes (`test_acc_n5`,
`test_acc_n6`), each against the best trivial rule on the same examples.

    python benchmarks/bench_calibrate.py [--smoke] [--json out.json] [--epochs 12] [--seeds 3]

The arms run interleaved per training seed (0, 1, ...); reported per arm and split: median and range
over seeds of the accuracy, the margin over the trivial rule, and the training wall time.
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
from common import command, figure, json_out, loadavg, median, positive_int  # noqa: E402

ARMS = {"mix34": [3, 4], "n4": [4]}  # the default's training sizes, and one size (the earlier default)


def train(train_sizes: list[int], epochs: int, seed: int, over: dict) -> dict:
    from stabray.train import make_run

    sizes = {"task.params.train_sizes": train_sizes, "task.params.long_sizes": [5, 6], "train.epochs": epochs}
    cfg = trial_config("dijkstra", {**sizes, **over}, seed=seed)
    cfg["method"]["params"].update(lam=1.0, bits=32)
    # accuracy only: the calibration asks whether the model learns the task
    cfg["eval"].update(eaf_examples=0, loss_gap=False, decomposition_examples=0, weight_noise_seeds=0)
    t0 = time.perf_counter()
    run = make_run(cfg)
    while not run.done:
        m = run.epoch()
    wall = time.perf_counter() - t0
    m.update(run.final())
    out = {"wall_s": wall}
    for metric in ("val_acc", "test_acc_n5", "test_acc_n6"):
        out[metric] = m[metric]
        out[f"trivial_{metric}"] = m.get(f"trivial_{metric}", 0.0)  # the best rule on the same examples
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny data, 1 epoch, 1 seed")
    p.add_argument("--json", type=json_out, default=None)
    p.add_argument("--epochs", type=positive_int, default=12)
    p.add_argument("--seeds", type=positive_int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    epochs, seeds = (1, 1) if args.smoke else (args.epochs, args.seeds)
    over = {"task.train_size": 64, "task.val_size": 16, "task.test_size": 16} if args.smoke else {}
    cmd = command(__file__, argv)
    res = {a: [] for a in ARMS}
    for s in range(seeds):
        for arm in list(ARMS) if s % 2 == 0 else list(reversed(ARMS)):
            t = loadavg()
            r = train(ARMS[arm], epochs, s, over)
            r["load_before"], r["load_after"] = t, loadavg()
            res[arm].append(r)
            print(
                f"  trained on {ARMS[arm]} nodes, seed {s}, {epochs} epochs ({r['wall_s']:.0f} s, load {t:.1f}): "
                + ", ".join(
                    f"{k} {r[k]:.3f} (rule {r['trivial_' + k]:.3f})" for k in ("val_acc", "test_acc_n5", "test_acc_n6")
                ),
                flush=True,
            )
    figs = []
    for arm, rs in res.items():
        for metric, where in (
            ("val_acc", "in distribution"),
            ("test_acc_n5", "at 5 nodes"),
            ("test_acc_n6", "at 6 nodes"),
        ):
            figs.append(
                figure(
                    f"calibration_{metric}_{arm}",
                    f"calibration: {metric} {where} after {epochs} epochs, trained on {'-'.join(map(str, ARMS[arm]))}"
                    "-node graphs (default trial, λ 1, 32 bits) vs the best trivial rule",
                    [r[metric] for r in rs],
                    "acc",
                    cmd,
                    baselines=[r[f"trivial_{metric}"] for r in rs],
                    compare="difference",
                    detail=f"{len(rs)} seeds; training {median(r['wall_s'] for r in rs):.0f} s "
                    f"[{min(r['wall_s'] for r in rs):.0f}-{max(r['wall_s'] for r in rs):.0f}]",
                )
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"smoke": args.smoke, "epochs": epochs, "runs": res, "figures": figs}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
