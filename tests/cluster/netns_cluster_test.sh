#!/usr/bin/env bash
# A 3-server cluster over tcp in which each kvserver runs in its own network namespace (veth
# pairs; 10.77.x.0/24 per namespace, the host end in the root namespace), client (kvcli) in the
# root namespace: keys spread over every server, any server as seed, one server killed (its keys
# fail naming it, the others work) and restarted (served again).
# Usage: netns_cluster_test.sh BUILD_DIR. Exit 77 (SKIPPED) when namespaces cannot be made.
set -u
export TZ=${TZ:-UTC}  # glog formats times with mktime: racy under TSan without TZ
B=${1:?usage: netns_cluster_test.sh BUILD_DIR}
KV=$B/server/kvserver
CLI=$B/tools/kvcli
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
[ -x "$KV" ] && [ -x "$CLI" ] || fail "build kvserver and kvcli first ($KV, $CLI)"
command -v ip >/dev/null || skip "no ip(8)"
[ "$(id -u)" = 0 ] || skip "needs root for ip netns"

tag=rk$$
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  for i in 0 1 2; do
    ip link del ${tag}h$i 2>/dev/null
    ip netns del ${tag}n$i 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add ${tag}n0 2>"$work/err" || skip "ip netns add not permitted: $(cat "$work/err")"

base=$(( ($$ % 80) * 3 + 10 ))   # 10.77.<base+i>.0/24: distinct for concurrent runs
addr() { echo "10.77.$((base + $1)).2"; }
for i in 0 1 2; do
  [ $i = 0 ] || ip netns add ${tag}n$i || fail "ip netns add ${tag}n$i"
  ip link add ${tag}h$i type veth peer name ${tag}p$i || skip "cannot create veth pairs"
  ip link set ${tag}p$i netns ${tag}n$i
  ip addr add 10.77.$((base + i)).1/24 dev ${tag}h$i
  ip link set ${tag}h$i up
  ip netns exec ${tag}n$i ip addr add "$(addr $i)/24" dev ${tag}p$i
  ip netns exec ${tag}n$i ip link set ${tag}p$i up
  ip netns exec ${tag}n$i ip link set lo up
done
cat > "$work/map.json" <<JSON
{"epoch": 1, "shards": 24, "servers": [
  {"id": 0, "address": "$(addr 0):7400"}, {"id": 1, "address": "$(addr 1):7400"},
  {"id": 2, "address": "$(addr 2):7400"}]}
JSON
start() {
  ip netns exec ${tag}n$1 "$KV" --host="$(addr $1)" --port=7400 --transport=tcp --memory=32MiB --huge_pages=false \
    --cluster_map="$work/map.json" --server_id=$1 --data_dir="$work/data$1" --durability=none \
    >"$work/s$1.log" 2>&1 &
  pids[$1]=$!
}
cli() { "$CLI" --transport=tcp --timeout_ms=2000 --connect_timeout_ms=1000 "$@"; }
wait_up() {
  for _ in $(seq 100); do cli --server="$(addr $1):7400" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  cat "$work/s$1.log"; fail "server $1 did not come up"
}
for i in 0 1 2; do start $i; done
for i in 0 1 2; do wait_up $i; done
echo "3 servers up in namespaces ${tag}n0..2 at $(addr 0), $(addr 1), $(addr 2)"

N=60
for k in $(seq $N); do cli --server="$(addr 0):7400" put key$k value$k >/dev/null || fail "put key$k"; done
cli --server="$(addr 1):7400" --json stats --all >"$work/stats.json" || fail "stats --all"
python3 - "$work/stats.json" <<'PY' || fail "keys not spread over all servers"
import json, sys
j = json.load(open(sys.argv[1]))
items = [s["stats"]["items"] for s in j["per_server"]]
print("items per server:", items)
assert len(items) == 3 and all(n > 0 for n in items) and sum(items) == 60, items
PY
for seed in 0 1 2; do
  for k in $(seq $N); do
    v=$(cli --server="$(addr $seed):7400" get key$k) || fail "get key$k via seed $seed"
    [ "$v" = "value$k" ] || fail "key$k via seed $seed: '$v'"
  done
done
cli --server="$(addr 2):7400" cluster || fail "kvcli cluster"
echo "all operations ok from every seed"

kill "${pids[1]}"; wait "${pids[1]}" 2>/dev/null; pids[1]=
ok=0; bad=0
for k in $(seq $N); do
  if cli --server="$(addr 0):7400" get key$k >/dev/null 2>"$work/err"; then
    ok=$((ok + 1))
  else
    grep -q "server 1 ($(addr 1):7400)" "$work/err" || fail "key$k: error does not name server 1: $(cat "$work/err")"
    bad=$((bad + 1))
  fi
done
echo "server 1 down: $ok keys served, $bad failed naming server 1"
[ $ok -gt 0 ] && [ $bad -gt 0 ] || fail "expected both served and failed keys"
cli --server="$(addr 0):7400" cluster >"$work/cl" 2>&1; cat "$work/cl"
grep -q "UNREACHABLE" "$work/cl" || fail "kvcli cluster does not show server 1 down"

start 1; wait_up 1
for k in $(seq $N); do cli --server="$(addr 2):7400" put key$k again$k >/dev/null || fail "put key$k after restart"; done
for k in $(seq $N); do
  v=$(cli --server="$(addr 0):7400" get key$k) || fail "get key$k after restart"
  [ "$v" = "again$k" ] || fail "key$k after restart: '$v'"
done
echo "server 1 restarted: every key served again"

# One client (an interactive kvcli session) that keeps running while server 2 is killed and
# restarted: errors only for server 2's keys, then it reconnects by itself.
{
  for k in $(seq $N); do echo "put key$k live$k"; done
  # Kill only once every put has its answer (a slow, sanitized client may still be working).
  for _ in $(seq 600); do
    [ "$(wc -l <"$work/live.out" 2>/dev/null || echo 0)" -ge $N ] && break
    sleep 0.1
  done
  kill "${pids[2]}"
  for _ in $(seq 100); do kill -0 "${pids[2]}" 2>/dev/null || break; sleep 0.1; done
  for k in $(seq $N); do echo "get key$k"; done
  start 2
  echo "${pids[2]}" >"$work/pid2"
  wait_up 2 >&2
  sleep 0.7  # the client retries a down server at most every 500 ms
  for k in $(seq $N); do echo "put key$k back$k"; done
  for k in $(seq $N); do echo "get key$k"; done
} | cli --server="$(addr 0):7400" --json >"$work/live.out" 2>"$work/live.err"
pids[2]=$(cat "$work/pid2")
python3 - "$work/live.out" "$N" "$(addr 2):7400" <<'PY' || fail "the running client did not ride out server 2's restart"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
n, addr2 = int(sys.argv[2]), sys.argv[3]
assert len(lines) == 4 * n, len(lines)
assert all(l["ok"] for l in lines[:n]), "puts before the kill"
down = lines[n:2 * n]
served = [l for l in down if l["ok"]]
failed = [l for l in down if not l["ok"]]
for l in served:
    assert l["value"] == "live" + l["key"][3:], l
for l in failed:
    assert addr2 in l["message"], l
print(f"server 2 down: {len(served)} keys served, {len(failed)} failed naming {addr2}")
assert served and failed
assert all(l["ok"] for l in lines[2 * n:3 * n]), [l for l in lines[2 * n:3 * n] if not l["ok"]][:3]
for l in lines[3 * n:]:
    assert l["ok"] and l["value"] == "back" + l["key"][3:], l
print("server 2 restarted: the same client served every key again")
PY
echo PASSED
