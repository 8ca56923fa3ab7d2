#!/usr/bin/env bash
# bench/control-plane-scale.sh, tiny: 9 simulated servers against a fresh etcd, one kill round;
# the table has its row, the round completed (the coordinator committed a map without the
# killed server and every live server installed it) and no live server lost its lease.
# Exit 77 (SKIPPED) when etcd is not installed.
set -uo pipefail
root=$1 build=$2
if [[ ! -x $build/bench/control_plane_sim ]]; then
  # The sanitizer presets build no benchmarks (RDKV_BUILD_BENCH=OFF).
  echo "SKIPPED: $build/bench/control_plane_sim is not built (RDKV_BUILD_BENCH=OFF)"
  exit 77
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-cp-scale-test.XXXXXX")
trap 'rm -rf "$out"' EXIT
NO_BUILD=1 "$root/bench/control-plane-scale.sh" --counts 9 --kills 1 --steady 1 --build "$build" \
  --out "$out/run" >"$out/log" 2>&1
rc=$?
cat "$out/log"
((rc == 77)) && exit 77
((rc == 0)) || { echo "FAIL: control-plane-scale.sh exited $rc"; exit 1; }
grep -q '^RESULT servers=9 .*failed_rounds=0 .*leases_lost=0' "$out/log" ||
  { echo "FAIL: no complete RESULT line"; exit 1; }
grep -q '^round 1: killed 1 of 9 ' "$out/log" || { echo "FAIL: no kill round"; exit 1; }
grep -q '^| 9 | 1 | ' "$out/log" || { echo "FAIL: no table row"; exit 1; }
echo "PASS"
