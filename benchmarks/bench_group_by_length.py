"""Batches of similar length (`train.group_by_length`) against uniformly shuffled batches: the time of a
training epoch of stabray's `Trainer` (sft_cot) on the same examples, the same model and batch size.

    python benchmarks/bench_group_by_length.py [--smoke] [--json out.json] [--examples 480] [--repeats 3]

A batch is padded to its longest example, and the padding is computed like any token; on a mix of
graph sizes a uniformly drawn batch of 16 almost always holds one of the largest graphs. Two data
sets: the default sweep's (Dijkstra, 1 decimal, 3- and 4-node graphs drawn evenly) and the
length-generalization profiles' (labelled graphs, three in four at 4 nodes: `L28`-`L37` in
scripts/calibration_profiles.yaml); the embedded `mini` decoder, batch 16, one thread. For each, both
arms train a fresh model (same seed) for one epoch over the same `--examples` examples, interleaved
(the order alternates by round) after one warm-up round. Reported per data set: the epoch's wall and
CPU time grouped / uniform (median and range of the per-round ratios), and the tokens computed (batch
rows x longest row, summed) grouped / uniform, with the non-pad tokens, equal on both sides. What it
does not measure: whether grouping changes what the model learns (the calibration rows `d21` against
`d17` do: README, "Laptop calibration").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from common import command, figure, json_out, positive_int  # noqa: E402

import stabray.train.loop as loop  # noqa: E402
from stabray.config import TrainCfg  # noqa: E402
from stabray.data.encode import Encoder  # noqa: E402
from stabray.data.splits import draw  # noqa: E402
from stabray.data.tokenizer import build_tokenizer  # noqa: E402
from stabray.methods import get_method  # noqa: E402
from stabray.models.build import ModelSpec, build_model  # noqa: E402
from stabray.tasks import get_task  # noqa: E402

# name -> (task params, training sizes, their probabilities)
DATA = {
    "default_mix34": ({"n_nodes": 4, "decimals": 1}, (3, 4), None),
    "labelled_mix34w13": ({"n_nodes": 4, "decimals": 1, "labels": 12}, (3, 4), (0.25, 0.75)),
}


def setup(name: str, n: int):
    params, sizes, probs = DATA[name]
    exs = draw(get_task("dijkstra", **params), "train", n, seed=0, size=sizes, probs=probs)
    tok = build_tokenizer([t for e in exs for t in (e.question, e.question_nohint, e.answer)])
    return exs, Encoder(tok), tok


def one_epoch(exs, enc, tok, grouped: bool) -> dict[str, float]:
    """One epoch of a fresh model; wall and CPU time of `train_epoch`, and the tokens it computed."""
    model = build_model(ModelSpec(preset="mini"), tok, seed=0)
    cfg = TrainCfg(epochs=1, batch_size=16, lr=3e-3, warmup_steps=10, group_by_length=grouped)
    trainer = loop.Trainer(model, get_method("sft_cot"), enc, exs, cfg, seed=0)
    computed = [0]
    real = loop.collate

    def counting(items, pad):
        computed[0] += len(items) * max(len(e.input_ids) for e in items)
        return real(items, pad)

    loop.collate = counting
    try:
        w, c = time.perf_counter(), time.process_time()
        m = trainer.train_epoch()
        return {
            "wall": time.perf_counter() - w,
            "cpu": time.process_time() - c,
            "computed": computed[0],
            "tokens": m["tokens"],
        }
    finally:
        loop.collate = real


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="64 examples, 1 round: checks it runs")
    p.add_argument("--json", type=json_out, default=None, help="write the results here")
    p.add_argument("--examples", type=positive_int, default=480, help="examples per epoch (30 batches of 16)")
    p.add_argument("--repeats", type=positive_int, default=3, help="interleaved rounds (after one warm-up)")
    args = p.parse_args(argv)
    n, repeats = (64, 1) if args.smoke else (args.examples, args.repeats)
    torch.set_num_threads(1)
    cmd = command(__file__, argv)
    figs, out = [], {}
    for name in DATA:
        exs, enc, tok = setup(name, n)
        arms = {"uniform": False, "grouped": True}
        for grouped in arms.values():  # warm-up
            one_epoch(exs, enc, tok, grouped)
        rounds = []
        for r in range(repeats):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            rounds.append({a: one_epoch(exs, enc, tok, arms[a]) for a in order})
        assert all(rd["grouped"]["tokens"] == rd["uniform"]["tokens"] for rd in rounds)  # the same examples
        computed = rounds[0]["grouped"]["computed"] / rounds[0]["uniform"]["computed"]
        wall = [rd["grouped"]["wall"] / rd["uniform"]["wall"] for rd in rounds]
        cpu = [rd["grouped"]["cpu"] / rd["uniform"]["cpu"] for rd in rounds]
        print(
            f"{name}: {n} examples, batch 16, mini, 1 thread, {repeats} rounds: epoch time grouped / uniform "
            f"{statistics.median(wall):.3f} by wall [{min(wall):.3f}-{max(wall):.3f}], "
            f"{statistics.median(cpu):.3f} by CPU [{min(cpu):.3f}-{max(cpu):.3f}]; tokens computed "
            f"{computed:.3f} ({rounds[0]['grouped']['computed']} vs {rounds[0]['uniform']['computed']}, "
            f"non-pad {int(rounds[0]['uniform']['tokens'])} on both)",
            flush=True,
        )
        figs.append(
            figure(
                f"group_by_length_{name}",
                f"a training epoch with `train.group_by_length` / uniformly shuffled batches (wall time), {name}",
                [rd["grouped"]["wall"] for rd in rounds],
                "s",
                cmd,
                baselines=[rd["uniform"]["wall"] for rd in rounds],
                target="<= 0.8",
                detail=f"{n} examples, batch 16, embedded mini, 1 thread; by CPU time {statistics.median(cpu):.3f}x; "
                f"tokens computed {computed:.3f}x",
            )
        )
        out[name] = {"rounds": rounds, "tokens_computed_ratio": computed}
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": figs, "smoke": args.smoke, "examples": n, **out}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
