#!/usr/bin/env bash
# GET and PUT throughput of a local rdkv cluster with 1, 2 and 3 servers (tcp transport), with
# the same kvbench load for every size: YCSB workload C (100 % reads) and a 100 %-update
# workload, uniform keys, CLIENTS client processes of THREADS threads each, client i seeded at
# server i mod N (the clients are spread; every client reaches every server it needs).
#
#   bench/cluster-scaling.sh                       uncapped: servers and clients share the host
#   SERVER_CPU=0.1 bench/cluster-scaling.sh        each kvserver capped at 0.1 CPU (a cgroup each)
#
# Environment (all optional):
#   SERVERS        cluster sizes to run (default "1 2 3")
#   RECORDS        records loaded (default 1000; few enough that every client's location cache
#                  is warm after WARMUP even at a low throughput)
#   WARMUP         seconds each workload runs before measuring (default 3)
#   DURATION       seconds measured per workload (default 10)
#   CLIENTS        client processes (default 3)
#   THREADS_PER_SERVER  threads per client process for each server (default 24): with N servers
#                  every client process runs N x 24 threads, so each server sees the same load
#                  (CLIENTS connections with 24 requests in flight each, on average) whatever N;
#                  that is what shows whether capacity grows with servers. Deep enough that a
#                  server finds many requests per wakeup, so its CPU per request stays the same
#   THREADS        a fixed number of threads per client process instead, whatever N: then each
#                  server sees 1/N of the load, and on tcp a server busy with fewer requests
#                  per wakeup spends more CPU per request (see docs/benchmarks.md)
#   SERVER_CPU     CPU budget of each kvserver, in CPUs (e.g. 0.1, 0.5, 1): every server runs in
#                  its own cgroup with that quota, standing in for a machine of its own, so a
#                  server's capacity does not depend on how many servers share this host.
#                  cgroup v1 (cpu.cfs_quota_us) or v2 (cpu.max); when neither is writable the
#                  run goes on uncapped and says so. Empty (default): no cap.
#   CPU_PERIOD_US  the quota's period (default 10000 = 10 ms, or longer where the quota would
#                  be under the kernel's 1 ms minimum: 20000 for SERVER_CPU=0.05), so a
#                  throttled server waits some ms, not up to the kernel default's 100 ms
#   SERVER_SHARES  cpu.shares (v1) / cpu.weight x10 (v2) of the server cgroups (default 8192,
#                  i.e. 8x a normal process): a capped server gets its budget even while other
#                  work loads the host; it can never take more than SERVER_CPU
#   CLIENT_SHARES  put the client processes in one cgroup with this cpu.shares (v1; v2: weight
#                  x10 / 1024), no quota: on a host busy with other work the clients then still
#                  get the CPU they need, so the servers stay the bottleneck. Default: not used.
#   CGROUP_PARENT  cgroup directory to create the server cgroups under (default: the root of
#                  the cpu hierarchy; give a delegated one when the root is not writable)
#   CLIENT_CPUS    taskset CPU list for the client processes (e.g. 1); default: not pinned
#   SERVER_CPUS    taskset CPU list for the servers (e.g. 0); default: not pinned
#   BUILD          build dir holding server/kvserver and bench/kvbench/kvbench (default
#                  build/default; it is built first unless NO_BUILD=1)
#   RDKV_BASE_PORT first server port (default 7600)
#   OUT_DIR        keep every kvbench report there (n<servers>-<get|put>-client<i>.txt)
#
# Prints two markdown tables: GET and PUT ops/s per cluster size (summed over the clients) with
# the ratio to the first size; and per size and workload the CPU each server used (how often
# its cgroup ran out of quota), server and client CPU per operation, the CPU the host left idle
# and READs per GET; plus the load average before and after. Everything it started (servers,
# clients, cgroups, the state dir) is removed on exit, also on Ctrl-C or SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
PROG=cluster-scaling.sh
SERVERS=${SERVERS:-"1 2 3"}
RECORDS=${RECORDS:-1000}
WARMUP=${WARMUP:-3}
DURATION=${DURATION:-10}
OUT_DIR=${OUT_DIR:-}
CLIENTS=${CLIENTS:-3}
THREADS=${THREADS:-}
THREADS_PER_SERVER=${THREADS_PER_SERVER:-24}
SERVER_CPU=${SERVER_CPU:-}
CPU_PERIOD_US=${CPU_PERIOD_US:-}
SERVER_SHARES=${SERVER_SHARES:-8192}
CGROUP_PARENT=${CGROUP_PARENT:-}
CLIENT_SHARES=${CLIENT_SHARES:-}
CLIENT_CPUS=${CLIENT_CPUS:-}
SERVER_CPUS=${SERVER_CPUS:-}
BUILD=${BUILD:-build/default}
PORT=${RDKV_BASE_PORT:-7600}

die() { echo "$PROG: error: $*" >&2; exit 2; }
note() { echo "$PROG: $*" >&2; }
uint() { [[ $2 =~ ^[0-9]+$ ]] && (($2 >= 1)) || die "$1=$2: a positive integer"; }
uint RECORDS "$RECORDS"
uint WARMUP "$WARMUP"
uint DURATION "$DURATION"
[[ -z ${OPS:-} ]] || die "OPS is gone: the runs are timed (WARMUP + DURATION seconds per workload)"
uint CLIENTS "$CLIENTS"
[[ -z $THREADS ]] || uint THREADS "$THREADS"
uint THREADS_PER_SERVER "$THREADS_PER_SERVER"
[[ -z $CPU_PERIOD_US ]] || uint CPU_PERIOD_US "$CPU_PERIOD_US"
uint SERVER_SHARES "$SERVER_SHARES"
[[ -z $CLIENT_SHARES ]] || uint CLIENT_SHARES "$CLIENT_SHARES"
for n in $SERVERS; do [[ $n =~ ^[1-9]$ ]] || die "SERVERS: '$n' is not 1..9"; done
if [[ -n $SERVER_CPU ]]; then
  [[ $SERVER_CPU =~ ^[0-9]*\.?[0-9]+$ ]] && awk -v c="$SERVER_CPU" 'BEGIN {exit !(c > 0)}' ||
    die "SERVER_CPU=$SERVER_CPU: a number of CPUs above 0 (e.g. 0.05)"
  [[ -n $CPU_PERIOD_US ]] ||
    CPU_PERIOD_US=$(awk -v c="$SERVER_CPU" 'BEGIN {p = 10000; m = int(1000 / c + 0.999); print (m > p ? m : p)}')
  QUOTA_US=$(awk -v c="$SERVER_CPU" -v p="$CPU_PERIOD_US" 'BEGIN {printf "%d", c * p + 0.5}')
  ((QUOTA_US >= 1000)) || die "SERVER_CPU=$SERVER_CPU x CPU_PERIOD_US=$CPU_PERIOD_US is under the kernel's 1 ms minimum quota; raise CPU_PERIOD_US"
fi
for v in CLIENT_CPUS SERVER_CPUS; do
  if [[ -n ${!v} ]]; then
    command -v taskset >/dev/null || die "$v needs taskset (util-linux)"
    taskset -c "${!v}" true 2>/dev/null || die "$v=${!v}: not a CPU list taskset accepts here"
  fi
done

if [[ ${NO_BUILD:-0} != 1 ]]; then
  [[ $BUILD != build/default || -f $BUILD/build.ninja ]] || cmake --preset default >/dev/null
  cmake --build "$BUILD" --target kvserver kvcli kvbench >/dev/null
fi
KVB=$BUILD/bench/kvbench/kvbench
[[ -x $KVB ]] || die "$KVB not found (BUILD=$BUILD)"

if [[ -n $OUT_DIR ]]; then mkdir -p "$OUT_DIR" || die "cannot create OUT_DIR=$OUT_DIR"; fi
state=$(mktemp -d)
export RDKV_CLUSTER_DIR=$state RDKV_BASE_PORT=$PORT RDKV_BIN=$BUILD
CG_MODE=none CG_BASE="" CG_WHY="" SERVER_CAPPED=0 CLIENT_CG=""
cleanup() {
  local f p d t killed=()
  for f in "$state"/pid[0-9]*; do  # clients still running (interrupted): only the ones we started
    [[ -f $f ]] || continue
    p=$(cat "$f")
    if [[ $(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") == *kvbench* ]]; then
      kill "$p" 2>/dev/null && killed+=("$p")
    fi
  done
  for p in "${killed[@]}"; do  # gone before their cgroup is removed
    for ((t = 0; t < 30; t++)); do
      [[ -e /proc/$p/cmdline && -n $(tr -d '\0' 2>/dev/null <"/proc/$p/cmdline") ]] || break
      sleep 0.1
    done
  done
  deploy/local-cluster.sh stop >/dev/null 2>&1 || true
  if [[ -n $CG_BASE && -d $CG_BASE ]]; then
    for d in "$CG_BASE"/server-* "$CG_BASE"/clients; do
      if [[ -d $d ]] && ! rmdir "$d" 2>/dev/null; then note "could not remove cgroup $d"; fi
    done
    rmdir "$CG_BASE" 2>/dev/null || note "could not remove cgroup $CG_BASE"
  fi
  rm -rf "$state"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- cgroups: one per server, each with a CPU quota ----------------------------------------
# cg_setup: sets CG_MODE (v1, v2 or none) and CG_BASE; CG_WHY says why none.
cg_setup() {
  local v1=${CGROUP_PARENT:-} v2="" root
  if [[ -z $v1 ]]; then
    for root in /sys/fs/cgroup/cpu /sys/fs/cgroup/cpu,cpuacct; do
      [[ -f $root/cpu.cfs_quota_us ]] && { v1=$root; break; }
    done
    if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then v2=/sys/fs/cgroup; fi
  elif [[ -f $v1/cgroup.controllers ]]; then
    v2=$v1 v1=""
  elif [[ ! -f $v1/cpu.cfs_quota_us ]]; then
    CG_WHY="CGROUP_PARENT=$CGROUP_PARENT is neither a cgroup v1 cpu nor a cgroup v2 directory"
    return
  fi
  if [[ -n $v1 ]]; then
    CG_BASE=$v1/rdkv-bench-$$
    if mkdir "$CG_BASE" 2>/dev/null; then
      CG_MODE=v1
      return
    fi
    CG_WHY="cannot create $CG_BASE (cgroup v1 cpu controller not writable)"
    CG_BASE=""
  fi
  if [[ -n $v2 ]]; then
    if ! grep -qw cpu "$v2/cgroup.controllers"; then
      CG_WHY="${CG_WHY:+$CG_WHY; }cgroup v2 at $v2 does not offer the cpu controller"
      return
    fi
    grep -qw cpu "$v2/cgroup.subtree_control" 2>/dev/null ||
      echo +cpu >"$v2/cgroup.subtree_control" 2>/dev/null || true
    CG_BASE=$v2/rdkv-bench-$$
    if mkdir "$CG_BASE" 2>/dev/null && echo +cpu >"$CG_BASE/cgroup.subtree_control" 2>/dev/null; then
      CG_MODE=v2
      return
    fi
    CG_WHY="${CG_WHY:+$CG_WHY; }cannot create $CG_BASE with the cpu controller enabled (cgroup v2 not writable or not delegated; try CGROUP_PARENT)"
    if [[ -d $CG_BASE ]]; then rmdir "$CG_BASE" 2>/dev/null || true; fi
    CG_BASE=""
  fi
  [[ -n $CG_WHY ]] || CG_WHY="no cgroup cpu controller found under /sys/fs/cgroup"
}

# cg_weight DIR SHARES: cpu.shares (v1) or the matching cpu.weight (v2) of DIR.
cg_weight() {
  if [[ $CG_MODE == v1 ]]; then
    echo "$2" >"$1/cpu.shares"
  else
    local w=$(($2 * 100 / 1024))
    echo $((w < 1 ? 1 : w > 10000 ? 10000 : w)) >"$1/cpu.weight"
  fi
}

# cg_make I: the cgroup of server I, with the quota (created once, reused by every cluster size).
cg_make() {
  local d=$CG_BASE/server-$1
  [[ -d $d ]] && return 0
  mkdir "$d"
  if [[ $CG_MODE == v1 ]]; then
    echo "$CPU_PERIOD_US" >"$d/cpu.cfs_period_us"
    echo "$QUOTA_US" >"$d/cpu.cfs_quota_us"
  else
    echo "$QUOTA_US $CPU_PERIOD_US" >"$d/cpu.max"
  fi
  cg_weight "$d" "$SERVER_SHARES"
}

if [[ -n $SERVER_CPU || -n $CLIENT_SHARES ]]; then
  cg_setup
  if [[ $CG_MODE == none ]]; then
    [[ -z $SERVER_CPU ]] || note "SKIPPED the CPU cap (SERVER_CPU=$SERVER_CPU): $CG_WHY. The servers run uncapped."
    [[ -z $CLIENT_SHARES ]] || note "SKIPPED CLIENT_SHARES=$CLIENT_SHARES: $CG_WHY."
  else
    [[ -z $SERVER_CPU ]] || SERVER_CAPPED=1
    if [[ -n $CLIENT_SHARES ]]; then
      CLIENT_CG=$CG_BASE/clients
      mkdir "$CLIENT_CG"
      cg_weight "$CLIENT_CG" "$CLIENT_SHARES"
    fi
  fi
fi

# --- measuring -------------------------------------------------------------------------------
HZ=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }  # user+sys, all threads
# cg_periods I: "<periods> <throttled periods>" of server I's cgroup so far ("0 0" uncapped).
cg_periods() {
  if ((!SERVER_CAPPED)); then echo "0 0"; return; fi
  awk '$1 == "nr_periods" {p = $2} $1 == "nr_throttled" {t = $2} END {print p + 0, t + 0}' \
    "$CG_BASE/server-$1/cpu.stat"
}
host_idle() { awk '$1 == "cpu" {print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }

# run_clients N NAME WORKLOAD-ARGS...: runs the clients for WARMUP + DURATION seconds and
# measures the last DURATION seconds (so every client's location cache is warm, whatever the
# throughput). Sets OPS_S (ops/s summed over the clients), READS_PER_GET, CLIENT_CPU (CPUs all
# clients used together), HOST_IDLE (CPUs idle on the host) and per server SRV_CPU[i] (CPUs
# used) and SRV_THR[i] (% of quota periods in which its cgroup was throttled).
run_clients() {
  local n=$1 name=$2
  shift 2
  local i f pids=() t_w t_e threads=${THREADS:-$((THREADS_PER_SERVER * n))}
  local -a c_w p_w
  local idle_w
  for ((i = 0; i < CLIENTS; i++)); do
    (
      if [[ -n $CLIENT_CG ]]; then echo "$BASHPID" >"$CLIENT_CG/cgroup.procs"; fi
      "${CLIENT_TASKSET[@]}" "$KVB" run -db rdkv -p rdkv.seed="127.0.0.1:$((PORT + i % n))" \
        -p rdkv.transport=tcp -p recordcount="$RECORDS" -p requestdistribution=uniform \
        -p operationcount=0 -p maxexecutiontime=$((WARMUP + DURATION)) \
        -p status.interval="$WARMUP" -threads "$threads" "$@" >"$state/out$i" 2>"$state/err$i" &
      echo $! >"$state/pid$i"
      wait $! || exit 1
      # `times` prints the CPU of this subshell's finished children: the client's user and sys.
      times >"$state/times$i"
    ) &
    pids+=($!)
  done
  sleep "$WARMUP"
  # The start of the measured window: the clients' first status line (printed at WARMUP s)
  # gives their operation counts at this point.
  t_w=$(date +%s%N)
  for ((i = 0; i < n; i++)); do
    c_w[i]=$(cpu_ticks "${SRV_PID[i]}")
    p_w[i]=$(cg_periods "$i")
  done
  local cli_w=0
  for ((i = 0; i < CLIENTS; i++)); do
    f=$state/pid$i
    [[ -f $f ]] && cli_w=$((cli_w + $(cpu_ticks "$(cat "$f")")))
  done
  idle_w=$(host_idle)
  local failed=0
  for i in "${!pids[@]}"; do
    if ! wait "${pids[i]}"; then
      failed=1
      echo "$PROG: client $i failed; last lines of its output:" >&2
      tail -n 5 "$state/out$i" "$state/err$i" | sed 's/^/    /' >&2
    fi
  done
  ((failed == 0)) || exit 1
  t_e=$(date +%s%N)
  local wall idle_e
  idle_e=$(host_idle)
  wall=$(awk -v a="$t_w" -v b="$t_e" 'BEGIN {print (b - a) / 1e9}')
  for ((i = 0; i < n; i++)); do
    SRV_CPU[i]=$(awk -v a="${c_w[i]}" -v b="$(cpu_ticks "${SRV_PID[i]}")" -v hz="$HZ" -v w="$wall" \
      'BEGIN {printf "%.2f", (b - a) / hz / w}')
    SRV_THR[i]=$(echo "${p_w[i]} $(cg_periods "$i")" |
      awk '{printf "%.0f", ($3 > $1 ? 100 * ($4 - $2) / ($3 - $1) : 0)}')
  done
  HOST_IDLE=$(echo "$idle_w $idle_e" | awk -v c="$(nproc)" '{printf "%.2f", ($4 > $2 ? c * ($3 - $1) / ($4 - $2) : 0)}')
  local errs
  errs=$(cat "$state"/out* | awk -F', ' '/\], Return=/ && !/Return=OK/ && !/Return=NOT_FOUND/ {s += $3}
    /\[RDKV\], ClientErrors/ {s += $3} END {print s + 0}')
  ((errs == 0)) || note "$errs failed operations in this run (see the kvbench outputs)"
  # Per client: (operations at the end - operations at the first status line) / the time between.
  OPS_S=0
  for ((i = 0; i < CLIENTS; i++)); do
    local ops_w
    ops_w=$(awk '/ sec: [0-9]+ operations;/ {for (k = 1; k < NF; k++) if ($k == "sec:") {print $(k + 1); exit}}' \
      "$state/err$i")
    [[ -n $ops_w ]] || die "client $i printed no status line at ${WARMUP} s (see $state/err$i)"
    OPS_S=$(awk -F', ' -v w="$ops_w" -v warm="$WARMUP" -v sum="$OPS_S" '
      /\[OVERALL\], RunTime/ {t = $3 / 1000} /\[OVERALL\], Operations/ {o = $3}
      END {printf "%.0f", sum + (t > warm ? (o - w) / (t - warm) : 0)}' "$state/out$i")
  done
  READS_PER_GET=$(cat "$state"/out* | awk -F', ' '/\[RDKV\], GETs/ {g += $3} /\[RDKV\], READs,/ {r += $3}
    END {printf "%.2f", (g > 0 ? r / g : 0)}')
  CLIENT_CPU=$(cat "$state"/times* | awk -v w="$wall" -v hz="$HZ" -v before="$cli_w" '
    function sec(t) { sub(/s$/, "", t); split(t, a, "m"); return a[1] * 60 + a[2] }
    NR % 2 == 0 {s += sec($1) + sec($2)} END {printf "%.2f", (s - before / hz) / w}')
  if [[ -n $OUT_DIR ]]; then
    for ((i = 0; i < CLIENTS; i++)); do
      cat "$state/out$i" "$state/err$i" >"$OUT_DIR/n$n-$name-client$i.txt"
    done
  fi
  rm -f "$state"/out* "$state"/err* "$state"/times* "$state"/pid[0-9]*
}

# cpu_row N WORKLOAD: the CPU table's row for the last run.
cpu_row() {
  local n=$1 i each="" sum=0 thr=0
  for ((i = 0; i < n; i++)); do
    each+="${each:+ / }${SRV_CPU[i]}"
    sum=$(awk -v a="$sum" -v b="${SRV_CPU[i]}" 'BEGIN {print a + b}')
    thr=$((thr + SRV_THR[i]))
  done
  local thr_text=-
  ((SERVER_CAPPED)) && thr_text="$((thr / n)) %"
  local rpg=-
  [[ $2 == GET ]] && rpg=$READS_PER_GET
  awk -v n="$n" -v w="$2" -v each="$each" -v thr="$thr_text" -v sum="$sum" -v ops="$OPS_S" \
    -v cli="$CLIENT_CPU" -v idle="$HOST_IDLE" -v rpg="$rpg" 'BEGIN {
      printf "| %d | %s | %s | %s | %.1f | %s | %.1f | %s | %s |\n", n, w, each, thr,
        (ops > 0 ? 1e6 * sum / ops : 0), cli, (ops > 0 ? 1e6 * cli / ops : 0), idle, rpg }'
}

# --- the runs --------------------------------------------------------------------------------
CLIENT_TASKSET=()
[[ -n $CLIENT_CPUS ]] && CLIENT_TASKSET=(taskset -c "$CLIENT_CPUS")
cap="none: servers and clients share the host's CPUs"
((SERVER_CAPPED)) && cap="$SERVER_CPU CPU per server (cgroup $CG_MODE, quota $QUOTA_US us per $CPU_PERIOD_US us)"
echo "host: $(nproc) CPUs, $(uname -r); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "server cap: $cap${SERVER_CPUS:+; servers pinned to CPUs $SERVER_CPUS}"
if [[ -n $THREADS ]]; then threads_text="$THREADS threads each"; else threads_text="$THREADS_PER_SERVER threads per server each"; fi
echo "clients: $CLIENTS process(es), $threads_text${CLIENT_CPUS:+, pinned to CPUs $CLIENT_CPUS}${CLIENT_CG:+, in a cgroup with cpu shares $CLIENT_SHARES}; uniform keys over $RECORDS records; each workload ${WARMUP} s warm-up + ${DURATION} s measured"
base_get="" base_put="" tput_rows="" cpu_rows=""
declare -a SRV_PID SRV_CPU SRV_THR
for n in $SERVERS; do
  deploy/local-cluster.sh stop >/dev/null 2>&1 || true
  rm -rf "${state:?}"/server-* "$state"/cluster*
  deploy/local-cluster.sh start "$n" >/dev/null
  for ((i = 0; i < n; i++)); do
    SRV_PID[i]=$(cat "$state/server-$i/pid")
    if ((SERVER_CAPPED)); then
      cg_make "$i"
      echo "${SRV_PID[i]}" >"$CG_BASE/server-$i/cgroup.procs"  # every thread moves with it
    fi
    if [[ -n $SERVER_CPUS ]]; then taskset -a -c -p "$SERVER_CPUS" "${SRV_PID[i]}" >/dev/null; fi
  done
  "$KVB" load -db rdkv -P bench/workloads/workloadc -p rdkv.seed="127.0.0.1:$PORT" \
    -p rdkv.transport=tcp -p recordcount="$RECORDS" -threads 4 >"$state/load" 2>&1 ||
    { tail -n 5 "$state/load" >&2; die "loading $RECORDS records into $n server(s) failed"; }
  run_clients "$n" get -P bench/workloads/workloadc
  get=$OPS_S
  cpu_rows+=$(cpu_row "$n" GET)$'\n'
  run_clients "$n" put -P bench/workloads/workloada -p readproportion=0 -p updateproportion=1
  put=$OPS_S
  cpu_rows+=$(cpu_row "$n" PUT)$'\n'
  [[ -n $base_get ]] || base_get=$get base_put=$put
  tput_rows+=$(awk -v n="$n" -v c="$CLIENTS" -v t="${THREADS:-$((THREADS_PER_SERVER * n))}" \
    -v g="$get" -v bg="$base_get" -v p="$put" -v bp="$base_put" 'BEGIN {
      printf "| %d | %d x %d | %d | %.2f | %d | %.2f |", n, c, t, g, (bg > 0 ? g / bg : 0), p,
        (bp > 0 ? p / bp : 0) }')$'\n'
  note "$n server(s) done: GET $get ops/s, PUT $put ops/s"
done
echo
echo "| servers | client threads | GET ops/s | vs first | PUT ops/s | vs first |"
echo "|---|---:|---:|---:|---:|---:|"
printf '%s' "$tput_rows"
echo
echo "| servers | workload | CPU of each server | throttled | server CPU us/op | clients CPU | clients CPU us/op | host idle | READs/GET |"
echo "|---|---|---|---:|---:|---:|---:|---:|---:|"
printf '%s' "$cpu_rows"
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "CPU: CPUs busy (1.00 = one CPU) over the measured seconds; us/op: CPU microseconds per operation; host idle: CPUs the whole host left idle."
if ((SERVER_CAPPED)); then
  echo "throttled: share of the quota periods in which a server's cgroup used up its quota (average over the servers; near 100 % = the servers are the bottleneck)."
fi
echo "READs/GET: over the whole GET run, warm-up included (1.0 = every GET hit the location cache)."
