#!/usr/bin/env bash
# Builds the project's virtual environment in .venv (or $VLHUB_VENV) from this checkout.
# torch/torchvision are pinned to the pair that imports on the project's machines (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLHUB_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -m pip install -q "torch==${VLHUB_TORCH:-2.14.1}" "torchvision==${VLHUB_TORCHVISION:-0.29.1}" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -m pip install -q -e ".[test,docs]" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -c "import torch, torchvision, transformers, vlhub; print('vlhub env ready: torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__)"
