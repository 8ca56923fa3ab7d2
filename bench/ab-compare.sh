#!/usr/bin/env bash
# Before/after comparison of two builds of rdkv on this machine: bench/kv_bench (GET and PUT
# latency and throughput against an embedded server) and kvbench YCSB workload B against a
# kvserver of the same build. The two builds run alternately, REPEAT times each, so that load
# from elsewhere on the machine hits both alike; the table gives each figure's median and the
# ratio B/A.
#
#   bench/ab-compare.sh BUILD_A BUILD_B          e.g. a build of the old commit and build/default
#
# Settings (environment): REPEAT (3), KEYS (10000, kv_bench), RECORDS (10000) and OPS (50000)
# (kvbench), THREADS (2), SECONDS_PER_PHASE (2).
# Each build dir needs bench/kv_bench, bench/kvbench/kvbench and server/kvserver; build them with
#   cmake --build BUILD --target kv_bench kvbench kvserver
# Exit status: 0 when every run succeeded, 1 when one failed (its output is shown), 2 on usage.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "ab-compare: $*" >&2; exit 1; }
if (($# != 2)); then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
A=$1 B=$2
REPEAT=${REPEAT:-3} KEYS=${KEYS:-10000} RECORDS=${RECORDS:-10000} OPS=${OPS:-50000}
THREADS=${THREADS:-2} SECS=${SECONDS_PER_PHASE:-2}
for b in "$A" "$B"; do
  for t in bench/kv_bench bench/kvbench/kvbench server/kvserver; do
    [[ -x $b/$t ]] || die "$b/$t not found: cmake --build $b --target kv_bench kvbench kvserver"
  done
done

work=$(mktemp -d /tmp/rdkv-ab.XXXXXX)
server_pid=""
cleanup() {
  set +e
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 40000))
    if ! ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then echo "$p"; return 0; fi
  done
  die "no free port found"
}

# kv_bench of build $1, run $2: its JSON figures in $work/kvb-$1-$2.json.
run_kv_bench() {
  local label=$1 dir=$2 r=$3
  "$dir/bench/kv_bench" --transport=tcp --keys="$KEYS" --ops=5000 --threads="$THREADS" \
    --seconds="$SECS" --json="$work/kv-$label-$r.json" >"$work/kv-$label-$r.txt" 2>&1 ||
    { cat "$work/kv-$label-$r.txt" >&2; die "kv_bench of $dir failed"; }
}

# kvbench workload B of build $1 against a fresh kvserver of the same build.
run_ycsb_b() {
  local label=$1 dir=$2 r=$3 port
  port=$(free_port)
  "$dir/server/kvserver" --host=127.0.0.1 --port="$port" --transport=tcp --memory=256MiB \
    --durability=none --worker_threads=2 >"$work/server-$label-$r.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 100); do
    timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null && break
    sleep 0.1
  done
  local props=(-P bench/workloads/workloadb -p rdkv.seed=127.0.0.1:"$port" -p rdkv.transport=tcp
               -p recordcount="$RECORDS" -p operationcount="$OPS")
  "$dir/bench/kvbench/kvbench" load -db rdkv "${props[@]}" -threads "$THREADS" \
    >"$work/load-$label-$r.txt" 2>&1 || { tail "$work/load-$label-$r.txt" >&2; die "kvbench load ($dir) failed"; }
  "$dir/bench/kvbench/kvbench" run -db rdkv "${props[@]}" -threads "$THREADS" \
    >"$work/ycsb-$label-$r.txt" 2>&1 || { tail "$work/ycsb-$label-$r.txt" >&2; die "kvbench run ($dir) failed"; }
  kill "$server_pid" && wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

for ((r = 1; r <= REPEAT; r++)); do
  for pair in "A:$A" "B:$B"; do
    label=${pair%%:*} dir=${pair#*:}
    echo "ab-compare: run $r/$REPEAT, build $label ($dir)" >&2
    run_kv_bench "$label" "$dir" "$r"
    run_ycsb_b "$label" "$dir" "$r"
  done
done

python3 - "$work" "$REPEAT" "$A" "$B" <<'EOF'
import json, re, statistics, sys
work, repeat, a_dir, b_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def kv(label, r):
    return json.load(open(f"{work}/kv-{label}-{r}.json"))
def ycsb(label, r):
    out = {}
    for line in open(f"{work}/ycsb-{label}-{r}.txt"):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3: continue
        if parts[0] == "[OVERALL]" and parts[1] == "Throughput(ops/sec)": out["ycsb_b_ops_per_s"] = float(parts[2])
        m = re.match(r"\[(READ|UPDATE)\]", parts[0])
        if m and parts[1] == "50thPercentileLatency(us)": out[f"ycsb_b_{m.group(1).lower()}_p50_us"] = float(parts[2])
        if parts[0] == "[RDKV]" and parts[1] == "READsPerGET": out["ycsb_b_reads_per_get"] = float(parts[2])
    return out
rows = {}
for label in ("A", "B"):
    for r in range(1, repeat + 1):
        figs = {k: v for k, v in kv(label, r).items() if isinstance(v, (int, float))}
        figs.update(ycsb(label, r))
        for k, v in figs.items(): rows.setdefault(k, {}).setdefault(label, []).append(v)
print(f"A = {a_dir}\nB = {b_dir}\nmedian of {repeat} alternating runs each\n")
print(f"| figure | A | B | B/A |\n|---|---:|---:|---:|")
for k in sorted(rows):
    if "A" not in rows[k] or "B" not in rows[k]: continue
    a, b = statistics.median(rows[k]["A"]), statistics.median(rows[k]["B"])
    ratio = f"{b / a:.3f}" if a else "-"
    print(f"| {k} | {a:.2f} | {b:.2f} | {ratio} |")
EOF
