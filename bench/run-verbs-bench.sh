#!/usr/bin/env bash
# READ and GET latency over real verbs (Soft-RoCE in the rdkv VM), as ratios to perftest on the
# same device in the same boot. Also runs the tcp figures on the host for comparison.
#   bench/run-verbs-bench.sh [BUILD_DIR]      (default build/default; builds what it needs)
# BASELINE_KV_BENCH=FILE (a kv_bench binary of another commit; not under /tmp or /run, which the
# VM does not share) also runs that kv_bench in every round, right after this build's, and
# prints its GET ratios beside: a before/after of the client in one boot.
set -euo pipefail
BASELINE=${BASELINE_KV_BENCH:-}
if [[ -n $BASELINE ]]; then  # resolved from the caller's directory
  BASELINE=$(realpath -e "$BASELINE" 2>/dev/null) || {
    echo "BASELINE_KV_BENCH=$BASELINE_KV_BENCH does not exist" >&2
    exit 2
  }
  [[ -x $BASELINE ]] || { echo "BASELINE_KV_BENCH=$BASELINE is not an executable" >&2; exit 2; }
  [[ $BASELINE != /tmp/* && $BASELINE != /run/* ]] || {
    echo "BASELINE_KV_BENCH must not lie under /tmp or /run (the VM does not see them)" >&2
    exit 2
  }
fi
cd "$(dirname "$0")/.."
B=${1:-build/default}
if [[ $B == build/default ]]; then
  cmake --preset default >/dev/null
  cmake --build --preset default --target transport_bench kv_bench kvserver >/dev/null
fi
OUT=$PWD/build/bench-verbs
ROUNDS=${ROUNDS:-5}
rm -rf "$OUT" && mkdir -p "$OUT"
tests/rxe/vm.sh --timeout 2400 --out "$OUT" -- bench/verbs-bench-guest.sh "$B" "$OUT" "$ROUNDS" \
  "$BASELINE"

# j FILE a.b.c: a field of a JSON file.
j() {
  python3 -c "import json,sys,functools; print(functools.reduce(lambda d,k: d[k], sys.argv[2].split('.'), json.load(open(sys.argv[1]))))" "$1" "$2"
}
p64=$(j "$OUT/perftest-64.json" ib_read_lat.p50_us)
bw64=$(j "$OUT/perftest-64.json" ib_read_bw.reads_per_s)
t50=$(j "$OUT/transport-64.json" p50_us)
t99=$(j "$OUT/transport-64.json" p99_us)
trate=$(j "$OUT/transport-64.json" reads_per_s)
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$1" "$2"; }
echo
echo "== verbs (Soft-RoCE in the VM; TCG emulation: only ratios mean anything) =="
echo "ib_read_lat 64 B p50:            ${p64} us"
echo "rdkv READ 64 B p50 / p99:        ${t50} / ${t99} us   ratio to ib_read_lat: $(ratio "$t50" "$p64")  (target <= 1.15)"
echo "rdkv READ rate qd=16:            ${trate} /s   (ib_read_bw 64 B: ${bw64} /s)"
# Each round's ratios against the perftest run of the same round, then their medians.
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = []
for r in range(1, rounds + 1):
    p = json.load(open(f"{out}/perftest-128-{r}.json"))
    c = json.load(open(f"{out}/kv-cache-{r}.json"))
    i = json.load(open(f"{out}/kv-index-{r}.json"))
    t = json.load(open(f"{out}/transport-128-{r}.json"))
    fl = json.load(open(f"{out}/transport-floor-{r}.json"))
    read, srtt = p["ib_read_lat"]["p50_us"], p["ib_send_lat"]["rtt_p50_us"]
    rows.append(dict(read=read, srtt=srtt, get=c["get_p50_us"], idx=i["get_p50_us"],
                     put=c["put_p50_us"], rpg=c["reads_per_get"], irpg=i["reads_per_get"],
                     tread=t["p50_us"], tidx=t["index_pattern_p50_us"],
                     floor=fl["index_pattern_p50_us"]))
print("round  ib_read_lat128  SEND-rtt  GET-cached  GET-index  PUT   | GET/read  index/read  PUT/rtt"
      " | READ128  idx-READs | GET/READ128  index/idx-READs")
for n, w in enumerate(rows, 1):
    print(f"{n:5d}  {w['read']:14.1f}  {w['srtt']:8.1f}  {w['get']:10.1f}  {w['idx']:9.1f}  {w['put']:5.0f} |"
          f" {w['get'] / w['read']:8.2f}  {w['idx'] / w['read']:10.2f}  {w['put'] / w['srtt']:7.2f} |"
          f" {w['tread']:7.1f}  {w['tidx']:9.1f} | {w['get'] / w['tread']:11.2f}  {w['idx'] / w['tidx']:15.2f}")
med = lambda f: statistics.median(f(w) for w in rows)
print(f"median of {rounds} rounds (READs per GET: cached {rows[0]['rpg']}, index {rows[0]['irpg']}):")
print(f"  GET p50, location cache / ib_read_lat 128 B: {med(lambda w: w['get'] / w['read']):.2f}  (target <= 1.15)")
print(f"  GET p50, index path / ib_read_lat 128 B:     {med(lambda w: w['idx'] / w['read']):.2f}  (target <= 2.2)")
print(f"  PUT p50 / ib_send_lat 128 B round trip:      {med(lambda w: w['put'] / w['srtt']):.2f}  (target <= 2.5)")
print("the same READs through rdkv's transport alone (READ128: one 128 B READ; idx-READs: 2 x 512 B,")
print("then 128 B), so what the KV code adds shows apart from what the bytes cost the fabric:")
print(f"  transport READ 128 B / ib_read_lat 128 B:     {med(lambda w: w['tread'] / w['read']):.2f}")
print(f"  index path's READs alone / ib_read_lat 128 B: {med(lambda w: w['tidx'] / w['read']):.2f}")
print(f"  two 128 B READs in turn / ib_read_lat 128 B:  {med(lambda w: w['floor'] / w['read']):.2f}"
      "  (the floor of any GET of two round trips)")
print(f"  GET, cached / transport READ 128 B:           {med(lambda w: w['get'] / w['tread']):.2f}")
print(f"  GET, index path / its READs alone:            {med(lambda w: w['idx'] / w['tidx']):.2f}")
import os
if os.path.exists(f"{out}/base-cache-1.json"):
    base = []
    for r in range(1, rounds + 1):
        c = json.load(open(f"{out}/base-cache-{r}.json"))
        i = json.load(open(f"{out}/base-index-{r}.json"))
        base.append((c["get_p50_us"], i["get_p50_us"]))
    print("the baseline kv_bench (BASELINE_KV_BENCH), run right after this build's in each round:")
    print("round  GET-cached base/this  GET-index base/this")
    for n, (w, (bc, bi)) in enumerate(zip(rows, base), 1):
        print(f"{n:5d}  {bc:9.1f} / {w['get']:6.1f}  {bi:9.1f} / {w['idx']:6.1f}")
    bmed = lambda k: statistics.median(b[k] / w['read'] for w, b in zip(rows, base))
    bpair = lambda k, f: statistics.median(f(w) / b[k] for w, b in zip(rows, base))
    print(f"  baseline GET p50, location cache / ib_read_lat 128 B: {bmed(0):.2f}")
    print(f"  baseline GET p50, index path / ib_read_lat 128 B:     {bmed(1):.2f}")
    print(f"  this / baseline, cached GET p50 (median of rounds):   {bpair(0, lambda w: w['get']):.3f}")
    print(f"  this / baseline, index-path GET p50:                  {bpair(1, lambda w: w['idx']):.3f}")
PY
echo "raw JSON: $OUT"
