#!/usr/bin/env bash
# POST throughput and local pop lateness with one remote site (GR) against
# no sites, interleaved in one run (issue 15). Node A (127.0.0.1, CPU 0)
# takes every request; in the "sites" runs it also sends each timer to
# site B (127.0.0.2, CPU 1, a one-node site of its own).
# Usage: perf/sites-bench.sh [rounds] [timers]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
count="${2:-40000}"
. perf/lib.sh

node() { # $1 = ip, $2 = site name, $3 = remote entry or "", $4 = CPU
  local cfg="$work/$1.toml"
  printf '[runtime]\ncores = 1\n' >"$cfg"
  if [ -n "$3" ]; then
    printf '[sites]\nlocal_site = "%s"\nremote_site = ["%s"]\nreplicate_timers_across_sites = true\n' "$2" "$3" >>"$cfg"
  fi
  start_node "$1" "$cfg" "$work/$1.log" "$4"
}

for r in $(seq 1 "$rounds"); do
  for kind in nosites sites; do
    if [ "$kind" = sites ]; then
      node 127.0.0.2 B "A=127.0.0.1:$port" 1
      node 127.0.0.1 A "B=127.0.0.2:$port" 0
    else
      node 127.0.0.1 A "" 0
    fi
    "$bin/chronos-perf" http --target "127.0.0.1:$port" --count "$count" --connections 16 \
      --interval-ms 3000-13000 --replication-factor 1 --name "sites-$kind-r$r-$stamp" | tail -n 8
    if [ "$kind" = sites ]; then
      curl -fs "http://127.0.0.1:$port/metrics" | grep '^chronos_site_replication_total'
    fi
    stop_nodes
    sleep 1
  done
done
python3 - "$stamp" "$rounds" <<'PY'
import json, sys
stamp, rounds = sys.argv[1], int(sys.argv[2])
for r in range(1, rounds + 1):
    a = json.load(open(f"perf/results/sites-nosites-r{r}-{stamp}.json"))
    b = json.load(open(f"perf/results/sites-sites-r{r}-{stamp}.json"))
    ta, tb = a["post_throughput_per_s"], b["post_throughput_per_s"]
    la, lb = a["pops"]["lateness"], b["pops"]["lateness"]
    print(f"round {r}: POST {ta:.0f}/s without sites, {tb:.0f}/s with one remote site ({tb/ta:.2f}x); "
          f"pop p99 {la['p99_ms']:.2f} vs {lb['p99_ms']:.2f} ms, p99.9 {la['p999_ms']:.2f} vs {lb['p999_ms']:.2f} ms; "
          f"lost {a['pops']['lost']}/{b['pops']['lost']}, duplicates {a['pops']['duplicates']}/{b['pops']['duplicates']}")
PY
