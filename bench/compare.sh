#!/usr/bin/env bash
# kvbench against rdkv, Redis and memcached on this machine, side by side.
#
#   bench/compare.sh
#   RECORDS=100000 OPS=200000 THREADS="1 2 4" REPEAT=3 bench/compare.sh
#   bench/compare.sh --check   only check that BUILD's kvbench can run every peer (exit 0) or
#                              say which it cannot (exit 2); with the deps and build steps
#                              unless COMPARE_SKIP_DEPS / COMPARE_SKIP_BUILD say otherwise
#
# Starts, on 127.0.0.1 and free ports: one rdkv kvserver (deploy/local-cluster.sh when present,
# else kvserver directly; tcp transport unless RDKV_TRANSPORT says otherwise), one redis-server
# and one memcached, all without persistence. For each backend it loads RECORDS records once
# (YCSB's practice) and runs the workloads in YCSB's order A, B, C, F, D (D last: it inserts)
# with the same thread counts and operation counts, through the same kvbench generators and
# histograms. Prints one table (markdown): throughput and p50/p99 per operation type for each
# backend, and rdkv's ratio to each peer. Stops everything it started, whatever happens.
#
# Environment (all optional):
#   WORKLOADS   subset of "a b c d f" (default all five; e is refused: no range scans)
#   RECORDS     records loaded (default 10000)          OPS      operations per run (default 20000)
#   WARMUP      operations each run makes first, unmeasured, on one thread (kvbench's
#               warmupoperationcount; default 0, YCSB's practice). Every backend gets the same;
#               for rdkv it fills the client's location cache, as a long-running client's is.
#               Not for D: its warm-up would insert records that the record count misses
#   THREADS     client thread counts (default "2")       REPEAT   runs of each cell; the median
#                                                                 of each figure is shown (default 1)
#   BUILD       build dir with kvbench and kvserver (default build/default; configured with
#               the default preset and the two targets built when missing or stale)
#   RDKV_TRANSPORT  tcp (default), verbs or auto       SERVER_THREADS  server threads (default 2)
#   RDKV_PROPS  more kvbench properties for rdkv only (e.g. "-p rdkv.busy_poll_us=0")
#   RDKV_SERVER_FLAGS  more kvserver flags (e.g. "--busy_poll_always")
#   COMPARE_OUT     keep every kvbench output (text, plus status lines) in this directory
#   COMPARE_CHART   where the chart goes (default build/compare/throughput.svg): throughput
#                   against client threads per workload and backend (bench/throughput_chart.py),
#                   drawn from this run's medians, which go beside it as throughput.tsv
#   COMPARE_SKIP_DEPS=1  do not run deploy/install-deps.sh --bench
#   COMPARE_SKIP_BUILD=1 use the binaries in BUILD as they are
# A kvbench built without the redis or memcached backend (BUILD configured before their
# libraries were installed) makes the script reconfigure BUILD and build again; if a backend is
# still missing, or a peer produced no result, it fails naming the peer and prints no table.
# Exit status: 0 when every run finished without a failed operation; 1 some operations failed;
# 2 a peer could not be run (or another setup error).
set -euo pipefail
cd "$(dirname "$0")/.."
PROG=compare.sh
CHECK_ONLY=0
case ${1:-} in
  "") ;;
  --check) CHECK_ONLY=1 ;;
  *) echo "$PROG: usage: bench/compare.sh [--check] (settings in the environment: see the script's head)" >&2; exit 2 ;;
esac

WORKLOADS=${WORKLOADS:-"a b c d f"}
RECORDS=${RECORDS:-10000}
OPS=${OPS:-20000}
WARMUP=${WARMUP:-0}
THREADS=${THREADS:-2}
REPEAT=${REPEAT:-1}
BUILD=${BUILD:-build/default}
TRANSPORT=${RDKV_TRANSPORT:-tcp}
SERVER_THREADS=${SERVER_THREADS:-2}
RDKV_PROPS=${RDKV_PROPS:-}

die() { echo "$PROG: error: $*" >&2; exit 2; }
say() { echo "$PROG: $*" >&2; }

for w in $WORKLOADS; do
  case $w in
    a | b | c | d | f) ;;
    e) die "workload e needs range scans, which a hash store (and plain redis/memcached keys) do not offer" ;;
    *) die "unknown workload '$w' (a b c d f)" ;;
  esac
done
[[ $RECORDS =~ ^[0-9]+$ && $OPS =~ ^[0-9]+$ && $WARMUP =~ ^[0-9]+$ && $REPEAT =~ ^[1-9][0-9]*$ ]] ||
  die "RECORDS, OPS, WARMUP and REPEAT must be numbers"

# --- dependencies and binaries ---------------------------------------------------------------
DBS="rdkv redis memcached"
KVBENCH=$BUILD/bench/kvbench/kvbench
KVSERVER=$BUILD/server/kvserver
# The backends of DBS that $KVBENCH was built without (its --help says "built in: a, b").
missing_backends() {
  local built db missing=""
  built=$("$KVBENCH" --help 2>&1 | sed -n 's/.*(built in: \([^)]*\)).*/\1/p' | head -n1)
  for db in $DBS; do
    [[ ", $built, " == *", $db, "* ]] || missing+=" $db"
  done
  echo "${missing# }"
}
build_targets() {
  local targets=(kvbench kvserver)
  if cmake --build "$BUILD" --target help 2>/dev/null | grep '^kvcli:' >/dev/null; then targets+=(kvcli); fi
  cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}" >&2
}

if [[ ${COMPARE_SKIP_DEPS:-0} != 1 ]]; then deploy/install-deps.sh --bench >&2; fi
if [[ ${COMPARE_SKIP_BUILD:-0} != 1 ]]; then
  if [[ ! -f $BUILD/build.ninja ]]; then cmake --preset default -B "$BUILD" >&2; fi
  build_targets
  missing=$(missing_backends)
  if [[ -n $missing ]]; then
    # A build dir configured before install-deps.sh --bench installed hiredis/libmemcached:
    # pkg-config's "not found" is cached, so only a fresh look at the libraries brings them in.
    say "kvbench in $BUILD lacks the backend(s) $missing: reconfiguring $BUILD to find their libraries"
    cmake -U '__pkg_config_checked_KVBENCH_*' -U 'KVBENCH_*' -B "$BUILD" >&2
    build_targets
  fi
fi
[[ -x $KVBENCH ]] || die "$KVBENCH not found"
[[ -x $KVSERVER ]] || die "$KVSERVER not found"
# Every peer must run: a comparison without one is no comparison (and would print empty columns).
missing=$(missing_backends)
if [[ -n $missing ]]; then
  die "$KVBENCH was built without the backend(s) $missing, so $missing cannot be run" \
    "(libhiredis-dev for redis, libmemcached-dev for memcached: deploy/install-deps.sh --bench;" \
    "then reconfigure $BUILD, or run without COMPARE_SKIP_BUILD=1)"
fi
if ((CHECK_ONLY)); then
  say "$KVBENCH runs every backend ($DBS)"
  exit 0
fi
for b in redis-server memcached; do
  command -v "$b" >/dev/null || die "$b not found (deploy/install-deps.sh --bench installs it)"
done

# --- servers ---------------------------------------------------------------------------------
work=$(mktemp -d /tmp/rdkv-compare.XXXXXX)
redis_pid="" memcached_pid="" kvserver_pid="" cluster_dir=""
cleanup() {
  set +e
  if [[ -n $cluster_dir ]]; then
    RDKV_STOP_TIMEOUT=5 deploy/local-cluster.sh stop "$cluster_dir" >/dev/null 2>&1
  fi
  for pid in $kvserver_pid $redis_pid $memcached_pid; do
    kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A port nothing listens on (tried at random in 20000..59999).
used_ports=""
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 40000))
    [[ " $used_ports " == *" $p "* ]] && continue
    if ! ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then
      used_ports+=" $p"
      echo "$p"
      return 0
    fi
  done
  die "no free port found"
}
wait_tcp() {  # wait_tcp PORT NAME LOG
  for _ in $(seq 1 100); do
    if timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  cat "$3" >&2 || true
  die "$2 did not start on 127.0.0.1:$1"
}

mem_mib=$((RECORDS * 4 / 1024 + 256))  # ~1.1 KB a record, with room for D's inserts and updates

rdkv_port=$(free_port)
if [[ -x deploy/local-cluster.sh ]]; then
  cluster_dir=$work/rdkv-cluster
  say "rdkv: deploy/local-cluster.sh start 1 (port $rdkv_port, $TRANSPORT, ${mem_mib}MiB, no persistence)"
  RDKV_BIN=$BUILD RDKV_BASE_PORT=$rdkv_port RDKV_TRANSPORT=$TRANSPORT RDKV_MEMORY=${mem_mib}MiB \
    RDKV_DURABILITY=none RDKV_EXTRA_FLAGS="--worker_threads=$SERVER_THREADS ${RDKV_SERVER_FLAGS:-}" \
    deploy/local-cluster.sh start 1 "$cluster_dir" >"$work/cluster.log" 2>&1 ||
    { cat "$work/cluster.log" >&2; die "the rdkv cluster did not start"; }
else
  say "rdkv: $KVSERVER (port $rdkv_port, $TRANSPORT, ${mem_mib}MiB)"
  setsid "$KVSERVER" --host=127.0.0.1 --port="$rdkv_port" --transport="$TRANSPORT" --memory="${mem_mib}MiB" \
    --worker_threads="$SERVER_THREADS" ${RDKV_SERVER_FLAGS:-} >"$work/kvserver.log" 2>&1 &
  kvserver_pid=$!
  wait_tcp "$rdkv_port" kvserver "$work/kvserver.log"
fi

# Every server runs in a session of its own (setsid), as deploy/local-cluster.sh starts rdkv's
# and as a daemon runs: Linux's autogroup scheduling then shares the CPUs between the server
# and kvbench as it would between a service and its clients, the same for all three.
redis_port=$(free_port)
say "redis: redis-server on port $redis_port (no RDB snapshots, no AOF)"
setsid redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  --dir "$work" --loglevel warning >"$work/redis.log" 2>&1 &
redis_pid=$!
wait_tcp "$redis_port" redis-server "$work/redis.log"

memcached_port=$(free_port)
mc_user=()
[[ $(id -u) -eq 0 ]] && mc_user=(-u nobody)  # memcached refuses to run as root without -u
say "memcached: port $memcached_port, -t $SERVER_THREADS, -m $mem_mib (memory only by nature)"
setsid memcached "${mc_user[@]}" -l 127.0.0.1 -p "$memcached_port" -U 0 -t "$SERVER_THREADS" -m "$mem_mib" \
  -c 1024 >"$work/memcached.log" 2>&1 &
memcached_pid=$!
wait_tcp "$memcached_port" memcached "$work/memcached.log"

dbprops() {
  case $1 in
    rdkv) echo "-p rdkv.seed=127.0.0.1:$rdkv_port -p rdkv.transport=$TRANSPORT $RDKV_PROPS" ;;
    redis) echo "-p redis.host=127.0.0.1 -p redis.port=$redis_port" ;;
    memcached) echo "-p memcached.host=127.0.0.1 -p memcached.port=$memcached_port" ;;
  esac
}

# --- runs --------------------------------------------------------------------------------------
out_dir=${COMPARE_OUT:-$work/out}
mkdir -p "$out_dir"
failed=0
maxthreads=1
for t in $THREADS; do ((t > maxthreads)) && maxthreads=$t; done

# kvbench PHASE DB WORKLOAD OUTFILE [args...]
kvb() {
  local phase=$1 db=$2 w=$3 out=$4
  shift 4
  local rc=0
  # shellcheck disable=SC2046
  "$KVBENCH" "$phase" -db "$db" -P bench/workloads/workload"$w" $(dbprops "$db") \
    -p recordcount="$RECORDS" -p operationcount="$OPS" -p status.interval=5 \
    $([[ $phase == run && $w != d ]] && echo -p warmupoperationcount="$WARMUP") "$@" \
    >"$out" 2>"$out.stderr" || rc=$?
  if ((rc != 0)); then
    failed=1
    say "kvbench $phase -db $db workload $w: exit $rc"
    tail -n 5 "$out.stderr" >&2
  fi
}

declare -A nrec=()  # records each backend holds (D's inserts add to them)
for db in $DBS; do
  say "loading $RECORDS records into $db ($maxthreads threads)"
  kvb load "$db" a "$out_dir/load-$db.txt" -threads "$maxthreads"
  nrec[$db]=$RECORDS
done
# YCSB's order (D inserts, so it goes last); backends interleaved per cell so that a noisy
# neighbour on a shared machine hits all three alike.
order=""
for w in a b c f d; do [[ " $WORKLOADS " == *" $w "* ]] && order+=" $w"; done
for w in $order; do
  for t in $THREADS; do
    for ((r = 1; r <= REPEAT; r++)); do
      for db in $DBS; do
        say "workload $w, $t thread(s), run $r/$REPEAT: $db"
        out=$out_dir/run-$w-t$t-$db-$r.txt
        # recordcount is also where D's inserts start: past the records earlier D runs added.
        kvb run "$db" "$w" "$out" -threads "$t" -p recordcount="${nrec[$db]}"
        if [[ $w == d ]]; then
          added=$(awk -F', ' '$1 == "[INSERT]" && $2 ~ /^Return=/ { n += $3 } END { print n + 0 }' "$out")
          nrec[$db]=$((nrec[$db] + added))
        fi
      done
    done
  done
done

# --- table -------------------------------------------------------------------------------------
# metric FILE SECTION NAME: the value of "[SECTION], NAME, value" (empty when absent).
metric() { awk -F', ' -v s="[$2]" -v n="$3" '$1 == s && $2 == n { print $3; exit }' "$1" 2>/dev/null; }
# No table with holes: every backend must have a throughput for every cell of every repeat.
for db in $DBS; do
  holes=""
  for w in $order; do
    for t in $THREADS; do
      for ((r = 1; r <= REPEAT; r++)); do
        [[ -n $(metric "$out_dir/run-$w-t$t-$db-$r.txt" OVERALL "Throughput(ops/sec)") ]] ||
          holes+=" ${w^^}/$t/run$r"
      done
    done
  done
  if [[ -n $holes ]]; then
    die "$db could not be run (no result for$holes; see the kvbench messages above): no table"
  fi
done
# median of the arguments (empty when none)
median() { printf '%s\n' "$@" | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
# cell W T DB SECTION NAME: the median over the repeats
cell() {
  local vals=() r
  for ((r = 1; r <= REPEAT; r++)); do vals+=("$(metric "$out_dir/run-$1-t$2-$3-$r.txt" "$4" "$5")"); done
  median "${vals[@]}"
}
fmt() { [[ -z $1 ]] && { echo "-"; return; }; awk -v v="$1" 'BEGIN { if (v >= 100) printf "%.0f", v; else printf "%.1f", v }'; }
ratio() { [[ -z $1 || -z $2 ]] && { echo "-"; return; }; awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

echo
echo "kvbench, $RECORDS records of 10 x 100 B, $OPS operations per run ($WARMUP unmeasured first), median of $REPEAT run(s); rdkv transport $TRANSPORT; $(nproc) cores"
echo "throughput in ops/s (per workload); latency p50 / p99 in us (per operation type)"
echo "ratio = rdkv / peer: above 1 for ops/s means rdkv is faster; below 1 for p50/p99 means rdkv is faster"
echo
echo "| workload | threads | op | rdkv ops/s | rdkv p50 | rdkv p99 | redis ops/s | redis p50 | redis p99 | memcached ops/s | memcached p50 | memcached p99 | rdkv/redis ops/s | rdkv/redis p50 | rdkv/redis p99 | rdkv/memcached ops/s | rdkv/memcached p50 | rdkv/memcached p99 |"
echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for w in a b c d f; do
  [[ " $order " == *" $w "* ]] || continue
  W=${w^^}
  for t in $THREADS; do
    first=1
    for op in READ UPDATE INSERT READ-MODIFY-WRITE; do
      [[ -n $(cell "$w" "$t" rdkv "$op" Operations) ]] || continue
      declare -A tp=() p50=() p99=()
      for db in $DBS; do
        tp[$db]=$(cell "$w" "$t" "$db" OVERALL "Throughput(ops/sec)")
        p50[$db]=$(cell "$w" "$t" "$db" "$op" "50thPercentileLatency(us)")
        p99[$db]=$(cell "$w" "$t" "$db" "$op" "99thPercentileLatency(us)")
      done
      row="| $W | $t | $op"
      for db in $DBS; do
        if ((first)); then row+=" | $(fmt "${tp[$db]}")"; else row+=" | "; fi
        row+=" | $(fmt "${p50[$db]}") | $(fmt "${p99[$db]}")"
      done
      for peer in redis memcached; do
        if ((first)); then row+=" | $(ratio "${tp[rdkv]}" "${tp[$peer]}")"; else row+=" | "; fi
        row+=" | $(ratio "${p50[rdkv]}" "${p50[$peer]}") | $(ratio "${p99[rdkv]}" "${p99[$peer]}")"
      done
      echo "$row |"
      first=0
      unset tp p50 p99
    done
  done
done
# --- chart -------------------------------------------------------------------------------------
chart=${COMPARE_CHART:-build/compare/throughput.svg}
mkdir -p "$(dirname "$chart")"
medians=${chart%.svg}.tsv
{
  echo "# workload	threads	backend	ops/s (median of $REPEAT): bench/compare.sh, $RECORDS records, $OPS operations, $WARMUP warm-up"
  for w in $order; do
    for t in $THREADS; do
      for db in $DBS; do
        printf '%s\t%s\t%s\t%s\n' "${w^^}" "$t" "$db" "$(cell "$w" "$t" "$db" OVERALL "Throughput(ops/sec)")"
      done
    done
  done
} >"$medians"
if python3 bench/throughput_chart.py "$medians" "$chart" \
  "kvbench: $RECORDS records, $OPS operations ($WARMUP warm-up), median of $REPEAT; rdkv over $TRANSPORT; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"; then
  echo
  echo "chart: $chart (data: $medians)"
else
  say "the chart could not be drawn (the table above stands)"
fi

if ((REPEAT > 1)); then
  # How far apart the repeats of one cell were: on a shared machine, the figure to read first.
  spreads=""
  for w in $order; do
    for t in $THREADS; do
      for db in $DBS; do
        sp=$(for ((r = 1; r <= REPEAT; r++)); do metric "$out_dir/run-$w-t$t-$db-$r.txt" OVERALL "Throughput(ops/sec)"; done |
          awk 'NR == 1 || $1 < lo { lo = $1 } NR == 1 || $1 > hi { hi = $1 } END { if (lo > 0) printf "%.2f", hi / lo }')
        [[ -n $sp ]] && spreads+="$sp ${w^^}/$t/$db"$'\n'
      done
    done
  done
  worst=$(sort -g <<<"$spreads" | grep . | tail -n1)
  mid=$(sort -g <<<"$spreads" | grep . | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')
  echo
  echo "run-to-run spread of throughput (max/min of the $REPEAT repeats of a cell): median ${mid}x, worst ${worst%% *}x (${worst#* })"
fi
rdkv_rpg=$(cell c "${THREADS%% *}" rdkv RDKV READsPerGET 2>/dev/null || true)
if [[ -n $rdkv_rpg ]]; then echo; echo "rdkv READs per GET (workload C, ${THREADS%% *} thread(s)): $rdkv_rpg"; fi
errors=$(cat "$out_dir"/*.txt 2>/dev/null | awk -F', ' '$2 ~ /^Return=ERROR$/ { n += $3 } END { print n + 0 }')
echo "failed operations over all runs: $errors"
if [[ -n ${COMPARE_OUT:-} ]]; then echo "raw kvbench output: $out_dir"; fi
if ((failed || errors > 0)); then
  echo "$PROG: some runs failed; see the messages above" >&2
  exit 1
fi
