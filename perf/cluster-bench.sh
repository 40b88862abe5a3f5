#!/usr/bin/env bash
# POST throughput and pop lateness: a 3-node loopback cluster (127.0.0.1-3,
# replication factor 2) against a single node, interleaved in one run.
# Usage: perf/cluster-bench.sh [rounds] [timers]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
count="${2:-30000}"
cargo build --release --locked --bin chronos --bin chronos-perf >/dev/null
stamp="$(date -u +%Y-%m-%d)"
for r in $(seq 1 "$rounds"); do
  ./target/release/chronos-perf http --nodes 1 --cores 1 --replication-factor 1 \
    --count "$count" --connections 16 --interval-ms 3000-13000 --name "cluster-single-r$r-$stamp"
  ./target/release/chronos-perf http --nodes 3 --cores 1 --replication-factor 2 \
    --count "$count" --connections 16 --interval-ms 3000-13000 --name "cluster-3x-rf2-r$r-$stamp"
done
python3 - "$stamp" "$rounds" <<'PY'
import json, sys
stamp, rounds = sys.argv[1], int(sys.argv[2])
for r in range(1, rounds + 1):
    one = json.load(open(f"perf/results/cluster-single-r{r}-{stamp}.json"))
    three = json.load(open(f"perf/results/cluster-3x-rf2-r{r}-{stamp}.json"))
    a, b = one["post_throughput_per_s"], three["post_throughput_per_s"]
    print(f"round {r}: single {a:.0f} req/s, 3 nodes rf2 {b:.0f} req/s, cost {a/b:.2f}x; "
          f"pop p99 {one['pops']['lateness']['p99_ms']:.2f} vs {three['pops']['lateness']['p99_ms']:.2f} ms; "
          f"duplicates {three['pops']['duplicates']}, lost {three['pops']['lost']}")
PY
