#!/usr/bin/env bash
# The Soft-RoCE baseline for one-sided READs and two-sided SENDs, measured with perftest inside
# the rdkv VM: ib_read_lat -R, ib_send_lat -R and ib_read_bw -R, server in the background +
# client in the same guest, both against $RDKV_RXE_ADDR on $RDKV_RXE_DEVICE. Prints one
# machine-readable line per test:
#   perftest ib_read_lat size=64 p50_us=... p99_us=... avg_us=... (then p999_us min_us max_us stdev_us iters)
#   perftest ib_send_lat size=64 p50_us=... p99_us=... avg_us=... rtt_p50_us=... (same fields)
#   perftest ib_read_bw size=64 reads_per_s=... (then bw_avg_MBps bw_peak_MBps iters)
# p50_us is perftest's t_typical (the median). ib_send_lat reports one way (half of its
# ping-pong round trip); rtt_p50_us is twice that: the raw SEND/RECV round trip that a two-sided
# request and its answer take. MB is perftest's MB (2^20 bytes).
#
# Usage (from the host):
#   tests/rxe/vm.sh --out OUTDIR -- tests/rxe/perftest.sh [-s SIZE] [--lat-iters N] [--bw-iters N]
#                                                         [--json OUTDIR/perftest.json] [--verbose]
#                                                         [--server-cpu N] [--client-cpu N]
# --server-cpu / --client-cpu pin perftest's server / client to one vCPU (taskset), as
# bench/verbs-bench-guest.sh pins kvserver and its clients. Defaults: -s 64, --lat-iters 5000,
# --bw-iters 20000. --json writes the same figures as JSON
# (inside the VM only an --out directory, /tmp and /run are writable; /tmp and /run vanish).
# Exit: 0 ok, 1 a tool failed or printed no result row, 2 bad usage or outside the VM.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/rxe/lib.sh
. "$here/lib.sh"

size=64
lat_iters=5000
bw_iters=20000
json=""
verbose=0
server_pin=()
client_pin=()
usage() {
  sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while (($# > 0)); do
  case $1 in
    -s | --size) size=${2:?}; shift 2 ;;
    --lat-iters) lat_iters=${2:?}; shift 2 ;;
    --bw-iters) bw_iters=${2:?}; shift 2 ;;
    --json) json=${2:?}; shift 2 ;;
    -v | --verbose) verbose=1; shift ;;
    --server-cpu) server_pin=(taskset -c "${2:?}"); shift 2 ;;
    --client-cpu) client_pin=(taskset -c "${2:?}"); shift 2 ;;
    -h | --help) usage ;;
    *) echo "perftest.sh: unknown argument $1" >&2; usage ;;
  esac
done
for n in "$size" "$lat_iters" "$bw_iters"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "perftest.sh: not a positive integer: $n" >&2; exit 2; }
done
rxe_require_vm perftest.sh
rxe_port_active || { echo "perftest.sh: $RXE_DEV is not PORT_ACTIVE" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() {
  echo "perftest.sh: FAIL: $*" >&2
  local f
  for f in "$work"/*.log; do
    [[ -s $f ]] || continue
    echo "---- $(basename "$f")" >&2
    tail -n 30 "$f" >&2
  done
  exit 1
}

# numeric VALUE...: true when every VALUE is a plain decimal number (they go into JSON as is).
numeric() {
  local v
  for v in "$@"; do [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || return 1; done
}

# measure NAME PORT ITERS NFIELDS ARGS...: runs NAME (a perftest binary) as server + client and
# sets ROW to the client's result row (#bytes #iterations ...). Under TCG on a busy host perftest
# sometimes cannot calibrate its clock and prints inf/nan; such a run is repeated, up to 5 times.
ROW=""
measure() {
  local name=$1 port=$2 iters=$3 nf=$4 attempt why
  shift 4
  local cmd=("$name" -R -d "$RXE_DEV" -p "$port" -s "$size" -n "$iters" "$@")
  for attempt in 1 2 3 4 5; do
    # A connect that races the server's listen is refused now and then (RDMA_CM_EVENT_REJECTED)
    # when perftest runs many times in one boot: such a pair is run again, up to 5 times.
    rm -f "$work/$name-client.log"  # only this attempt's client may say it was refused
    if ! why=$(rxe_pair "$work/$name" "$port" "${server_pin[@]}" "${cmd[@]}" -- \
      "${client_pin[@]}" "${cmd[@]}" "$RXE_ADDR"); then
      if grep -qs "RDMA_CM_EVENT_REJECTED" "$work/$name-client.log" && ((attempt < 5)); then
        echo "perftest.sh: $name connect refused (the server was not listening yet); retrying" >&2
        sleep 1
        continue
      fi
      fail "$why"
    fi
    if ((verbose)); then cat "$work/$name-client.log" >&2; fi
    ROW=$(awk -v s="$size" -v n="$iters" -v nf="$nf" '$1 == s && $2 == n && NF >= nf' "$work/$name-client.log")
    [[ -n $ROW ]] || fail "$name printed no result row for size $size"
    # shellcheck disable=SC2086 # split the row into fields
    if numeric $ROW; then return 0; fi
    if rxe_clock_miscalibrated "$work/$name-client.log" && ((attempt < 5)); then
      echo "perftest.sh: $name could not calibrate its clock (TCG on a busy host); retrying" >&2
      continue
    fi
    fail "$name result row is not numeric: $ROW"
  done
}

# ib_read_lat: #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%   (usec)
measure ib_read_lat 18515 "$lat_iters" 9 -F
read -r _ _ l_min l_max l_typ l_avg l_stdev l_p99 l_p999 _ <<<"$ROW"
echo "perftest ib_read_lat size=$size p50_us=$l_typ p99_us=$l_p99 avg_us=$l_avg p999_us=$l_p999 min_us=$l_min max_us=$l_max stdev_us=$l_stdev iters=$lat_iters"

# ib_send_lat: the same columns, one-way latency (half the ping-pong round trip).
measure ib_send_lat 18517 "$lat_iters" 9 -F
read -r _ _ s_min s_max s_typ s_avg s_stdev s_p99 s_p999 _ <<<"$ROW"
s_rtt=$(awk -v t="$s_typ" 'BEGIN { printf "%.2f", 2 * t }')
echo "perftest ib_send_lat size=$size p50_us=$s_typ p99_us=$s_p99 avg_us=$s_avg rtt_p50_us=$s_rtt p999_us=$s_p999 min_us=$s_min max_us=$s_max stdev_us=$s_stdev iters=$lat_iters"

# ib_read_bw: #bytes #iterations BW_peak BW_average MsgRate   (MB/sec, Mpps)
measure ib_read_bw 18516 "$bw_iters" 5
read -r _ _ b_peak b_avg b_mpps _ <<<"$ROW"
reads=$(awk -v m="$b_mpps" 'BEGIN { printf "%.0f", m * 1000000 }')
echo "perftest ib_read_bw size=$size reads_per_s=$reads bw_avg_MBps=$b_avg bw_peak_MBps=$b_peak iters=$bw_iters"

if [[ -n $json ]]; then
  mkdir -p "$(dirname "$json")"
  cat >"$json.tmp" <<EOF
{
  "device": "$RXE_DEV",
  "addr": "$RXE_ADDR",
  "size": $size,
  "ib_read_lat": {"iters": $lat_iters, "p50_us": $l_typ, "p99_us": $l_p99, "p999_us": $l_p999, "avg_us": $l_avg, "min_us": $l_min, "max_us": $l_max, "stdev_us": $l_stdev},
  "ib_send_lat": {"iters": $lat_iters, "p50_us": $s_typ, "rtt_p50_us": $s_rtt, "p99_us": $s_p99, "p999_us": $s_p999, "avg_us": $s_avg, "min_us": $s_min, "max_us": $s_max, "stdev_us": $s_stdev},
  "ib_read_bw": {"iters": $bw_iters, "reads_per_s": $reads, "bw_avg_MBps": $b_avg, "bw_peak_MBps": $b_peak}
}
EOF
  mv "$json.tmp" "$json"
  echo "perftest json=$json"
fi
