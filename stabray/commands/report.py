"""`python -m stabray report` and `python -m stabray icl-figures`: the same commands as
`python -m analysis report` / `python -m analysis icl-figures`."""

from analysis.cli import register as _register_report
from analysis.cli import register_icl_figures


def register(subparsers) -> None:
    _register_report(subparsers)
    register_icl_figures(subparsers)
