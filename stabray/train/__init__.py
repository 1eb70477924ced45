"""Training without Ray or MLflow: the loop (`Trainer`) and the trial runners behind one protocol.

from stabray.train import make_run, load_run
"""

from stabray.train import icl, run  # noqa: F401  (registers the "icl" and "text" runners)
from stabray.train.loop import Trainer, pick_device
from stabray.train.runner import RUNNERS, Runner, StabilityOptions, StabilityTable, load_run, make_run

__all__ = [
    "RUNNERS",
    "Runner",
    "StabilityOptions",
    "StabilityTable",
    "Trainer",
    "load_run",
    "make_run",
    "pick_device",
]
