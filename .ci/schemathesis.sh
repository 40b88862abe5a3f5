#!/usr/bin/env bash
# Contract test: schemathesis (PyPI) against a live node's GET /openapi.json,
# every operation, a bounded number of examples each. Called by .ci/run;
# runs alone too: CARGO_TARGET_DIR=... bash .ci/schemathesis.sh [storage]
# (`storage`: the node keeps a timer log, so every generated timer goes
# through the log's record encoder too).
#
# Idempotent and non-interactive: schemathesis is installed once, pinned,
# into a venv in the CI cache and reused. The node is the debug build
# (built if missing), on a free loopback port, with a shared secret that
# every request carries, so the admin and internal routes are exercised
# past their 403. It is stopped on every exit (trap). Fails on any
# schemathesis failure, a node that died, or a panic in its log.
#
# The node and schemathesis run in a network namespace of their own with
# only loopback (as root, like the net split tests): the generated
# timers' callbacks really fire, and in there no generated address
# (169.254.169.254, 10.0.0.0/8, a name) reaches anything beyond this run.
set -euo pipefail
cd "$(dirname "$0")/.."

ST_VERSION=4.32.5
# Examples per operation, and a bound on the whole run (seconds).
ST_EXAMPLES="${ST_EXAMPLES:-100}"
ST_TIME_MAX_S="${ST_TIME_MAX_S:-600}"
CACHE="${CHRONOS_CI_CACHE:-$HOME/.cache/chronos-ci}"
VENV="$CACHE/venv"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"

if ! "$VENV/bin/st" --version 2>/dev/null | grep -qx "st, version $ST_VERSION"; then
  command -v python3 >/dev/null || { apt-get update -qq && apt-get install -y -qq python3 python3-venv; }
  python3 -m venv "$VENV" || { apt-get update -qq && apt-get install -y -qq python3-venv && python3 -m venv "$VENV"; }
  "$VENV/bin/pip" install -q --disable-pip-version-check "schemathesis==$ST_VERSION"
fi
"$VENV/bin/st" --version

BIN="$CARGO_TARGET_DIR/debug/chronos"
cargo build --locked -q --bin chronos

work=$(mktemp -d)
pid=
ns="chronos-st-$$"
stop() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  ip netns delete "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap stop EXIT
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
inns() { ip netns exec "$ns" "$@"; }

port=$(inns python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
secret="schemathesis-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
# One node in memory; callback timeouts (1500 ms) bound what the generated
# timers' pops cost; a pop to a generated host fails, which is fine.
cat >"$work/chronos.toml" <<EOF
[cluster]
shared-secret = "$secret"
EOF
if [ "${1:-}" = storage ]; then
  printf '[storage]\npath = "%s"\n' "$work/data" >>"$work/chronos.toml"
fi
# Not through `inns`: a function run in the background is a subshell, and
# $! would be it, not the node (which `ip netns exec` becomes).
ip netns exec "$ns" "$BIN" --config "$work/chronos.toml" --bind-address 127.0.0.1 \
  --bind-port "$port" 2>"$work/chronos.log" >/dev/null &
pid=$!
for _ in $(seq 1 200); do
  inns curl -fsS "http://127.0.0.1:$port/ping" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { echo "chronos exited at start:"; cat "$work/chronos.log"; exit 1; }
  sleep 0.1
done
inns curl -fsS "http://127.0.0.1:$port/ping" >/dev/null || { echo "chronos did not answer /ping"; cat "$work/chronos.log"; exit 1; }

# The resync listing's parameters: the node's own address half the time
# (else a generated one: 404) and always its cluster view (another is a
# 400 that the positive checks would rightly call a refused valid request).
view=$(inns curl -fsS -H "Authorization: Bearer $secret" "http://127.0.0.1:$port/cluster" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["cluster-view-id"])')
cat >"$work/schemathesis.toml" <<EOF
[dictionaries.node]
values = ["127.0.0.1:$port"]
[parameters]
"query.cluster-view-id" = "$view"
"query.node-for-replicas" = { dictionary = "node", probability = 0.5 }
# An Idempotency-Key used again with another body is 422 (the IETF
# draft; issue 42): schemathesis reuses the header values it generates,
# so for POST /timers its valid-data check takes a 422 as well.
[[operations]]
include-path = "/timers"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]
EOF

# Every check schemathesis has: no 5xx, statuses, content types, headers
# and bodies as documented, valid data accepted and invalid data refused,
# 405 with Allow for undocumented methods, the secret not ignored. (The
# stateful ones, use_after_free and ensure_resource_availability, need
# OpenAPI links, which a timer service has none of: they do not run.)
status=0
# Strategies for the formats of issue 42's timing keys (cron, zone, RFC 3339).
export PYTHONPATH="$PWD/.ci${PYTHONPATH:+:$PYTHONPATH}" SCHEMATHESIS_HOOKS=schemathesis_hooks
cd "$work" # schemathesis keeps a .schemathesis/ directory where it runs
timeout --kill-after=10 "$ST_TIME_MAX_S" ip netns exec "$ns" "$VENV/bin/st" --config-file "$work/schemathesis.toml" \
  run "http://127.0.0.1:$port/openapi.json" \
  --header "Authorization: Bearer $secret" \
  --checks all \
  --max-examples "$ST_EXAMPLES" \
  --workers 1 \
  --request-timeout 10 \
  --generation-database none \
  --no-color || status=$?

if ! kill -0 "$pid" 2>/dev/null; then
  echo "chronos died during the run:"; tail -50 "$work/chronos.log"; exit 1
fi
if grep -n "panicked" "$work/chronos.log"; then
  echo "chronos panicked during the run (above)"; exit 1
fi
[ "$status" -eq 0 ] || { echo "schemathesis failed (exit $status)"; exit "$status"; }
echo "schemathesis: every operation conforms"
