"""`python -m stabray ui`: start the MLflow UI on a sweep's store and print its URL."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request


def register(sub) -> None:
    p = sub.add_parser("ui", help="start the MLflow UI on a sweep's tracking store and print its URL")
    p.add_argument("--tracking-uri", help="store to browse (default: $MLFLOW_TRACKING_URI, else sqlite ./mlflow.db)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--no-wait", action="store_true", help="start it, print the URL once it answers, and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    from stabray.errors import UserError
    from stabray.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(args.tracking_uri)
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
    proc = subprocess.Popen(cmd, start_new_session=args.no_wait, stdout=sys.stderr)  # our stdout: the URL
    url = f"http://{args.host}:{args.port}"
    for _ in range(120):
        if proc.poll() is not None:
            raise UserError(f"the MLflow UI exited with code {proc.returncode} (is port {args.port} in use?)")
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.5)
    print(f"MLflow UI for {uri}: {url}", flush=True)
    if args.no_wait:
        return 0
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return 0
