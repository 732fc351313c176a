#!/usr/bin/env bash
# Point the Flower CLI at the SuperLink and register the sites' SuperNode public keys.
#
# Usage: deploy/register-sites.sh CRED_DIR CONNECTION_NAME ADDRESS SITE...
#   CRED_DIR         holds ca.crt and supernode-SITE.pub for every SITE
#   CONNECTION_NAME  name of the CLI connection, as in `flwr run . CONNECTION_NAME`
#   ADDRESS          host:port of the SuperLink for the operator, e.g. 127.0.0.1:9091 (its
#                    private port: Control is not reachable through deploy/start-proxy.sh)
# Writes (or updates) [superlink.CONNECTION_NAME] (address, root-certificates) in
# $FLWR_HOME/config.toml, then runs `flwr supernode register` for each site's key; a key
# that is already registered (or was revoked) is reported and skipped.
# Environment: FLWR_HOME (required: the Flower CLI folder the operator uses, e.g.
# STATE_DIR/flwr-home; set FLWR_HOME=~/.flwr on purpose to use your own).
set -euo pipefail
usage() { sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 2; }
[ $# -ge 4 ] || usage
[ -d "$1" ] || { echo "register-sites: credentials folder $1 does not exist" >&2; exit 1; }
cred="$(cd "$1" && pwd)"; name="$2"; address="$3"; shift 3
[ -n "${FLWR_HOME:-}" ] || { echo "register-sites: set FLWR_HOME (e.g. FLWR_HOME=STATE_DIR/flwr-home)" >&2; exit 2; }
[[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "register-sites: connection name '$name' must match [A-Za-z0-9_-]+" >&2; exit 2; }
for file in ca.crt $(printf 'supernode-%s.pub ' "$@"); do
  [ -f "$cred/$file" ] || { echo "register-sites: $cred/$file is missing" >&2; exit 1; }
done
. "$(dirname "$0")/../scripts/offline-env.sh"
mkdir -p "$FLWR_HOME"
export FLWR_HOME="$(cd "$FLWR_HOME" && pwd)"

flwr config list >/dev/null  # creates Flower's default config.toml when there is none
python - "$FLWR_HOME/config.toml" "$name" "$address" "$cred/ca.crt" <<'PY'
import sys
try:
    import tomli as tomllib, tomli_w  # both come with flwr
except ImportError as error:
    sys.exit(f"register-sites: {error}: run it with the Python environment that has flwr installed")
path, name, address, ca = sys.argv[1:]
with open(path, "rb") as handle:
    config = tomllib.load(handle)
config.setdefault("superlink", {})[name] = {"address": address, "root-certificates": ca}
with open(path, "wb") as handle:
    tomli_w.dump(config, handle)
PY
echo "register-sites: connection '$name' -> $address in $FLWR_HOME/config.toml"

for site in "$@"; do
  if out="$(flwr supernode register --name "$site" "$cred/supernode-$site.pub" "$name" 2>&1)"; then
    node="$(grep -o 'SuperNode [0-9]* registered' <<<"$out" | tr -dc '0-9' || true)"
    echo "register-sites: registered $site (node ${node:-?}; revoke it with: flwr supernode unregister ${node:-NODE_ID} $name)"
  elif grep -qi "already" <<<"$out"; then
    echo "register-sites: $site's key is already registered, or was revoked (then the site needs a new key pair)"
  else
    echo "register-sites: registering $site failed:" >&2; echo "$out" >&2; exit 1
  fi
done
