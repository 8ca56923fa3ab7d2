#!/usr/bin/env bash
# Connection scaling of one kvserver on tcp (issue 14): one server holds CONNECTIONS client
# connections; the handshake rate (connections/s) under a storm of simultaneous connects; the
# server's memory per connection (RSS delta / connections); GET throughput at CONNECTIONS
# connections vs BASE (target: at least 0.8) and the server's CPU per GET in both. Driven by
# bench/conn_bench (see its header).
#
#   bench/connection-scaling.sh                      2000 connections vs 16
#   CONNECTIONS=300 SECONDS_PER_PHASE=1 bench/connection-scaling.sh
#
# Environment (all optional):
#   CONNECTIONS        client connections (default 2000)
#   BASE               connections of the reference GET phase (default 16)
#   STORM_THREADS      threads connecting at once (default 48: the server closes the oldest
#                      unfinished handshake beyond 64 per source address, and every connect of
#                      this run comes from 127.0.0.1)
#   THREADS            threads of the GET phases (default 4)
#   SECONDS_PER_PHASE  seconds per GET phase (default 2; each runs twice, alternating)
#   KEYS               keys loaded (default 1000)
#   BUILD              build dir holding server/kvserver and bench/conn_bench (default build/ci;
#                      built first unless NO_BUILD=1)
#   SERVER_ARGS        extra kvserver flags
#   JSON               also write conn_bench's figures there
#
# Raises the open-file limit to what CONNECTIONS needs (both processes hold one socket per
# connection; the client also one thread each) and starts the server with
# --max_connections=CONNECTIONS+64. Prints the host load before and after and the figures
# (ratios against the same run). The server is stopped on exit, also on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
PROG=connection-scaling.sh
CONNECTIONS=${CONNECTIONS:-2000}
BASE=${BASE:-16}
STORM_THREADS=${STORM_THREADS:-48}
THREADS=${THREADS:-4}
SECONDS_PER_PHASE=${SECONDS_PER_PHASE:-2}
KEYS=${KEYS:-1000}
BUILD=${BUILD:-build/ci}
SERVER_ARGS=${SERVER_ARGS:-}
JSON=${JSON:-}

die() {
  echo "$PROG: $*" >&2
  exit 2
}
[[ $CONNECTIONS =~ ^[0-9]+$ && $CONNECTIONS -ge $BASE ]] || die "CONNECTIONS must be >= BASE"

if [[ ${NO_BUILD:-0} != 1 ]]; then
  cmake --build "$BUILD" --target kvserver conn_bench >/dev/null
fi
for t in server/kvserver bench/conn_bench; do
  [[ -x $BUILD/$t ]] || die "$BUILD/$t not found: cmake --build $BUILD --target kvserver conn_bench"
done

need=$((CONNECTIONS + 1024))
if (($(ulimit -n) < need)); then
  ulimit -n "$need" 2>/dev/null || die "cannot raise the open-file limit to $need (hard limit $(ulimit -Hn))"
fi
threads_max=$(cat /proc/sys/kernel/threads-max 2>/dev/null || echo 0)
((threads_max == 0 || threads_max > CONNECTIONS + 512)) ||
  die "kernel.threads-max ($threads_max) is below the client's one thread per connection"

state=$(mktemp -d)
server_pid=""
cleanup() {
  if [[ -n $server_pid ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$state"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
# shellcheck disable=SC2086  # SERVER_ARGS is a list of flags
"$BUILD/server/kvserver" --transport=tcp --host=127.0.0.1 --port=0 --port_file="$state/port" \
  --memory=64MiB --huge_pages=false --max_connections=$((CONNECTIONS + 64)) $SERVER_ARGS \
  >"$state/server.log" 2>&1 &
server_pid=$!
for ((i = 0; i < 100; i++)); do
  [[ -s $state/port ]] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$state/server.log" >&2; die "kvserver exited"; }
  sleep 0.1
done
[[ -s $state/port ]] || die "kvserver did not start in 10 s"
port=$(cat "$state/port")

json_arg=()
[[ -n $JSON ]] && json_arg=(--json="$JSON")
out=$("$BUILD/bench/conn_bench" --server="127.0.0.1:$port" --server_pid="$server_pid" \
  --connections="$CONNECTIONS" --base_connections="$BASE" --storm_threads="$STORM_THREADS" \
  --threads="$THREADS" --seconds="$SECONDS_PER_PHASE" --keys="$KEYS" "${json_arg[@]}") || {
  rc=$?
  echo "$out"
  tail -20 "$state/server.log" >&2
  exit "$rc"
}
echo "$out"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
ratio=$(sed -n 's/.* ratio=\([0-9.]*\).*/\1/p' <<<"$out")
cpu_ratio=$(sed -n 's/.* server_cpu_ratio=\([0-9.]*\).*/\1/p' <<<"$out")
awk -v r="$ratio" -v cr="$cpu_ratio" -v c="$CONNECTIONS" -v b="$BASE" 'BEGIN {
  printf "GET throughput at %d connections / at %d: %.3f (target >= 0.800: %s)\n", c, b, r,
    (r >= 0.8 ? "met" : "MISSED")
  printf "server CPU per GET at %d connections / at %d: %.3f\n", c, b, cr }'
