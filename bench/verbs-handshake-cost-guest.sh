#!/usr/bin/env bash
# Guest half of bench/verbs-handshake-cost.sh (runs inside tests/rxe/vm.sh; JSON to $RDKV_VM_OUT).
#   verbs-handshake-cost-guest.sh NEW_BUILD_DIR REF_BUILD_DIR ROUNDS
set -eu
NEW=$1 REF=$2 ROUNDS=$3
: "${RDKV_RXE_ADDR:?runs inside tests/rxe/vm.sh}"
for r in $(seq 1 "$ROUNDS"); do
  for which in ref new; do
    b=$REF
    [[ $which == new ]] && b=$NEW
    "$b/bench/transport_bench" --transport=verbs --host="$RDKV_RXE_ADDR" --size=128 --iters=3000 \
      --qd=16 --seconds=1 --connects=60 --json="$RDKV_VM_OUT/$which-$r.json" 2>/dev/null |
      sed "s/^/$which: /"
  done
done
