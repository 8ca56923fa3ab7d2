#!/usr/bin/env bash
# Bytes per item: rdkv vs Redis vs memcached, loaded with the same items (issue 13).
#
#   bench/memory-per-item.sh [BUILD]        (default build/ci; needs kvserver and mem_load there)
#
# Two cases, each loaded into one kvserver (tcp, region sized to fit), one redis-server and one
# memcached, one after the other (only one store is up at a time), all without persistence:
#   small  SMALL_N items (default 10,000,000) of 16-byte keys and 32-byte values
#   1kb    KB_N records (default 200,000) of 24-byte keys and 1000-byte values (YCSB's record:
#          10 fields of 100 bytes, stored as one value; a "user..." key)
# bench/mem_load generates the items (key "k000..i", a value derived from i) for all three.
# Figures per item:
#   rdkv       heap = STATS used_bytes / items (the items' blocks: header, key, value, padding
#              and size-class rounding); +index = (used_bytes + index_buckets * 512) / items
#   redis      used_memory / keys (INFO memory; the brief's figure), and the same less the empty
#              server's used_memory
#   memcached  bytes / curr_items (items as stored), and (total_malloced + hash_bytes) /
#              curr_items (slab pages handed out, with their unused chunks, plus the hash table)
# and each rdkv figure as a ratio to Redis's used_memory / keys.
# Environment: SMALL_N, KB_N, CASES ("small 1kb"), THREADS (mem_load's client threads, 4).
# Installs redis-server and memcached with apt-get when missing (as root), like
# deploy/install-deps.sh --bench does for bench/compare.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PROG=memory-per-item.sh
BUILD=${1:-build/ci}
SMALL_N=${SMALL_N:-10000000}
KB_N=${KB_N:-200000}
CASES=${CASES:-"small 1kb"}
THREADS=${THREADS:-4}
KVSERVER=$BUILD/server/kvserver
LOAD=$BUILD/bench/mem_load

die() { echo "$PROG: error: $*" >&2; exit 2; }
say() { echo "$PROG: $*" >&2; }
for b in "$KVSERVER" "$LOAD"; do
  [[ -x $b ]] || die "$b is not built (cmake --build $BUILD --target kvserver mem_load)"
done
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null ||
  ! command -v memcached >/dev/null; then
  [[ $(id -u) -eq 0 ]] || die "redis-server, redis-cli and memcached are needed (apt-get install redis-server redis-tools memcached)"
  say "installing redis-server, redis-tools and memcached"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    redis-server redis-tools memcached >&2
fi

work=$(mktemp -d /tmp/rdkv-mem.XXXXXX)
pid=""
stop() {
  if [[ -n $pid ]]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
  fi
}
trap 'stop; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_tcp() {  # wait_tcp PORT NAME LOG
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  cat "$3" >&2 || true
  die "$2 did not start on 127.0.0.1:$1"
}
# memcached's "stats" and "stats slabs" answers (STAT name value lines; total_malloced is in
# the latter).
mc_stats() {
  exec 3<>"/dev/tcp/127.0.0.1/$1"
  printf 'stats\r\nstats slabs\r\nquit\r\n' >&3
  timeout 5 cat <&3 | tr -d '\r'
  exec 3<&-
}
stat_of() { awk -v k="$2" '$1 == "STAT" && $2 == k { print $3 }' <<<"$1"; }
json_of() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }
div() { python3 -c "print(f'{($1) / ($2):.1f}')"; }
ratio() { python3 -c "print(f'{($1) / ($2):.2f}')"; }

echo "$PROG: $(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs," \
  "$(redis-server --version | awk '{print $1, $3}'), memcached $(memcached -V | awk '{print $2}')"
rows=()
for case in $CASES; do
  case $case in
    small) n=$SMALL_N kb=16 vb=32 ;;
    1kb) n=$KB_N kb=24 vb=1000 ;;
    *) die "unknown case '$case' (small, 1kb)" ;;
  esac
  args=(--count="$n" --key_bytes="$kb" --value_bytes="$vb")
  payload=$((kb + vb))

  # --- rdkv: heap for n items of 32-byte units (header 32 B), with 10% slack, and an index of
  # one slot per item at ~85% use (two-choice 64-slot buckets refuse at ~96%).
  item=$(((32 + payload + 31) / 32 * 32))
  index=$((n * 8 * 100 / 85 + (64 << 10)))
  memory=$((n * item * 110 / 100 + index + (64 << 20)))
  frac=$(python3 -c "print(f'{$index / $memory:.6f}')")
  port=$(free_port)
  say "$case: kvserver, $n items, --memory=$memory --index_fraction=$frac"
  "$KVSERVER" --host=127.0.0.1 --port="$port" --transport=tcp --memory="$memory" \
    --index_fraction="$frac" --worker_threads=2 >"$work/kvserver.log" 2>&1 &
  pid=$!
  wait_tcp "$port" kvserver "$work/kvserver.log"
  t0=$(date +%s)
  GLOG_minloglevel=1 "$LOAD" "${args[@]}" --server="127.0.0.1:$port" --threads="$THREADS" >"$work/stats.json" ||
    die "loading kvserver failed (see above)"
  say "$case: kvserver loaded in $(($(date +%s) - t0)) s"
  stats=$(cat "$work/stats.json")
  items=$(json_of items <<<"$stats")
  used=$(json_of used_bytes <<<"$stats")
  buckets=$(json_of index_buckets <<<"$stats")
  stop
  [[ $items -eq $n ]] || die "kvserver holds $items items, not $n"
  rdkv_heap=$(div "$used" "$items")
  rdkv_region=$(div "$used + $buckets * 512" "$items")

  # --- redis
  port=$(free_port)
  say "$case: redis-server, $n keys (redis-cli --pipe)"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
    --dir "$work" --loglevel warning >"$work/redis.log" 2>&1 &
  pid=$!
  wait_tcp "$port" redis-server "$work/redis.log"
  empty=$(redis-cli -p "$port" info memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }')
  "$LOAD" "${args[@]}" --emit=resp | redis-cli -p "$port" --pipe >"$work/pipe.log" ||
    { cat "$work/pipe.log" >&2; die "redis-cli --pipe failed"; }
  keys=$(redis-cli -p "$port" dbsize | tr -d '\r')
  redis_used=$(redis-cli -p "$port" info memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }')
  stop
  [[ $keys -eq $n ]] || die "redis holds $keys keys, not $n"
  redis_item=$(div "$redis_used" "$keys")
  redis_net=$(div "$redis_used - $empty" "$keys")

  # --- memcached
  port=$(free_port)
  mc_mib=$((n * (payload + 96) / 1048576 * 2 + 128))
  mc_user=()
  [[ $(id -u) -eq 0 ]] && mc_user=(-u nobody)
  say "$case: memcached -m $mc_mib, $n items (text protocol, noreply)"
  memcached "${mc_user[@]}" -l 127.0.0.1 -p "$port" -U 0 -t 2 -m "$mc_mib" -c 64 \
    >"$work/memcached.log" 2>&1 &
  pid=$!
  wait_tcp "$port" memcached "$work/memcached.log"
  "$LOAD" "${args[@]}" --emit=memcached >"/dev/tcp/127.0.0.1/$port"
  mc_items=0
  for _ in $(seq 1 600); do  # noreply: wait until memcached has applied every set
    s=$(mc_stats "$port")
    mc_items=$(stat_of "$s" curr_items)
    [[ $mc_items -ge $n ]] && break
    sleep 0.5
  done
  stop
  [[ $mc_items -eq $n ]] || die "memcached holds $mc_items items, not $n (evictions: $(stat_of "$s" evictions))"
  mc_bytes=$(div "$(stat_of "$s" bytes)" "$mc_items")
  mc_total=$(div "$(stat_of "$s" total_malloced) + $(stat_of "$s" hash_bytes)" "$mc_items")

  rows+=("| $case | $n | $payload | $rdkv_heap | $rdkv_region | $redis_item | $redis_net | $mc_bytes | $mc_total | $(ratio "$rdkv_heap" "$redis_item") | $(ratio "$rdkv_region" "$redis_item") | $(ratio "$rdkv_heap" "$payload") |")
done

echo
echo "| case | items | key+value B | rdkv heap B/item | rdkv heap+index B/item | redis used_memory/keys | redis (less empty) | memcached bytes/item | memcached (malloced+hash)/item | rdkv heap / redis | rdkv heap+index / redis | rdkv heap / payload |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
