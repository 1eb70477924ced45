"""`stabray` (or `python -m stabray`): the command line.

stabray's own commands live in `stabray/commands/<name>.py`, each exposing `register(subparsers)`,
which adds its parser and sets `func(args) -> int`. Packages add commands through the entry-point
group `stabray.commands` (a `register(subparsers)` function each): `analysis` adds `report`,
`icl-figures` and `reproduce` this way, so stabray never imports the analysis layer above it.

Errors a user can fix (`UserError`: an unknown task, a misspelled key, an impossible value) print
one line and exit with code 2, before any expensive work starts.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from importlib.metadata import entry_points

from stabray.errors import UserError, one_line

COMMANDS = ["sweep", "tasks", "data", "methods", "stability", "ui"]
ENTRY_POINTS = "stabray.commands"

ABOUT = """\
stabray: sweeps that measure and control the stability of multi-step reasoning.

A sweep fine-tunes a language model on a reasoning task with intermediate steps (a CLRS algorithm
trace, a LEGO chain, a planning task) with one or more training methods (Algorithm 1 of Li et al.
2026: chain compression + quantization-aware training, and its baselines). Optuna searches the
hyperparameters, ASHA stops weak trials early, Ray Tune runs the trials, and every trial reports its
accuracy and its error amplification factor (EAF) to MLflow."""

EXAMPLES = """\
examples:
  stabray sweep dijkstra                     run the default sweep (8 trials, ~3 min on 2 CPU cores)
  stabray sweep dijkstra --dry-run           validate and print the resolved spec
  stabray sweep dijkstra --set train.epochs=4 --set search.num_samples=4
  stabray ui                                 browse the trials in MLflow (./mlflow.db)
  stabray ui --optuna                        browse the latest sweep's Optuna study
  stabray report --experiment dijkstra       tables and figures of a sweep into reports/dijkstra
  stabray tasks dijkstra                     a task's example and statistics
  stabray methods                            every method with its hyperparameters

`stabray COMMAND --help` explains a command. `python -m stabray` works the same."""


def shipped_specs() -> list[str]:
    """Names of the sweep specs that ship in sweeps/ (what `stabray sweep NAME` accepts)."""
    from stabray.spec import SWEEPS_DIR

    return sorted(
        str(p.relative_to(SWEEPS_DIR).with_suffix("")) for p in SWEEPS_DIR.rglob("*.yaml") if not p.stem.startswith("_")
    )


def epilog() -> str:
    specs = textwrap.fill(
        ", ".join(shipped_specs()), 96, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False
    )
    return f"{EXAMPLES}\n\nshipped sweep specs (sweeps/*.yaml; a path to your own YAML works too):\n{specs}"


def version() -> str:
    from stabray import __version__

    return __version__


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (argparse prints the usage first), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="stabray", description=ABOUT, epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"stabray {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name in COMMANDS:
        importlib.import_module(f"stabray.commands.{name}").register(sub)
    for ep in sorted(entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        ep.load()(sub)
    parser.set_defaults(commands=sub.choices)  # each command's parser, by name
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the command's parser, which knows the command's arguments
        args.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
