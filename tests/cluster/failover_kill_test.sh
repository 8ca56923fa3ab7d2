#!/usr/bin/env bash
# Automatic failover under load (issue #12, docs/design.md "Failover"): a 3-server cluster
# (RDKV_FAILOVER_SERVERS=N for more; map in etcd, R=3, two kvcoord coordinators, etcd lease TTL 2 s; a killed process is found by the coordinators' probes), clients recording a mix of
# GET/PUT/INSERT/CAS/DELETE on a small hot key set, while a primary is killed with SIGKILL
# round after round (the server with the most primaries, so a different one each time), and
# restarted once the coordinator has promoted its backups (round 2 also kills the elected
# coordinator at the same moment: the other one takes over). Each round waits for the promotion,
# with more than 3 servers for the replication factor to be restored on the survivors, and then
# for it to be restored with the restarted server (it rejoins as a catching-up replica). Then lincheck: the whole history must be linearizable (no acknowledged
# write lost, no stale or invented read). Prints per round: kill -> the promoted map seen, kill ->
# writes answered again (end of the longest gap in answers), kill -> R on the survivors (more
# than 3 servers), restart -> R in-sync replicas again;
# and p50/max of each (bench/failover-bench.sh runs it with more rounds).
#
#   failover_kill_test.sh BUILD_DIR HISTORY_LOAD LINCHECK [ROUNDS] [DURABILITY] [OUT_DIR]
# Exit 77 (SKIPPED) when etcd or python3 is missing or no ports are free.
set -uo pipefail
build=$1 load=$2 lincheck=$3 rounds=${4:-4} durability=${5:-none} out_dir=${6:-}
# In the Soft-RoCE VM (tests/rxe/verbs-suite.sh): RDKV_FAILOVER_TRANSPORT=verbs and
# RDKV_FAILOVER_HOST=the rxe address; the coordinators then detect by the lease alone (no probes).
transport=${RDKV_FAILOVER_TRANSPORT:-tcp} host=${RDKV_FAILOVER_HOST:-127.0.0.1}
# The VM's CPU is emulated (20-50x slower): there the suite sets a longer etcd lease TTL
# (RDKV_FAILOVER_LEASE_TTL; at 2 s the servers could not renew in time and fenced themselves
# over and over), multiplies every deadline of this test by RDKV_FAILOVER_TIME_SCALE, polls etcd
# every RDKV_FAILOVER_POLL_S (one HTTP request each: etcd_map_wait.py) and passes
# RDKV_COORD_EXTRA_FLAGS (e.g. a slower coordinator poll) to deploy/local-cluster.sh.
lease_ttl=${RDKV_FAILOVER_LEASE_TTL:-2} scale=${RDKV_FAILOVER_TIME_SCALE:-1}
poll_s=${RDKV_FAILOVER_POLL_S:-0.05}
[[ $lease_ttl =~ ^[1-9][0-9]*$ && $scale =~ ^[1-9][0-9]*$ ]] ||
  { echo "FAIL: RDKV_FAILOVER_LEASE_TTL and RDKV_FAILOVER_TIME_SCALE must be positive integers"; exit 1; }
# bench/failover-bench.sh: RDKV_FAILOVER_SERVERS (3..6; 2 shards each), extra history_load
# flags (RDKV_FAILOVER_LOAD_FLAGS, e.g. --pin_keys) and RDKV_FAILOVER_REBALANCE=1 (primaries
# spread again before each kill) for the unaffected shards' throughput.
nservers=${RDKV_FAILOVER_SERVERS:-3}
[[ $nservers =~ ^[3-6]$ ]] || { echo "FAIL: RDKV_FAILOVER_SERVERS must be 3..6"; exit 1; }
read -ra load_flags <<<"${RDKV_FAILOVER_LOAD_FLAGS:-}"
# shellcheck source=../deploy/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/lib.sh"
LC=$DEPLOY_TEST_ROOT/deploy/local-cluster.sh
command -v etcd >/dev/null || skip "etcd is not installed (deploy/install-deps.sh installs it)"
command -v etcdctl >/dev/null || skip "etcdctl is not installed (deploy/install-deps.sh installs it)"
command -v python3 >/dev/null || skip "python3 is not installed"
# The interpreter itself: a version manager's shim (pyenv) is a bash script that costs tens of
# milliseconds of CPU per start, which the failover bench would count against the cluster.
py=$(python3 -c 'import sys; print(sys.executable)') && [[ -x $py ]] || py=python3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ -x $build/coordinator/kvcoord ]] || { echo "FAIL: $build/coordinator/kvcoord not built"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-failover.XXXXXX")
load_pid=""
cleanup() {
  [[ -n $load_pid ]] && kill "$load_pid" 2>/dev/null
  [[ -n ${map_pid:-} ]] && kill "$map_pid" 2>/dev/null
  "$LC" stop "$work/c" >/dev/null 2>&1
  if [[ -n $out_dir ]]; then mkdir -p "$out_dir" && cp -r "$work"/. "$out_dir"/ 2>/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT

base=$(free_base_port 8) || skip "no free port range found"
export RDKV_BIN=$build RDKV_HOST=$host RDKV_BASE_PORT=$base RDKV_METRICS_BASE_PORT=off
export RDKV_SHARDS=$((2 * nservers)) RDKV_TRANSPORT=$transport RDKV_MEMORY=64MiB RDKV_DURABILITY=$durability
export RDKV_REPLICATION=3 RDKV_ETCD=local RDKV_ETCD_PORT=$((base + 6)) RDKV_CLUSTER_NAME=fo
export RDKV_COORDINATORS=2 RDKV_ETCD_LEASE_TTL=$lease_ttl
unset RDKV_CLUSTER_DIR RDKV_EXTRA_FLAGS RDKV_AUTH_TOKEN RDKV_ADMIN_TOKEN
expect_rc 0 "start $nservers servers, R=3, map in etcd, 2 coordinators, durability $durability" \
  "$LC" start "$nservers" "$work/c"
etcd_ep=127.0.0.1:$((base + 6))
# map_state: "EPOCH COORDINATED PRIMARIES... | INSYNC_COUNTS... | JOINING_TOTAL" of the map in etcd.
map_json() { ETCDCTL_API=3 etcdctl --endpoints="$etcd_ep" get /rdkv/fo/map --print-value-only 2>/dev/null; }
map_query() {  # map_query PYTHON_EXPR_OVER_m -> its value
  map_json | "$py" -c "import json,sys
m=json.load(sys.stdin); sh=m['shards']; reps=m.get('replicas') or [[o] for o in m['owners']]
joining=sum(len(v) for v in (m.get('joining') or {}).values())
print($1)" 2>/dev/null
}
# The test's clock and its waits on the map: one coprocess for the whole test, one HTTP request
# per poll (etcd_map_wait.py). Polling with etcdctl and python3, or even one interpreter start
# per wait, took the CPU that the failover bench measures the unaffected shards by.
coproc MAPQ { exec "$py" "$here/etcd_map_wait.py" "$etcd_ep" /rdkv/fo/map "$poll_s" $((2 * scale)); }
map_in=${MAPQ[1]} map_out=${MAPQ[0]} map_pid=$MAPQ_PID
# A write to the coprocess after it died: a failure of the test (with cleanup), not a SIGPIPE
# that would end the shell without its EXIT trap.
trap 'bad "the map coprocess (etcd_map_wait.py) died"; exit 1' PIPE
mapq() {  # mapq REQUEST [SECONDS] -> its answer in $MAPQ_ANSWER; 1 when none came in time
  MAPQ_ANSWER=""
  kill -0 "$map_pid" 2>/dev/null || { bad "the map coprocess (etcd_map_wait.py) is not running"; exit 1; }
  printf '%s\n' "$1" >&"$map_in" && IFS= read -r -t "${2:-10}" MAPQ_ANSWER <&"$map_out"
}
# wait_for SECONDS PYTHON_CONDITION -> 0 when it held in time (SECONDS x scale); waited_ns: the
# monotonic time of the etcd read that showed it.
waited_ns=0
wait_for() {
  mapq "wait $(($1 * scale)) $2" $(($1 * scale + 10)) || return 1
  case $MAPQ_ANSWER in
    ok\ *) waited_ns=${MAPQ_ANSWER#ok } ;;
    error*) echo "wait_for: $MAPQ_ANSWER" >&2; return 1 ;;
    *) return 1 ;;
  esac
}
all_admitted="m.get('coordinated', False) and all(s.get('incarnation', 0) for s in m['servers'])"
full="all(len(r) == 3 for r in reps) and joining == 0"
check "the coordinator admits every server" wait_for 20 "$all_admitted"
# A slow start (an overloaded host: leases lost, servers dropped) may leave shards below R: the
# first kill would strand them.
check "every shard has 3 in-sync replicas" wait_for 60 "$full"

"$load" --seed="$host:$base" --transport="$transport" --threads=8 --keys=16 --seconds=900 --stop_file="$work/stop" \
  --out="$work/h.jsonl" --keys_out="$work/keys.txt" "${load_flags[@]}" >"$work/load.out" 2>&1 &
load_pid=$!
sleep 1.5
: >"$work/rounds.txt"
kvcli=$build/tools/kvcli
for ((r = 1; r <= rounds; r++)); do
  if [[ -n ${RDKV_FAILOVER_REBALANCE:-} ]]; then
    # Bench only: primaries back to shard s -> server s % N (a failover moves them to the
    # survivors and none comes back by itself; without this, a few rounds leave one server
    # primary of every shard and no shard unaffected), then a quiet second before the kill.
    for ((s = 0; s < 2 * nservers; s++)); do
      want=$((s % nservers))
      [[ $(map_query "m['owners'][$s] != $want and $want in reps[$s]") == True ]] || continue
      "$kvcli" --seed="$host:$base" --transport="$transport" cluster promote "$s" "$want" \
        >/dev/null 2>&1 || bad "round $r: rebalance: promote server $want for shard $s"
    done
    sleep 1.2
  fi
  victim=$(map_query "max(range(len(m['servers'])), key=lambda i: (sum(1 for o in m['owners'] if o == i), -((i - $r) % $nservers)))")
  epoch=$(map_query "m['epoch']")
  map_json >"$work/map-before-$r.json"  # which shards the kill affects (failover_analysis.py)
  pid=$(cat "$work/c/server-$victim/pid")
  coord_pid=""
  if ((r == 2)); then
    # Round 2 also kills the elected coordinator with the server: the other one must be elected
    # and finish the failover.
    leader=$(ETCDCTL_API=3 etcdctl --endpoints="$etcd_ep" get /rdkv/fo/coordinator --print-value-only |
      "$py" -c 'import json,sys; print(json.load(sys.stdin)["name"])' 2>/dev/null)
    [[ -n $leader && -f $work/c/$leader/pid ]] && coord_pid=$(cat "$work/c/$leader/pid")
    [[ -n $coord_pid ]] || bad "round $r: no elected coordinator found"
  fi
  # The clock is read just before the signal (the builtin kill follows at once).
  mapq now
  t_kill=$MAPQ_ANSWER
  kill -KILL "$pid" || { bad "round $r: kill server $victim (pid $pid)"; break; }
  if [[ -n $coord_pid ]]; then
    kill -KILL "$coord_pid" && ok "round $r: killed the elected coordinator ($leader) with server $victim"
  fi
  printf '=== %(%F %T)T failover_kill_test: SIGKILL to pid %s\n' -1 "$pid" >>"$work/c/server-$victim/kvserver.log"
  if ! wait_for 15 "m['epoch'] > $epoch and all(o != $victim for o in m['owners']) and all($victim not in x for x in reps)"; then
    bad "round $r: server $victim's shards were not promoted within $((15 * scale)) s"
    break
  fi
  t_promoted=$waited_ns
  # With more than 3 servers the survivors can hold every replica: the coordinator restores
  # R before the victim comes back (kill -> R restored, the issue's second failover time).
  t_restored=0
  if ((nservers > 3)); then
    if ! wait_for 30 "$full"; then
      bad "round $r: R=3 was not restored on the survivors within $((30 * scale)) s: $(map_json)"
      break
    fi
    t_restored=$waited_ns
  fi
  sleep 0.5
  mapq now
  t_restart=$MAPQ_ANSWER
  # Until it is gone or a zombie (in the VM nothing reaps it: kill -0 alone waited forever).
  while :; do
    st=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || st=gone
    [[ $st =~ ^(Z|X|gone|)$ ]] && break
    sleep 0.05
  done
  "$LC" restart "$victim" "$work/c" >/dev/null || { bad "round $r: restart server $victim"; break; }
  if ! wait_for 60 "$full and all(s.get('incarnation', 0) for s in m['servers'])"; then
    bad "round $r: the replication factor was not restored within $((60 * scale)) s: $(map_json)"
    break
  fi
  t_full=$waited_ns
  echo "$r $victim $t_kill $t_promoted $t_restart $t_full $t_restored" >>"$work/rounds.txt"
  ok "round $r: killed server $victim; promoted in $(((t_promoted - t_kill) / 1000000)) ms; R=3 again $(((t_full - t_restart) / 1000000)) ms after its restart"
done
# Operations under the same load: the coordinator's events, and a drain for maintenance.
# Up to 3 tries: under sanitizers on a loaded host one etcd range read once took over kvcli's 2 s.
events() {
  local i
  for i in 1 2 3; do
    "$kvcli" --etcd="$etcd_ep" --cluster_name=fo cluster events && return 0
    sleep 1
  done
  return 2
}
expect_rc 0 "kvcli cluster events" events
contains "  ... lists the failovers" "failover"
contains "  ... and the elections" "elected"
busy=$(map_query "max(range(len(m['servers'])), key=lambda i: sum(1 for o in m['owners'] if o == i))")
expect_rc 0 "kvcli cluster drain $busy under load" "$kvcli" --seed="$host:$base" --transport="$transport" \
  cluster drain "$busy"
check "  ... server $busy is primary of no shard" wait_for 10 "all(o != $busy for o in m['owners'])"
if ((nservers == 3)); then
  check "  ... and still an in-sync replica of every shard" wait_for 10 "all($busy in r for r in reps)"
else  # with more servers than R it was never a replica of every shard
  check "  ... and every shard still has 3 in-sync replicas" wait_for 10 "$full"
fi
touch "$work/stop"
wait "$load_pid"
rc=$?
load_pid=""
cat "$work/load.out"
check "history_load exited 0" test "$rc" = 0
ops=$(wc -l <"$work/h.jsonl")
check "history_load recorded ops ($ops)" test "$ops" -gt 100
expect_rc 0 "lincheck: linearizable across $rounds kills" timeout $((300 * scale)) "$lincheck" "$work/h.jsonl"
head -n 12 <<<"$OUT"
# Failover times: kill -> the promoted map seen in etcd, kill -> writes answered again (the end
# of the longest gap without a definite write answer: what clients see), restart -> R restored.
python3 - "$work/rounds.txt" "$work/h.jsonl" <<'PY' | tee "$work/failover-times.txt"
import json, sys
rounds = [list(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
# Writes answered with a definite outcome (ok, not_found, exists, version_mismatch), by time.
answers = sorted(op["complete"] for op in map(json.loads, open(sys.argv[2]))
                 if op.get("op") != "get" and op.get("outcome") not in ("unknown", "fail"))
def stats(name, xs):
    xs = sorted(xs)
    if not xs:
        print(f"{name}: no data"); return
    print(f"{name}: p50 {xs[len(xs) // 2]:.0f} ms, max {xs[-1]:.0f} ms, n {len(xs)}")
promote, back, restore, survivors = [], [], [], []
for r, victim, t_kill, t_prom, t_restart, t_full, t_restored in rounds:
    promote.append((t_prom - t_kill) / 1e6)
    restore.append((t_full - t_restart) / 1e6)
    if t_restored:
        survivors.append((t_restored - t_kill) / 1e6)
    # The outage clients saw: the longest stretch without a definite write answer that begins
    # within 3 s of the kill; writes flow again at its end.
    window = [t for t in answers if t_kill <= t <= t_restart]
    gap_start, gap_end, prev = t_kill, t_kill, t_kill
    for t in window + [t_restart]:
        if t - prev > gap_end - gap_start and prev <= t_kill + 3e9:
            gap_start, gap_end = prev, t
        prev = t
    back.append((gap_end - t_kill) / 1e6)
    print(f"round {r}: server {victim}: promoted map seen {promote[-1]:.0f} ms after the kill; "
          f"writes stopped {(gap_end - gap_start) / 1e6:.0f} ms, flowing again {back[-1]:.0f} ms "
          f"after the kill; "
          + (f"R=3 on the survivors {survivors[-1]:.0f} ms after the kill; " if t_restored else "")
          + f"R=3 again {restore[-1]:.0f} ms after the restart")
stats("kill -> promoted map seen (+ the test's etcd poll period, 50 ms by default)", promote)
stats("kill -> writes flowing again (end of the longest gap in write answers)", back)
if survivors:
    stats("kill -> replication factor restored on the survivors (+ the test's etcd poll period, 50 ms by default)",
          survivors)
stats("restart -> replication factor restored", restore)
PY
if ((rounds >= 2)); then
  check "a second coordinator was elected after the first was killed" \
    bash -c "cat $work/c/coord-*/kvcoord.log | grep -c ': elected' | awk '{exit !(\$1 >= 2)}'"
fi
finish
