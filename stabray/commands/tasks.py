"""`python -m stabray tasks [NAME ...]`: every task with one rendered example and its statistics
(mean question / answer length in tokens, mean number of steps, trivial-baseline accuracy) at the
size its shipped sweep spec trains on (sweeps/<task>.yaml; the generator's default when no spec
runs it) and at the length-generalization sizes. Long lines of an example wrap at 100 characters."""

from __future__ import annotations

import argparse
import json
import textwrap

import numpy as np

from stabray.tasks import TASKS, get_task
from stabray.tasks.base import TOKEN_RE, Task

WIDTH = 100  # example lines wrap here


def shipped_params(name: str) -> tuple[str | None, dict]:
    """(spec file, task params) of the first shipped spec that trains on the task, preferring the
    spec named after it; (None, {}) when none does."""
    from stabray.config import read_yaml
    from stabray.spec import SWEEPS_DIR, load_spec

    paths = sorted(p for p in SWEEPS_DIR.glob("*.yaml") if not p.stem.startswith("_"))
    paths.sort(key=lambda p: p.stem != name)
    for path in paths:
        raw = read_yaml(path)
        if (raw.get("task") or {}).get("name") not in (None, name):
            continue
        spec, _ = load_spec(str(path))
        if TASKS.canonical(spec.task.name) == name:
            return f"sweeps/{path.name}", dict(spec.task.params)
    return None, {}


MAX_WRAPPED = 8  # an example line longer than this many wrapped lines is elided (e.g. 200 ICL pairs)


def wrapped(text: str, prefix: str, task_name: str = "") -> list[str]:
    """Each line of `text` behind `prefix`, long lines wrapped (continuations indented by 2); a line
    that would take more than MAX_WRAPPED lines ends with a note of how much was left out."""
    out = []
    for line in text.rstrip("\n").split("\n"):
        parts = textwrap.wrap(line, WIDTH - len(prefix), subsequent_indent="  ", break_on_hyphens=False) or [""]
        if len(parts) > MAX_WRAPPED:
            left = len(line) - sum(len(p.strip()) + 1 for p in parts[:MAX_WRAPPED])
            parts = parts[:MAX_WRAPPED] + [
                f"  ... ({left:,} more characters; `stabray data {task_name} --n 1` prints all)"
            ]
        out += [prefix + part for part in parts]
    return out


def count_tokens(text: str) -> int:
    """Tokens of the embedded word-level tokenizer: its pre-tokenizer is this regex and every
    pre-token is one vocabulary entry, so the count is exact."""
    return len(TOKEN_RE.findall(text))


def task_stats(task: Task, n: int = 50, seed: int = 0) -> list[dict]:
    """One row per test split (the training size or mix, then the length-generalization sizes: +10%,
    +20%, or the task's explicit long_sizes), each from n examples of that split."""
    from stabray.data.splits import draw, split_size_of

    rows = []
    for split in ("test", *task.long_sizes()):
        size = split_size_of(task, split)
        exs = draw(task, split, n, seed, size)
        sizes = tuple(int(s) for s in np.atleast_1d(size))
        row = {
            "split": split,
            task.size_field: "-".join(map(str, sizes)) if len(sizes) > 1 else sizes[0],  # a training mix: "3-4"
            "n": n,
            "question_tokens": float(np.mean([count_tokens(e.question) for e in exs])),
            "answer_tokens": float(np.mean([count_tokens(e.answer) for e in exs])),
            "answer_tokens_nocot": float(np.mean([count_tokens(e.render_answer(None)) for e in exs])),
            "steps": float(np.mean([len(e.steps) for e in exs])),
        }
        for rule_name, acc in task.baseline_accuracy(exs).items():
            row[f"baseline: {rule_name}"] = float(acc)
        rows.append(row)
    return rows


def describe_task(name: str, n: int, seed: int, show_example: bool) -> tuple[str, dict]:
    from stabray.data.splits import draw

    spec_file, params = shipped_params(name)
    task = get_task(name, **params)
    cls = type(task)
    aliases = TASKS.aliases_of(name)
    doc = (cls.__doc__ or __import__(cls.__module__, fromlist=["x"]).__doc__ or "").strip()
    summary = " ".join(doc.split("\n\n")[0].split())  # first paragraph
    described = ", ".join(f"{k}={v}" for k, v in task.describe().items() if k not in ("task", "version"))
    lines = [f"{name}" + (f" (alias: {', '.join(aliases)})" if aliases else "") + f"  v{task.version}"]
    lines += textwrap.wrap(summary, WIDTH, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)
    where = f"as in {spec_file}" if spec_file else "the generator's defaults; no shipped spec trains on it"
    lines += textwrap.wrap(
        f"params ({where}): {described}", WIDTH, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False
    )
    if show_example:
        ex = draw(task, "test", 1, seed, task.size)[0]
        lines.append(f"  example (test split, {task.size_field}={task.size}, seed {seed}):")
        lines += wrapped(ex.question, "    | ", name) + wrapped(ex.answer, "    > ", name)
    rows = task_stats(task, n, seed)
    lines.append(f"  statistics over {n} test examples per size (tokens of the embedded tokenizer):")
    lines.append(
        f"    {task.size_field:>8}  {'question':>9}  {'answer':>7}  {'no-CoT':>6}  {'steps':>6}  "
        "trivial baselines (accuracy)"
    )
    for r in rows:
        base = ", ".join(f"{k[len('baseline: ') :]}: {v:.2f}" for k, v in r.items() if k.startswith("baseline: "))
        row = (
            f"    {r[task.size_field]:>8}  {r['question_tokens']:>9.1f}  {r['answer_tokens']:>7.1f}  "
            f"{r['answer_tokens_nocot']:>6.1f}  {r['steps']:>6.1f}  "
        )
        lines += textwrap.wrap(base or "-", 150, initial_indent=row, subsequent_indent=" " * len(row))  # a table row
    info = {"task": name, "aliases": aliases, "version": task.version, "params": task.describe(), "stats": rows}
    return "\n".join(lines), info


def run(args: argparse.Namespace) -> int:
    names = [TASKS.canonical(n) for n in args.names] if args.names else TASKS.names()
    infos = []
    for i, name in enumerate(names):
        text, info = describe_task(name, args.n, args.seed, not args.no_example)
        infos.append(info)
        if not args.json:
            print(("\n" if i else "") + text, flush=True)
    if args.json:
        print(json.dumps(infos, indent=2))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tasks",
        help="list the tasks with an example and statistics",
        description=__doc__.split(":", 1)[1].strip(),
    )
    p.add_argument("names", nargs="*", metavar="TASK", help="tasks to show (default: all)")
    p.add_argument("--n", type=int, default=50, help="examples per size for the statistics (default 50)")
    p.add_argument("--seed", type=int, default=0, help="seed of the examples shown and measured")
    p.add_argument("--no-example", action="store_true", help="statistics only")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(func=run)
