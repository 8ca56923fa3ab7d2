#!/usr/bin/env bash
# Runs INSIDE the Soft-RoCE VM (see bench/run-verbs-bench.sh): perftest's ib_read_lat/ib_read_bw
# and rdkv's own benchmarks on the same rxe device in the same boot, so ratios mean something.
#   bench/verbs-bench-guest.sh BUILD_DIR OUT_DIR [ROUNDS] [BASELINE_KV_BENCH]
#
# The VM has two vCPUs; each side gets its own, as two machines would: the server side (kvserver,
# perftest's server) on vCPU 0, the client side (kv_bench --server, perftest's client) on vCPU 1.
# Left to the scheduler, a client thread and the server's polling threads shared a vCPU now and
# then, and the same READ took 45 or 90 us from one run to the next.
# The GET and PUT figures are taken in ROUNDS rounds (default 5), each with its own perftest run
# right before rdkv's: the emulated machine drifts by tens of percent within one boot, so each
# ratio is taken within a round and the host script reports their median. Every tool's log
# (and kvserver's) is kept in OUT_DIR.
set -euo pipefail
B=${1:?usage: verbs-bench-guest.sh BUILD_DIR OUT_DIR [ROUNDS] [BASELINE_KV_BENCH]}
OUT=${2:?usage: verbs-bench-guest.sh BUILD_DIR OUT_DIR [ROUNDS] [BASELINE_KV_BENCH]}
ROUNDS=${3:-5}
BASELINE=${4:-}  # another commit's kv_bench, run after this build's in every round
: "${RDKV_RXE_ADDR:?runs inside tests/rxe/vm.sh}"
SERVER_CPU=0
CLIENT_CPU=1
pins=(--server-cpu "$SERVER_CPU" --client-cpu "$CLIENT_CPU")

work=$(mktemp -d)
taskset -c "$SERVER_CPU" "$B/server/kvserver" --transport=verbs --host="$RDKV_RXE_ADDR" --port=0 \
  --port_file="$work/port" --memory=256MiB 2>"$work/kvserver.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true
cp "$work/kvserver.log" "$OUT/" 2>/dev/null || true; rm -rf "$work"' EXIT
for ((i = 0; i < 300; ++i)); do
  [[ -s $work/port ]] && break
  kill -0 "$server" 2>/dev/null || { cat "$work/kvserver.log" >&2; exit 1; }
  sleep 0.1
done
[[ -s $work/port ]] || { echo "kvserver wrote no port file" >&2; exit 1; }
target="$RDKV_RXE_ADDR:$(cat "$work/port")"

# A 64-byte value with kv_bench's keys makes a 128-byte item: a cached GET is one 128-byte READ.
# kv_gets KV_BENCH NAME ROUND: GETs through the location cache, then through the index alone.
kv_gets() {
  taskset -c "$CLIENT_CPU" "$1" --server="$target" --transport=verbs \
    --value_size=64 --keys=2000 --ops=3000 --seconds=1 --threads=2 --multiget_keys=0 \
    --json="$OUT/$2-cache-$3.json" 2>"$OUT/$2-cache-$3.log"
  taskset -c "$CLIENT_CPU" "$1" --server="$target" --transport=verbs \
    --value_size=64 --keys=2000 --ops=2000 --seconds=1 --threads=2 --multiget_keys=0 \
    --location_cache=false --json="$OUT/$2-index-$3.json" 2>"$OUT/$2-index-$3.log"
}
for ((r = 1; r <= ROUNDS; ++r)); do
  tests/rxe/perftest.sh -s 128 --bw-iters 2000 "${pins[@]}" --json "$OUT/perftest-128-$r.json"
  kv_gets "$B/bench/kv_bench" kv "$r"
  [[ -z $BASELINE ]] || kv_gets "$BASELINE" base "$r"
  # The same READs through the transport alone (a 128-byte READ; the index path's 2 x 512 B then
  # 128 B): what the fabric charges for a GET's bytes, so the KV code's own share shows.
  taskset -c "$CLIENT_CPU" "$B/bench/transport_bench" --transport=verbs --host="$RDKV_RXE_ADDR" \
    --size=128 --iters=2000 --qd=16 --seconds=0.3 --index_pattern \
    --json="$OUT/transport-128-$r.json" 2>"$OUT/transport-128-$r.log"
  # The floor of any GET of two round trips: one 128-byte READ, then another (no second bucket).
  taskset -c "$CLIENT_CPU" "$B/bench/transport_bench" --transport=verbs --host="$RDKV_RXE_ADDR" \
    --size=128 --iters=2000 --qd=16 --seconds=0.3 --index_pattern --index_buckets=1 \
    --index_bucket_bytes=128 --json="$OUT/transport-floor-$r.json" 2>"$OUT/transport-floor-$r.log"
  echo "round $r of $ROUNDS done"
done

# The transport's own READ (listener and client in one process, on the client's vCPU) against
# perftest of the same size, after the rounds: the first perftest run of a boot is often slow.
tests/rxe/perftest.sh -s 64 "${pins[@]}" --json "$OUT/perftest-64.json"
taskset -c "$CLIENT_CPU" "$B/bench/transport_bench" --transport=verbs --host="$RDKV_RXE_ADDR" \
  --size=64 --iters=5000 --qd=16 --seconds=3 --json="$OUT/transport-64.json" \
  2>"$OUT/transport-64.log"
