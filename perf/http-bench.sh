#!/usr/bin/env bash
# GET /ping and POST /timers throughput of chronos against a stock nginx
# (Debian package, one worker per core, reuseport, `return 200`), measured
# with wrk on the same machine, interleaved in one run.
#
#   perf/http-bench.sh [rounds] [seconds] [connections]
#
# Two configurations, both interleaved in the run:
#  - "per core": nginx with one worker per core, chronos with one shard per
#    core (its default). wrk shares the cores with them.
#  - "1 worker": nginx with one worker, chronos with one shard, so wrk has
#    the other core to itself (on this 2-core machine the load generator
#    otherwise competes with the server for CPU).
#
# The chronos rows use its defaults (glommio's sockets); "chronos-ring" rows
# are the same binary with `[http] net-ring = true` (src/http/ring.rs), the
# A/B for the network ring.
#
# Needs: wrk, nginx (apt-get install wrk nginx-light), a release build.
# Prints a table and writes perf/results/http-<date>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}; SECS=${2:-10}; CONNS=${3:-64}
NGINX_PORT=18080; CHRONOS_PORT=17253; NGINX1_PORT=18081; CHRONOS1_PORT=17254
RING_PORT=17255; RING1_PORT=17256
TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet
BIN="$TARGET_DIR/release/chronos"
WORK=$(mktemp -d)
cores=$(nproc)
cat > "$WORK/nginx.conf" <<CONF
worker_processes $cores;
worker_cpu_affinity auto;
pid $WORK/nginx.pid;
error_log $WORK/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$NGINX_PORT reuseport; location / { return 200 "OK"; } }
}
CONF
sed -e "s/^worker_processes $cores;/worker_processes 1;/" -e "s/$NGINX_PORT/$NGINX1_PORT/" \
  -e "s#$WORK/nginx.pid#$WORK/nginx1.pid#" "$WORK/nginx.conf" > "$WORK/nginx1.conf"
cat > "$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"timing":{"interval":3600},"callback":{"http":{"uri":"http://127.0.0.1:9/cb","opaque":"wrk"}}}'
wrk.headers["Content-Type"] = "application/json"
LUA
nginx -c "$WORK/nginx.conf"
nginx -c "$WORK/nginx1.conf"
"$BIN" --bind-port $CHRONOS_PORT --log-level warn 2>"$WORK/chronos.log" &
CPID=$!
"$BIN" --bind-port $CHRONOS1_PORT --cores 1 --log-level warn 2>"$WORK/chronos1.log" &
CPID1=$!
printf '[http]\nnet-ring = true\n' > "$WORK/ring.toml"
"$BIN" --config "$WORK/ring.toml" --bind-port $RING_PORT --log-level warn 2>"$WORK/ring.log" &
GPID=$!
"$BIN" --config "$WORK/ring.toml" --bind-port $RING1_PORT --cores 1 --log-level warn 2>"$WORK/ring1.log" &
GPID1=$!
trap 'kill $CPID $CPID1 $GPID $GPID1 2>/dev/null; nginx -c "$WORK/nginx.conf" -s stop 2>/dev/null; nginx -c "$WORK/nginx1.conf" -s stop 2>/dev/null; rm -rf "$WORK"' EXIT
sleep 1
run() { # name url [script]
  local out
  if [ -n "${3:-}" ]; then out=$(wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -s "$3" "$2"); else out=$(wrk -t1 -c"$CONNS" -d"${SECS}s" --latency "$2"); fi
  local rps p50 p99
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1=="50%" {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  printf '%-28s %12s req/s   p50 %8s   p99 %8s\n' "$1" "$rps" "$p50" "$p99"
}
RESULT="perf/results/http-$(date +%Y-%m-%d).txt"
{
  echo "# $(date -Iseconds) $(uname -r) $(nproc) cores; wrk -t1 -c$CONNS -d${SECS}s; per core: chronos and nginx on every core; 1w/1s: one worker, one shard"
  for r in $(seq 1 "$ROUNDS"); do
    run "nginx GET /" "http://127.0.0.1:$NGINX_PORT/"
    run "chronos GET /ping" "http://127.0.0.1:$CHRONOS_PORT/ping"
    run "chronos POST /timers" "http://127.0.0.1:$CHRONOS_PORT/timers" "$WORK/post.lua"
    run "chronos-ring GET /ping" "http://127.0.0.1:$RING_PORT/ping"
    run "nginx-1w GET /" "http://127.0.0.1:$NGINX1_PORT/"
    run "chronos-1s GET /ping" "http://127.0.0.1:$CHRONOS1_PORT/ping"
    run "chronos-1s POST /timers" "http://127.0.0.1:$CHRONOS1_PORT/timers" "$WORK/post.lua"
    run "chronos-ring-1s GET /ping" "http://127.0.0.1:$RING1_PORT/ping"
  done
} | tee "$RESULT"
