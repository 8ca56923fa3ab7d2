#!/usr/bin/env bash
# Tests deploy/local-cluster.sh.
#
#   tests/deploy/local_cluster_test.sh script BUILD_DIR
#       The script's own logic against a stand-in kvserver (fake-kvserver.py): generated map,
#       flags passed and left out, readiness, status, stop (SIGTERM, then SIGKILL), idempotent
#       stop, and the errors for a missing binary, a busy port and a server that dies at start.
#   tests/deploy/local_cluster_test.sh real BUILD_DIR
#       A 3-server cluster of the real kvserver from BUILD_DIR over tcp: start, status, each
#       server answers (kvcli ping, else a TCP connect), put/get with kvcli when it exists, stop,
#       status says dead, stop again; with durability=sync: restart keeps the data, kvcli
#       cluster move, and a restart keeps the moved map; with etcd installed: the map in a local
#       etcd and two kvcoord coordinators (RDKV_COORDINATORS), each serving /metrics where
#       start prints, one of them elected. Exits 77 (SKIPPED) when this kvserver cannot serve
#       over tcp yet.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ROOT=$DEPLOY_TEST_ROOT
LC=$ROOT/deploy/local-cluster.sh
mode=${1:?usage: $0 script|real BUILD_DIR}
BUILD=${2:?usage: $0 script|real BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd)

WORK=$(mktemp -d /tmp/rdkv-lc-test.XXXXXX)
listener_pid=""
cleanup() {
  # Whatever a failed check left running: stop every cluster this test made.
  for d in "$WORK"/c*; do [[ -d $d ]] && RDKV_STOP_TIMEOUT=2 "$LC" stop "$d" >/dev/null 2>&1 || true; done
  [[ -n $listener_pid ]] && kill "$listener_pid" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# pids_gone DIR: no pid recorded in DIR belongs to a live process.
pids_gone() {
  local f pid
  for f in "$1"/server-*/pid; do
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null && [[ -n $(tr -d '\0' 2>/dev/null <"/proc/$pid/cmdline") ]]; then return 1; fi
  done
}

# map_ok MAPFILE N SHARDS BASE: the generated map is what the cluster map format wants.
map_ok() {
  python3 - "$@" <<'EOF'
import json, sys
path, n, shards, base = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
m = json.load(open(path))
assert set(m) == {"epoch", "shards", "servers", "owners"}, m.keys()
assert m["epoch"] == 1 and m["shards"] == shards
assert m["servers"] == [{"id": i, "address": f"127.0.0.1:{base + i}"} for i in range(n)], m["servers"]
assert m["owners"] == [s % n for s in range(shards)], m["owners"]
EOF
}

# new_ports N: exports RDKV_BASE_PORT, a fresh free range of N ports, into `base` (2N ports are
# free: the N after the servers' are their /metrics ports).
new_ports() {
  base=$(free_base_port $((2 * $1))) || skip "no free port range found"
  export RDKV_BASE_PORT=$base
}

test_script() {
  command -v python3 >/dev/null || skip "python3 is not installed (the stand-in kvserver is a python script)"
  local bin=$WORK/bin
  mkdir -p "$bin"
  cp "$ROOT/tests/deploy/fake-kvserver.py" "$bin/kvserver"
  chmod +x "$bin/kvserver"
  export RDKV_BIN=$bin RDKV_HOST=127.0.0.1
  unset RDKV_CLUSTER_DIR RDKV_TRANSPORT RDKV_DURABILITY RDKV_EXTRA_FLAGS RDKV_AUTH_TOKEN RDKV_SHARDS

  # Missing binary.
  RDKV_BIN=$WORK/nowhere expect_rc 2 "start without a kvserver fails" "$LC" start 3 "$WORK/c0"
  contains "  ... and says kvserver is missing" "kvserver not found"
  contains "  ... and how to build it" "cmake --build"

  # A normal lifecycle.
  local base d=$WORK/c1
  new_ports 3
  expect_rc 0 "start 3 servers" "$LC" start 3 "$d"
  contains "  ... prints the seed address" "seed: 127.0.0.1:$base"
  check "  ... the generated map has 3 servers, 64 shards, round-robin owners, epoch 1" \
    map_ok "$d/cluster-map.json" 3 64 "$base"
  contains "  ... kvserver -> no kvcli: says readiness used a TCP connect" "TCP connect"
  local i ports_ok=1 flags_ok=1
  for i in 0 1 2; do
    [[ $(cat "$d/server-$i/port" 2>/dev/null) == $((base + i)) ]] || ports_ok=0
    grep -q -- "--server_id=$i " "$d/server-$i/kvserver.log" || flags_ok=0
    grep -q -- "--data_dir=$d/server-$i/data" "$d/server-$i/kvserver.log" || flags_ok=0
    grep -q -- "--cluster_map=$d/cluster-map.json" "$d/server-$i/kvserver.log" || flags_ok=0
    grep -q -- "--durability=none" "$d/server-$i/kvserver.log" || flags_ok=0
    [[ -d $d/server-$i/data ]] || flags_ok=0
  done
  check "  ... server i listens on base port + i" test $ports_ok = 1
  check "  ... each server got --server_id, --data_dir, --cluster_map, --durability" test $flags_ok = 1
  expect_rc 0 "status of a running cluster" "$LC" status "$d"
  check "  ... lists 3 alive servers" test "$(grep -c ' alive' <<<"$OUT")" = 3
  expect_rc 2 "a second start on a running cluster is refused" "$LC" start 3 "$d"
  contains "  ... and says to stop it first" "still running"
  expect_rc 2 "another cluster on the same ports is refused" "$LC" start 2 "$WORK/c2"
  contains "  ... naming the busy port" "$((base + 1))"
  expect_rc 0 "stop" "$LC" stop "$d"
  check "  ... every server process is gone" pids_gone "$d"
  expect_rc 1 "status after stop exits 1" "$LC" status "$d"
  check "  ... and reports 3 dead servers" test "$(grep -c ' dead' <<<"$OUT")" = 3
  expect_rc 0 "stop again (idempotent)" "$LC" stop "$d"
  contains "  ... says they are not running" "not running"
  expect_rc 0 "stop on a dir that never held a cluster" "$LC" stop "$WORK/never"
  expect_rc 3 "status on a dir that never held a cluster exits 3" "$LC" status "$WORK/never"
  new_ports 3
  expect_rc 0 "start again in the same dir after stop" "$LC" start 3 "$d"
  expect_rc 0 "  ... and stop" "$LC" stop "$d"

  # RDKV_CLUSTER_DIR as the default state dir; N=1.
  new_ports 1
  RDKV_CLUSTER_DIR=$WORK/c3 expect_rc 0 "start 1 with RDKV_CLUSTER_DIR" "$LC" start 1
  check "  ... writes its state there" test -s "$WORK/c3/server-0/pid"
  RDKV_CLUSTER_DIR=$WORK/c3 expect_rc 0 "  ... stop with RDKV_CLUSTER_DIR" "$LC" stop

  # A kvserver without the cluster/persistence flags: they are left out, with a warning.
  new_ports 2
  FAKE_KVSERVER_FLAGS="" RDKV_DURABILITY=sync expect_rc 0 "start with a kvserver lacking --cluster_map etc." \
    "$LC" start 2 "$WORK/c4"
  contains "  ... warns which flags it left out" "does not take --cluster_map --durability --server_id --data_dir"
  contains "  ... warns that durability=sync was not honoured" "RDKV_DURABILITY=sync"
  "$LC" stop "$WORK/c4" >/dev/null

  # A port held by something else.
  new_ports 3
  # (SO_REUSEADDR: the port may still have TIME_WAIT connections from the clusters above.)
  python3 -c 'import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1",int(sys.argv[1]))); s.listen(); time.sleep(60)' $((base + 1)) &
  listener_pid=$!
  local listening=0
  for _ in $(seq 1 50); do
    [[ -n $(ss -Hltn "sport = :$((base + 1))") ]] && { listening=1; break; }
    sleep 0.1
  done
  check "a test listener holds port $((base + 1))" test $listening = 1
  expect_rc 2 "start with a busy port fails" "$LC" start 3 "$WORK/c5"
  contains "  ... naming the port" "port(s) already in use on 127.0.0.1: $((base + 1))"
  contains "  ... and the process holding it" "pid $listener_pid"
  kill "$listener_pid"
  wait "$listener_pid" 2>/dev/null || true
  listener_pid=""

  # A server that exits at start.
  new_ports 2
  FAKE_KVSERVER_FAIL="NotSupported: test failure" expect_rc 1 "a server that dies at start fails start" \
    "$LC" start 2 "$WORK/c6"
  contains "  ... shows its log" "cannot start: NotSupported: test failure"
  check "  ... and leaves nothing running" pids_gone "$WORK/c6"

  # A server that ignores SIGTERM gets SIGKILL.
  new_ports 2
  FAKE_KVSERVER_IGNORE_TERM=1 expect_rc 0 "start servers that ignore SIGTERM" "$LC" start 2 "$WORK/c7"
  RDKV_STOP_TIMEOUT=1 expect_rc 0 "stop them" "$LC" stop "$WORK/c7"
  contains "  ... escalating to SIGKILL" "sending SIGKILL"
  check "  ... and they are gone" pids_gone "$WORK/c7"

  # Bad arguments.
  expect_rc 2 "an unknown command is an error" "$LC" restart
  expect_rc 2 "N=0 is an error" "$LC" start 0 "$WORK/c8"
  expect_rc 0 "--help" "$LC" --help
  contains "  ... documents the environment" "RDKV_BASE_PORT"
}

test_real() {
  local kvserver=$BUILD/server/kvserver kvcli=$BUILD/tools/kvcli
  [[ -x $kvserver ]] || { bad "no kvserver in $BUILD/server (build the kvserver target)"; return; }
  export RDKV_BIN=$BUILD RDKV_TRANSPORT=tcp RDKV_MEMORY=64MiB RDKV_HOST=127.0.0.1 RDKV_START_TIMEOUT=60
  unset RDKV_CLUSTER_DIR RDKV_DURABILITY RDKV_EXTRA_FLAGS RDKV_AUTH_TOKEN RDKV_SHARDS

  # Can this kvserver serve over tcp at all? (The transport may still be under construction.)
  local probe=$WORK/probe
  timeout 10 "$kvserver" --transport=tcp --host=127.0.0.1 --port=0 --memory=16MiB \
    --port_file="$probe" >"$WORK/probe.log" 2>&1 &
  local ppid=$!
  for _ in $(seq 1 100); do [[ -s $probe ]] && break; kill -0 $ppid 2>/dev/null || break; sleep 0.1; done
  kill $ppid 2>/dev/null || true
  wait $ppid 2>/dev/null || true
  if [[ ! -s $probe ]] && grep -q "NotSupported" "$WORK/probe.log"; then
    skip "this kvserver cannot serve over tcp yet: $(grep -m1 'cannot start' "$WORK/probe.log")"
  fi
  [[ -s $probe ]] || { bad "kvserver does not start over tcp:"; sed 's/^/    | /' "$WORK/probe.log"; return; }

  local base d=$WORK/c1 i
  base=$(free_base_port 6) || skip "no free port range found"  # 3 servers, 3 /metrics
  export RDKV_BASE_PORT=$base
  expect_rc 0 "start 3 real kvservers over tcp" "$LC" start 3 "$d"
  contains "  ... prints the seed address" "seed: 127.0.0.1:$base"
  if grep -qE -- "^[[:space:]]+-metrics_port \(" <<<"$("$kvserver" --helpfull 2>&1 || true)"; then
    contains "  ... prints each server's /metrics URL" "metrics: server 2: http://127.0.0.1:$((base + 5))/metrics"
    check "  ... server 0 serves Prometheus metrics next to its port" \
      bash -c "curl -fsS 'http://127.0.0.1:$((base + 3))/metrics' | grep -q '^rdkv_items '"
  fi
  expect_rc 0 "status" "$LC" status "$d"
  check "  ... lists 3 alive servers" test "$(grep -c ' alive' <<<"$OUT")" = 3
  if [[ -x $kvcli ]]; then
    for i in 0 1 2; do
      expect_rc 0 "kvcli ping server $i" "$kvcli" --transport=tcp --server="127.0.0.1:$((base + i))" ping
    done
    local seeds=(0)
    if grep -qE -- "^[[:space:]]+-cluster_map \(" <<<"$("$kvserver" --helpfull 2>&1 || true)"; then
      seeds=(0 1 2)  # one cluster: any server is a seed, the client routes each key to its owner
    fi
    for i in 0 1 2 3 4 5 6 7; do
      expect_rc 0 "put key$i via seed server 0" "$kvcli" --transport=tcp --server="127.0.0.1:$base" put "key$i" "value$i"
    done
    local s
    for s in "${seeds[@]}"; do
      for i in 0 1 2 3 4 5 6 7; do
        expect_rc 0 "get key$i via seed server $s" "$kvcli" --transport=tcp --server="127.0.0.1:$((base + s))" get "key$i"
        contains "  ... returns value$i" "value$i"
      done
    done
    expect_rc 1 "get of a missing key exits 1" "$kvcli" --transport=tcp --server="127.0.0.1:$base" get no-such-key
  else
    echo "SKIPPED: ping and put/get: no kvcli in $BUILD/tools yet (start checked each server with a TCP connect)"
    for i in 0 1 2; do
      # shellcheck disable=SC2016
      check "server $i accepts TCP connections" timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ $((base + i))
    done
  fi
  expect_rc 0 "stop" "$LC" stop "$d"
  check "  ... every server process is gone" pids_gone "$d"
  expect_rc 1 "status after stop exits 1" "$LC" status "$d"
  check "  ... and reports 3 dead servers" test "$(grep -c ' dead' <<<"$OUT")" = 3
  expect_rc 0 "stop again (idempotent)" "$LC" stop "$d"
  check "no server logged an error" bash -c "! grep -h '^E[0-9]' $d/server-*/kvserver.log"

  # With persistence: stop and start again in the same dir keeps what was written.
  local help
  help=$("$kvserver" --helpfull 2>&1 || true)
  if ! grep -qE -- "^[[:space:]]+-durability \(" <<<"$help" || ! grep -qE -- "^[[:space:]]+-data_dir \(" <<<"$help"; then
    echo "SKIPPED: restart with durability=sync: this kvserver has no --durability/--data_dir yet"
  elif [[ ! -x $kvcli ]]; then
    echo "SKIPPED: restart with durability=sync: no kvcli in $BUILD/tools yet"
  else
    local p=$WORK/c2 cli=("$kvcli" --transport=tcp --server="127.0.0.1:$base")
    RDKV_DURABILITY=sync expect_rc 0 "start 2 servers with durability=sync" "$LC" start 2 "$p"
    expect_rc 0 "  ... put a key" "${cli[@]}" put durable-key durable-value
    expect_rc 0 "  ... stop" "$LC" stop "$p"
    check "  ... the data dir of server 0 holds something" bash -c "[[ -n \$(ls -A '$p/server-0/data') ]]"
    RDKV_DURABILITY=sync expect_rc 0 "  ... start again in the same dir" "$LC" start 2 "$p"
    expect_rc 0 "  ... the key is still there" "${cli[@]}" get durable-key
    contains "  ... with its value" "durable-value"
    # One-command shard move; the servers keep the new map across a restart.
    local k
    for k in 0 1 2 3 4 5 6 7 8 9; do "${cli[@]}" put "move-key$k" "move-value$k" >/dev/null; done
    expect_rc 0 "  ... kvcli cluster move 0,2 1" "$kvcli" --transport=tcp --seed="127.0.0.1:$base" cluster move 0,2 1
    contains "  ... reports the move" "moved shards 0,2 to server 1: map epoch 1 -> 2"
    contains "  ... with its steps" "step 4/4"
    expect_rc 0 "  ... kvcli cluster" "${cli[@]}" cluster
    contains "  ... shows map epoch 2" "cluster map epoch 2"
    check "  ... and server 1 owning shards 0 and 2" grep -qE "^server 1 .* shards 0-3,5," <<<"$OUT"
    expect_rc 2 "  ... a shard that does not exist is refused" "${cli[@]}" cluster move 64 1
    expect_rc 2 "  ... malformed SHARDS are refused" "${cli[@]}" cluster move 3-1 1
    expect_rc 0 "  ... stop" "$LC" stop "$p"
    RDKV_DURABILITY=sync expect_rc 0 "  ... start again" "$LC" start 2 "$p"
    expect_rc 0 "  ... kvcli cluster" "${cli[@]}" cluster
    contains "  ... the servers kept map epoch 2 (their --cluster_map file says 1)" "cluster map epoch 2"
    check "  ... server 0 logged which map it chose" grep -q "using the saved map" "$p/server-0/kvserver.log"
    local all_there=1
    for k in 0 1 2 3 4 5 6 7 8 9; do
      [[ $("${cli[@]}" get "move-key$k" 2>&1) == "move-value$k" ]] || all_there=0
    done
    check "  ... every key written before the move is there" test $all_there = 1
    expect_rc 0 "  ... stop" "$LC" stop "$p"
  fi

  # The map in etcd (started here) and two failover coordinators, each with its /metrics.
  if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; then
    echo "SKIPPED: coordinators: etcd and etcdctl are not installed (deploy/install-deps.sh installs them)"
  elif [[ ! -x $kvcli ]]; then
    echo "SKIPPED: coordinators: no kvcli in $BUILD/tools (it imports the map into etcd)"
  elif [[ ! -x $BUILD/coordinator/kvcoord ]]; then
    bad "no kvcoord in $BUILD/coordinator (build the kvcoord target)"
  else
    local e=$WORK/c3 cpids=() leaders
    # 2 servers, their 2 /metrics, etcd's client and peer ports, 2 coordinators' /metrics.
    base=$(free_base_port 8) || skip "no free port range found"
    export RDKV_BASE_PORT=$base
    RDKV_ETCD=local RDKV_COORDINATORS=2 RDKV_CLUSTER_NAME=lc expect_rc 0 \
      "start 2 servers with the map in a local etcd and 2 coordinators" "$LC" start 2 "$e"
    contains "  ... prints each coordinator's /metrics URL" \
      "metrics: coordinator 1: http://127.0.0.1:$((base + 7))/metrics"
    for i in 0 1; do
      check "  ... coordinator $i serves rdkv_coordinator_* metrics on port $((base + 6 + i))" \
        bash -c "curl -fsS 'http://127.0.0.1:$((base + 6 + i))/metrics' | grep -q '^rdkv_coordinator_terms_total '"
      cpids+=("$(cat "$e/coord-$i/pid" 2>/dev/null)")
    done
    # Both stand for election; the metrics say which one won (the other keeps 0).
    leaders=0
    for _ in $(seq 1 100); do
      leaders=0
      for i in 0 1; do
        curl -fsS "http://127.0.0.1:$((base + 6 + i))/metrics" 2>/dev/null |
          grep -q '^rdkv_coordinator_is_leader 1' && leaders=$((leaders + 1))
      done
      ((leaders == 1)) && break
      sleep 0.1
    done
    check "  ... exactly one reports rdkv_coordinator_is_leader 1 (within 10 s)" test "$leaders" = 1
    expect_rc 0 "  ... stop" "$LC" stop "$e"
    contains "  ... stops the coordinators" "coordinator coord-1 (pid ${cpids[1]}): stopped"
    check "  ... every server process is gone" pids_gone "$e"
    check "  ... and both coordinators" bash -c '! kill -0 "$1" 2>/dev/null && ! kill -0 "$2" 2>/dev/null' _ "${cpids[@]}"
  fi

  # Secrets (docs/security.md "Secrets: files, not command lines"): RDKV_AUTH_TOKEN and
  # RDKV_ADMIN_TOKEN become mode-0600 files in the cluster dir, never command-line arguments.
  if [[ -x $kvcli ]]; then
    local sd=$WORK/c4 data_secret=lc-data-$RANDOM$RANDOM admin_secret=lc-admin-$RANDOM$RANDOM
    base=$(free_base_port 4) || skip "no free port range found"
    export RDKV_BASE_PORT=$base
    RDKV_AUTH_TOKEN=$data_secret RDKV_ADMIN_TOKEN=$admin_secret expect_rc 0 \
      "start 2 servers with RDKV_AUTH_TOKEN and RDKV_ADMIN_TOKEN" "$LC" start 2 "$sd"
    check "  ... no secret on any command line (ps)" \
      bash -c '! ps -eo args | grep -v grep | grep -F -e "$1" -e "$2" >/dev/null' _ "$data_secret" "$admin_secret"
    check "  ... the secret files are mode 600" \
      bash -c '[[ $(stat -c %a "$1/auth_token") == 600 && $(stat -c %a "$1/admin_token") == 600 ]]' _ "$sd"
    expect_rc 2 "  ... a client without the data secret is refused" \
      "$kvcli" --transport=tcp --server="127.0.0.1:$base" put lc-key lc-value
    contains "  ... with PermissionDenied" "PermissionDenied"
    expect_rc 0 "  ... a client with the secret file writes" \
      "$kvcli" --transport=tcp --server="127.0.0.1:$base" --auth_token_file="$sd/auth_token" put lc-key lc-value
    expect_rc 0 "  ... and reads" \
      "$kvcli" --transport=tcp --server="127.0.0.1:$((base + 1))" --auth_token_file="$sd/auth_token" get lc-key
    contains "  ... the value" "lc-value"
    check "  ... no secret in the servers' logs" \
      bash -c '! grep -F -e "$1" -e "$2" "$3"/server-*/kvserver.log >/dev/null' _ "$data_secret" "$admin_secret" "$sd"
    expect_rc 0 "  ... stop" "$LC" stop "$sd"
  fi
}

case $mode in
  script) test_script ;;
  real) test_real ;;
  *) echo "usage: $0 script|real BUILD_DIR" >&2; exit 2 ;;
esac
finish
