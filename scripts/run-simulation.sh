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
#   RAY_CPUS         CPUs Ray may use (default: 2)
#   CLIENT_CPUS      CPUs per simulated client (default: 1); RAY_CPUS / CLIENT_CPUS clients
#                    train at once, each a worker process of ~2 GB at 128 px
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
if ! sites="$(python -m fedsm_core.cli check-config --app . --simulation --print-num-sites \
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

log="$(mktemp)"
flwr run . --stream \
  --federation-config "num-supernodes=${NUM_SUPERNODES:-$sites} client-resources-num-cpus=${CLIENT_CPUS:-1} init-args-num-cpus=${RAY_CPUS:-2}" \
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
