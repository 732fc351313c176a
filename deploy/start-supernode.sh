#!/usr/bin/env bash
# Start one site's Flower SuperNode (TLS, authenticated with the site's key), in the background.
#
# Usage: deploy/start-supernode.sh CRED_DIR SITE DATA_PATH SUPERLINK_ADDRESS PORT STATE_DIR
#   CRED_DIR           holds ca.crt and this site's private key supernode-SITE
#   SITE               the site's name in the federation spec (node config site-name)
#   DATA_PATH          this site's data folder (node config data-path); never leaves the site
#   SUPERLINK_ADDRESS  host:port of the SuperLink's public door (deploy/start-proxy.sh), e.g. fl.example.org:9093
#   PORT               a free local port for the SuperNode's own ClientApp API
#   STATE_DIR          gets supernode-SITE.log and supernode-SITE.pid
# Waits up to $WAIT_S s (default 30) for the SuperLink to accept the node ("SuperNode ID" in
# the log); exits 1 with the end of the log when the SuperNode exits (e.g. an unregistered
# key), keeps it running (retrying) when it merely has not connected yet.
# Environment: FLWR_HOME (default STATE_DIR/flwr-home), WAIT_S, SUPERNODE_DEVICE (node config
#   device: cuda:N pins one GPU of a multi-GPU machine; unset, the run's device, auto by default,
#   trains on the first GPU torch sees, else the CPU).
set -euo pipefail
usage() { sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 2; }
[ $# -eq 6 ] || usage
here="$(cd "$(dirname "$0")" && pwd)"
[ -d "$1" ] || { echo "start-supernode: credentials folder $1 does not exist" >&2; exit 1; }
cred="$(cd "$1" && pwd)"; site="$2"; address="$4"; port="$5"
[ -d "$3" ] || { echo "start-supernode: data folder $3 does not exist" >&2; exit 1; }
data="$(cd "$3" && pwd)"
mkdir -p "$6"
state="$(cd "$6" && pwd)"
[[ "$site" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "start-supernode: site name '$site' must match [A-Za-z0-9._-]+" >&2; exit 2; }
[[ "$data" != *"'"* ]] || { echo "start-supernode: the data path must not contain a single quote" >&2; exit 2; }
for file in ca.crt "supernode-$site"; do
  [ -f "$cred/$file" ] || { echo "start-supernode: $cred/$file is missing" >&2; exit 1; }
done
node_config="site-name='$site' data-path='$data'"
if [ -n "${SUPERNODE_DEVICE:-}" ]; then
  [[ "$SUPERNODE_DEVICE" =~ ^(auto|cpu|cuda(:[0-9]+)?)$ ]] || {
    echo "start-supernode: SUPERNODE_DEVICE='$SUPERNODE_DEVICE' must be auto, cpu, cuda or cuda:N" >&2; exit 2; }
  node_config="$node_config device='$SUPERNODE_DEVICE'"
fi
. "$here/../scripts/offline-env.sh"
export FLWR_HOME="${FLWR_HOME:-$state/flwr-home}"
mkdir -p "$FLWR_HOME"
command -v flower-supernode >/dev/null || { echo "start-supernode: flower-supernode is not on PATH (pip install flwr)" >&2; exit 1; }
pidfile="$state/supernode-$site.pid"; log="$state/supernode-$site.log"
if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  echo "start-supernode: $site is already running (PID $(cat "$pidfile"))" >&2; exit 1
fi

cd "$state"
: >"$log"
setsid nohup flower-supernode --root-certificates "$cred/ca.crt" --superlink "$address" --port "$port" \
  --auth-supernode-private-key "$cred/supernode-$site" \
  --node-config "$node_config" </dev/null >>"$log" 2>&1 &
pid=$!
echo "$pid" >"$pidfile"

for _ in $(seq $((${WAIT_S:-30} * 2))); do
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" && rc=0 || rc=$?
    rm -f "$pidfile"
    echo "start-supernode: $site's SuperNode exited (status $rc); end of $log:" >&2
    tail -n 15 "$log" >&2; exit 1
  fi
  if grep -q "SuperNode ID" "$log"; then
    echo "start-supernode: $site's SuperNode (PID $pid) is connected to $address"; exit 0
  fi
  sleep 0.5
done
echo "start-supernode: $site's SuperNode (PID $pid) has not connected to $address yet; it keeps" \
  "retrying (see $log)" >&2
