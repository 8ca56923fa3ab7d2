#!/usr/bin/env bash
# How far one etcd carries rdkv's control plane (issue 12, "toward many machines";
# docs/benchmarks.md "Control plane at scale"): for each server count, a fresh single-member etcd
# (the settings of tests/support/etcd_fixture.h: heartbeat 50 ms, election 250 ms) and
# bench/control_plane_sim (simulated servers as threads: registrations under leases with
# keepalives every TTL/3, a map watch each, the two registration puts and the gain gate per map
# change; the failover coordinator in-process, probes off, re-replication off), which measures
# the steady state and kill rounds. Prints each run's lines and then one table.
#
#   bench/control-plane-scale.sh [--counts 50,100,200,400] [--kills 1,1,1,5] [--steady S]
#                                [--build DIR] [--out DIR] [-- EXTRA SIM FLAGS]
#
# Counts above 256 (a map's limit, cluster::kMaxServers) are split over clusters of at most 200
# in the same etcd (each with its own map and coordinator; kills in cluster 0). Needs etcd.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
counts=50,100,200,400 kills=1,1,1,5 steady=10 build=$ROOT/build/ci out="" extra=()
while (($#)); do
  case $1 in
    --counts) counts=$2; shift 2 ;;
    --kills) kills=$2; shift 2 ;;
    --steady) steady=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "control-plane-scale.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
command -v etcd >/dev/null || { echo "SKIPPED: etcd is not installed (deploy/install-deps.sh)"; exit 77; }
out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/rdkv-cp-scale.XXXXXX")}
mkdir -p "$out"
if [[ -z ${NO_BUILD:-} ]]; then
  cmake --build "$build" -j2 --target control_plane_sim >/dev/null
fi
sim=$build/bench/control_plane_sim
# shellcheck source=../tests/deploy/lib.sh
source "$ROOT/tests/deploy/lib.sh"
etcd_pid=""
cleanup() { [[ -n $etcd_pid ]] && kill -9 "$etcd_pid" 2>/dev/null; wait 2>/dev/null; true; }
trap cleanup EXIT
echo "control-plane-scale: counts $counts, kills per round $kills, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); outputs in $out"
: >"$out/results.txt"
failed=0
IFS=, read -ra list <<<"$counts"
for n in "${list[@]}"; do
  clusters=$(((n + 199) / 200))
  port=$(free_base_port 2) || { echo "no free ports" >&2; exit 1; }
  rm -rf "$out/etcd-$n"
  etcd --name m0 --data-dir "$out/etcd-$n" --listen-client-urls "http://127.0.0.1:$port" \
    --advertise-client-urls "http://127.0.0.1:$port" --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-cluster "m0=http://127.0.0.1:$((port + 1))" --heartbeat-interval 50 \
    --election-timeout 250 >"$out/etcd-$n.log" 2>&1 &
  etcd_pid=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  echo "=== $n servers ($clusters cluster(s)), load $(cut -d' ' -f1-3 /proc/loadavg)"
  set +e
  "$sim" --etcd="127.0.0.1:$port" --etcd_pid="$etcd_pid" --servers="$n" --clusters="$clusters" \
    --kills="$kills" --steady_s="$steady" "${extra[@]}" 2>"$out/sim-$n.log" | tee "$out/sim-$n.txt"
  rc=${PIPESTATUS[0]}
  set -e
  ((rc == 0)) || { echo "control_plane_sim exited $rc (see $out/sim-$n.log)"; failed=1; }
  grep '^RESULT' "$out/sim-$n.txt" >>"$out/results.txt" || true
  kill -9 "$etcd_pid" 2>/dev/null; wait "$etcd_pid" 2>/dev/null || true
  etcd_pid=""
  rm -rf "$out/etcd-$n"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out/results.txt" <<'PY'
import sys
rows = []
for line in open(sys.argv[1]):
    kv = dict(x.split("=", 1) for x in line.split()[1:])
    rows.append(kv)
cols = [("servers", "servers"), ("clusters", "maps"), ("steady_req_s", "etcd req/s"),
        ("steady_keepalive_s", "keepalives/s"), ("steady_cpu_pct", "etcd CPU %"),
        ("watchers", "watchers"), ("db_kib", "db KiB"), ("expiry_p50_ms", "kill->expiry ms"),
        ("decision_p50_ms", "decision p50 ms"), ("decision_max_ms", "decision max ms"),
        ("seen_p50_ms", "expiry->map seen p50 ms"), ("fanout_p50_ms", "map->all installed p50 ms"),
        ("fanout_max_ms", "max ms"), ("window_req_s", "failover req/s"),
        ("window_cpu_pct", "failover CPU %"), ("leases_lost", "leases lost"),
        ("failed_rounds", "rounds failed")]
print("| " + " | ".join(h for _, h in cols) + " |")
print("|" + "---:|" * len(cols))
for r in rows:
    print("| " + " | ".join(r.get(k, "-") for k, _ in cols) + " |")
PY
exit "$failed"
