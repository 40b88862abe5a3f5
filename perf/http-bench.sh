#!/usr/bin/env bash
# GET /ping and POST /timers throughput of chronos against a stock nginx
# (Debian package, one worker per core, reuseport, `return 200`), measured
# with wrk on the same machine, interleaved in one run.
#
#   perf/http-bench.sh [rounds] [seconds] [connections] [wrk threads]
#
# Two configurations, both interleaved in the run:
#  - "per core": nginx with one worker per core, chronos with one shard per
#    core (its default). wrk shares the cores with them.
#  - "1 worker": nginx with one worker, chronos with one shard, so wrk has
#    the other core to itself (on this 2-core machine the load generator
#    otherwise competes with the server for CPU).
#
# The chronos rows use its defaults (the network ring, src/http/ring.rs,
# and `[http] accept-steering = "cpu"`); "chronos-glommio" rows are the same
# binary with `[http] net-ring = false` (glommio's sockets), the A/B for the
# ring, and "chronos-hash" with `accept-steering = "hash"` (the kernel's
# reuseport hash, as nginx uses), the A/B for the steering.
#
# Besides req/s and latency, each row gives the server's CPU per request
# (user + system time of its processes over the run, from /proc, divided by
# the requests wrk completed): on 2 cores shared with wrk, a server that
# spends less CPU per request leaves more to the load generator, and this
# figure varies far less between runs than req/s does.
#
# With CHRONOS_BASELINE=<path to another chronos binary>, two more rows per
# round ("baseline GET /ping", "baseline POST /timers") run that binary with
# the same defaults, interleaved with the others: a before/after A/B of a
# change in one run (e.g. a release build of the previous commit).
#
# Needs: wrk, nginx (apt-get install wrk nginx-light), a release build.
# Prints a table and writes perf/results/http-<date>-t<threads>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}; SECS=${2:-10}; CONNS=${3:-64}; THREADS=${4:-1}
NGINX_PORT=18080; CHRONOS_PORT=17253; NGINX1_PORT=18081; CHRONOS1_PORT=17254
GLOMMIO_PORT=17255; GLOMMIO1_PORT=17256; HASH_PORT=17257; BASE_PORT=17258
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
printf '[http]\nnet-ring = false\n' > "$WORK/glommio.toml"
"$BIN" --config "$WORK/glommio.toml" --bind-port $GLOMMIO_PORT --log-level warn 2>"$WORK/glommio.log" &
GPID=$!
"$BIN" --config "$WORK/glommio.toml" --bind-port $GLOMMIO1_PORT --cores 1 --log-level warn 2>"$WORK/glommio1.log" &
GPID1=$!
printf '[http]\naccept-steering = "hash"\n' > "$WORK/hash.toml"
"$BIN" --config "$WORK/hash.toml" --bind-port $HASH_PORT --log-level warn 2>"$WORK/hash.log" &
HPID=$!
BPID=""
if [ -n "${CHRONOS_BASELINE:-}" ]; then
  "$CHRONOS_BASELINE" --bind-port $BASE_PORT --log-level warn 2>"$WORK/baseline.log" &
  BPID=$!
fi
trap 'kill $CPID $CPID1 $GPID $GPID1 $HPID $BPID 2>/dev/null; nginx -c "$WORK/nginx.conf" -s stop 2>/dev/null; nginx -c "$WORK/nginx1.conf" -s stop 2>/dev/null; rm -rf "$WORK"' EXIT
sleep 1
NGINX_PIDS=$(pgrep -f "nginx: worker" -P "$(cat "$WORK/nginx.pid")" | tr '\n' ' ')
NGINX1_PIDS=$(pgrep -f "nginx: worker" -P "$(cat "$WORK/nginx1.pid")" | tr '\n' ' ')
ticks() { # total user+system clock ticks of the given pids
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo $t
}
HZ=$(getconf CLK_TCK)
run() { # name pids url [script]
  local out before after
  before=$(ticks $2)
  if [ -n "${4:-}" ]; then out=$(wrk -t"$THREADS" -c"$CONNS" -d"${SECS}s" --latency -s "$4" "$3"); else out=$(wrk -t"$THREADS" -c"$CONNS" -d"${SECS}s" --latency "$3"); fi
  after=$(ticks $2)
  local rps p50 p99 reqs cpu
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1=="50%" {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  cpu=$(awk -v t=$((after - before)) -v hz="$HZ" -v n="$reqs" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
  printf '%-28s %12s req/s   p50 %8s   p99 %8s   cpu %6s us/req\n' "$1" "$rps" "$p50" "$p99" "$cpu"
}
RESULT="perf/results/http-$(date +%Y-%m-%d)-t$THREADS.txt"
{
  echo "# $(date -Iseconds) $(uname -r) $(nproc) cores; wrk -t$THREADS -c$CONNS -d${SECS}s; per core: chronos and nginx on every core; 1w/1s: one worker, one shard"
  for r in $(seq 1 "$ROUNDS"); do
    run "nginx GET /" "$NGINX_PIDS" "http://127.0.0.1:$NGINX_PORT/"
    run "chronos GET /ping" "$CPID" "http://127.0.0.1:$CHRONOS_PORT/ping"
    run "chronos POST /timers" "$CPID" "http://127.0.0.1:$CHRONOS_PORT/timers" "$WORK/post.lua"
    if [ -n "$BPID" ]; then
      run "baseline GET /ping" "$BPID" "http://127.0.0.1:$BASE_PORT/ping"
      run "baseline POST /timers" "$BPID" "http://127.0.0.1:$BASE_PORT/timers" "$WORK/post.lua"
    fi
    run "chronos-glommio GET /ping" "$GPID" "http://127.0.0.1:$GLOMMIO_PORT/ping"
    run "chronos-hash GET /ping" "$HPID" "http://127.0.0.1:$HASH_PORT/ping"
    run "nginx-1w GET /" "$NGINX1_PIDS" "http://127.0.0.1:$NGINX1_PORT/"
    run "chronos-1s GET /ping" "$CPID1" "http://127.0.0.1:$CHRONOS1_PORT/ping"
    run "chronos-1s POST /timers" "$CPID1" "http://127.0.0.1:$CHRONOS1_PORT/timers" "$WORK/post.lua"
    run "chronos-glommio-1s GET /ping" "$GPID1" "http://127.0.0.1:$GLOMMIO1_PORT/ping"
  done
} | tee "$RESULT"
