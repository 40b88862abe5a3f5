#!/usr/bin/env bash
# Resync of many timers to a joining node (issue 14), and pop lateness
# while it runs, against the same workload with no resync, in one run.
#
# Node A (127.0.0.1, one core) holds PRELOAD timers (1 h interval,
# replication factor 2, so on one node each has one replica). The harness
# then creates a measured workload (RATE timers/s, 1 s interval) and
# measures its pops. Run "idle": nothing else happens. Run "resync": as
# soon as the preload is in, node B (127.0.0.2, one core) joins, A reloads
# to the two-node cluster, and `chronos resync --wait` runs on B then on A;
# every preloaded timer gains its second replica on B.
# Usage: perf/resync-bench.sh [preload] [rate] [count]
# (CLUSTER_EXTRA: more [cluster] lines for both nodes, e.g. resync-at-start = false)
set -euo pipefail
cd "$(dirname "$0")/.."
preload="${1:-1000000}"
rate="${2:-2000}"
count="${3:-60000}"
. perf/lib.sh
a="127.0.0.1:$port"
b="127.0.0.2:$port"

config() { # $1 = this node, $2 = joining list
  printf '[runtime]\ncores = 1\n[timers]\ntimers-per-shard-max = 4000000\n[cluster]\nlocalhost = "%s"\nnode = ["%s"]\njoining = [%s]\n%s\n' "$1" "$a" "$2" "${CLUSTER_EXTRA:-}"
}

for run in idle resync; do
  config "$a" "" >"$work/a.toml"
  start_node 127.0.0.1 "$work/a.toml" "$work/a-$run.log" 0
  name="resync-$run-$(( preload / 1000 ))k-$stamp"
  "$bin/chronos-perf" http --target "$a" --preload "$preload" --count "$count" \
    --rate "$rate" --interval-ms 1000 --connections 16 --name "$name" >"$work/$name.out" 2>&1 &
  h=$!
  until grep -q preloaded "$work/$name.out"; do
    kill -0 "$h" 2>/dev/null || { cat "$work/$name.out"; exit 1; }
    sleep 0.2
  done
  if [ "$run" = resync ]; then
    config "$b" "\"$b\"" >"$work/b.toml"
    start_node 127.0.0.2 "$work/b.toml" "$work/b.log" 1
    config "$a" "\"$b\"" >"$work/a.toml"
    kill -HUP "${pids[-2]}"
    sleep 0.5
    t0="$(date +%s.%N)"
    "$bin/chronos" resync --wait --address "$b" >"$work/resync-b.out"
    t1="$(date +%s.%N)"
    "$bin/chronos" resync --wait --address "$a" >"$work/resync-a.out"
    t2="$(date +%s.%N)"
    held="$(curl -fs "http://$b/metrics" | awk '$1=="chronos_timers_pending"{print $2}')"
    python3 - "$t0" "$t1" "$t2" "$held" "$preload" <<'PY' | tee "perf/results/resync-$(( preload / 1000 ))k-$(date -u +%Y-%m-%d).txt"
import sys
t0, t1, t2, held, preload = map(float, sys.argv[1:])
print(f"resync of {preload:.0f} timers to the joining node: {t1 - t0:.1f} s on B "
      f"({preload / (t1 - t0):.0f} timers/s), then {t2 - t1:.1f} s on A; B holds {held:.0f} timers")
PY
  fi
  wait "$h" || { cat "$work/$name.out"; exit 1; }
  tail -n 12 "$work/$name.out"
  stop_nodes
  sleep 1
done
python3 - "$stamp" "$(( preload / 1000 ))" <<'PY'
import json, sys
stamp, k = sys.argv[1], sys.argv[2]
idle = json.load(open(f"perf/results/resync-idle-{k}k-{stamp}.json"))["pops"]
busy = json.load(open(f"perf/results/resync-resync-{k}k-{stamp}.json"))["pops"]
for q in ("p50_ms", "p99_ms", "p999_ms", "max_ms"):
    print(f"pop lateness {q}: idle {idle['lateness'][q]:.2f}, during resync {busy['lateness'][q]:.2f}")
print(f"lost: idle {idle['lost']}, resync {busy['lost']}; duplicates: idle {idle['duplicates']}, resync {busy['duplicates']}")
PY
