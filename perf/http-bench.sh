#!/usr/bin/env bash
# GET /ping and POST /timers throughput and server CPU per request of
# chronos against a stock nginx (Debian package, `return 200`), measured
# with wrk on the same machine, interleaved in one run.
#
#   perf/http-bench.sh [rounds] [seconds] [connections] [wrk threads]
#   ROWS=pinned (default) | all      CHRONOS_BASELINE=<binary>      FLOOR=1
#
# "pinned" (issue 22's configuration): nginx with one worker and chronos
# with one shard (`--cores 1`), each pinned to CPU 0 (taskset), wrk pinned
# to CPU 1, so the server and the load generator never share a core.
# Rows: nginx GET /, chronos GET /ping, chronos POST /timers, and with
# CHRONOS_BASELINE the same two chronos rows for that binary (a
# before/after A/B in one run, e.g. a release build of the previous
# commit). After the rounds, a summary gives per round nginx's CPU per
# request over chronos's (the goal: >= 1.25), chronos's req/s over
# nginx's, and POST over GET.
#
# FLOOR=1 adds two pinned rows of `chronos-perf floor` (perf/harness/
# floor.rs): one-thread servers that answer every request head with
# chronos's /ping bytes and do nothing else, one on epoll (read + write)
# and one on io_uring (multishot RECV, SEND): the least CPU per request a
# server can spend on this kernel's TCP, to tell what is within reach.
#
# "all" adds the older configurations, interleaved too:
#  - "per core": nginx with one worker per core, chronos with one shard per
#    core (its default). wrk shares the cores with them.
#  - "1 worker": nginx with one worker, chronos with one shard, unpinned.
#  The chronos rows use its defaults (the network ring, src/http/ring.rs,
#  and `[http] accept-steering = "cpu"`); "chronos-glommio" rows are the
#  same binary with `[http] net-ring = false` (glommio's sockets), the A/B
#  for the ring, and "chronos-hash" with `accept-steering = "hash"` (the
#  kernel's reuseport hash, as nginx uses), the A/B for the steering.
#
# Besides req/s and latency, each row gives the server's CPU per request
# (user + system time of its processes over the run, from /proc, divided by
# the requests wrk completed). It varies far less between runs than req/s
# does; on this shared machine, still compare rows of the same run.
#
# Needs: wrk, nginx (apt-get install wrk nginx-light), a release build.
# Prints a table and writes perf/results/http-<date>-t<threads>[-pinned].txt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}; SECS=${2:-10}; CONNS=${3:-64}; THREADS=${4:-1}
ROWS=${ROWS:-pinned}
NGINX_PORT=18080; CHRONOS_PORT=17253; NGINX1_PORT=18081; CHRONOS1_PORT=17254
GLOMMIO_PORT=17255; GLOMMIO1_PORT=17256; HASH_PORT=17257; BASE_PORT=17258
PIN_NGINX_PORT=18082; PIN_CHRONOS_PORT=17259; PIN_BASE_PORT=17260
FLOOR_EPOLL_PORT=17261; FLOOR_URING_PORT=17262
SERVER_CPU=0; LOAD_CPU=1
TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet
BIN="$TARGET_DIR/release/chronos"
WORK=$(mktemp -d)
cores=$(nproc)
PIDS=()
NGINX_CONFS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for c in "${NGINX_CONFS[@]}"; do nginx -c "$c" -s stop 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
nginx_conf() { # file port workers pidfile
  cat > "$1" <<CONF
worker_processes $3;
$([ "$3" -gt 1 ] && echo "worker_cpu_affinity auto;")
pid $4;
error_log $WORK/error-$2.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$2 reuseport; location / { return 200 "OK"; } }
}
CONF
}
start_nginx() { # conf [cpu]: the workers inherit the master's affinity
  if [ -n "${2:-}" ]; then taskset -c "$2" nginx -c "$1"; else nginx -c "$1"; fi
  NGINX_CONFS+=("$1")
}
nginx_workers() { # pidfile
  pgrep -f "nginx: worker" -P "$(cat "$1")" | tr '\n' ' '
}
start_chronos() { # bin name port [cpu] [args...]: sets LAST_PID
  local bin=$1 name=$2 port=$3 cpu=$4
  shift 4
  if [ -n "$cpu" ]; then
    taskset -c "$cpu" "$bin" --bind-port "$port" --log-level warn "$@" 2>"$WORK/$name.log" &
  else
    "$bin" --bind-port "$port" --log-level warn "$@" 2>"$WORK/$name.log" &
  fi
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}
cat > "$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"timing":{"interval":3600},"callback":{"http":{"uri":"http://127.0.0.1:9/cb","opaque":"wrk"}}}'
wrk.headers["Content-Type"] = "application/json"
LUA

# Pinned: one worker / one shard on SERVER_CPU, wrk on LOAD_CPU.
nginx_conf "$WORK/nginx-pin.conf" $PIN_NGINX_PORT 1 "$WORK/nginx-pin.pid"
start_nginx "$WORK/nginx-pin.conf" $SERVER_CPU
start_chronos "$BIN" chronos-pin $PIN_CHRONOS_PORT $SERVER_CPU --cores 1
PIN_CPID=$LAST_PID
PIN_BPID=""
if [ -n "${CHRONOS_BASELINE:-}" ]; then
  start_chronos "$CHRONOS_BASELINE" baseline-pin $PIN_BASE_PORT $SERVER_CPU --cores 1
  PIN_BPID=$LAST_PID
fi
FLOOR_EPID=""; FLOOR_UPID=""
if [ "${FLOOR:-0}" = 1 ]; then
  FLOOR_SECS=$((ROUNDS * SECS * 12 + 120))
  taskset -c $SERVER_CPU "$TARGET_DIR/release/chronos-perf" floor epoll 127.0.0.1:$FLOOR_EPOLL_PORT $FLOOR_SECS &
  FLOOR_EPID=$!; PIDS+=("$FLOOR_EPID")
  taskset -c $SERVER_CPU "$TARGET_DIR/release/chronos-perf" floor uring 127.0.0.1:$FLOOR_URING_PORT $FLOOR_SECS &
  FLOOR_UPID=$!; PIDS+=("$FLOOR_UPID")
fi
if [ "$ROWS" = all ]; then
  nginx_conf "$WORK/nginx.conf" $NGINX_PORT "$cores" "$WORK/nginx.pid"
  nginx_conf "$WORK/nginx1.conf" $NGINX1_PORT 1 "$WORK/nginx1.pid"
  start_nginx "$WORK/nginx.conf"
  start_nginx "$WORK/nginx1.conf"
  start_chronos "$BIN" chronos $CHRONOS_PORT ""; CPID=$LAST_PID
  start_chronos "$BIN" chronos1 $CHRONOS1_PORT "" --cores 1; CPID1=$LAST_PID
  printf '[http]\nnet-ring = false\n' > "$WORK/glommio.toml"
  start_chronos "$BIN" glommio $GLOMMIO_PORT "" --config "$WORK/glommio.toml"; GPID=$LAST_PID
  start_chronos "$BIN" glommio1 $GLOMMIO1_PORT "" --config "$WORK/glommio.toml" --cores 1; GPID1=$LAST_PID
  printf '[http]\naccept-steering = "hash"\n' > "$WORK/hash.toml"
  start_chronos "$BIN" hash $HASH_PORT "" --config "$WORK/hash.toml"; HPID=$LAST_PID
  BPID=""
  if [ -n "${CHRONOS_BASELINE:-}" ]; then
    start_chronos "$CHRONOS_BASELINE" baseline $BASE_PORT ""; BPID=$LAST_PID
  fi
fi
sleep 1
PIN_NGINX_PIDS=$(nginx_workers "$WORK/nginx-pin.pid")
if [ "$ROWS" = all ]; then
  NGINX_PIDS=$(nginx_workers "$WORK/nginx.pid")
  NGINX1_PIDS=$(nginx_workers "$WORK/nginx1.pid")
fi
ticks() { # total user+system clock ticks of the given pids
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo $t
}
HZ=$(getconf CLK_TCK)
ROWS_TSV="$WORK/rows.tsv"
: > "$ROWS_TSV"
run() { # name pids url [script] [wrk cpu]
  local out before after wrk=(wrk -t"$THREADS" -c"$CONNS" -d"${SECS}s" --latency)
  [ -n "${4:-}" ] && wrk+=(-s "$4")
  [ -n "${5:-}" ] && wrk=(taskset -c "$5" "${wrk[@]}")
  before=$(ticks $2)
  out=$("${wrk[@]}" "$3")
  after=$(ticks $2)
  local rps p50 p99 reqs cpu
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1=="50%" {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  cpu=$(awk -v t=$((after - before)) -v hz="$HZ" -v n="$reqs" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
  printf '%-28s %12s req/s   p50 %8s   p99 %8s   cpu %6s us/req\n' "$1" "$rps" "$p50" "$p99" "$cpu"
  printf '%s\t%s\t%s\t%s\n' "$ROUND" "$1" "$rps" "$cpu" >> "$ROWS_TSV"
}
summary() { # per round: nginx cpu / chronos cpu, chronos rps / nginx rps, POST / GET
  awk -F'\t' '
    { rps[$1, $2] = $3; cpu[$1, $2] = $4; if ($1 > n) n = $1 }
    END {
      print "# summary (pinned rows): per round"
      for (r = 1; r <= n; r++) {
        ng = "nginx GET / (pinned)"; cg = "chronos GET /ping (pinned)"; cp = "chronos POST /timers (pinned)"
        line = sprintf("round %d: CPU/req nginx / chronos GET %.2f, POST %.2f; req/s chronos GET / nginx %.2f, POST / nginx %.2f, POST / GET %.2f",
          r, cpu[r, ng] / cpu[r, cg], cpu[r, ng] / cpu[r, cp], rps[r, cg] / rps[r, ng], rps[r, cp] / rps[r, ng], rps[r, cp] / rps[r, cg])
        bg = "baseline GET /ping (pinned)"; bp = "baseline POST /timers (pinned)"
        if ((r, bg) in cpu)
          line = line sprintf("; baseline: CPU/req nginx / baseline GET %.2f, POST %.2f; chronos CPU/req over baseline GET %.2f, POST %.2f",
            cpu[r, ng] / cpu[r, bg], cpu[r, ng] / cpu[r, bp], cpu[r, cg] / cpu[r, bg], cpu[r, cp] / cpu[r, bp])
        fe = "floor-epoll GET (pinned)"; fu = "floor-uring GET (pinned)"
        if ((r, fe) in cpu)
          line = line sprintf("; floor: CPU/req nginx / floor-epoll %.2f, nginx / floor-uring %.2f, chronos GET / floor-uring %.2f",
            cpu[r, ng] / cpu[r, fe], cpu[r, ng] / cpu[r, fu], cpu[r, cg] / cpu[r, fu])
        print line
      }
    }' "$ROWS_TSV"
}
RESULT="perf/results/http-$(date +%Y-%m-%d)-t$THREADS$([ "$ROWS" = pinned ] && echo -pinned).txt"
{
  echo "# $(date -Iseconds) $(uname -r) $(nproc) cores; wrk -t$THREADS -c$CONNS -d${SECS}s; pinned: server on CPU $SERVER_CPU, wrk on CPU $LOAD_CPU; rows=$ROWS"
  for r in $(seq 1 "$ROUNDS"); do
    ROUND=$r
    run "nginx GET / (pinned)" "$PIN_NGINX_PIDS" "http://127.0.0.1:$PIN_NGINX_PORT/" "" $LOAD_CPU
    run "chronos GET /ping (pinned)" "$PIN_CPID" "http://127.0.0.1:$PIN_CHRONOS_PORT/ping" "" $LOAD_CPU
    run "chronos POST /timers (pinned)" "$PIN_CPID" "http://127.0.0.1:$PIN_CHRONOS_PORT/timers" "$WORK/post.lua" $LOAD_CPU
    if [ -n "$PIN_BPID" ]; then
      run "baseline GET /ping (pinned)" "$PIN_BPID" "http://127.0.0.1:$PIN_BASE_PORT/ping" "" $LOAD_CPU
      run "baseline POST /timers (pinned)" "$PIN_BPID" "http://127.0.0.1:$PIN_BASE_PORT/timers" "$WORK/post.lua" $LOAD_CPU
    fi
    if [ -n "$FLOOR_EPID" ]; then
      run "floor-epoll GET (pinned)" "$FLOOR_EPID" "http://127.0.0.1:$FLOOR_EPOLL_PORT/ping" "" $LOAD_CPU
      run "floor-uring GET (pinned)" "$FLOOR_UPID" "http://127.0.0.1:$FLOOR_URING_PORT/ping" "" $LOAD_CPU
    fi
    [ "$ROWS" = all ] || continue
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
  summary
} | tee "$RESULT"
