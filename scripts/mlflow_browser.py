"""Look at a sweep's MLflow UI in a real browser (headless Chromium): start `stabray ui` on a store,
load pages, save the rendered DOM and screenshots.

    python scripts/mlflow_browser.py --tracking-uri sqlite:////abs/mlflow.db --out shots/
    python scripts/mlflow_browser.py --tracking-uri ... --experiment dijkstra --out shots/

It writes, for the experiment's runs table, its parent (sweep) run and the trial run with the best
test_acc (`runs`, `parent_run`, `trial_run`): `<page>.png` (screenshot)
and `<page>.html` (the DOM after the page's scripts ran). Needs Debian's `chromium` package
(`bash scripts/install_browser.sh`); the default test suite does not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # we run as root in a container
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
]


def chromium() -> str | None:
    """The Chromium binary, or None when it is not installed."""
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UIServer:
    """`python -m stabray ui` on a store, on a free local port, stopped on exit."""

    def __init__(self, tracking_uri: str, port: int | None = None):
        self.uri, self.port = tracking_uri, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> UIServer:
        cmd = [sys.executable, "-m", "stabray", "ui", "--tracking-uri", self.uri, "--port", str(self.port)]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, start_new_session=True, text=True)
        self.first_line = self.proc.stdout.readline()  # printed once the server answers
        for _ in range(240):
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2)
                return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"stabray ui did not start on {self.url}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)  # the server and its worker: the session we started
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)


def render(url: str, *, screenshot: Path | None = None, size: str = "1920,1080", budget_ms: int = 15000) -> str:
    """The DOM of `url` after `budget_ms` of virtual time (and a screenshot when asked)."""
    exe = chromium()
    if exe is None:
        raise RuntimeError("chromium is not installed (bash scripts/install_browser.sh)")
    with tempfile.TemporaryDirectory() as profile:
        flags = [*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}"]
        if screenshot is not None:
            subprocess.run(
                [exe, *flags, f"--window-size={size}", f"--screenshot={screenshot}", url],
                capture_output=True,
                timeout=120,
            )
        out = subprocess.run([exe, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    return out.stdout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tracking-uri", required=True, help="the store, e.g. sqlite:////abs/path/mlflow.db")
    p.add_argument("--experiment", default=None, help="experiment name (default: the newest one)")
    p.add_argument("--out", default="mlflow-shots", help="folder for the PNGs and HTML (default mlflow-shots)")
    p.add_argument("--port", type=int, default=None)
    args = p.parse_args(argv)
    if args.port is not None and not 1 <= args.port <= 65535:
        p.error(f"--port {args.port}: a port is 1-65535")
    if chromium() is None:  # before the UI starts
        p.error("chromium is not installed (bash scripts/install_browser.sh)")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        p.error(f"--out {out}: a file, not a folder")
    from mlflow import MlflowClient

    from stabray.errors import UserError
    from stabray.tracking import check_store, experiment_links, resolve_tracking_uri

    try:  # as `stabray ui` reads it (a bare path is a sqlite file); a store that is not there is named
        args.tracking_uri = resolve_tracking_uri(args.tracking_uri)
        check_store(args.tracking_uri, create=False)
    except UserError as e:
        p.error(str(e))
    client = MlflowClient(args.tracking_uri)
    if args.experiment and client.get_experiment_by_name(args.experiment) is None:
        names = [e.name for e in client.search_experiments()]
        p.error(f"--experiment {args.experiment}: not in {args.tracking_uri} (it has {', '.join(names) or 'none'})")
    out.mkdir(parents=True, exist_ok=True)
    with UIServer(args.tracking_uri, args.port) as ui:
        links = dict(experiment_links(args.tracking_uri, ui.url))
        name = args.experiment or next(iter(links), None)
        if name not in links:
            print(f"no experiment {name or ''} at {args.tracking_uri}", file=sys.stderr)
            return 2
        exp = client.get_experiment_by_name(name)
        parents = client.search_runs(
            [exp.experiment_id], "tags.`stabray.role` = 'sweep'", order_by=["start_time DESC"], max_results=1
        )
        pages = {"runs": links[name]}
        run_page = f"{ui.url}/#/experiments/{exp.experiment_id}/runs/{{}}?workflowType=machine_learning"
        if parents:
            pages["parent_run"] = run_page.format(parents[0].info.run_id)
        trials = client.search_runs(  # the trial with the best test accuracy: its params and final metrics
            [exp.experiment_id], "tags.`stabray.role` = 'trial'", order_by=["metrics.test_acc DESC"], max_results=1
        )
        if trials:
            pages["trial_run"] = run_page.format(trials[0].info.run_id)
        for page, url in pages.items():
            dom = render(url, screenshot=out / f"{page}.png")
            (out / f"{page}.html").write_text(dom)
            print(f"{page}: {url} -> {out / (page + '.png')} ({len(dom)} characters of DOM)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
