#!/usr/bin/env bash
# Make the credentials of a TLS + SuperNode-authenticated Flower deployment.
#
# Usage: deploy/make-credentials.sh OUT_DIR SITE...
#   OUT_DIR/ca.crt, ca.key          a certificate authority (keep ca.key offline)
#   OUT_DIR/server.crt, server.key  the SuperLink's TLS certificate, signed by the CA, valid for
#                                   127.0.0.1, localhost and $SUPERLINK_HOST (an IP or DNS name)
#   OUT_DIR/supernode-SITE[.pub]    one SuperNode key pair per site (ECDSA P-384, OpenSSH
#                                   format, no passphrase); the SuperLink registers the .pub
# Existing files are kept: run it again with new site names to add sites (a new
# SUPERLINK_HOST needs a fresh OUT_DIR). Private keys are chmod 600.
# Environment: SUPERLINK_HOST (optional), CERT_DAYS (default 365).
set -euo pipefail
usage() { sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 2; }
[ $# -ge 2 ] || usage
out="$1"; shift
for tool in openssl ssh-keygen; do
  command -v "$tool" >/dev/null || { echo "make-credentials: '$tool' is not installed" >&2; exit 1; }
done
for site in "$@"; do
  [[ "$site" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "make-credentials: site name '$site' must match [A-Za-z0-9._-]+" >&2; exit 2; }
done
mkdir -p "$out"
cd "$out"
umask 077
days="${CERT_DAYS:-365}"
quiet() {  # run a command, show its output only when it fails
  local log
  log="$("$@" 2>&1)" || { echo "make-credentials: failed: $*" >&2; echo "$log" >&2; exit 1; }
}

if [ ! -f ca.crt ]; then
  quiet openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-384 -sha384 \
    -days "$days" -keyout ca.key -out ca.crt -subj "/CN=FedSM deployment CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
  echo "make-credentials: wrote $out/ca.crt and ca.key"
fi
if [ ! -f server.crt ]; then
  san="IP:127.0.0.1,DNS:localhost"
  host="${SUPERLINK_HOST:-}"
  if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then san="$san,IP:$host"; elif [ -n "$host" ]; then san="$san,DNS:$host"; fi
  quiet openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-384 -keyout server.key \
    -out server.csr -subj "/CN=${host:-localhost}"
  printf '%s\n' "subjectAltName=$san" "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" \
    "subjectKeyIdentifier=hash" "authorityKeyIdentifier=keyid,issuer" > server.ext
  quiet openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -sha384 \
    -days "$days" -extfile server.ext -out server.crt
  rm -f server.csr server.ext ca.srl
  echo "make-credentials: wrote $out/server.crt and server.key ($san)"
fi
for site in "$@"; do
  if [ ! -f "supernode-$site" ]; then
    quiet ssh-keygen -q -t ecdsa -b 384 -N "" -C "$site" -f "supernode-$site"
    echo "make-credentials: wrote $out/supernode-$site and supernode-$site.pub"
  fi
done
chmod 600 ca.key server.key
chmod 644 ca.crt server.crt
for site in "$@"; do chmod 600 "supernode-$site"; chmod 644 "supernode-$site.pub"; done
