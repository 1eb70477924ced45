"""Progress on stderr for work that may take more than a few seconds (data generation, reading a
sweep back from MLflow, the eq. (4) measurement, a report), so stdout keeps only the results.

- `stage(text)`: one step of unknown length. On a terminal a spinner while it runs, and a line with
  the time taken when that was `quiet_s` or more; in a log, a line when it starts and one when it ends.
- `counted(text, total)`: a loop of known length. Nothing for the first `after_s` seconds (fast work
  prints nothing), then `text: k/total` at most every `every_s` seconds (rewritten in place on a
  terminal), and a last line with the time taken.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator


def _tty() -> bool:
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


@contextmanager
def stage(text: str, quiet_s: float = 2.0) -> Iterator[None]:
    t0 = time.perf_counter()
    if _tty():
        from rich.console import Console

        with Console(stderr=True).status(f"{text} ...", spinner="dots"):
            yield
    else:
        print(f"{text} ...", file=sys.stderr, flush=True)
        yield
    dt = time.perf_counter() - t0
    if dt >= quiet_s or not _tty():
        print(f"{text}: done in {dt:.1f} s", file=sys.stderr, flush=True)


class counted:
    """with counted("generating dijkstra train", n) as p: ... p.advance() ..."""

    def __init__(self, text: str, total: int, after_s: float = 3.0, every_s: float = 2.0):
        self.text, self.total, self.after_s, self.every_s = text, total, after_s, every_s
        self.done, self.shown = 0, False
        self.t0 = self.last = time.perf_counter()
        self.tty = _tty()

    def __enter__(self) -> counted:
        return self

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self.t0 >= self.after_s and now - self.last >= self.every_s:
            self.last, self.shown = now, True
            eta = (now - self.t0) / self.done * (self.total - self.done) if self.done else 0.0
            msg = f"{self.text}: {self.done}/{self.total} ({now - self.t0:.0f} s, about {eta:.0f} s left)"
            print(
                ("\r" + msg + "\033[K") if self.tty else msg, end="" if self.tty else "\n", file=sys.stderr, flush=True
            )

    def __exit__(self, *exc) -> None:
        if self.shown:
            msg = f"{self.text}: {self.done}/{self.total} in {time.perf_counter() - self.t0:.1f} s"
            print(("\r" + msg + "\033[K") if self.tty else msg, file=sys.stderr, flush=True)
