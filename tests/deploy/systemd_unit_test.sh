#!/usr/bin/env bash
# Tests deploy/systemd/rdkv-kvserver@.service, its example env file and the example cluster map.
#
#   tests/deploy/systemd_unit_test.sh BUILD_DIR
#
# 1. `systemd-analyze verify` prints nothing (it exits 0 even for unknown keys or bad values, so
#    any message fails the test). ExecStart points at a copy of the binary in a temp dir.
# 2. The settings RDMA needs are there, and the ones that break it are not.
# 3. `systemd-analyze security --offline` rates the unit's exposure at most 3.0 of 10.
# 4. The example cluster map follows the format of common/cluster/cluster_map.h.
# 5. The unit's ExecStart, run by hand the way systemd would (specifiers expanded, Environment=
#    and the example env file loaded, a few values overridden for a local run), starts the real
#    kvserver and it serves over tcp. SKIPPED (that part only) while kvserver lacks one of the
#    flags the unit passes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ROOT=$DEPLOY_TEST_ROOT
BUILD=${1:?usage: $0 BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd)
UNIT=$ROOT/deploy/systemd/rdkv-kvserver@.service
ENVFILE=$ROOT/deploy/systemd/kvserver-0.env.example
MAP=$ROOT/deploy/config/cluster-map.example.json

command -v systemd-analyze >/dev/null ||
  skip "systemd-analyze is not installed (Debian package 'systemd')"

WORK=$(mktemp -d /tmp/rdkv-systemd-test.XXXXXX)
server_pid=""
cleanup() {
  [[ -n $server_pid ]] && kill -KILL "$server_pid" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- 1. systemd-analyze verify -----------------------------------------------------------------
bin=$WORK/bin/kvserver
mkdir -p "$WORK/bin" "$WORK/units"
if [[ -x $BUILD/server/kvserver ]]; then cp "$BUILD/server/kvserver" "$bin"; else printf '#!/bin/sh\n' >"$bin"; fi
chmod +x "$bin"
grep -q '^ExecStart=/usr/local/bin/kvserver ' "$UNIT" && ok "ExecStart runs /usr/local/bin/kvserver" ||
  bad "ExecStart does not start with /usr/local/bin/kvserver (this test rewrites that path)"
sed "s|/usr/local/bin/kvserver|$bin|" "$UNIT" >"$WORK/units/rdkv-kvserver@.service"
OUT=$(cd "$WORK/units" && systemd-analyze verify rdkv-kvserver@.service 2>&1) && rc=0 || rc=$?
if [[ $rc == 0 && -z $OUT ]]; then
  ok "systemd-analyze verify: no complaints"
else
  bad "systemd-analyze verify (exit $rc) complained:"
  sed 's/^/    | /' <<<"$OUT"
fi
# The check above must be able to fail: a misspelt key and a bad value have to show up.
sed -e 's/^LockPersonality=yes/LockPersonalty=yes/' -e 's/^Restart=on-failure/Restart=bogus/' \
  "$WORK/units/rdkv-kvserver@.service" >"$WORK/units/broken@.service"
OUT=$(cd "$WORK/units" && systemd-analyze verify broken@.service 2>&1) || true
check "  ... and it does report a misspelt key and a bad value" \
  bash -c 'grep -q "LockPersonalty" <<<"$1" && grep -q "bogus" <<<"$1"' _ "$OUT"

# The coordinator's unit (deploy/systemd/rdkv-kvcoord.service): verify and exposure.
CUNIT=$ROOT/deploy/systemd/rdkv-kvcoord.service
cbin=$WORK/bin/kvcoord
if [[ -x $BUILD/coordinator/kvcoord ]]; then cp "$BUILD/coordinator/kvcoord" "$cbin"; else printf '#!/bin/sh\n' >"$cbin"; fi
chmod +x "$cbin"
sed "s|/usr/local/bin/kvcoord|$cbin|" "$CUNIT" >"$WORK/units/rdkv-kvcoord.service"
OUT=$(cd "$WORK/units" && systemd-analyze verify rdkv-kvcoord.service 2>&1) && rc=0 || rc=$?
if [[ $rc == 0 && -z $OUT ]]; then
  ok "kvcoord unit: systemd-analyze verify: no complaints"
else
  bad "kvcoord unit: systemd-analyze verify (exit $rc) complained:"
  sed 's/^/    | /' <<<"$OUT"
fi
if [[ -x $BUILD/coordinator/kvcoord ]]; then
  # Every flag the unit passes through --tryfromenv is one kvcoord has.
  cflags=$(sed -n 's/.*--tryfromenv=\([a-z_,]*\).*/\1/p' "$CUNIT" | tr ',' ' ')
  chelp=$("$BUILD/coordinator/kvcoord" --help 2>&1)
  missing=""
  for f in $cflags; do grep -qE -- "^ +-$f " <<<"$chelp" || missing+=" $f"; done
  check "kvcoord unit: every --tryfromenv flag exists in kvcoord${missing:+ (missing:$missing)}" test -z "$missing"
fi

# --- 2. what RDMA needs ------------------------------------------------------------------------
has() { grep -qE "^$1" "$UNIT"; }
check "LimitMEMLOCK=infinity (registered memory is pinned)" has 'LimitMEMLOCK=infinity$'
check "PrivateDevices is not turned on (it hides /dev/infiniband)" bash -c "! grep -qE '^PrivateDevices=(yes|true|1|on)' '$UNIT'"
check "DeviceAllow lets it open the uverbs devices" has 'DeviceAllow=char-infiniband_verbs rw'
check "DeviceAllow lets it open /dev/infiniband/rdma_cm" has 'DeviceAllow=/dev/infiniband/rdma_cm rw'
check "RestrictAddressFamilies allows AF_NETLINK AF_INET AF_INET6 AF_UNIX" \
  bash -c "line=\$(grep '^RestrictAddressFamilies=' '$UNIT'); for f in AF_NETLINK AF_INET AF_INET6 AF_UNIX; do [[ \" \${line#*=} \" == *\" \$f \"* ]] || exit 1; done"
check "RDMAV_HUGEPAGES_SAFE=1 in the environment" has 'Environment=RDMAV_HUGEPAGES_SAFE=1$'
check "EnvironmentFile=/etc/rdkv/kvserver-%i.env" has 'EnvironmentFile=/etc/rdkv/kvserver-%i.env$'
check "StateDirectory=rdkv/%i and --data_dir there" \
  bash -c "grep -q '^StateDirectory=rdkv/%i$' '$UNIT' && grep -q -- '--data_dir=%S/rdkv/%i' '$UNIT'"
check "the server id is the instance name" bash -c "grep -q -- '--server_id=%i' '$UNIT'"
check "Restart=on-failure" has 'Restart=on-failure$'
# gflags silently ignores a FLAGS_<name> variable that --tryfromenv does not list.
env_flags_listed() {
  local listed f bad_ones=()
  listed=",$(sed -n 's/.*--tryfromenv=\([a-z_,]*\).*/\1/p' "$UNIT"),"
  for f in $(grep -oE '^#?FLAGS_[a-z_]+' "$ENVFILE" | sed 's/^#\{0,1\}FLAGS_//'); do
    [[ $listed == *",$f,"* ]] || bad_ones+=("$f")
  done
  ((${#bad_ones[@]} == 0)) || { echo "    not in --tryfromenv: ${bad_ones[*]}"; return 1; }
}
check "every FLAGS_ line of the example env file is listed in --tryfromenv" env_flags_listed

# --- 3. exposure -------------------------------------------------------------------------------
OUT=$(cd "$WORK/units" && systemd-analyze security --offline=true --no-pager rdkv-kvserver@.service 2>&1) || true
level=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' <<<"$OUT")
if [[ -n $level ]] && awk -v l="$level" 'BEGIN { exit !(l <= 3.0) }'; then
  ok "systemd-analyze security: exposure $level (at most 3.0)"
elif [[ -z $level ]]; then
  echo "SKIPPED: exposure rating: this systemd-analyze has no 'security --offline':"
  tail -n 3 <<<"$OUT" | sed 's/^/    | /'
else
  bad "systemd-analyze security: exposure $level is above 3.0"
fi

# --- 4. the example cluster map ----------------------------------------------------------------
map_valid() {
  python3 - "$1" <<'EOF'
import json, re, sys
m = json.load(open(sys.argv[1]))
assert isinstance(m, dict), "top level must be an object"
assert set(m) <= {"epoch", "shards", "servers", "owners"}, f"unknown fields {set(m)}"
assert isinstance(m["epoch"], int) and m["epoch"] > 0, "epoch"
assert isinstance(m["shards"], int) and 1 <= m["shards"] <= 4096, "shards"
ids = [s["id"] for s in m["servers"]]
assert 1 <= len(ids) <= 256 and len(set(ids)) == len(ids) and all(0 <= i < 256 for i in ids), "ids"
for s in m["servers"]:
    assert set(s) == {"id", "address"}, s
    assert re.fullmatch(r".+:([1-9][0-9]{0,4})", s["address"]) and int(s["address"].rsplit(":", 1)[1]) <= 65535, s
if "owners" in m:
    assert len(m["owners"]) == m["shards"] and all(o in ids for o in m["owners"]), "owners"
EOF
}
if command -v python3 >/dev/null; then
  check "the example cluster map is valid" map_valid "$MAP"
else
  echo "SKIPPED: example map check: python3 is not installed"
fi

# --- 5. the unit's command line starts kvserver ------------------------------------------------
help=$("$BUILD/server/kvserver" --helpfull 2>&1 || true)
flags=$(sed -n 's/.*--tryfromenv=\([a-z_,]*\).*/\1/p' "$UNIT" | tr ',' ' ')
flags="$flags server_id data_dir"
missing=()
for f in $flags; do grep -qE -- "^[[:space:]]+-$f \(" <<<"$help" || missing+=("--$f"); done
if [[ ! -x $BUILD/server/kvserver ]]; then
  bad "no kvserver in $BUILD/server"
elif ((${#missing[@]} > 0)); then
  echo "SKIPPED: running the unit's ExecStart: this kvserver lacks ${missing[*]} yet"
else
  port=$(free_base_port 1) || skip "no free port"
  state=$WORK/state
  mkdir -p "$state/rdkv/0"
  # ExecStart with its continuation lines joined and the specifiers expanded.
  exec_line=$(sed -n '/^ExecStart=/,/[^\\]$/p' "$UNIT" | sed 's/\\$//' | tr -d '\n' | sed 's/^ExecStart=//')
  exec_line=${exec_line//%i/0}
  exec_line=${exec_line//%S/$state}
  exec_line=${exec_line//\/usr\/local\/bin\/kvserver/$BUILD/server/kvserver}
  printf '{"epoch": 1, "shards": 8, "servers": [{"id": 0, "address": "127.0.0.1:%d"}]}\n' "$port" >"$WORK/map.json"
  (
    set -a
    while IFS= read -r l; do [[ $l == Environment=* ]] && eval "export ${l#Environment=}"; done <"$UNIT"
    # shellcheck source=/dev/null
    source "$ENVFILE"
    # Local overrides: this host, a free port, tcp, a small region, the map above.
    export FLAGS_host=127.0.0.1 FLAGS_port=$port FLAGS_transport=tcp FLAGS_memory=32MiB
    export FLAGS_cluster_map=$WORK/map.json FLAGS_durability=none
    export KVSERVER_EXTRA_FLAGS="--port_file=$WORK/port"
    set +a
    # systemd expands $VAR (unbraced) in ExecStart into words split on whitespace, as eval does.
    eval "exec $exec_line"
  ) >"$WORK/kvserver.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 100); do [[ -s $WORK/port ]] && break; kill -0 $server_pid 2>/dev/null || break; sleep 0.1; done
  if [[ -s $WORK/port ]] && timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$port"; then
    ok "the unit's ExecStart with the example env file starts kvserver, which serves on $port"
  else
    bad "the unit's ExecStart did not start a serving kvserver; its log:"
    sed 's/^/    | /' "$WORK/kvserver.log"
  fi
  kill -TERM "$server_pid" 2>/dev/null || true
  rc=0
  wait "$server_pid" || rc=$?
  server_pid=""
  check "  ... and exits 0 on SIGTERM (systemd's stop)" test "$rc" = 0
fi

finish
