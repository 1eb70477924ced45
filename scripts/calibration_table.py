"""The README's laptop calibration table from calibration JSON lines (scripts/calibrate.py's --out;
scripts/calibration_results.jsonl holds every row measured so far): one row per trial, then the
mean ± std over seeds of every profile run with 3 or more seeds.

    python scripts/calibration_table.py scripts/calibration_results.jsonl [more.jsonl ...]
    python scripts/calibration_table.py scripts/calibration_results.jsonl --readme README.md

With --readme, the text between the README's `<!-- calibration-table: begin ...-->` and
`<!-- calibration-table: end -->` lines is replaced by the table instead of printing it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import yaml

PROFILES = Path(__file__).with_name("calibration_profiles.yaml")
BEGIN = "<!-- calibration-table: begin"
END = "<!-- calibration-table: end -->"


def compact(value) -> str:
    """A YAML flow value without quotes: {decimals: 1, train_sizes: [3, 4]}."""
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


def settings(name: str, profiles: dict) -> str:
    """What a profile changes against its parent, as in scripts/calibration_profiles.yaml."""
    entry = profiles.get(name) or {}
    if entry.get("not_shipped"):
        return f"{entry.get('parent')} + prototype-only option"
    sets = ", ".join(f"{k}={compact(v)}" for k, v in (entry.get("set") or {}).items())
    return f"{entry['parent']} + {sets}" if entry.get("parent") else "the base"


def cell(split: dict | None) -> str:
    return "-" if split is None else f"{split['acc']:.3f} ({split['best_rule']:.3f})"


def replace_block(text: str, table: str) -> str:
    """`text` with the lines between the begin and end markers replaced by `table`."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"the README must hold exactly one '{BEGIN} ...-->' line and one '{END}' line")
    head, rest = text.split(BEGIN, 1)
    marker, _, after = rest.partition("\n")
    _, tail = after.split(END, 1)
    return f"{head}{BEGIN}{marker}\n{table.strip()}\n{END}{tail}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--readme", type=Path, help="rewrite this file's calibration table in place")
    args = ap.parse_args()
    out = table(args.files)
    if args.readme is None:
        print(out, end="")
        return
    args.readme.write_text(replace_block(args.readme.read_text(), out))
    print(f"{args.readme}: calibration table rewritten ({out.count(chr(10))} lines)", file=sys.stderr)


def table(files: list[str]) -> str:
    """The per-trial table and the seed means of `files` (JSON lines), as Markdown."""
    lines: list[str] = []
    emit = lines.append
    profiles = yaml.safe_load(PROFILES.read_text())["profiles"]
    rows = [json.loads(line) for f in files for line in Path(f).read_text().splitlines() if line.strip()]
    emit(
        "| # | profile | seed | task | settings (changes vs parent) | train sizes | in-dist acc (rule) "
        "| long sizes | +1 acc (rule) | +2 acc (rule) | cpu min | wall min | code |"
    )
    emit("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    by_profile = defaultdict(list)
    for i, r in enumerate(rows, 1):
        splits = r["splits"]
        longs = [s for s in splits if s != "test"]
        train = ",".join(map(str, splits["test"]["sizes"]))
        long_sizes = ",".join(str(splits[s]["sizes"][0]) for s in longs)
        cpu = f"{r['cpu_min']:.2f}" if r.get("cpu_min") else "-"
        emit(
            f"| {i} | {r['profile']} | {r['seed']} | {r['task']} | {settings(r['profile'], profiles)} | {train} | "
            f"{cell(splits['test'])} | {long_sizes} | {cell(splits.get(longs[0]))} | "
            f"{cell(splits.get(longs[1]) if len(longs) > 1 else None)} | {cpu} | {r['wall_min']:.2f} | "
            f"{r['source']} |"
        )
        by_profile[r["profile"]].append(r)
    emit("\nSeed means (profiles run with >= 3 seeds; mean ± sample std over seeds, the rule in brackets):\n")
    emit("| profile | seeds | in-dist | +1 | +2 | cpu min |")
    emit("|---|---|---|---|---|---|")
    for name, rs in by_profile.items():
        if len(rs) < 3:
            continue
        cols = []
        for k in range(3):
            accs = [list(r["splits"].values())[k]["acc"] for r in rs]
            rule = list(rs[0]["splits"].values())[k]["best_rule"]
            cols.append(f"{statistics.mean(accs):.3f} ± {statistics.stdev(accs):.3f} ({rule:.3f})")
        cpus = [r["cpu_min"] for r in rs if r.get("cpu_min")]
        cpu = f"{statistics.mean(cpus):.2f}" if cpus else "-"
        seeds = ",".join(str(s) for s in sorted(r["seed"] for r in rs))
        emit(f"| {name} | {seeds} | {cols[0]} | {cols[1]} | {cols[2]} | {cpu} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
