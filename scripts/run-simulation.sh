#!/usr/bin/env bash
# Run FedSM on simulated sites (one per site of the dataset) with `flwr run .` (Ray simulation, local SuperLink).
#
# Usage: scripts/run-simulation.sh ["key=value key2=value2"]
#   The optional argument overrides [tool.flwr.app.config] keys, e.g.
#   scripts/run-simulation.sh "num-server-rounds=5 softpull-lambda=0.5"
# Environment:
#   FLWR_HOME        Flower's state folder (default: .flwr-home in the project)
#   FEDSM_RUNS       where run folders go (default: runs/ in the project)
#   NUM_SUPERNODES   simulated SuperNodes (default: one per site of the run's dataset); any number
#                    works: with fewer, a node serves several sites
#   RAY_CPUS         CPUs Ray may use (default: the machine's core count, at most
#                    NUM_SUPERNODES * CLIENT_CPUS, since more would only start idle workers)
#   CLIENT_CPUS      CPUs per simulated client (default: 1); RAY_CPUS / CLIENT_CPUS clients
#                    train at once, each a worker process of ~2 GB at 128 px
#   CLIENT_GPUS      GPU share per simulated client (default: auto). auto: when torch sees a
#                    GPU, the share that lets the clients running at once split the visible
#                    GPUs (1/6 each for 6 clients on one GPU); otherwise 0. 0 trains on the CPU
#                    (the GPUs are then hidden from the run). Ray hides every GPU from a client
#                    that requests none, so without a share device=auto means the CPU.
#
# The settings are checked first (`fedsm check-config`: sites, softpull-lambda against 1/K,
# data folders, held-out site); a problem stops the script before flwr starts anything.
# Exits non-zero when the run fails (`flwr run --stream` itself exits 0 then), and
# stops the local SuperLink it started, so no server outlives the run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/offline-env.sh
export FLWR_HOME="${FLWR_HOME:-$PWD/.flwr-home}"
mkdir -p "$FLWR_HOME"
FLWR_HOME="$(cd "$FLWR_HOME" && pwd)"
runs="${FEDSM_RUNS:-$PWD/runs}"
mkdir -p "$runs"
runs="$(cd "$runs" && pwd)"
overrides="${1:-}"

# Check the settings before anything starts; its answer is the number of sites.
if ! sites="$(python -m fedsm_core.command_line.cli check-config --app . --simulation --print-num-sites \
    --run-config "output-dir='$runs' $overrides")"; then
  echo "run-simulation: fix the settings above; nothing was started" >&2
  exit 2
fi

stop_superlink() {
  # The local SuperLink is started detached by `flwr run`; find it by its database path.
  local pid
  for pid in $(pgrep -f -- "--database $FLWR_HOME/local-superlink/state.db" || true); do
    pkill -f -- "flower-superexec .*--parent-pid $pid\$" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  done
  return 0
}
stop_superlink  # a SuperLink left from an earlier run keeps that run's environment
trap stop_superlink EXIT

resources="$(python -m fedsm_core.command_line.simulation_resources --num-supernodes "${NUM_SUPERNODES:-$sites}" \
  --ray-cpus "${RAY_CPUS:-$(nproc)}" --client-cpus "${CLIENT_CPUS:-1}" --client-gpus "${CLIENT_GPUS:-auto}")" \
  || { echo "run-simulation: fix the setting named above" >&2; exit 2; }
FEDERATION_CONFIG=""; CLIENT_GPU_SHARE=""
eval "$resources"  # FEDERATION_CONFIG and CLIENT_GPU_SHARE, shell-quoted by the module
if [ "$CLIENT_GPU_SHARE" = "0" ]; then
  # RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0 (offline-env.sh) leaves GPUs visible to workers that
  # requested none; hide them, so that clients without a share really train on the CPU.
  export CUDA_VISIBLE_DEVICES=""
fi

log="$(mktemp)"
flwr run . --stream \
  --federation-config "$FEDERATION_CONFIG" \
  --run-config "output-dir='$runs' $overrides" 2>&1 | tee "$log"
run_id="$(grep -oE 'Successfully started run [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -n 1 || true)"
rm -f "$log"
if [ -z "$run_id" ]; then
  echo "run-simulation: flwr run did not start a run (see the output above)" >&2
  exit 1
fi
status="$(flwr ls --run-id "$run_id" --format json | python -c 'import json, sys; r = json.load(sys.stdin)["runs"][0]; print(r["status"], "|", r["status-details"])')"
echo "run $run_id: $status"
case "$status" in
  finished:completed*) exit 0 ;;
  *) echo "run-simulation: run $run_id did not complete: $status" >&2; exit 1 ;;
esac
