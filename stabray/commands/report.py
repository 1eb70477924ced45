"""`python -m stabray report`: the same command as `python -m analysis report`."""

from analysis.cli import register  # noqa: F401
