"""Run every benchmark in its own process and print one line per benchmark with its headline figure.

    python benchmarks/run_all.py --smoke                 # each at tiny size: checks they all run (CI)
    python benchmarks/run_all.py --out bench-results     # the real measurements (about 25 min, 2 cores)
    python benchmarks/run_all.py --smoke --only train qat

Each benchmark is `benchmarks/bench_<name>.py`, run as `python bench_<name>.py [--smoke] --json
<out>/<name>.json`; every `bench_*.py` in this folder is picked up (so bench_methods.py runs once it
exists). No thresholds are asserted: the exit code is non-zero only when a benchmark fails to run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ["data", "eaf", "train", "qat", "methods", "sweep", "search"]  # cheap first; others after, by name


def available() -> list[str]:
    names = [p.stem[len("bench_") :] for p in HERE.glob("bench_*.py")]
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def headline(name: str, r: dict) -> str:
    """The figure each benchmark exists for (best effort: unknown layouts print nothing)."""
    try:
        if name == "train":
            x = r["ratio_to_minimal"]
            return f"stabray {x['stabray']:.3f}x minimal loop, HF Trainer {x['hf_trainer']:.3f}x (target >= 0.95)"
        if name == "qat":
            worst = max((v, b) for b, v in r["ratio_to_fp32"].items() if b != "32")
            return f"worst {worst[0]:.3f}x fp32 at {worst[1]} bits (target <= 1.3)"
        if name == "sweep":
            ml = r["mlflow"]
            s = (
                f"MLflow log_batch {ml['log_batch_ms_per_result']:.1f} ms/result ({ml['per_key_over_batch']:.1f}x "
                f"faster than per key)"
            )
            return (f"overhead {100 * r['overhead']:+.1f}% (target <= 10%); " if "overhead" in r else "") + s
        if name == "search":
            return "; ".join(
                f"{a}: best val_acc {x['best_val_acc']:.3f} in {x['trial_epochs']} trial-epochs"
                for a, x in r["arms"].items()
            )
        if name == "eaf":
            return f"batched {r['speedup']:.1f}x the per-pair loop, disagreement {r['max_rel_disagreement']:.1e}"
        if name == "data":
            g = max(x["generate_s_per_2000"] for x in r["results"])
            ld = max(x["load_s"] for x in r["results"])
            return f"slowest generation {g:.2f} s/2000, slowest cached load {ld:.3f} s"
    except (KeyError, TypeError, ValueError):
        pass
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="pass --smoke to every benchmark")
    p.add_argument("--only", nargs="*", default=None, help=f"benchmarks to run (default: all of {available()})")
    p.add_argument("--out", default=None, help="folder for the JSON files (default: a temporary one)")
    p.add_argument("--quiet", action="store_true", help="hide the benchmarks' own output")
    args = p.parse_args(argv)
    names = available()
    if args.only:
        unknown = [n for n in args.only if n not in names]
        if unknown:
            p.error(f"unknown benchmark(s) {unknown}; available: {', '.join(names)}")
        names = [n for n in names if n in args.only]
    tmp = None if args.out else tempfile.TemporaryDirectory()
    out = Path(args.out or tmp.name)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        js = out / f"{name}.json"
        cmd = [sys.executable, str(HERE / f"bench_{name}.py"), *(["--smoke"] if args.smoke else []), "--json", str(js)]
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=args.quiet, text=True)
        dt = time.perf_counter() - t0
        res = json.loads(js.read_text()) if proc.returncode == 0 and js.exists() else {}
        if proc.returncode and args.quiet:
            print((proc.stdout or "")[-3000:] + (proc.stderr or "")[-3000:])
        rows.append((name, proc.returncode, dt, headline(name, res)))
    print(
        f"\n{'benchmark':<10} {'rc':>3} {'s':>7}  headline"
        + ("  (smoke: sizes too small to mean anything)" if args.smoke else "")
    )
    for name, rc, dt, h in rows:
        print(f"{name:<10} {rc:>3} {dt:>7.1f}  {h}")
    if tmp:
        tmp.cleanup()
    return 1 if any(rc for _, rc, _, _ in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
