#!/usr/bin/env bash
# etcd over TLS end to end (docs/security.md "etcd over TLS"): an etcd that serves clients only
# over https and asks for client certificates (--client-cert-auth); kvcli imports a map through
# it, a kvserver takes its map and registers through it, kvcli finds the server through it and
# does a put/get. Refused, each with a clear error: no client certificate, a CA that did not
# sign etcd's certificate, http:// to the https port, and TLS files with http:// endpoints
# (usage, exit 2). Certificates are made at test time (tls_make_certs.sh) and removed at exit.
#
#   etcd_tls_test.sh KVCLI KVSERVER
# Exits 77 (SKIPPED) when etcd or the openssl CLI is not installed.
set -uo pipefail
kvcli=$1 kvserver=$2
here=$(cd "$(dirname "$0")" && pwd)
command -v etcd >/dev/null || { echo "SKIPPED: etcd is not installed (apt-get install etcd-server)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-etcd-tls.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { echo "ok - $*"; }

if ! "$here/tls_make_certs.sh" "$work/pki" >"$work/pki.log" 2>&1; then
  echo "SKIPPED: cannot make test certificates with the openssl CLI: $(cat "$work/pki.log")"
  exit 77
fi
pki=$work/pki
# Free loopback ports (the kernel's choice, released at once).
read -r client_port peer_port kv_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')

etcd --name tls --data-dir "$work/etcd" \
  --listen-client-urls "https://127.0.0.1:$client_port" \
  --advertise-client-urls "https://127.0.0.1:$client_port" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "tls=http://127.0.0.1:$peer_port" \
  --cert-file "$pki/server.pem" --key-file "$pki/server.key" \
  --trusted-ca-file "$pki/ca.pem" --client-cert-auth >"$work/etcd.log" 2>&1 &
pids+=($!)
endpoint=https://127.0.0.1:$client_port
tls=(--etcd="$endpoint" --etcd_cacert="$pki/ca.pem" --etcd_cert="$pki/client.pem"
  --etcd_key="$pki/client.key" --cluster_name=tls)
printf '{"epoch": 1, "shards": 4, "servers": [{"id": 0, "address": "127.0.0.1:%s"}]}\n' "$kv_port" \
  >"$work/map.json"
imported=""
for _ in $(seq 1 100); do
  if out=$("$kvcli" "${tls[@]}" cluster import-map "$work/map.json" 2>&1); then
    imported=1
    break
  fi
  sleep 0.1
done
if [[ -z $imported ]]; then
  echo "--- etcd log"; tail -20 "$work/etcd.log"
  echo "FAIL: kvcli cluster import-map over https: $out" >&2
  exit 1
fi
ok "kvcli imported the map through etcd over https (client certificate)"

"$kvserver" --host=127.0.0.1 --port="$kv_port" --transport=tcp --memory=64MiB --huge_pages=false \
  --metrics_port=-1 --server_id=0 --etcd_lease_ttl_s=3 --data_dir="$work/data" "${tls[@]}" >"$work/server.log" 2>&1 &
pids+=($!)
served=""
for _ in $(seq 1 100); do
  if out=$("$kvcli" "${tls[@]}" --transport=tcp put k over-tls 2>&1); then
    served=1
    break
  fi
  kill -0 "${pids[1]}" 2>/dev/null || break
  sleep 0.1
done
if [[ -n $served ]]; then
  ok "kvserver took its map from etcd over https; kvcli found it there and put a key"
else
  fail "no put through the https-registered server: $out"
  tail -20 "$work/server.log"
fi
out=$("$kvcli" "${tls[@]}" --transport=tcp get k 2>&1)
[[ $out == *over-tls* ]] && ok "get k -> over-tls" || fail "get k: $out"
grep -q "registered" "$work/server.log" || grep -qi "etcd" "$work/server.log" ||
  fail "the server log says nothing about etcd"

# Refusals: each fails with a reason, and etcd and the server keep serving.
out=$("$kvcli" --etcd="$endpoint" --etcd_cacert="$pki/ca.pem" --cluster_name=tls get k 2>&1)
rc=$?
if ((rc != 0)) && [[ $out == *--etcd_cert* ]]; then
  ok "no client certificate: refused, the error suggests --etcd_cert (exit $rc)"
else
  fail "no client certificate: exit $rc: $out"
fi
out=$("$kvcli" --etcd="$endpoint" --etcd_cacert="$pki/other-ca.pem" --etcd_cert="$pki/client.pem" \
  --etcd_key="$pki/client.key" --cluster_name=tls get k 2>&1)
rc=$?
if ((rc != 0)) && [[ $out == *ertificate* || $out == *SSL* ]]; then
  ok "a CA that did not sign etcd's certificate: refused naming the certificate (exit $rc)"
else
  fail "wrong CA: exit $rc: $out"
fi
out=$("$kvcli" --etcd="http://127.0.0.1:$client_port" --cluster_name=tls get k 2>&1)
rc=$?
if ((rc != 0)) && [[ $out == *"write the endpoint as https://"* ]]; then
  ok "http:// to the https port: refused, the error suggests https:// (exit $rc)"
else
  fail "http:// to https etcd: exit $rc: $out"
fi
out=$("$kvcli" --etcd="127.0.0.1:$client_port" --etcd_cacert="$pki/ca.pem" --cluster_name=tls \
  get k 2>&1)
rc=$?
if ((rc == 2)) && [[ $out == *https://* ]]; then
  ok "TLS files with an http endpoint: usage error naming https:// (exit 2)"
else
  fail "TLS files with an http endpoint: exit $rc: $out"
fi
out=$("$kvcli" "${tls[@]}" --transport=tcp get k 2>&1)
[[ $out == *over-tls* ]] && ok "still served after the refusals" || fail "after the refusals: $out"

if ((failures > 0)); then
  echo "--- server log"; tail -20 "$work/server.log"
  echo "$failures failure(s)"
  exit 1
fi
echo "etcd_tls_test: OK"
