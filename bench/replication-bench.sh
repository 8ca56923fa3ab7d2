#!/usr/bin/env bash
# What primary-backup replication costs (issue 11): write throughput and p50/p99 latency with
# replication factor R = 1, 2, 3 in one run, as ratios to R = 1; GET throughput with each R
# (GETs are one-sided READs of the primary: replication should not change them); and the rate
# of the catch-up copy that `kvcli cluster add-replica` makes while writes go on.
#
#   bench/replication-bench.sh [--records N] [--ops N] [--threads N] [--shards N] [--out DIR]
#
# Options:
#   --records N        records loaded for the R runs (default 10000; 10 fields x 100 B each)
#   --ops N            operations per measured run (default 20000)
#   --threads N        kvbench client threads, one operation in flight each (default 16)
#   --shards N         shards in the map (default 24)
#   --repeat N         rounds of R = 1, 2, 3 (interleaved; the table shows medians; default 3)
#   --copy-records N   records of 100 B loaded for the catch-up copy (default 200000; 0 skips it)
#   --no-roles         skip the role split (below)
#   --worker-threads N kvserver --worker_threads (default 16: a primary's worker waits for its
#                      backups' answers, so more workers keep more writes in flight)
#   --memory SIZE      kvserver --memory (default 256MiB)
#   --server-flags "F" more kvserver flags, split on spaces (e.g. "--busy_poll_us=0")
#   --client-props "P" more kvbench properties, split on spaces (e.g. "rdkv.busy_poll_us=0")
#   --server-cpus A/B/C pin server 0, 1, 2 to these CPU lists (taskset -c; e.g. 0-3/4-7/8-11):
#                      a machine per server on one many-core host, so that a backup's work is
#                      not taken from its primary's cores; default: no pinning
#   --client-cpus LIST pin kvbench and kvcli to this CPU list (e.g. 12-15); default: no pinning
#   --build DIR        build dir with server/kvserver, tools/kvcli, bench/kvbench/kvbench
#                      (default build/ci, else build/default); nothing is built
#   --out DIR          keep every raw output there (kvbench reports, kvcli JSON, server logs,
#                      the maps, the table); default: a temporary dir, removed at the end
#
# Each R: 3 kvservers (tcp, 127.0.0.1, free ports, each its own --data_dir, durability none)
# with a map of epoch 1, servers 0..2, shard s's primary s % 3 and its backups the next R - 1
# servers; kvbench loads the records, then runs 100 % updates (uniform keys), YCSB A and YCSB
# C (zipfian), in that order. The catch-up: R = 2, COPY_RECORDS records of one 100-byte field,
# then `kvcli --json cluster add-replica S (S + 2) % 3` for every shard S, one after the
# other, while a kvbench 100 % update load runs.
#
# The role split: 100 % updates with every shard's primary on server 0 and its backups on servers
# 1..R-1 (R = 1, 2, 3, --repeat rounds), so that each process has one role: the CPU per write
# of the primary alone and of each backup (from /proc/PID/stat). With one machine per server,
# the primary's CPU per write is what bounds a shard's write throughput.
#
# Prints the host (nproc, load average before and after), one table of figures with their
# ratios to R = 1 (medians over the rounds), server and client CPU per 1000 operations, the
# role split and the catch-up rates. Everything it starts is stopped on exit (Ctrl-C and SIGTERM included).
set -euo pipefail
cd "$(dirname "$0")/.."
PROG=replication-bench.sh

RECORDS=10000 OPS=20000 THREADS=16 SHARDS=24 REPEAT=3 COPY_RECORDS=200000 WORKERS=16
MEMORY=256MiB BUILD="" OUT="" ROLES=1 SERVER_CPUS="" CLIENT_CPUS="" SERVER_FLAGS="" CLIENT_PROPS=""
die() { echo "$PROG: error: $*" >&2; exit 2; }
note() { echo "$PROG: $*" >&2; }
usage() { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "$1"; }
while (($# > 0)); do
  case $1 in
    -h | --help) usage 0 ;;
    --no-roles) ROLES=0; shift; continue ;;
    --records | --ops | --threads | --shards | --repeat | --copy-records | --worker-threads | \
      --memory | --build | --out | --server-cpus | --client-cpus | --server-flags | --client-props)
      (($# >= 2)) || die "$1 needs a value (usage: --help)"
      case $1 in
        --server-cpus) SERVER_CPUS=$2 ;; --client-cpus) CLIENT_CPUS=$2 ;;
        --records) RECORDS=$2 ;; --ops) OPS=$2 ;; --threads) THREADS=$2 ;;
        --shards) SHARDS=$2 ;; --repeat) REPEAT=$2 ;; --copy-records) COPY_RECORDS=$2 ;;
        --worker-threads) WORKERS=$2 ;; --memory) MEMORY=$2 ;; --build) BUILD=$2 ;;
        --out) OUT=$2 ;; --server-flags) SERVER_FLAGS=$2 ;; --client-props) CLIENT_PROPS=$2 ;;
      esac
      shift 2 ;;
    *) echo "$PROG: unknown argument '$1'" >&2; usage 2 >&2 ;;
  esac
done
CLIENT_PROP_ARGS=()
for p in $CLIENT_PROPS; do
  [[ $p == *=* ]] || die "--client-props: '$p' is not NAME=VALUE"
  CLIENT_PROP_ARGS+=(-p "$p")
done
uint() { if ! [[ $2 =~ ^[0-9]+$ ]] || (($2 < $3)); then die "$1=$2: an integer >= $3"; fi; }
uint --records "$RECORDS" 1
uint --ops "$OPS" 1
uint --threads "$THREADS" 1
uint --shards "$SHARDS" 1
((SHARDS <= 4096)) || die "--shards=$SHARDS: at most 4096"
uint --repeat "$REPEAT" 1
uint --copy-records "$COPY_RECORDS" 0
uint --worker-threads "$WORKERS" 1

# Pinning: PIN_SRV[i] and PIN_CLI are command prefixes (empty: not pinned).
declare -a PIN_SRV=("" "" "")
PIN_CLI=()
if [[ -n $SERVER_CPUS$CLIENT_CPUS ]]; then
  command -v taskset >/dev/null || die "--server-cpus/--client-cpus need taskset (util-linux)"
fi
cpulist_ok() { [[ $1 =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]]; }
if [[ -n $SERVER_CPUS ]]; then
  IFS=/ read -r -a _sc <<<"$SERVER_CPUS"
  ((${#_sc[@]} == 3)) || die "--server-cpus=$SERVER_CPUS: three CPU lists separated by '/'"
  for i in 0 1 2; do
    cpulist_ok "${_sc[i]}" || die "--server-cpus: '${_sc[i]}' is not a CPU list (e.g. 0-3 or 0,2)"
    PIN_SRV[i]="taskset -c ${_sc[i]}"
  done
fi
if [[ -n $CLIENT_CPUS ]]; then
  cpulist_ok "$CLIENT_CPUS" || die "--client-cpus=$CLIENT_CPUS is not a CPU list (e.g. 12-15)"
  PIN_CLI=(taskset -c "$CLIENT_CPUS")
fi

if [[ -z $BUILD ]]; then
  BUILD=build/ci
  [[ -x $BUILD/server/kvserver ]] || BUILD=build/default
fi
KVSERVER=$BUILD/server/kvserver KVCLI=$BUILD/tools/kvcli KVB=$BUILD/bench/kvbench/kvbench
for b in "$KVSERVER" "$KVCLI" "$KVB"; do
  [[ -x $b ]] || die "$b not found; build it: cmake --build $BUILD --target kvserver kvcli kvbench"
done
kvcli_help=$("$KVCLI" --help 2>&1 || true)
if [[ $kvcli_help != *"cluster add-replica"* ]]; then
  note "SKIPPED the catch-up copy: $KVCLI has no 'cluster add-replica'"
  COPY_RECORDS=0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-replbench.XXXXXX")
if [[ -n $OUT ]]; then
  mkdir -p "$OUT" || die "cannot create --out $OUT"
  OUT=$(cd "$OUT" && pwd)
else
  OUT=$work/out
  mkdir -p "$OUT"
fi
# shellcheck source=bench/lib/servers.sh
source bench/lib/servers.sh
BG_PID=""
cleanup() {
  if [[ -n $BG_PID ]]; then kill -TERM "$BG_PID" 2>/dev/null || true; wait "$BG_PID" 2>/dev/null || true; fi
  stop_servers
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- servers ---------------------------------------------------------------------------------
# write_map FILE R [single]: epoch 1, servers 0..2, shard s: primary s % 3, backups the next
# R - 1; with "single", every shard's primary is server 0 and its backups servers 1..R-1 (the
# role split: each process then has one role).
write_map() {
  local f=$1 r=$2 single=${3:-} s i sep p
  {
    printf '{"epoch": 1, "shards": %d,\n "servers": [' "$SHARDS"
    for i in 0 1 2; do
      printf '%s{"id": %d, "address": "127.0.0.1:%d"}' "$([[ $i -gt 0 ]] && echo ', ')" "$i" "${PORTS[i]}"
    done
    printf '],\n "owners": ['
    for ((s = 0; s < SHARDS; s++)); do
      p=$((s % 3))
      [[ -n $single ]] && p=0
      printf '%s%d' "$([[ $s -gt 0 ]] && echo ', ')" "$p"
    done
    printf '],\n "replicas": ['
    for ((s = 0; s < SHARDS; s++)); do
      sep="["
      p=$((s % 3))
      [[ -n $single ]] && p=0
      ((s > 0)) && printf ', '
      for ((i = 0; i < r; i++)); do printf '%s%d' "$sep" $(((p + i) % 3)); sep=", "; done
      printf ']'
    done
    printf ']}\n'
  } >"$f"
}
# start_cluster NAME R [single]: 3 servers with a map of replication factor R (write_map);
# sets SRV_PID, SEED. A port taken by someone else meanwhile: again with new ports (3 tries).
start_cluster() {
  for _ in 1 2 3; do
    start_cluster_once "$@" && return 0
    note "$1: a port was taken before the server bound it; again with new ports"
  done
  die "$1: the servers could not bind their ports in 3 tries"
}
# start_cluster_once NAME R [single]: returns 1 when a server could not bind its port.
start_cluster_once() {
  local name=$1 r=$2 single=${3:-} i d t
  stop_servers
  pick_ports 3
  d=$work/$name
  rm -rf "$d"
  mkdir -p "$d"
  write_map "$d/map.json" "$r" "$single"
  cp "$d/map.json" "$OUT/$name-map.json"
  for i in 0 1 2; do
    mkdir -p "$d/server-$i"
    # shellcheck disable=SC2086  # the pinning prefix splits on purpose
    ${PIN_SRV[i]} "$KVSERVER" --host=127.0.0.1 --port="${PORTS[i]}" --port_file="$d/server-$i/port" \
      --transport=tcp --memory="$MEMORY" --cluster_map="$d/map.json" --server_id="$i" \
      --data_dir="$d/server-$i" --durability=none --worker_threads="$WORKERS" $SERVER_FLAGS \
      </dev/null >"$OUT/$name-server-$i.log" 2>&1 &
    SRV_PID[i]=$!
  done
  SEED=127.0.0.1:${PORTS[0]}
  for i in 0 1 2; do
    for ((t = 0; ; t++)); do
      if ! kill -0 "${SRV_PID[i]}" 2>/dev/null; then
        if grep -q 'Address already in use' "$OUT/$name-server-$i.log"; then
          stop_servers
          return 1
        fi
        tail -n 15 "$OUT/$name-server-$i.log" >&2
        die "server $i of $name exited during start"
      fi
      if [[ -s $d/server-$i/port ]] &&
        timeout 10 "$KVCLI" --server="127.0.0.1:${PORTS[i]}" --transport=tcp ping >/dev/null 2>&1; then
        break
      fi
      ((t < 300)) || die "server $i of $name did not answer within 30 s (log: $OUT/$name-server-$i.log)"
      sleep 0.1
    done
  done
  return 0
}

HZ=$(getconf CLK_TCK)
srv_ticks() {  # user + system ticks of every server, summed
  local p s=0 v
  for p in "${SRV_PID[@]}"; do
    v=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)
    s=$((s + v))
  done
  echo "$s"
}
# srv_switches: context switches (voluntary + involuntary) of every thread of every server.
srv_switches() {
  local p
  for p in "${SRV_PID[@]}"; do cat /proc/"$p"/task/*/status 2>/dev/null || true; done |
    awk '/^(voluntary|nonvoluntary)_ctxt_switches:/ {s += $2} END {print s + 0}'
}

# srv_ticks_each: user + system ticks of each server, space-separated (server 0 first).
srv_ticks_each() {
  local p out=""
  for p in "${SRV_PID[@]}"; do
    out+="$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0) "
  done
  echo "$out"
}

# srv_thread_ticks: user + system ticks of every server thread, summed by thread name (kvserver
# names its threads: rdkv-nic, rdkv-worker, rdkv-repl-send, ...), one "name ticks" per line.
# A thread that exits during a run takes its ticks with it (the long-lived ones do not exit).
srv_thread_ticks() {
  local p t
  for p in "${SRV_PID[@]}"; do
    for t in /proc/"$p"/task/*; do
      # stat's fields after the ")" that ends the name: utime is the 12th, stime the 13th.
      printf '%s %s\n' "$(cat "$t/comm" 2>/dev/null)" \
        "$(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{print $12 + $13}')"
    done
  done | awk 'NF == 2 {s[$1] += $2} END {for (k in s) print k, s[k]}' | sort
}

# kvb NAME ARGS...: one kvbench run against SEED (its report to $OUT/NAME.txt); sets SRV_CPU and
# CLI_CPU (CPU seconds of the servers and of kvbench during it), SRV_CPU_EACH (each server's,
# space-separated), SRV_CSW (the servers' context switches during it) and WALL (its seconds).
kvb() {
  local name=$1 before after csw_before rc each_before
  shift
  before=$(srv_ticks)
  each_before=$(srv_ticks_each)
  csw_before=$(srv_switches)
  srv_thread_ticks >"$work/threads-before"
  local t0 t1
  t0=$(date +%s.%N)
  set +e
  (
    "${PIN_CLI[@]}" "$KVB" "$@" -db rdkv -p rdkv.seed="$SEED" -p rdkv.transport=tcp -p status.interval=0 \
      "${CLIENT_PROP_ARGS[@]}" >"$OUT/$name.txt" 2>"$OUT/$name.err"
    rc=$?
    times >"$work/times"
    exit $rc
  )
  rc=$?
  set -e
  t1=$(date +%s.%N)
  WALL=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
  after=$(srv_ticks)
  SRV_CPU_EACH=$(awk -v a="$each_before" -v b="$(srv_ticks_each)" -v hz="$HZ" 'BEGIN {
    n = split(a, x, " "); split(b, y, " ")
    for (i = 1; i <= n; i++) printf "%s%.3f", (i > 1 ? " " : ""), (y[i] - x[i]) / hz }')
  SRV_CSW=$(($(srv_switches) - csw_before))
  # CPU seconds of each thread name during the run: $OUT/NAME.threads ("name seconds").
  srv_thread_ticks | awk -v hz="$HZ" 'NR == FNR {b[$1] = $2; next} {printf "%s %.3f\n", $1, ($2 - b[$1]) / hz}' \
    "$work/threads-before" - >"$OUT/$name.threads"
  # 3: the run finished but some operations failed; they are counted in the table's errors.
  if ((rc == 3)); then
    note "kvbench $name: some operations failed (see $OUT/$name.txt)"
  elif ((rc != 0)); then
    tail -n 5 "$OUT/$name.txt" "$OUT/$name.err" >&2
    die "kvbench $name failed (exit $rc)"
  fi
  SRV_CPU=$(awk -v a="$before" -v b="$after" -v hz="$HZ" 'BEGIN {printf "%.3f", (b - a) / hz}')
  CLI_CPU=$(awk 'function sec(t) { sub(/s$/, "", t); split(t, a, "m"); return a[1] * 60 + a[2] }
    NR == 2 {printf "%.3f", sec($1) + sec($2)}' "$work/times")
}
# field FILE SECTION NAME: a value of kvbench's report ("[SECTION], NAME, VALUE").
field() { awk -F', ' -v s="[$2]" -v n="$3" '$1 == s && $2 == n {print $3; exit}' "$1"; }

# --- the R runs ------------------------------------------------------------------------------
echo "host: $(nproc) CPUs, $(uname -r); uptime before: $(uptime)"
echo "pinning: servers ${SERVER_CPUS:-none} (0/1/2), client ${CLIENT_CPUS:-none}"
echo "settings: $RECORDS records of 10 x 100 B, $OPS operations per run, $THREADS client threads, $SHARDS shards, 3 servers (tcp, durability none, $WORKERS worker threads), $REPEAT round(s)"
ROWS=$work/rows  # lines: workload op R round ops/s p50 p99 srv_us/op cli_us/op errors srv_csw/op
#   srv_cores busiest_srv_cores cli_cores (CPUs busy: CPU seconds / wall seconds)
: >"$ROWS"
THREAD_ROWS=$work/thread-rows  # lines: R round thread-name us/op (100 % updates)
: >"$THREAD_ROWS"
WORKLOADS=(update "-P bench/workloads/workloada -p readproportion=0 -p updateproportion=1 -p requestdistribution=uniform"
  A "-P bench/workloads/workloada"
  C "-P bench/workloads/workloadc")
for ((round = 1; round <= REPEAT; round++)); do
  for r in 1 2 3; do
    start_cluster "r$r-round$round" "$r"
    kvb "r$r-round$round-load" load -P bench/workloads/workloada -p recordcount="$RECORDS" -threads "$THREADS"
    for ((w = 0; w < ${#WORKLOADS[@]}; w += 2)); do
      wl=${WORKLOADS[w]}
      name=r$r-round$round-$wl
      # shellcheck disable=SC2086  # the workload's arguments split on purpose
      kvb "$name" run ${WORKLOADS[w + 1]} -p recordcount="$RECORDS" -p operationcount="$OPS" -threads "$THREADS"
      f=$OUT/$name.txt
      errs=$(awk -F', ' '/\], Return=/ && !/Return=OK/ && !/Return=NOT_FOUND/ {s += $3} END {print s + 0}' "$f")
      tput=$(field "$f" OVERALL "Throughput(ops/sec)")
      nops=$(field "$f" OVERALL Operations)
      for op in UPDATE READ; do
        p50=$(field "$f" "$op" "50thPercentileLatency(us)")
        [[ -n $p50 ]] || continue
        p99=$(field "$f" "$op" "99thPercentileLatency(us)")
        opn=$(field "$f" "$op" Operations)
        # ops/s of this op type: its share of the run's throughput.
        echo "$wl $op $r $round $(awk -v t="$tput" -v o="$opn" -v n="$nops" 'BEGIN {printf "%.1f", t * o / n}') $p50 $p99 \
$(awk -v c="$SRV_CPU" -v n="$nops" 'BEGIN {printf "%.1f", 1e6 * c / n}') \
$(awk -v c="$CLI_CPU" -v n="$nops" 'BEGIN {printf "%.1f", 1e6 * c / n}') $errs \
$(awk -v c="$SRV_CSW" -v n="$nops" 'BEGIN {printf "%.1f", c / n}') \
$(awk -v s="$SRV_CPU" -v e="$SRV_CPU_EACH" -v c="$CLI_CPU" -v w="$WALL" 'BEGIN {
  n = split(e, x, " "); m = 0; for (i = 1; i <= n; i++) if (x[i] + 0 > m) m = x[i] + 0
  printf "%.2f %.2f %.2f", s / w, m / w, c / w }')" >>"$ROWS"
      done
      if [[ $wl == update ]]; then
        # The servers' CPU per write by thread name: "R round name us/op".
        awk -v r="$r" -v round="$round" -v n="$nops" '{printf "%s %s %s %.2f\n", r, round, $1, 1e6 * $2 / n}' \
          "$OUT/$name.threads" >>"$THREAD_ROWS"
      fi
      note "round $round R=$r $wl: $tput ops/s (servers ${SRV_CPU} CPU-s, client ${CLI_CPU} CPU-s)"
    done
  done
done
stop_servers

# The table: medians over the rounds, ratios of the medians to R = 1.
TABLE=$work/table
awk '
  function median(key,    n, i, j, t, a) {
    n = split(vals[key], a, " ")
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function add(key, v) { vals[key] = (key in vals) ? vals[key] " " v : v }
  {
    k = $1 SUBSEP $2 SUBSEP $3
    if (!(($1 SUBSEP $2) in seen)) { seen[$1 SUBSEP $2] = 1; order[++no] = $1 SUBSEP $2 }
    add(k SUBSEP "t", $5); add(k SUBSEP "p50", $6); add(k SUBSEP "p99", $7)
    add(k SUBSEP "s", $8); add(k SUBSEP "c", $9); err[k] += $10; add(k SUBSEP "x", $11)
    add(k SUBSEP "sb", $12); add(k SUBSEP "mb", $13); add(k SUBSEP "cb", $14)
  }
  END {
    print "| workload | op | R | ops/s | p50 us | p99 us | ops/s vs R=1 | p50 vs R=1 | p99 vs R=1 | servers CPU us/op | client CPU us/op | servers switches/op | errors | servers CPUs busy | busiest server CPUs busy | client CPUs busy |"
    print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= no; i++) {
      split(order[i], wo, SUBSEP)
      b = order[i] SUBSEP 1
      bt = median(b SUBSEP "t"); b50 = median(b SUBSEP "p50"); b99 = median(b SUBSEP "p99")
      for (r = 1; r <= 3; r++) {
        k = order[i] SUBSEP r
        if (!((k SUBSEP "t") in vals)) continue
        t = median(k SUBSEP "t"); p50 = median(k SUBSEP "p50"); p99 = median(k SUBSEP "p99")
        printf "| %s | %s | %d | %.0f | %.1f | %.1f | %.2f | %.2f | %.2f | %.1f | %.1f | %.1f | %d | %.2f | %.2f | %.2f |\n",
          wo[1], wo[2], r, t, p50, p99, (bt > 0 ? t / bt : 0), (b50 > 0 ? p50 / b50 : 0),
          (b99 > 0 ? p99 / b99 : 0), median(k SUBSEP "s"), median(k SUBSEP "c"), median(k SUBSEP "x"), err[k],
          median(k SUBSEP "sb"), median(k SUBSEP "mb"), median(k SUBSEP "cb")
      }
    }
  }' "$ROWS" >"$TABLE"
cp "$ROWS" "$OUT/rows.txt"

# --- the role split --------------------------------------------------------------------------
ROLE_TABLE=$work/roles
: >"$ROLE_TABLE"
if ((ROLES)); then
  ROLE_ROWS=$work/role-rows  # lines: R round ops/s primary_us backup1_us backup2_us
  : >"$ROLE_ROWS"
  for ((round = 1; round <= REPEAT; round++)); do
    for r in 1 2 3; do
      name=roles-r$r-round$round
      start_cluster "$name" "$r" single
      kvb "$name-load" load -P bench/workloads/workloada -p recordcount="$RECORDS" -threads "$THREADS"
      kvb "$name-update" run -P bench/workloads/workloada -p readproportion=0 -p updateproportion=1 \
        -p requestdistribution=uniform -p recordcount="$RECORDS" -p operationcount="$OPS" -threads "$THREADS"
      f=$OUT/$name-update.txt
      tput=$(field "$f" OVERALL "Throughput(ops/sec)")
      nops=$(field "$f" OVERALL Operations)
      echo "$r $round $tput $(awk -v e="$SRV_CPU_EACH" -v n="$nops" 'BEGIN {
        split(e, c, " "); printf "%.1f %.1f %.1f", 1e6 * c[1] / n, 1e6 * c[2] / n, 1e6 * c[3] / n }')" >>"$ROLE_ROWS"
      note "role split round $round R=$r: $tput ops/s (servers ${SRV_CPU_EACH} CPU-s)"
    done
  done
  stop_servers
  cp "$ROLE_ROWS" "$OUT/role-rows.txt"
  awk '
    function median(key,    n, i, j, t, a) {
      n = split(vals[key], a, " ")
      for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
      return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function add(key, v) { vals[key] = (key in vals) ? vals[key] " " v : v }
    { add($1 SUBSEP "t", $3); add($1 SUBSEP "p", $4); add($1 SUBSEP "b1", $5); add($1 SUBSEP "b2", $6) }
    END {
      print "| R | ops/s | primary CPU us/write | backup 1 CPU us/write | backup 2 CPU us/write | primary vs R=1 | primary-bound writes/s per core |"
      print "|---:|---:|---:|---:|---:|---:|---:|"
      p1 = median(1 SUBSEP "p")
      for (r = 1; r <= 3; r++) {
        if (!((r SUBSEP "t") in vals)) continue
        p = median(r SUBSEP "p")
        printf "| %d | %.0f | %.1f | %.1f | %.1f | %.2f | %.0f |\n", r, median(r SUBSEP "t"), p,
          median(r SUBSEP "b1"), median(r SUBSEP "b2"), (p1 > 0 ? p / p1 : 0), (p > 0 ? 1e6 / p : 0)
      }
    }' "$ROLE_ROWS" >"$ROLE_TABLE"
fi

# --- the catch-up copy -----------------------------------------------------------------------
COPY_LINE=""
if ((COPY_RECORDS > 0)); then
  start_cluster copy 2
  kvb copy-load load -P bench/workloads/workloada -p recordcount="$COPY_RECORDS" -p fieldcount=1 \
    -p fieldlength=100 -threads "$THREADS"
  load_tput=$(field "$OUT/copy-load.txt" OVERALL "Throughput(ops/sec)")
  # The update load during the copy: runs until killed, a status line every second.
  "${PIN_CLI[@]}" "$KVB" run -db rdkv -p rdkv.seed="$SEED" -p rdkv.transport=tcp -P bench/workloads/workloada \
    -p readproportion=0 -p updateproportion=1 -p requestdistribution=uniform \
    -p recordcount="$COPY_RECORDS" -p fieldcount=1 -p fieldlength=100 -p operationcount=0 \
    -p maxexecutiontime=3600 -p status.interval=1 -threads 4 "${CLIENT_PROP_ARGS[@]}" \
    >"$OUT/copy-updates.txt" 2>"$OUT/copy-updates.err" &
  BG_PID=$!
  sleep 2
  copy_t0=$(date +%s.%N)
  items=0 bytes=0 secs=0
  : >"$OUT/copy-add-replica.json"
  for ((s = 0; s < SHARDS; s++)); do
    to=$(((s + 2) % 3))
    if ! timeout 600 "${PIN_CLI[@]}" "$KVCLI" --seed="$SEED" --transport=tcp --json cluster add-replica "$s" "$to" \
      >"$work/add.json" 2>"$work/add.err"; then
      cat "$work/add.json" "$work/add.err" >&2
      die "kvcli cluster add-replica $s $to failed"
    fi
    cat "$work/add.json" >>"$OUT/copy-add-replica.json"
    cat "$work/add.err" >>"$OUT/copy-add-replica.err"
    read -r i b c < <(tr ',{}' '\n' <"$work/add.json" | awk -F: '
      $1 ~ /"items_copied"/ {i = $2} $1 ~ /"bytes_copied"/ {b = $2} $1 ~ /"copy_seconds"/ {c = $2}
      END {print i + 0, b + 0, c + 0}')
    items=$((items + i)) bytes=$((bytes + b))
    secs=$(awk -v a="$secs" -v c="$c" 'BEGIN {print a + c}')
  done
  copy_t1=$(date +%s.%N)
  sleep 1
  kvb_alive=1
  kill -0 "$BG_PID" 2>/dev/null || kvb_alive=0
  kill -TERM "$BG_PID" 2>/dev/null || true
  wait "$BG_PID" 2>/dev/null || true
  BG_PID=""
  ((kvb_alive)) || { tail -n 5 "$OUT/copy-updates.txt" "$OUT/copy-updates.err" >&2; die "the update load stopped during the copy"; }
  stop_servers
  # Update rate during the copy: from the status lines inside [copy_t0, copy_t1] (wall clock).
  upd=$(awk -v t0="$copy_t0" -v t1="$copy_t1" '
    / sec: [0-9]+ operations;/ {
      split($2, hms, ":"); cmd = "date -d \"" $1 " " substr($2, 1, 8) "\" +%s"; cmd | getline e; close(cmd)
      t = e + substr($2, 10) / 1000
      for (k = 1; k < NF; k++) if ($k == "sec:") n = $(k + 1)
      if (t >= t0 && t <= t1) { if (!have) { ta = t; na = n; have = 1 } tb = t; nb = n }
    }
    END { if (have && tb > ta) printf "%.0f", (nb - na) / (tb - ta); else print "-" }' "$OUT/copy-updates.err")
  COPY_LINE=$(awk -v i="$items" -v b="$bytes" -v s="$secs" -v w="$(awk -v a="$copy_t0" -v b="$copy_t1" 'BEGIN {print b - a}')" \
    -v n="$SHARDS" -v u="$upd" -v lt="$load_tput" 'BEGIN {
      printf "| %d | %d | %.1f | %.2f | %.2f | %.0f | %.2f | %.0f | %s | %.0f |", n, i, b / 1048576, s, w,
        (s > 0 ? i / s : 0), (s > 0 ? b / 1048576 / s : 0), (w > 0 ? i / w : 0), u, lt }')
fi

# --- report ----------------------------------------------------------------------------------
{
  echo
  echo "## replication: R = 1, 2, 3 (medians of $REPEAT round(s); ratios to R = 1)"
  cat "$TABLE"
  echo
  echo "ops/s: of that op type (its share of the run's throughput); p50/p99: kvbench's latency per op type;"
  echo "CPU: CPU microseconds per operation of the whole run (= ms per 1000 operations; servers: all 3 summed, from /proc/PID/stat; client: the kvbench process; 10 ms ticks); switches: context switches of all the servers' threads per operation; errors: failed operations over all rounds; CPUs busy: CPU seconds / wall seconds of the run (all servers, the busiest server, kvbench): a process near the CPUs it is pinned to bounds the run."
  echo
  echo "## the servers' CPU per write by thread, 100 % updates (us per write, all 3 servers, medians of $REPEAT round(s))"
  awk '
    function median(s,    n, i, j, t, a) {
      n = split(s, a, " ")
      for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
      return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { k = $1 SUBSEP $3; v[k] = (k in v) ? v[k] " " $4 : $4; names[$3] = 1; rs[$1] = 1 }
    END {
      nn = 0
      for (x in names) list[++nn] = x
      for (i = 2; i <= nn; i++) for (j = i; j > 1 && list[j - 1] > list[j]; j--) { t = list[j]; list[j] = list[j - 1]; list[j - 1] = t }
      printf "| R |"; for (i = 1; i <= nn; i++) printf " %s |", list[i]; print " all |"
      printf "|---:|"; for (i = 1; i <= nn; i++) printf "---:|"; print "---:|"
      for (r = 1; r <= 3; r++) {
        if (!(r in rs)) continue
        printf "| %d |", r; sum = 0
        for (i = 1; i <= nn; i++) {
          k = r SUBSEP list[i]
          m = (k in v) ? median(v[k]) : 0; sum += m
          printf " %.2f |", m
        }
        printf " %.2f |\n", sum
      }
    }' "$THREAD_ROWS"
  echo "(from /proc/PID/task/TID/stat of every server thread, by the name kvserver gives it; 10 ms ticks; a thread that exited during a run is missing)"
  if ((ROLES)); then
    echo
    echo "## role split: 100 % updates, every shard's primary on server 0, backups on 1..R-1 (medians of $REPEAT round(s))"
    cat "$ROLE_TABLE"
    echo "(CPU per write of each process from /proc/PID/stat, 10 ms ticks; server 1 and 2 idle below their R; the last column is 1e6 / the primary's us per write: the primary's bound with a core of its own)"
  fi
  if ((COPY_RECORDS > 0)); then
    echo
    echo "## catch-up copy: R = 2 -> 3, kvcli cluster add-replica per shard while 4 threads update"
    echo "| shards | items copied | MiB copied | copy s (sum) | wall s | items/s | MiB/s | items/s (wall) | updates/s during the copy | load ops/s (R=2) |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    echo "$COPY_LINE"
    echo "(MiB: keys + values as kvcli reports bytes_copied; copy s: kvcli's copy_seconds summed over the shards)"
  fi
  echo
  echo "uptime after: $(uptime); nproc: $(nproc)"
} | tee "$OUT/table.md"
