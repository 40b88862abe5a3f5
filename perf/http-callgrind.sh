#!/usr/bin/env bash
# User-space instructions per HTTP request of one pinned one-shard node,
# under callgrind (instruction counts hold on a loaded machine; wall clock
# does not). Issue 22, "HTTP cost per request".
#
#   perf/http-callgrind.sh <chronos binary> <ping|post|post-tags> [secs] [conns]
#
# The node (`--cores 1`, CPU 0) runs under `valgrind --tool=callgrind`;
# once it answers /ping the counters are zeroed (`callgrind_control -z`),
# wrk (-t1, CPU 1) loads it for `secs` (default 8: under 10 s, so no
# timer of the POST body pops inside the window), the counters are dumped
# (`callgrind_control -d`) and divided by wrk's completed requests.
# Prints one line and leaves the dump, wrk's output and callgrind_annotate
# listings (self.txt: self cost; annot.txt: with the inclusive cost of
# every call from chronos's sources) in $OUT (default a new /tmp dir).
#   post       {"timing":{"interval":10,"repeat-for":10},"callback":{"http":{...}}}
#   post-tags  the same with reliability.replication-factor and two tags
# Needs valgrind and wrk (apt-get install valgrind wrk).
set -euo pipefail
BIN=$1; KIND=$2; SECS=${3:-8}; CONNS=${4:-64}
PORT=${PORT:-17391}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
CB='"callback":{"http":{"uri":"http://127.0.0.1:9/cb","opaque":"some-opaque-data"}}'
case $KIND in
  ping) PATH_=/ping; BODY= ;;
  post) PATH_=/timers; BODY="{\"timing\":{\"interval\":10,\"repeat-for\":10},$CB}" ;;
  post-tags) PATH_=/timers
    BODY="{\"timing\":{\"interval\":10,\"repeat-for\":10},$CB,\"reliability\":{\"replication-factor\":2},\"statistics\":{\"tag-info\":[{\"type\":\"CALL\"},{\"type\":\"SUB\",\"count\":3}]}}" ;;
  *) echo "kind: ping, post or post-tags" >&2; exit 2 ;;
esac
WRK_ARGS=()
if [ -n "$BODY" ]; then
  cat > "$OUT/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '$BODY'
wrk.headers["Content-Type"] = "application/json"
LUA
  WRK_ARGS=(-s "$OUT/post.lua")
fi
taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.out" \
  "$BIN" --cores 1 --bind-port "$PORT" --log-level warn 2>"$OUT/node.log" &
VPID=$!
trap 'kill $VPID 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
  curl -sf "http://127.0.0.1:$PORT/ping" >/dev/null 2>&1 && break
  sleep 0.5
done
sleep 1
callgrind_control -z "$VPID" >/dev/null
taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" "${WRK_ARGS[@]}" "http://127.0.0.1:$PORT$PATH_" >"$OUT/wrk.txt"
callgrind_control -d "$VPID" >/dev/null
kill "$VPID"; wait "$VPID" 2>/dev/null || true
REQS=$(awk '/requests in/ {print $1}' "$OUT/wrk.txt")
DUMP=$(ls -t "$OUT"/cg.out.* | head -1)
callgrind_annotate --threshold=100 --auto=no "$DUMP" >"$OUT/self.txt" 2>/dev/null
callgrind_annotate --threshold=100 --auto=yes --inclusive=yes "$DUMP" >"$OUT/annot.txt" 2>/dev/null
IR=$(awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}' "$OUT/self.txt")
echo "$KIND: $REQS requests ($(grep -c Non-2xx "$OUT/wrk.txt" || true) non-2xx lines), $IR Ir, $((IR / REQS)) Ir per request; files in $OUT"
