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

# free_base_port N: a port P such that P..P+N-1 have no listener on this machine.
free_base_port() {
  local n=$1 p i busy
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 30000))
    busy=0
    for ((i = 0; i < n; i++)); do
      if [[ -n $(ss -Hltn "sport = :$((p + i))" 2>/dev/null) ]]; then busy=1; break; fi
    done
    ((busy)) || { echo "$p"; return 0; }
  done
  return 1
}
