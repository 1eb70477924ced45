"""Run every benchmark in its own process and collect their figures into one summary.json.

    python benchmarks/run_all.py --smoke                 # each at tiny size: checks they run and the schema (CI)
    python benchmarks/run_all.py --out bench             # the real measurements (about an hour on 2 loaded cores)
    python benchmarks/run_all.py --smoke --only train qat
    python benchmarks/run_all.py --only qat --update bench/summary.json --out bench   # re-run some into a full run

Each benchmark is `benchmarks/bench_<name>.py`, run as `python bench_<name>.py [--smoke] --json
<out>/<name>.json`; every `bench_*.py` in this folder is picked up. `<out>/summary.json` holds one
entry per figure of the README's Performance table (`name, value, unit, baseline, ratio, repeats,
min, max, target, met, command`, see benchmarks/common.py), each with the wall time of its benchmark
and the machine's load average before and after it, plus the run's own wall time and load.
`benchmarks/readme_table.py` renders the README's table from it. No thresholds are asserted: the exit
code is non-zero when a benchmark fails to run or a figure does not follow the schema.
`--update SUMMARY --out DIR`: after a change to the code one benchmark measures, re-run only that one
(`--only`) and write DIR/summary.json as SUMMARY with its rows and figures replaced (DIR = SUMMARY's own
folder updates it in place: until the merge at the end the re-run's rows go to DIR/rerun_summary.json,
so a run cut short leaves SUMMARY as it was); the summary's `updates` list says which benchmarks were
re-run when, how long they took and under what load (the README's run line says it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import check_figure  # noqa: E402

# the two targets first (tracking, sweep), then the cheap ones, the long sweeps last; unknown ones after, by name
ORDER = ["tracking", "sweep", "eaf", "train", "qat", "data", "methods", "calibrate", "search", "default_sweep"]


def available() -> list[str]:
    names = [p.stem[len("bench_") :] for p in HERE.glob("bench_*.py")]
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def headline(figs: list[dict]) -> str:
    """The figures with a target: median and whether it is met."""
    out = []
    for f in figs:
        if f.get("target"):
            on = f.get("target_on", "value")
            x = f.get(on if on != "value" else "value")
            out.append(f"{f['name']} {x:.3g} ({f['target']}: {'met' if f['met'] else 'MISSED'})")
    return "; ".join(out)


def write_summary(
    out: Path, smoke: bool, t0: float, load0, rows: list, figures: list, name: str = "summary.json"
) -> dict:
    summary = {
        "smoke": smoke,
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "wall_s": time.perf_counter() - t0,
        "load_before": list(load0),
        "load_after": list(os.getloadavg()),
        "benchmarks": rows,
        "figures": figures,
    }
    (out / name).write_text(json.dumps(summary, indent=1, default=str))
    return summary


def merge(full: dict, rerun: dict) -> dict:
    """`full` with the benchmarks of `rerun` replaced (rows and figures, in place of the old ones; a
    benchmark `full` lacks goes last), and `rerun` noted in `updates`."""
    again = {r["benchmark"]: r for r in rerun["benchmarks"]}
    if full.get("smoke") != rerun.get("smoke"):
        raise SystemExit("--update: cannot mix a smoke run with a full one")
    rows = [again.get(r["benchmark"], r) for r in full["benchmarks"]]
    rows += [r for name, r in again.items() if name not in {r["benchmark"] for r in full["benchmarks"]}]
    figures = []
    for r in rows:
        source = rerun if r["benchmark"] in again else full
        figures += [f for f in source["figures"] if f.get("benchmark") == r["benchmark"]]
    note = {k: rerun[k] for k in ("created", "wall_s", "load_before", "load_after")}
    note["benchmarks"] = list(again)
    return {**full, "benchmarks": rows, "figures": figures, "updates": [*full.get("updates", []), note]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="pass --smoke to every benchmark")
    p.add_argument("--only", nargs="*", default=None, help=f"benchmarks to run (default: all of {available()})")
    p.add_argument("--out", default=None, help="folder for the JSON files (default: a temporary one)")
    p.add_argument("--quiet", action="store_true", help="hide the benchmarks' own output")
    p.add_argument(
        "--update",
        default=None,
        help="a full run's summary.json: write it to --out with the re-run benchmarks' rows and figures replaced",
    )
    args = p.parse_args(argv)
    if args.only is not None and not args.only:
        p.error("--only: name at least one benchmark (without --only every one runs)")
    if args.update and not args.only:
        p.error("--update re-runs some benchmarks into an earlier summary: name them with --only")
    if args.update and not args.out:
        p.error("--update writes the merged summary into --out: give a folder (a temporary one would be deleted)")
    if args.update and not Path(args.update).is_file():
        p.error(f"--update: no summary at {args.update}")
    earlier = None
    if args.update:  # read before anything runs: a summary that cannot be merged is found now
        try:
            earlier = json.loads(Path(args.update).read_text())
        except ValueError as e:
            p.error(f"--update {args.update}: not a JSON summary ({e})")
        if not isinstance(earlier, dict) or not isinstance(earlier.get("benchmarks"), list):
            p.error(f"--update {args.update}: not a run_all.py summary (no 'benchmarks' list)")
        if bool(earlier.get("smoke")) != args.smoke:
            p.error(f"--update {args.update}: cannot mix a smoke run with a full one")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        p.error(f"--out {args.out}: a file, not a folder")
    names = available()
    if args.only:
        unknown = [n for n in args.only if n not in names]
        if unknown:
            p.error(f"unknown benchmark(s) {unknown}; available: {', '.join(names)}")
        names = [n for n in names if n in args.only]
    tmp = None if args.out else tempfile.TemporaryDirectory()
    out = Path(args.out or tmp.name)
    out.mkdir(parents=True, exist_ok=True)
    rows, figures, problems = [], [], []
    partial = "rerun_summary.json" if args.update else "summary.json"
    run_load0, run_t0 = os.getloadavg(), time.perf_counter()
    for name in names:
        js = out / f"{name}.json"
        cmd = [sys.executable, str(HERE / f"bench_{name}.py"), *(["--smoke"] if args.smoke else []), "--json", str(js)]
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=args.quiet, text=True)
        dt = time.perf_counter() - t0
        load1 = os.getloadavg()
        res = json.loads(js.read_text()) if proc.returncode == 0 and js.exists() else {}
        if proc.returncode and args.quiet:
            print((proc.stdout or "")[-3000:] + (proc.stderr or "")[-3000:])
        figs = res.get("figures", [])
        if proc.returncode == 0 and not figs:
            problems.append(f"{name}: no figures in {js.name}")
        for f in figs:
            bad = check_figure(f)
            if bad:
                problems.append(f"{name}/{f.get('name')}: {'; '.join(bad)}")
            f.update(benchmark=name, wall_s=dt, load_before=load0[0], load_after=load1[0])
            figures.append(f)
        rows.append(
            {"benchmark": name, "rc": proc.returncode, "wall_s": dt, "load_before": list(load0),
             "load_after": list(load1), "command": " ".join(["python", f"benchmarks/bench_{name}.py",
                                                              *(["--smoke"] if args.smoke else [])])}
        )  # fmt: skip
        rows[-1]["headline"] = headline(figs)
        # after each: a cut-short run keeps its part (an update's apart from the summary it updates)
        write_summary(out, args.smoke, run_t0, run_load0, rows, figures, partial)
    summary = ran = write_summary(out, args.smoke, run_t0, run_load0, rows, figures, partial)
    if args.update:
        summary = merge(earlier, ran)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        print(f"updated {args.update} -> {out / 'summary.json'}: re-ran {', '.join(r['benchmark'] for r in rows)}")
    print(
        f"\n{'benchmark':<14} {'rc':>3} {'s':>7} {'load':>10}  headline"
        + ("  (smoke: sizes too small to mean anything)" if args.smoke else "")
    )
    for r in rows:
        print(
            f"{r['benchmark']:<14} {r['rc']:>3} {r['wall_s']:>7.1f} {r['load_before'][0]:>4.1f}-"
            f"{r['load_after'][0]:<4.1f}  {r['headline']}"
        )
    print(f"all: {ran['wall_s'] / 60:.1f} min; {len(figures)} figures in {out / 'summary.json'}")  # this run's
    for p_ in problems:
        print(f"schema: {p_}")
    if tmp:
        tmp.cleanup()
    return 1 if problems or any(r["rc"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
