#!/usr/bin/env bash
# A cluster of N kvservers on this machine, for development, demos and tests.
#
#   deploy/local-cluster.sh start  [N] [DIR]   start N servers (default 3), wait until all answer
#   deploy/local-cluster.sh status [DIR]       pid, port and health of each; exit 1 if any is down
#   deploy/local-cluster.sh stop   [DIR]       SIGTERM, then SIGKILL after a timeout; idempotent
#   deploy/local-cluster.sh kill ID [DIR]      SIGKILL server ID (a crash, for failover tests)
#   deploy/local-cluster.sh restart ID [DIR]   start server ID again with its flags (after kill)
#
# DIR (the state dir) defaults to $RDKV_CLUSTER_DIR, else /tmp/rdkv-cluster. It holds:
#   cluster.env            what `start` chose (N, host, base port, binaries); read by stop/status
#   cluster-map.json       the generated cluster map (epoch 1, round-robin owners)
#   server-<id>/kvserver.log   the server's log (glog, to stderr); appended across restarts
#   server-<id>/pid, port      pid file, and the port the server reports once it serves
#   server-<id>/data       its --data_dir (kept by `stop`; delete DIR to start from empty)
#   server-<id>/args       its command line (NUL-separated), for `restart`
#   coord-<i>/kvcoord.log, pid   the failover coordinators (RDKV_COORDINATORS)
#
# Environment (all optional):
#   RDKV_BIN           dir holding kvserver and kvcli (or a build dir with server/ and tools/);
#                      default: build/default of this repository
#   RDKV_HOST          address every server listens on (default 127.0.0.1)
#   RDKV_BASE_PORT     server i listens on RDKV_BASE_PORT + i (default 7400)
#   RDKV_METRICS_BASE_PORT  server i serves Prometheus /metrics on RDKV_METRICS_BASE_PORT + i
#                      (default: the N ports right after the servers', RDKV_BASE_PORT + N + i;
#                      "off": no /metrics)
#   RDKV_SHARDS        shards in the generated map (default 64)
#   RDKV_REPLICATION   replicas per shard, R (default 1): shard s on server s % N, then the
#                      next R-1 servers as its backups (docs/design.md "Replication")
#   RDKV_ETCD          where the cluster map lives: "" (default: a map file, --cluster_map),
#                      "local" (start etcd on this machine, state in DIR/etcd, client port
#                      RDKV_ETCD_PORT, default RDKV_BASE_PORT + 2N; stopped by `stop`), or the
#                      endpoints of a running etcd (host:port[,...]). The map is imported with
#                      `kvcli cluster import-map` and the servers run with --etcd
#   RDKV_CLUSTER_NAME  the cluster's name in etcd (default local)
#   RDKV_COORDINATORS  failover coordinators (kvcoord) to start with an etcd cluster (default 0:
#                      none, replica sets change only by hand). With 1 or more, a failed or
#                      restarted server is replaced automatically and the map's
#                      replication_factor restored (docs/design.md "Failover")
#   RDKV_COORD_METRICS_BASE_PORT  coordinator i serves Prometheus /metrics on this + i
#                      (default: RDKV_BASE_PORT + 2N + 2, the ports after the servers', their
#                      /metrics ports and the local etcd's two; "off": none, which is also the
#                      default with RDKV_METRICS_BASE_PORT=off)
#   RDKV_ETCD_LEASE_TTL  the servers' and coordinators' etcd lease TTL in seconds (default: the
#                      programs' own, 2): how long a dead server goes undetected at most
#   RDKV_TRANSPORT     auto | tcp | verbs (default tcp)
#   RDKV_DEVICE        RDMA device for verbs (e.g. rxe0; default: kvserver picks)
#   RDKV_MEMORY        region size per server (default 128MiB)
#   RDKV_DURABILITY    sync | async | none (default none)
#   RDKV_AUTH_TOKEN    data secret clients must prove (default: none). Written to
#                      DIR/auth_token (mode 0600) and passed as --auth_token_file, never on a
#                      command line (docs/security.md)
#   RDKV_ADMIN_TOKEN   admin secret for moves, snapshots, map installs (default: none: admin
#                      requests only from loopback). Written to DIR/admin_token likewise
#   RDKV_EXTRA_FLAGS   more kvserver flags, word-split (e.g. "--worker_threads=1")
#   RDKV_COORD_EXTRA_FLAGS  more kvcoord flags, word-split (e.g. "--poll_ms=500")
#   RDKV_START_TIMEOUT seconds to wait for every server to answer (default 30)
#   RDKV_STOP_TIMEOUT  seconds between SIGTERM and SIGKILL (default 10)
#
# Flags this kvserver build does not know yet (--cluster_map, --server_id, --data_dir,
# --durability) are left out with a warning, so the script works on older builds too.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROG=local-cluster.sh

die() { echo "$PROG: error: $*" >&2; exit 2; }
warn() { echo "$PROG: warning: $*" >&2; }
say() { echo "$PROG: $*"; }

usage() {  # usage EXIT_STATUS: the header comment of this file
  sed -n '2,/^[^#]/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit "$1"
}

# --- arguments -------------------------------------------------------------------------------
cmd=${1:-}
[[ -n $cmd ]] || usage 2
shift
N=""
DIR=${RDKV_CLUSTER_DIR:-/tmp/rdkv-cluster}
for a in "$@"; do
  case $a in
    -h | --help) usage 0 ;;
    [0-9] | [0-9][0-9] | [0-9][0-9][0-9]) N=$a ;;  # kill/restart: the server id
    -*) die "unknown option '$a'" ;;
    *) DIR=$a ;;
  esac
done
case $cmd in
  start | stop | status) ;;
  kill | restart) [[ -n $N ]] || die "$cmd needs a server id" ;;
  -h | --help | help) usage 0 ;;
  *) die "unknown command '$cmd' (start|stop|status|kill|restart)" ;;
esac
DIR=${DIR%/}

# --- helpers ---------------------------------------------------------------------------------
# find_bin NAME SUBDIR: the binary from RDKV_BIN (flat or a build dir) or build/default.
find_bin() {
  local name=$1 sub=$2 c
  local candidates=()
  if [[ -n ${RDKV_BIN:-} ]]; then
    candidates=("$RDKV_BIN/$name" "$RDKV_BIN/$sub/$name")
  else
    candidates=("$ROOT/build/default/$sub/$name")
  fi
  for c in "${candidates[@]}"; do
    if [[ -x $c && -f $c ]]; then (cd "$(dirname "$c")" && echo "$PWD/$name"); return 0; fi
  done
  return 1
}

# pid_alive PID: true when PID runs a kvserver (guards against a recycled pid).
pid_alive() {
  local pid=$1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  local cmdline
  cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
  [[ $cmdline == *kvserver* ]]
}

# child_alive PID: true while a server this script just started runs (not yet exec'd counts).
child_alive() {
  local state
  kill -0 "$1" 2>/dev/null || return 1
  state=$(awk '{print $3}' 2>/dev/null </proc/"$1"/stat) || return 1
  [[ $state != Z ]]
}

# tcp_open HOST PORT: true when something accepts a TCP connection there.
tcp_open() {
  # shellcheck disable=SC2016  # $1 and $2 expand in the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# who_listens PORT: "pid N (name)" of the listener when ss can tell, else "".
who_listens() {
  local line
  line=$(ss -Hltnp "sport = :$1" 2>/dev/null | head -n1) || true
  if [[ $line =~ users:\(\(\"([^\"]+)\",pid=([0-9]+) ]]; then
    echo "pid ${BASH_REMATCH[2]} (${BASH_REMATCH[1]})"
  elif [[ -n $line ]]; then
    echo "another process"
  fi
}

load_state() {
  [[ -f $DIR/cluster.env ]] || return 1
  # shellcheck source=/dev/null
  source "$DIR/cluster.env"
}

ping_server() {  # ping_server HOST:PORT -> kvcli exit status (only when kvcli exists)
  local extra=()
  [[ -n ${AUTH_TOKEN_FILE:-} ]] && extra+=("--auth_token_file=$AUTH_TOKEN_FILE")
  # The servers' transport, not kvcli's auto choice (which picks verbs whenever a device is up).
  [[ ${TRANSPORT:-auto} != auto ]] && extra+=("--transport=$TRANSPORT")
  timeout 10 "$KVCLI" --server="$1" "${extra[@]}" ping >/dev/null 2>&1
}

# --- start -----------------------------------------------------------------------------------
do_start() {
  N=${N:-3}
  ((N >= 1 && N <= 256)) || die "N must be 1..256 (got $N)"
  local host=${RDKV_HOST:-127.0.0.1}
  local base=${RDKV_BASE_PORT:-7400}
  local shards=${RDKV_SHARDS:-64}
  local transport=${RDKV_TRANSPORT:-tcp}
  local memory=${RDKV_MEMORY:-128MiB}
  local durability=${RDKV_DURABILITY:-none}
  local timeout_s=${RDKV_START_TIMEOUT:-30}
  local replication=${RDKV_REPLICATION:-1}
  local etcd=${RDKV_ETCD:-}
  local cluster_name=${RDKV_CLUSTER_NAME:-local}
  [[ $replication =~ ^[0-9]+$ ]] && ((replication >= 1 && replication <= 5 && replication <= N)) ||
    die "RDKV_REPLICATION=$replication must be 1..min(5, N=$N)"
  [[ $base =~ ^[0-9]+$ ]] && ((base >= 1 && base + N - 1 <= 65535)) ||
    die "RDKV_BASE_PORT=$base: ports $base..$((base + N - 1)) must lie in 1..65535"
  local metrics_base=${RDKV_METRICS_BASE_PORT:-$((base + N))}
  [[ $metrics_base == off ]] ||
    { [[ $metrics_base =~ ^[0-9]+$ ]] && ((metrics_base >= 1 && metrics_base + N - 1 <= 65535)); } ||
    die "RDKV_METRICS_BASE_PORT=$metrics_base: ports $metrics_base..$((metrics_base + N - 1)) must lie in 1..65535 (or off)"
  [[ $shards =~ ^[0-9]+$ ]] && ((shards >= 1 && shards <= 4096)) ||
    die "RDKV_SHARDS=$shards must be 1..4096"
  # Coordinators: checked before anything starts. Their /metrics ports follow the local etcd's.
  local ncoord=${RDKV_COORDINATORS:-0}
  [[ $ncoord =~ ^[0-9]+$ ]] || die "RDKV_COORDINATORS=$ncoord must be a number"
  ((ncoord == 0)) || [[ -n $etcd ]] || die "RDKV_COORDINATORS needs RDKV_ETCD (the coordinators work through etcd)"
  local coord_metrics_base=${RDKV_COORD_METRICS_BASE_PORT:-}
  if [[ -z $coord_metrics_base ]]; then
    coord_metrics_base=$((base + 2 * N + 2))
    [[ $metrics_base == off ]] && coord_metrics_base=off
  fi
  ((ncoord > 0)) || coord_metrics_base=off
  [[ $coord_metrics_base == off ]] ||
    { [[ $coord_metrics_base =~ ^[0-9]+$ ]] && ((coord_metrics_base >= 1 && coord_metrics_base + ncoord - 1 <= 65535)); } ||
    die "RDKV_COORD_METRICS_BASE_PORT=$coord_metrics_base: ports $coord_metrics_base..$((coord_metrics_base + ncoord - 1)) must lie in 1..65535 (or off)"
  case $transport in auto | tcp | verbs) ;; *) die "RDKV_TRANSPORT=$transport: auto, tcp or verbs" ;; esac
  case $durability in sync | async | none) ;; *) die "RDKV_DURABILITY=$durability: sync, async or none" ;; esac

  KVSERVER=$(find_bin kvserver server) || die "kvserver not found in ${RDKV_BIN:-$ROOT/build/default/server}.
  Build it:  cmake --preset default && cmake --build --preset default --target kvserver kvcli
  or point RDKV_BIN at a directory that holds kvserver (and kvcli)."
  KVCLI=$(find_bin kvcli tools) || KVCLI=""

  # A cluster already recorded in DIR?
  if load_state; then
    local running=0 i pid
    for ((i = 0; i < NSERVERS; i++)); do
      pid=$(cat "$DIR/server-$i/pid" 2>/dev/null || true)
      pid_alive "$pid" && running=$((running + 1))
    done
    if ((running > 0)); then
      die "a cluster in $DIR is still running ($running of $NSERVERS servers up); run '$PROG stop $DIR' first"
    fi
  fi

  # Which of our flags does this kvserver know? (gflags: --helpfull lists every flag, exits 1.)
  local help
  help=$("$KVSERVER" --helpfull 2>&1 || true)
  has_flag() { grep -qE -- "^[[:space:]]+-$1 \(" <<<"$help"; }
  has_flag port_file || die "$KVSERVER does not look like kvserver (no --port_file in --helpfull)"
  # /metrics only with a kvserver that serves it.
  has_flag metrics_port || metrics_base=off

  # Ports free?
  local i port who busy=() ports=()
  for ((i = 0; i < N; i++)); do
    ports+=($((base + i)))
    [[ $metrics_base == off ]] || ports+=($((metrics_base + i)))
  done
  if [[ $coord_metrics_base != off ]]; then
    for ((i = 0; i < ncoord; i++)); do ports+=($((coord_metrics_base + i))); done
  fi
  local dups
  dups=$(printf '%s\n' "${ports[@]}" | sort -n | uniq -d | tr '\n' ' ')
  [[ -z $dups ]] || die "port(s) ${dups% } given twice: the servers', their /metrics and the coordinators' /metrics ports must not overlap (RDKV_BASE_PORT, RDKV_METRICS_BASE_PORT, RDKV_COORD_METRICS_BASE_PORT)"
  for port in "${ports[@]}"; do
    who=$(who_listens "$port")
    if [[ -n $who ]]; then
      busy+=("$port (used by $who)")
    elif tcp_open "$host" "$port"; then
      busy+=("$port")
    fi
  done
  if ((${#busy[@]} > 0)); then
    die "port(s) already in use on $host: ${busy[*]}.
  Stop whatever holds them, or choose other ports: RDKV_BASE_PORT=<port> [RDKV_METRICS_BASE_PORT=<port>|off] $PROG start $N"
  fi

  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  NSERVERS=$N
  TRANSPORT=$transport
  # Secrets go to files (mode 0600), never onto a command line where ps shows them.
  AUTH_TOKEN_FILE="" ADMIN_TOKEN_FILE=""
  write_secret() {  # write_secret NAME VALUE -> prints the file's path
    (umask 077 && printf '%s' "$2" >"$DIR/$1")
    echo "$DIR/$1"
  }
  if [[ -n ${RDKV_AUTH_TOKEN:-} ]]; then AUTH_TOKEN_FILE=$(write_secret auth_token "$RDKV_AUTH_TOKEN"); fi
  if [[ -n ${RDKV_ADMIN_TOKEN:-} ]]; then
    ADMIN_TOKEN_FILE=$(write_secret admin_token "$RDKV_ADMIN_TOKEN")
  fi
  local map=$DIR/cluster-map.json
  {
    printf '{\n  "epoch": 1,\n  "shards": %d,\n  "servers": [\n' "$shards"
    for ((i = 0; i < N; i++)); do
      printf '    {"id": %d, "address": "%s:%d"}%s\n' "$i" "$host" $((base + i)) "$([[ $i -lt $((N - 1)) ]] && echo ,)"
    done
    printf '  ],\n  "owners": ['
    for ((i = 0; i < shards; i++)); do
      printf '%s%d' "$([[ $i -gt 0 ]] && echo ', ')" $((i % N))
    done
    printf ']'
    if ((replication > 1)); then
      printf ',\n  "replication_factor": %d' "$replication"
      printf ',\n  "replicas": ['
      local k
      for ((i = 0; i < shards; i++)); do
        printf '%s[' "$([[ $i -gt 0 ]] && echo ', ')"
        for ((k = 0; k < replication; k++)); do
          printf '%s%d' "$([[ $k -gt 0 ]] && echo ,)" $(((i + k) % N))
        done
        printf ']'
      done
      printf ']'
    fi
    printf '\n}\n'
  } >"$map.tmp"
  mv "$map.tmp" "$map"

  # etcd: start one here when asked, then import the map (kept when etcd already has one).
  ETCD_ENDPOINTS="" ETCD_PID_FILE=""
  if [[ -n $etcd ]]; then
    [[ -n $KVCLI ]] || die "RDKV_ETCD needs kvcli next to kvserver (it imports the map)"
    has_flag etcd || die "RDKV_ETCD is set but $KVSERVER has no --etcd (too old)"
    if [[ $etcd == local ]]; then
      command -v etcd >/dev/null || die "etcd is not installed (deploy/install-deps.sh installs it)"
      local cport=${RDKV_ETCD_PORT:-$((base + 2 * N))} pport
      pport=$((cport + 1))
      for port in $cport $pport; do
        [[ -z $(who_listens "$port") ]] || die "etcd port $port is in use (set RDKV_ETCD_PORT)"
        [[ $coord_metrics_base == off ]] || ((port < coord_metrics_base || port >= coord_metrics_base + ncoord)) ||
          die "etcd port $port is also a coordinator's /metrics port (set RDKV_ETCD_PORT or RDKV_COORD_METRICS_BASE_PORT)"
      done
      mkdir -p "$DIR/etcd"
      ETCD_PID_FILE=$DIR/etcd/pid
      setsid etcd --name local --data-dir "$DIR/etcd/data" \
        --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
        --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
        --initial-cluster "local=http://127.0.0.1:$pport" --heartbeat-interval 50 --election-timeout 250 \
        </dev/null >>"$DIR/etcd/etcd.log" 2>&1 &
      echo $! >"$ETCD_PID_FILE"
      ETCD_ENDPOINTS=127.0.0.1:$cport
      local t=0
      until ETCDCTL_API=3 etcdctl --endpoints="$ETCD_ENDPOINTS" endpoint health >/dev/null 2>&1; do
        t=$((t + 1))
        ((t < 100)) || { tail -n 15 "$DIR/etcd/etcd.log" >&2; die "etcd did not start (log: $DIR/etcd/etcd.log)"; }
        sleep 0.1
      done
      say "etcd serving on $ETCD_ENDPOINTS (state in $DIR/etcd)"
    else
      ETCD_ENDPOINTS=$etcd
    fi
    local out
    if out=$("$KVCLI" --etcd="$ETCD_ENDPOINTS" --cluster_name="$cluster_name" cluster import-map "$map" 2>&1); then
      say "$out"
    elif [[ $out == *"already holds"* ]]; then
      say "etcd already holds the map of cluster '$cluster_name'; the servers use that one"
    else
      die "importing the map into etcd: $out"
    fi
  fi

  (
    umask 077
    echo "# written by $PROG start; read by stop and status"
    printf '%s=%q\n' NSERVERS "$N" HOST "$host" BASE_PORT "$base" TRANSPORT "$transport" \
      KVSERVER "$KVSERVER" KVCLI "$KVCLI" AUTH_TOKEN_FILE "$AUTH_TOKEN_FILE" \
      ADMIN_TOKEN_FILE "$ADMIN_TOKEN_FILE" ETCD_ENDPOINTS "$ETCD_ENDPOINTS" \
      ETCD_PID_FILE "$ETCD_PID_FILE" CLUSTER_NAME "$cluster_name" NCOORD "${RDKV_COORDINATORS:-0}"
  ) >"$DIR/cluster.env"

  local skipped=()
  local common=(--host="$host" --transport="$transport" --memory="$memory")
  [[ -n ${RDKV_DEVICE:-} ]] && common+=(--device="$RDKV_DEVICE")
  if [[ -n $AUTH_TOKEN_FILE ]]; then
    has_flag auth_token_file || die "RDKV_AUTH_TOKEN is set but $KVSERVER has no --auth_token_file (too old)"
    common+=(--auth_token_file="$AUTH_TOKEN_FILE")
  fi
  if [[ -n $ADMIN_TOKEN_FILE ]]; then
    has_flag admin_token_file || die "RDKV_ADMIN_TOKEN is set but $KVSERVER has no --admin_token_file (too old)"
    common+=(--admin_token_file="$ADMIN_TOKEN_FILE")
  fi
  if [[ -n $ETCD_ENDPOINTS ]]; then
    common+=(--etcd="$ETCD_ENDPOINTS" --cluster_name="$cluster_name")
    [[ -n ${RDKV_ETCD_LEASE_TTL:-} ]] && common+=(--etcd_lease_ttl_s="$RDKV_ETCD_LEASE_TTL")
  elif has_flag cluster_map; then
    common+=(--cluster_map="$map")
  else
    skipped+=(--cluster_map)
  fi
  # Replicated writes wait for their backups on the worker threads: more of them.
  ((replication > 1)) && has_flag worker_threads && common+=(--worker_threads=8)
  if has_flag durability; then
    common+=(--durability="$durability")
  else
    skipped+=(--durability)
    [[ $durability != none ]] && warn "RDKV_DURABILITY=$durability asked for, but this kvserver has no --durability: servers run without persistence"
  fi
  local has_id=0 has_data=0
  if has_flag server_id; then has_id=1; else skipped+=(--server_id); fi
  if has_flag data_dir; then has_data=1; else skipped+=(--data_dir); fi
  ((${#skipped[@]} == 0)) || warn "this kvserver does not take ${skipped[*]} yet; left out (servers run standalone, not as one cluster)"
  local extra=()
  # shellcheck disable=SC2206
  [[ -n ${RDKV_EXTRA_FLAGS:-} ]] && extra=(${RDKV_EXTRA_FLAGS})

  say "starting $N kvserver(s) on $host:$base..$((base + N - 1)) (transport $transport, $memory each), state in $DIR"
  local pids=()
  for ((i = 0; i < N; i++)); do
    local sd=$DIR/server-$i
    mkdir -p "$sd/data"
    rm -f "$sd/port" "$sd/pid"
    local args=("${common[@]}" --port=$((base + i)) --port_file="$sd/port")
    if [[ $metrics_base != off ]]; then
      # On the servers' own address, which is what the printed URL names.
      args+=(--metrics_port=$((metrics_base + i)))
      has_flag metrics_host && args+=(--metrics_host="$host")
    fi
    ((has_id)) && args+=(--server_id="$i")
    ((has_data)) && args+=(--data_dir="$sd/data")
    args+=("${extra[@]}")
    printf '%s\0' "${args[@]}" >"$sd/args"
    echo "=== $(date '+%F %T') $PROG start: $KVSERVER ${args[*]}" >>"$sd/kvserver.log"
    # setsid: the servers outlive this script and do not get the terminal's Ctrl-C.
    setsid "$KVSERVER" "${args[@]}" </dev/null >>"$sd/kvserver.log" 2>&1 &
    pids[i]=$!
    echo "${pids[i]}" >"$sd/pid"
  done

  # Wait until each server answers: port file written, then kvcli ping (or a TCP connect).
  local deadline=$((SECONDS + timeout_s)) ready
  for ((i = 0; i < N; i++)); do
    local sd=$DIR/server-$i addr=$host:$((base + i))
    ready=0
    while ((SECONDS < deadline)); do
      if ! child_alive "${pids[i]}"; then
        echo "$PROG: error: server $i (pid ${pids[i]}, port $((base + i))) exited during start; last lines of $sd/kvserver.log:" >&2
        tail -n 15 "$sd/kvserver.log" | sed 's/^/    /' >&2
        stop_all 5 >/dev/null
        stop_etcd >/dev/null
        exit 1
      fi
      if [[ -s $sd/port ]]; then
        if [[ -n $KVCLI ]]; then
          ping_server "$addr" && ready=1
        elif [[ $transport == tcp ]] || grep -q "over tcp" "$sd/kvserver.log"; then
          tcp_open "$host" $((base + i)) && ready=1
        else
          ready=1  # verbs without kvcli: the port file is all we can check
        fi
      fi
      ((ready)) && break
      sleep 0.2
    done
    if ((!ready)); then
      echo "$PROG: error: server $i ($addr) did not answer within ${timeout_s}s; last lines of $sd/kvserver.log:" >&2
      tail -n 15 "$sd/kvserver.log" | sed 's/^/    /' >&2
      stop_all 5 >/dev/null
      stop_etcd >/dev/null
      exit 1
    fi
  done
  [[ -n $KVCLI ]] || warn "kvcli not found next to kvserver: readiness checked with a TCP connect, not a ping"
  start_coordinators
  say "all $N servers answer; cluster map: $map (R=$replication${ETCD_ENDPOINTS:+, in etcd $ETCD_ENDPOINTS as cluster '$cluster_name'})"
  echo "seed: $host:$base"
  if [[ $metrics_base != off ]]; then
    for ((i = 0; i < N; i++)); do
      echo "metrics: server $i: http://$host:$((metrics_base + i))/metrics"
    done
  fi
  if [[ $coord_metrics_base != off ]]; then
    for ((i = 0; i < ncoord; i++)); do
      echo "metrics: coordinator $i: http://$host:$((coord_metrics_base + i))/metrics"
    done
  fi
  if [[ -n $KVCLI ]]; then
    local t=""
    [[ $transport != auto ]] && t=" --transport=$transport"
    if [[ -n $AUTH_TOKEN_FILE ]]; then t+=" --auth_token_file=$AUTH_TOKEN_FILE"; fi
    echo "try:  $KVCLI --server=$host:$base$t put hello world && $KVCLI --server=$host:$base$t get hello"
    if [[ -n $ADMIN_TOKEN_FILE ]]; then
      echo "admin commands (move, snapshot): add --admin_token_file=$ADMIN_TOKEN_FILE"
    fi
  fi
}

# start_coordinators: RDKV_COORDINATORS kvcoord processes for an etcd cluster (do_start's
# ncoord, coord_metrics_base, host, cluster_name). With /metrics, waits until each serves it.
start_coordinators() {
  local n=$ncoord i
  ((n > 0)) || return 0
  [[ -n ${ETCD_ENDPOINTS:-} ]] || die "RDKV_COORDINATORS needs RDKV_ETCD (the coordinators work through etcd)"
  local kvcoord
  kvcoord=$(find_bin kvcoord coordinator) || die "kvcoord not found next to kvserver (build the kvcoord target)"
  if [[ $coord_metrics_base != off ]] && ! grep -qE -- "^[[:space:]]+-metrics_port \(" <<<"$("$kvcoord" --help 2>&1 || true)"; then
    warn "this kvcoord has no --metrics_port: the coordinators serve no /metrics"
    coord_metrics_base=off
  fi
  local args=(--etcd="$ETCD_ENDPOINTS" --cluster_name="$cluster_name" --transport="$TRANSPORT")
  [[ $TRANSPORT == tcp ]] || args+=(--probe_ms=0)
  [[ -n ${RDKV_ETCD_LEASE_TTL:-} ]] && args+=(--lease_ttl_s="$RDKV_ETCD_LEASE_TTL")
  [[ -n $AUTH_TOKEN_FILE ]] && args+=(--auth_token_file="$AUTH_TOKEN_FILE")
  [[ -n $ADMIN_TOKEN_FILE ]] && args+=(--admin_token_file="$ADMIN_TOKEN_FILE")
  # shellcheck disable=SC2206  # word-split on purpose, like RDKV_EXTRA_FLAGS
  [[ -n ${RDKV_COORD_EXTRA_FLAGS:-} ]] && args+=(${RDKV_COORD_EXTRA_FLAGS})
  local pids=()
  for ((i = 0; i < n; i++)); do
    local cd=$DIR/coord-$i cargs=("${args[@]}" --name="coord-$i")
    [[ $coord_metrics_base == off ]] || cargs+=(--metrics_host="$host" --metrics_port=$((coord_metrics_base + i)))
    mkdir -p "$cd"
    echo "=== $(date '+%F %T') $PROG start: $kvcoord ${cargs[*]}" >>"$cd/kvcoord.log"
    setsid "$kvcoord" "${cargs[@]}" </dev/null >>"$cd/kvcoord.log" 2>&1 &
    pids[i]=$!
    echo "${pids[i]}" >"$cd/pid"
  done
  # /metrics is served from the start (before the election): it shows the coordinator is up.
  if [[ $coord_metrics_base != off ]]; then
    local deadline=$((SECONDS + ${RDKV_START_TIMEOUT:-30})) port
    for ((i = 0; i < n; i++)); do
      port=$((coord_metrics_base + i))
      until tcp_open "$host" "$port"; do
        if ! child_alive "${pids[i]}" || ((SECONDS >= deadline)); then
          echo "$PROG: error: coordinator $i (pid ${pids[i]}) does not serve /metrics on $host:$port; last lines of $DIR/coord-$i/kvcoord.log:" >&2
          tail -n 15 "$DIR/coord-$i/kvcoord.log" | sed 's/^/    /' >&2
          stop_coordinators >/dev/null
          stop_all 5 >/dev/null
          stop_etcd >/dev/null
          exit 1
        fi
        sleep 0.1
      done
    done
  fi
  say "$n failover coordinator(s) (kvcoord) started; logs in $DIR/coord-*/kvcoord.log"
}

# stop_coordinators: first of all, so that stopping the servers is not taken for failures.
stop_coordinators() {
  local f pid
  for f in "$DIR"/coord-*/pid; do
    [[ -f $f ]] || continue
    pid=$(cat "$f")
    if [[ $pid =~ ^[0-9]+$ ]] && [[ $(tr '\0' ' ' 2>/dev/null </proc/"$pid"/cmdline) == *kvcoord* ]]; then
      kill -TERM "$pid" 2>/dev/null || true
      local t=0
      while kill -0 "$pid" 2>/dev/null && ((t < 50)); do sleep 0.1; t=$((t + 1)); done
      kill -KILL "$pid" 2>/dev/null || true
      say "coordinator $(basename "$(dirname "$f")") (pid $pid): stopped"
    fi
    rm -f "$f"
  done
}

do_kill() {
  load_state || die "no cluster recorded in $DIR"
  ((N < NSERVERS)) || die "server $N is not in this cluster (0..$((NSERVERS - 1)))"
  local pid
  pid=$(cat "$DIR/server-$N/pid" 2>/dev/null || true)
  pid_alive "$pid" || die "server $N is not running"
  kill -KILL "$pid"
  local t=0
  while pid_alive "$pid" && ((t < 100)); do sleep 0.05; t=$((t + 1)); done
  echo "=== $(date '+%F %T') $PROG kill: SIGKILL to pid $pid" >>"$DIR/server-$N/kvserver.log"
  say "server $N (pid $pid): killed (SIGKILL)"
}

do_restart() {
  load_state || die "no cluster recorded in $DIR"
  ((N < NSERVERS)) || die "server $N is not in this cluster (0..$((NSERVERS - 1)))"
  local sd=$DIR/server-$N pid
  pid=$(cat "$sd/pid" 2>/dev/null || true)
  pid_alive "$pid" && die "server $N is still running (pid $pid)"
  [[ -f $sd/args ]] || die "no recorded command line in $sd/args (started by an older $PROG?)"
  local args=()
  mapfile -d '' args <"$sd/args"
  rm -f "$sd/port"
  echo "=== $(date '+%F %T') $PROG restart: $KVSERVER ${args[*]}" >>"$sd/kvserver.log"
  setsid "$KVSERVER" "${args[@]}" </dev/null >>"$sd/kvserver.log" 2>&1 &
  echo $! >"$sd/pid"
  local t=0
  until [[ -s $sd/port ]]; do
    t=$((t + 1))
    if ((t > 300)) || ! child_alive "$(cat "$sd/pid")"; then
      tail -n 15 "$sd/kvserver.log" | sed 's/^/    /' >&2
      die "server $N did not start again"
    fi
    sleep 0.1
  done
  say "server $N restarted (pid $(cat "$sd/pid"))"
}

# --- stop ------------------------------------------------------------------------------------
# stop_all TIMEOUT: SIGTERM every recorded server, SIGKILL what is left after TIMEOUT seconds.
stop_all() {
  local grace=$1 i pid live=() n_live=0
  for ((i = 0; i < NSERVERS; i++)); do
    pid=$(cat "$DIR/server-$i/pid" 2>/dev/null || true)
    if pid_alive "$pid"; then
      kill -TERM "$pid" 2>/dev/null || true
      live[i]=$pid
      n_live=$((n_live + 1))
    else
      say "server $i: not running"
    fi
  done
  ((n_live > 0)) || return 0
  local deadline=$((SECONDS + grace))
  while ((SECONDS < deadline)); do
    local left=0
    for i in "${!live[@]}"; do pid_alive "${live[i]}" && left=$((left + 1)); done
    ((left == 0)) && break
    sleep 0.1
  done
  for i in "${!live[@]}"; do
    if pid_alive "${live[i]}"; then
      warn "server $i (pid ${live[i]}) ignored SIGTERM for ${grace}s; sending SIGKILL"
      kill -KILL "${live[i]}" 2>/dev/null || true
      local t=0
      while pid_alive "${live[i]}" && ((t < 50)); do sleep 0.1; t=$((t + 1)); done
    fi
    say "server $i (pid ${live[i]}): stopped"
  done
}

# stop_etcd: stops the etcd this script started for the cluster (RDKV_ETCD=local), if any.
stop_etcd() {
  if [[ -n ${ETCD_PID_FILE:-} && -f $ETCD_PID_FILE ]]; then
    local epid
    epid=$(cat "$ETCD_PID_FILE")
    if [[ $epid =~ ^[0-9]+$ ]] && kill -0 "$epid" 2>/dev/null &&
      [[ $(tr '\0' ' ' <"/proc/$epid/cmdline" 2>/dev/null) == *etcd* ]]; then
      kill -TERM "$epid" 2>/dev/null || true
      local t=0
      while kill -0 "$epid" 2>/dev/null && ((t < 50)); do sleep 0.1; t=$((t + 1)); done
      kill -KILL "$epid" 2>/dev/null || true
      say "etcd (pid $epid): stopped"
    fi
    rm -f "$ETCD_PID_FILE"
  fi
}

do_stop() {
  if ! load_state; then
    say "no cluster recorded in $DIR; nothing to stop"
    return 0
  fi
  local grace=${RDKV_STOP_TIMEOUT:-10}
  stop_coordinators
  stop_all "$grace"
  stop_etcd
  say "cluster in $DIR stopped (data dirs and logs kept)"
}

# --- status ----------------------------------------------------------------------------------
do_status() {
  if ! load_state; then
    echo "$PROG: no cluster recorded in $DIR (start one with '$PROG start')" >&2
    exit 3
  fi
  [[ -n ${KVCLI:-} && -x ${KVCLI:-} ]] || KVCLI=""
  local i pid port addr state bad=0
  printf '%-4s %-8s %-6s %-22s %s\n' id pid port address state
  for ((i = 0; i < NSERVERS; i++)); do
    pid=$(cat "$DIR/server-$i/pid" 2>/dev/null || echo -)
    port=$((BASE_PORT + i))
    addr=$HOST:$port  # HOST, BASE_PORT, NSERVERS: from cluster.env
    if pid_alive "$pid"; then
      state=alive
      if [[ -n $KVCLI ]]; then
        if ping_server "$addr"; then state="alive, ping ok"; else state="alive, NOT answering ping"; bad=1; fi
      fi
    else
      state=dead
      bad=1
    fi
    printf '%-4s %-8s %-6s %-22s %s\n' "$i" "$pid" "$port" "$addr" "$state"
  done
  return $bad
}

case $cmd in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  kill) do_kill ;;
  restart) do_restart ;;
esac
