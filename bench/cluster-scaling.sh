#!/usr/bin/env bash
# GET and PUT throughput of a local rdkv cluster with 1, 2 and 3 servers (tcp transport), with
# the same kvbench load: YCSB workload C (100% reads) and a 100%-update workload, each with
# THREADS client threads in each of CLIENTS client processes (the clients are spread: each
# process uses a different server as its seed).
#   bench/cluster-scaling.sh            (RECORDS=20000 OPS=40000 THREADS=2 CLIENTS=2)
set -euo pipefail
cd "$(dirname "$0")/.."
RECORDS=${RECORDS:-20000}
OPS=${OPS:-40000}
THREADS=${THREADS:-2}
CLIENTS=${CLIENTS:-2}
BUILD=${BUILD:-build/default}
PORT=${RDKV_BASE_PORT:-7600}
cmake --preset default >/dev/null
cmake --build "$BUILD" --target kvserver kvcli kvbench >/dev/null
KVB=$BUILD/bench/kvbench/kvbench
state=$(mktemp -d)
export RDKV_CLUSTER_DIR=$state RDKV_BASE_PORT=$PORT RDKV_BIN=$BUILD
trap 'deploy/local-cluster.sh stop >/dev/null 2>&1 || true; rm -rf "$state"' EXIT

run_clients() {  # workload-args... -> total ops/s over all client processes
  local n=$1
  shift
  local pids=() i
  for i in $(seq 0 $((CLIENTS - 1))); do
    "$KVB" run -db rdkv -p rdkv.seed="127.0.0.1:$((PORT + i % n))" -p rdkv.transport=tcp \
      -p recordcount="$RECORDS" -p operationcount="$OPS" -threads "$THREADS" "$@" \
      >"$state/out$i" 2>/dev/null &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  cat "$state"/out* | awk -F', ' '/\[OVERALL\], Throughput/ {s += $3} END {printf "%.0f", s}'
  rm -f "$state"/out*
}

printf '| servers | GET ops/s (workload C) | PUT ops/s (100%% updates) |\n|---|---:|---:|\n'
for n in 1 2 3; do
  deploy/local-cluster.sh stop >/dev/null 2>&1 || true
  rm -rf "${state:?}"/server-* "$state"/cluster*
  deploy/local-cluster.sh start "$n" >/dev/null
  "$KVB" load -db rdkv -P bench/workloads/workloadc -p rdkv.seed="127.0.0.1:$PORT" \
    -p rdkv.transport=tcp -p recordcount="$RECORDS" -threads "$THREADS" >/dev/null 2>&1
  get=$(run_clients "$n" -P bench/workloads/workloadc)
  put=$(run_clients "$n" -P bench/workloads/workloada -p readproportion=0 -p updateproportion=1)
  printf '| %d | %s | %s |\n' "$n" "$get" "$put"
done
