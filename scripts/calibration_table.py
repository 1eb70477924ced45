"""The README's laptop calibration table from calibration JSON lines (scripts/calibrate.py's --out;
scripts/calibration_results.jsonl holds every row measured so far): one row per trial, then the
mean ± std over seeds of every profile run with 3 or more seeds.

    python scripts/calibration_table.py scripts/calibration_results.jsonl [more.jsonl ...]
    python scripts/calibration_table.py scripts/calibration_results.jsonl --readme README.md
    python scripts/calibration_table.py scripts/calibration_results.jsonl --compare L32 L28

With --readme, the text between the README's `<!-- calibration-table: begin ...-->` and
`<!-- calibration-table: end -->` lines is replaced by the table instead of printing it.
With --compare A B (profile names or their prefix before the first `_`), it prints instead, per
split, A's mean and sample std over seeds, its margin over the split's best trivial rule with a
one-sample t-test against the rule (the rule is one number: every seed is tested on the same
examples), and A - B with Welch's t-test and, on the seeds both ran, a paired t-test and the
per-seed differences (pairing means most when both profiles draw the same data, i.e. the same task
settings: a seed then fixes the graphs each trains and is tested on). Both are two-sided; with 3-4
seeds a side they detect only large effects. When the rows did not all run on one kernel path
(calibrate.py's `machine` field; older rows have none), it says so: such seeds are draws, not reruns.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from stabray.errors import UserError, run_script

if str(Path(__file__).resolve().parent) not in sys.path:  # the sibling script (profile_config), also when imported
    sys.path.insert(0, str(Path(__file__).resolve().parent))

PROFILES = Path(__file__).with_name("calibration_profiles.yaml")
BEGIN = "<!-- calibration-table: begin"
END = "<!-- calibration-table: end -->"


def compact(value) -> str:
    """A YAML flow value without quotes: {decimals: 1, train_sizes: [3, 4]}."""
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


def settings(row: dict, doc: dict) -> str:
    """What a row's profile changes against its parent, as in scripts/calibration_profiles.yaml (`doc`),
    then the row's `--set` overrides that give a field another value than the profile does (calibrate.py
    records them; some older rows repeat a profile's own fields). A row named with `--label` is
    read under the profile it ran (`from_profile`); a name that is no profile is said to be one."""
    from calibrate import profile_config

    name = row.get("from_profile", row["profile"])
    entry = doc["profiles"].get(name)
    if name not in doc["profiles"]:
        text = "not a profile of calibration_profiles.yaml"
    elif (entry or {}).get("not_shipped"):
        text = f"{entry.get('parent')} + prototype-only option"
    elif (entry or {}).get("parent"):
        text = f"{entry['parent']} + " + ", ".join(f"{k}={compact(v)}" for k, v in (entry.get("set") or {}).items())
    else:
        text = "the base"
    if "from_profile" in row:
        text = f"profile {name}: {text}"
    if name in doc["profiles"] and not (entry or {}).get("not_shipped"):
        base = profile_config(name, doc)
        items = [str(item) for item in row.get("overrides") or []]
        last = dict(item.split("=", 1) for item in items if "=" in item)  # the last --set of a key wins
        own = [f"{k}={v}" for k, v in last.items() if differs(base, k, v)] + [i for i in items if "=" not in i]
        if own:
            text += "; --set " + ", ".join(own)
    return text.replace("|", "\\|")  # a Markdown cell


def differs(config: dict, key: str, value: str) -> bool:
    """Whether `--set key=value` gives the field another value than `config` holds."""
    from stabray.config import get_path

    def number(x):  # PyYAML reads 1e-3 as a string; the trial config reads it as 0.001
        if isinstance(x, str):
            try:
                return float(x)
            except ValueError:
                return x
        return x

    try:
        given = yaml.safe_load(value)
    except yaml.YAMLError:
        return True
    held = get_path(config, key, missing := object())
    return held is missing or number(given) != number(held)


def cell(split: dict | None) -> str:
    return "-" if split is None else f"{split['acc']:.3f} ({split['best_rule']:.3f})"


def replace_block(text: str, table: str) -> str:
    """`text` with the lines between the begin and end markers replaced by `table`."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise UserError(f"the README must hold exactly one '{BEGIN} ...-->' line and one '{END}' line")
    head, rest = text.split(BEGIN, 1)
    marker, _, after = rest.partition("\n")
    _, tail = after.split(END, 1)
    return f"{head}{BEGIN}{marker}\n{table.strip()}\n{END}{tail}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--readme", type=Path, help="rewrite this file's calibration table in place")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two profiles over seeds")
    args = ap.parse_args()
    if args.compare:
        print(compare(args.files, *args.compare), end="")
        return
    out = table(args.files)
    if args.readme is None:
        print(out, end="")
        return
    args.readme.write_text(replace_block(args.readme.read_text(), out))
    print(f"{args.readme}: calibration table rewritten ({out.count(chr(10))} lines)", file=sys.stderr)


def read_rows(files: list[str], need: tuple[str, ...] = ("profile", "seed", "splits")) -> list[dict]:
    """Every calibration row in `files` (JSON lines), in order. A file that cannot be read, a line that
    is not a JSON object and a row without the keys `need` are UserErrors naming the file and line."""
    rows = []
    for f in files:
        try:
            text = Path(f).read_text()
        except OSError as e:
            raise UserError(f"{f}: cannot read it ({e.strerror or type(e).__name__})") from None
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise UserError(f"{f}, line {n}: not valid JSON ({e})") from None
            if not isinstance(row, dict) or (missing := [k for k in need if k not in row]):
                what = f"no {', '.join(missing)}" if isinstance(row, dict) else f"a JSON {type(row).__name__}"
                raise UserError(f"{f}, line {n}: not a calibration row ({what})")
            rows.append(row)
    return rows


def table(files: list[str]) -> str:
    """The per-trial table and the seed means of `files` (JSON lines), as Markdown."""
    lines: list[str] = []
    emit = lines.append
    doc = yaml.safe_load(PROFILES.read_text())
    rows = read_rows(files)
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
            f"| {i} | {r['profile']} | {r['seed']} | {r['task']} | {settings(r, doc)} | {train} | "
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


def _profile_rows(rows: list[dict], name: str) -> dict[int, dict]:
    """The rows of the profile called `name`, or whose name starts with `name` + "_", by seed."""
    names = {r["profile"] for r in rows if r["profile"] == name or r["profile"].startswith(name + "_")}
    if len(names) != 1:
        found = ", ".join(sorted(names)) or "none"
        raise UserError(f"--compare: {name!r} must name exactly one profile in the results (matches: {found})")
    (full,) = names
    by_seed: dict[int, dict] = {}
    for r in rows:
        if r["profile"] == full:
            if r["seed"] in by_seed:
                raise UserError(f"--compare: profile {full} has seed {r['seed']} twice")
            by_seed[r["seed"]] = r
    return by_seed


def kernel_paths(side: dict[int, dict]) -> list[str]:
    """The kernel paths (`machine.kernels` of calibrate.py's rows) a profile's seeds ran on; rows from
    before it was recorded count as "not recorded"."""
    return sorted({(r.get("machine") or {}).get("kernels", "not recorded") for r in side.values()})


def compare(files: list[str], a: str, b: str) -> str:
    """Profile `a` against its trivial rules and against profile `b`, split by split (see the module
    docstring); a split missing from either side is skipped, and one drawn at other sizes on the two
    sides (the in-distribution `test` of profiles trained on different mixes) is named, not compared."""
    from scipy import stats

    from analysis.tables import fmt_p, welch

    rows = read_rows(files)
    ra, rb = _profile_rows(rows, a), _profile_rows(rows, b)
    name_a, name_b = next(iter(ra.values()))["profile"], next(iter(rb.values()))["profile"]
    if name_a == name_b:
        raise UserError(f"--compare: {a!r} and {b!r} name the same profile ({name_a}); compare two")
    task_a, task_b = next(iter(ra.values())).get("task"), next(iter(rb.values())).get("task")
    if task_a != task_b:
        raise UserError(f"--compare: {name_a} ({task_a}) and {name_b} ({task_b}) are different tasks")
    out = [f"A = {name_a} (seeds {sorted(ra)})", f"B = {name_b} (seeds {sorted(rb)})"]
    pa, pb = kernel_paths(ra), kernel_paths(rb)
    if pa != pb or len(pa) > 1:  # one path on both sides is the only like-for-like case
        out.append(
            f"kernel paths differ (A: {'; '.join(pa)}; B: {'; '.join(pb)}): rows from another path part at "
            "the 4th decimal of their loss within a few epochs, so seeds are draws, not reruns"
        )
    common = sorted(set(ra) & set(rb))
    for split in next(iter(ra.values()))["splits"]:
        if any(split not in r["splits"] for r in [*ra.values(), *rb.values()]):
            continue
        sizes = {tuple(r["splits"][split]["sizes"]) for r in [*ra.values(), *rb.values()]}
        if len(sizes) > 1:  # e.g. `test` of profiles trained on different size mixes: unlike examples
            listed = " and ".join(",".join(map(str, s)) for s in sorted(sizes))
            out.append(f"{split}: not compared: drawn at sizes {listed} (different inputs on the two sides)")
            continue
        xa = [ra[s]["splits"][split]["acc"] for s in sorted(ra)]
        xb = [rb[s]["splits"][split]["acc"] for s in sorted(rb)]
        rule = next(iter(ra.values()))["splits"][split]["best_rule"]
        mean_a = statistics.mean(xa)
        sd = statistics.stdev(xa) if len(xa) > 1 else 0.0
        spread = f"± {sd:.3f}" if len(xa) > 1 else "(one seed)"
        line = f"{split}: A {mean_a:.3f} {spread}, rule {rule:.3f}, A - rule {mean_a - rule:+.3f}"
        if len(xa) > 1 and sd > 0:
            line += f" (t-test p={fmt_p(float(stats.ttest_1samp(xa, rule).pvalue))})"
        line += f"; A - B {mean_a - statistics.mean(xb):+.3f}"
        w = welch(xa, xb)
        if w is not None:
            line += f" (Welch p={fmt_p(w[2])})"
        if len(common) > 1:
            pa = [ra[s]["splits"][split]["acc"] for s in common]
            pb = [rb[s]["splits"][split]["acc"] for s in common]
            diffs = [x - y for x, y in zip(pa, pb)]
            pair = stats.ttest_rel(pa, pb)
            p = fmt_p(float(pair.pvalue)) if statistics.pstdev(diffs) > 0 else "-"
            line += f", paired on seeds {common}: {' '.join(f'{d:+.3f}' for d in diffs)} (p={p})"
        elif common:  # one shared seed: its difference, no test
            (s,) = common
            line += f", on seed {s}: {ra[s]['splits'][split]['acc'] - rb[s]['splits'][split]['acc']:+.3f}"
        out.append(line)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(run_script(main))
