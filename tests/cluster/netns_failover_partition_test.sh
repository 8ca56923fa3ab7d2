#!/usr/bin/env bash
# Automatic failover across a network partition (issue #12, docs/design.md "Failover"): 3
# kvservers, each in its own network namespace (veth pairs to the root namespace), the map in
# etcd (root namespace), R=3, two kvcoord coordinators, clients recording a GET/PUT/INSERT/CAS/
# DELETE load on 12 shared hot keys: most in the root namespace, two threads inside server 0's
# namespace, talking to server 0 (the primary of shards 0 and 3).
#   1. Server 0's link is cut (its veth's root end down): it cannot reach etcd or its peers, its
#      own clients still reach it. It must fence itself before its lease expires; the
#      coordinator (its probes hang rather than being refused) waits for the lease and promotes
#      an in-sync backup of shards 0 and 3.
#   2. After the promotion the clients inside keep going against server 0 for a while: they must
#      never read a value older than a write the new primaries acknowledged, and nothing server 0
#      acknowledges may be lost.
#   3. The link comes back: server 0 registers again, finds itself in no replica set, and the
#      coordinator adds it back to every shard with a catch-up copy (R=3 again, never a primary).
#   4. The kill test across namespaces: RDKV_NETNS_KILL_ROUNDS (default 3) rounds, each SIGKILLs
#      the server that is primary of the most shards (another one each round), waits for its
#      shards' promotion, restarts it in its namespace and waits until it is a replica of every
#      shard again, under the same load.
#   5. Both client groups' histories together are linearizable (lincheck).
# RDKV_NETNS_DURABILITY=sync runs the servers with --durability=sync (default none).
# Usage: netns_failover_partition_test.sh BUILD_DIR. Exit 77 (SKIPPED) when namespaces cannot be
# made or etcd is missing.
set -u
export TZ=${TZ:-UTC}
B=${1:?usage: netns_failover_partition_test.sh BUILD_DIR}
KV=$B/server/kvserver
CLI=$B/tools/kvcli
COORD=$B/coordinator/kvcoord
LOAD=$B/tests/history/history_load
LIN=$B/tests/history/lincheck
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
[ -x "$KV" ] && [ -x "$CLI" ] && [ -x "$COORD" ] && [ -x "$LOAD" ] && [ -x "$LIN" ] ||
  fail "build kvserver, kvcli, kvcoord, history_load and lincheck first"
command -v ip >/dev/null || skip "no ip(8)"
command -v etcd >/dev/null && command -v etcdctl >/dev/null ||
  skip "etcd is not installed (deploy/install-deps.sh installs it)"
command -v python3 >/dev/null || skip "python3 is not installed"
[ "$(id -u)" = 0 ] || skip "needs root for ip netns"
# shellcheck source=../deploy/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/lib.sh"

tag=fp$$
work=$(mktemp -d)
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  ip route del blackhole "10.79.$base.0/24" 2>/dev/null
  for i in 0 1 2; do
    ip link del ${tag}h$i 2>/dev/null
    ip netns del ${tag}n$i 2>/dev/null
  done
  if [ -n "${KEEP_DIR:-}" ]; then mkdir -p "$KEEP_DIR" && cp -r "$work"/. "$KEEP_DIR"/; fi
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add ${tag}n0 2>"$work/err" || skip "ip netns add not permitted: $(cat "$work/err")"

base=$(( ($$ % 80) * 3 + 10 ))
addr() { echo "10.79.$((base + $1)).2"; }
hostaddr() { echo "10.79.$((base + $1)).1"; }
for i in 0 1 2; do
  [ $i = 0 ] || ip netns add ${tag}n$i || fail "ip netns add ${tag}n$i"
  ip link add ${tag}h$i type veth peer name ${tag}p$i || skip "cannot create veth pairs"
  ip link set ${tag}p$i netns ${tag}n$i
  ip addr add "$(hostaddr $i)/24" dev ${tag}h$i
  ip link set ${tag}h$i up
  ip netns exec ${tag}n$i ip addr add "$(addr $i)/24" dev ${tag}p$i
  ip netns exec ${tag}n$i ip link set ${tag}p$i up
  ip netns exec ${tag}n$i ip link set lo up
  ip netns exec ${tag}n$i ip route add 10.79.0.0/16 via "$(hostaddr $i)"
done
sysctl -qw net.ipv4.ip_forward=1

# etcd in the root namespace, reachable from every namespace through its veth's root address.
ep=$(free_base_port 2) || skip "no free port for etcd"
etcd --name p --data-dir "$work/etcd" --listen-client-urls "http://0.0.0.0:$ep" \
  --advertise-client-urls "http://127.0.0.1:$ep" --listen-peer-urls "http://127.0.0.1:$((ep + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((ep + 1))" \
  --initial-cluster "p=http://127.0.0.1:$((ep + 1))" --heartbeat-interval 50 --election-timeout 250 \
  >"$work/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$ep" endpoint health >/dev/null 2>&1 && break
  sleep 0.1
done
ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$ep" endpoint health >/dev/null 2>&1 || fail "etcd did not start"

python3 - "$work/map.json" "$(addr 0)" "$(addr 1)" "$(addr 2)" <<'PY'
import json, sys
path, addrs = sys.argv[1], sys.argv[2:]
shards = 6
m = {"epoch": 1, "shards": shards, "replication_factor": 3,
     "servers": [{"id": i, "address": f"{a}:7400"} for i, a in enumerate(addrs)],
     "owners": [s % 3 for s in range(shards)],
     "replicas": [[(s + k) % 3 for k in range(3)] for s in range(shards)]}
json.dump(m, open(path, "w"))
PY
"$CLI" --etcd="127.0.0.1:$ep" --cluster_name=part cluster import-map "$work/map.json" >/dev/null ||
  fail "import-map"
printf 'netns-admin-secret' >"$work/admin"
chmod 600 "$work/admin"
for i in 0 1; do
  "$COORD" --etcd="127.0.0.1:$ep" --cluster_name=part --lease_ttl_s=2 --name=coord-$i \
    --admin_token_file="$work/admin" >>"$work/coord$i.log" 2>&1 &
  pids+=($!)
done
# RDKV_NETNS_DURABILITY: the servers' --durability (default none: memory replication alone
# must keep every acknowledged write; sync: each restart also recovers from RocksDB).
durability=${RDKV_NETNS_DURABILITY:-none}
case $durability in none | sync | async) ;; *) fail "RDKV_NETNS_DURABILITY: none, sync or async" ;; esac
spid=()
start_server() {  # start_server I: server I in its namespace (again after a kill: same flags)
  local i=$1
  ip netns exec ${tag}n$i "$KV" --host="$(addr $i)" --port=7400 --transport=tcp --memory=32MiB \
    --huge_pages=false --nocheck_memory --etcd="$(hostaddr $i):$ep" --cluster_name=part \
    --etcd_lease_ttl_s=2 --server_id=$i --data_dir="$work/data$i" --durability="$durability" \
    --worker_threads=8 --admin_token_file="$work/admin" >>"$work/s$i.log" 2>&1 &
  spid[i]=$!
  pids+=($!)
}
for i in 0 1 2; do
  rm -rf "$work/data$i"
  start_server $i
done
map_query() {  # map_query PYTHON_EXPR_OVER_m
  ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$ep" get /rdkv/part/map --print-value-only 2>/dev/null |
    python3 -c "import json,sys
m=json.load(sys.stdin); reps=m.get('replicas') or [[o] for o in m['owners']]
joining=sum(len(v) for v in (m.get('joining') or {}).values())
print($1)" 2>/dev/null
}
wait_for() {  # wait_for SECONDS PYTHON_CONDITION
  local deadline=$((SECONDS + $1))
  while ((SECONDS < deadline)); do
    [ "$(map_query "$2")" = True ] && return 0
    sleep 0.1
  done
  return 1
}
wait_for 30 "m.get('coordinated', False) and all(s.get('incarnation', 0) for s in m['servers'])" ||
  { tail -5 "$work"/s*.log "$work"/coord*.log; fail "the coordinator did not admit the 3 servers"; }
echo "3 servers in namespaces ${tag}n0..2, map in etcd (R=3), 2 coordinators: admitted"

"$LOAD" --seed="$(addr 1):7400" --threads=4 --keys=12 --key_prefix=pk- --client_base=0 \
  --seconds=900 --stop_file="$work/stop" --out="$work/h_out.jsonl" >"$work/load_out.txt" 2>&1 &
load_out=$!
ip netns exec ${tag}n0 "$LOAD" --seed="$(addr 0):7400" --threads=2 --keys=12 --key_prefix=pk- \
  --client_base=100 --seconds=900 --stop_file="$work/stop" --out="$work/h_in.jsonl" \
  >"$work/load_in.txt" 2>&1 &
load_in=$!
sleep 2

epoch=$(map_query "m['epoch']")
# A silent partition: the link goes down and the root namespace drops what it would route to
# server 0's subnet (without the blackhole route, packets would follow the default route).
ip link set ${tag}h0 down
ip route add blackhole "10.79.$base.0/24"
t0=$SECONDS
echo "server 0 cut off (map epoch $epoch)"
wait_for 20 "m['epoch'] > $epoch and all(o != 0 for o in m['owners']) and all(0 not in r for r in reps)" ||
  fail "server 0's shards were not promoted within 20 s of the partition: $(map_query m)"
echo "promoted $((SECONDS - t0)) s after the partition: owners $(map_query "m['owners']")"
grep -q "could not be renewed" "$work/s0.log" || fail "server 0 did not fence itself (lease)"
echo "server 0 fenced itself: $(grep -m1 'could not be renewed' "$work/s0.log" | cut -c1-200)"
# Its own clients keep trying against it for a while, the others write through the new primaries.
sleep 3
ip route del blackhole "10.79.$base.0/24"
ip link set ${tag}h0 up
ip route replace "10.79.$base.0/24" dev ${tag}h0 src "$(hostaddr 0)" 2>/dev/null
t1=$SECONDS
echo "partition healed"
wait_for 90 "all(len(r) == 3 for r in reps) and joining == 0 and all(o != 0 for o in m['owners'])" ||
  fail "server 0 did not rejoin every shard as a replica within 90 s: $(map_query m)"
echo "server 0 is an in-sync backup of every shard again $((SECONDS - t1)) s after the heal, primary of none"
# 4. The kill test across the namespaces: SIGKILL the server that is primary of the most shards,
#    each round another one, under the same load; its shards are promoted, it is restarted in
#    its namespace and comes back as a backup of every shard (R=3 again). The one history
#    covers these failovers too.
full="all(len(r) == 3 for r in reps) and joining == 0 and all(s.get('incarnation', 0) for s in m['servers'])"
for ((r = 1; r <= ${RDKV_NETNS_KILL_ROUNDS:-3}; r++)); do
  victim=$(map_query "max(range(3), key=lambda i: (sum(1 for o in m['owners'] if o == i), -((i - $r) % 3)))")
  epoch=$(map_query "m['epoch']")
  [[ $victim =~ ^[0-2]$ && $epoch =~ ^[0-9]+$ ]] || fail "kill round $r: no map in etcd ($victim, $epoch)"
  kill -0 $load_out 2>/dev/null && kill -0 $load_in 2>/dev/null ||
    fail "kill round $r: the load ended before the kill rounds (raise history_load's --seconds)"
  kill -KILL "${spid[victim]}" || fail "kill round $r: kill server $victim"
  wait "${spid[victim]}" 2>/dev/null
  # Out of the cleanup list: its pid may be reused.
  alive=()
  for p in "${pids[@]}"; do [[ $p == "${spid[victim]}" ]] || alive+=("$p"); done
  pids=("${alive[@]}")
  t2=$SECONDS
  wait_for 20 "m['epoch'] > $epoch and all(o != $victim for o in m['owners']) and all($victim not in x for x in reps)" ||
    fail "kill round $r: server $victim's shards were not promoted within 20 s: $(map_query m)"
  promoted=$((SECONDS - t2))
  start_server "$victim"
  wait_for 60 "$full" ||
    fail "kill round $r: server $victim did not come back as a replica of every shard within 60 s: $(map_query m)"
  echo "kill round $r: server $victim SIGKILLed in its namespace; promoted within ${promoted} s, R=3 again $((SECONDS - t2)) s after the kill"
done
sleep 1
touch "$work/stop"
wait $load_out; rc_out=$?
wait $load_in; rc_in=$?
cat "$work/load_out.txt" "$work/load_in.txt" | grep -v "^[IWE][0-9]"
# Unknown outcomes make the check exponential: a client stuck on a dead address must re-route.
unknown_out=$(python3 -c 'import json,sys; print(sum(1 for l in open(sys.argv[1]) if json.loads(l)["outcome"] == "unknown" and json.loads(l)["op"] != "get"))' "$work/h_out.jsonl")
echo "writes of unknown outcome (root namespace): $unknown_out"
[ "$unknown_out" -lt 200 ] || fail "$unknown_out writes of unknown outcome: clients did not re-route"
[ $rc_out = 0 ] || fail "the root-namespace load failed ($rc_out)"
# The clients inside lost every server but their own for a while: errors are expected there;
# what they recorded must still fit the history.
cat "$work/h_out.jsonl" "$work/h_in.jsonl" >"$work/h.jsonl"
inside_ok=$(grep -c '"outcome":"ok"' "$work/h_in.jsonl")
[ "$inside_ok" -gt 10 ] || fail "the clients inside server 0's namespace completed only $inside_ok ops"
timeout 300 "$LIN" "$work/h.jsonl" >"$work/lin.out" 2>&1 || { head -n 30 "$work/lin.out"; fail "the history is not linearizable"; }
head -n 3 "$work/lin.out"
grep -q "committed map epoch" "$work/coord0.log" "$work/coord1.log" || fail "no coordinator decision logged"
echo "PASSED: partitioned primary fenced, promoted elsewhere, rejoined as a backup; ${RDKV_NETNS_KILL_ROUNDS:-3} SIGKILLed primaries replaced; history (both client groups) linearizable"
