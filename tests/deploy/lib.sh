# shellcheck shell=bash disable=SC2034
# Shared helpers for the tests in tests/deploy/ (sourced, not run).
#
# A test calls ok/bad for each check, `skip REASON` to stop early when a prerequisite is
# genuinely missing (prints SKIPPED and exits 77, which CTest reports as skipped), and `finish`
# at the end: it prints "N passed, N failed" and exits 1 if any check failed.

DEPLOY_TEST_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
_passed=0
_failed=0

ok() { echo "ok - $*"; _passed=$((_passed + 1)); }
bad() { echo "FAIL - $*"; _failed=$((_failed + 1)); }
skip() { echo "SKIPPED: $*"; exit 77; }

# check DESCRIPTION COMMAND...: ok when COMMAND succeeds.
check() {
  local what=$1
  shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}

# expect_rc WANT DESCRIPTION COMMAND...: runs COMMAND, output in $OUT, ok when its status is WANT.
expect_rc() {
  local want=$1 what=$2 rc=0
  shift 2
  OUT=$("$@" 2>&1) || rc=$?
  if [[ $rc == "$want" ]]; then
    ok "$what (exit $rc)"
  else
    bad "$what: exit $rc, wanted $want; output:"
    sed 's/^/    | /' <<<"$OUT"
  fi
}

# contains DESCRIPTION TEXT: ok when $OUT contains TEXT (a fixed string).
contains() {
  if grep -qF -- "$2" <<<"$OUT"; then
    ok "$1"
  else
    bad "$1: output lacks '$2'; output:"
    sed 's/^/    | /' <<<"$OUT"
  fi
}

finish() {
  echo "$_passed passed, $_failed failed"
  ((_failed == 0))
}

# free_base_port N: a port P such that P..P+N-1 are free on this machine right now.
# P lies below the kernel's ephemeral range (ip_local_port_range), which is where the port-0
# listeners and outgoing connections of tests running in parallel get their ports; a port is
# free when nothing listens on it and (with python3) it can be bound. Callers pick a fresh range
# for each cluster they start rather than reusing one for the whole test.
free_base_port() {
  local n=$1 p i busy lo=32768 hi
  read -r lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || lo=32768
  hi=$((lo - n))
  ((hi > 10000)) || hi=$((32768 - n))
  for _ in $(seq 1 100); do
    p=$((10000 + RANDOM % (hi - 10000)))
    busy=0
    for ((i = 0; i < n; i++)); do
      if [[ -n $(ss -Hltn "sport = :$((p + i))" 2>/dev/null) ]] || ! port_bindable $((p + i)); then
        busy=1
        break
      fi
    done
    ((busy)) || { echo "$p"; return 0; }
  done
  return 1
}

# port_bindable PORT: 127.0.0.1:PORT can be bound now (true when python3 is missing).
port_bindable() {
  command -v python3 >/dev/null || return 0
  python3 -c 'import socket,sys
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null
}
