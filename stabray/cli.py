"""`python -m stabray <command>` (also installed as the `stabray` command).

stabray's own commands live in `stabray/commands/<name>.py`, each exposing `register(subparsers)`,
which adds its parser and sets `func(args) -> int`. Packages add commands through the entry-point
group `stabray.commands` (a `register(subparsers)` function each): `analysis` adds `report` and
`icl-figures` this way, so stabray never imports the analysis layer above it.

Errors a user can fix (`UserError`: an unknown task, a misspelled key, an impossible value) print
one line and exit with code 2, before any expensive work starts.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points

from stabray.errors import UserError

COMMANDS = ["sweep", "tasks", "data", "methods", "stability", "ui"]
ENTRY_POINTS = "stabray.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stabray", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"stabray.commands.{name}").register(sub)
    for ep in sorted(entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        ep.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
