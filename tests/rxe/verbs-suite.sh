#!/usr/bin/env bash
# The verbs test suite. Runs INSIDE the Soft-RoCE VM (started by tests/rxe/run-verbs-tests.sh):
#   1. the transport conformance suite, verbs instances, RDKV_REQUIRE_VERBS=1 (no skipping)
#   2. verbs-only transport tests (smoke, a refused RDMA WRITE, session security: a replayed or
#      forged handshake, wrong secrets, roles, per-connection memory windows)
#   3. kvserver + kvcli over verbs: every operation and its errors
#   4. a full region over verbs (OutOfSpace, stored keys intact); a 3-server cluster over verbs
#      with every shard on 2 servers: each write on both replicas, a promotion, GETs through it
#   5. automatic failover over verbs: a primary SIGKILLed under a recorded load, promoted by
#      kvcoord, restarted and caught up; lincheck (failover_kill_test.sh, 1 round;
#      RDKV_VM_FAILOVER=0 leaves it out)
#   6. one-sidedness (sigstop_test): with kvserver stopped by SIGSTOP, GETs of stored keys still
#      return the right values while a PUT times out; SIGCONT and everything resumes
#
#   tests/rxe/verbs-suite.sh BUILD_DIR
set -uo pipefail
B=${1:?usage: verbs-suite.sh BUILD_DIR}
if [[ -z ${RDKV_RXE_ADDR:-} ]]; then
  echo "verbs-suite: SKIPPED: not inside the Soft-RoCE VM (RDKV_RXE_ADDR is not set); run it with tests/rxe/run-verbs-tests.sh $B"
  exit 0
fi
export RDKV_REQUIRE_VERBS=1
# The VM emulates its CPU (TCG): run the conformance suite at a reduced scale.
export RDKV_TEST_SCALE=${RDKV_TEST_SCALE:-0.1}
failures=0
pass() { echo "verbs-suite: PASS: $*"; }
fail() { echo "verbs-suite: FAIL: $*"; failures=$((failures + 1)); }

run_gtest() {
  local name=$1
  shift
  echo "verbs-suite: --- $name $*"
  if "$B/tests/$name" "$@"; then pass "$name"; else fail "$name (exit $?)"; fi
}

run_gtest conformance_test --gtest_filter='*/verbs'
run_gtest verbs_smoke_test
run_gtest verbs_write_refused_test
run_gtest verbs_auth_test

# --- kvserver and kvcli over verbs ---------------------------------------------------------
work=$(mktemp -d)
server_pid=""
cleanup() {
  if [[ -n $server_pid ]]; then
    kill -CONT "$server_pid" 2>/dev/null
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
  fi
}
trap cleanup EXIT
# Secrets from files, never the command line (docs/security.md).
(umask 077 && printf 'vm-secret' >"$work/secret" && printf 'wrong' >"$work/wrong")
"$B/server/kvserver" --transport=verbs --host="$RDKV_RXE_ADDR" --port=0 --port_file="$work/port" \
  --memory=64MiB --auth_token_file="$work/secret" --max_value_size=64KiB 2>"$work/kvserver.log" &
server_pid=$!
for _ in $(seq 1 300); do [[ -s $work/port ]] && break; sleep 0.1; done
if [[ ! -s $work/port ]]; then
  cat "$work/kvserver.log"
  fail "kvserver did not start over verbs"
  echo "verbs-suite: $failures failure(s)"
  exit 1
fi
port=$(cat "$work/port")
cli() {
  "$B/tools/kvcli" --transport=verbs --server="$RDKV_RXE_ADDR:$port" --auth_token_file="$work/secret" \
    --timeout_ms="${CLI_TIMEOUT_MS:-5000}" "$@"
}
# expect EXIT_CODE EXPECTED_STDOUT_SUBSTRING -- kvcli args
expect() {
  local want_rc=$1 want_out=$2
  shift 3
  local out rc
  out=$(cli "$@" 2>&1)
  rc=$?
  if [[ $rc == "$want_rc" && $out == *"$want_out"* ]]; then
    pass "kvcli $* -> $rc"
  else
    fail "kvcli $*: exit $rc (want $want_rc), output: $out (want to contain '$want_out')"
  fi
}
expect 0 "" -- ping
expect 0 "" -- put alpha one
expect 0 "one" -- get alpha
expect 1 "" -- get missing-key
expect 1 "" -- insert alpha again
expect 0 "" -- insert beta two
ver=$(cli --json get alpha | sed -n 's/.*"version": *\([0-9]*\).*/\1/p')
expect 1 "" -- cas alpha 999999 nope
expect 0 "" -- cas alpha "$ver" uno
expect 0 "uno" -- get alpha
expect 1 "two" -- mget alpha beta missing-key
expect 0 "two" -- mget alpha beta
expect 0 "" -- del beta
expect 1 "" -- get beta
expect 2 "" -- put "" empty-key
expect 0 "items" -- stats
head -c 60000 /dev/urandom | base64 -w0 | head -c 60000 >"$work/big"
expect 0 "" -- put big "@$work/big"
if [[ $(cli get big) == "$(cat "$work/big")" ]]; then pass "60 KB value round trip"; else fail "60 KB value differs"; fi
# A wrong token is refused.
out=$("$B/tools/kvcli" --transport=verbs --server="$RDKV_RXE_ADDR:$port" --auth_token_file="$work/wrong" ping 2>&1)
rc=$?
if [[ $rc == 2 && $out == *PermissionDenied* ]]; then pass "wrong token refused"; else fail "wrong token: exit $rc: $out"; fi

# A full region over verbs: writes fail with OutOfSpace, stored keys stay readable.
cleanup
server_pid=""
"$B/server/kvserver" --transport=verbs --host="$RDKV_RXE_ADDR" --port=0 --port_file="$work/port2" \
  --memory=1MiB --auth_token_file="$work/secret" --max_value_size=64KiB 2>"$work/kvserver2.log" &
server_pid=$!
for _ in $(seq 1 300); do [[ -s $work/port2 ]] && break; sleep 0.1; done
port=$(cat "$work/port2" 2>/dev/null || echo 0)
head -c 30000 /dev/zero | tr '\0' x >"$work/v30k"
full=""
for i in $(seq 1 60); do
  out=$(cli put "fill$i" "@$work/v30k" 2>&1) || { full=$out; break; }
done
if [[ $full == *OutOfSpace* ]]; then pass "full region: $full"; else fail "no OutOfSpace after 60 x 30 KB in 1 MiB: $full"; fi
expect 0 "xxxx" -- get fill1
cleanup
server_pid=""

# A 3-server cluster over verbs: one rxe device, three ports, one map; kvcli routes by shard.
# Replicated (R=2, docs/design.md "Replication"): primaries forward every write to their backup
# over verbs SEND/RECV with the admin secret (REPLICATE is an admin op).
ports=()
for i in 0 1 2; do ports+=($((17400 + i))); done
replicas=$(python3 -c 'print(",".join("[%d,%d]" % (s % 3, (s + 1) % 3) for s in range(16)))')
cat >"$work/map.json" <<MAP
{"epoch": 1, "shards": 16, "servers": [
  {"id": 0, "address": "$RDKV_RXE_ADDR:${ports[0]}"},
  {"id": 1, "address": "$RDKV_RXE_ADDR:${ports[1]}"},
  {"id": 2, "address": "$RDKV_RXE_ADDR:${ports[2]}"}],
 "owners": [$(python3 -c 'print(",".join(str(s % 3) for s in range(16)))')],
 "replicas": [$replicas]}
MAP
printf 'vm-admin-secret' >"$work/admin"
chmod 600 "$work/admin"
cluster_pids=()
for i in 0 1 2; do
  "$B/server/kvserver" --transport=verbs --host="$RDKV_RXE_ADDR" --port="${ports[$i]}" \
    --port_file="$work/cport$i" --memory=32MiB --auth_token_file="$work/secret" \
    --admin_token_file="$work/admin" --worker_threads=4 \
    --cluster_map="$work/map.json" --server_id=$i --data_dir="$work/cdata$i" --durability=none \
    2>"$work/cluster$i.log" &
  cluster_pids+=($!)
done
for i in 0 1 2; do
  for _ in $(seq 1 300); do [[ -s $work/cport$i ]] && break; sleep 0.1; done
done
port=${ports[1]}  # any server is a seed
for k in $(seq 1 12); do expect 0 "" -- put "ckey$k" "cval$k"; done
port=${ports[2]}
for k in $(seq 1 12); do expect 0 "cval$k" -- get "ckey$k"; done
out=$(cli --json cluster 2>&1)
if [[ $(grep -o '"reachable":true' <<<"$out" | wc -l) == 3 ]]; then pass "kvcli cluster: 3 reachable servers over verbs"; else fail "kvcli cluster: $out"; fi
spread=$(cli --json stats 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(sum(1 for s in d["per_server"] if s.get("stats",{}).get("items",0) > 0))' || echo 0)
if [[ $spread == 3 ]]; then pass "keys spread over all 3 servers"; else fail "keys on only $spread of 3 servers"; fi
items=$(cli --json stats 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(sum(s.get("stats",{}).get("items",0) for s in d["per_server"]))' || echo 0)
if [[ $items == 24 ]]; then pass "every key on its 2 replicas (24 items for 12 keys)"; else fail "replicas hold $items items, want 24"; fi
# Roles over verbs: the data secret alone cannot promote (an admin op); nothing changes.
out=$(cli cluster promote 0 1 2>&1)
rc=$?
if [[ $rc != 0 && $out == *ermission* ]]; then pass "promote with the data secret only refused over verbs"; else fail "promote without the admin secret: exit $rc: $out"; fi
for k in 1 2 3; do expect 0 "cval$k" -- get "ckey$k"; done
if cli --admin_token_file="$work/admin" cluster promote 0 1 >"$work/promote.out" 2>&1; then
  pass "kvcli cluster promote 0 1 over verbs"
else
  fail "promote over verbs: $(cat "$work/promote.out")"
fi
for k in $(seq 1 12); do expect 0 "cval$k" -- get "ckey$k"; done
for k in $(seq 1 12); do expect 0 "" -- put "ckey$k" "again$k"; done
for k in $(seq 1 12); do expect 0 "again$k" -- get "ckey$k"; done
for p in "${cluster_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done

# Automatic failover over verbs (issue #12, docs/design.md "Failover"): the kill test of
# tests/cluster/failover_kill_test.sh (map in etcd, R=3, two kvcoord detecting by the lease,
# a recorded load, lincheck), one round, on the real one-sided path. About 3.5 minutes in the
# VM; RDKV_VM_FAILOVER=0 leaves it out (SKIPPED) for a quick local run.
if [[ ${RDKV_VM_FAILOVER:-1} == 0 ]]; then
  echo "verbs-suite: SKIPPED: failover over verbs: RDKV_VM_FAILOVER=0"
elif command -v etcd >/dev/null; then
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  # Scaled to the emulated CPU (failover_kill_test.sh's head): etcd lease TTL 8 s, deadlines x6,
  # etcd polled every second, the coordinator every 500 ms, 2 load threads with a 5 ms pause
  # after each operation (at full speed the history grew by 600 operations a second).
  if RDKV_FAILOVER_TRANSPORT=verbs RDKV_FAILOVER_HOST="$RDKV_RXE_ADDR" \
    RDKV_FAILOVER_LEASE_TTL=8 RDKV_FAILOVER_TIME_SCALE=6 RDKV_FAILOVER_POLL_S=1 \
    RDKV_COORD_EXTRA_FLAGS="--poll_ms=500" RDKV_FAILOVER_LOAD_FLAGS="--threads=2 --pause_us=5000" \
    "$root/tests/cluster/failover_kill_test.sh" "$B" "$B/tests/history/history_load" \
    "$B/tests/history/lincheck" 1 none >"$work/failover.out" 2>&1; then
    pass "failover over verbs: $(grep -E '^ok - round|writes flowing' "$work/failover.out" | tr '\n' ' ')"
  else
    fail "failover over verbs (exit $?):"
    grep -vE '^[IW][0-9]{8}' "$work/failover.out" | tail -n 30 | sed 's/^/    | /'
  fi
else
  fail "failover over verbs: etcd is not installed (deploy/install-deps.sh installs it; RDKV_VM_FAILOVER=0 skips the step)"
fi

# One-sidedness (SIGSTOP) needs a client connected before the stop: its own test.
run_gtest sigstop_test

echo "verbs-suite: $failures failure(s)"
[[ $failures == 0 ]]
