#!/usr/bin/env bash
# The project's test command: build the environment from this checkout, then run the whole suite offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
VENV="${VLHUB_VENV:-.venv}"
export HF_HUB_OFFLINE=1
# The whole suite, slow multi-process and end-to-end tests included (a few minutes); VLHUB_SLOW_TESTS=0 skips those.
export VLHUB_SLOW_TESTS="${VLHUB_SLOW_TESTS:-1}"
exec "$VENV/bin/python" -m pytest -q tests "$@"
