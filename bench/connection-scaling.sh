#!/usr/bin/env bash
# Connection scaling of one kvserver on tcp or verbs (issue 14): one server holds CONNECTIONS client
# connections; the handshake rate (connections/s) under a storm of simultaneous connects; the
# server's memory per connection (RSS delta / connections); GET throughput at CONNECTIONS
# connections vs BASE (target: at least 0.8) and the server's CPU per GET in both. Driven by
# bench/conn_bench (see its header). Then the same phases against a memcached on the same host
# (the reference: what the kernel's sockets and this driver lose from BASE to CONNECTIONS
# connections for a server known to scale; its ratio is printed beside rdkv's).
#
#   bench/connection-scaling.sh                      2000 connections vs 16
#   CONNECTIONS=300 SECONDS_PER_PHASE=1 bench/connection-scaling.sh
#   TRANSPORT=verbs bench/connection-scaling.sh      the same over Soft-RoCE in the rdkv VM
#                                                    (tests/rxe/vm.sh; about 5 minutes)
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
#   REFERENCE          memcached (default; skipped with a line saying so when it is not
#                      installed: deploy/install-deps.sh --bench) or none
#   TRANSPORT          tcp (default) or verbs: then the script runs itself inside the VM
#                      (RDKV_VM_MEM MiB of guest memory, default 8192), the server on vCPU 0
#                      and conn_bench on vCPU 1 as in bench/verbs-bench-guest.sh, with no
#                      memcached reference (the VM has none); STORM_THREADS defaults to 16
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
TRANSPORT=${TRANSPORT:-tcp}
[[ $TRANSPORT == tcp || $TRANSPORT == verbs ]] || {
  echo "$PROG: TRANSPORT must be tcp or verbs, not '$TRANSPORT'" >&2
  exit 2
}
if [[ $TRANSPORT == verbs ]]; then
  STORM_THREADS=${STORM_THREADS:-16}
else
  STORM_THREADS=${STORM_THREADS:-48}
fi
THREADS=${THREADS:-4}
SECONDS_PER_PHASE=${SECONDS_PER_PHASE:-2}
KEYS=${KEYS:-1000}
BUILD=${BUILD:-build/ci}
SERVER_ARGS=${SERVER_ARGS:-}
JSON=${JSON:-}
REFERENCE=${REFERENCE:-memcached}

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

if [[ $TRANSPORT == verbs && -z ${RDKV_RXE_ADDR:-} ]]; then
  # On the host: boot the Soft-RoCE VM and run this script in it (built already, no memcached).
  echo "host load before the VM: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
  out_dir=()
  if [[ -n $JSON ]]; then  # the guest sees the host read-only, apart from its --out directory
    JSON=$(realpath -m "$JSON")
    mkdir -p "$(dirname "$JSON")"
    out_dir=(--out "$(dirname "$JSON")")
  fi
  # 2,000 clients in one process register about 1.5 GiB (768 KiB each) and map as much again:
  # the VM's default 4 GiB runs out of memory.
  export RDKV_VM_MEM=${RDKV_VM_MEM:-8192}
  exec tests/rxe/vm.sh --timeout "${RDKV_VM_TIMEOUT:-2400}" "${out_dir[@]}" -- env NO_BUILD=1 REFERENCE=none \
    TRANSPORT=verbs CONNECTIONS="$CONNECTIONS" BASE="$BASE" STORM_THREADS="$STORM_THREADS" \
    THREADS="$THREADS" SECONDS_PER_PHASE="$SECONDS_PER_PHASE" KEYS="$KEYS" BUILD="$BUILD" \
    SERVER_ARGS="$SERVER_ARGS" JSON="$JSON" bench/connection-scaling.sh
fi
# Where the server listens and which CPU each side gets: on verbs (inside the VM) the server on
# vCPU 0 and the driver on vCPU 1, as two machines would be.
host=127.0.0.1
server_cpu=()
client_cpu=()
if [[ $TRANSPORT == verbs ]]; then
  host=$RDKV_RXE_ADDR
  server_cpu=(taskset -c 0)
  client_cpu=(taskset -c 1)
  REFERENCE=none
fi

need=$((CONNECTIONS + 1024))
# verbs: each client (its own fabric) holds a device context, an rdma_cm channel, a completion
# channel and its wake-up descriptors.
[[ $TRANSPORT == verbs ]] && need=$((8 * CONNECTIONS + 1024))
if (($(ulimit -n) < need)); then
  ulimit -n "$need" 2>/dev/null || die "cannot raise the open-file limit to $need (hard limit $(ulimit -Hn))"
fi
threads_max=$(cat /proc/sys/kernel/threads-max 2>/dev/null || echo 0)
((threads_max == 0 || threads_max > CONNECTIONS + 512)) ||
  die "kernel.threads-max ($threads_max) is below the client's one thread per connection"

state=$(mktemp -d)
server_pid=""
memcached_pid=""
cleanup() {
  for pid in $server_pid $memcached_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$state"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
# shellcheck disable=SC2086  # SERVER_ARGS is a list of flags
"${server_cpu[@]}" "$BUILD/server/kvserver" --transport="$TRANSPORT" --host="$host" --port=0 \
  --port_file="$state/port" --memory=64MiB --huge_pages=false \
  --max_connections=$((CONNECTIONS + 64)) $SERVER_ARGS >"$state/server.log" 2>&1 &
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
out=$("${client_cpu[@]}" "$BUILD/bench/conn_bench" --server="$host:$port" \
  --server_pid="$server_pid" --transport="$TRANSPORT" --connections="$CONNECTIONS" --base_connections="$BASE" --storm_threads="$STORM_THREADS" \
  --threads="$THREADS" --seconds="$SECONDS_PER_PHASE" --keys="$KEYS" "${json_arg[@]}") || {
  rc=$?
  echo "$out"
  tail -20 "$state/server.log" >&2
  exit "$rc"
}
echo "$out"
kill "$server_pid" 2>/dev/null || true
wait "$server_pid" 2>/dev/null || true
server_pid=""

# The reference: memcached, same driver and phases, its own ratio.
mc_out=""
if [[ $REFERENCE == memcached ]]; then
  if command -v memcached >/dev/null; then
    mc_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    mc_user=()
    [[ $(id -u) -eq 0 ]] && mc_user=(-u nobody)  # memcached refuses to run as root without -u
    memcached "${mc_user[@]}" -l 127.0.0.1 -p "$mc_port" -U 0 -t 2 -m 64 \
      -c $((CONNECTIONS + 64)) >"$state/memcached.log" 2>&1 &
    memcached_pid=$!
    for ((i = 0; i < 100; i++)); do
      (exec 3<>"/dev/tcp/127.0.0.1/$mc_port") 2>/dev/null && break
      sleep 0.1
    done
    mc_out=$("$BUILD/bench/conn_bench" --memcached="127.0.0.1:$mc_port" \
      --server_pid="$memcached_pid" --connections="$CONNECTIONS" --base_connections="$BASE" \
      --storm_threads="$STORM_THREADS" --threads="$THREADS" --seconds="$SECONDS_PER_PHASE" \
      --keys="$KEYS") || {
      echo "$mc_out"
      die "the memcached reference run failed (log: $(tail -3 "$state/memcached.log"))"
    }
    echo "$mc_out"
  else
    echo "reference: SKIPPED (memcached is not installed: deploy/install-deps.sh --bench)"
  fi
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$2"; }
ratio=$(field ratio "$out")
cpu_ratio=$(field server_cpu_ratio "$out")
awk -v r="$ratio" -v cr="$cpu_ratio" -v c="$CONNECTIONS" -v b="$BASE" 'BEGIN {
  printf "GET throughput at %d connections / at %d: %.3f (target >= 0.800: %s)\n", c, b, r,
    (r >= 0.8 ? "met" : "MISSED")
  printf "server CPU per GET at %d connections / at %d: %.3f\n", c, b, cr }'
if [[ -n $mc_out ]]; then
  mc_ratio=$(field ratio "$mc_out")
  awk -v r="$ratio" -v m="$mc_ratio" -v mc="$(field server_cpu_ratio "$mc_out")" \
    -v c="$CONNECTIONS" -v b="$BASE" 'BEGIN {
    printf "memcached, same driver: GET throughput at %d / at %d: %.3f, server CPU per GET: %.3f\n", c, b, m, mc
    printf "rdkv ratio / memcached ratio: %.3f\n", r / m }'
fi
