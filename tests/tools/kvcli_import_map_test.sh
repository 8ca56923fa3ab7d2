#!/usr/bin/env bash
# kvcli cluster import-map and the replication factor (docs/operations.md): a map file without
# replicas gets backups from --replication_factor; one with replica sets keeps them, and its
# factor comes from the file, the flag (at least its largest set) or, when neither says, its
# largest set (said on stderr), so that kvcoord restores a lost replica; a factor above the
# servers is refused, from the flag or from the file.
#
#   kvcli_import_map_test.sh KVCLI
# Exits 77 (SKIPPED) when etcd is not installed.
set -uo pipefail
kvcli=$1
command -v etcd >/dev/null || { echo "SKIPPED: etcd is not installed (apt-get install etcd-server)"; exit 77; }
command -v etcdctl >/dev/null || { echo "SKIPPED: etcdctl is not installed (apt-get install etcd-client)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-import-map.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { echo "ok - $*"; }

# Free ports are picked, then released, so another test may take one before etcd binds it:
# start again on new ports (at most 5 tries) until etcd answers.
start_etcd() {
  read -r client_port peer_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
  rm -rf "$work/etcd"
  etcd --name im --data-dir "$work/etcd" \
    --listen-client-urls "http://127.0.0.1:$client_port" \
    --advertise-client-urls "http://127.0.0.1:$client_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "im=http://127.0.0.1:$peer_port" >"$work/etcd.log" 2>&1 &
  etcd_pid=$!
  pids+=("$etcd_pid")
  endpoint=127.0.0.1:$client_port
  for _ in $(seq 1 100); do
    ETCDCTL_API=3 etcdctl --endpoints="$endpoint" --dial-timeout=1s --command-timeout=2s \
      endpoint health >/dev/null 2>&1 && return 0
    kill -0 "$etcd_pid" 2>/dev/null || break  # it exited (a port taken meanwhile)
    sleep 0.1
  done
  kill "$etcd_pid" 2>/dev/null
  wait "$etcd_pid" 2>/dev/null
  return 1
}
started=0
for _ in 1 2 3 4 5; do
  if start_etcd; then
    started=1
    break
  fi
done
if ((started == 0)); then
  echo "FAIL: etcd did not start in 5 tries; its last log:" >&2
  tail -20 "$work/etcd.log" >&2
  exit 1
fi

servers='[{"id": 0, "address": "127.0.0.1:1"}, {"id": 1, "address": "127.0.0.1:2"}, {"id": 2, "address": "127.0.0.1:3"}]'
printf '{"epoch": 1, "shards": 3, "servers": %s}\n' "$servers" >"$work/plain.json"
printf '{"epoch": 1, "shards": 3, "servers": %s, "owners": [0, 1, 2], "replicas": [[0, 1], [1, 2], [2, 0]]}\n' \
  "$servers" >"$work/replicas.json"
printf '{"epoch": 1, "shards": 3, "servers": %s, "replication_factor": 4}\n' "$servers" >"$work/too-many.json"

# import NAME ARGS...: runs kvcli cluster import-map into cluster NAME; sets rc, out, err.
import() {
  local name=$1
  shift
  # Bounded: a hang fails this step with its name instead of the whole test's timeout.
  out=$(timeout 60 "$kvcli" --etcd="$endpoint" --cluster_name="$name" cluster import-map "$@" \
    2>"$work/err")
  rc=$?
  err=$(cat "$work/err")
}
# factor NAME: the replication_factor of cluster NAME's map in etcd ("" when none).
factor() {
  ETCDCTL_API=3 etcdctl --endpoints="$endpoint" --dial-timeout=2s --command-timeout=5s \
    get --print-value-only "/rdkv/$1/map" |
    python3 -c 'import json, sys; print(json.load(sys.stdin).get("replication_factor", ""))'
}

import plain "$work/plain.json" --replication_factor=2
if ((rc == 0)) && [[ $(factor plain) == 2 ]]; then ok "no replicas + --replication_factor=2: R=2"; else fail "plain: rc $rc $err"; fi

import sets "$work/replicas.json"
if ((rc == 0)) && [[ $(factor sets) == 2 ]] && [[ $err == *"no replication_factor"* ]]; then
  ok "replica sets, no factor: R=2 from the largest set, and said so"
else
  fail "sets: rc $rc, factor '$(factor sets)', stderr: $err"
fi

import sets3 "$work/replicas.json" --replication_factor=3
if ((rc == 0)) && [[ $(factor sets3) == 3 ]]; then ok "replica sets + --replication_factor=3: R=3"; else fail "sets3: rc $rc $err"; fi

import sets1 "$work/replicas.json" --replication_factor=1
if ((rc != 0)) && [[ $err == *"below"* ]]; then ok "a factor below the file's sets is refused"; else fail "sets1: rc $rc $err"; fi

import many "$work/plain.json" --replication_factor=4
if ((rc != 0)) && [[ $err == *"more than"* ]]; then ok "a factor above the servers (flag) is refused"; else fail "many: rc $rc $err"; fi

import file4 "$work/too-many.json"
if ((rc != 0)) && [[ $err == *"more than"* ]]; then ok "a factor above the servers (file) is refused"; else fail "file4: rc $rc $err"; fi

if ((failures > 0)); then
  echo "--- etcd log"; tail -20 "$work/etcd.log"
  echo "kvcli_import_map_test: $failures failure(s)"
  exit 1
fi
echo "kvcli_import_map_test: OK"
