#!/usr/bin/env bash
# TLS end to end with a real kvserver and kvcli (docs/security.md "TLS (tcp)"): put/get/del over
# TLS with the flags, a plaintext kvcli refused with a reason naming TLS, a kvcli trusting
# another CA refused (certificate verify failed), the server serving on after both, mutual TLS,
# replication between two TLS servers of a cluster (mutual TLS), and kvserver refusing TLS flags on verbs and half-given flags (exit 2). Certificates are made
# at test time (tls_make_certs.sh) and removed at exit.
#
#   tls_cli_test.sh KVCLI KVSERVER
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/wait_for_port.sh"
kvcli=$1 kvserver=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-tls-cli.XXXXXX")
server_pid=""
stop_server() {
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  server_pid=""
}
cluster_pids=()
cleanup() {
  stop_server
  for p in "${cluster_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

if ! "$here/tls_make_certs.sh" "$work/pki" >"$work/pki.log" 2>&1; then
  echo "SKIPPED: cannot make test certificates with the openssl CLI: $(cat "$work/pki.log")"
  exit 0
fi
pki=$work/pki

start_server() {  # extra kvserver flags...
  rm -f "$work/port"
  "$kvserver" --port=0 --port_file="$work/port" --transport=tcp --memory=64MiB --huge_pages=false \
    --metrics_port=-1 "$@" >"$work/server.log" 2>&1 &
  server_pid=$!
  server=127.0.0.1:$(wait_for_port "$work/port" "$server_pid" "$work/server.log") || exit 1
}
kv() { "$kvcli" --server="$server" --transport=tcp --connect_timeout_ms=5000 "$@" 2>"$work/err"; }

# ---- one-way TLS ----
start_server --tls_cert_file="$pki/server.pem" --tls_key_file="$pki/server.key"
out=$(kv --tls_ca_file="$pki/ca.pem" put k1 hello-over-tls) || fail "put over TLS: $out $(cat "$work/err")"
out=$(kv --tls_ca_file="$pki/ca.pem" get k1) || fail "get over TLS: $out $(cat "$work/err")"
[[ $out == *hello-over-tls* ]] || fail "get over TLS returned: $out"
big=$(head -c 200000 /dev/zero | tr '\0' 'x')
printf '%s' "$big" >"$work/big"
kv --tls_ca_file="$pki/ca.pem" put big "@$work/big" >/dev/null || fail "put 200 kB over TLS: $(cat "$work/err")"
out=$(kv --tls_ca_file="$pki/ca.pem" get big) || fail "get 200 kB over TLS: $(cat "$work/err")"
[[ ${#out} -ge 200000 && $out == *xxxx* ]] || fail "get 200 kB over TLS returned ${#out} bytes"

# A plaintext kvcli: refused, and told why.
kv get k1 >/dev/null && fail "a plaintext kvcli read from a TLS server"
grep -q "requires TLS" "$work/err" || fail "plaintext kvcli error does not say TLS: $(cat "$work/err")"
# A kvcli trusting another CA: refused by verification.
kv --tls_ca_file="$pki/other-ca.pem" get k1 >/dev/null && fail "a kvcli trusting another CA connected"
grep -q "certificate verify failed" "$work/err" ||
  fail "wrong-CA kvcli error does not name verification: $(cat "$work/err")"
# The server served on.
out=$(kv --tls_ca_file="$pki/ca.pem" get k1) || fail "get after the refusals: $out $(cat "$work/err")"
kill -0 "$server_pid" 2>/dev/null || fail "kvserver died"
stop_server

# ---- a TLS kvcli to a plaintext server ----
start_server
kv --tls_ca_file="$pki/ca.pem" get k1 >/dev/null && fail "a TLS kvcli talked to a plaintext server"
grep -q "plaintext" "$work/err" || fail "TLS kvcli to plaintext server: $(cat "$work/err")"
kv put p v >/dev/null || fail "plaintext put after the TLS attempt: $(cat "$work/err")"
stop_server

# ---- mutual TLS ----
start_server --tls_cert_file="$pki/server.pem" --tls_key_file="$pki/server.key" \
  --tls_ca_file="$pki/ca.pem" --tls_require_client_cert
kv --tls_ca_file="$pki/ca.pem" get k1 >/dev/null && fail "mutual TLS: a kvcli without a certificate got in"
out=$(kv --tls_ca_file="$pki/ca.pem" --tls_cert_file="$pki/client.pem" \
  --tls_key_file="$pki/client.key" put m v) || fail "mutual TLS put: $out $(cat "$work/err")"
stop_server

# ---- replication between TLS servers (mutual TLS: each server presents its certificate) ----
# Free ports below the ephemeral range (a random base in 20000-39999 once collided with one).
# shellcheck source=../deploy/lib.sh
base=$(source "$(dirname "${BASH_SOURCE[0]}")/../deploy/lib.sh" && free_base_port 2) ||
  { echo "FAIL: no free port range found" >&2; exit 1; }
cat >"$work/map.json" <<JSON
{"epoch": 1, "shards": 2,
 "servers": [{"id": 0, "address": "127.0.0.1:$base"}, {"id": 1, "address": "127.0.0.1:$((base + 1))"}],
 "owners": [0, 0], "replicas": [[0, 1], [0, 1]]}
JSON
for id in 0 1; do
  "$kvserver" --port=$((base + id)) --transport=tcp --memory=32MiB --huge_pages=false \
    --metrics_port=-1 --cluster_map="$work/map.json" --server_id=$id --data_dir="$work/data$id" \
    --durability=none --tls_cert_file="$pki/server.pem" --tls_key_file="$pki/server.key" \
    --tls_ca_file="$pki/ca.pem" --tls_require_client_cert >"$work/c$id.log" 2>&1 &
  cluster_pids+=($!)
done
ckv() {
  "$kvcli" --server=127.0.0.1:$base --transport=tcp --connect_timeout_ms=5000 \
    --tls_ca_file="$pki/ca.pem" --tls_cert_file="$pki/client.pem" --tls_key_file="$pki/client.key" \
    "$@" 2>"$work/err"
}
for _ in $(seq 1 100); do ckv ping >/dev/null && break; sleep 0.1; done
for k in 1 2 3 4 5 6 7 8; do ckv put rk$k rv$k >/dev/null || fail "replicated put rk$k: $(cat "$work/err")"; done
items=$(ckv --json stats --all | python3 -c '
import json, sys
j = json.load(sys.stdin)
print(" ".join(str(s.get("stats", {}).get("items", "-")) for s in sorted(j["per_server"], key=lambda s: s["id"])))')
[[ $items == "8 8" ]] || fail "replication over TLS: items per server '$items', want '8 8' ($(tail -3 "$work/c0.log"))"
for p in "${cluster_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
cluster_pids=()

# ---- flags kvserver refuses (usage errors: exit 2) ----
"$kvserver" --port=0 --transport=verbs --tls_cert_file="$pki/server.pem" \
  --tls_key_file="$pki/server.key" --memory=64MiB >"$work/verbs.log" 2>&1
rc=$?
[[ $rc == 2 ]] || fail "kvserver --transport=verbs with TLS flags exited $rc, not 2"
grep -q "verbs has no TLS" "$work/verbs.log" || fail "verbs+TLS message: $(cat "$work/verbs.log")"
"$kvserver" --port=0 --transport=tcp --tls_cert_file="$pki/server.pem" --memory=64MiB \
  >"$work/half.log" 2>&1
rc=$?
[[ $rc == 2 ]] || fail "kvserver with --tls_cert_file alone exited $rc, not 2"
"$kvserver" --port=0 --transport=tcp --tls_cert_file="$pki/server.pem" \
  --tls_key_file="$pki/client.key" --memory=64MiB --huge_pages=false >"$work/mismatch.log" 2>&1
rc=$?
[[ $rc != 0 ]] || fail "kvserver started with a key that does not match its certificate"
grep -q "does not match" "$work/mismatch.log" || fail "mismatched key message: $(tail -3 "$work/mismatch.log")"

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "PASS"
