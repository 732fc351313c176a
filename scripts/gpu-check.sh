#!/usr/bin/env bash
# One command for a machine with a CUDA GPU: GPU tests, a 256 px simulation, CPU-vs-GPU agreement.
#
# Usage: scripts/gpu-check.sh
#   Where torch sees no CUDA device it prints "skipped: no CUDA device" and exits 0.
#   Otherwise it runs, in order:
#     1. the tests marked gpu (python -m pytest -q -m gpu);
#     2. a 3-round, six-site FedSM simulation at 256 px (scripts/run-simulation.sh with
#        CLIENT_GPUS=auto, precision=auto), sampled with nvidia-smi: seconds per round, images per
#        second, peak GPU memory per worker, and the share of time the GPU was busy during the
#        training exchanges (target: at least 60 % on one H100/H200-class GPU);
#     3. one FedSM round on the CPU and on the GPU from the same seeds in fp32, the updates
#        compared per model within the tolerance stated in experiments/bench/device_agreement.py.
#   Results: $GPU_CHECK_OUT/report.md and results.json (default results/gpu-check).
# Environment: GPU_CHECK_OUT; CLIENT_GPUS, RAY_CPUS, CLIENT_CPUS as for run-simulation.sh.
# Exits 1 when a test fails, a part fails, or the CPU and GPU rounds disagree.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/offline-env.sh
if ! python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "skipped: no CUDA device"
  exit 0
fi
out="${GPU_CHECK_OUT:-results/gpu-check}"
mkdir -p "$out"
nvidia-smi || true

tests_status=0
# With pipefail the pipeline's status is pytest's (tee succeeds).
python -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tee "$out/gpu-tests.log" || tests_status=$?
summary="$(tail -n 1 "$out/gpu-tests.log")"

python -m experiments.gpu.check --out "$out" --tests-status "$tests_status" --tests-summary "$summary"
