#!/usr/bin/env bash
# A cluster of N kvservers on this machine, for development, demos and tests.
#
#   deploy/local-cluster.sh start  [N] [DIR]   start N servers (default 3), wait until all answer
#   deploy/local-cluster.sh status [DIR]       pid, port and health of each; exit 1 if any is down
#   deploy/local-cluster.sh stop   [DIR]       SIGTERM, then SIGKILL after a timeout; idempotent
#
# DIR (the state dir) defaults to $RDKV_CLUSTER_DIR, else /tmp/rdkv-cluster. It holds:
#   cluster.env            what `start` chose (N, host, base port, binaries); read by stop/status
#   cluster-map.json       the generated cluster map (epoch 1, round-robin owners)
#   server-<id>/kvserver.log   the server's log (glog, to stderr); appended across restarts
#   server-<id>/pid, port      pid file, and the port the server reports once it serves
#   server-<id>/data       its --data_dir (kept by `stop`; delete DIR to start from empty)
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
#   RDKV_TRANSPORT     auto | tcp | verbs (default tcp)
#   RDKV_DEVICE        RDMA device for verbs (e.g. rxe0; default: kvserver picks)
#   RDKV_MEMORY        region size per server (default 128MiB)
#   RDKV_DURABILITY    sync | async | none (default none)
#   RDKV_AUTH_TOKEN    token clients must present (default: none)
#   RDKV_EXTRA_FLAGS   more kvserver flags, word-split (e.g. "--worker_threads=1")
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
    [0-9] | [0-9][0-9] | [0-9][0-9][0-9]) N=$a ;;
    -*) die "unknown option '$a'" ;;
    *) DIR=$a ;;
  esac
done
case $cmd in
  start | stop | status) ;;
  -h | --help | help) usage 0 ;;
  *) die "unknown command '$cmd' (start|stop|status)" ;;
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
  [[ -n ${AUTH_TOKEN:-} ]] && extra+=("--auth_token=$AUTH_TOKEN")
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
  [[ $base =~ ^[0-9]+$ ]] && ((base >= 1 && base + N - 1 <= 65535)) ||
    die "RDKV_BASE_PORT=$base: ports $base..$((base + N - 1)) must lie in 1..65535"
  local metrics_base=${RDKV_METRICS_BASE_PORT:-$((base + N))}
  [[ $metrics_base == off ]] ||
    { [[ $metrics_base =~ ^[0-9]+$ ]] && ((metrics_base >= 1 && metrics_base + N - 1 <= 65535)); } ||
    die "RDKV_METRICS_BASE_PORT=$metrics_base: ports $metrics_base..$((metrics_base + N - 1)) must lie in 1..65535 (or off)"
  [[ $shards =~ ^[0-9]+$ ]] && ((shards >= 1 && shards <= 4096)) ||
    die "RDKV_SHARDS=$shards must be 1..4096"
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
  AUTH_TOKEN=${RDKV_AUTH_TOKEN:-}
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
    printf ']\n}\n'
  } >"$map.tmp"
  mv "$map.tmp" "$map"

  (
    umask 077  # it may hold the auth token
    echo "# written by $PROG start; read by stop and status"
    printf '%s=%q\n' NSERVERS "$N" HOST "$host" BASE_PORT "$base" TRANSPORT "$transport" \
      KVSERVER "$KVSERVER" KVCLI "$KVCLI" AUTH_TOKEN "${RDKV_AUTH_TOKEN:-}"
  ) >"$DIR/cluster.env"

  local skipped=()
  local common=(--host="$host" --transport="$transport" --memory="$memory")
  [[ -n ${RDKV_DEVICE:-} ]] && common+=(--device="$RDKV_DEVICE")
  [[ -n ${RDKV_AUTH_TOKEN:-} ]] && common+=(--auth_token="$RDKV_AUTH_TOKEN")
  if has_flag cluster_map; then common+=(--cluster_map="$map"); else skipped+=(--cluster_map); fi
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
    [[ $metrics_base == off ]] || args+=(--metrics_port=$((metrics_base + i)))
    ((has_id)) && args+=(--server_id="$i")
    ((has_data)) && args+=(--data_dir="$sd/data")
    args+=("${extra[@]}")
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
      exit 1
    fi
  done
  [[ -n $KVCLI ]] || warn "kvcli not found next to kvserver: readiness checked with a TCP connect, not a ping"
  say "all $N servers answer; cluster map: $map"
  echo "seed: $host:$base"
  if [[ $metrics_base != off ]]; then
    for ((i = 0; i < N; i++)); do
      echo "metrics: server $i: http://$host:$((metrics_base + i))/metrics"
    done
  fi
  if [[ -n $KVCLI ]]; then
    local t=""
    [[ $transport != auto ]] && t=" --transport=$transport"
    echo "try:  $KVCLI --server=$host:$base$t put hello world && $KVCLI --server=$host:$base$t get hello"
  fi
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

do_stop() {
  if ! load_state; then
    say "no cluster recorded in $DIR; nothing to stop"
    return 0
  fi
  local grace=${RDKV_STOP_TIMEOUT:-10}
  stop_all "$grace"
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
esac
