#!/usr/bin/env bash
# Runs INSIDE the Soft-RoCE VM (see bench/run-verbs-bench.sh): perftest's ib_read_lat/ib_read_bw
# and rdkv's own benchmarks on the same rxe device in the same boot, so ratios mean something.
#   bench/verbs-bench-guest.sh BUILD_DIR OUT_DIR
set -euo pipefail
B=${1:?usage: verbs-bench-guest.sh BUILD_DIR OUT_DIR}
OUT=${2:?usage: verbs-bench-guest.sh BUILD_DIR OUT_DIR}
: "${RDKV_RXE_ADDR:?runs inside tests/rxe/vm.sh}"
# Alternate the reference and our run so that drift in the emulated machine hits both.
tests/rxe/perftest.sh -s 64 --json "$OUT/perftest-64.json"
"$B/bench/transport_bench" --transport=verbs --host="$RDKV_RXE_ADDR" --size=64 --iters=5000 \
  --qd=16 --seconds=3 --json="$OUT/transport-64.json" 2>/dev/null
# A 64-byte value with kv_bench's keys makes a 128-byte item: a cached GET is one 128-byte READ.
tests/rxe/perftest.sh -s 128 --json "$OUT/perftest-128.json"
"$B/bench/kv_bench" --transport=verbs --host="$RDKV_RXE_ADDR" --value_size=64 --keys=2000 \
  --ops=3000 --seconds=3 --threads=2 --json="$OUT/kv-cache.json" 2>/dev/null
"$B/bench/kv_bench" --transport=verbs --host="$RDKV_RXE_ADDR" --value_size=64 --keys=2000 \
  --ops=3000 --seconds=3 --threads=2 --location_cache=false --json="$OUT/kv-index.json" 2>/dev/null
