#!/usr/bin/env bash
# Start the Flower SuperLink with TLS and SuperNode authentication, in the background.
#
# Usage: deploy/start-superlink.sh CRED_DIR STATE_DIR [PORT]
#   CRED_DIR   folder of make-credentials.sh (uses ca.crt, server.crt, server.key)
#   STATE_DIR  gets superlink.log and superlink.pid; the SuperLink runs in it (the
#              ServerApp's working folder)
#   PORT       Fleet, Control and Runtime API port (default 9093)
# Waits until the SuperLink accepts connections (at most $WAIT_S s, default 60); exits 1
# with the end of its log otherwise. Stop it with deploy/stop.sh STATE_DIR.
# State (runs, registered keys, messages) is in memory: register the sites again after a
# restart. SUPERLINK_DATABASE=STATE_DIR/superlink.db keeps it in SQLite instead, but messages
# then go through that file too, and on a busy machine requests failed with "database is
# locked" (Flower's 5 s SQLite busy timeout), which stalled or killed runs.
# Environment: SUPERLINK_BIND (listen address, default 127.0.0.1; 0.0.0.0 for remote
# SuperNodes), SUPERLINK_DATABASE, FLWR_HOME (default STATE_DIR/flwr-home), WAIT_S.
set -euo pipefail
usage() { sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 2; }
[ $# -ge 2 ] && [ $# -le 3 ] || usage
here="$(cd "$(dirname "$0")" && pwd)"
[ -d "$1" ] || { echo "start-superlink: credentials folder $1 does not exist" >&2; exit 1; }
cred="$(cd "$1" && pwd)"
mkdir -p "$2"
state="$(cd "$2" && pwd)"
port="${3:-9093}"
bind="${SUPERLINK_BIND:-127.0.0.1}"
. "$here/../scripts/offline-env.sh"
export FLWR_HOME="${FLWR_HOME:-$state/flwr-home}"
mkdir -p "$FLWR_HOME"
for file in ca.crt server.crt server.key; do
  [ -f "$cred/$file" ] || { echo "start-superlink: $cred/$file is missing (run deploy/make-credentials.sh)" >&2; exit 1; }
done
command -v flower-superlink >/dev/null || { echo "start-superlink: flower-superlink is not on PATH (pip install flwr)" >&2; exit 1; }
pidfile="$state/superlink.pid"
if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  echo "start-superlink: already running (PID $(cat "$pidfile")); stop it with deploy/stop.sh $state" >&2; exit 1
fi

database=()
[ -z "${SUPERLINK_DATABASE:-}" ] || database=(--database "$SUPERLINK_DATABASE")

cd "$state"  # setsid: its own session, so deploy/stop.sh finds every process it starts
setsid nohup flower-superlink --ssl-ca-certfile "$cred/ca.crt" --ssl-certfile "$cred/server.crt" \
  --ssl-keyfile "$cred/server.key" --enable-supernode-auth --disable-runtime-dependency-installation \
  "${database[@]}" --host "$bind" --port "$port" \
  </dev/null >>"$state/superlink.log" 2>&1 &
pid=$!
echo "$pid" >"$pidfile"

probe="$bind"; [ "$probe" = 0.0.0.0 ] && probe=127.0.0.1
for _ in $(seq $((${WAIT_S:-60} * 2))); do
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" && rc=0 || rc=$?
    rm -f "$pidfile"
    echo "start-superlink: flower-superlink exited (status $rc); end of $state/superlink.log:" >&2
    tail -n 20 "$state/superlink.log" >&2; exit 1
  fi
  if (exec 3<>"/dev/tcp/$probe/$port") 2>/dev/null; then
    echo "start-superlink: SuperLink (PID $pid) accepts connections on $bind:$port"; exit 0
  fi
  sleep 0.5
done
echo "start-superlink: SuperLink (PID $pid) does not accept connections on $probe:$port after" \
  "${WAIT_S:-60} s; see $state/superlink.log, stop it with deploy/stop.sh $state" >&2
exit 1
