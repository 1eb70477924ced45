"""The batched EAF estimator (`estimate_eaf`) against a per-pair Python loop with one jvp and one
vjp per iteration (`estimate_eaf_loop`, the approach of the paper's code), on the same Dijkstra
examples (12 nodes) with T = 8 steps (7 intermediate + the final answer) on the embedded model
(ModelSpec(preset="small"), untrained: cost does not depend on the weights). Targets: >= 5x faster,
<= 1% apart.

    python benchmarks/bench_eaf.py [--smoke] [--json out.json] [--n 2] [--iters 10] [--repeats 3]

Both sides run on the same `--n` examples (the loop is slow, so n is small; nothing is scaled up),
with the same start vectors, after one warm-up call each, interleaved (the order alternates) for
`--repeats` rounds; reported: median and range of the per-round wall and CPU-time ratios, and the
largest relative disagreement per (example, step pair).

Warm start, at equal iteration counts: the model is perturbed as by one epoch of training (every
weight times 1 + N(0, 0.01^2)), and the EAF of the perturbed model with `--warm-iters` iterations
started from the unperturbed model's vectors is compared with the same number of iterations started
cold, both against a converged reference (50 cold iterations): the relative error of each.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import command, figure, json_out, load, positive_int  # noqa: E402

from stabray.data.encode import Encoder  # noqa: E402
from stabray.data.splits import make_splits  # noqa: E402
from stabray.data.tokenizer import build_tokenizer  # noqa: E402
from stabray.models.build import ModelSpec, build_model  # noqa: E402
from stabray.stability import EAFTracker, estimate_eaf, estimate_eaf_loop  # noqa: E402
from stabray.tasks import get_task  # noqa: E402

T_STEPS = 8  # blocks: 7 intermediate steps + the final answer


def timed(f):
    t0, c0 = time.perf_counter(), time.process_time()
    r = f()
    return r, time.perf_counter() - t0, time.process_time() - c0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="1 example, 2 iterations, 1 round: checks it runs")
    ap.add_argument("--json", type=json_out, help="write the measurements here")
    ap.add_argument("--n", type=positive_int, default=2, help="examples, the same on both sides")
    ap.add_argument("--iters", type=positive_int, default=10)
    ap.add_argument("--warm-iters", type=positive_int, default=3)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument(
        "--threads", type=positive_int, default=1, help="torch threads (1: 2+ threads spin-wait when loaded)"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    n, iters, repeats, nodes = (1, 2, 1, 8) if args.smoke else (args.n, args.iters, args.repeats, 12)
    cmd = command(__file__, argv)

    task = get_task("dijkstra", n_nodes=nodes)
    pool = make_splits(task, {"test": 4 * n + 32}, seed=0, splits=("test",))["test"]
    exs = [e for e in pool if len(e.steps) >= T_STEPS - 1][:n]
    assert len(exs) == n, f"only {len(exs)} examples with >= {T_STEPS - 1} steps"
    tok = build_tokenizer([e.question + e.answer for e in pool])
    enc = Encoder(tok)
    encoded = [enc.encode(e.question, e.steps[: T_STEPS - 1], e.final) for e in exs]
    model = build_model(ModelSpec(preset="tiny" if args.smoke else "small"), tok, seed=0)

    sides = {
        "batched": lambda: estimate_eaf(model, encoded, iters=iters),
        "loop": lambda: estimate_eaf_loop(model, encoded, iters=iters),
    }
    for f in (
        lambda: estimate_eaf(model, encoded[:1], iters=1),
        lambda: estimate_eaf_loop(model, encoded[:1], iters=1),
    ):
        f()  # warm-up: allocator, autograd graphs, first-call costs
    rounds, disagreement = [], 0.0
    for r in range(repeats):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        rd = {}
        for name in order:
            res, wall, cpu = timed(sides[name])
            rd[name] = {"wall_s": wall, "cpu_s": cpu, "eaf": float(res.eaf)}
            rd[name + "_per_example"] = res.per_example
        a, b = rd.pop("batched_per_example"), rd.pop("loop_per_example")
        ok = ~torch.isnan(b) & (b != 0)
        disagreement = max(disagreement, float(((a[ok] - b[ok]).abs() / b[ok].abs()).max()) if ok.any() else 0.0)
        rounds.append(rd)
        print(
            f"  round {r + 1}/{repeats}: batched {rd['batched']['wall_s']:.1f} s, loop {rd['loop']['wall_s']:.1f} s "
            f"(load {load():.1f})",
            flush=True,
        )

    # warm start at equal iteration counts, on a model moved as by one epoch of training
    moved = build_model(ModelSpec(preset="tiny" if args.smoke else "small"), tok, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in moved.parameters():
            p.mul_(1 + 0.01 * torch.randn(p.shape, generator=g))
    tracker = EAFTracker(warm_iters=args.warm_iters)
    estimate_eaf(model, encoded, iters=iters, tracker=tracker)  # the previous epoch's vectors
    warm = estimate_eaf(moved, encoded, iters=iters, tracker=tracker)  # all stored: warm_iters iterations
    cold = estimate_eaf(moved, encoded, iters=args.warm_iters)
    ref = estimate_eaf(moved, encoded, iters=5 if args.smoke else 50)
    err_warm, err_cold = abs(warm.eaf - ref.eaf) / abs(ref.eaf), abs(cold.eaf - ref.eaf) / abs(ref.eaf)

    bw, lw = [rd["batched"]["wall_s"] for rd in rounds], [rd["loop"]["wall_s"] for rd in rounds]
    bc, lc = [rd["batched"]["cpu_s"] for rd in rounds], [rd["loop"]["cpu_s"] for rd in rounds]
    speed = figure(
        "eaf_estimator_speedup",
        f"EAF estimator: per-pair loop time / batched time, {n} Dijkstra example(s) ({nodes} nodes), T = {T_STEPS}, "
        f"{iters} power iterations, both sides on the same examples",
        lw,
        "s",
        cmd,
        baselines=bw,
        target=">= 5",
        detail="wall time; by CPU time " + f"{sorted(a / b for a, b in zip(lc, bc))[len(bc) // 2]:.1f}x",
    )
    speed_cpu = figure(
        "eaf_estimator_speedup_cpu",
        "EAF estimator, the same by CPU time (steadier under outside load)",
        lc,
        "s",
        cmd,
        baselines=bc,
        target=">= 5",
    )
    agree = figure(
        "eaf_estimator_disagreement",
        "EAF estimator: largest relative disagreement batched vs loop, per (example, step pair)",
        [disagreement],
        "rel",
        cmd,
        target="<= 0.01",
        detail="max over every round (the computation is deterministic: one value)",
    )
    warmf = figure(
        "eaf_warm_start_error",
        f"EAF warm start at equal iterations ({args.warm_iters}): relative error warm vs cold, on a model moved as "
        "by one epoch, against 50 cold iterations",
        [err_warm],
        "rel",
        cmd,
        baselines=[err_cold],
        detail=f"warm {err_warm:.2e}, cold {err_cold:.2e}",
    )
    print(f"EAF on {n} examples, T = {T_STEPS}, {iters} power iterations, {args.threads} thread(s), {repeats} rounds")
    print(f"  batched: {min(bw):.1f}-{max(bw):.1f} s; per-pair loop: {min(lw):.1f}-{max(lw):.1f} s")
    print(
        f"  speedup (median [range]): {speed['ratio']:.1f}x [{speed['min']:.1f}-{speed['max']:.1f}] by wall, "
        f"{speed_cpu['ratio']:.1f}x [{speed_cpu['min']:.1f}-{speed_cpu['max']:.1f}] by CPU time (target >= 5x)"
    )
    print(f"  max relative disagreement, per (example, pair): {disagreement:.2e} (target <= 1e-2)")
    print(f"  warm start, {args.warm_iters} iterations: relative error {err_warm:.2e} warm vs {err_cold:.2e} cold")
    if args.json:
        out = dict(
            smoke=args.smoke,
            examples=n,
            T=T_STEPS,
            iters=iters,
            threads=args.threads,
            rounds=rounds,
            max_rel_disagreement=disagreement,
            warm={"iters": args.warm_iters, "err_warm": err_warm, "err_cold": err_cold, "ref_eaf": ref.eaf},
            figures=[speed, speed_cpu, agree, warmf],
        )
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
