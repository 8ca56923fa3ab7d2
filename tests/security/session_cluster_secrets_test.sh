#!/usr/bin/env bash
# Servers of one cluster authenticate each other (docs/security.md "Roles"): a primary forwards
# every write (REPLICATE, an admin op) to its backups over a session that proves the admin
# secret. Two kvservers over tcp, a static map where every shard has replicas [0, 1] (primary 0,
# backup 1), the same data secret on both:
#
#   1. server 1's admin secret differs from server 0's: a kvcli PUT (with the data secret) is
#      NOT acknowledged (non-zero exit, an error naming the backup and the secret), neither
#      server holds the item, a GET finds nothing, and server 0's log names the refusal;
#   2. control: the same admin secret on both: the same PUT succeeds and both servers hold it.
#
# Secrets are in 0600 files, never on a command line. The map needs each server's address
# before it starts, so the ports come from free_base_port (tests/deploy/lib.sh: free ports
# below the ephemeral range), and a cluster that cannot bind them is started again on others.
#
#   session_cluster_secrets_test.sh KVCLI KVSERVER
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../support/wait_for_port.sh
source "$here/../support/wait_for_port.sh"
# shellcheck source=../deploy/lib.sh
source "$here/../deploy/lib.sh"  # free_base_port; ok, bad, skip, finish
kvcli=$1 kvserver=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-cluster-secrets.XXXXXX")
pids=()
stop_cluster() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  pids=()
}
cleanup() {
  stop_cluster
  if [[ -n ${KEEP_WORK:-} ]]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

secret() { (umask 077 && printf '%s\n' "$2-$RANDOM$RANDOM$RANDOM$RANDOM" >"$work/$1"); }
secret data data
secret admin0 admin-a
secret admin1 admin-b
cmp -s "$work/admin0" "$work/admin1" && { echo "the two admin secrets are equal"; exit 1; }

# start_cluster TAG ADMIN_FILE_0 ADMIN_FILE_1: servers 0 and 1 of a 2-shard map, both shards
# on [0, 1]; sets $seed and $log0/$log1.
start_cluster() {
  local tag=$1 id base
  local -a admin=("$2" "$3")
  for _ in 1 2 3; do
    base=$(free_base_port 2) || skip "no free port range found"
    cat >"$work/$tag.map.json" <<JSON
{"epoch": 1, "shards": 2,
 "servers": [{"id": 0, "address": "127.0.0.1:$base"}, {"id": 1, "address": "127.0.0.1:$((base + 1))"}],
 "owners": [0, 0], "replicas": [[0, 1], [0, 1]]}
JSON
    local -a pid=()
    for id in 1 0; do
      rm -rf "$work/$tag.data$id" "$work/$tag.port$id"
      "$kvserver" --port=$((base + id)) --port_file="$work/$tag.port$id" --transport=tcp \
        --memory=16MiB --huge_pages=false --metrics_port=-1 --cluster_map="$work/$tag.map.json" \
        --server_id=$id --data_dir="$work/$tag.data$id" --durability=none \
        --auth_token_file="$work/data" --admin_token_file="${admin[$id]}" \
        >"$work/$tag.server$id.log" 2>&1 &
      pid[id]=$!
      pids+=($!)
    done
    log0=$work/$tag.server0.log log1=$work/$tag.server1.log
    if wait_for_port "$work/$tag.port0" "${pid[0]}" "$log0" >/dev/null &&
      wait_for_port "$work/$tag.port1" "${pid[1]}" "$log1" >/dev/null; then
      seed=127.0.0.1:$base
      return 0
    fi
    stop_cluster
    grep -q "in use" "$log0" "$log1" || { bad "$tag: the cluster did not start"; finish; exit 1; }
    echo "ports $base..$((base + 1)) were taken meanwhile; again on others"
  done
  bad "$tag: no free ports in 3 attempts"
  finish
  exit 1
}

# verdict WHAT WHY_NOT COMMAND...: ok WHAT when COMMAND succeeds, else bad "WHAT: WHY_NOT".
verdict() {
  local what=$1 why=$2
  shift 2
  if "$@"; then ok "$what"; else bad "$what: $why"; fi
}
has() { [[ $1 == *"$2"* ]]; }  # has TEXT PART

# kv ARGS...: kvcli against the cluster with the data secret; stdout in $out, stderr in $err,
# exit status in $rc, seconds taken in $took.
kv() {
  local t0=$SECONDS
  rc=0
  out=$("$kvcli" --seed="$seed" --transport=tcp --auth_token_file="$work/data" \
    --connect_timeout_ms=3000 --timeout_ms=1500 "$@" 2>"$work/err") || rc=$?
  err=$(cat "$work/err")
  took=$((SECONDS - t0))
}
# items: "N0 N1", the items each server holds (kvcli --json stats --all).
items() {
  kv --json stats --all
  python3 -c '
import json, sys
j = json.load(sys.stdin)
print(" ".join(str(s.get("stats", {}).get("items", "-")) for s in sorted(j["per_server"], key=lambda s: s["id"])))' <<<"$out"
}

# ---- 1. different admin secrets: the primary cannot replicate ----
start_cluster mismatch "$work/admin0" "$work/admin1"
kv ping
[[ $rc == 0 ]] || bad "kvcli ping: exit $rc: $err"
kv put sec-key sec-value
echo "PUT with mismatched admin secrets: exit $rc after ${took}s: $err"
verdict "the PUT is not acknowledged (exit $rc)" "it was: $out" [ "$rc" != 0 ]
verdict "the error says the write was not acknowledged" "$err" has "$err" "not acknowledged"
verdict "the error names backup server 1" "$err" has "$err" "backup server 1"
verdict "the error names the cause" "$err" has "$err" "could not prove that it knows the admin secret"
verdict "the client gave up within its --timeout_ms (${took}s)" "--timeout_ms=1500" [ "$took" -le 5 ]
got=$(items)
verdict "neither server holds the item (items per server: $got)" "want '0 0'" [ "$got" = "0 0" ]
kv get sec-key
verdict "a GET finds nothing (exit 1)" "exit $rc: $out $err" [ "$rc" = 1 ]
# The refusal is in server 0's log (the replicator, at the handshake: server 1 could not prove
# server 0's admin secret), not only in the client's error.
verdict "server 0's log names the admin secret refusal" "$(grep -i replicat "$log0" | tail -3)" \
  grep -q "could not prove that it knows the admin secret" "$log0"
verdict "both servers still run" "a server died" kill -0 "${pids[0]}" "${pids[1]}"
stop_cluster

# ---- 2. control: the same admin secret on both ----
start_cluster match "$work/admin0" "$work/admin0"
kv put sec-key sec-value
verdict "with matching admin secrets the PUT is acknowledged" "exit $rc: $err" [ "$rc" = 0 ]
got=$(items)
verdict "both servers hold the item (items per server: $got)" "want '1 1'" [ "$got" = "1 1" ]
kv get sec-key
verdict "GET returns the value" "exit $rc: $out $err" [ "$rc:$out" = "0:sec-value" ]
stop_cluster

# No secret reached a server log (none was on a command line: files only).
for f in data admin0 admin1; do
  s=$(cat "$work/$f")
  if grep -rqF -- "$s" "$work"/*.log; then bad "the $f secret is in a server log"; fi
done
finish
