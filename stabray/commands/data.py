"""`python -m stabray data TASK --split test --n 200 --out F.jsonl`: write examples as JSON lines.

Each line has `question`, `steps` (list of strings), `final`, `answer` (the full answer text with
every step, exactly as SFT-CoT trains on it), `question_nohint` and `meta` (the generator's inputs,
e.g. the adjacency matrix and source). Without `--size` the split is the one training and
evaluation use for that seed at the paper's split sizes (train excludes every question of the
evaluation splits; an evaluation split redraws the questions of the ones before it, so a test split
is a spec's when its validation split has the paper's 200 examples); with `--size` it is drawn at
that size (test then excludes that size's val questions, train its val and test questions).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stabray.errors import UserError, unwritable

SPLITS = ("train", "val", "test", "test_long", "test_longer")  # a task with long_sizes has test_n<k> instead


def parse_params(items: list[str]) -> dict:
    """key=value pairs; values are parsed as JSON when they can be (10, 0.5, true), else strings."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--param expects key=value, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def examples(task, split: str, n: int, seed: int, size: int | None):
    from stabray.data.splits import DEFAULT_SIZES, draw, make_splits

    known = ("train", "val", "test", *task.long_sizes())
    if split not in known:
        raise UserError(f"task {task.name!r} has no split {split!r}; its splits: {', '.join(known)}")
    if size is None:
        # train: exactly the training split a sweep uses (it excludes every evaluation split)
        return make_splits(task, {split: n}, seed, splits=(split,) if split != "train" else None)[split]
    exclude: set[str] = set()
    for s in {"train": ("val", "test"), "test": ("val",)}.get(split, ()):
        exclude.update(e.question for e in draw(task, s, DEFAULT_SIZES[s], seed, size, exclude=set(exclude)))
    return draw(task, split, n, seed, size, exclude=exclude)


def check_output_file(path: str, force: bool) -> Path:
    """An output file we may write: its folder exists, it is not a folder, and it is new unless --force."""
    out = Path(path)
    if out.is_dir():
        raise UserError(f"--out {path}: is a directory; give a file name (e.g. {out / 'examples.jsonl'})")
    if not out.parent.is_dir():
        raise UserError(f"--out {path}: the directory {out.parent} does not exist")
    if out.exists() and not force:
        raise UserError(f"--out {path}: the file exists; pass --force to overwrite it")
    if why := unwritable(out.parent):
        raise UserError(f"--out {path}: {why}")
    return out


def run(args: argparse.Namespace) -> int:
    from stabray.tasks import get_task

    if args.n < 1:
        raise UserError(f"--n must be >= 1, got {args.n}")
    if not 0 <= args.seed < 2**32:  # a dataset seed, as task.data_seed in a spec
        raise UserError(f"--seed must be in 0..2**32-1, got {args.seed}")
    path = None if args.out == "-" else check_output_file(args.out, args.force)
    task = get_task(args.task, **parse_params(args.param))
    exs = examples(task, args.split, args.n, args.seed, args.size)
    lines = "".join(json.dumps({**e.to_record(), "meta": e.meta}) + "\n" for e in exs)
    if path is None:
        sys.stdout.write(lines)
    else:
        path.write_text(lines, encoding="utf-8")
    size = args.size if args.size is not None else exs[0].meta.get("n")
    print(
        f"wrote {len(exs)} {task.name} examples ({args.split}, {task.size_field}={size}, seed {args.seed}) "
        f"to {args.out if args.out != '-' else 'stdout'}",
        file=sys.stderr,
    )
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "data",
        help="write a task's examples as JSON lines",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("task", help="task name (see `python -m stabray tasks`)")
    p.add_argument(
        "--split",
        default="test",
        help=f"which split: {', '.join(SPLITS)}, or test_n<k> for a task's long_sizes (default test)",
    )
    p.add_argument("--n", type=int, default=200, help="number of examples (default 200)")
    p.add_argument("--out", default="-", help="output .jsonl file ('-' = stdout, the default)")
    p.add_argument("--force", action="store_true", help="overwrite --out when it exists")
    p.add_argument("--seed", type=int, default=0, help="dataset seed (default 0, as in sweeps)")
    p.add_argument(
        "--size", type=int, default=None, help="input size (nodes / variables) to draw at, overriding the split's own"
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task generator parameter, e.g. n_nodes=5 or p=0.3 (repeatable)",
    )
    p.set_defaults(func=run)
