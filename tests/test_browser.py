"""The MLflow UI in a real browser (headless Chromium, Debian's `chromium` package:
`bash scripts/install_browser.sh`): after a tiny sweep, the runs page that `stabray ui` links to
shows the parent and child runs, a searched parameter and val_acc. Slow (a sweep, a server, a
browser), so it runs only with `-m slow`; the default suite does not need Chromium."""

import importlib.util
from pathlib import Path

import pytest

from stabray.cli import main

ROOT = Path(__file__).resolve().parent.parent


def browser_helper():
    spec = importlib.util.spec_from_file_location("mlflow_browser", ROOT / "scripts" / "mlflow_browser.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_runs_page_shows_parent_children_params_and_metrics(tmp_path, monkeypatch):
    from mlflow import MlflowClient
    from test_sweep import write_spec

    from stabray.tracking import experiment_links

    helper = browser_helper()
    assert helper.chromium(), "chromium is not installed: bash scripts/install_browser.sh"
    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["sweep", str(write_spec(tmp_path)), "--tracking-uri", uri, "--storage", str(tmp_path / "runs")]) == 0
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("mini").experiment_id])
    parent = next(r.info.run_name for r in runs if r.data.tags.get("stabray.role") == "sweep")
    children = [r.info.run_name for r in runs if r.data.tags.get("stabray.role") == "trial"]
    assert len(children) == 2 and all(c.startswith("alg1-lam") for c in children)

    with helper.UIServer(uri) as ui:
        ((name, url),) = experiment_links(uri, ui.url)
        dom = helper.render(url, screenshot=tmp_path / "runs.png")
    assert name == "mini"
    assert parent in dom, "the parent (sweep) run is not on the runs page"
    for child in children:
        assert child in dom, f"child run {child} is not on the runs page"
    assert ">lam<" in dom and ">val_acc<" in dom  # column headers: a searched param and the metric
    assert (tmp_path / "runs.png").stat().st_size > 10_000
