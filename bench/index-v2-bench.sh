#!/usr/bin/env bash
# Index v2 (issue 13) figures, in one run on this machine:
#   1. bench/index_fill_bench: slot use at the first refusal (v2 Store vs an exact model of the
#      v1 placement, same keys, same process) and heap/index bytes per small item;
#   2. kvbench YCSB A, B and C against one kvserver (tcp): READs and round trips per GET after a
#      warm-up (warmupoperationcount operations on one more connection, not measured);
#   3. YCSB A from two kvbench processes at once (each its own client and location cache).
#
#   bench/index-v2-bench.sh [BUILD]          (default build/ci; needs kvserver, kvbench and
#                                             index_fill_bench built there)
# Environment: RECORDS (10000), OPS (20000), WARMUP (100000), THREADS (2), BUCKETS (16384).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/ci}
RECORDS=${RECORDS:-10000}
OPS=${OPS:-20000}
WARMUP=${WARMUP:-100000}
THREADS=${THREADS:-2}
BUCKETS=${BUCKETS:-16384}
KVSERVER=$BUILD/server/kvserver
KVBENCH=$BUILD/bench/kvbench/kvbench
FILL=$BUILD/bench/index_fill_bench
for b in "$KVSERVER" "$KVBENCH" "$FILL"; do
  [[ -x $b ]] || { echo "index-v2-bench: $b is not built" >&2; exit 1; }
done

echo "index-v2-bench: $(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
echo "== index fill ($BUCKETS buckets)"
"$FILL" --buckets="$BUCKETS" --seeds=3 --region_mib=256

work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$KVSERVER" --host=127.0.0.1 --port="$port" --transport=tcp --memory=256MiB --worker_threads=2 \
  >"$work/kvserver.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done

props=(-p rdkv.seed="127.0.0.1:$port" -p rdkv.transport=tcp -p recordcount="$RECORDS"
  -p status.interval=0)
"$KVBENCH" load -db rdkv -P bench/workloads/workloada "${props[@]}" -threads "$THREADS" \
  >"$work/load.txt"
echo "== kvbench: $RECORDS records (1 KB), $OPS operations after $WARMUP warm-up operations," \
  "$THREADS threads, tcp"
printf '%-9s %-12s %-12s %-10s %-10s\n' workload READsPerGET RTTsPerGET cache_hits GETs
for w in a b c; do
  out=$work/run-$w.txt
  "$KVBENCH" run -db rdkv -P bench/workloads/workload"$w" "${props[@]}" -threads "$THREADS" \
    -p operationcount="$OPS" -p warmupoperationcount="$WARMUP" >"$out"
  val() { awk -F', ' -v k="$1" '$1 == "[RDKV]" && $2 == k { print $3 }' "$out"; }
  printf '%-9s %-12s %-12s %-10s %-10s\n' "$w" "$(val READsPerGET)" "$(val RTTsPerGET)" \
    "$(val LocationCacheHits)" "$(val GETs)"
done
# YCSB A again, from two client processes at once (one thread each): each process's cache learns
# only its own writes, so the other process's updates leave stale locations behind.
pids=()
for p in 1 2; do
  "$KVBENCH" run -db rdkv -P bench/workloads/workloada "${props[@]}" -threads 1 \
    -p operationcount=$((OPS / 2)) -p warmupoperationcount=$((WARMUP / 2)) >"$work/run-a2-$p.txt" &
  pids+=($!)
done
wait "${pids[@]}"
for p in 1 2; do
  out=$work/run-a2-$p.txt
  val() { awk -F', ' -v k="$1" '$1 == "[RDKV]" && $2 == k { print $3 }' "$out"; }
  printf '%-9s %-12s %-12s %-10s %-10s\n' "a/proc$p" "$(val READsPerGET)" "$(val RTTsPerGET)" \
    "$(val LocationCacheHits)" "$(val GETs)"
done
