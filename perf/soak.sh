#!/usr/bin/env bash
# The fault soak (issue 21 item 6, issue 37 item 5): three chronos nodes
# with [storage] under a create/delete/update load while a nemesis kills
# (also past the replication delivery window), splits, grows and shrinks
# the cluster by rolling reloads; then the invariants (perf/README.md,
# "Fault soak").
# Exit status: 0 every invariant held, 1 one failed, 2 the run could not
# be made, 3 it overran its time bound. Run as root for the net split
# (network namespaces); without it the split is skipped, loudly.
# Usage: perf/soak.sh [seconds] [chronos-perf soak flags ...]
#   perf/soak.sh 600                 the 10-minute run perf/README records
#   perf/soak.sh 60 --no-storage     today's in-memory nodes (loses timers
#                                    at the kill of every node)
# The output is also written to perf/results/soak-<seconds>s-<date>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
shift || true
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/chronos-rel-target}"
cargo build --release --locked --bin chronos --bin chronos-perf >/dev/null
mkdir -p perf/results
"$CARGO_TARGET_DIR/release/chronos-perf" soak --duration-s "$secs" "$@" |
  tee "perf/results/soak-${secs}s-$(date -u +%Y-%m-%d).txt"
