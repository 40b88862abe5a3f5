#!/usr/bin/env bash
# Overload (issue 16): one node on one core (CPU 0) offered creates plus
# their pops (1 s interval) at RATE and at 2 x RATE, with and without
# [throttling], in one run: admitted throughput, refusals, pop lateness.
# Usage: perf/overload-bench.sh [rate] [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
rate="${1:-15000}"
secs="${2:-10}"
. perf/lib.sh
for throttle in off on; do
  for mult in 1 2; do
    printf '[runtime]\ncores = 1\n' >"$work/c.toml"
    [ "$throttle" = on ] && printf '[throttling]\n' >>"$work/c.toml"
    start_node 127.0.0.1 "$work/c.toml" "$work/log" 0
    r=$(( rate * mult ))
    "$bin/chronos-perf" http --target "127.0.0.1:$port" --count $(( r * secs )) --rate "$r" \
      --interval-ms 1000 --connections 32 --replication-factor 1 \
      --name "overload-$throttle-x$mult-$stamp" | grep -E 'POST|pop lateness|errors'
    curl -fs "http://127.0.0.1:$port/metrics" | grep -E '^chronos_(throttled_total|throttle_rate) '
    stop_nodes
    sleep 1
  done
done
