#!/usr/bin/env bash
# Headless Chromium for the browser test (`pytest -m slow tests/test_browser.py`) and for
# `python scripts/mlflow_browser.py` (screenshots of a sweep's MLflow pages). Debian/Ubuntu, as root.
# Nothing else needs it: the default test suite runs without a browser.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    chromium --version 2>/dev/null || true
    exit 0
fi
apt-get update -qq
apt-get install -y -qq chromium
chromium --version 2>/dev/null || true
