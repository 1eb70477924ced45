"""Checkpoint loading for tools (stability CLI, analysis): see TrialRun.save for the layout."""

from stabray.train.run import load_checkpoint, load_run

__all__ = ["load_checkpoint", "load_run"]
