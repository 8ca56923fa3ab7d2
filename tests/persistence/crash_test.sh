#!/usr/bin/env bash
# The persistence crash test: kill -9 a kvserver at random moments under concurrent writes,
# restart it, and check every acknowledged write (tests/persistence/crash_driver.cc).
#
#   crash_test.sh DRIVER KVSERVER MODE [CYCLES] [driver flags...]   (what ctest runs)
#   crash_test.sh BUILD_DIR [CYCLES]                                 (both modes, by hand)
#
# MODE is sync (zero lost acknowledged writes allowed) or async (lost writes reported; any
# acknowledged more than --persist_lag_ms before a kill fails the test).
# RDKV_CRASH_CYCLES overrides CYCLES; RDKV_CRASH_SEED fixes the random seed.
# Exit status: 0 pass, 1 a violation (details in the work dir it names, which is kept).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# TSan builds: a false positive inside glibc (tsan.supp says which) must not kill the server.
export TSAN_OPTIONS="${TSAN_OPTIONS:-} suppressions=$here/tsan.supp"

seed_flag=()
[[ -n ${RDKV_CRASH_SEED:-} ]] && seed_flag=(--seed="$RDKV_CRASH_SEED")

if [[ $# -le 2 && -d ${1:-} ]]; then
  build=$1
  cycles=${RDKV_CRASH_CYCLES:-${2:-20}}
  driver=$build/tests/persistence/persist_crash_driver
  kvserver=$build/server/kvserver
  "$driver" --kvserver="$kvserver" --mode=sync --cycles="$cycles" "${seed_flag[@]}"
  "$driver" --kvserver="$kvserver" --mode=async --cycles="$cycles" "${seed_flag[@]}"
  exit 0
fi
if [[ $# -lt 3 ]]; then
  sed -n '2,12p' "$0" >&2
  exit 2
fi
driver=$1 kvserver=$2 mode=$3
cycles=${RDKV_CRASH_CYCLES:-${4:-20}}
shift $(( $# < 4 ? $# : 4 ))
exec "$driver" --kvserver="$kvserver" --mode="$mode" --cycles="$cycles" "${seed_flag[@]}" "$@"
