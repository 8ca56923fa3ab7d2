#!/usr/bin/env bash
# bench/promotion-bench.sh in a tiny configuration: it finishes, prints one row per run with the
# keys resent (about a third of the records: shard 0's of 3) and the resend's and the promote's
# times, and refuses bad arguments. Checks completeness, never timings.
#
#   promotion_bench_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-promobench-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

for b in server/kvserver tools/kvcli bench/kvbench/kvbench; do
  if [[ ! -x $build/$b ]]; then
    echo "SKIPPED: $build/$b is not built (build kvserver, kvcli and kvbench)"
    exit 0
  fi
done

rc=0
"$src/bench/promotion-bench.sh" --keys "300 900" --repeat 2 --build "$build" --out "$work/out" \
  >"$work/stdout" 2>"$work/stderr" || rc=$?
if ((rc != 0)); then
  tail -n 20 "$work/stderr" >&2
  fail "the script exited $rc"
fi
out=$(cat "$work/stdout")
for keys in 300 900; do
  for run in 1 2; do
    row=$(grep -E "^$keys +$run " <<<"$out" || true)
    read -r _ _ resent ms rate promote <<<"$row"
    if [[ -z $row ]]; then
      fail "no row for $keys keys, run $run"
      continue
    fi
    # Shard 0 holds about a third of the keys (hashed): well within 10%..60%.
    ((resent * 10 >= keys && resent * 10 <= keys * 6)) ||
      fail "$keys keys, run $run: $resent keys resent"
    [[ $ms =~ ^[0-9]+$ && $rate =~ ^[0-9]+$ && $promote =~ ^[0-9]+$ ]] ||
      fail "$keys keys, run $run: not numbers: $row"
  done
done
[[ -s $work/out/keys-300-run-1/server-1.log ]] || fail "no server log kept under --out"

# Bad arguments: exit 2 with a message, nothing started.
for args in "--keys abc" "--repeat 0" "--bogus"; do
  rc=0
  # shellcheck disable=SC2086  # split on purpose
  "$src/bench/promotion-bench.sh" $args --build "$build" >"$work/bad.out" 2>"$work/bad.err" || rc=$?
  ((rc == 2)) || fail "'$args' exited $rc, not 2"
  grep -q "error:" "$work/bad.err" || fail "'$args' printed no error"
done

if ((failures > 0)); then
  echo "$failures failure(s); the output:" >&2
  cat "$work/stdout" >&2
  exit 1
fi
echo "promotion-bench: rows for every run, bad arguments refused"
