"""`python -m stabray <command>`. Each command lives in `stabray/commands/<name>.py` and exposes
`register(subparsers)`, which adds its parser and sets `func(args) -> int`.

Errors a user can fix (`UserError`: an unknown task, a misspelled key, an impossible value) print
one line and exit with code 2, before any expensive work starts.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from stabray.errors import UserError

COMMANDS = ["sweep", "tasks", "data", "methods", "stability", "report", "ui"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stabray", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"stabray.commands.{name}")
        except ModuleNotFoundError as e:  # a command not built yet in this checkout
            if e.name == f"stabray.commands.{name}":
                continue
            raise
        mod.register(sub)
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
