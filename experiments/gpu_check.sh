#!/usr/bin/env bash
# The prepared GPU check for method="pallas": correctness against the reference plus
# timings of every GDN method, prefill T = 2048..16384 and verify windows T = 2..16.
# Installs nothing; runs from the repository root with the machine's python3 (JAX 0.11.2 on the
# lent H200). Writes $OUT/gpu_check.json when $OUT is set (the device tool's output folder), else
# /tmp/gpu_check.json. Extra arguments go to the Python module, e.g. --cpu_smoke for a CPU run.
#
#   experiments/gpu_check.sh                 # GPU, < 5 minutes (--budget_s=240 skips the rest)
#   experiments/gpu_check.sh --cpu_smoke     # CPU, interpret mode, tiny shapes, < 1 minute
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-/tmp}"
export PYTHONUNBUFFERED=1
"$PYTHON" -c 'import jax; print("jax", jax.__version__, "devices", jax.devices())'
exec "$PYTHON" -m experiments.gpu_check --json_out="$OUT_DIR/gpu_check.json" "$@"
