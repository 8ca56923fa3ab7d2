#!/usr/bin/env bash
# Runs every libFuzzer target of a fuzz build for a bounded time each.
#   tests/fuzz/run-fuzzers.sh BUILD_DIR SECONDS
# A crash, leak or sanitizer report fails the run; the reproducer is left in BUILD_DIR/fuzz-artifacts.
set -euo pipefail
B=${1:?usage: run-fuzzers.sh BUILD_DIR SECONDS}
SECS=${2:-30}
mapfile -t fuzzers < <(find "$B" -type f -name '*_fuzz' -perm -u+x | sort)
if ((${#fuzzers[@]} == 0)); then
  echo "run-fuzzers: no fuzz targets found under $B (build with the fuzz preset)" >&2
  exit 1
fi
mkdir -p "$B/fuzz-artifacts"
failed=0
for f in "${fuzzers[@]}"; do
  name=$(basename "$f")
  corpus="$B/fuzz-corpus/$name"
  mkdir -p "$corpus"
  echo "run-fuzzers: $name for ${SECS}s"
  if "$f" -max_total_time="$SECS" -max_len=8192 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$B/fuzz-artifacts/$name-" "$corpus" >"$B/fuzz-artifacts/$name.log" 2>&1; then
    echo "run-fuzzers: $name passed ($(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$B/fuzz-artifacts/$name.log" | grep -o '[0-9]*$') runs)"
  else
    echo "run-fuzzers: $name FAILED; last lines:"
    tail -30 "$B/fuzz-artifacts/$name.log"
    failed=1
  fi
done
exit "$failed"
