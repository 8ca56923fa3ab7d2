# Helpers shared by the scripts that run inside the rdkv Soft-RoCE VM (selftest.sh, perftest.sh).
# Source it; it defines functions and RXE_DEV / RXE_ADDR, nothing runs.
# shellcheck shell=bash

# shellcheck disable=SC2034 # used by the scripts that source this file
RXE_DEV=${RDKV_RXE_DEVICE:-rxe0}
# shellcheck disable=SC2034
RXE_ADDR=${RDKV_RXE_ADDR:-192.168.77.1}

# rxe_require_vm NAME: refuse to run outside the VM (the host has no RDMA device at all).
rxe_require_vm() {
  if [[ ${RDKV_IN_VM:-} != 1 ]]; then
    echo "$1: run inside the Soft-RoCE VM: tests/rxe/vm.sh -- tests/rxe/$1" >&2
    exit 2
  fi
}

# rxe_port_active: true when $RXE_DEV's port 1 is PORT_ACTIVE.
rxe_port_active() {
  local info
  info=$(ibv_devinfo -d "$RXE_DEV" 2>&1) || return 1
  [[ $info == *PORT_ACTIVE* ]]
}

# rxe_wait_listen PID PORT [SECONDS]: wait until there is an rdma_cm listener on PORT (rdma_cm
# listeners are not sockets; `rdma resource show cm_id` lists them). PID is the server (or a
# `timeout` wrapping it); fails when PID exits first or after SECONDS (default 60).
rxe_wait_listen() {
  local pid=$1 port=$2 limit=${3:-60} i=0
  while ((i < limit * 5)); do
    kill -0 "$pid" 2>/dev/null || return 1
    if rdma resource show cm_id 2>/dev/null |
      grep -E "state LISTEN .*src-addr [^ ]*:$port( |$)" >/dev/null; then
      return 0
    fi
    sleep 0.2
    i=$((i + 1))
  done
  return 1
}

# rxe_stop PID...: stop background servers that are still running (ignores those already gone).
rxe_stop() {
  local pid
  for pid in "$@"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
