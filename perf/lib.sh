# Shared by the multi-node bench scripts (sourced, not run): builds the
# release binaries, picks a free port, and starts chronos nodes pinned to
# a CPU, stopping them all on exit.
#   bin, stamp, work, port   set on sourcing
#   start_node IP CONFIG LOG CPU   start one node, wait for /ping
#   stop_nodes                     stop every node started so far
set -euo pipefail
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/chronos-rel-target}"
cargo build --release --locked --bin chronos --bin chronos-perf >/dev/null
bin="$CARGO_TARGET_DIR/release"
stamp="$(date -u +%Y-%m-%d)"
work="$(mktemp -d)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
pids=()

stop_nodes() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_nodes EXIT

# A node's shard pins to the first CPU of its affinity: `taskset` gives
# each node its own CPU, as separate machines would have.
start_node() { # $1 = ip, $2 = config file, $3 = log, $4 = CPU
  taskset -c "$4" "$bin/chronos" --config "$2" --bind-address "$1" --bind-port "$port" 2>"$3" &
  pids+=($!)
  for _ in $(seq 1 200); do
    curl -fs "http://$1:$port/ping" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "chronos at $1 did not start"; cat "$3"; exit 1
}
