#!/usr/bin/env bash
# Create .venv and install stabray with its test extras, at the versions CI tested (constraints.txt).
# Idempotent: a second run installs nothing.
# TORCH overrides the torch requirement (default torch==2.13.0, the version this repo is tested with;
# on a CUDA machine use e.g. TORCH="torch" to take the newest). Which build pip takes depends on where
# it looks: a configured local CPU wheel (as on the CI machine) wins; PyPI's Linux wheel is the CUDA
# build (several GB). TORCH_INDEX, if set, is the index torch comes from, e.g.
# TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU build on a laptop.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "${TORCH:-torch==2.13.0}"
fi
if ! .venv/bin/python -c "import stabray, ray, mlflow, optuna, peft, polars, datasets, pytest, scipy" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.stabray-installed ] || [ constraints.txt -nt .venv/.stabray-installed ]; then
  .venv/bin/pip install -q -c constraints.txt -e ".[dev]"
  touch .venv/.stabray-installed
fi
