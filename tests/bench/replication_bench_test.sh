#!/usr/bin/env bash
# bench/replication-bench.sh in a tiny configuration: it finishes, prints a complete table (every
# workload and op type for R = 1, 2, 3, with ratios, no failed operation) and the catch-up
# line, and keeps its raw outputs under --out. Checks completeness, never timings.
#
#   replication_bench_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-replbench-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

for b in server/kvserver tools/kvcli bench/kvbench/kvbench; do
  if [[ ! -x $build/$b ]]; then
    echo "SKIPPED: $build/$b is not built (build kvserver, kvcli and kvbench)"
    exit 0
  fi
done

# Pinned to every CPU (taskset -c 0-N): the pinning path runs without changing the schedule.
pin=()
if command -v taskset >/dev/null; then
  all=0-$(($(nproc) - 1))
  pin=(--server-cpus "$all/$all/$all" --client-cpus "$all")
else
  echo "pinning not exercised: no taskset"
fi
rc=0
"$src/bench/replication-bench.sh" "${pin[@]}" --records 300 --ops 400 --threads 4 --shards 3 --repeat 1 \
  --copy-records 600 --worker-threads 8 --memory 64MiB --build "$build" --out "$work/out" \
  >"$work/stdout" 2>"$work/stderr" || rc=$?
if ((rc != 0)); then
  tail -n 20 "$work/stderr" >&2
  fail "the script exited $rc"
fi
out=$(cat "$work/stdout")

# The servers' CPU per write by thread name: a row for each R, with the NIC threads' column.
threads_head=$(grep -A1 "CPU per write by thread" <<<"$out" | tail -n 1)
[[ $threads_head == *" rdkv-nic |"* && $threads_head == *" all |"* ]] ||
  fail "no per-thread CPU table with an rdkv-nic column: $threads_head"
for r in 1 2 3; do
  grep -A6 "CPU per write by thread" <<<"$out" | grep -qE "^\| $r \|( [0-9.]+ \|)+$" ||
    fail "no per-thread CPU row for R=$r"
done

# One row per workload, op type and R: | workload | op | R | ops/s | p50 | p99 | 3 ratios | CPU x2 |
# switches | errors | CPUs busy x3 |
for row in "update UPDATE" "A READ" "A UPDATE" "C READ"; do
  read -r wl op <<<"$row"
  for r in 1 2 3; do
    line=$(grep -E "^\| $wl \| $op \| $r \|" <<<"$out" || true)
    if [[ -z $line ]]; then
      fail "no row for $wl $op R=$r"
      continue
    fi
    IFS='|' read -r -a cells <<<"$line"
    ((${#cells[@]} == 17)) || { fail "row '$line' has ${#cells[@]} cells, not 17"; continue; }
    for c in 4 5 6 7 8 9 10 11 12 13 14 15 16; do
      [[ ${cells[c]// /} =~ ^[0-9]+(\.[0-9]+)?$ ]] || fail "$wl $op R=$r: cell $c '${cells[c]}' is not a number"
    done
    awk -v t="${cells[4]}" 'BEGIN {exit !(t > 0)}' || fail "$wl $op R=$r: no throughput"
    [[ ${cells[13]// /} == 0 ]] || fail "$wl $op R=$r: ${cells[13]} failed operations"
    if ((r == 1)); then
      [[ ${cells[7]// /} == 1.00 ]] || fail "$wl $op R=1: ratio to itself is ${cells[7]}"
    fi
  done
done

# The catch-up line: 3 shards, items copied, positive rates (unless the script said why not:
# a kvcli without `cluster add-replica`).
line=$(grep -A2 '^| shards | items copied' <<<"$out" | tail -n1 || true)
IFS='|' read -r -a cells <<<"$line"
if [[ $(cat "$work/stderr") == *"SKIPPED the catch-up copy"* ]]; then
  echo "catch-up checks skipped: $(grep -o 'SKIPPED the catch-up copy.*' "$work/stderr")"
elif ((${#cells[@]} != 11)); then
  fail "no complete catch-up line: '$line'"
else
  [[ ${cells[1]// /} == 3 ]] || fail "catch-up: ${cells[1]} shards, not 3"
  items=${cells[2]// /}
  if ! [[ $items =~ ^[0-9]+$ ]] || ((items == 0 || items > 600)); then
    fail "catch-up: $items items copied"
  fi
  awk -v r="${cells[6]}" -v m="${cells[7]}" 'BEGIN {exit !(r > 0 && m > 0)}' ||
    fail "catch-up: items/s ${cells[6]}, MiB/s ${cells[7]}"
  [[ -s $work/out/copy-add-replica.json ]] || fail "--out lacks copy-add-replica.json"
fi
[[ $out == *"nproc: "* && $out == *"uptime before: "* ]] || fail "the host load is not recorded"

# The role split: one row per R with numeric cells (CPU in 10 ms ticks: a tiny run may show 0).
roles=$(sed -n '/^## role split/,/^$/p' <<<"$out")
for r in 1 2 3; do
  line=$(grep -E "^\| $r \| " <<<"$roles" || true)
  IFS='|' read -r -a cells <<<"$line"
  if ((${#cells[@]} != 8)); then
    fail "role split: no complete row for R=$r: '$line'"
    continue
  fi
  for c in 2 3 4 5 6 7; do
    [[ ${cells[c]// /} =~ ^[0-9]+(\.[0-9]+)?$ ]] || fail "role split R=$r: cell $c '${cells[c]}' is not a number"
  done
done
[[ -s $work/out/role-rows.txt ]] || fail "--out lacks role-rows.txt"

# Raw outputs kept under --out.
for f in table.md rows.txt r1-round1-update.txt r3-round1-C.txt r2-round1-server-0.log; do
  [[ -s $work/out/$f ]] || fail "--out lacks $f"
done

# Bad arguments: usage, exit 2.
rc=0
"$src/bench/replication-bench.sh" --records 0 >/dev/null 2>"$work/err" || rc=$?
[[ $rc == 2 ]] || fail "--records 0 exited $rc"
rc=0
"$src/bench/replication-bench.sh" --server-cpus 0-1/2 >/dev/null 2>"$work/err" || rc=$?
[[ $rc == 2 && $(cat "$work/err") == *"three CPU lists"* ]] || fail "--server-cpus 0-1/2 exited $rc: $(cat "$work/err")"
if ((${#pin[@]} > 0)); then
  [[ $out == *"pinning: servers $all/$all/$all (0/1/2), client $all"* ]] || fail "the pinning is not recorded"
fi

if ((failures > 0)); then
  echo "--- stdout:" >&2
  cat "$work/stdout" >&2
  echo "replication_bench_test: $failures failure(s)" >&2
  exit 1
fi
echo "replication_bench_test: passed"
