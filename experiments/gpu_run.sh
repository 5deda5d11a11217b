#!/usr/bin/env bash
# The one prepared run for a lent GPU, in order, each step under its own time limit so
# one hang cannot cost the others:
#   1. experiments/gpu_check.sh: every GDN form incl. "pallas" against the reference, and timings
#      (prefill T = 2048..16384, verify windows T = 2..16), within GPU_CHECK_BUDGET seconds;
#   2. experiments/gpu_decode.py: end-to-end decoding (shipped model and the Qwen3.5-0.8B shape in
#      bf16): plain greedy, MTP chains and trees, n-gram, spec == greedy on the device, window ÷
#      step, the step against the HBM roofline, within GPU_DECODE_BUDGET seconds.
# Writes gpu_check.json, gpu_decode.json, their logs and nvidia-smi's line under $OUT (the device
# tool's output folder; /tmp/gpu_run otherwise). About 7 minutes on the H200; installs nothing.
#
#   experiments/gpu_run.sh              # on the GPU machine: run(command=..., timeout_s=540)
#   experiments/gpu_run.sh --cpu_smoke  # here, with PYTHON=.venv/bin/python: < 4 minutes
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHON="${PYTHON:-python3}" PYTHONUNBUFFERED=1
export OUT="${OUT:-/tmp/gpu_run}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.draw \
    --format=csv >"$OUT/nvidia_smi.csv" 2>&1 || echo "no nvidia-smi" >"$OUT/nvidia_smi.csv"
cat "$OUT/nvidia_smi.csv"
status=0
timeout "${GPU_CHECK_LIMIT:-200}" experiments/gpu_check.sh --budget_s="${GPU_CHECK_BUDGET:-90}" \
    "$@" >"$OUT/gpu_check.log" 2>&1 || status=$?
echo "== gpu_check exit $status"
grep -v '^[IWE][0-9]\{4\} ' "$OUT/gpu_check.log" | tail -n 30
status2=0
timeout "${GPU_DECODE_LIMIT:-330}" "$PYTHON" -m experiments.gpu_decode \
    --budget_s="${GPU_DECODE_BUDGET:-240}" --json_out="$OUT/gpu_decode.json" "$@" \
    >"$OUT/gpu_decode.out" 2>"$OUT/gpu_decode.err" || status2=$?
echo "== gpu_decode exit $status2"
grep -v '^\[' "$OUT/gpu_decode.out" | tail -n 40
grep -E 'Error|error:|Traceback' "$OUT/gpu_decode.err" | tail -n 5
exit $((status || status2))
