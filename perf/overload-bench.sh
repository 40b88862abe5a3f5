#!/usr/bin/env bash
# Overload (issue 16): one node on one core (CPU 0) offered creates plus
# their pops (1 s interval) at RATE and at 2 x RATE, with and without
# [throttling], in one run: admitted throughput, refusals, pop lateness.
# Usage: perf/overload-bench.sh [rate] [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
rate="${1:-15000}"
secs="${2:-10}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/chronos-rel-target}"
cargo build --release --locked --bin chronos --bin chronos-perf >/dev/null
bin="$CARGO_TARGET_DIR/release"
stamp="$(date -u +%Y-%m-%d)"
work="$(mktemp -d)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null || true' EXIT
for throttle in off on; do
  for mult in 1 2; do
    printf '[runtime]\ncores = 1\n' >"$work/c.toml"
    [ "$throttle" = on ] && printf '[throttling]\n' >>"$work/c.toml"
    taskset -c 0 "$bin/chronos" --config "$work/c.toml" --bind-port "$port" 2>"$work/log" &
    pid=$!
    for _ in $(seq 1 200); do curl -fs "http://127.0.0.1:$port/ping" >/dev/null 2>&1 && break; sleep 0.05; done
    r=$(( rate * mult ))
    "$bin/chronos-perf" http --target "127.0.0.1:$port" --count $(( r * secs )) --rate "$r" \
      --interval-ms 1000 --connections 32 --replication-factor 1 \
      --name "overload-$throttle-x$mult-$stamp" | grep -E 'POST|pop lateness|errors'
    curl -fs "http://127.0.0.1:$port/metrics" | grep -E '^chronos_(throttled_total|throttle_rate) '
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
    sleep 1
  done
done
