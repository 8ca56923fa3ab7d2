#!/usr/bin/env bash
# GET/PUT throughput and latency over the tcp transport, plaintext vs TLS 1.3, in the same boot:
# kv_bench (embedded server) alternates a plaintext run and a TLS run REPEAT times with the same
# settings and prints each figure's median and the TLS/plaintext ratio. Certificates are made in
# a temporary directory (tests/security/tls_make_certs.sh) and removed at exit.
#
#   bench/tls-bench.sh
#   BUILD=build/ci REPEAT=3 THREADS=2 SECONDS_PER_PHASE=2 VALUE_SIZE=64 bench/tls-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/default}
REPEAT=${REPEAT:-3}
THREADS=${THREADS:-2}
SECONDS_PER_PHASE=${SECONDS_PER_PHASE:-2}
VALUE_SIZE=${VALUE_SIZE:-64}
KEYS=${KEYS:-10000}
bench=$BUILD/bench/kv_bench
[[ -x $bench ]] || { echo "tls-bench.sh: $bench not built (cmake --build $BUILD --target kv_bench)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-tls-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
tests/security/tls_make_certs.sh "$work/pki" >/dev/null
pki=$work/pki

echo "# $(date -u +%Y-%m-%dT%H:%MZ) load: $(cut -d' ' -f1-3 /proc/loadavg) cpus: $(nproc)"
echo "# value_size=$VALUE_SIZE keys=$KEYS threads=$THREADS seconds=$SECONDS_PER_PHASE repeat=$REPEAT"
run() {  # plain|tls
  local extra=()
  if [[ $1 == tls ]]; then
    extra=(--tls_cert_file="$pki/server.pem" --tls_key_file="$pki/server.key" --tls_ca_file="$pki/ca.pem")
  fi
  "$bench" --transport=tcp --keys="$KEYS" --value_size="$VALUE_SIZE" --ops=3000 \
    --threads="$THREADS" --seconds="$SECONDS_PER_PHASE" "${extra[@]}" 2>/dev/null
}
for i in $(seq 1 "$REPEAT"); do
  run plain >"$work/plain.$i"
  run tls >"$work/tls.$i"
done
python3 - "$work" "$REPEAT" <<'PY'
import re, statistics, sys
work, repeat = sys.argv[1], int(sys.argv[2])
keys = ["get_ops_per_s", "put_ops_per_s", "p50_us"]
def figures(path):
    text = open(path).read()
    f = {}
    f["get_ops_per_s"] = float(re.search(r"get_ops_per_s=([\d.]+)", text).group(1))
    f["put_ops_per_s"] = float(re.search(r"put_ops_per_s=([\d.]+)", text).group(1))
    f["get_p50_us"] = float(re.search(r"get_lat p50_us=([\d.]+)", text).group(1))
    f["put_p50_us"] = float(re.search(r"put_lat p50_us=([\d.]+)", text).group(1))
    return f
runs = {m: [figures(f"{work}/{m}.{i}") for i in range(1, repeat + 1)] for m in ("plain", "tls")}
print("| figure | tcp | tcp+TLS | TLS / tcp |")
print("|---|---|---|---|")
for k in ["get_ops_per_s", "put_ops_per_s", "get_p50_us", "put_p50_us"]:
    p = statistics.median(r[k] for r in runs["plain"])
    t = statistics.median(r[k] for r in runs["tls"])
    print(f"| {k} | {p:,.1f} | {t:,.1f} | {t / p:.2f} |")
PY
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
