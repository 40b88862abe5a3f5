#!/usr/bin/env bash
# Run every fuzz target (or those named) for SECS seconds each, one after
# another, starting from the seeds in fuzz/seeds/<target> (taken from the
# tests). The growing corpus lives in $FUZZ_CORPUS (default
# ~/.cache/chronos-fuzz/corpus), outside the tree. A crash stops the run
# with libFuzzer's report and the input under fuzz/artifacts/.
#
#   fuzz/run.sh            # 20 s each (what .ci/run does)
#   fuzz/run.sh 600        # 10 minutes each
#   fuzz/run.sh 3600 timer_json http_request
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
set -euo pipefail
cd "$(dirname "$0")"
SECS="${1:-20}"
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(http_request http_response timer_json timer_json_fast replication_body resync resync_page queue_input log_file)
fi
CORPUS="${FUZZ_CORPUS:-$HOME/.cache/chronos-fuzz/corpus}"
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$HOME/.cache/chronos-fuzz/target}"
cargo +nightly fuzz build 2>&1 | tail -n 2
for t in "${TARGETS[@]}"; do
  mkdir -p "$CORPUS/$t"
  cp -n seeds/"$t"/* "$CORPUS/$t/" 2>/dev/null || true
  echo "=== $t: ${SECS} s"
  cargo +nightly fuzz run "$t" "$CORPUS/$t" -- \
    -max_total_time="$SECS" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 2>&1 |
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)|ERROR|panicked|SUMMARY|Test unit written" || true
  # libFuzzer exits non-zero on a crash; pipefail is off for grep, so check the artifacts.
  if [ -n "$(find artifacts/"$t" -type f 2>/dev/null)" ]; then
    echo "fuzz target $t failed: see fuzz/artifacts/$t"
    exit 1
  fi
done
