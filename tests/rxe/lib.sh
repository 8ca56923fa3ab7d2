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

# rxe_wait_listen PID PORT [SECONDS]: wait until process PID has an rdma_cm listener on PORT
# (rdma_cm listeners are not sockets; `rdma resource show cm_id` lists them, with their pid).
# Matching the pid matters: a listener of a server that just exited can linger there for a
# moment. Fails when PID exits first or after SECONDS (default 60).
rxe_wait_listen() {
  local pid=$1 port=$2 limit=${3:-60} i=0
  while ((i < limit * 5)); do
    kill -0 "$pid" 2>/dev/null || return 1
    if rdma resource show cm_id 2>/dev/null |
      grep -E "state LISTEN .*pid $pid .*src-addr [^ ]*:$port( |$)" >/dev/null; then
      return 0
    fi
    sleep 0.2
    i=$((i + 1))
  done
  return 1
}

# rxe_tool_name CMD...: the tool a command line runs, past a leading "taskset -c CPUS" (for
# messages).
rxe_tool_name() {
  if [[ ${1:-} == taskset ]]; then echo "${4:-taskset}"; else echo "${1:-}"; fi
}

# rxe_pair LOG PORT SERVER_CMD... -- CLIENT_CMD...: runs the server in the background, waits for
# its rdma_cm listener on PORT, then runs the client (limited to 600 s), then waits up to 60 s
# for the server to finish. Output goes to LOG-server.log and LOG-client.log. On failure it
# prints the reason on stdout and returns 1.
rxe_pair() {
  local log=$1 port=$2 spid rc i
  shift 2
  local server=()
  while (($# > 0)) && [[ $1 != -- ]]; do
    server+=("$1")
    shift
  done
  shift # the --
  "${server[@]}" >"$log-server.log" 2>&1 &
  spid=$!
  if ! rxe_wait_listen "$spid" "$port"; then
    rxe_stop "$spid"
    echo "$(rxe_tool_name "${server[@]}") server did not start listening on port $port"
    return 1
  fi
  timeout 600 "$@" >"$log-client.log" 2>&1 && rc=0 || rc=$?
  if ((rc != 0)); then
    rxe_stop "$spid"
    echo "$(rxe_tool_name "$@") client failed (exit $rc)"
    return 1
  fi
  for ((i = 0; i < 300; i++)); do
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$spid" 2>/dev/null; then
    rxe_stop "$spid"
    echo "$(rxe_tool_name "${server[@]}") server did not exit 60 s after its client"
    return 1
  fi
  wait "$spid" && rc=0 || rc=$?
  if ((rc != 0)); then
    echo "$(rxe_tool_name "${server[@]}") server failed (exit $rc)"
    return 1
  fi
}

# rxe_clock_miscalibrated LOG: true when perftest could not measure the CPU clock, which happens
# under TCG on a busy host ("Correlation coefficient r^2: 0.86 < 0.9"); its figures are then
# inf/nan and the run should simply be repeated.
rxe_clock_miscalibrated() {
  grep -q 'Correlation coefficient' "$1"
}

# rxe_stop PID...: stop background servers that are still running (ignores those already gone).
rxe_stop() {
  local pid
  for pid in "$@"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
