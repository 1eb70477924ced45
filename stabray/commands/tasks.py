"""`python -m stabray tasks [NAME ...]`: every task with one rendered example and its statistics
(mean question / answer length in tokens, mean number of steps, trivial-baseline accuracy) at the
default size and the length-generalization sizes."""

from __future__ import annotations

import argparse
import json
import textwrap

import numpy as np

from stabray.tasks import TASKS, get_task
from stabray.tasks.base import TOKEN_RE, Task

SPLITS = ("test", "test_long", "test_longer")  # default size, +10%, +20%


def count_tokens(text: str) -> int:
    """Tokens of the embedded word-level tokenizer: its pre-tokenizer is this regex and every
    pre-token is one vocabulary entry, so the count is exact."""
    return len(TOKEN_RE.findall(text))


def task_stats(task: Task, n: int = 50, seed: int = 0) -> list[dict]:
    """One row per size (default, +10%, +20%), each from n examples of that test split."""
    from stabray.data.splits import draw, split_size_of

    rows = []
    for split in SPLITS:
        size = split_size_of(task, split)
        exs = draw(task, split, n, seed, size)
        row = {
            "split": split,
            task.size_field: size,
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

    task = get_task(name)
    cls = type(task)
    aliases = TASKS.aliases_of(name)
    summary = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())  # first paragraph
    lines = [
        f"{name}" + (f" (alias: {', '.join(aliases)})" if aliases else "") + f"  v{task.version}",
        f"  {summary}",
        "  params: " + ", ".join(f"{k}={v}" for k, v in task.describe().items() if k not in ("task", "version")),
    ]
    if show_example:
        ex = draw(task, "test", 1, seed, task.size)[0]
        lines.append(f"  example (test split, {task.size_field}={task.size}, seed {seed}):")
        lines += [
            textwrap.indent(ex.question.rstrip("\n"), "    | "),
            textwrap.indent(ex.answer.rstrip("\n"), "    > "),
        ]
    rows = task_stats(task, n, seed)
    lines.append(f"  statistics over {n} test examples per size (tokens of the embedded tokenizer):")
    lines.append(
        f"    {task.size_field:>8}  {'question':>9}  {'answer':>7}  {'no-CoT':>6}  {'steps':>6}  "
        "trivial baselines (accuracy)"
    )
    for r in rows:
        base = ", ".join(f"{k[len('baseline: ') :]}: {v:.2f}" for k, v in r.items() if k.startswith("baseline: "))
        lines.append(
            f"    {r[task.size_field]:>8}  {r['question_tokens']:>9.1f}  {r['answer_tokens']:>7.1f}  "
            f"{r['answer_tokens_nocot']:>6.1f}  {r['steps']:>6.1f}  {base or '-'}"
        )
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
    p = subparsers.add_parser("tasks", help="list the tasks with an example and statistics", description=__doc__)
    p.add_argument("names", nargs="*", metavar="TASK", help="tasks to show (default: all)")
    p.add_argument("--n", type=int, default=50, help="examples per size for the statistics (default 50)")
    p.add_argument("--seed", type=int, default=0, help="seed of the examples shown and measured")
    p.add_argument("--no-example", action="store_true", help="statistics only")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(func=run)
