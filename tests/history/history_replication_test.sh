#!/usr/bin/env bash
# history_load against a replicated 3-server cluster whose map lives in etcd
# (deploy/local-cluster.sh with RDKV_REPLICATION and RDKV_ETCD=local, tcp) while replica sets
# change under load: every shard's backup is promoted, then a replica is added to shard 0 (a
# catch-up copy) and the old one removed. Then lincheck: the history must be linearizable, and
# no acknowledged write may be lost (docs/design.md "Replication").
#
#   history_replication_test.sh BUILD_DIR HISTORY_LOAD LINCHECK [R] [SECONDS]
# Exit 77 (SKIPPED) when no ports are free or etcd is not installed.
set -uo pipefail
build=$1 load=$2 lincheck=$3 r=${4:-2} seconds=${5:-8}
# shellcheck source=../deploy/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/lib.sh"
LC=$DEPLOY_TEST_ROOT/deploy/local-cluster.sh
kvcli=$build/tools/kvcli
command -v etcd >/dev/null || skip "etcd is not installed (deploy/install-deps.sh installs it)"
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-history-repl.XXXXXX")
cleanup() {
  "$LC" stop "$work/c" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

base=$(free_base_port 8) || skip "no free port range found"
export RDKV_BIN=$build RDKV_HOST=127.0.0.1 RDKV_BASE_PORT=$base RDKV_METRICS_BASE_PORT=off
export RDKV_SHARDS=6 RDKV_TRANSPORT=tcp RDKV_MEMORY=64MiB RDKV_DURABILITY=none
export RDKV_REPLICATION=$r RDKV_ETCD=local RDKV_ETCD_PORT=$((base + 6)) RDKV_CLUSTER_NAME=hist
unset RDKV_CLUSTER_DIR RDKV_EXTRA_FLAGS RDKV_AUTH_TOKEN
expect_rc 0 "start 3 servers, R=$r, map in etcd" "$LC" start 3 "$work/c"
seed=127.0.0.1:$base
cli() { "$kvcli" --transport=tcp --seed="$seed" "$@"; }

"$load" --seed="$seed" --threads=8 --keys=16 --seconds="$seconds" --out="$work/h.jsonl" \
  >"$work/load.out" 2>&1 &
load_pid=$!
sleep 1.5
for s in 0 1 2 3 4 5; do
  expect_rc 0 "promote shard $s to its first backup under load" cli cluster promote "$s" $(((s + 1) % 3))
done
if ((r < 3)); then
  # Shard 0: primary 1, backup 0 now; add server 2 (catch-up copy under load), drop server 0.
  expect_rc 0 "add server 2 as a replica of shard 0 under load" cli cluster add-replica 0 2
  contains "  ... it is in sync" "in-sync replica of shard 0"
  expect_rc 0 "remove server 0 from shard 0 under load" cli cluster remove-replica 0 0
  expect_rc 0 "promote shard 0 to the new replica (server 2)" cli cluster promote 0 2
fi
wait "$load_pid"
rc=$?
cat "$work/load.out"
check "history_load exited 0" test "$rc" = 0
ops=$(wc -l <"$work/h.jsonl")
check "history_load recorded ops ($ops)" test "$ops" -gt 100
expect_rc 0 "lincheck: linearizable" "$lincheck" "$work/h.jsonl"
head -n 12 <<<"$OUT"
expect_rc 0 "kvcli cluster shows the replicas" cli cluster
contains "  ... backups listed" "backup of"
check "no server logged an error" bash -c "! grep -h '^E[0-9]' $work/c/server-*/kvserver.log"
finish
