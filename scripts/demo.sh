#!/usr/bin/env bash
# The README's main job: build the environment, then for one architecture (--model_type, UNITER by default) pre-train
# a tiny model on the embedded shapes world, fine-tune it for VQA and for retrieval, evaluate both against their
# baselines (majority answer, chance), answer held-out questions and rank held-out captions with the pipelines; then
# captioning (a tiny Unified VLP for encoders): caption metrics against the most-frequent-caption baseline. Steps an
# architecture cannot do are skipped with a reason; one PNG per shown example; a summary table at the end.
# Everything goes under runs/demo/<model_type>/; running it again reuses the steps finished with the same settings,
# --overwrite_output_dir starts them over. Offline. Extra arguments go to `python -m vlhub.demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
VENV="${VLHUB_VENV:-.venv}"
export HF_HUB_OFFLINE=1
# Tiny matrices gain nothing from a second thread, and threads fighting over shared cores cost a lot.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$VENV/bin/python" -m vlhub.demo "$@"
