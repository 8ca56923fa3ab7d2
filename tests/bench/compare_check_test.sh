#!/usr/bin/env bash
# bench/compare.sh refuses to compare when kvbench lacks a peer's backend: it names the peer,
# exits 2 and prints no table (a fake build dir; --check stops after the check).
#
#   compare_check_test.sh SOURCE_DIR
set -uo pipefail
src=$1
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-compare-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# fake_build BACKENDS: a build dir whose kvbench --help lists BACKENDS as built in.
fake_build() {
  rm -rf "$work/build"
  mkdir -p "$work/build/bench/kvbench" "$work/build/server"
  printf '#!/bin/sh\necho "  -db NAME         rdkv (default), redis or memcached (built in: %s)"\n' "$1" \
    >"$work/build/bench/kvbench/kvbench"
  printf '#!/bin/sh\nexit 0\n' >"$work/build/server/kvserver"
  chmod +x "$work/build/bench/kvbench/kvbench" "$work/build/server/kvserver"
}
run() {  # run ARGS...: compare.sh on the fake build; sets rc, out, err
  COMPARE_SKIP_DEPS=1 COMPARE_SKIP_BUILD=1 BUILD="$work/build" "$src/bench/compare.sh" "$@" \
    >"$work/out" 2>"$work/err"
  rc=$?
  out=$(cat "$work/out")
  err=$(cat "$work/err")
}

fake_build "rdkv"
run --check
[[ $rc == 2 ]] || fail "--check without redis and memcached exited $rc (stderr: $err)"
[[ $err == *"without the backend(s) redis memcached"* ]] || fail "peers not named: $err"
[[ -z $out ]] || fail "printed on stdout: $out"
run
[[ $rc == 2 ]] || fail "a comparison without its peers exited $rc (stderr: $err)"
[[ $out != *"|"* ]] || fail "printed a table: $out"

fake_build "rdkv, redis"
run --check
[[ $rc == 2 && $err == *"backend(s) memcached,"* ]] || fail "memcached missing: rc $rc, $err"

fake_build "rdkv, redis, memcached"
run --check
[[ $rc == 0 ]] || fail "--check with every backend exited $rc (stderr: $err)"

run --frobnicate
[[ $rc == 2 && $err == *usage* ]] || fail "bad argument: rc $rc, $err"

if ((failures > 0)); then
  echo "compare_check_test: $failures failure(s)" >&2
  exit 1
fi
echo "compare_check_test: passed"
