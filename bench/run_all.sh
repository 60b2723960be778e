#!/usr/bin/env bash
# Runs every device bench and writes one markdown table (stdout and OUT/table.md, written atomically).
#
#   bench/run_all.sh --device cuda|cpu [--quick] [--out DIR]
#
# Each bench writes its figures as JSON (--json) to OUT/json/, its output to OUT/logs/<bench>.log; then
# bench/collect_table.py builds the table from the JSON files. --device cuda is refused up front where torch sees no
# GPU. --quick: tiny models, one repeat: a check of the wiring, not figures to quote. On a CPU the full run is cut
# to what finishes within the hour (batch-1 VLP decoding, a 2000-image store; no bf16 rows where the CPU has no bf16
# units). OUT defaults to runs/bench-<device>[-quick]. PYTHON names the interpreter (default: python). Not run here:
# bench_app.py (a browser's view of the CPU app) and bench_import.py (import time, no device), and the
# --original-checkout comparisons (they need the authors' code).
set -uo pipefail

usage() { sed -n 4p "$0" | sed 's/^#   /usage: /'; }
device="" quick=0 out=""
while (($#)); do
  case "$1" in
    --device) device="${2:-}"; shift 2 || shift ;;
    --device=*) device="${1#--device=}"; shift ;;
    --quick) quick=1; shift ;;
    --out) out="${2:-}"; shift 2 || shift ;;
    --out=*) out="${1#--out=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_all.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if [[ $device != cpu && $device != cuda ]]; then
  echo "run_all.sh: --device must be cpu or cuda, got '${device}'" >&2; usage >&2; exit 2
fi
if [[ -z $out ]]; then out="runs/bench-$device$( ((quick)) && echo -quick)"; fi

root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python}"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
if [[ $device == cuda ]]; then
  "$python" -c "
import sys
sys.path.insert(0, '$root/bench')
from device import cuda_refusal
refusal = cuda_refusal()
sys.exit('run_all.sh: ' + refusal if refusal else 0)" || exit 2
fi
mkdir -p "$out/json" "$out/logs" || exit 2
rm -f "$out"/json/*.json "$out/table.md"  # a failed run must not leave an earlier run's figures or table

gpu=$([[ $device == cuda ]] && echo 1 || echo 0)
if ((quick)); then
  machine=(--peak-size 256 --repeats 3)
  encoders=(--size tiny --batch-sizes 4 --bf16-batch-sizes 4 --attention sdpa --repeats 1 --text 8 --regions 8
            --peak-size 256)
  vlp=(--size small --batch-sizes 1 --searches greedy vlp-beam --beams 2 --new-tokens 2 --repeats 0
       --skip-uncached-above-batch 0)
  tden=(--size small --batch-sizes 1 --beams 1 2 --steps 2 --regions 11 --repeats 1 --baselines)
  detector=(--tiny --dtypes fp32 --batch-sizes 1 --height 64 --width 80)
  training=(--sizes tiny --objectives mlm --steps 2 --warmup 1 --batch 4)
  data=(--sizes 320 --workers 0 --steps 2 --warmup-batches 1 --timed-batches 3 --read-seconds 0.1 --peak-size 256
        --cache-dir "$out/bench-data")
  dtypes=(--rounds 1 --tokens 64 --width 256)
else
  machine=()
  encoders=(--batch-sizes 32 --bf16-batch-sizes 32 --attention sdpa --repeats 5)
  vlp=(--batch-sizes 1 8 --searches greedy vlp-beam --repeats 2 --skip-uncached-above-batch 0)
  tden=(--batch-sizes 1 8 --beams 1 3 --repeats 3 --baselines)
  training=(--objectives "default mix" --steps 12 --warmup 3)
  data=(--sizes 20000 --workers 0 2)
  dtypes=(--rounds 7)
  if ((gpu)); then
    encoders+=(--compile)  # compiled rows beside the plain ones: measured, not assumed
    vlp+=(--dtype bf16)
    tden+=(--dtype bf16)
    detector=(--dtypes fp32 bf16 --batch-sizes 1 8 --repeats 3 --threads "$(nproc)")
    training+=(--sizes base)  # uniter-base, batch 64, bf16 mixed precision (the bench's GPU defaults)
  else  # the CPU's figures within the hour: smaller peak probes, batch 1 decoding, a 2000-image store
    machine=(--peak-size 2048 --repeats 3)
    encoders+=(--peak-size 2048)
    if ! "$python" -c "import sys; from vlhub.utils.precision import bf16_is_fast; sys.exit(not bf16_is_fast('cpu'))"
    then
      encoders+=(--bf16-batch-sizes)  # no bf16 units: bf16 is emulated, slower than fp32 (vlhub keeps fp32 there)
    fi
    vlp=(--batch-sizes 1 --searches greedy vlp-beam --repeats 2 --skip-uncached-above-batch 0)
    detector=(--dtypes fp32 --batch-sizes 1 --repeats 1 --threads "$(nproc)")
    training+=(--sizes tiny base)
    data=(--sizes 2000 --workers 0 2)
  fi
fi
training+=(--skip-vqa-inference)

# The benches, then the table, run one after another, each in a process forked from one that has imported torch,
# transformers and vlhub (bench/run_benches.py): the same fresh process per bench, without each paying those imports.
jobs=$(mktemp) || exit 2
trap 'rm -f "$jobs"' EXIT
queue() {  # queue NAME SCRIPT ARGS...: one job for bench/run_benches.py, its output to OUT/logs/NAME.log
  local fields=("$1" "$root/bench/$2" "${@:3}")
  printf '%s\0' "${#fields[@]}" "${fields[@]}" >>"$jobs"
}
bench() {  # bench NAME SCRIPT ARGS...: a bench, its figures to OUT/json/NAME.json
  queue "$1" "$2" --device "$device" --json "$out/json/$1.json" "${@:3}"
}
bench machine device.py "${machine[@]}"
bench encoders bench_encoders.py "${encoders[@]}"
bench vlp_decoding bench_vlp_decoding.py "${vlp[@]}"
bench tden_decoding bench_tden_decoding.py "${tden[@]}"
bench detector bench_detector.py "${detector[@]}"
bench training bench_training.py "${training[@]}"
bench data bench_data.py "${data[@]}"
bench dtypes bench_dtypes.py "${dtypes[@]}"
title="vlhub benchmarks: bench/run_all.sh --device $device$( ((quick)) && echo ' --quick (wiring check, not figures)'), $(date -u +%Y-%m-%d)"
queue table collect_table.py --json-dir "$out/json" --out "$out/table.md" --title "$title"
failed=()
if ! failures=$("$python" "$root/bench/run_benches.py" "$jobs" "$out/logs"); then
  failed+=(run_benches.py)  # the runner itself failed (its message is above); the jobs it did not run left nothing
fi
failed+=($failures)
if [[ -f $out/table.md ]]; then cat "$out/table.md"; fi  # written, with a row per missing bench, even when one failed
if ((${#failed[@]})); then
  echo "run_all.sh: failed: ${failed[*]} (logs in $out/logs)" >&2
  exit 1
fi
echo "[run_all] table written to $out/table.md" >&2
