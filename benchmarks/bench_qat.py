"""QAT step-time overhead per bit-width: one optimisation step (forward, backward, gradient clipping,
AdamW) of Algorithm 1 at 1, 2, 3, 4 and 8 bits, relative to full precision (32 bits), on the same
model and batch.

    python benchmarks/bench_qat.py [--smoke] [--json out.json] [--steps 20] [--repeats 5] [--profile 2]

The model is the default sweep's (embedded `mini`, built with the same seed for every bit-width and
prepared by `alg1.prepare`, which registers the default quantizer's parametrization, `LSQQuantize`
(learned per-channel step and offset), on every Linear but the head; `--quantizer fixed` times the
fixed-scale `FakeQuantize`); the batch is one fixed `collate`d batch of the default sweep's size (16 Dijkstra examples,
full chains), so only the step itself is timed. Bit-widths run interleaved, `--repeats` rounds after
a warm-up; each ratio is the median over rounds of (step time at b bits) / (step time at 32 bits),
by wall time and by CPU time. Target (issue 8): <= 1.3x. `--profile B` adds a torch.profiler table
of the step at B bits (where the time goes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_train's setup (same model and data)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from bench_train import CLIP, LR, WD, setup  # noqa: E402
from common import command, figure, json_out, positive_int  # noqa: E402

from stabray.config import PRESETS  # noqa: E402
from stabray.data.encode import collate  # noqa: E402
from stabray.methods import get_method  # noqa: E402

TARGET = 1.3  # step time at b bits over full precision
BITS = (32, 1, 2, 3, 4, 8)


def make(new_model, bits: int, quantizer: str = "lsq"):
    """(model, method, optimizer) for alg1 at `bits`, no compression (lam = 1: same batch for all)."""
    method = get_method("alg1", lam=1.0, bits=bits, quantizer=quantizer)
    model = method.prepare(new_model())
    model.train()
    opt = torch.optim.AdamW(method.trainable_parameters(model), lr=LR, weight_decay=WD)
    return model, method, opt


def step(model, method, opt, batch) -> None:
    opt.zero_grad(set_to_none=True)
    method.step(model, batch)
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()


def time_steps(setup_, batch, n: int) -> tuple[float, float]:
    """Mean (wall, CPU) seconds per step over n steps."""
    w, c = time.perf_counter(), time.process_time()
    for _ in range(n):
        step(*setup_, batch)
    return (time.perf_counter() - w) / n, (time.process_time() - c) / n


def profile(setup_, batch, bits: int, rows: int = 15) -> str:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    for _ in range(3):
        step(*setup_, batch)
    with tprofile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            step(*setup_, batch)
    return f"torch.profiler, 10 steps at {bits} bits:\n" + prof.key_averages().table(
        sort_by="self_cpu_time_total", row_limit=rows
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="2 steps, 1 round: checks it runs")
    p.add_argument("--json", type=json_out, default=None, help="write the results here")
    p.add_argument("--steps", type=positive_int, default=20, help="steps per measurement")
    p.add_argument("--repeats", type=positive_int, default=5, help="interleaved rounds (after one warm-up)")
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument("--preset", choices=sorted(PRESETS), default="mini")
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--quantizer", choices=["lsq", "fixed"], default="lsq", help="alg1's quantizer (default lsq)")
    p.add_argument(
        "--profile", type=int, choices=BITS, default=None, metavar="BITS", help=f"print a profile at one of {BITS} bits"
    )
    args = p.parse_args(argv)
    steps, repeats = (2, 1) if args.smoke else (args.steps, args.repeats)
    torch.set_num_threads(args.threads)
    exs, enc, new_model = setup(args.batch_size, args.preset)
    batch = collate([enc.encode(e.question, e.steps, e.final) for e in exs], enc.pad)
    setups = {b: make(new_model, b, args.quantizer) for b in BITS}
    for b in BITS:  # warm-up
        time_steps(setups[b], batch, max(1, steps // 4))
    rounds = []  # per round {bits: (wall s/step, CPU s/step)}
    for r in range(repeats):
        order = BITS if r % 2 == 0 else tuple(reversed(BITS))
        rounds.append({b: time_steps(setups[b], batch, steps) for b in order})
    ms = {b: 1e3 * statistics.median(rd[b][0] for rd in rounds) for b in BITS}
    ratio = {b: statistics.median(rd[b][0] / rd[32][0] for rd in rounds) for b in BITS}
    ratio_cpu = {b: statistics.median(rd[b][1] / rd[32][1] for rd in rounds) for b in BITS}
    load = os.getloadavg()[0]
    tokens = int(batch["attention_mask"].sum())
    print(
        f"QAT step time: embedded {args.preset}, batch {args.batch_size} ({tokens} tokens), {steps} steps x "
        f"{repeats} rounds, {args.threads} thread(s), load avg {load:.1f}"
    )
    print(f"{'bits':>4} {'ms/step':>8} {'x fp32':>7} {'x fp32 (CPU time)':>18}")
    for b in BITS:
        print(f"{b:>4} {ms[b]:>8.2f} {ratio[b]:>7.3f} {ratio_cpu[b]:>18.3f}")
    worst = max(ratio[b] for b in BITS if b != 32)
    ok = worst <= TARGET
    print(f"target: every bit-width <= {TARGET}x full precision: {'met' if ok else 'MISSED'} (worst {worst:.3f}x)")
    prof = profile(setups[args.profile], batch, args.profile) if args.profile is not None else None
    if prof:
        print(prof)
    cmd = command(__file__, argv)
    figs = [
        figure(
            f"qat_step_time_{b}bit",
            f"QAT step time at {b} bits / full precision ({args.quantizer} quantizer)",
            [rd[b][0] for rd in rounds],
            "s",
            cmd,
            baselines=[rd[32][0] for rd in rounds],
            target=f"<= {TARGET}",
            detail=f"embedded {args.preset}, batch {args.batch_size}, {steps} steps x {repeats} rounds; by CPU time "
            f"{ratio_cpu[b]:.3f}x",
        )
        for b in BITS
        if b != 32
    ]
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "figures": figs,
                    "smoke": args.smoke,
                    "preset": args.preset,
                    "batch_size": args.batch_size,
                    "batch_tokens": tokens,
                    "steps": steps,
                    "repeats": repeats,
                    "threads": args.threads,
                    "load_avg_1min": load,
                    "ms_per_step": {str(b): v for b, v in ms.items()},
                    "ratio_to_fp32": {str(b): v for b, v in ratio.items()},
                    "ratio_to_fp32_cpu_time": {str(b): v for b, v in ratio_cpu.items()},
                    "target": TARGET,
                    "target_met": ok,
                    "profile": prof,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
