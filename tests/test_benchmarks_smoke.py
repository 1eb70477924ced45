"""The benchmarks keep working: each runs at tiny size (`--smoke`) and writes its JSON. No speed
thresholds are asserted (CI machines are noisy). The fast checks run in-process by default; the
full smoke run of every benchmark (Ray sweeps, HF Trainer) is marked slow."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # bench_qat imports bench_train, bench_search bench_sweep
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"bench_{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_qat_smoke(tmp_path):
    out = tmp_path / "qat.json"
    assert load("qat").main(["--smoke", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert set(r["ratio_to_fp32"]) == {"32", "1", "2", "3", "4", "8"} and r["ratio_to_fp32"]["32"] == 1.0


def test_mlflow_logging_cost_smoke(tmp_path):
    out = tmp_path / "sweep.json"
    assert load("sweep").main(["--smoke", "--skip-sweep", "--json", str(out)]) == 0
    ml = json.loads(out.read_text())["mlflow"]
    assert ml["keys_per_result"] == 9 and ml["log_batch_ms_per_result"] > 0


def test_asha_expected_epochs():
    f = load("search").expected_epochs
    assert f(6, 2) == 2 + 2 / 2 + 2 / 4  # rungs at 2 and 4, half kept at each
    assert f(12, 3) == 3 + 3 / 2 + 6 / 4
    assert f(4, 4) == 4  # no rung below max_t: every trial runs to the end


def test_run_all_lists_every_benchmark():
    spec = importlib.util.spec_from_file_location("run_all", BENCH / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert {"data", "eaf", "train", "qat", "sweep", "search"} <= set(mod.available())


@pytest.mark.slow
def test_run_all_smoke(tmp_path):
    """Every benchmark's --smoke in its own process (Ray sweeps included: minutes on 2 cores)."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--smoke", "--quiet", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for name in ("data", "eaf", "train", "qat", "sweep", "search"):
        assert (tmp_path / f"{name}.json").exists(), name
