"""One calibration trial without Ray: a sweep spec's trial (plus --set overrides), trained to the end
with one torch thread, then exact-match accuracy on every evaluation split beside the task's trivial
rules on the same examples, broken down by input size; one JSON line appended to --out.

    PYTHONPATH=. python scripts/calibrate.py sweeps/dijkstra.yaml --seed 1 --label d30 \\
        --set task.params.labels=0 --out calibration.jsonl

What it changes against the spec (so trials cost what the study measured): method sft_cot unless
--set method.name=..., no per-epoch EAF, no eq. (4) table, no weight-noise seeds, no loss gap,
validation on `--val-examples` examples per epoch. The calibration table in the README lists the
commands of its rows; `scripts/calibration_table.py` turns the JSON lines into that table.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict

import yaml


def split_report(run, split: str) -> dict:
    from stabray.tasks.base import extract_final

    exs = run.data[split]
    res = run.evaluate(split)
    ok = [run.task.is_correct(e, extract_final(p)) for e, p in zip(exs, res.predictions)]
    rules = run.task.baseline_accuracy(exs)
    best = max(rules.items(), key=lambda kv: kv[1]) if rules else ("none", 0.0)
    by = defaultdict(list)
    for e, o in zip(exs, ok):
        by[e.meta.get("n")].append((e, o))
    by_size = {}
    for n, pairs in sorted(by.items()):
        b = run.task.baseline_accuracy([e for e, _ in pairs])
        by_size[str(n)] = {
            "n": len(pairs),
            "acc": sum(o for _, o in pairs) / len(pairs),
            "best_rule": max(b.values()) if b else 0.0,
        }
    acc = sum(ok) / len(ok)
    return {
        "acc": acc,
        "n": len(ok),
        "std": math.sqrt(acc * (1 - acc) / len(ok)),
        "best_rule": best[1],
        "best_rule_name": best[0],
        "rules": rules,
        "by_size": by_size,
        "sizes": sorted({e.meta.get("n") for e in exs}),
        "sample_pred": res.predictions[:2],
        "sample_gold": [e.answer for e in exs[:2]],
        "wrong": [(p, e.answer) for e, p, o in zip(exs, res.predictions, ok) if not o][:4],  # (predicted, gold)
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", help="a sweep spec (name or path); its trial base is the calibration trial")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="", help="the profile's name in the table")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    ap.add_argument("--val-examples", type=int, default=100)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default="calibration.jsonl")
    args = ap.parse_args()

    import torch

    from stabray.config import set_path
    from stabray.spec import load_spec
    from stabray.train.run import TrialRun

    torch.set_num_threads(1)
    overrides = {"method.name": "sft_cot", "method.params": {}, "search.space": {}}
    for item in args.set:
        k, v = item.split("=", 1)
        overrides[k] = yaml.safe_load(v)
    spec, path = load_spec(args.spec, overrides)
    cfg = spec.trial_base()
    cfg["seed"] = args.seed
    cfg["device"] = "cpu"
    cfg["cache_dir"] = args.cache_dir
    for k, v in {
        "train.threads": 1,
        "eval.eaf_examples": 0,
        "eval.decomposition_examples": 0,
        "eval.weight_noise_seeds": 0,
        "eval.loss_gap": False,
        "eval.val_examples": args.val_examples,
    }.items():
        set_path(cfg, k, v)
    t0, c0 = time.perf_counter(), time.process_time()
    run = TrialRun(cfg)
    n_params = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    print(f"[{args.label or path.stem} seed {args.seed}] params {n_params}, vocab {len(run.tokenizer)}", flush=True)
    epochs = []
    while not run.done:
        m = run.epoch()
        epochs.append({k: round(float(v), 4) for k, v in m.items() if isinstance(v, (int, float))})
        print(
            f"  epoch {m['epoch']:2d} loss {m['train_loss']:.4f} val {m['val_acc']:.3f} "
            f"tok/s {m['tokens_per_s']:.0f} t={time.perf_counter() - t0:.0f}s",
            flush=True,
        )
    final = {s: split_report(run, s) for s in ("test", *run.long_splits)}
    rec = {
        "label": args.label or path.stem,
        "spec": str(args.spec),
        "overrides": args.set,
        "seed": args.seed,
        "config": cfg,
        "params": n_params,
        "wall_min": (time.perf_counter() - t0) / 60,
        "cpu_min": (time.process_time() - c0) / 60,
        "epochs": epochs,
        "final": final,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    with open(args.out, "a") as f:
        f.write(json.dumps(rec) + "\n")
    for s, r in final.items():
        bys = " ".join(f"{n}:{v['acc']:.2f}/{v['best_rule']:.2f}" for n, v in r["by_size"].items())
        print(f"  {s:12s} acc {r['acc']:.3f} (n {r['n']})  best rule {r['best_rule']:.3f}  [{bys}]")
    print(f"  wall {rec['wall_min']:.2f} min, cpu {rec['cpu_min']:.2f} min")
    print(f"  pred {final['test']['sample_pred'][0]!r}\n  gold {final['test']['sample_gold'][0]!r}")
    for s, r in final.items():
        for pred, gold in r["wrong"][:2]:
            print(f"  {s} wrong: pred {pred!r}\n  {' ' * len(s)}        gold {gold!r}")


if __name__ == "__main__":
    main()
