"""SIGINT (Ctrl-C) and SIGTERM during a sweep: stop Ray Tune the way it stops itself, then let the
sweep mark its MLflow runs KILLED and print how to resume.

Ray Tune's own SIGINT handler ends `Tuner.fit()` after saving the experiment state one last time
(so `Tuner.restore` continues every unfinished trial), but it tells no one that it did, and Ray
leaves SIGTERM to kill the driver outright. `GracefulStop` installs one handler for both signals
(Ray Tune's SIGINT handler is turned off with TUNE_DISABLE_SIGINT_HANDLER) that records the signal
and, while `fit()` runs, sends SIGUSR1: Ray Tune's other "stop gracefully" signal, which its fit
loop always listens to. A second signal stops at once (KeyboardInterrupt), as Ray Tune's does.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulStop:
    """Context manager for a sweep's driver (main thread only). `signal` is the first signal
    received (None when none was); `in_fit()` wraps each `Tuner.fit()`."""

    def __init__(self):
        self.signal: int | None = None
        self._fitting = False
        self._saved: dict[int, object] = {}
        self._saved_env: str | None = None

    def __enter__(self) -> GracefulStop:
        self._saved_env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # ours forwards to Ray Tune instead
        for s in SIGNALS:
            self._saved[s] = signal.signal(s, self._handle)
        return self

    def install(self) -> None:
        """Take the signals again: `ray.init` puts its own SIGTERM handler in place (it prints a stack
        trace and aborts the driver)."""
        for s in SIGNALS:
            signal.signal(s, self._handle)

    def __exit__(self, *exc) -> None:
        for s, h in self._saved.items():
            signal.signal(s, h)
        if self._saved_env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = self._saved_env

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signal).name if self.signal is not None else None

    @contextmanager
    def in_fit(self):
        """Around `Tuner.fit()`. Until Ray Tune installs its SIGUSR1 handler (early in fit), a
        placeholder holds the signal's place: SIGUSR1's default action would kill the driver."""
        saved = signal.signal(signal.SIGUSR1, _placeholder)
        self._fitting = True
        try:
            yield
        finally:
            self._fitting = False
            signal.signal(signal.SIGUSR1, saved)

    def _handle(self, signum, frame) -> None:
        first = self.signal is None
        if first:
            self.signal = signum
        if first and self._fitting and signal.getsignal(signal.SIGUSR1) is not _placeholder:
            os.kill(os.getpid(), signal.SIGUSR1)  # Ray Tune: save the experiment state, end fit()
            return
        raise KeyboardInterrupt  # a second signal, or one before Ray Tune listens: stop now


def _placeholder(signum, frame) -> None:
    """SIGUSR1 before Ray Tune's handler is in place: ignored (our own handler never sends it then)."""
