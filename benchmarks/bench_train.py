"""Training throughput (non-pad tokens/s): stabray's `Trainer` (sft_cot) vs a minimal hand-written
PyTorch loop vs `transformers.Trainer`, on the same embedded model, data and batch.

    python benchmarks/bench_train.py [--smoke] [--json out.json] [--steps 40] [--repeats 9]

All three train the same model (`build_model(ModelSpec(preset), tokenizer, seed=0)`, rebuilt for
every run) on the same Dijkstra examples (the default sweep's task: 4 nodes, 1 decimal), encoded
with `Encoder` and batched with `collate`, with the same optimizer (AdamW), schedule (linear warm-up
then cosine), gradient clipping (1.0) and batch size. The minimal loop encodes the dataset once
up front; stabray's `Trainer` encodes every batch (methods may change an example's view every epoch,
e.g. Algorithm 1's step resampling), so that cost is part of what is measured. HF Trainer gets the
pre-encoded examples and `collate` as its collator; its time runs from `on_train_begin` to
`on_train_end` (its one-off setup is not counted). The three run interleaved, `--repeats` times
after one warm-up round; the ratios are medians of the per-round ratios, by wall time and by the
process's CPU time (the latter barely moves when other jobs share the cores). Target (issue 8):
stabray >= 0.95x the minimal loop. Threads are fixed (`--threads`, default 1: a sweep trial's
share of the machine).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from common import command, figure, json_out, positive_int  # noqa: E402

from stabray.config import PRESETS, TrainCfg  # noqa: E402
from stabray.data.encode import Encoder, collate  # noqa: E402
from stabray.data.splits import draw  # noqa: E402
from stabray.data.tokenizer import build_tokenizer  # noqa: E402
from stabray.methods import get_method  # noqa: E402
from stabray.models.build import ModelSpec, build_model  # noqa: E402
from stabray.tasks import get_task  # noqa: E402
from stabray.train.loop import Trainer  # noqa: E402

TARGET = 0.95  # stabray tokens/s over the minimal loop's
LR, WD, WARMUP, CLIP = 3e-3, 0.01, 10, 1.0  # the default sweep's training settings


def setup(n_examples: int, preset: str = "mini", seed: int = 0):
    """(examples, encoder, model factory) for the default sweep's task."""
    task = get_task("dijkstra", n_nodes=4, decimals=1)
    exs = draw(task, "train", n_examples, seed=seed, size=task.size)
    tok = build_tokenizer([t for e in exs for t in (e.question, e.question_nohint, e.answer)])
    enc = Encoder(tok)

    def new_model():
        return build_model(ModelSpec(preset=preset), tok, seed=seed)

    return exs, enc, new_model


def lr_lambda(total: int):
    """The same schedule as stabray's Trainer: linear warm-up, then cosine to 10%."""

    def f(step: int) -> float:
        if step < WARMUP:
            return (step + 1) / WARMUP
        frac = min(1.0, (step - WARMUP) / max(1, total - WARMUP))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    return f


class Clock:
    """Wall time and this process's CPU time (robust to other load on a shared machine)."""

    def start(self):
        self.w, self.c = time.perf_counter(), time.process_time()

    def stop(self) -> tuple[float, float]:
        return time.perf_counter() - self.w, time.process_time() - self.c


def run_stabray(exs, enc, new_model, bs: int, steps: int) -> tuple[float, float, int]:
    model = new_model()
    method = get_method("sft_cot")
    cfg = TrainCfg(
        epochs=1, batch_size=bs, lr=LR, weight_decay=WD, warmup_steps=WARMUP, grad_clip=CLIP, max_steps_per_epoch=steps
    )
    tr = Trainer(model, method, enc, exs, cfg, seed=0)
    clock = Clock()
    clock.start()
    m = tr.train_epoch()
    return (*clock.stop(), int(m["tokens"]))


def run_minimal(exs, enc, new_model, bs: int, steps: int) -> tuple[float, float, int]:
    model = new_model()
    data = [enc.encode(e.question, e.steps, e.final) for e in exs]  # once, up front
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps))
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).tolist()
    model.train()
    tokens = 0
    clock = Clock()
    clock.start()
    for b in range(steps):
        batch = collate([data[i] for i in order[b * bs : (b + 1) * bs]], enc.pad)
        tokens += int(batch["attention_mask"].sum())
        opt.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
    return (*clock.stop(), tokens)


def run_hf(exs, enc, new_model, bs: int, steps: int, tmp: str) -> tuple[float, float, int]:
    from transformers import Trainer as HFTrainer
    from transformers import TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    model = new_model()
    data = [enc.encode(e.question, e.steps, e.final) for e in exs]
    counted = [0]

    def collator(items):
        batch = collate(items, enc.pad)
        counted[0] += int(batch["attention_mask"].sum())
        return batch

    class Timed(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            counted[0] = 0
            self.clock = Clock()
            self.clock.start()

        def on_train_end(self, args, state, control, **kw):
            self.dt = self.clock.stop()

    clock = Timed()
    args = TrainingArguments(
        output_dir=tmp,
        per_device_train_batch_size=bs,
        max_steps=steps,
        learning_rate=LR,
        weight_decay=WD,
        warmup_steps=WARMUP,
        lr_scheduler_type="cosine",
        max_grad_norm=CLIP,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=True,
        seed=0,
    )
    trainer = HFTrainer(model=model, args=args, train_dataset=data, data_collator=collator, callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # its end-of-training dict would interrupt the table
    trainer.train()
    return (*clock.dt, counted[0])


def main(argv: list[str] | None = None) -> int:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="5 steps, 1 round: checks it runs")
    p.add_argument("--json", type=json_out, default=None, help="write the results here")
    p.add_argument("--steps", type=positive_int, default=40, help="optimisation steps per run")
    p.add_argument("--batch-size", type=positive_int, default=16, help="the default sweep's batch")
    p.add_argument("--repeats", type=positive_int, default=5, help="interleaved rounds (after one warm-up)")
    p.add_argument(
        "--preset", choices=sorted(PRESETS), default="mini", help="embedded model shape (mini: the default sweep's)"
    )
    p.add_argument("--threads", type=positive_int, default=1)
    args = p.parse_args(argv)
    steps, repeats = (5, 1) if args.smoke else (args.steps, args.repeats)
    torch.set_num_threads(args.threads)
    bs = args.batch_size
    exs, enc, new_model = setup(steps * bs, args.preset)
    with tempfile.TemporaryDirectory() as tmp:
        loops = {
            "minimal": lambda: run_minimal(exs, enc, new_model, bs, steps),
            "stabray": lambda: run_stabray(exs, enc, new_model, bs, steps),
            "hf_trainer": lambda: run_hf(exs, enc, new_model, bs, steps, tmp),
        }
        for f in loops.values():  # warm-up: imports, allocator, encoder caches
            f()
        rounds = []  # per round {loop: (tokens per wall s, tokens per CPU s)}
        for r in range(repeats):
            names = list(loops) if r % 2 == 0 else list(reversed(loops))  # alternate the order
            rd = {}
            for n in names:
                wall, cpu, tok = loops[n]()
                rd[n] = (tok / wall, tok / cpu)
            rounds.append(rd)
    tps = {n: statistics.median(rd[n][0] for rd in rounds) for n in loops}
    ratio = {n: statistics.median(rd[n][0] / rd["minimal"][0] for rd in rounds) for n in loops}
    ratio_cpu = {n: statistics.median(rd[n][1] / rd["minimal"][1] for rd in rounds) for n in loops}
    load = os.getloadavg()[0]
    print(
        f"training throughput: embedded {args.preset}, batch {bs}, {steps} steps x {repeats} rounds, "
        f"{args.threads} thread(s), load avg {load:.1f}"
    )
    print(f"{'loop':<12} {'tokens/s':>10} {'x minimal':>10} {'x minimal (CPU time)':>21}")
    for n in loops:
        print(f"{n:<12} {tps[n]:>10.0f} {ratio[n]:>10.3f} {ratio_cpu[n]:>21.3f}")
    ok = ratio["stabray"] >= TARGET
    print(f"target: stabray >= {TARGET}x the minimal loop: {'met' if ok else 'MISSED'}")
    cmd = command(__file__, argv)
    setting = f"embedded {args.preset}, batch {bs}, {steps} steps, {args.threads} thread(s), {repeats} rounds"
    figs = [
        figure(
            "train_throughput_stabray",
            "training throughput: stabray `Trainer` / a minimal PyTorch loop (tokens/s)",
            [rd["stabray"][0] for rd in rounds],
            "tokens/s",
            cmd,
            baselines=[rd["minimal"][0] for rd in rounds],
            target=f">= {TARGET}",
            detail=f"{setting}; by CPU time {ratio_cpu['stabray']:.3f}x",
        ),
        figure(
            "train_throughput_hf",
            "training throughput: `transformers.Trainer` / a minimal PyTorch loop (tokens/s)",
            [rd["hf_trainer"][0] for rd in rounds],
            "tokens/s",
            cmd,
            baselines=[rd["minimal"][0] for rd in rounds],
            detail=f"{setting}; by CPU time {ratio_cpu['hf_trainer']:.3f}x",
        ),
    ]
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "figures": figs,
                    "smoke": args.smoke,
                    "preset": args.preset,
                    "batch_size": bs,
                    "steps": steps,
                    "repeats": repeats,
                    "threads": args.threads,
                    "load_avg_1min": load,
                    "tokens_per_s": tps,
                    "ratio_to_minimal": ratio,
                    "ratio_to_minimal_cpu_time": ratio_cpu,
                    "rounds_tokens_per_s": rounds,
                    "target": TARGET,
                    "target_met": ok,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
