#!/usr/bin/env bash
# Issue #15, defects 8 and 10, against the kvserver binary: --help lists kvserver's own flags
# only; bad usage exits 2 (unknown or foreign flags, malformed numbers, NaN, a --memory the
# machine cannot give, 2^64-1); a damaged WAL stops the start naming file and offset with the
# data dir unchanged, and --wal_recovery=point_in_time starts reporting the drop; SIGTERM
# during a slow recovery stops cleanly (exit 0, data dir unchanged, all keys there afterwards).
#
#   defects_kvserver_test.sh KVSERVER KVCLI
set -uo pipefail
kvserver=$1 kvcli=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-defects.XXXXXX")
server_pid=""
cleanup() {
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
common=(--port=0 --transport=tcp --memory=32MiB --huge_pages=false)

# --- help and usage ---
"$kvserver" --help >"$work/help" 2>&1 || fail "--help exited $?"
lines=$(wc -l <"$work/help")
((lines < 150)) || fail "--help prints $lines lines"
# gflags' format, which deploy/local-cluster.sh and tests/deploy parse: "    -name (...".
grep -qE -- "^ +-memory \(" "$work/help" || fail "--help lacks --memory"
grep -qE -- "^ +-wal_recovery \(" "$work/help" || fail "--help lacks --wal_recovery"
"$kvserver" --helpfull >"$work/helpfull" 2>&1 || fail "--helpfull exited $?"
grep -qE -- "^ +-port_file \(" "$work/helpfull" || fail "--helpfull lacks --port_file"
grep -qi "rocksdb.*tool\|--db=\|--compression_type" "$work/help" && fail "--help lists RocksDB tool flags"

# usage EXPECTED_WORDS ARGS...: kvserver exits 2 at once with the words on stderr.
usage() {
  local words=$1
  shift
  timeout 20 "$kvserver" "${common[@]}" "$@" >"$work/out" 2>&1
  local rc=$?
  [[ $rc == 2 ]] || fail "kvserver $* exited $rc, expected 2: $(tail -2 "$work/out")"
  grep -q -- "$words" "$work/out" || fail "kvserver $*: no '$words' in: $(tail -2 "$work/out")"
}
usage "unknown flag --bogus" --bogus
usage "unknown flag --nosuchflag" --nosuchflag=1
usage "--port=abc: not a valid" --port=abc
usage "--grace_ms=1e3: not a valid" --grace_ms=1e3
usage "not a number within 0.001..0.5" --index_fraction=nan
usage "is above the largest supported region" --memory=18446744073709551615
usage "more than this machine can give" --memory=64TiB
# Near RAM: the region alone fits in MemAvailable, the process around it does not.
avail_mib=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
usage "more than this machine can give" --memory="$((avail_mib - 64))MiB"
usage "unexpected argument" stray
usage "unknown WAL recovery" --wal_recovery=maybe
FLAGS_port=abc usage "FLAGS_port=abc (--tryfromenv): not a valid" --tryfromenv=port,memory
usage "--tryfromenv: unknown flag nosuch" --tryfromenv=port,nosuch
# A RocksDB tool flag, if this librocksdb defines any (db_bench's, ldb's): refused too.
for f in compression_type benchmarks num; do
  timeout 20 "$kvserver" "${common[@]}" --$f=1 >"$work/out" 2>&1
  [[ $? == 2 ]] || fail "kvserver --$f=1 (not a kvserver flag) was accepted"
done

# --- a server with 50 synced keys ---
data=$work/data
start() {  # start ARGS...: a kvserver in the background on $data; waits for its port file
  rm -f "$work/port"
  "$kvserver" "${common[@]}" --port_file="$work/port" --data_dir="$data" "$@" \
    >"$work/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 300); do
    [[ -s $work/port ]] && return 0
    kill -0 "$server_pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
stop() {
  kill -TERM "$server_pid" 2>/dev/null
  wait "$server_pid"
  local rc=$?
  server_pid=""
  return $rc
}
cli() { "$kvcli" --server="127.0.0.1:$(cat "$work/port")" --transport=tcp "$@"; }
fingerprint() { (cd "$data" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }

start || { cat "$work/server.log"; echo "kvserver did not start" >&2; exit 1; }
for i in $(seq 1 50); do
  cli put "key$i" "$(printf 'value-%04d-%0200d' "$i" 0)" >/dev/null || fail "put key$i"
done
stop || fail "clean stop exited $?"

# --- SIGTERM during a slow recovery (50 ms per key: about 2.5 s) ---
before=$(fingerprint)
rm -f "$work/port"
RDKV_TEST_RECOVERY_DELAY_US=50000 "$kvserver" "${common[@]}" --port_file="$work/port" \
  --data_dir="$data" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
  grep -q "recovery: loading" "$work/server.log" && break
  sleep 0.05
done
sleep 0.5
kill -TERM "$server_pid"
t0=$(date +%s)
wait "$server_pid"
rc=$?
server_pid=""
[[ $rc == 0 ]] || fail "SIGTERM during recovery: exit $rc, expected 0: $(tail -3 "$work/server.log")"
(($(date +%s) - t0 < 5)) || fail "SIGTERM during recovery took more than 5 s"
[[ -s $work/port ]] && fail "the server served after SIGTERM during recovery"
grep -q "stopped by a signal" "$work/server.log" || fail "no 'stopped by a signal' in the log"
[[ $(fingerprint) == "$before" ]] || fail "the data dir changed after SIGTERM during recovery"
start || fail "restart after the stopped recovery"
[[ $(cli get key50) == value-0050-* ]] || fail "key50 lost after the stopped recovery"
# The start moved the old WAL into a table file: 50 more writes for the WAL of the next test.
for i in $(seq 51 100); do
  cli put "key$i" "$(printf 'value-%04d-%0200d' "$i" 0)" >/dev/null || fail "put key$i"
done
stop || fail "clean stop exited $?"

# --- a WAL garbled in the middle ---
wal=$(ls -S "$data"/db/*.log | head -1)
size=$(stat -c %s "$wal")
((size > 8000)) || fail "the WAL holds $size bytes, expected the 50 writes"
printf '\xde\xad\xbe\xef\xde\xad\xbe\xef' | dd of="$wal" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
before=$(fingerprint)
timeout 60 "$kvserver" "${common[@]}" --data_dir="$data" >"$work/out" 2>&1
rc=$?
[[ $rc == 2 ]] || fail "garbled WAL: exit $rc, expected 2"
grep -q "$wal at byte [0-9]" "$work/out" || fail "garbled WAL: file and offset not named: $(tail -2 "$work/out")"
[[ $(fingerprint) == "$before" ]] || fail "garbled WAL: the data dir changed"
start --wal_recovery=point_in_time || fail "--wal_recovery=point_in_time did not start"
grep -q "recovered through sequence" "$work/server.log" || fail "point_in_time: the drop is not reported"
cli get key1 >/dev/null || fail "point_in_time: key1 (before the damage) is missing"
stop

if ((failures > 0)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "defects_kvserver_test: all passed"
