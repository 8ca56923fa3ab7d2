#!/usr/bin/env bash
# How long a manual promotion takes once many keys were written (issue 11): before a promoted
# backup serves, it resends every key it applied as a backup in the last 60 s to the shard's
# other backups (docs/design.md "Manual promotion"), and writes to the shard wait for that.
#
#   bench/promotion-bench.sh [--keys "N ..."] [--repeat N] [--build DIR] [--out DIR]
#
# Options:
#   --keys "N ..."  records loaded before each promotion, one run per figure (default
#                   "10000 100000 200000"; a third of them are shard 0's)
#   --repeat N      runs per figure (default 2); the table shows each run
#   --build DIR     build dir with server/kvserver, tools/kvcli, bench/kvbench/kvbench
#                   (default build/ci, else build/default); nothing is built
#   --out DIR       keep the servers' logs and kvbench's output there (default: a temporary dir)
#
# Each run: 3 kvservers (tcp, 127.0.0.1, durability none), a map of 3 shards with R = 2 (shard
# s: primary s, backup s + 1), `kvbench load` of N records (one 32-byte field, 8 threads), then
# `kvcli cluster promote 0 1`. Prints, per run, the keys server 1 resent and how long the
# resend took (its log line "promotion to map epoch 2: resent K ... in M ms"), and the whole
# promote as kvcli reports it (map changes, the old primary's lease, the resend).
set -euo pipefail
cd "$(dirname "$0")/.."
PROG=promotion-bench.sh
KEYS="10000 100000 200000" REPEAT=2 BUILD="" OUT=""
die() { echo "$PROG: error: $*" >&2; exit 2; }
usage() { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "$1"; }
while (($# > 0)); do
  case $1 in
    -h | --help) usage 0 ;;
    --keys | --repeat | --build | --out)
      (($# >= 2)) || die "$1 needs a value"
      case $1 in
        --keys) KEYS=$2 ;; --repeat) REPEAT=$2 ;; --build) BUILD=$2 ;; --out) OUT=$2 ;;
      esac
      shift 2 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "--repeat must be a positive integer, not '$REPEAT'"
for n in $KEYS; do [[ $n =~ ^[1-9][0-9]*$ ]] || die "--keys: '$n' is not a positive integer"; done
if [[ -z $BUILD ]]; then BUILD=build/ci; [[ -x $BUILD/server/kvserver ]] || BUILD=build/default; fi
KVSERVER=$BUILD/server/kvserver KVCLI=$BUILD/tools/kvcli KVB=$BUILD/bench/kvbench/kvbench
for b in "$KVSERVER" "$KVCLI" "$KVB"; do
  [[ -x $b ]] || die "$b not found; build it: cmake --build $BUILD --target kvserver kvcli kvbench"
done
work=$(mktemp -d /tmp/rdkv-promotion.XXXXXX)
[[ -n $OUT ]] || OUT=$work/out
mkdir -p "$OUT"
# shellcheck source=bench/lib/servers.sh
source bench/lib/servers.sh
cleanup() { stop_servers; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_cluster DIR: 3 servers, R = 2 map; sets SRV_PID and PORTS. Returns 1 when a port was
# taken before a server bound it.
start_cluster() {
  local d=$1 i t
  pick_ports 3
  mkdir -p "$d"
  cat >"$d/map.json" <<EOF
{"epoch": 1, "shards": 3,
 "servers": [{"id": 0, "address": "127.0.0.1:${PORTS[0]}"}, {"id": 1, "address": "127.0.0.1:${PORTS[1]}"},
             {"id": 2, "address": "127.0.0.1:${PORTS[2]}"}],
 "owners": [0, 1, 2], "replicas": [[0, 1], [1, 2], [2, 0]]}
EOF
  for i in 0 1 2; do
    mkdir -p "$d/server-$i"
    "$KVSERVER" --host=127.0.0.1 --port="${PORTS[i]}" --transport=tcp --memory=512MiB \
      --cluster_map="$d/map.json" --server_id="$i" --data_dir="$d/server-$i" --durability=none \
      </dev/null >"$d/server-$i.log" 2>&1 &
    SRV_PID[i]=$!
  done
  for i in 0 1 2; do
    for ((t = 0; ; t++)); do
      if ! kill -0 "${SRV_PID[i]}" 2>/dev/null; then
        grep -q 'Address already in use' "$d/server-$i.log" && { stop_servers; return 1; }
        tail -n 15 "$d/server-$i.log" >&2
        die "server $i exited during start"
      fi
      timeout 10 "$KVCLI" --server="127.0.0.1:${PORTS[i]}" --transport=tcp ping >/dev/null 2>&1 && break
      ((t < 300)) || die "server $i did not answer within 30 s (log: $d/server-$i.log)"
      sleep 0.1
    done
  done
}

echo "host: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start; build $BUILD"
printf '%-10s %-4s %-12s %-12s %-14s %-12s\n' keys run "keys resent" "resend ms" "resend keys/s" "promote ms"
for n in $KEYS; do
  for ((r = 1; r <= REPEAT; r++)); do
    d=$OUT/keys-$n-run-$r
    rm -rf "$d"
    for attempt in 1 2 3; do
      start_cluster "$d" && break
      ((attempt < 3)) || die "the servers could not bind their ports in 3 tries"
    done
    "$KVB" load -db rdkv -p rdkv.seed="127.0.0.1:${PORTS[0]}" -p rdkv.transport=tcp \
      -P bench/workloads/workloada -p recordcount="$n" -p fieldcount=1 -p fieldlength=32 \
      -p status.interval=0 -threads 8 >"$d/load.txt" 2>&1 || {
      tail -n 5 "$d/load.txt" >&2
      die "kvbench load failed (output: $d/load.txt)"
    }
    promote=$("$KVCLI" --seed="127.0.0.1:${PORTS[0]}" --transport=tcp cluster promote 0 1 2>&1) ||
      die "promote failed: $promote"
    promote_s=$(sed -n 's/.*map epoch 1 -> 2 (\([0-9.]*\) s).*/\1/p' <<<"$promote")
    line=$(grep -h "promotion to map epoch 2: resent" "$d/server-1.log" | tail -n 1 || true)
    resent=$(sed -n 's/.*resent \([0-9]*\) recently.*/\1/p' <<<"$line")
    ms=$(sed -n 's/.* in \([0-9]*\) ms.*/\1/p' <<<"$line")
    [[ -n $resent && -n $ms && -n $promote_s ]] ||
      die "could not read the figures (kvcli: '$promote'; server 1: '$line')"
    rate=$(awk -v k="$resent" -v m="$ms" 'BEGIN { printf "%.0f", (m > 0) ? k * 1000 / m : 0 }')
    printf '%-10s %-4s %-12s %-12s %-14s %-12.0f\n' "$n" "$r" "$resent" "$ms" "$rate" \
      "$(awk -v s="$promote_s" 'BEGIN { print s * 1000 }')"
    stop_servers
  done
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
