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
# CHRONOS_BINS="label=/path/to/chronos ...": the node binaries to compare,
# each an idle then a resync run, in the order given, ROUNDS times
# (default: this tree's build, once). The harness is this tree's for all.
# Prints, per binary, pop lateness idle vs resync (p99.9 ratio: issue 22's
# goal is <= 2) and each node's longest stretch of bulk work without a
# breath ("stretch-us-max" in GET /cluster; n/a on builds without it),
# and the CPU seconds each node spent during the resync, and each node's
# own pop lateness (its histogram: due time to the callback's first byte
# on the socket), to tell the node's part of the tail from the rest. The
# summary goes to perf/results/resync-<k>k-[RESULT_TAG-]<date>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
preload="${1:-1000000}"
rate="${2:-2000}"
count="${3:-60000}"
. perf/lib.sh
a="127.0.0.1:$port"
b="127.0.0.2:$port"
harness="$bin/chronos-perf"
bins="${CHRONOS_BINS:-current=$bin/chronos}"
rounds="${ROUNDS:-1}"
k=$(( preload / 1000 ))
summary="perf/results/resync-${k}k-${RESULT_TAG:+$RESULT_TAG-}$stamp.txt"

config() { # $1 = this node, $2 = joining list
  printf '[runtime]\ncores = 1\n[timers]\ntimers-per-shard-max = 4000000\n[cluster]\nlocalhost = "%s"\nnode = ["%s"]\njoining = [%s]\n%s\n' "$1" "$a" "$2" "${CLUSTER_EXTRA:-}"
}

stretch() { # $1 = node address: its stretch figures from GET /cluster
  curl -fs "http://$1/cluster" | python3 -c '
import json, sys
r = json.load(sys.stdin)["resync"]
if "stretch-us-max" not in r:
    print("n/a")
else:
    bounds, counts = r["stretch-us-bounds"], r["stretch-counts"]
    print(r["stretch-us-max"], "us max CPU time (wall clock", r["stretch-wall-us-max"],
          "us); stretches up to", bounds, "us, and more:", counts)'
}

node_lateness() { # $1 = node address: its own pop lateness (due to the
  # callback's first byte handed to the socket), from its histogram, so a
  # run's tail can be split into the node's part and the way to the harness.
  curl -fs "http://$1/metrics" | python3 -c '
import sys
b = {}
for line in sys.stdin:
    if line.startswith("chronos_pop_lateness_seconds_bucket"):
        le = line.split("le=\"")[1].split("\"")[0]
        b[le] = b.get(le, 0) + float(line.split()[-1])
n = b.get("+Inf", 0)
if n == 0:
    print("no pops")
else:
    print(f"{n:.0f} pops; over", ", ".join(f"{float(le) * 1e3:g} ms: {n - c:.0f}" for le, c in b.items() if le != "+Inf" and 0.0005 <= float(le) <= 0.01))'
}

cpu_s() { # $1 = pid: its user + system CPU seconds so far
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"
}

one_run() { # $1 = label, $2 = idle|resync, $3 = name
  local label="$1" run="$2" name="$3"
  config "$a" "" >"$work/a.toml"
  start_node 127.0.0.1 "$work/a.toml" "$work/a-$run.log" 0
  timeout 600 "$harness" http --target "$a" --preload "$preload" --count "$count" \
    --rate "$rate" --interval-ms 1000 --connections 16 --name "$name" >"$work/$name.out" 2>&1 &
  h=$!
  until grep -qs preloaded "$work/$name.out"; do
    kill -0 "$h" 2>/dev/null || { cat "$work/$name.out"; exit 1; }
    sleep 0.2
  done
  if [ "$run" = resync ]; then
    config "$b" "\"$b\"" >"$work/b.toml"
    start_node 127.0.0.2 "$work/b.toml" "$work/b.log" 1
    config "$a" "\"$b\"" >"$work/a.toml"
    kill -HUP "${pids[-2]}"
    sleep 0.5
    cpu_a0="$(cpu_s "${pids[-2]}")"
    cpu_b0="$(cpu_s "${pids[-1]}")"
    t0="$(date +%s.%N)"
    timeout 300 "$bin/chronos" resync --wait --address "$b" >"$work/resync-b.out"
    t1="$(date +%s.%N)"
    timeout 300 "$bin/chronos" resync --wait --address "$a" >"$work/resync-a.out"
    t2="$(date +%s.%N)"
    echo "$label: CPU seconds during the resync: A $(awk "BEGIN{print $(cpu_s "${pids[-2]}") - $cpu_a0}"), B $(awk "BEGIN{print $(cpu_s "${pids[-1]}") - $cpu_b0}")" | tee -a "$summary"
    held="$(curl -fs "http://$b/metrics" | awk '$1=="chronos_timers_pending"{print $2}')"
    python3 - "$t0" "$t1" "$t2" "$held" "$preload" "$label" <<'PY' | tee -a "$summary"
import sys
t0, t1, t2, held, preload = map(float, sys.argv[1:6])
print(f"{sys.argv[6]}: resync of {preload:.0f} timers to the joining node: {t1 - t0:.1f} s on B "
      f"({preload / (t1 - t0):.0f} timers/s), then {t2 - t1:.1f} s on A; B holds {held:.0f} timers")
PY
    echo "$label: stretch without a breath, A (serving): $(stretch "$a")" | tee -a "$summary"
    echo "$label: stretch without a breath, B (applying): $(stretch "$b")" | tee -a "$summary"
  fi
  wait "$h" || { cat "$work/$name.out"; exit 1; }
  echo "$label $run: node-side pop lateness, A: $(node_lateness "$a")" | tee -a "$summary"
  [ "$run" = resync ] && echo "$label $run: node-side pop lateness, B: $(node_lateness "$b")" | tee -a "$summary"
  tail -n 12 "$work/$name.out"
  stop_nodes
  sleep 1
}

names=()
for round in $(seq 1 "$rounds"); do
  for pair in $bins; do
    label="${pair%%=*}"
    path="${pair#*=}"
    [ "$(basename "$path")" = chronos ] || { echo "$path: the node binary must be named chronos"; exit 1; }
    bin="$(cd "$(dirname "$path")" && pwd)"
    for run in idle resync; do
      name="resync-$run-${k}k-${RESULT_TAG:+$RESULT_TAG-}$label-r$round-$stamp"
      one_run "$label" "$run" "$name"
    done
    names+=("${RESULT_TAG:+$RESULT_TAG-}$label-r$round")
  done
done
python3 - "$stamp" "$k" "${names[@]}" <<'PY' | tee -a "$summary"
import json, sys
stamp, k = sys.argv[1], sys.argv[2]
for tag in sys.argv[3:]:
    def pops(run):
        return json.load(open(f"perf/results/resync-{run}-{k}k-{tag}-{stamp}.json"))["pops"]
    idle, busy = pops("idle"), pops("resync")
    for q in ("p50_ms", "p99_ms", "p999_ms", "max_ms"):
        print(f"{tag}: pop lateness {q}: idle {idle['lateness'][q]:.2f}, during resync {busy['lateness'][q]:.2f}")
    ratio = busy["lateness"]["p999_ms"] / max(idle["lateness"]["p999_ms"], 1e-9)
    print(f"{tag}: p99.9 during resync / idle = {ratio:.2f} (goal <= 2)")
    print(f"{tag}: lost: idle {idle['lost']}, resync {busy['lost']}; duplicates: idle {idle['duplicates']}, resync {busy['duplicates']}")
PY
