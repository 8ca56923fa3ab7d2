#!/usr/bin/env bash
# The main job on an embedded default: installs dependencies, builds, starts a local kvserver
# (tcp transport on 127.0.0.1 unless an RDMA device is active), does a kvcli round trip, and
# runs a short GET/PUT benchmark. Everything stops when the script ends.
#
#   deploy/demo.sh            (RDKV_DEMO_PORT=7400 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${RDKV_DEMO_PORT:-7400}
BUILD=build/default

deploy/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target kvserver kvcli kv_bench

work=$(mktemp -d)
server_pid=""
cleanup() {
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== starting kvserver on 127.0.0.1:$PORT"
"$BUILD/server/kvserver" --host=127.0.0.1 --port="$PORT" --memory=256MiB \
  --port_file="$work/port" 2>"$work/kvserver.log" &
server_pid=$!
for _ in $(seq 1 100); do [[ -s $work/port ]] && break; sleep 0.1; done
[[ -s $work/port ]] || { cat "$work/kvserver.log"; echo "kvserver did not start" >&2; exit 1; }
grep -m1 "serving on" "$work/kvserver.log" || true

cli() { "$BUILD/tools/kvcli" --server="127.0.0.1:$PORT" "$@"; }
echo "== kvcli round trip"
set -x
cli ping
cli put greeting "hello from rdkv"
cli get greeting
cli --json get greeting
cli del greeting
set +x
if cli get greeting; then echo "deleted key still found" >&2; exit 1; fi
echo "(exit 1 above = not found, as expected)"

echo "== short benchmark (GET and PUT, embedded server, tcp)"
"$BUILD/bench/kv_bench" --keys=5000 --ops=3000 --seconds=1 --threads=2
echo "== demo done"
