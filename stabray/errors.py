"""Errors a user can fix. The CLI prints their message and exits with code 2."""

import difflib
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


class UserError(ValueError):
    """Bad input: an unknown name, a misspelled key, an impossible value."""


class SpecError(UserError):
    """A sweep spec that does not validate; the message names the field and the file. `related`: other
    fields the problem is about (a conflict between two), for saying which `--set` caused it."""

    def __init__(self, path: str, field: str, problem: str, related: tuple[str, ...] = ()):
        self.path, self.field, self.problem, self.related = str(path), field, problem, tuple(related)
        super().__init__(f"{self.path}: {field}: {problem}")


def one_line(message: object) -> str:
    """A message on one line: its non-blank lines, stripped, joined by single spaces (spaces within a
    line, as in a quoted path, are kept)."""
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip())


def run_script(main: Callable[[], int | None]) -> int:
    """The exit code of a script's `main` (None: 0), where a UserError prints `error: <message>` on
    one line and is code 2, as for stabray's commands; a failure that is not the input's keeps its
    own code. Used as `raise SystemExit(run_script(main))`."""
    try:
        return int(main() or 0)
    except UserError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2


def did_you_mean(
    word: object, choices: Iterable[str], n: int = 2, cutoff: float = 0.6, quote: bool = False, before: str = ""
) -> str:
    """`before` + "did you mean a or b?" naming the choices closest to a misspelled `word` (difflib's
    ratio at least `cutoff`, at most `n`, closest first; quoted with repr when `quote`), or "" when
    none is close."""
    close = difflib.get_close_matches(str(word), list(choices), n=n, cutoff=cutoff)
    return f"{before}did you mean {' or '.join(repr(c) if quote else c for c in close)}?" if close else ""


def unwritable(path: str | Path) -> str | None:
    """Why this process cannot create files at `path` (an existing folder, or the nearest existing
    folder above one still to be created), or None when it can (or when that is a file, which the
    callers' own checks name). Probed by creating and removing a nameless temporary file: permission
    bits say nothing for root, on /proc or /sys, or on a read-only mount."""
    path = Path(path).absolute()
    folder = next((p for p in (path, *path.parents) if p.exists()), None)
    if folder is None or not folder.is_dir():
        return None
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"cannot create files in {folder} ({e.strerror or type(e).__name__})"
    return None


def check_output_folder(out: str | Path, names: Iterable[str], force: bool, flag: str = "--out") -> Path:
    """A folder a command may write the files `names` into: new (created with its parents) or a
    directory, where this process can create files (probed at the nearest existing folder), and none
    of `names` is there unless `force` (other files in it are left alone). Raises UserError naming the
    problem; called before any work whose result would be lost."""
    out = Path(out)
    if blocked := next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None):
        raise UserError(f"{flag} {out}: {blocked} is a file, not a directory")
    if why := unwritable(out):
        raise UserError(f"{flag} {out}: {why}")
    there = [n for n in names if (out / n).exists()]
    if there and not force:
        raise UserError(f"{out / there[0]} exists; pass --force to overwrite it, or {flag} another folder")
    return out
