"""What a sweep prints while it runs: one live view instead of Ray's per-trial boxes.

On a terminal it is a `rich` live display: a progress bar over trials and one over trial-epochs, and a
table of the running and ended trials (name, epoch, val_acc, best val_acc, val_eaf, state: running,
stopped by ASHA (or the EAF rule, or a search.stop_if rule) at epoch k, finished, failed). Elsewhere
(a log file, a pipe, CI) it prints one line per event instead: trial started, epoch reported, trial
ended. Lines stay within `WIDTH` characters.

It is a Ray Tune `Callback` on the driver; `stabray.tune.sweep` installs it and silences Ray's own
reporter (`-v` on the command line brings Ray's output back instead).
"""

from __future__ import annotations

import atexit
import math
import sys
import time
from typing import Any, Callable

from ray.tune import Callback

from stabray.config import get_path
from stabray.record import STOPPER_WORDS, run_name, trial_status, unwrap

WIDTH = 120  # the widest line the view prints
MAX_ROWS = 14  # table rows on a terminal: every running trial, then the best ended ones


class TrialRow:
    def __init__(self, index: int, name: str, max_epochs: int):
        self.index, self.name, self.max_epochs = index, name, max_epochs
        self.epoch = 0
        self.val_acc: float | None = None
        self.best: float | None = None
        self.eaf: float | None = None
        self.state = "running"
        self.ended = False

    def update(self, result: dict[str, Any]) -> None:
        self.epoch = int(result.get("epoch") or result.get("training_iteration") or self.epoch)
        if _num(result.get("val_acc")):
            self.val_acc = float(result["val_acc"])
            self.best = self.val_acc if self.best is None else max(self.best, self.val_acc)
        if _num(result.get("val_eaf")):
            self.eaf = float(result["val_eaf"])


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


class SweepConsole(Callback):
    """Live progress of one Ray Tune run of a sweep (a multi-method sweep runs one per method).

    `total`: trials to run; `epochs`: the most epochs a trial runs; `searched`: the searched config
    paths (they name the trials, as in MLflow); `namer`: the trial -> name function of the MLflow
    callback, so both show the same names."""

    def __init__(
        self,
        title: str,
        total: int,
        epochs: int,
        searched: list[str] | tuple[str, ...] = (),
        namer: Callable[[Any], str] | None = None,
        stopped_by: Callable[[str], str] | None = None,
    ):
        self.stopped_by = stopped_by  # trial_id -> who stopped it early ("asha", "eaf_stop", "stop_if")
        self.title, self.total, self.epochs = title, total, epochs
        self.searched, self.namer = list(searched), namer
        self.rows: dict[str, TrialRow] = {}
        self.t0: float | None = None
        self._console = None
        self._live = None

    def __getstate__(self):  # Ray pickles callbacks with the experiment; terminals do not pickle
        d = dict(self.__dict__)
        d["_console"] = d["_live"] = None
        d["rows"], d["t0"] = {}, None
        return d

    # -- what is known -----------------------------------------------------------------------
    def name(self, trial) -> str:
        if self.namer is not None:
            return self.namer(trial)
        return run_name(unwrap(trial.config), self.searched)

    def counts(self) -> tuple[int, int, int]:
        """(trials ended, trial-epochs done, trial-epochs the sweep will take at most by now)."""
        ended = sum(r.ended for r in self.rows.values())
        done = sum(r.epoch for r in self.rows.values())
        budget = sum(r.epoch if r.ended else r.max_epochs for r in self.rows.values())
        budget += max(0, self.total - len(self.rows)) * self.epochs
        return ended, done, budget

    def clock(self) -> str:
        s = int(time.monotonic() - (self.t0 or time.monotonic()))
        return f"{s // 60:2d}:{s % 60:02d}"

    # -- output ------------------------------------------------------------------------------
    @property
    def console(self):
        if self._console is None:
            from rich.console import Console

            probe = Console(file=sys.stdout)
            self._console = Console(file=sys.stdout, width=min(probe.width, WIDTH), highlight=False)
        return self._console

    def _start(self) -> None:
        if self.t0 is None:
            self.t0 = time.monotonic()
            self.line(
                f"{self.title}: {self.total} trials of up to {self.epochs} epochs"
                + (", searching " + ", ".join(p.rsplit(".", 1)[-1] for p in self.searched) if self.searched else "")
            )
        if self._live is None and self.console.is_terminal:
            from rich.live import Live

            self._live = Live(self, console=self.console, refresh_per_second=2, transient=False)
            self._live.start()
            atexit.register(self.close)

    def close(self) -> None:
        """Stop the live display (leaves its last frame on the screen)."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def line(self, text: str) -> None:
        """One event line (not while the live display shows the same in its table)."""
        if self._live is None:
            print(text[:WIDTH], file=self.console.file, flush=True)

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        ended, done, budget = self.counts()
        running = sum(not r.ended for r in self.rows.values())
        header = Text(
            f"{self.title}  {self.clock()}  trials {bar(ended, self.total)} {ended}/{self.total} ended, "
            f"{running} running"
        )
        epochs = Text(f"trial-epochs {bar(done, budget)} {done}/{budget}")
        table = Table(box=None, pad_edge=False, header_style="bold")
        for col, justify in (("#", "right"), ("trial", "left"), ("epoch", "right"), ("val_acc", "right"),
                             ("best", "right"), ("val_eaf", "right"), ("state", "left")):  # fmt: skip
            table.add_column(col, justify=justify, no_wrap=True, overflow="ellipsis")
        rows = sorted(self.rows.values(), key=lambda r: (r.ended, -(r.best or -1), r.index))
        for r in rows[:MAX_ROWS]:
            table.add_row(
                str(r.index),
                r.name,
                f"{r.epoch}/{r.max_epochs}",
                _fmt(r.val_acc),
                _fmt(r.best),
                _fmt(r.eaf),
                r.state,
                style="bold" if not r.ended else None,
            )
        parts = [header, epochs, table]
        if len(rows) > MAX_ROWS:
            parts.append(Text(f"... and {len(rows) - MAX_ROWS} more ended trials (MLflow has them all)"))
        return Group(*parts)

    # -- Ray Tune callback hooks --------------------------------------------------------------
    def setup(self, **info) -> None:
        self._start()

    def on_trial_start(self, iteration, trials, trial, **info):
        self._start()
        if trial.trial_id in self.rows:  # restarted after a failure, or resumed
            row = self.rows[trial.trial_id]
            row.ended, row.state = False, "running"
            return
        epochs = int(get_path(unwrap(trial.config), "train.epochs", self.epochs) or self.epochs)
        row = self.rows[trial.trial_id] = TrialRow(len(self.rows) + 1, self.name(trial), epochs)
        self.line(f"[{self.clock()}] start  {row.name}  (trial {row.index}/{self.total})")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if trial.trial_id not in self.rows:
            self.on_trial_start(iteration, trials, trial)
        row = self.rows[trial.trial_id]
        row.update(result)
        ended, done, budget = self.counts()
        self.line(
            f"[{self.clock()}] {row.name}  epoch {row.epoch:>2}/{row.max_epochs}  val_acc {_fmt(row.val_acc)}  "
            f"val_eaf {_fmt(row.eaf)}  [trial-epochs {done}/{budget}]"
        )

    def on_trial_complete(self, iteration, trials, trial, **info):
        row = self.rows.get(trial.trial_id)
        if row is None or row.ended:
            return
        last = trial.last_result or {}
        status = trial_status(failed=False, done=True, has_final="test_acc" in last)
        row.ended = True
        if status == "STOPPED":
            who = STOPPER_WORDS[self.stopped_by(trial.trial_id)] if self.stopped_by else "ASHA"
            row.state = f"stopped by {who} at epoch {row.epoch}"
            extra = f"best val_acc {_fmt(row.best)}"
        else:
            row.state = "finished"
            extra = f"val_acc {_fmt(row.val_acc)}  test_acc {_fmt(last.get('test_acc'))}  "
            extra += f"test_eaf {_fmt(last.get('test_eaf') if _num(last.get('test_eaf')) else None)}"
        ended, _, _ = self.counts()
        self.line(f"[{self.clock()}] {row.name}  {row.state}: {extra}  [{ended}/{self.total} trials ended]")

    def on_trial_error(self, iteration, trials, trial, **info):
        row = self.rows.get(trial.trial_id)
        if row is None:
            return
        row.ended, row.state = True, f"failed at epoch {row.epoch + 1}"
        path = getattr(trial, "path", None) or getattr(trial, "local_path", None)
        self.line(f"[{self.clock()}] {row.name}  {row.state}" + (f" (see {path}/error.txt)" if path else ""))

    def on_experiment_end(self, trials, **info):
        self.close()


def bar(done: int, total: int, width: int = 20) -> str:
    """A text progress bar, e.g. [#######.............]."""
    n = 0 if total <= 0 else min(width, round(width * done / total))
    return "[" + "#" * n + "." * (width - n) + "]"
