#!/usr/bin/env bash
# history_load against a 3-server cluster (deploy/local-cluster.sh, tcp) while shards move
# (kvcli cluster move, twice), then lincheck: the history must be linearizable. Writes to a
# moving shard may end kWrongOwner or time out; they are recorded as `unknown`.
#
#   history_cluster_test.sh BUILD_DIR HISTORY_LOAD LINCHECK [SECONDS]
# BUILD_DIR holds server/kvserver and tools/kvcli. Exit 77 (SKIPPED) when no ports are free.
set -uo pipefail
build=$1 load=$2 lincheck=$3 seconds=${4:-6}
# shellcheck source=../deploy/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/lib.sh"
LC=$DEPLOY_TEST_ROOT/deploy/local-cluster.sh
kvcli=$build/tools/kvcli
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-history-cluster.XXXXXX")
cleanup() {
  "$LC" stop "$work/c" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

base=$(free_base_port 3) || skip "no free port range found"
export RDKV_BIN=$build RDKV_HOST=127.0.0.1 RDKV_BASE_PORT=$base RDKV_METRICS_BASE_PORT=off
export RDKV_SHARDS=6 RDKV_TRANSPORT=tcp RDKV_MEMORY=64MiB RDKV_DURABILITY=none
unset RDKV_CLUSTER_DIR RDKV_EXTRA_FLAGS RDKV_AUTH_TOKEN
expect_rc 0 "start 3 servers (6 shards, shard s on server s % 3)" "$LC" start 3 "$work/c"
seed=127.0.0.1:$base

"$load" --seed="$seed" --threads=8 --keys=16 --seconds="$seconds" --out="$work/h.jsonl" \
  >"$work/load.out" 2>&1 &
load_pid=$!
sleep 1.5
# Shards 0, 2, 3 to server 1, then 0 and 1 to server 2, under load (16 hot keys: about
# half of them in the first move).
expect_rc 0 "kvcli cluster move 0,2,3 1 under load" "$kvcli" --transport=tcp --seed="$seed" \
  cluster move 0,2,3 1
contains "  ... reports the move" "moved shards 0,2-3 to server 1"
grep -E "^  shard [0-9]+: [0-9]+ item" <<<"$OUT"
# The cluster holds only this run's keys: items copied are hot keys that moved under load.
check "  ... copied hot keys" grep -qE "^  shard [0-9]+: [1-9][0-9]* item" <<<"$OUT"
sleep 1
expect_rc 0 "kvcli cluster move 0,1 2 under load" "$kvcli" --transport=tcp --seed="$seed" \
  cluster move 0,1 2
contains "  ... reports the move" "to server 2"
grep -E "^  shard [0-9]+: [0-9]+ item" <<<"$OUT"
wait "$load_pid"
rc=$?
cat "$work/load.out"
check "history_load exited 0" test "$rc" = 0
ops=$(wc -l <"$work/h.jsonl")
check "history_load recorded ops ($ops)" test "$ops" -gt 100
expect_rc 0 "lincheck: linearizable" "$lincheck" "$work/h.jsonl"
head -n 12 <<<"$OUT"
check "no server logged an error" bash -c "! grep -h '^E[0-9]' $work/c/server-*/kvserver.log"
finish
