#!/usr/bin/env bash
# Failover times over many kills (issue #12; docs/benchmarks.md "Failover"): runs
# tests/cluster/failover_kill_test.sh (3 servers, R=3, map in etcd, two kvcoord, a recorded
# GET/PUT/INSERT/CAS/DELETE load on 16 hot keys) with ROUNDS SIGKILLs of the server holding the
# most primaries, each restarted after its promotion, then checks the history with lincheck and
# prints per round and as p50/max: kill -> the promoted map seen in etcd, kill -> writes answered
# again (the end of the longest gap in write answers), with --servers above 3 kill -> every
# shard back to R in-sync replicas on the survivors (before the restart), restart -> every shard
# back to R in-sync replicas;
# then the coordinator's own decision times from its log (revocation after a refused probe ->
# map committed); then, per kill, the throughput of the unaffected shards (bench/
# failover_analysis.py: GETs and writes on keys whose shard's primary was not the killed server,
# from the kill to the affected keys' writes flowing again, over the same keys' throughput in the
# second before; "untouched": shards the killed server held no replica of, with --servers > 3).
# Before each kill the primaries are spread again (kvcli cluster promote: shard s -> server
# s % N), then one quiet second.
#
#   bench/failover-bench.sh [--rounds N] [--durability none|sync] [--servers 3..6] [--pin-keys]
#                           [--cpu] [--build DIR] [--out DIR]
#
# --cpu: samples every CPU while the test runs (perf record -a, 499 Hz, CLOCK_MONOTONIC) and
# prints where the host's CPU went in the failover windows against the second before each kill
# (bench/failover_analysis.py cpu: kvserver, kvcoord, etcd, the load, the test harness, idle).
#
# --pin-keys: 8 keys, 16 load threads, thread i on key i % 8 only (history_load --pin_keys),
# threads 0-7 GETs only (one per 3 ms at most each: --get_only_pause_us=3000; at full speed they
# take the host's CPU, and lincheck's search of a key with ~60,000 GETs runs out of memory),
# threads 8-15 the mix with a 2 ms pause after each operation (--pause_us=2000: on a quiet host
# they made 200,000 operations per key in 6 rounds, beyond lincheck's memory budget), so that a
# thread waiting on an affected key holds up no other key, and a write
# waiting holds up no GET (closed-loop threads on random keys all end up waiting on the affected
# keys within a few operations; the analysis counts only the readers' GETs).
#
# Defaults: 20 rounds, durability none, build/ci (built first: kvserver kvcli kvcoord
# history_load lincheck), outputs under a temporary dir that is printed. Needs etcd and python3.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=20 durability=none build=$ROOT/build/ci out="" servers=3 pin="" cpu=""
while (($#)); do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --durability) durability=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --servers) servers=$2; shift 2 ;;
    --pin-keys) pin=1; shift ;;
    --cpu) cpu=1; shift ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "failover-bench.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
[[ $rounds =~ ^[0-9]+$ ]] && ((rounds >= 1)) || { echo "--rounds must be a positive number" >&2; exit 2; }
case $durability in none | sync) ;; *) echo "--durability: none or sync" >&2; exit 2 ;; esac
out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/rdkv-failover-bench.XXXXXX")}
mkdir -p "$out"
if [[ -z ${NO_BUILD:-} ]]; then
  cmake --build "$build" -j2 --target kvserver kvcli kvcoord history_load lincheck >/dev/null
fi
export RDKV_FAILOVER_SERVERS=$servers
# Primaries spread again (shard s -> server s % N) and a quiet second before each kill, so that
# every kill leaves shards unaffected (bench/failover_analysis.py measures them).
export RDKV_FAILOVER_REBALANCE=1
[[ -n $pin ]] &&
  export RDKV_FAILOVER_LOAD_FLAGS="--pin_keys --keys=8 --threads=16 --get_only_threads=8 --get_only_pause_us=3000 --pause_us=2000"
echo "failover-bench: $rounds rounds, $servers servers, durability $durability${pin:+, keys pinned to threads}, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); outputs in $out"
perf_cmd=()
if [[ -n $cpu ]]; then
  command -v perf >/dev/null || { echo "--cpu needs perf (linux-perf)" >&2; exit 2; }
  # cpu-clock: a fixed period on every CPU, idle ones too (the cycles event of a hardware PMU
  # samples halted CPUs hardly at all), so that 499 samples are one CPU-second.
  perf_cmd=(perf record -q -a -e cpu-clock -F 499 -k CLOCK_MONOTONIC -o "$out/perf.data" --)
fi
set +e
"${perf_cmd[@]}" "$ROOT/tests/cluster/failover_kill_test.sh" "$build" "$build/tests/history/history_load" \
  "$build/tests/history/lincheck" "$rounds" "$durability" "$out" | tee "$out/test.txt"
rc=${PIPESTATUS[0]}
set -e
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
# The coordinator's side: a refused probe (lease revoked) -> the map committed, from its log.
python3 - "$out" <<'PY'
import glob, re, sys, datetime
times = []
for log in glob.glob(sys.argv[1] + "/c/coord-*/kvcoord.log"):
    revoked = None
    for line in open(log, errors="replace"):
        m = re.match(r"[IWE](\d{8}) (\d\d:\d\d:\d\d\.\d+)", line)
        if not m:
            continue
        t = datetime.datetime.strptime(m.group(1) + " " + m.group(2), "%Y%m%d %H:%M:%S.%f")
        if "revoking its etcd lease" in line:
            revoked = t
        elif revoked and "committed map epoch" in line and "failed servers" in line:
            times.append((t - revoked).total_seconds() * 1000)
            revoked = None
times.sort()
if times:
    print(f"coordinator: refused probe -> map committed: p50 {times[len(times)//2]:.1f} ms, "
          f"max {times[-1]:.1f} ms, n {len(times)}")
else:
    print("coordinator: no probe-triggered decision found in the logs")

# Restoring R, the cluster's side, from the coordinators' logs: from a committed map that left
# shards below R and let copies start (a failover, when another server can take the replicas;
# or the admission of a restarted server, when only it can) to the last "in-sync replica" line
# before the next decision. (The test's own "R=3 again" also counts the restart script and
# its etcd polling.)
def stamp(line):
    m = re.match(r"[IWE](\d{8}) (\d\d:\d\d:\d\d\.\d+)", line)
    return datetime.datetime.strptime(m.group(1) + " " + m.group(2), "%Y%m%d %H:%M:%S.%f") if m else None
events = []
for log in glob.glob(sys.argv[1] + "/c/coord-*/kvcoord.log"):
    for line in open(log, errors="replace"):
        t = stamp(line)
        if t is None:
            continue
        if "committed map epoch" in line and ("failed servers" in line or "admitted servers" in line):
            events.append((t, "decision"))
        elif "coordinator: in-sync replicas (" in line and "items copied" in line:
            events.append((t, "synced"))
events.sort()
gaps = []
for i, (t, kind) in enumerate(events):
    if kind != "decision":
        continue
    done = None
    for t2, k2 in events[i + 1:]:
        if k2 == "decision":
            break
        done = t2
    if done is not None:
        gaps.append((done - t).total_seconds() * 1000)
gaps.sort()
if gaps:
    print(f"decision -> every shard back to R (coordinator's log): "
          f"p50 {gaps[len(gaps)//2]:.0f} ms, max {gaps[-1]:.0f} ms, n {len(gaps)}")

PY
# The unaffected shards' throughput during each failover.
if [[ -f $out/keys.txt ]]; then
  python3 "$ROOT/bench/failover_analysis.py" unaffected "$out" | tee "$out/unaffected.txt"
  if [[ -n $cpu && -f $out/perf.data ]]; then
    perf script -i "$out/perf.data" -F comm,tid,time >"$out/cpu-samples.txt" 2>/dev/null
    python3 "$ROOT/bench/failover_analysis.py" cpu "$out" "$out/cpu-samples.txt" | tee "$out/cpu.txt"
  fi
fi
exit "$rc"
