#!/usr/bin/env bash
# history_load against a real kvserver (tcp), then lincheck: the history must be linearizable.
# Then the same with --inject=stale_read (one GET recorded with an older value of its key):
# lincheck must find it (exit 1, the key named). Then with the server stopped for a while:
# ops of unknown outcome, still linearizable. Then two load processes, two histories, one check.
#
#   history_e2e_test.sh KVSERVER HISTORY_LOAD LINCHECK [SECONDS]
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/wait_for_port.sh"
kvserver=$1 load=$2 lincheck=$3 seconds=${4:-3}
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-history-e2e.XXXXXX")
server_pid=""
cleanup() {
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

"$kvserver" --port=0 --port_file="$work/port" --transport=tcp --memory=64MiB --huge_pages=false \
  >"$work/server.log" 2>&1 &
server_pid=$!
seed=127.0.0.1:$(wait_for_port "$work/port" "$server_pid" "$work/server.log") || exit 1

# 1. A correct server: linearizable.
"$load" --seed="$seed" --threads=8 --keys=8 --seconds="$seconds" --out="$work/ok.jsonl" \
  || fail "history_load exited $?"
ops=$(wc -l <"$work/ok.jsonl")
echo "recorded $ops ops"
((ops > 100)) || fail "only $ops ops recorded"
"$lincheck" "$work/ok.jsonl" >"$work/ok.out"
rc=$?
head -n 3 "$work/ok.out"
[[ $rc == 0 ]] || { cat "$work/ok.out"; fail "lincheck exited $rc on a correct server's history"; }
grep -q '^verdict: LINEARIZABLE' "$work/ok.out" || fail "no LINEARIZABLE verdict"

# 2. One stale read injected into the recording: lincheck must fail and name the key.
"$load" --seed="$seed" --threads=8 --keys=8 --seconds="$seconds" --out="$work/stale.jsonl" \
  --inject=stale_read 2>"$work/stale.err"
rc=$?
cat "$work/stale.err"
[[ $rc == 0 ]] || fail "history_load --inject=stale_read exited $rc"
key=$(sed -n 's/.*injected stale read: key \([^ ]*\) .*/\1/p' "$work/stale.err")
"$lincheck" "$work/stale.jsonl" >"$work/stale.out"
rc=$?
sed -n '/^key /,$p' "$work/stale.out" | head -n 20
[[ $rc == 1 ]] || { cat "$work/stale.out"; fail "lincheck exited $rc on a stale read, expected 1"; }
grep -q "^key $key: NOT LINEARIZABLE" "$work/stale.out" || fail "the violation does not name key '$key'"
# The search alone (without the version sweep that caught it above) must find it too.
"$lincheck" --version_precheck=false "$work/stale.jsonl" >"$work/stale-search.out"
rc=$?
sed -n '/^key /,$p' "$work/stale-search.out" | head -n 20
[[ $rc == 1 ]] || { cat "$work/stale-search.out"; fail "lincheck --version_precheck=false exited $rc"; }
grep -q "^key $key: NOT LINEARIZABLE" "$work/stale-search.out" \
  || fail "the search's violation does not name key '$key'"

# 3. The server stopped (SIGSTOP) for 1.5 s under load: ops time out (300 ms) and are recorded
# `unknown`; the queued requests apply after SIGCONT, long after their callers gave up. Still
# linearizable.
"$load" --seed="$seed" --threads=8 --keys=8 --seconds=$((seconds + 2)) --op_timeout_ms=300 \
  --out="$work/stop.jsonl" >"$work/stop.load" 2>&1 &
load_pid=$!
sleep 1
kill -STOP "$server_pid"
sleep 1.5
kill -CONT "$server_pid"
wait "$load_pid" || fail "history_load exited $? (server stopped)"
grep '^outcomes' "$work/stop.load"
grep -qE '^outcomes: .* unknown=[1-9]' "$work/stop.load" || fail "no unknown outcome recorded while the server was stopped"
"$lincheck" "$work/stop.jsonl" >"$work/stop.out"
rc=$?
head -n 2 "$work/stop.out"
[[ $rc == 0 ]] || { cat "$work/stop.out"; fail "lincheck exited $rc on the stopped server's history"; }

# 4. Two history_load processes on the same keys (their own client ids), one history each,
# checked together: CLOCK_MONOTONIC is one clock for every process of the machine.
prefix="two-$$-$RANDOM-"
"$load" --seed="$seed" --threads=4 --keys=4 --seconds="$seconds" --key_prefix="$prefix" \
  --client_base=0 --out="$work/p0.jsonl" >"$work/p0.load" 2>&1 &
p0=$!
"$load" --seed="$seed" --threads=4 --keys=4 --seconds="$seconds" --key_prefix="$prefix" \
  --client_base=100 --out="$work/p1.jsonl" >"$work/p1.load" 2>&1 || fail "history_load 2 exited $?"
wait "$p0" || fail "history_load 1 exited $?"
"$lincheck" "$work/p0.jsonl" "$work/p1.jsonl" >"$work/two.out"
rc=$?
head -n 2 "$work/two.out"
[[ $rc == 0 ]] || { cat "$work/two.out"; fail "lincheck exited $rc on two processes' histories"; }
grep -q '^ops: .*, keys: 4,' "$work/two.out" || fail "the two histories do not share their 4 keys"

if ((failures > 0)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "PASS"
