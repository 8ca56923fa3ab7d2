#!/usr/bin/env bash
# What the verbs session security costs (docs/security.md "Cost"): connection setup rate and
# one-sided READ latency (what a GET that hits the client's location cache does: one READ of
# the item) of this build against a reference build, in ONE boot of the Soft-RoCE VM, runs
# interleaved (ref, new, ref, new, ...) so that the emulator's drift hits both alike.
#
#   bench/verbs-handshake-cost.sh NEW_BUILD_DIR REF_BUILD_DIR [ROUNDS]
#
# Both build dirs need bench/transport_bench (with --connects; copy this tree's
# bench/transport_bench.cc into the reference source if it predates that flag). Prints each
# run, then the medians and the ratios new/ref. Only the ratios mean anything (TCG emulation).
set -euo pipefail
cd "$(dirname "$0")/.."
NEW=${1:?usage: verbs-handshake-cost.sh NEW_BUILD_DIR REF_BUILD_DIR [ROUNDS]}
REF=${2:?usage: verbs-handshake-cost.sh NEW_BUILD_DIR REF_BUILD_DIR [ROUNDS]}
ROUNDS=${3:-3}
for b in "$NEW" "$REF"; do
  [[ -x $b/bench/transport_bench ]] || { echo "verbs-handshake-cost: $b/bench/transport_bench is missing" >&2; exit 1; }
done
OUT=$PWD/build/bench-handshake
rm -rf "$OUT" && mkdir -p "$OUT"
tests/rxe/vm.sh --timeout 1200 --out "$OUT" -- bench/verbs-handshake-cost-guest.sh "$NEW" "$REF" "$ROUNDS"
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def med(which, key):
    return statistics.median(json.load(open(f"{out}/{which}-{r}.json"))[key] for r in range(1, rounds + 1))
print()
print(f"== verbs handshake and windows cost: medians of {rounds} interleaved runs, one VM boot ==")
for key, what in [("connects_per_s", "connections/s (Connect + close, sequential)"),
                  ("connect_p50_ms", "Connect p50 ms"),
                  ("p50_us", "READ 128 B p50 us (qd 1)"),
                  ("p99_us", "READ 128 B p99 us (qd 1)"),
                  ("reads_per_s", "READs/s (qd 16)")]:
    ref, new = med("ref", key), med("new", key)
    print(f"{what:45s} ref {ref:10.2f}   new {new:10.2f}   new/ref {new / ref:5.2f}")
PY
