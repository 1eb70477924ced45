"""What every benchmark shares: the figure record that `run_all.py` collects into summary.json, robust
statistics over repeats, and the machine's load.

A figure is one number of the README's Performance table:

    name      stable id (e.g. "sweep_overhead")
    label     what it measures, in words (the table's first column)
    value     median over the repeats of the measured side, in `unit`
    unit      "x" (a ratio), "%" (a share), "s", "GB", "acc" (a fraction of examples), ...
    baseline  median of the side it is compared with, in `unit`; None when there is none
    ratio     median of the per-repeat ratios value / baseline; None when there is no baseline, or when
              the comparison is a difference (accuracies): then `difference` holds the median of the
              per-repeat differences value - baseline
    repeats   how many measurements the median is over
    min, max  range over the repeats of the statistic the target is on (`ratio` when there is a
              baseline, else `value`)
    target    "<= 1.1", ">= 5", ... on that statistic, or None
    met       whether the median meets the target (None without a target)
    command   the command that reproduces it
"""

from __future__ import annotations

import argparse
import operator
import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable

FIELDS = ("name", "value", "unit", "baseline", "ratio", "repeats", "min", "max", "target", "met", "command")
OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


def load() -> float:
    """The 1-minute load average (processes running or waiting for a core)."""
    return os.getloadavg()[0]


def median(xs: Iterable[float]) -> float:
    return float(statistics.median(list(xs)))


def meets(x: float, target: str | None) -> bool | None:
    if not target:
        return None
    op, bound = target.split()
    return bool(OPS[op](x, float(bound)))


def figure(
    name: str,
    label: str,
    values: list[float],
    unit: str,
    command: str,
    *,
    baselines: list[float] | None = None,
    target: str | None = None,
    detail: str = "",
    on: str | None = None,
    compare: str = "ratio",
) -> dict[str, Any]:
    """One figure from per-repeat measurements. With `baselines` (same length, same repeats, measured
    interleaved with `values`), the target and the range are on the per-repeat ratios, else on the
    values. `on` overrides which statistic the target is on ("value" or "ratio")."""
    if baselines is not None and len(baselines) != len(values):
        raise ValueError(f"{name}: {len(values)} values but {len(baselines)} baselines")
    ratios = diffs = None
    if baselines is not None and compare == "ratio":
        ratios = [v / b for v, b in zip(values, baselines)]
    elif baselines is not None:
        diffs = [v - b for v, b in zip(values, baselines)]
    on = on or ("ratio" if ratios is not None else "difference" if diffs is not None else "value")
    stat = {"ratio": ratios, "difference": diffs, "value": values}[on]
    med = median(stat)
    return {
        "name": name,
        "label": label,
        "value": median(values),
        "unit": unit,
        "baseline": median(baselines) if baselines is not None else None,
        "ratio": median(ratios) if ratios is not None else None,
        **({"difference": median(diffs)} if diffs is not None else {}),
        "repeats": len(values),
        "min": min(stat),
        "max": max(stat),
        "target": target,
        "target_on": on,
        "met": meets(med, target),
        "command": command,
        "detail": detail,
        "samples": {"values": values, **({"baselines": baselines} if baselines is not None else {})},
    }


def command(script: str, argv: list[str] | None) -> str:
    """The command line that reproduces a figure (without --json, which only says where to write)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--json" in args:
        i = args.index("--json")
        del args[i : i + 2]
    return " ".join(["python", f"benchmarks/{Path(script).name}", *map(shlex.quote, args)])


def check_figure(f: dict[str, Any]) -> list[str]:
    """Problems with one figure record (empty: it follows the schema)."""
    bad = [f"missing {k}" for k in FIELDS if k not in f]
    if bad:
        return bad
    num = (int, float)
    if not isinstance(f["name"], str) or not f["name"]:
        bad.append("name: not a non-empty string")
    for k in ("value", "min", "max"):
        if not isinstance(f[k], num):
            bad.append(f"{k}: not a number")
    for k in ("baseline", "ratio"):
        if f[k] is not None and not isinstance(f[k], num):
            bad.append(f"{k}: not a number or null")
    if (f["baseline"] is None) != (f["ratio"] is None and f.get("difference") is None):
        bad.append("baseline and ratio (or difference): both or neither")
    if not isinstance(f["repeats"], int) or f["repeats"] < 1:
        bad.append("repeats: not a positive integer")
    if not isinstance(f["unit"], str) or not isinstance(f["command"], str) or not f["command"].startswith("python "):
        bad.append("unit/command: not strings (command starts with 'python ')")
    if f["target"] is not None:
        parts = str(f["target"]).split()
        if len(parts) != 2 or parts[0] not in OPS:
            bad.append(f"target: {f['target']!r} is not '<op> <number>'")
        elif not isinstance(f["met"], bool):
            bad.append("met: not a boolean for a figure with a target")
    elif f["met"] is not None:
        bad.append("met: set without a target")
    if not bad and f["min"] > f["max"]:
        bad.append("min > max")
    return bad


loadavg = load  # for scripts where `load` names something else


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (a count of steps, repeats, threads, examples, epochs)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def json_out(text: str) -> str:
    """argparse type of `--json`: a file whose folder exists, checked before anything is measured (a
    measurement that took minutes is not lost to a typo in the path written last)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not path.absolute().parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder {path.absolute().parent} does not exist")
    return text
