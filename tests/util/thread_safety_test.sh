#!/usr/bin/env bash
# Shows that clang's -Wthread-safety check (the `tsa` preset, tests/run-all.sh stage tsa) is not
# vacuous: tests/util/thread_safety/guarded_ok.cc must compile with the preset's flags
# (-Wthread-safety -Wthread-safety-beta -Werror), and each *_bad.cc (a locking-rule violation:
# an unguarded read, a REQUIRES call without the lock, a write under a shared lock, two locks
# against their ACQUIRED_BEFORE order) must fail to, with a thread-safety diagnostic. And
# tests/util/syntax_check.py (how the tsa stage compiles the tree) must fail a tree holding one
# such unit and pass a clean one.
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

# The tsa stage runs the whole tree through tests/util/syntax_check.py: it must fail when one
# unit breaks a rule and pass when none does.
if command -v python3 >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  bad=$(ls "$DIR"/*_bad.cc | head -1)
  write_db() {  # write_db FILE...: a compile_commands.json of these units in $tmp
    local first=1
    printf '[' >"$tmp/compile_commands.json"
    for f in "$@"; do
      ((first)) || printf ',' >>"$tmp/compile_commands.json"
      first=0
      printf '{"directory":"%s","file":"%s","output":"%s.o","command":"%s -std=c++20 -Wthread-safety -Wthread-safety-beta -Werror -I%s -o %s.o -c %s"}' \
        "$tmp" "$f" "$f" "$CXX" "$ROOT" "$tmp/x" "$f" >>"$tmp/compile_commands.json"
    done
    printf ']' >>"$tmp/compile_commands.json"
  }
  write_db "$DIR/guarded_ok.cc" "$bad"
  if out=$(python3 "$ROOT/tests/util/syntax_check.py" "$tmp" 2 2>&1); then
    echo "FAIL: syntax_check.py passed a tree holding $(basename "$bad")"; failed=1
  elif grep -q "FAILED $bad" <<<"$out" && grep -q "1/2 translation units passed" <<<"$out"; then
    echo "ok: syntax_check.py fails the tree on $(basename "$bad")"
  else
    echo "FAIL: syntax_check.py failed without naming $(basename "$bad"):"; echo "$out"; failed=1
  fi
  write_db "$DIR/guarded_ok.cc"
  if out=$(python3 "$ROOT/tests/util/syntax_check.py" "$tmp" 2 2>&1); then
    echo "ok: syntax_check.py passes a clean tree"
  else
    echo "FAIL: syntax_check.py refused a clean tree:"; echo "$out"; failed=1
  fi
  rm -rf "$tmp"
else
  echo "FAIL: python3 not found: cannot check tests/util/syntax_check.py"; failed=1
fi
exit $failed
