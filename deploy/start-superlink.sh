#!/usr/bin/env bash
# Start the Flower SuperLink (TLS, SuperNode authentication) and the operator's SuperExec.
#
# Usage: deploy/start-superlink.sh CRED_DIR STATE_DIR [PORT]
#   CRED_DIR   folder of make-credentials.sh (uses ca.crt, server.crt, server.key)
#   STATE_DIR  gets superlink.log/.pid, superexec.log/.pid and superexec.secret; both run
#              in it (the ServerApp's working folder)
#   PORT       Fleet, Control and Runtime API port (default 9091), bound to 127.0.0.1
# The SuperLink serves the Fleet, Control (submit, list, stop runs; register SuperNodes)
# and Runtime APIs on one port, and Flower 1.42 does not authenticate Control: keep it on
# 127.0.0.1 and let SuperNodes in through deploy/start-proxy.sh, which forwards /v1/fleet/
# only. The operator's flwr CLI uses 127.0.0.1:PORT on this machine (or an SSH tunnel).
# ServerApps run in process isolation: this script starts flower-superexec itself, and the
# SuperLink hands ServerApp tasks only to a SuperExec that signs its requests with the
# shared secret STATE_DIR/superexec.secret (made on first start, mode 600).
# Waits until the SuperLink accepts connections (at most $WAIT_S s, default 60); exits 1
# with the end of its log otherwise. Stop both with deploy/stop.sh STATE_DIR.
# State (runs, registered keys, messages) is in memory: register the sites again after a
# restart. SUPERLINK_DATABASE=STATE_DIR/superlink.db keeps it in SQLite instead, but messages
# then go through that file too, and on a busy machine requests failed with "database is
# locked" (Flower's 5 s SQLite busy timeout), which stalled or killed runs.
# Environment: SUPERLINK_BIND (listen address, default 127.0.0.1; anything else exposes
# the Control and Runtime APIs to whoever reaches it, and is refused unless
# SUPERLINK_EXPOSE_CONTROL=1), SUPERLINK_DATABASE, FLWR_HOME (default STATE_DIR/flwr-home),
# WAIT_S.
set -euo pipefail
usage() { sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 2; }
[ $# -ge 2 ] && [ $# -le 3 ] || usage
here="$(cd "$(dirname "$0")" && pwd)"
[ -d "$1" ] || { echo "start-superlink: credentials folder $1 does not exist" >&2; exit 1; }
cred="$(cd "$1" && pwd)"
mkdir -p "$2"
state="$(cd "$2" && pwd)"
port="${3:-9091}"
bind="${SUPERLINK_BIND:-127.0.0.1}"
if [[ ! "$bind" =~ ^(127\.[0-9.]+|::1|localhost)$ ]] && [ "${SUPERLINK_EXPOSE_CONTROL:-0}" != 1 ]; then
  echo "start-superlink: SUPERLINK_BIND=$bind would let anyone who reaches port $port register" \
    "SuperNode keys, submit, list and stop runs (Flower 1.42 does not authenticate its Control" \
    "API). Keep the SuperLink on 127.0.0.1 and start deploy/start-proxy.sh for the SuperNodes;" \
    "set SUPERLINK_EXPOSE_CONTROL=1 only on a network where every host is trusted." >&2
  exit 2
fi
. "$here/../scripts/offline-env.sh"
export FLWR_HOME="${FLWR_HOME:-$state/flwr-home}"
mkdir -p "$FLWR_HOME"
for file in ca.crt server.crt server.key; do
  [ -f "$cred/$file" ] || { echo "start-superlink: $cred/$file is missing (run deploy/make-credentials.sh)" >&2; exit 1; }
done
for tool in flower-superlink flower-superexec; do
  command -v "$tool" >/dev/null || { echo "start-superlink: $tool is not on PATH (pip install flwr)" >&2; exit 1; }
done
pidfile="$state/superlink.pid"; exec_pidfile="$state/superexec.pid"
for running in "$pidfile" "$exec_pidfile"; do
  if [ -f "$running" ] && kill -0 "$(cat "$running")" 2>/dev/null; then
    echo "start-superlink: $(basename "$running" .pid) is already running (PID $(cat "$running"));" \
      "stop it with deploy/stop.sh $state" >&2; exit 1
  fi
done
secret="$state/superexec.secret"
if [ ! -s "$secret" ]; then  # the SuperLink reads the file as raw bytes: no newline
  (umask 077; openssl rand -hex 32 | tr -d '\n' >"$secret")
fi

database=()
[ -z "${SUPERLINK_DATABASE:-}" ] || database=(--database "$SUPERLINK_DATABASE")

cd "$state"  # setsid: its own session, so deploy/stop.sh finds every process it starts
setsid nohup flower-superlink --ssl-ca-certfile "$cred/ca.crt" --ssl-certfile "$cred/server.crt" \
  --ssl-keyfile "$cred/server.key" --enable-supernode-auth --disable-runtime-dependency-installation \
  --isolation process --superexec-auth-secret-file "$secret" \
  "${database[@]}" --host "$bind" --port "$port" \
  </dev/null >>"$state/superlink.log" 2>&1 &
pid=$!
echo "$pid" >"$pidfile"

probe="$bind"; [ "$probe" = 0.0.0.0 ] && probe=127.0.0.1
up=0
for _ in $(seq $((${WAIT_S:-60} * 2))); do
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" && rc=0 || rc=$?
    rm -f "$pidfile"
    echo "start-superlink: flower-superlink exited (status $rc); end of $state/superlink.log:" >&2
    tail -n 20 "$state/superlink.log" >&2; exit 1
  fi
  if (exec 3<>"/dev/tcp/$probe/$port") 2>/dev/null; then up=1; break; fi
  sleep 0.5
done
if [ "$up" != 1 ]; then
  echo "start-superlink: SuperLink (PID $pid) does not accept connections on $probe:$port after" \
    "${WAIT_S:-60} s; see $state/superlink.log, stop it with deploy/stop.sh $state" >&2
  exit 1
fi

# The operator's SuperExec: it alone holds the secret, so only it can acquire ServerApp tasks.
setsid nohup flower-superexec --runtime-api-address "$probe:$port" --root-certificates "$cred/ca.crt" \
  --superexec-auth-secret-file "$secret" </dev/null >>"$state/superexec.log" 2>&1 &
exec_pid=$!
echo "$exec_pid" >"$exec_pidfile"
sleep 1
if ! kill -0 "$exec_pid" 2>/dev/null; then
  rm -f "$exec_pidfile"
  echo "start-superlink: flower-superexec exited; end of $state/superexec.log:" >&2
  tail -n 20 "$state/superexec.log" >&2
  echo "start-superlink: the SuperLink (PID $pid) still runs; stop it with deploy/stop.sh $state" >&2; exit 1
fi
echo "start-superlink: SuperLink (PID $pid) accepts connections on $bind:$port; SuperExec PID $exec_pid"
