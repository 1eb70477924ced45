"""`python -m stabray ui`: start the MLflow UI on a sweep's store and print its URL (and, for each
sweep, the link to its runs table with the columns that matter). `--optuna` serves the Optuna
dashboard on a sweep's study instead (`<run dir>/optuna.db`, beside the Ray results)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("ui", help="start the MLflow UI on a sweep's tracking store and print its URL")
    p.add_argument("--tracking-uri", help="store to browse (default: $MLFLOW_TRACKING_URI, else sqlite ./mlflow.db)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--no-wait", action="store_true", help="start it, print the URL once it answers, and exit")
    p.add_argument(
        "--optuna",
        nargs="?",
        const="latest",
        metavar="RUN_DIR",
        help="serve optuna-dashboard on a sweep's Optuna study instead: a run directory or its optuna.db "
        "(default: the newest under --storage)",
    )
    p.add_argument(
        "--storage", default="stabray_runs", help="Ray results folder the sweeps wrote (default ./stabray_runs)"
    )
    p.set_defaults(func=run)


SHOWN = 10  # experiment links printed at start-up (newest first)


def print_links(uri: str, url: str) -> None:
    """Each experiment's runs table, in MLflow's model-training view with the sweep's columns: the
    SHOWN newest, then how many more the UI's experiment list holds."""
    from stabray.tracking import experiment_links

    try:
        links = experiment_links(uri, url)
    except Exception:  # noqa: BLE001 - the links are a convenience; the server runs anyway
        return
    for name, link in links[:SHOWN]:
        print(f"  {name}: {link}", flush=True)
    if len(links) > SHOWN:
        print(f"  ... and {len(links) - SHOWN} older experiments: {url.rstrip('/')}/#/experiments", flush=True)


@contextlib.contextmanager
def served(cmd: list[str], no_wait: bool):
    """Run a server (MLflow's, or optuna-dashboard) in a session of its own for the `with` block and stop
    its whole process group when the block ends (the MLflow server runs uvicorn and job workers as
    children; terminating only the process we started would leave them serving). Ctrl-C, SIGTERM and
    SIGHUP to this process end the block as KeyboardInterrupt. With `no_wait`, a block that ends
    normally leaves the server running (detached, `--no-wait`)."""

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread: leave the handlers alone
            pass
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=sys.stderr)  # our stdout: the URL
    try:
        yield proc
    except BaseException:
        stop(proc)
        raise
    else:
        if not no_wait:
            stop(proc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the server's whole process group, then SIGKILL to what is left after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):  # the group is gone
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, so an exited group reads as gone
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def wait_until_answers(proc: subprocess.Popen, url: str, what: str, timeout_s: float = 60.0) -> None:
    """Block until `url` answers an HTTP request; a UserError naming `what` if the server exits first
    (its output is on stderr above) or has not answered within `timeout_s`."""
    from stabray.errors import UserError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UserError(f"{what} exited with code {proc.returncode} (its output is above)")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.5)
    raise UserError(f"{what} did not answer at {url} within {timeout_s:.0f} s")


def optuna_study(target: str, storage: str) -> Path:
    """The optuna.db of a run directory, a path to one, or the newest under `storage`."""
    from stabray.errors import UserError

    if target != "latest":
        p = Path(target)
        db = p if p.suffix == ".db" else p / "optuna.db"
        if not db.exists():
            found = sorted(p.glob("*/optuna.db")) if p.is_dir() else []  # a multi-method sweep: one per method
            if not found:
                raise UserError(f"--optuna: no Optuna study at {db}")
            db = found[0]
        return checked_study(db)
    found = sorted(Path(storage).glob("*/optuna.db")) + sorted(Path(storage).glob("*/*/optuna.db"))
    if not found:
        raise UserError(f"--optuna: no sweep with an Optuna study under {Path(storage).absolute()} (see --storage)")
    return checked_study(max(found, key=lambda q: q.stat().st_mtime))


def checked_study(db: Path) -> Path:
    """`db` if it is a file holding an Optuna study (optuna-dashboard would otherwise start, fail on it
    and print its own traceback): an SQLite database with Optuna's `studies` table."""
    import sqlite3

    from stabray.errors import UserError
    from stabray.tracking.store import SQLITE_HEADER

    if db.is_dir():
        raise UserError(f"--optuna {db}: a directory, not an Optuna database")
    if db.stat().st_size == 0:
        raise UserError(f"--optuna {db}: an empty file (no study written to it yet)")
    with open(db, "rb") as f:
        if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
            raise UserError(f"--optuna {db}: not an SQLite database (a damaged or another file)")
    try:
        with sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True) as con:
            tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
    except sqlite3.Error as e:
        raise UserError(f"--optuna {db}: cannot read the database ({e})") from None
    if "studies" not in tables:
        raise UserError(f"--optuna {db}: an SQLite database without an Optuna study (no table 'studies')")
    return db


def run_optuna(args) -> int:
    """optuna-dashboard on the study, on --port (8080 unless given), bound to --host (this machine)."""
    db = optuna_study(args.optuna, args.storage)
    port = args.port if args.port != 5000 else 8080
    check_port(args.host, port)
    launch = "import sys; from optuna_dashboard._cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", launch, f"sqlite:///{db.absolute()}", "--host", args.host, "--port", str(port)]
    url = f"http://{args.host}:{port}"
    try:
        with served(cmd + ["--quiet"], args.no_wait) as proc:
            wait_until_answers(proc, url, f"optuna-dashboard on {db}")
            print(f"Optuna dashboard for {db}: {url}", flush=True)
            return 0 if args.no_wait else proc.wait()
    except KeyboardInterrupt:
        return 0


def check_port(host: str, port: int) -> None:
    """The UI's port must be free: a server already there (another UI, on another store) would
    answer our health check, and we would print its URL as ours."""
    from stabray.errors import UserError

    if not 0 < port < 65536:
        raise UserError(f"--port {port}: a TCP port is 1-65535")
    try:
        family, _, _, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]  # IPv4 or IPv6
    except socket.gaierror as e:  # a name that does not resolve, an address that is not one
        raise UserError(f"--host {host}: not a host name or address ({e.strerror or e})") from None
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: only a listener blocks us
        try:
            s.bind(where)
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise UserError(
                    f"--host {host}: not an address of this machine (use 127.0.0.1, 0.0.0.0 for every "
                    "interface, or one of this machine's addresses)"
                ) from None
            if e.errno == errno.EACCES:
                raise UserError(f"cannot serve on {host}:{port}: permission denied (pass --port above 1023)") from None
            raise UserError(
                f"cannot serve on {host}:{port} ({e.strerror or e}): another program (another MLflow UI?) "
                "uses it; pass --port with a free port"
            ) from None


def run(args) -> int:
    from stabray.tracking import check_store, resolve_tracking_uri

    if args.optuna is not None:
        return run_optuna(args)
    uri = resolve_tracking_uri(args.tracking_uri)
    check_store(uri, create=True)
    check_port(args.host, args.port)
    if uri.startswith("sqlite:///") and not os.path.exists(uri[len("sqlite:///") :]):
        print(
            f"note: no MLflow database at {uri[len('sqlite:///') :]} yet; the server creates an empty one",
            file=sys.stderr,
        )
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--workers",
        "1",
    ]
    url = f"http://{args.host}:{args.port}"
    try:
        with served(cmd, args.no_wait) as proc:
            wait_until_answers(proc, url + "/health", f"the MLflow UI on {uri}")
            print(f"MLflow UI for {uri}: {url}", flush=True)
            print_links(uri, url)
            return 0 if args.no_wait else proc.wait()
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP: the server's group is stopped
        return 0
