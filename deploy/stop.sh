#!/usr/bin/env bash
# Stop the SuperLink, SuperExec, proxy and SuperNodes started by the deploy/ scripts.
#
# Usage: deploy/stop.sh STATE_DIR
#   Stops each process named by STATE_DIR/supernode-*.pid, proxy.pid, superexec.pid and
#   superlink.pid, in this order, with its children and the sessions they lead (ServerApp
#   and ClientApp processes, also those a crashed SuperExec left behind, nginx workers):
#   SIGTERM, up to $STOP_WAIT_S s (default 15), then SIGKILL; removes the PID files. A PID
#   file whose process is gone, or is no longer a Flower or nginx process, is only removed.
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 2; }
[ -d "$1" ] || { echo "stop: $1 is not a folder" >&2; exit 1; }

descendants() {  # every child, grandchild, ... of $1
  local child
  for child in $(pgrep -P "$1" || true); do echo "$child"; descendants "$child"; done
}
family() {  # $1, its descendants and every process of a session one of them leads
  local p tree
  tree="$1 $(descendants "$1")"
  { for p in $tree; do echo "$p"; pgrep -s "$p" || true; done; } | sort -u | tr '\n' ' '
}
alive() { local p; for p in "$@"; do kill -0 "$p" 2>/dev/null && echo "$p"; done; return 0; }

shopt -s nullglob
# SuperNodes first: they sign off, through the proxy; the SuperExec before the SuperLink it polls
for pidfile in "$1"/supernode-*.pid "$1"/proxy.pid "$1"/superexec.pid "$1"/superlink.pid; do
  [ -f "$pidfile" ] || continue
  pid="$(cat "$pidfile")"
  if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && ps -o args= -p "$pid" | grep -qE 'flower|nginx'; then
    tree="$(family "$pid")"
    kill -TERM "$pid" 2>/dev/null || true  # the parent first: it stops its SuperExec cleanly
    for _ in $(seq $((${STOP_WAIT_S:-15} * 5))); do
      [ -z "$(alive $tree)" ] && break
      kill -0 "$pid" 2>/dev/null || kill -TERM $(alive $tree) 2>/dev/null || true
      sleep 0.2
    done
    left="$(alive $tree)"
    [ -z "$left" ] || { echo "stop: killing $(echo $left) (did not stop on SIGTERM)" >&2; kill -KILL $left 2>/dev/null || true; }
    echo "stop: stopped $(basename "$pidfile" .pid) (PID $pid)"
  fi
  rm -f "$pidfile"
done
