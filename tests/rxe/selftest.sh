#!/usr/bin/env bash
# Checks the Soft-RoCE device inside the rdkv VM, end to end with the stock tools:
#   1. ibv_devinfo: $RDKV_RXE_DEVICE (rxe0) is PORT_ACTIVE
#   2. rping: rdma_cm connection + SEND/RDMA READ/WRITE, server and client in this guest
#   3. ib_read_lat -R -s 64 -n 1000: one-sided RDMA READs over an rdma_cm QP
# Usage (from the host): tests/rxe/vm.sh -- tests/rxe/selftest.sh
# Exits 0 when all pass, 1 on the first failure (with the tool's output), 2 outside the VM.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/rxe/lib.sh
. "$here/lib.sh"
rxe_require_vm selftest.sh

work=$(mktemp -d) # /tmp is a tmpfs inside the VM
trap 'rm -rf "$work"' EXIT

fail() {
  echo "selftest: FAIL: $*" >&2
  local f
  for f in "$work"/*.log; do
    [[ -s $f ]] || continue
    echo "---- $(basename "$f")" >&2
    tail -n 40 "$f" >&2
  done
  exit 1
}
pass() { echo "selftest: ok: $*"; }

# 1. The device and its port.
ibv_devices >"$work/ibv_devices.log" 2>&1 || fail "ibv_devices failed"
grep -qw "$RXE_DEV" "$work/ibv_devices.log" || fail "ibv_devices does not list $RXE_DEV"
rxe_port_active || fail "ibv_devinfo -d $RXE_DEV: port is not PORT_ACTIVE"
pass "$RXE_DEV is PORT_ACTIVE ($(ibv_devinfo -d "$RXE_DEV" | awk '$1 == "link_layer:" { print $2 }'), address $RXE_ADDR)"

# 2. rping loopback through rdma_cm.
count=5
rping=(rping -a "$RXE_ADDR" -p 7174 -C "$count" -v)
why=$(rxe_pair "$work/rping" 7174 "${rping[@]}" -s -- "${rping[@]}" -c) || fail "$why"
got=$(grep -c '^ping data: rdma-ping-' "$work/rping-client.log" || true)
((got == count)) || fail "rping client saw $got of $count pings"
pass "rping: $count pings over rdma_cm to $RXE_ADDR"

# 3. ib_read_lat over rdma_cm. Under TCG on a busy host perftest sometimes cannot calibrate its
# clock and prints inf; that run is repeated (up to 3 times), other failures are not.
for attempt in 1 2 3; do
  lat=(ib_read_lat -R -F -d "$RXE_DEV" -s 64 -n 1000 -p 18515)
  why=$(rxe_pair "$work/ib_read_lat" 18515 "${lat[@]}" -- "${lat[@]}" "$RXE_ADDR") || fail "$why"
  row=$(awk '$1 == 64 && $2 == 1000 && NF >= 9' "$work/ib_read_lat-client.log")
  [[ -n $row ]] || fail "ib_read_lat printed no result row"
  read -r _ _ tmin _ ttyp tavg _ p99 _ <<<"$row"
  [[ $ttyp =~ ^[0-9.]+$ ]] && break
  if rxe_clock_miscalibrated "$work/ib_read_lat-client.log" && ((attempt < 3)); then
    echo "selftest: ib_read_lat could not calibrate its clock (TCG on a busy host); retrying"
    continue
  fi
  fail "ib_read_lat result row is not numeric: $row"
done
pass "ib_read_lat -R -s 64 -n 1000: typical ${ttyp} us, avg ${tavg} us, min ${tmin} us, p99 ${p99} us"

echo "selftest: PASS"
