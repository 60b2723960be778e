#!/usr/bin/env bash
# The project's test command: build the environment from this checkout, then run the whole suite offline.
set -euo pipefail
cd "$(dirname "$0")/.."
# The app's browser test drives Debian's chromium through chromium-driver (no browser download): installed here when
# missing and this is a root shell with apt-get (the project's machines, CI); elsewhere that one test is skipped.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
  else
    echo "note: no chromium/chromedriver: the app's browser test will be skipped (apt-get install chromium chromium-driver)"
  fi
fi
bash scripts/setup_env.sh
VENV="${VLHUB_VENV:-.venv}"
export HF_HUB_OFFLINE=1
# The whole suite, slow multi-process and end-to-end tests included (a few minutes); VLHUB_SLOW_TESTS=0 skips those.
export VLHUB_SLOW_TESTS="${VLHUB_SLOW_TESTS:-1}"
# One pytest-xdist worker per available core (VLHUB_TEST_PROCESSES to choose; `-n 0` after the script's name runs one
# process); each test file runs whole on one worker, so a module's shared setup is built once.
exec "$VENV/bin/python" -m pytest -q -n "${VLHUB_TEST_PROCESSES:-$(nproc)}" --dist loadfile tests "$@"
