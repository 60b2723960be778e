#!/usr/bin/env bash
# The README's main job: build the environment, then pre-train a tiny UNITER on the embedded shapes world, fine-tune
# it for VQA, evaluate it against the majority-answer baseline and answer held-out questions with the VQA pipeline;
# then a tiny Unified VLP fine-tuned for captioning: caption metrics against the most-frequent-caption baseline and
# captions of held-out images next to their references.
# Offline; a few minutes on 2 CPU cores. Extra arguments go to `python -m vlhub.demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
VENV="${VLHUB_VENV:-.venv}"
export HF_HUB_OFFLINE=1
# Tiny matrices gain nothing from a second thread, and threads fighting over shared cores cost a lot.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$VENV/bin/python" -m vlhub.demo "$@"
