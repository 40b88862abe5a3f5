#!/usr/bin/env bash
# The durable timer log (issue 21, "Performance"), in one run:
#
#   perf/storage-bench.sh [rounds] [wrk seconds] [wrk connections] [timers]
#   defaults:              3        8              "16 128"          1000000
#   PARTS="device post recovery" (any subset), RATE=5000 WINDOW_S=3 SNAP_AT=2
#   TAG=-x (appended to the result names)
#   SEGMENT_BYTES=n (the log's segment-bytes; default the node's: smaller
#   segments rotate more often within a row)
#   CHRONOS_BASELINE=/path/to/chronos (another build: adds batch-base and
#   none-base rows, interleaved with the others)
#   NICE=0 (e.g. -10: chronos, wrk and chronos-perf at that nice value, to
#   shield them from other work on a shared machine)
#
# chronos runs with `[runtime] cores = 1` pinned to CPU 1 (taskset; its
# shard pins to the first CPU of its affinity), wrk and chronos-perf on
# CPU 0. Storage directories are on the real disk, under /var/tmp.
#
# device    4 KiB O_DIRECT pwrite + fdatasync from Python on the same file
#           system, into a fallocated file (as chronos's segments) with the
#           CPU left idle and with a busy loop on it, and into a file
#           written with zeros first (busy): what the disk itself costs,
#           apart from chronos.
# post      POST /timers throughput (wrk -t1, a one-hour timer with its
#           callback to 127.0.0.1:9) for memory (no [storage]), sync =
#           "batch" and sync = "none", interleaved, at each connection
#           count, a fresh node and directory per row, default
#           compact-log-bytes (a snapshot in a row is counted, not
#           avoided). Per row: req/s, wrk p50/p99/max, chronos CPU per request,
#           and from /metrics: syncs, records per sync, log bytes per
#           create, fdatasync latency (mean from _sum/_count; the
#           histogram's first bucket is 1 ms, so only the share under 1, 2
#           and 5 ms is known) and snapshots.
# recovery  per round, a fresh directory:
#           1. load TIMERS one-hour timers (chronos-perf's --preload, 16
#              pipelined connections) into a node with sync = "none" and no
#              compaction;
#           2. SIGTERM; start with sync = "batch": start -> /ready 200 is
#              the recovery of TIMERS timers from the log alone;
#              "idle" window: chronos-perf http, RATE timers/s with a 1 s
#              interval for WINDOW_S s (pop lateness against its sink);
#           3. SIGTERM; start with compact-log-bytes = the log so far plus
#              what the idle window wrote by SNAP_AT s (creates from 0,
#              pops from 1 s): "snap" window, the same load, during which
#              the shard snapshots its TIMERS timers (each window reports
#              how much chronos_storage_snapshots_total moved in it: 1 in
#              "snap", 0 in the others; the snapshot's place in the window
#              comes from its log line); then "idle2", the same load after
#              the snapshot;
#           4. SIGTERM; start again: recovery from snapshot plus log.
#           Also: snapshot bytes per timer, log bytes per create of the load.
#
# Prints the rows as they come and a summary (medians, min-max) and writes
# perf/results/storage-<date><TAG>.txt; chronos-perf's JSON and SVG go to
# perf/results/storage-<date><TAG>/. The header names the commit built
# (CHRONOS_COMMIT when run from a tree without git, e.g. a `git archive`).
# Needs: wrk (apt-get install wrk), python3, a release build (lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}; SECS=${2:-8}; CONNS=${3:-"16 128"}; TIMERS=${4:-1000000}
PARTS=${PARTS:-"device post recovery"}
RATE=${RATE:-5000}; WINDOW_S=${WINDOW_S:-3}; SNAP_AT=${SNAP_AT:-2}; NICE=${NICE:-0}
SEGMENT_BYTES=${SEGMENT_BYTES:-}
CHRONOS_CPU=1; LOAD_CPU=0
. perf/lib.sh
data_root="$(mktemp -d /var/tmp/chronos-storage-bench.XXXXXX)"
cleanup() { stop_nodes; rm -rf "$data_root" "$work"; }
trap cleanup EXIT
out_dir="perf/results/storage-$stamp${TAG:-}"
result="perf/results/storage-$stamp${TAG:-}.txt"
rows="$work/rows.tsv"
: >"$rows"
mkdir -p "$out_dir"
cat >"$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"timing":{"interval":3600},"callback":{"http":{"uri":"http://127.0.0.1:9/x","opaque":"wrk"}}}'
wrk.headers["Content-Type"] = "application/json"
LUA

config() { # $1 = file, $2 = memory|batch|none, $3 = data dir, $4 = compact-log-bytes
  printf '[http]\nbind-address = "127.0.0.1"\n[runtime]\ncores = 1\n' >"$1"
  if [ "$2" != memory ]; then
    printf '[storage]\npath = "%s"\nsync = "%s"\ncompact-log-bytes = %s\n' "$3" "$2" "$4" >>"$1"
    [ -z "$SEGMENT_BYTES" ] || printf 'segment-bytes = %s\n' "$SEGMENT_BYTES" >>"$1"
  fi
}

# Start one chronos on CHRONOS_CPU on a fresh port; t0 = its start (ns).
start_chronos() { # $1 = config, $2 = log, [$3 = chronos binary]
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  t0=$(date +%s%N)
  nice -n "$NICE" taskset -c "$CHRONOS_CPU" "${3:-$bin/chronos}" --config "$1" --bind-port "$port" 2>"$2" &
  pids+=($!)
}

# Wait for /ready 200 (polled every 10 ms); prints ms since t0.
wait_ready() { # $1 = log
  local code
  for _ in $(seq 1 6000); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$port/ready" || true)
    if [ "$code" = 200 ]; then
      echo $(( ($(date +%s%N) - t0) / 1000000 ))
      return 0
    fi
    kill -0 "${pids[-1]}" 2>/dev/null || { echo "chronos exited" >&2; cat "$1" >&2; exit 1; }
    sleep 0.01
  done
  echo "chronos not ready after 60 s" >&2; cat "$1" >&2; exit 1
}

# SIGTERM the node and wait for it (stop_nodes from lib.sh).
stop_chronos() { stop_nodes; }

metrics() { curl -fs "http://127.0.0.1:$port/metrics"; }
metric() { # $1 = metrics text, $2 = exact series name
  awk -v n="$2" '$1 == n { print $2; found = 1 } END { if (!found) print 0 }' <<<"$1"
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# ---- device ----
device() {
  cat >"$work/dsync.py" <<'PY'
import os, mmap, time, sys
path, n, label, prep = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
bs = 4096
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
if prep == "zeroed":  # written with zeros first: no unwritten extents
    zeros = mmap.mmap(-1, 1 << 20)
    for at in range(0, (n + 1) * bs, 1 << 20):
        os.pwrite(fd, zeros, at)
else:  # as chronos's segments: fallocate (unwritten extents)
    os.posix_fallocate(fd, 0, (n + 1) * bs)
os.fsync(fd)
buf = mmap.mmap(-1, bs)
buf.write(b"x" * bs)
w, s = [], []
for i in range(n):
    t0 = time.perf_counter(); os.pwrite(fd, buf, i * bs)
    t1 = time.perf_counter(); os.fdatasync(fd)
    t2 = time.perf_counter()
    w.append(t1 - t0); s.append(t2 - t1)
os.close(fd); os.unlink(path)
def pct(a, p):
    a = sorted(a); return a[min(len(a) - 1, int(p * len(a)))] * 1e3
for name, a in (("pwrite", w), ("fdatasync", s)):
    print(f"device {label:9} {prep:9} {name:9} x{n}: mean {sum(a)/len(a)*1e3:6.3f} ms  p50 {pct(a,.5):6.3f}  p99 {pct(a,.99):6.3f}  max {max(a)*1e3:6.3f}")
PY
  for r in $(seq 1 "$ROUNDS"); do
    taskset -c "$CHRONOS_CPU" python3 "$work/dsync.py" "$data_root/dsync" 1000 "idle-r$r" fallocate
    taskset -c "$CHRONOS_CPU" sh -c 'while :; do :; done' &
    local spin=$!
    taskset -c "$CHRONOS_CPU" python3 "$work/dsync.py" "$data_root/dsync" 1000 "busy-r$r" fallocate
    taskset -c "$CHRONOS_CPU" python3 "$work/dsync.py" "$data_root/dsync" 1000 "busy-r$r" zeroed
    kill "$spin"; wait "$spin" 2>/dev/null || true
  done
}

# ---- post ----
post_row() { # $1 = memory|batch|none[-base], $2 = connections, $3 = round
  local dir="$data_root/post-$1" log="$work/post-$1-$2-$3.log" out m0 m1 k0 k1 exe="$bin/chronos"
  case $1 in *-base) exe="$CHRONOS_BASELINE" ;; esac
  rm -rf "$dir"
  config "$work/post.toml" "${1%-base}" "$dir" $((64 << 20))
  start_chronos "$work/post.toml" "$log" "$exe"
  wait_ready "$log" >/dev/null
  local pid="${pids[-1]}"
  m0="$(metrics)"; k0=$(ticks "$pid")
  out="$(nice -n "$NICE" taskset -c "$LOAD_CPU" wrk -t1 -c"$2" -d"${SECS}s" --latency -s "$work/post.lua" "http://127.0.0.1:$port/timers")"
  k1=$(ticks "$pid"); m1="$(metrics)"
  stop_chronos
  rm -rf "$dir"
  local rps p50 p99 reqs bad
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  local max; max=$(awk '$1=="Latency" {print $4; exit}' <<<"$out")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  bad=$(awk '/Non-2xx/ {print $NF}' <<<"$out"); bad=${bad:-0}
  local f
  # created records syncs bytes sync_sum sync_count le1 le2 le5 snapshots
  local vals=()
  for f in chronos_timers_created_total chronos_storage_records_total chronos_storage_syncs_total \
    chronos_storage_bytes_total chronos_storage_sync_seconds_sum chronos_storage_sync_seconds_count \
    'chronos_storage_sync_seconds_bucket{le="0.001"}' 'chronos_storage_sync_seconds_bucket{le="0.002"}' \
    'chronos_storage_sync_seconds_bucket{le="0.005"}' chronos_storage_snapshots_total; do
    vals+=("$(awk -v a="$(metric "$m0" "$f")" -v b="$(metric "$m1" "$f")" 'BEGIN {print b - a}')")
  done
  local cpu
  cpu=$(awk -v t=$((k1 - k0)) -v hz="$(getconf CLK_TCK)" -v n="$reqs" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
  printf 'post\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s' "$3" "$1" "$2" "$rps" "$bad" "$p50" "$p99" "$cpu" >>"$rows"
  printf '\t%s' "${vals[@]}" >>"$rows"
  printf '\t%s\n' "$max" >>"$rows"
  python3 - "$(tail -n 1 "$rows")" <<'PY'
import sys
r = sys.argv[1].split("\t")
_, rnd, mode, conns, rps, bad, p50, p99, cpu = r[:9]
created, records, syncs, byts, ssum, scount, le1, le2, le5, snaps = map(float, r[9:19])
lmax = r[19] if len(r) > 19 else "?"
line = f"r{rnd} {mode:10} c{conns:>3}: {float(rps):9.0f} req/s  non-2xx {bad}  p50 {p50:>8}  p99 {p99:>8}  max {lmax:>8}  cpu {cpu} us/req"
if syncs:
    line += (f"  | syncs {syncs:.0f}, {records / syncs:.1f} records/sync, {byts / max(created, 1):.0f} B/create,"
             f" fdatasync mean {ssum / scount * 1e3:.3f} ms, <=1 ms {le1 / scount:.1%}, <=2 ms {le2 / scount:.1%},"
             f" <=5 ms {le5 / scount:.1%}, snapshots {snaps:.0f}")
print(line)
PY
}

post() {
  local r c m i
  local modes=(memory batch none)
  [ -z "${CHRONOS_BASELINE:-}" ] || modes+=(batch-base none-base)
  for r in $(seq 1 "$ROUNDS"); do
    echo "r$r post: load average $(cut -d' ' -f1-3 /proc/loadavg)"
    for c in $CONNS; do
      # Rotate the order each round so no mode always runs first.
      for i in "${!modes[@]}"; do
        m=${modes[$(( (i + r - 1) % ${#modes[@]} ))]}
        post_row "$m" "$c" "$r"
      done
    done
  done
}

# ---- recovery, and pop lateness during a snapshot ----
window() { # $1 = name, $2 = round; appends a "late" row
  local name="storage-$1-$stamp-r$2" before after o s0 s1 e
  before="$(metrics)"
  s0=$(date +%s%3N)
  e=0
  o="$(nice -n "$NICE" taskset -c "$LOAD_CPU" "$bin/chronos-perf" http --target "127.0.0.1:$port" --count $((RATE * WINDOW_S)) \
    --rate "$RATE" --interval-ms 1000 --connections 16 --replication-factor 1 \
    --name "$name" --out-dir "$out_dir" 2>&1)" || e=$?
  s1=$(date +%s%3N)
  after="$(metrics)"
  echo "$o" >"$work/$name.out"
  local snaps logd
  snaps=$(awk -v a="$(metric "$before" chronos_storage_snapshots_total)" -v b="$(metric "$after" chronos_storage_snapshots_total)" 'BEGIN {print b - a}')
  logd=$(awk -v a="$(metric "$before" chronos_storage_bytes_total)" -v b="$(metric "$after" chronos_storage_bytes_total)" 'BEGIN {print b - a}')
  # pop lateness: expected delivered lost dups early p50 p99 p99.9 max
  local pl nl tp
  pl=$(awk '/^pop lateness/ {print $3, $4, $5, $6, $7, $8, $9, $10, $11}' <<<"$o")
  nl=$(awk '/^1 ms sleep noise/ {print $5, $6, $7, $8}' <<<"$o")
  tp=$(awk '/^POST throughput/ {print $3}' <<<"$o")
  [ -n "$pl" ] || { echo "chronos-perf failed (exit $e):"; echo "$o"; exit 1; }
  printf 'late\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$2" "$1" "$snaps" "$logd" "$s0" "$s1" "$tp" "$pl" "$nl" | tr ' ' '\t' >>"$rows"
  echo "r$2 window $1: snapshots in it $snaps, log bytes $logd, POST $tp/s; pops: expected delivered lost dups early p50 p99 p99.9 max = $pl ms; 1 ms sleep noise p50 p99 p99.9 max = $nl ms"
}

recovery_round() { # $1 = round
  local r=$1 dir="$data_root/rec" m L ms line snapline
  echo "r$r recovery: load average $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf "$dir"
  config "$work/rec.toml" none "$dir" $((1 << 40))
  start_chronos "$work/rec.toml" "$work/rec-load-$r.log"
  wait_ready "$work/rec-load-$r.log" >/dev/null
  nice -n "$NICE" taskset -c "$LOAD_CPU" "$bin/chronos-perf" http --target "127.0.0.1:$port" --preload "$TIMERS" --count 1 \
    --interval-ms 1000 --connections 16 --replication-factor 1 --name "preload-r$r" --out-dir "$work" \
    >"$work/preload-$r.out" 2>&1 || { cat "$work/preload-$r.out"; exit 1; }
  m="$(metrics)"
  local held loaded
  held=$(metric "$m" chronos_timers_pending)
  loaded=$(grep -o 'preloaded .*' "$work/preload-$r.out")
  L=$(metric "$m" chronos_storage_log_bytes)
  echo "r$r load: $loaded; held $held; log $L bytes ($(awk -v l="$L" -v n="$held" 'BEGIN {printf "%.0f", l / n}') B/timer, sync none, pipelined)"
  [ "${held%.*}" -ge "$TIMERS" ] || { echo "only $held timers held after the preload"; exit 1; }
  stop_chronos

  # Recovery from the log alone, then the idle window.
  config "$work/rec.toml" batch "$dir" $((1 << 40))
  start_chronos "$work/rec.toml" "$work/rec-log-$r.log"
  ms=$(wait_ready "$work/rec-log-$r.log")
  line=$(grep -o 'recovered [0-9]* timers and tombstones in [0-9]* ms' "$work/rec-log-$r.log")
  printf 'recover\t%s\tlog\t%s\t%s\t%s\n' "$r" "$ms" "$(awk '{print $2}' <<<"$line")" "$(awk '{print $(NF-1)}' <<<"$line")" >>"$rows"
  printf 'disk\t%s\tpreload\t%s\t%s\n' "$r" "$held" "$L" >>"$rows"
  echo "r$r recovery, log only ($L bytes): /ready 200 after $ms ms; log: $line"
  window idle "$r"
  local idle_bytes
  idle_bytes=$(tail -n 1 "$rows" | cut -f5)
  m="$(metrics)"
  L=$(metric "$m" chronos_storage_log_bytes)
  stop_chronos

  # Snapshot ~SNAP_AT s into the next window. A timer of the window writes
  # about half its log bytes at its create and half at its pop (1 s
  # later), so by SNAP_AT s the window has written (SNAP_AT - 0.5) s of
  # creates' worth of its total.
  local compact=$(( ${L%.*} + ${idle_bytes%.*} * (SNAP_AT * 10 - 5) / (WINDOW_S * 10) ))
  config "$work/rec.toml" batch "$dir" "$compact"
  start_chronos "$work/rec.toml" "$work/rec-snap-$r.log"
  ms=$(wait_ready "$work/rec-snap-$r.log")
  line=$(grep -o 'recovered [0-9]* timers and tombstones in [0-9]* ms' "$work/rec-snap-$r.log")
  printf 'recover\t%s\tlog\t%s\t%s\t%s\n' "$r" "$ms" "$(awk '{print $2}' <<<"$line")" "$(awk '{print $(NF-1)}' <<<"$line")" >>"$rows"
  echo "r$r recovery, log only (again): /ready 200 after $ms ms; log: $line; compact-log-bytes $compact"
  window snap "$r"
  local ws we
  ws=$(tail -n 1 "$rows" | cut -f6); we=$(tail -n 1 "$rows" | cut -f7)
  window idle2 "$r"
  snapline=$(grep -o 'snapshot of [0-9]* timers ([0-9]* bytes) in [0-9]* ms' "$work/rec-snap-$r.log" | head -n 1 || true)
  local snapat
  snapat=$(grep 'snapshot of' "$work/rec-snap-$r.log" | head -n 1 | awk '{print $1}' || true)
  [ -n "$snapline" ] || { echo "no snapshot in round $r"; tail -n 20 "$work/rec-snap-$r.log"; exit 1; }
  python3 - "$snapline" "$snapat" "$ws" "$we" "$r" >>"$rows" <<'PY'
import sys, datetime
line, at, ws, we, r = sys.argv[1:]
w = line.split()
timers, byts, ms = int(w[2]), int(w[4].strip("(")), int(w[7])
end = datetime.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() * 1000
start = end - ms
print(f"snap\t{r}\t{timers}\t{byts}\t{ms}\t{(start - int(ws)) / 1000:.2f}\t{(end - int(ws)) / 1000:.2f}\t{(int(we) - int(ws)) / 1000:.2f}")
PY
  tail -n 1 "$rows" | awk -F'\t' '{printf "r%s snapshot: %s timers, %s bytes (%.1f B/timer) in %s ms, from %+.2f s to %+.2f s of the snap window (%s s long, pops from +1 s)\n", $2, $3, $4, $4 / $3, $5, $6, $7, $8}'
  du -sb "$dir" | awk -v r="$r" '{print "r" r " directory after the snapshot and idle2: " $1 " bytes (segments preallocated)"}'
  stop_chronos

  # Recovery from snapshot plus log.
  start_chronos "$work/rec.toml" "$work/rec-both-$r.log"
  ms=$(wait_ready "$work/rec-both-$r.log")
  line=$(grep -o 'recovered [0-9]* timers and tombstones in [0-9]* ms' "$work/rec-both-$r.log")
  printf 'recover\t%s\tsnapshot+log\t%s\t%s\t%s\n' "$r" "$ms" "$(awk '{print $2}' <<<"$line")" "$(awk '{print $(NF-1)}' <<<"$line")" >>"$rows"
  echo "r$r recovery, snapshot + log: /ready 200 after $ms ms; log: $line; files: $(ls "$dir"/gen-*/ 2>/dev/null | tr '\n' ' ')"
  stop_chronos
  rm -rf "$dir"
}

recovery() {
  local r
  for r in $(seq 1 "$ROUNDS"); do recovery_round "$r"; done
}

summary() {
  python3 - "$rows" <<'PY'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
def med(xs):
    xs = [x for x in xs if x is not None]
    return (st.median(xs), min(xs), max(xs)) if xs else None
def fmt(t, f="{:.0f}"):
    if not t: return "-"
    return (f + " (" + f + "-" + f + ")").format(*t)
print("\n== summary: median (min-max) over rounds ==")
post = [r for r in rows if r[0] == "post"]
if post:
    by = {}
    for r in post:
        by.setdefault((r[2], r[3]), {})[r[1]] = r
    conns = sorted({r[3] for r in post}, key=int)
    for c in conns:
        print(f"\nPOST /timers, wrk -t1 -c{c}, chronos 1 core:")
        for m in ("memory", "batch", "batch-base", "none", "none-base"):
            rs = list(by.get((m, c), {}).values())
            if not rs: continue
            rps = med([float(r[4]) for r in rs]); cpu = med([float(r[8]) for r in rs])
            line = f"  {m:10} {fmt(rps)} req/s, cpu {fmt(cpu, '{:.2f}')} us/req, p99 {','.join(r[7] for r in rs)}, max {','.join(r[19] if len(r) > 19 else '?' for r in rs)}"
            if m != "memory":
                v = [list(map(float, r[9:19])) for r in rs]
                line += (f", {fmt(med([x[1] / x[2] for x in v]), '{:.1f}')} records/sync"
                         f", {fmt(med([x[3] / x[0] for x in v]))} log B/create"
                         f", fdatasync mean {fmt(med([x[4] / x[5] * 1e3 for x in v]), '{:.3f}')} ms"
                         f", <=1 ms {fmt(med([100 * x[6] / x[5] for x in v]), '{:.1f}')} %"
                         f", <=5 ms {fmt(med([100 * x[8] / x[5] for x in v]), '{:.1f}')} %"
                         f", snapshots {','.join(str(int(x[9])) for x in v)}")
            print(line)
        for m, goal in (("batch", 0.5), ("batch-base", 0.5), ("none", 0.9), ("none-base", 0.9)):
            ratios = []
            for rnd, r in by.get((m, c), {}).items():
                base = by.get(("memory", c), {}).get(rnd)
                if base: ratios.append(float(r[4]) / float(base[4]))
            if ratios:
                print(f"  {m}/memory per round: {', '.join(f'{x:.2f}' for x in ratios)}; median {st.median(ratios):.2f} (goal >= {goal})")
rec = [r for r in rows if r[0] == "recover"]
if rec:
    print("\nRecovery, start -> /ready 200 (the shard's own 'recovered' line in brackets):")
    for kind in ("log", "snapshot+log"):
        rs = [r for r in rec if r[2] == kind]
        if rs:
            print(f"  {kind:12} {fmt(med([float(r[3]) for r in rs]))} ms over {len(rs)} starts"
                  f" [{fmt(med([float(r[5]) for r in rs]))} ms], {','.join(r[4] for r in rs)} timers and tombstones (goal <= 3000 ms)")
late = [r for r in rows if r[0] == "late"]
if late:
    print("\nPop lateness, ms (each window: chronos-perf http, 1 s interval; snapshots in the window):")
    for w in ("idle", "snap", "idle2"):
        rs = [r for r in late if r[2] == w]
        if not rs: continue
        # late: 1 round, 2 name, 3 snaps, 4 logbytes, 5 s0, 6 s1, 7 post/s, 8.. expected delivered lost dups early p50 p99 p999 max, noise p50 p99 p999 max
        print(f"  {w:5} p50 {fmt(med([float(r[13]) for r in rs]), '{:.2f}')}  p99 {fmt(med([float(r[14]) for r in rs]), '{:.2f}')}"
              f"  p99.9 {fmt(med([float(r[15]) for r in rs]), '{:.2f}')}  max {fmt(med([float(r[16]) for r in rs]), '{:.2f}')}"
              f"  noise p99.9 {fmt(med([float(r[19]) for r in rs]), '{:.2f}')}  lost {','.join(r[10] for r in rs)}"
              f"  snapshots {','.join(r[3] for r in rs)}  log B/timer {fmt(med([float(r[4]) / float(r[8]) for r in rs]))}")
    for w in ("idle", "idle2"):
        ratios = []
        for r in [r for r in late if r[2] == "snap"]:
            base = [float(x[15]) for x in late if x[1] == r[1] and x[2] == w]
            if base: ratios.append(float(r[15]) / base[0])
        if ratios:
            print(f"  p99.9 snap / {w} of the same round: {', '.join(f'{x:.2f}' for x in ratios)}; median {st.median(ratios):.2f} (goal <= 2)")
snap = [r for r in rows if r[0] == "snap"]
if snap:
    print("\nSnapshots of the loaded shard:")
    print(f"  {fmt(med([float(r[3]) / float(r[2]) for r in snap]), '{:.1f}')} B per timer,"
          f" {fmt(med([float(r[2]) for r in snap]))} timers, {fmt(med([float(r[4]) for r in snap]))} ms;"
          f" in the snap window (pops from +1 s): {', '.join(f'+{r[5]}..+{r[6]} s of {r[7]} s' for r in snap)}")
disk = [r for r in rows if r[0] == "disk"]
if disk:
    print(f"  log bytes per create of the preload (sync none, 16 pipelined connections): {fmt(med([float(r[4]) / float(r[3]) for r in disk]), '{:.1f}')}")
PY
}

{
  trap cleanup EXIT
  commit="$(git rev-parse --short HEAD 2>/dev/null || echo "${CHRONOS_COMMIT:-unknown}")"
  [ -z "$(git status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null)" ] || commit="$commit + uncommitted src changes"
  echo "# $(date -Iseconds) chronos $commit; $(uname -r) $(nproc) cores; chronos 1 core on CPU $CHRONOS_CPU, load on CPU $LOAD_CPU, nice $NICE; rounds $ROUNDS, wrk ${SECS}s, conns $CONNS, timers $TIMERS, rate $RATE/s x ${WINDOW_S}s; data in $data_root ($(df -T "$data_root" | awk 'NR==2 {print $2, $1}'))"
  for p in $PARTS; do "$p"; done
  summary
} 2>&1 | tee "$result"
