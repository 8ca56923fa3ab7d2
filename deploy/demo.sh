#!/usr/bin/env bash
# The main job on an embedded default: installs dependencies, builds, starts etcd and a local
# cluster of three kvservers whose map lives in etcd, every shard on two of them (R=2; tcp
# transport on 127.0.0.1; durability none), does a kvcli round trip through one seed, shows the
# cluster and its replicas, promotes a backup, and runs a short YCSB workload A with kvbench.
# Everything it started is stopped when it ends.
#
#   deploy/demo.sh            (RDKV_DEMO_PORT=7400: the servers use 7400, 7401, 7402, serve
#                              Prometheus /metrics on 7403, 7404, 7405; etcd on 7406, 7407)
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${RDKV_DEMO_PORT:-7400}
BUILD=build/default

deploy/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target kvserver kvcli kvbench

state=$(mktemp -d)
export RDKV_CLUSTER_DIR=$state RDKV_BASE_PORT=$PORT RDKV_BIN=$BUILD
export RDKV_REPLICATION=2 RDKV_ETCD=local RDKV_CLUSTER_NAME=demo
cleanup() {
  deploy/local-cluster.sh stop >/dev/null 2>&1 || true
  rm -rf "$state"
}
trap cleanup EXIT

echo "== starting etcd and a local cluster of 3 kvservers, every shard on 2 of them"
deploy/local-cluster.sh start 3
seed=127.0.0.1:$PORT

cli() { "$BUILD/tools/kvcli" --server="$seed" "$@"; }
echo "== kvcli round trip through the seed $seed (keys are routed to their owners)"
set -x
cli ping
cli put greeting "hello from rdkv"
cli get greeting
cli --json get greeting
for i in 1 2 3 4 5 6; do cli put "user:$i" "value $i" >/dev/null; done
cli mget user:1 user:2 user:3 user:4 user:5 user:6
cli del greeting
set +x
if cli get greeting; then echo "deleted key still found" >&2; exit 1; fi
echo "(exit 1 above = not found, as expected)"
cli cluster
echo "== promote shard 0's backup (server 1) to primary: the map changes in etcd, every server follows"
cli cluster promote 0 1
cli get user:1

echo "== Prometheus metrics of server 0 (every server serves /metrics; docs/operations.md \"Metrics\")"
curl -fsS "http://127.0.0.1:$((PORT + 3))/metrics" | grep -E '^rdkv_(requests_total|items )'

echo "== short benchmark: YCSB workload A (50% reads, 50% updates, zipfian) against the cluster"
"$BUILD/bench/kvbench/kvbench" load -db rdkv -P bench/workloads/workloada -p rdkv.seed="$seed" \
  -p rdkv.transport=tcp -p recordcount=2000 -threads 2 >/dev/null
"$BUILD/bench/kvbench/kvbench" run -db rdkv -P bench/workloads/workloada -p rdkv.seed="$seed" \
  -p rdkv.transport=tcp -p recordcount=2000 -p operationcount=20000 -threads 2
echo "== demo done"
