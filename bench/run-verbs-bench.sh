#!/usr/bin/env bash
# READ and GET latency over real verbs (Soft-RoCE in the rdkv VM), as ratios to perftest on the
# same device in the same boot. Also runs the tcp figures on the host for comparison.
#   bench/run-verbs-bench.sh [BUILD_DIR]      (default build/default; builds what it needs)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/default}
if [[ $B == build/default ]]; then
  cmake --preset default >/dev/null
  cmake --build --preset default --target transport_bench kv_bench >/dev/null
fi
OUT=$PWD/build/bench-verbs
rm -rf "$OUT" && mkdir -p "$OUT"
tests/rxe/vm.sh --timeout 1800 --out "$OUT" -- bench/verbs-bench-guest.sh "$B" "$OUT"

# j FILE a.b.c: a field of a JSON file.
j() {
  python3 -c "import json,sys,functools; print(functools.reduce(lambda d,k: d[k], sys.argv[2].split('.'), json.load(open(sys.argv[1]))))" "$1" "$2"
}
p64=$(j "$OUT/perftest-64.json" ib_read_lat.p50_us)
p128=$(j "$OUT/perftest-128.json" ib_read_lat.p50_us)
bw64=$(j "$OUT/perftest-64.json" ib_read_bw.reads_per_s)
t50=$(j "$OUT/transport-64.json" p50_us)
t99=$(j "$OUT/transport-64.json" p99_us)
trate=$(j "$OUT/transport-64.json" reads_per_s)
kc=$(j "$OUT/kv-cache.json" get_p50_us)
kcr=$(j "$OUT/kv-cache.json" reads_per_get)
ki=$(j "$OUT/kv-index.json" get_p50_us)
kir=$(j "$OUT/kv-index.json" reads_per_get)
kput=$(j "$OUT/kv-cache.json" put_p50_us)
srtt=$(j "$OUT/perftest-128.json" ib_send_lat.rtt_p50_us)
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$1" "$2"; }
echo
echo "== verbs (Soft-RoCE in the VM; TCG emulation: only ratios mean anything) =="
echo "ib_read_lat 64 B p50:            ${p64} us"
echo "rdkv READ 64 B p50 / p99:        ${t50} / ${t99} us   ratio to ib_read_lat: $(ratio "$t50" "$p64")  (target <= 1.15)"
echo "rdkv READ rate qd=16:            ${trate} /s   (ib_read_bw 64 B: ${bw64} /s)"
echo "ib_read_lat 128 B p50:           ${p128} us"
echo "rdkv GET p50, location cache:    ${kc} us (${kcr} READs/GET)   ratio to ib_read_lat 128 B: $(ratio "$kc" "$p128")  (target <= 1.15)"
echo "rdkv GET p50, index path:        ${ki} us (${kir} READs/GET)   ratio to ib_read_lat 128 B: $(ratio "$ki" "$p128")  (target <= 2.2)"
echo "ib_send_lat 128 B round trip p50: ${srtt} us (twice perftest's one-way p50)"
echo "rdkv PUT p50 (two-sided):        ${kput} us   ratio to the SEND round trip: $(ratio "$kput" "$srtt")  (target <= 2.5)"
echo "raw JSON: $OUT"
