"""EAF on 64 Dijkstra examples with T = 8 steps (7 intermediate + the final answer) on the embedded
model (ModelSpec(preset="small"), untrained: cost does not depend on the weights): the batched
estimator (`estimate_eaf`) against a per-pair Python loop with one jvp and one vjp per iteration
(`estimate_eaf_loop`, the approach of the paper's code). Targets: >= 5x faster, <= 1% apart.

    python benchmarks/bench_eaf.py [--smoke] [--json out.json] [--loop-examples 4]

The loop is slow by design, so it runs on the first `--loop-examples` examples and its time is
scaled to all examples (per-example cost is uniform: same T, token cap and lengths within a few
tokens); disagreement is measured on those examples. Both use the same start vectors.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from stabray.data.encode import Encoder
from stabray.data.splits import make_splits
from stabray.data.tokenizer import build_tokenizer
from stabray.models.build import ModelSpec, build_model
from stabray.stability import EAFTracker, estimate_eaf, estimate_eaf_loop
from stabray.tasks import get_task

T_STEPS = 8  # blocks: 7 intermediate steps + the final answer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="2 examples, 2 iterations: checks it runs")
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--loop-examples", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: a busy machine time-slices it fairly; 2+ threads spin-wait)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    n, iters, n_loop = (2, 2, 1) if args.smoke else (args.n, args.iters, args.loop_examples)

    task = get_task("dijkstra", n_nodes=12)
    pool = make_splits(task, {"test": 4 * n + 16}, seed=0, splits=("test",))["test"]
    exs = [e for e in pool if len(e.steps) >= T_STEPS - 1][:n]
    assert len(exs) == n, f"only {len(exs)} examples with >= {T_STEPS - 1} steps"
    tok = build_tokenizer([e.question + e.answer for e in pool])
    enc = Encoder(tok)
    encoded = [enc.encode(e.question, e.steps[: T_STEPS - 1], e.final) for e in exs]
    model = build_model(ModelSpec(preset="small"), tok, seed=0)

    tracker = EAFTracker()  # only stores the final vectors: the first call costs what a cold one does
    t0, c0 = time.perf_counter(), time.process_time()
    batched = estimate_eaf(model, encoded, iters=iters, tracker=tracker)
    t_batched, c_batched = time.perf_counter() - t0, time.process_time() - c0
    t0 = time.perf_counter()
    warm = estimate_eaf(model, encoded, iters=iters, tracker=tracker)
    t_warm = time.perf_counter() - t0

    t0, c0 = time.perf_counter(), time.process_time()
    loop = estimate_eaf_loop(model, encoded[:n_loop], iters=iters)
    t_loop = (time.perf_counter() - t0) * n / n_loop
    c_loop = (time.process_time() - c0) * n / n_loop
    sub = batched.per_example[:n_loop]
    ok = ~torch.isnan(loop.per_example)
    disagreement = float(((sub[ok] - loop.per_example[ok]).abs() / loop.per_example[ok]).max())

    out = dict(
        examples=n,
        T=batched.T,
        threads=args.threads,
        iters=iters,
        eaf=batched.eaf,
        eaf_warm=warm.eaf,
        batched_s=t_batched,
        warm_s=t_warm,
        loop_s_extrapolated=t_loop,
        loop_examples=n_loop,
        speedup=t_loop / t_batched,
        warm_speedup=t_loop / t_warm,
        max_rel_disagreement=disagreement,
        batched_cpu_s=c_batched,
        loop_cpu_s_extrapolated=c_loop,
        cpu_speedup=c_loop / c_batched,
        load_avg_1min=os.getloadavg()[0],
    )
    print(f"EAF on {n} examples, T = {batched.T}, {iters} power iterations, {args.threads} thread(s)")
    print(f"  batched:          {t_batched:8.1f} s   EAF {batched.eaf:.4g}")
    print(f"  batched, warm:    {t_warm:8.1f} s   EAF {warm.eaf:.4g} ({tracker.warm_iters} iterations)")
    print(f"  per-pair loop:    {t_loop:8.1f} s   (measured on {n_loop} examples, scaled)")
    print(
        f"  speedup: {out['speedup']:.1f}x (target >= 5x); warm: {out['warm_speedup']:.1f}x; "
        f"by CPU time {out['cpu_speedup']:.1f}x; load avg {out['load_avg_1min']:.1f}"
    )
    print(f"  max relative disagreement, per (example, pair): {disagreement:.2e} (target <= 1e-2)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
