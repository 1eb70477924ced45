"""Data pipeline speed per task: generating 2,000 examples, and loading a cached dataset.

    python benchmarks/bench_data.py [--smoke] [--json out.json] [--tasks dijkstra dfs ...]

Targets (issue 3; reported, not asserted): generation <= 5 s per 2,000 examples, cached load
<= 0.5 s. "Generate" is `draw` of the training split at the default size (sampling, rendering and
the duplicate check). "Load" is `load_splits` of a dataset already in a temporary cache directory
(train 2,000 + four evaluation splits of 200: the paper's sizes), measured after one warm-up load
so that the one-off `import datasets` is not counted; "first load" is that warm-up's time.
`--smoke` uses 200 training examples and 20 per evaluation split, for a quick check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # keep the table readable

from common import command, figure, json_out, median, positive_int  # noqa: E402

from stabray.data.cache import load_splits  # noqa: E402
from stabray.data.splits import draw  # noqa: E402
from stabray.tasks import TASKS, get_task  # noqa: E402

GEN_TARGET_S = 5.0  # per 2,000 examples
LOAD_TARGET_S = 0.5


def split_sizes(n_train: int, n_eval: int) -> dict[str, int]:
    """Examples per split: the training split and the four evaluation splits of every task."""
    return {"train": n_train, "val": n_eval, "test": n_eval, "test_long": n_eval, "test_longer": n_eval}


def time_cached_load(task, sizes: dict[str, int], cache: str | Path, repeats: int):
    """(first load's wall s, [wall s per load], [CPU s per load]) of `load_splits` from a cache directory
    that already holds the dataset: one warm-up load (the one-off `import datasets`), then `repeats`
    timed loads (CPU time of this process: steadier than the wall under outside load)."""
    t0 = time.perf_counter()
    load_splits(task, sizes, seed=0, cache_dir=cache)
    first = time.perf_counter() - t0
    loads, load_cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        data = load_splits(task, sizes, seed=0, cache_dir=cache)
        loads.append(time.perf_counter() - t0)
        load_cpu.append(time.process_time() - c0)
    assert len(data["train"]) == sizes["train"]
    return first, loads, load_cpu


def bench_task(name: str, n_train: int, n_eval: int, repeats: int) -> dict:
    task = get_task(name)
    gen = []
    for r in range(repeats):
        t0 = time.perf_counter()
        draw(task, "train", n_train, seed=r, size=task.size)
        gen.append(time.perf_counter() - t0)
    sizes = split_sizes(n_train, n_eval)
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        load_splits(task, sizes, seed=0, cache_dir=cache)  # generate + write
        build = time.perf_counter() - t0
        first, loads, load_cpu = time_cached_load(task, sizes, cache, repeats)
    gen_s = median(gen)
    return {
        "generate_s_per_2000_each": [g * 2000 / n_train for g in gen],
        "load_s_each": loads,
        "load_cpu_s_each": load_cpu,
        "task": name,
        "n_train": n_train,
        "n_eval": n_eval,
        "generate_s": gen_s,
        "generate_s_per_2000": gen_s * 2000 / n_train,
        "build_and_cache_s": build,
        "first_load_s": first,
        "load_s": median(loads),
        "generate_ok": gen_s * 2000 / n_train <= GEN_TARGET_S,
        "load_ok": median(loads) <= LOAD_TARGET_S,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="200 train / 20 eval examples, one repeat")
    p.add_argument("--json", type=json_out, default=None, help="write the results here")
    p.add_argument("--tasks", nargs="*", default=None, help="tasks to measure (default: all)")
    p.add_argument("--repeats", type=positive_int, default=None, help="median of this many runs (default 3; smoke 1)")
    args = p.parse_args(argv)
    n_train, n_eval = (200, 20) if args.smoke else (2000, 200)
    repeats = args.repeats or (1 if args.smoke else 3)
    names = [TASKS.canonical(t) for t in args.tasks] if args.tasks else TASKS.names()
    rows = []
    print(f"{'task':<15} {'gen s/2000':>10} {'build+cache s':>13} {'first load s':>12} {'load s':>7}")
    for name in names:
        r = bench_task(name, n_train, n_eval, repeats)
        rows.append(r)
        flag = "" if r["generate_ok"] and r["load_ok"] else "  <- over target"
        print(
            f"{name:<15} {r['generate_s_per_2000']:>10.2f} {r['build_and_cache_s']:>13.2f} "
            f"{r['first_load_s']:>12.3f} {r['load_s']:>7.3f}{flag}",
            flush=True,
        )
    print(f"targets: generation <= {GEN_TARGET_S} s per 2,000 examples; cached load <= {LOAD_TARGET_S} s")
    cmd = command(__file__, argv)
    slow_gen = max(rows, key=lambda r: r["generate_s_per_2000"])
    slow_load = max(rows, key=lambda r: r["load_s"])
    figs = [
        figure(
            "data_generation_slowest",
            f"data generation, s per 2,000 examples, slowest task ({slow_gen['task']})",
            slow_gen["generate_s_per_2000_each"],
            "s",
            cmd,
            target=f"<= {GEN_TARGET_S}",
        ),
        figure(
            "data_cached_load_slowest",
            f"cached dataset load (train 2,000 + 4 x 200), slowest task ({slow_load['task']})",
            slow_load["load_s_each"],
            "s",
            cmd,
            target=f"<= {LOAD_TARGET_S}",
            detail=f"wall time; by CPU time {median(slow_load['load_cpu_s_each']):.3g} s",
        ),
    ]
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "smoke": args.smoke,
                    "targets": {"generate_s_per_2000": GEN_TARGET_S, "load_s": LOAD_TARGET_S},
                    "results": rows,
                    "figures": figs,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
