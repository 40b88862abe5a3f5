#!/usr/bin/env bash
# Issue 43 item 4: how chronos scales with cores, against nginx, in one run.
#
#   perf/scale-bench.sh [rounds] [wrk seconds] [wrk connections]
#   defaults:            3        5             256
#   CORES="1 2 4 8"  server core counts to try; a count runs only when the
#                    machine has a load core left beside it (below)
#   PENDING=1000000 POPS_RATE=10000 POPS_S=3   the pending run (0: skip it)
#   PER_SHARD_MAX=n  [timers] timers-per-shard-max (a pending run past the
#                    default 8 M per shard)
#   ROUNDS=0 (the first argument) runs the pending runs alone
#   TAG=-x           appended to the result name
#
# For each core count N that fits: the server gets CPUs 0..N-1 (taskset),
# the load generator CPUs N..N+L-1 with L = min(N, cores left), so the
# two never share a core. Rows, interleaved per round (the order rotates):
#   nginx GET /              N workers, `return 200` (Debian's nginx)
#   chronos GET /ping        --cores N (a shard per core, pinned by chronos)
#   chronos POST memory      POST /timers, no [storage]
#   chronos POST storage     POST /timers, [storage] sync = "batch" on the
#                            real disk (/var/tmp), a fresh directory per row
# each with wrk -tL -c<connections>: req/s, p50, p99 and server CPU per
# request (user + system time of its processes from /proc over the
# requests wrk completed). Then, once per core count, the pending run:
# chronos-perf http against a node of N shards, PENDING one-hour timers
# preloaded, then POPS_RATE timers/s for POPS_S s due 1 s after their
# create: pop lateness (p50, p99, p99.9, max) with that many pending, the
# RSS and bytes per pending timer.
#
# Writes perf/results/scale-<date><TAG>.txt, with the machine it ran on
# (CPU model, cores, memory, kernel, the storage file system); the pending
# runs' JSON and SVG go to perf/results/scale-<date><TAG>/. No figure here
# is asserted anywhere: this is a benchmark, not a test.
# Needs: wrk and nginx (apt-get install wrk nginx), python3, a release
# build (perf/lib.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}; SECS=${2:-5}; CONNS=${3:-256}
CORES=${CORES:-"1 2 4 8"}
PENDING=${PENDING:-1000000}; POPS_RATE=${POPS_RATE:-10000}; POPS_S=${POPS_S:-3}
PER_SHARD_MAX=${PER_SHARD_MAX:-}
. perf/lib.sh
data_root="$(mktemp -d /var/tmp/chronos-scale-bench.XXXXXX)"
nginx_pid=""
cleanup() {
  stop_nodes
  [ -z "$nginx_pid" ] || kill "$nginx_pid" 2>/dev/null || true
  rm -rf "$data_root" "$work"
}
trap cleanup EXIT
result="perf/results/scale-$stamp${TAG:-}.txt"
out_dir="perf/results/scale-$stamp${TAG:-}"
mkdir -p "$out_dir"
rows="$work/rows.tsv"
: >"$rows"
cat >"$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"timing":{"interval":3600},"callback":{"http":{"uri":"http://127.0.0.1:9/x","opaque":"wrk"}}}'
wrk.headers["Content-Type"] = "application/json"
LUA
machine() {
  local model mem fs
  model=$(awk -F: '/model name/ {gsub(/^ +/, "", $2); print $2; exit}' /proc/cpuinfo)
  mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)
  fs=$(df -T /var/tmp | awk 'NR==2 {print $2 " on " $1}')
  echo "$(nproc) cores ($model), $mem, Linux $(uname -r), /var/tmp $fs"
}
ticks() { # user + system clock ticks of the given pids (and their threads)
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo $t
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_nginx() { # $1 = cores, $2 = CPU list: sets nginx_pid, nginx_port
  nginx_port=$(free_port)
  cat >"$work/nginx.conf" <<CONF
worker_processes $1;
pid $work/nginx.pid;
error_log /dev/null;
events { worker_connections 4096; }
http {
  access_log off;
  server { listen 127.0.0.1:$nginx_port reuseport; location / { return 200 "OK"; } }
}
CONF
  taskset -c "$2" nginx -c "$work/nginx.conf"
  sleep 0.5
  nginx_pid=$(cat "$work/nginx.pid")
}
stop_nginx() { kill "$nginx_pid" 2>/dev/null || true; sleep 0.3; nginx_pid=""; }

start_server() { # $1 = cores, $2 = CPU list, $3 = memory|storage: sets srv
  local cfg="$work/node.toml"
  printf '[http]\nbind-address = "127.0.0.1"\n[runtime]\ncores = %s\n' "$1" >"$cfg"
  [ -z "$PER_SHARD_MAX" ] || printf '[timers]\ntimers-per-shard-max = %s\n' "$PER_SHARD_MAX" >>"$cfg"
  if [ "$3" = storage ]; then
    rm -rf "$data_root/store"
    printf '[storage]\npath = "%s"\nsync = "batch"\n' "$data_root/store" >>"$cfg"
  fi
  port=$(free_port)
  start_node 127.0.0.1 "$cfg" "$work/node.log" "$2"
  srv=${pids[-1]}
}

row() { # $1 = N, $2 = server CPUs, $3 = load CPUs, $4 = threads, $5 = round, $6 = kind
  local url script="" who pids_of out k0 k1
  case $6 in
    nginx-get) start_nginx "$1" "$2"; url="http://127.0.0.1:$nginx_port/"
      pids_of="$nginx_pid $(pgrep -P "$nginx_pid" | tr '\n' ' ')" ;;
    chronos-get) start_server "$1" "$2" memory; url="http://127.0.0.1:$port/ping"; pids_of=$srv ;;
    chronos-post-memory) start_server "$1" "$2" memory; url="http://127.0.0.1:$port/timers"
      script="$work/post.lua"; pids_of=$srv ;;
    chronos-post-storage) start_server "$1" "$2" storage; url="http://127.0.0.1:$port/timers"
      script="$work/post.lua"; pids_of=$srv ;;
  esac
  k0=$(ticks $pids_of)
  out=$(taskset -c "$3" wrk -t"$4" -c"$CONNS" -d"${SECS}s" --latency ${script:+-s "$script"} "$url")
  k1=$(ticks $pids_of)
  case $6 in nginx-get) stop_nginx ;; *) stop_nodes ;; esac
  local rps p50 p99 reqs bad cpu
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out"); p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  bad=$(awk '/Non-2xx/ {print $NF}' <<<"$out"); bad=${bad:-0}
  cpu=$(awk -v t=$((k1 - k0)) -v hz="$(getconf CLK_TCK)" -v n="$reqs" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
  printf 'http\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$5" "$6" "$rps" "$cpu" "$p99" "$bad" >>"$rows"
  printf 'N=%s r%s %-21s %10.0f req/s  non-2xx %s  p50 %8s  p99 %8s  cpu %s us/req\n' "$1" "$5" "$6" "$rps" "$bad" "$p50" "$p99" "$cpu"
}

pending_run() { # $1 = N, $2 = server CPUs, $3 = load CPUs
  local name="scale-pending-n$1-$stamp${TAG:-}" o rss held
  start_server "$1" "$2" memory
  o=$(taskset -c "$3" "$bin/chronos-perf" http --target "127.0.0.1:$port" --preload "$PENDING" \
    --count $((POPS_RATE * POPS_S)) --rate "$POPS_RATE" --interval-ms 1000 --connections 16 \
    --replication-factor 1 --name "$name" --out-dir "$out_dir" 2>&1) || { echo "$o"; exit 1; }
  grep -o 'preloaded .*' <<<"$o" || true
  rss=$(awk '/VmRSS/ {print $2 * 1024}' "/proc/$srv/status")
  held=$(curl -fs "http://127.0.0.1:$port/metrics" | awk '$1 == "chronos_timers_pending" {print $2}')
  stop_nodes
  local pl nl
  pl=$(awk '/^pop lateness/ {print $3, $4, $5, $6, $7, $8, $9, $10, $11}' <<<"$o")
  nl=$(awk '/^1 ms sleep noise/ {print $5, $6, $7, $8}' <<<"$o")
  printf 'pending\t%s\t%s\t%s\t%s\t%s\n' "$1" "$held" "$rss" "$pl" "$nl" | tr ' ' '\t' >>"$rows"
  echo "N=$1 pending: $held timers held, RSS $rss B ($(awk -v r="$rss" -v h="$held" 'BEGIN {printf "%.0f", r / h}') B/timer); pops: expected delivered lost dups early p50 p99 p99.9 max = $pl ms; the machine's 1 ms sleep noise p50 p99 p99.9 max = $nl ms"
}

summary() {
  python3 - "$rows" <<'PY'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
http = [r for r in rows if r[0] == "http"]
print("\n== summary: median (min-max) over rounds ==")
for n in sorted({r[1] for r in http}, key=int):
    print(f"\nN = {n} server cores:")
    by = {}
    for r in http:
        if r[1] == n: by.setdefault(r[3], []).append(r)
    for kind in ("nginx-get", "chronos-get", "chronos-post-memory", "chronos-post-storage"):
        rs = by.get(kind, [])
        if not rs: continue
        rps = [float(r[4]) for r in rs]; cpu = [float(r[5]) for r in rs]
        print(f"  {kind:21} {st.median(rps):9.0f} req/s ({min(rps):.0f}-{max(rps):.0f}), cpu {st.median(cpu):.2f} us/req")
    def ratio(a, b):
        xs = []
        for ra in by.get(a, []):
            rb = [x for x in by.get(b, []) if x[2] == ra[2]]
            if rb: xs.append(float(ra[4]) / float(rb[0][4]))
        return xs
    for a, b in (("chronos-get", "nginx-get"), ("chronos-post-memory", "nginx-get"), ("chronos-post-storage", "chronos-post-memory")):
        xs = ratio(a, b)
        if xs: print(f"  {a} / {b} per round: {', '.join(f'{x:.2f}' for x in xs)}; median {st.median(xs):.2f}")
for r in rows:
    if r[0] == "pending":
        print(f"\nN = {r[1]} pending run: {r[2]} timers, RSS {float(r[3]) / 2**20:.0f} MiB, pops p50 {r[9]} p99 {r[10]} p99.9 {r[11]} max {r[12]} ms, lost {r[6]}"
              + (f"; 1 ms sleep noise p99.9 {r[15]} ms" if len(r) > 15 else ""))
PY
}

main() {
  local total n load server_cpus load_cpus r i k kinds=(nginx-get chronos-get chronos-post-memory chronos-post-storage)
  total=$(nproc)
  for n in $CORES; do
    load=$(( total - n < n ? total - n : n ))
    if [ "$load" -lt 1 ]; then echo "N=$n: skipped (no core left for the load on $total cores)"; continue; fi
    server_cpus="0-$((n - 1))"; load_cpus="$n-$((n + load - 1))"
    echo "N=$n: server CPUs $server_cpus, load CPUs $load_cpus (wrk -t$load -c$CONNS)"
    for r in $(seq 1 "$ROUNDS"); do
      for i in "${!kinds[@]}"; do
        k=${kinds[$(( (i + r - 1) % ${#kinds[@]} ))]}
        row "$n" "$server_cpus" "$load_cpus" "$load" "$r" "$k"
      done
    done
    [ "$PENDING" = 0 ] || pending_run "$n" "$server_cpus" "$load_cpus"
  done
  summary
}

{
  commit="$(git rev-parse --short HEAD 2>/dev/null || echo "${CHRONOS_COMMIT:-unknown}")"
  echo "# $(date -Iseconds) chronos $commit, nginx $(command -v nginx >/dev/null && nginx -v 2>&1 | sed 's/.*version: //' || echo "not installed"); machine: $(machine)"
  echo "# rounds $ROUNDS, wrk ${SECS}s -c$CONNS, cores tried: $CORES, pending $PENDING + $POPS_RATE pops/s x ${POPS_S}s"
  main
} 2>&1 | tee "$result"
