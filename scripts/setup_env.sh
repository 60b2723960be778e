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
# transformers' common model tests (ModelTesterMixin, ConfigTester; tests/models/) come from the tests/ folder of the
# installed transformers version's source distribution: downloaded once and unpacked into the environment (never the
# repository), so the suite runs offline afterwards. VERSION, written last, marks a complete unpack of that version.
TRANSFORMERS_VERSION="$("$VENV/bin/python" -c "import transformers; print(transformers.__version__)")"
TRANSFORMERS_TESTS="$VENV/transformers_tests"
if [ "$(cat "$TRANSFORMERS_TESTS/VERSION" 2>/dev/null)" != "$TRANSFORMERS_VERSION" ]; then
  SDIST_DIR="$(mktemp -d)"
  "$VENV/bin/python" -m pip download -q --no-deps --no-binary :all: "transformers==$TRANSFORMERS_VERSION" -d "$SDIST_DIR"
  tar -xzf "$SDIST_DIR/transformers-$TRANSFORMERS_VERSION.tar.gz" -C "$SDIST_DIR" "transformers-$TRANSFORMERS_VERSION/tests"
  # test_configuration_common.py executes its folder's __init__.py (direct_transformers_import); the sdist has none.
  touch "$SDIST_DIR/transformers-$TRANSFORMERS_VERSION/tests/__init__.py"
  echo "$TRANSFORMERS_VERSION" >"$SDIST_DIR/transformers-$TRANSFORMERS_VERSION/tests/VERSION"
  rm -rf "$TRANSFORMERS_TESTS"
  mv "$SDIST_DIR/transformers-$TRANSFORMERS_VERSION/tests" "$TRANSFORMERS_TESTS"
  rm -rf "$SDIST_DIR"
fi
"$VENV/bin/python" -c "import torch, torchvision, transformers, vlhub; print('vlhub env ready: torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__)"
