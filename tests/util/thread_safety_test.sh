#!/usr/bin/env bash
# Shows that clang's -Wthread-safety check (the `tsa` preset, tests/run-all.sh stage tsa) is not
# vacuous: tests/util/thread_safety/guarded_ok.cc must compile with the preset's flags
# (-Wthread-safety -Wthread-safety-beta -Werror), and each *_bad.cc (a locking-rule violation:
# an unguarded read, a REQUIRES call without the lock, a write under a shared lock, two locks
# against their ACQUIRED_BEFORE order) must fail to, with a thread-safety diagnostic.
#
#   tests/util/thread_safety_test.sh [CLANGXX] [SOURCE_ROOT]
#
# Exit 0: all as expected; 1: a check failed; 77: no clang++ (SKIPPED).
set -uo pipefail
CXX=${1:-clang++}
ROOT=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
DIR=$ROOT/tests/util/thread_safety
if ! command -v "$CXX" >/dev/null 2>&1 || ! "$CXX" --version 2>/dev/null | grep -qi clang; then
  echo "SKIPPED: no clang++ ('$CXX'): -Wthread-safety needs clang"
  exit 77
fi
compile() {  # compile FILE: stderr to $log
  "$CXX" -std=c++20 -fsyntax-only -Wthread-safety -Wthread-safety-beta -Werror -I"$ROOT" "$1" 2>"$log"
}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0
if compile "$DIR/guarded_ok.cc"; then
  echo "ok: guarded_ok.cc compiles"
else
  echo "FAIL: guarded_ok.cc should compile:"; cat "$log"; failed=1
fi
for f in "$DIR"/*_bad.cc; do
  name=$(basename "$f")
  if compile "$f"; then
    echo "FAIL: $name compiled, but it breaks a locking rule: -Wthread-safety did not catch it"
    failed=1
  elif grep -q -- '-Werror,-Wthread-safety' "$log"; then
    echo "ok: $name refused: $(grep -m1 'error:' "$log" | sed 's/.*error: //')"
  else
    echo "FAIL: $name failed to compile, but not with a thread-safety error:"; cat "$log"
    failed=1
  fi
done
exit $failed
