#!/usr/bin/env bash
# TLS against plain, in one run (issue 23): `POST /timers` over TLS and
# plain, and a burst of HTTPS callbacks against plain ones.
#
#   perf/tls-bench.sh [rounds] [seconds] [connections] [burst timers]
#
# POST: two chronos nodes with one shard each, one plain and one with
# `[http] tls-certificate` (a test CA made here with openssl), both pinned
# to CPU 0; wrk (Debian's is built with OpenSSL, so `https://` works; one
# TLS handshake per connection, then keep-alive) pinned to CPU 1. Rows
# alternate plain/TLS per round; each gives req/s and the server's CPU per
# request (user + system from /proc over the run).
#
# Callbacks: chronos-perf's burst (`--due-lead-ms 4000 --due-window-ms 100`:
# every timer due within 0.1 s, so the rate is what one node delivers) to
# a stock nginx (`return 200`, 1 worker), once to its plain port and once
# to its TLS port (`--callback-scheme https`, the nodes trusting the CA
# through `[timers] callback-ca-file`); callbacks/s from chronos's counters.
#
# The goal: TLS at >= 0.6x plain, for both.
# Needs: wrk, nginx, openssl; builds the release binaries.
# Prints a table and writes perf/results/tls-<date>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}; SECS=${2:-10}; CONNS=${3:-64}; BURST=${4:-50000}
PLAIN_PORT=17271; TLS_PORT=17272; NGINX_PLAIN=18091; NGINX_TLS=18092
SERVER_CPU=0; LOAD_CPU=1
TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet --bin chronos --bin chronos-perf
BIN="$TARGET_DIR/release/chronos"
PERF="$TARGET_DIR/release/chronos-perf"
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  nginx -c "$WORK/nginx.conf" -s stop 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# A CA and one certificate for 127.0.0.1 (chronos's listener and nginx).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=chronos bench CA" -keyout "$WORK/ca.key" -out "$WORK/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj "/CN=127.0.0.1" -keyout "$WORK/node.key" -out "$WORK/node.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' > "$WORK/san.ext"
openssl x509 -req -in "$WORK/node.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" \
  -CAcreateserial -days 2 -extfile "$WORK/san.ext" -out "$WORK/node.crt" 2>/dev/null

cat > "$WORK/nginx.conf" <<CONF
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  ssl_session_cache shared:tls:1m;
  server { listen 127.0.0.1:$NGINX_PLAIN; location / { return 200 "OK"; } }
  server {
    listen 127.0.0.1:$NGINX_TLS ssl;
    ssl_certificate $WORK/node.crt;
    ssl_certificate_key $WORK/node.key;
    location / { return 200 "OK"; }
  }
}
CONF
nginx -c "$WORK/nginx.conf"

printf '[http]\ntls-certificate = "%s"\ntls-private-key = "%s"\n' \
  "$WORK/node.crt" "$WORK/node.key" > "$WORK/tls.toml"
taskset -c $SERVER_CPU "$BIN" --bind-port $PLAIN_PORT --cores 1 --log-level warn 2>"$WORK/plain.log" &
PLAIN_PID=$!; PIDS+=("$PLAIN_PID")
taskset -c $SERVER_CPU "$BIN" --config "$WORK/tls.toml" --bind-port $TLS_PORT --cores 1 \
  --log-level warn 2>"$WORK/tls.log" &
TLS_PID=$!; PIDS+=("$TLS_PID")
sleep 1
cat > "$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"timing":{"interval":3600},"callback":{"http":{"uri":"http://127.0.0.1:9/cb","opaque":"wrk"}}}'
wrk.headers["Content-Type"] = "application/json"
LUA
HZ=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
ROWS_TSV="$WORK/rows.tsv"; : > "$ROWS_TSV"
run() { # name pid url
  local out before after rps p99 reqs cpu
  before=$(ticks "$2")
  out=$(taskset -c $LOAD_CPU wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -s "$WORK/post.lua" "$3")
  after=$(ticks "$2")
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  cpu=$(awk -v t=$((after - before)) -v hz="$HZ" -v n="$reqs" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
  printf '%-26s %12s req/s   p99 %8s   cpu %6s us/req\n' "$1" "$rps" "$p99" "$cpu"
  printf '%s\t%s\t%s\t%s\n' "$ROUND" "$1" "$rps" "$cpu" >> "$ROWS_TSV"
}
burst() { # name scheme port [extra config]
  local out rate
  out=$("$PERF" http --cores 1 --replication-factor 1 --count "$BURST" --connections 16 \
    --due-lead-ms 4000 --due-window-ms 100 --callback-to "127.0.0.1:$3" \
    --callback-scheme "$2" ${4:+--extra-config "$4"} --name "tls-burst-$2" --out-dir "$WORK" 2>&1 | tail -3)
  rate=$(echo "$out" | sed -n 's/.*: \([0-9]*\) callbacks\/s.*/\1/p')
  printf '%-26s %12s callbacks/s   %s\n' "$1" "${rate:-?}" "$(echo "$out" | grep -o '[0-9]* succeeded, [0-9]* failed' | head -1)"
  printf '%s\t%s\t%s\t0\n' "$ROUND" "$1" "${rate:-0}" >> "$ROWS_TSV"
}
printf '[timers]\ncallback-ca-file = "%s"\n' "$WORK/ca.pem" > "$WORK/ca.toml"
RESULT="perf/results/tls-$(date +%Y-%m-%d).txt"
{
  echo "# $(date -Iseconds) $(uname -r) $(nproc) cores; wrk -t1 -c$CONNS -d${SECS}s on CPU $LOAD_CPU, chronos --cores 1 on CPU $SERVER_CPU; burst $BURST timers due within 0.1 s to nginx (1 worker)"
  for r in $(seq 1 "$ROUNDS"); do
    ROUND=$r
    run "POST /timers plain" "$PLAIN_PID" "http://127.0.0.1:$PLAIN_PORT/timers"
    run "POST /timers TLS" "$TLS_PID" "https://127.0.0.1:$TLS_PORT/timers"
    burst "callbacks plain" http $NGINX_PLAIN
    burst "callbacks HTTPS" https $NGINX_TLS "$WORK/ca.toml"
  done
  awk -F'\t' '
    { v[$1, $2] = $3; c[$1, $2] = $4; if ($1 > n) n = $1 }
    END {
      print "# TLS over plain, per round (goal >= 0.6)"
      for (r = 1; r <= n; r++)
        printf "round %d: POST req/s %.2f (CPU/req TLS over plain %.2f); callbacks/s %.2f\n", r,
          v[r, "POST /timers TLS"] / v[r, "POST /timers plain"],
          c[r, "POST /timers TLS"] / c[r, "POST /timers plain"],
          v[r, "callbacks HTTPS"] / v[r, "callbacks plain"]
    }' "$ROWS_TSV"
} | tee "$RESULT"
