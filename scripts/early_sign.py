"""LEGO's early sign of the clause-lookup plateau, read off the calibration rows: for every delta_op run
at init std 0.1 tracked at epoch E (calibrate.py --track-every), the share of its test chains whose
first wrong token is a step's variable (token 0) at epoch E, beside `val_departure_tok0` at E (the
validation twin a sweep's `search.stop_if` rule reads; absent in rows older than that metric), when
it first fits (validation accuracy >= 0.95), and what the rule "share >= THRESHOLD: it never fits"
calls it; beside it the share off at the operation (token 1), the other lookup a stuck run can
lack. Rows are numbered from 1 over the file's non-blank lines (the README's calibration-table rows).

The threshold was chosen after looking at rows 165-180 (--chosen-on), so the 2x2 table and Fisher's
exact test are printed twice: on those rows (where the rule was read, so the p-value flatters it) and
on every later row (where it was tested). A third line applies the same threshold to the validation
twin on every row that has it: that is what a sweep's `search.stop_if` rule would have done.

  PYTHONPATH=. python scripts/early_sign.py [scripts/calibration_results.jsonl] [--epoch 40] [--threshold 0.5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scipy.stats import fisher_exact

from stabray.errors import run_script

FIT = 0.95  # validation accuracy that counts as fitting the training chains


def first_fit(row: dict) -> int | None:
    return next((int(e["epoch"]) for e in row.get("epochs", []) if e.get("val_acc", 0.0) >= FIT), None)


def reading(row: dict, epoch: int) -> tuple[float, float, float | None] | None:
    """(test share off at the variable, test share off at the operation, val_departure_tok0) at
    `epoch`, or None when not tracked then."""
    at = next((e for e in row.get("epochs", []) if int(e["epoch"]) == epoch), None)
    if at is None or "track_departure" not in at:
        return None
    n, off = row["final"]["test"]["n"], at["track_departure"]["test"]
    return off.get("0", 0) / n, off.get("1", 0) / n, at.get("val_departure_tok0")


def eligible(row: dict) -> bool:
    cfg = row.get("config", {})
    return (
        cfg.get("task", {}).get("params", {}).get("trace") == "delta_op" and cfg.get("model", {}).get("init_std") == 0.1
    )


def table(rows: list[tuple[int, dict]], epoch: int, threshold: float) -> list[dict]:
    out = []
    for i, r in rows:
        got = reading(r, epoch) if eligible(r) else None
        if got is None:
            continue
        share, op, val = got
        fit = first_fit(r)
        out.append(
            {
                "row": i,
                "profile": r["profile"].split("_")[0],
                "seed": r["seed"],
                "share": share,
                "op": op,
                "val": val,
                "fit": fit,
                "called_stuck": share >= threshold,
                "val_called_stuck": None if val is None else val >= threshold,
            }
        )
    return out


def two_by_two(items: list[dict], call: str = "called_stuck") -> tuple[list[list[int]], float | None]:
    """[[stuck called stuck, fitted called stuck], [stuck called fits, fitted called fits]] and Fisher's p,
    for the call in `call` (the test share's, or "val_called_stuck": the validation twin's)."""
    m = [[0, 0], [0, 0]]
    for t in items:
        m[0 if t[call] else 1][0 if t["fit"] is None else 1] += 1
    p = fisher_exact(m)[1] if items else None
    return m, p


def twin_tally(items: list[dict]) -> tuple[list[dict], list[list[int]], float | None, dict | None]:
    """The rule applied to the validation twin: the runs that have one, their 2x2 and Fisher's p (as
    `two_by_two`), and the run whose twin lies farthest from its test share (None without twins)."""
    twins = [t for t in items if t["val"] is not None]
    m, p = two_by_two(twins, "val_called_stuck")
    far = max(twins, key=lambda t: abs(t["val"] - t["share"]), default=None)
    return twins, m, p, far


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?", default=str(Path(__file__).with_name("calibration_results.jsonl")))
    ap.add_argument("--epoch", type=int, default=40)
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("--chosen-on", default="165-180", help="rows the threshold was read on (A-B)")
    args = ap.parse_args()
    try:
        lo, hi = (int(x) for x in args.chosen_on.split("-"))
    except ValueError:
        ap.error(f"--chosen-on {args.chosen_on!r}: expected two row numbers A-B (e.g. 165-180)")
    if not 1 <= lo <= hi:
        ap.error(f"--chosen-on {args.chosen_on}: expected rows A-B with 1 <= A <= B")
    if not 0 <= args.threshold <= 1:  # a share of chains (NaN fails this too)
        ap.error(f"--threshold {args.threshold}: a share of chains, between 0 and 1")
    if str(Path(__file__).resolve().parent) not in sys.path:  # the sibling script, also when imported
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from calibration_table import read_rows  # noqa: E402

    rows = list(enumerate(read_rows([args.results], need=("profile", "seed")), 1))
    tracked = sorted(  # the epochs whose test-split departures were counted (calibrate.py --track-every)
        {int(e["epoch"]) for _, r in rows if eligible(r) for e in r.get("epochs", []) if "track_departure" in e}
    )
    if args.epoch not in tracked:
        have = ", ".join(map(str, tracked)) or "none"
        ap.error(f"--epoch {args.epoch}: no run's test departures were counted then (tracked epochs: {have})")
    items = table(rows, args.epoch, args.threshold)
    print(f"delta_op runs at init std 0.1 tracked at epoch {args.epoch}; rule: share off at the variable >= "
          f"{args.threshold:g} -> never fits (val_acc >= {FIT} in no epoch)")  # fmt: skip
    head = f"{'row':>4} {'profile':8} {'seed':>4} {'test share':>10} {'(at op)':>8} {'val_dep_tok0':>12} {'fits at':>8}"
    print(head + "  called  right")
    for t in items:
        val = "-" if t["val"] is None else f"{t['val']:.3f}"
        fit = "never" if t["fit"] is None else str(t["fit"])
        called = "stuck" if t["called_stuck"] else "fits"
        right = t["called_stuck"] == (t["fit"] is None)
        print(
            f"{t['row']:>4} {t['profile']:8} {t['seed']:>4} {t['share']:>10.3f} {t['op']:>8.3f} {val:>12} {fit:>8}  "
            f"{called:6}  "
            f"{'yes' if right else 'NO'}"
        )
    twins, tm, tp, far = twin_tally(items)
    chosen = [t for t in items if lo <= t["row"] <= hi]
    later = [t for t in items if t["row"] > hi]
    for label, part, (m, p) in (
        (f"rows {lo}-{hi} (the threshold was read on these)", chosen, two_by_two(chosen)),
        (f"rows after {hi} (tested)", later, two_by_two(later)),
        ("validation twin (what a search.stop_if rule reads), every row with it", twins, (tm, tp)),
    ):
        right = m[0][0] + m[1][1]
        print(
            f"{label}: {len(part)} runs, called right {right}; called stuck: {m[0][0]} stuck, {m[0][1]} fit; "
            f"called fits: {m[1][0]} stuck, {m[1][1]} fit" + (f"; Fisher p = {p:.3f}" if p is not None else "")
        )
    if far is not None:
        print(f"largest gap between the validation twin and the test share: {abs(far['val'] - far['share']):.3f} "
              f"(row {far['row']}: {far['val']:.3f} against {far['share']:.3f})")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(run_script(main))
