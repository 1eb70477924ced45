"""Per-step training cost of every method relative to SFT-CoT, on the same embedded model
(ModelSpec(preset="small")) and the same Dijkstra batch (n_nodes=10, 32 examples). Targets: QAT
(alg1 at 1/2/4 bits, lam=1 so the sequence is SFT-CoT's) <= 1.3x; Coconut > 1 (sequential latent
passes); NSO ~ 2m x (2m forward/backward passes).

    python benchmarks/bench_methods.py [--smoke] [--json out.json] [--rounds 12] [--only LABEL ...]

A step = zero_grad + method.step (forward and backward) + AdamW step, as the trainer runs it. Each
variant has its own freshly prepared model from the same initial weights and sees the batch its
method trains on: Coconut at curriculum stage 3 (three steps replaced by three latents, its most
expensive stage), implicit CoT at epoch 2 (two steps removed). Variants are interleaved round by
round and each ratio is the median over the rounds of (step time / SFT-CoT's step time in the same
round), so load from other processes hits all variants alike. torch uses `--threads` (default 1:
on a loaded machine two threads spin-wait on each other).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import command, figure, json_out, positive_int  # noqa: E402

from stabray.data.encode import Encoder, collate  # noqa: E402
from stabray.data.splits import make_splits  # noqa: E402
from stabray.data.tokenizer import build_tokenizer  # noqa: E402
from stabray.methods import get_method  # noqa: E402
from stabray.models.build import ModelSpec, build_model  # noqa: E402
from stabray.tasks import get_task  # noqa: E402

# label: (method, params, epoch whose training view is measured)
VARIANTS = {
    "sft_cot": ("sft_cot", {}, 0),
    "no_cot": ("no_cot", {}, 0),
    "implicit_cot@e2": ("implicit_cot", {"remove_per_epoch": 1.0, "unit": "steps", "removal_smoothing": 0.0}, 2),
    "alg1 lam=1 1-bit": ("alg1", {"lam": 1.0, "bits": 1}, 0),
    "alg1 lam=1 2-bit": ("alg1", {"lam": 1.0, "bits": 2}, 0),
    "alg1 lam=1 4-bit": ("alg1", {"lam": 1.0, "bits": 4}, 0),
    "alg1 lam=1 gauss2": ("alg1", {"lam": 1.0, "bits": 2, "noise": "gaussian"}, 0),
    "alg1 lam=0.2 2-bit": ("alg1", {"lam": 0.2, "bits": 2}, 0),
    "coconut@stage3": ("coconut", {"max_stage": 3, "latents_per_step": 1}, 3),
    "nso m=1": ("nso", {"samples": 1}, 0),
    "nso m=2": ("nso", {"samples": 2}, 0),
    "jacreg (defaults)": ("jacreg", {}, 0),
}
TARGETS = {
    "alg1 lam=1 1-bit": "<= 1.3",
    "alg1 lam=1 2-bit": "<= 1.3",
    "alg1 lam=1 4-bit": "<= 1.3",
    "coconut@stage3": "> 1",
    "nso m=1": "~ 2",
    "nso m=2": "~ 4",
    "jacreg (defaults)": "<= 2",
}


def build(label, tok, encoder, examples, preset):
    name, params, epoch = VARIANTS[label]
    method = get_method(name, **params)
    method.bind_tokenizer(tok)
    model = method.prepare(build_model(ModelSpec(preset=preset), tok, seed=0))
    model.train()
    rng = np.random.default_rng([0, epoch])
    batch = collate([encoder.encode(*method.train_view(e, epoch, rng), e.final) for e in examples], encoder.pad)
    params_ = method.trainable_parameters(model)
    opt = torch.optim.AdamW(params_, lr=1e-4)

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        method.step(model, batch)
        torch.nn.utils.clip_grad_norm_(params_, 1.0)
        opt.step()
        return time.perf_counter() - t0

    return step, int(batch["attention_mask"].sum())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny model, 4 examples, 2 rounds: checks it runs")
    ap.add_argument("--json", type=json_out, help="write the measurements here")
    ap.add_argument("--rounds", type=positive_int, default=6, help="timed steps per variant (median taken)")
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--batch", type=positive_int, default=32)
    ap.add_argument("--only", nargs="+", choices=list(VARIANTS), help="measure these variants (and sft_cot) only")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    n_nodes, preset, bs, rounds = (5, "tiny", 4, 2) if args.smoke else (10, "small", args.batch, args.rounds)
    task = get_task("dijkstra", n_nodes=n_nodes)
    examples = make_splits(task, {"train": bs}, splits=("train",))["train"]
    tok = build_tokenizer([t for e in examples for t in (e.question, e.question_nohint, e.answer)])
    encoder = Encoder(tok)
    steps, tokens = {}, {}
    labels = [v for v in VARIANTS if not args.only or v == "sft_cot" or v in args.only]
    for label in labels:
        steps[label], tokens[label] = build(label, tok, encoder, examples, preset)
        steps[label]()  # warm-up (allocations, first-call overheads)
    times = {label: [] for label in labels}
    for _ in range(rounds):  # interleaved: every variant once per round
        for label, step in steps.items():
            times[label].append(step())
    rows = {
        label: {
            "median_ms": 1e3 * statistics.median(t),
            "ratio": statistics.median(a / b for a, b in zip(t, times["sft_cot"])),
            "range": [min(a / b for a, b in zip(t, times["sft_cot"])), max(a / b for a, b in zip(t, times["sft_cot"]))],
            "tokens": tokens[label],
            "target": TARGETS.get(label, ""),
        }
        for label, t in times.items()
    }
    print(f"dijkstra n_nodes={n_nodes}, preset={preset}, batch={bs}, rounds={rounds}, threads={args.threads}")
    print(f"{'variant':<22}{'tokens':>8}{'ms/step':>10}{'x sft':>8}  target")
    for label, r in rows.items():
        print(f"{label:<22}{r['tokens']:>8}{r['median_ms']:>10.1f}{r['ratio']:>8.2f}  {r['target']}")
    cmd = command(__file__, argv)
    figs = [
        figure(
            "method_step_" + label.replace(" ", "_").replace("=", "").replace("@", "_at_").replace(".", "p"),
            f"training step time, {label} / SFT-CoT",
            times[label],
            "s",
            cmd,
            baselines=times["sft_cot"],
            target=TARGETS[label] if TARGETS.get(label, "").startswith(("<", ">")) else None,
            detail=f"Dijkstra {n_nodes} nodes, `{preset}`, batch {bs}, {args.threads} thread(s), {rounds} rounds",
        )
        for label in times
        if label != "sft_cot"
    ]
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "figures": figs,
                    "smoke": args.smoke,
                    "n_nodes": n_nodes,
                    "preset": preset,
                    "batch": bs,
                    "rounds": rounds,
                    "variants": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
