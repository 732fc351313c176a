#!/usr/bin/env bash
# Start nginx as the SuperLink's public door: TLS on the public port, Fleet API only.
#
# Usage: deploy/start-proxy.sh CRED_DIR STATE_DIR PUBLIC_ADDRESS [SUPERLINK_PORT]
#   CRED_DIR        folder of make-credentials.sh (uses server.crt, server.key, ca.crt)
#   STATE_DIR       the SuperLink's state folder; gets proxy.pid and proxy/ (nginx.conf,
#                   error.log, access.log, temporary files)
#   PUBLIC_ADDRESS  where SuperNodes connect, host:port, e.g. 0.0.0.0:9093
#   SUPERLINK_PORT  the port of deploy/start-superlink.sh on 127.0.0.1 (default 9091)
# nginx terminates TLS with the SuperLink's certificate and forwards POST /v1/fleet/NAME
# (the only paths a SuperNode uses) to https://127.0.0.1:SUPERLINK_PORT, verifying the
# SuperLink's certificate against ca.crt; headers pass unchanged, so SuperNode
# authentication (flwr-public-key, flwr-timestamp, flwr-signature) still happens in the
# SuperLink. Everything else (the Control API /v1/control/, the Runtime API /v1/runtime/,
# /docs, a path with dot segments, %-escapes or a query) gets 404.
# Waits until nginx accepts connections (at most $WAIT_S s, default 30). Stop it with
# deploy/stop.sh STATE_DIR. Needs nginx (Debian/Ubuntu: apt-get install nginx-light; the
# system service need not run: this is a separate instance with its own configuration).
# Environment: WAIT_S, PROXY_MAX_BODY (largest request body, default 64m; Flower sends
# arrays in chunks of 5 MiB).
set -euo pipefail
usage() { sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 2; }
[ $# -ge 3 ] && [ $# -le 4 ] || usage
[ -d "$1" ] || { echo "start-proxy: credentials folder $1 does not exist" >&2; exit 1; }
cred="$(cd "$1" && pwd)"
mkdir -p "$2"
state="$(cd "$2" && pwd)"
public="$3"; upstream_port="${4:-9091}"
[[ "$public" =~ ^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):[0-9]+$ ]] || {
  echo "start-proxy: PUBLIC_ADDRESS '$public' must be host:port, e.g. 0.0.0.0:9093" >&2; exit 2; }
[[ "$upstream_port" =~ ^[0-9]+$ ]] || { echo "start-proxy: SUPERLINK_PORT '$upstream_port' must be a number" >&2; exit 2; }
for file in ca.crt server.crt server.key; do
  [ -f "$cred/$file" ] || { echo "start-proxy: $cred/$file is missing (run deploy/make-credentials.sh)" >&2; exit 1; }
done
[[ "$cred$state" != *[[:space:]\;\"\'{}\$]* ]] || {
  echo "start-proxy: the credentials and state paths must not contain spaces, quotes, ';', '{', '}' or '\$'" >&2; exit 2; }
nginx="$(command -v nginx || true)"
[ -n "$nginx" ] || [ ! -x /usr/sbin/nginx ] || nginx=/usr/sbin/nginx  # not on a user's PATH
[ -n "$nginx" ] || { echo "start-proxy: nginx is not installed (Debian/Ubuntu: apt-get install nginx-light)" >&2; exit 1; }
pidfile="$state/proxy.pid"
if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  echo "start-proxy: already running (PID $(cat "$pidfile")); stop it with deploy/stop.sh $state" >&2; exit 1
fi

proxy="$state/proxy"
mkdir -p "$proxy/tmp"
user_line=""
if [ "$(id -u)" = 0 ]; then  # nginx would run its workers as 'nobody': let them write the temp files
  user_line="user nobody $(id -gn nobody);"
  chown nobody "$proxy/tmp"
fi
cat >"$proxy/nginx.conf" <<EOF
# Written by deploy/start-proxy.sh: SuperNodes reach the SuperLink's Fleet API and nothing else.
daemon off;
worker_processes 1;
pid $proxy/nginx.pid;
error_log $proxy/error.log notice;
$user_line
events { worker_connections 512; }
http {
  access_log $proxy/access.log;
  client_body_temp_path $proxy/tmp/body;
  proxy_temp_path $proxy/tmp/proxy;
  fastcgi_temp_path $proxy/tmp/fastcgi;
  uwsgi_temp_path $proxy/tmp/uwsgi;
  scgi_temp_path $proxy/tmp/scgi;
  server_tokens off;
  default_type text/plain;
  server {
    listen $public ssl;
    ssl_certificate $cred/server.crt;
    ssl_certificate_key $cred/server.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    client_max_body_size ${PROXY_MAX_BODY:-64m};
    location /v1/fleet/ {
      # The raw request line, not nginx's normalised path: '/v1/fleet/../control/..' or
      # '%2e%2e' never reaches the SuperLink.
      if (\$request_uri !~ "^/v1/fleet/[a-z][a-z-]*\$") { return 404; }
      limit_except POST { deny all; }
      proxy_pass https://127.0.0.1:$upstream_port;
      proxy_http_version 1.1;
      proxy_ssl_trusted_certificate $cred/ca.crt;
      proxy_ssl_verify on;
      proxy_ssl_name localhost;  # nginx checks DNS names only; the certificate names localhost
      proxy_set_header X-Forwarded-For \$remote_addr;
      proxy_request_buffering off;
      proxy_buffering off;
      proxy_read_timeout 300s;
      proxy_send_timeout 300s;
    }
    location / { return 404; }
  }
}
EOF
if ! check="$("$nginx" -t -q -p "$proxy" -c "$proxy/nginx.conf" -e "$proxy/error.log" 2>&1)"; then
  echo "start-proxy: nginx rejects $proxy/nginx.conf:" >&2; echo "$check" >&2; exit 1
fi

cd "$state"  # setsid: its own session, so deploy/stop.sh finds the master and its workers
setsid nohup "$nginx" -p "$proxy" -c "$proxy/nginx.conf" -e "$proxy/error.log" \
  </dev/null >>"$proxy/error.log" 2>&1 &
pid=$!
echo "$pid" >"$pidfile"

host="${public%:*}"; port="${public##*:}"; host="${host#[}"; host="${host%]}"
case "$host" in 0.0.0.0) host=127.0.0.1 ;; ::) host=::1 ;; esac
for _ in $(seq $((${WAIT_S:-30} * 2))); do
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" && rc=0 || rc=$?
    rm -f "$pidfile"
    echo "start-proxy: nginx exited (status $rc); end of $proxy/error.log:" >&2
    tail -n 20 "$proxy/error.log" >&2; exit 1
  fi
  if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then
    echo "start-proxy: nginx (PID $pid) forwards https://$public/v1/fleet/ to 127.0.0.1:$upstream_port"; exit 0
  fi
  sleep 0.5
done
echo "start-proxy: nginx (PID $pid) does not accept connections on $public after ${WAIT_S:-30} s;" \
  "see $proxy/error.log, stop it with deploy/stop.sh $state" >&2
exit 1
