#!/usr/bin/env bash
# Issue 37's costs, a base build against this one, interleaved in one run:
#  1. POST throughput at replication factor 2 (3 nodes on 127.0.0.1-3, one
#     core each), in memory and with [storage] (sync = "batch");
#  2. the time from a node's start to /ready 200 after a kill -9, with
#     RESTART_TIMERS timers in its log and on its one peer (the log's
#     replay, and in this build the hand-off: GET /handoff to the peer).
# Usage: BASE=<dir holding a base build's `chronos`> perf/ack-bench.sh [rounds] [timers] [restart-timers]
# The harness is this build's chronos-perf for both (CHRONOS_BIN picks the
# node binary). Results: perf/results/ack-*-<date>.json and a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
count="${2:-30000}"
restart_timers="${3:-1000000}"
: "${BASE:?set BASE to the directory of a base build (its chronos binary)}"
source perf/lib.sh
new="$bin"
stamp="$(date -u +%Y-%m-%d)"
out="perf/results/ack-bench-$stamp.txt"
: >"$out"

throughput() { # $1 = label, $2 = node binary dir, $3 = extra config or ""
  local extra_args=()
  if [ -n "$3" ]; then extra_args=(--extra-config "$3"); fi
  CHRONOS_BIN="$2/chronos" "$new/chronos-perf" http --nodes 3 --cores 1 --replication-factor 2 \
    --count "$count" --connections 16 --interval-ms 3000-13000 \
    --name "ack-$1-$stamp" "${extra_args[@]}" >/dev/null ||
    echo "$1: chronos-perf reported lost or early pops (below)" | tee -a "$out"
  python3 - "$1" "perf/results/ack-$1-$stamp.json" <<'PY' | tee -a "$out"
import json, sys
r = json.load(open(sys.argv[2]))
p = r["pops"]
print(f"{sys.argv[1]}: POST {r['post_throughput_per_s']:.0f} req/s, pop p99 {p['lateness']['p99_ms']:.2f} ms, lost {p['lost']}, duplicates {p['duplicates']}")
PY
}

# Two nodes with [storage], N timers preloaded, kill -9 of node 2, then
# the time until its /ready answers 200.
restart() { # $1 = label, $2 = node binary dir
  local dirs="$work/restart-$1"
  rm -rf "$dirs"
  local cfgs=()
  for i in 1 2; do
    mkdir -p "$dirs/store-$i"
    printf '[runtime]\ncores = 1\n[cluster]\nlocalhost = "127.0.0.%s:%s"\nnode = ["127.0.0.1:%s", "127.0.0.2:%s"]\n[log]\nlevel = "warn"\n[storage]\npath = "%s"\n' \
      "$i" "$port" "$port" "$port" "$dirs/store-$i" >"$dirs/node-$i.toml"
    cfgs+=("$dirs/node-$i.toml")
  done
  local saved_bin="$bin"
  bin="$2"
  start_node 127.0.0.1 "${cfgs[0]}" "$dirs/node-1.log" 0
  start_node 127.0.0.2 "${cfgs[1]}" "$dirs/node-2.log" 1
  "$new/chronos-perf" http --target "127.0.0.1:$port,127.0.0.2:$port" --preload "$restart_timers" \
    --count 100 --interval-ms 500 --name "ack-preload-$1-$stamp" | grep -E 'preloaded' | tee -a "$out"
  kill -9 "${pids[1]}"
  wait "${pids[1]}" 2>/dev/null || true
  local t0
  t0=$(date +%s.%N)
  start_node 127.0.0.2 "${cfgs[1]}" "$dirs/node-2b.log" 1
  until curl -fs "http://127.0.0.2:$port/ready" >/dev/null 2>&1; do sleep 0.02; done
  python3 -c "import sys; print(f'{sys.argv[1]}: start to /ready 200 with {sys.argv[3]} timers: {float(sys.argv[2]):.2f} s')" \
    "$1" "$(echo "$(date +%s.%N) - $t0" | bc)" "$restart_timers" | tee -a "$out"
  stop_nodes
  bin="$saved_bin"
  rm -rf "$dirs"
}

storage_cfg="$work/storage.toml"
for r in $(seq 1 "$rounds"); do
  for build in base new; do
    dir="$new"
    [ "$build" = base ] && dir="$BASE"
    throughput "$build-memory-r$r" "$dir" ""
    printf '[storage]\npath = "%s/%s-r%s-{node}"\n' "$work" "$build" "$r" >"$storage_cfg"
    throughput "$build-storage-r$r" "$dir" "$storage_cfg"
    rm -rf "$work/$build-r$r-"*
  done
done
for r in $(seq 1 "$rounds"); do
  restart "base-r$r" "$BASE"
  restart "new-r$r" "$new"
done
echo "summary in $out"
