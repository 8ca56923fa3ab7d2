#!/usr/bin/env python3
"""Failover analyses over a recorded history (issue 12; docs/benchmarks.md "Failover").

Used by tests/cluster/failover_kill_test.sh (writes flowing again) and bench/failover-bench.sh
(throughput of the unaffected shards during each failover):

  failover_analysis.py unaffected OUT_DIR   OUT_DIR as the kill test leaves it: rounds.txt,
                                            h.jsonl, keys.txt, map-before-<round>.json
  failover_analysis.py cpu OUT_DIR SAMPLES  where the host's CPU went in each failover's window
                                            (the same window as `unaffected`) and in the second
                                            before: SAMPLES is `perf script -F comm,tid,time` of
                                            a `perf record -a -k CLOCK_MONOTONIC` of the run

A history line is one operation (tests/history/README.md): op, key, invoke, complete (ns,
CLOCK_MONOTONIC), outcome. keys.txt (history_load --keys_out) has "KEY KEYHASH" lines.
"""
import collections
import json
import os
import re
import sys

DEFINITE = ("ok", "not_found", "exists", "version_mismatch")


def shard_of(key_hash, shards):
    """common/kv/limits.h ShardOf: bits 0..19 of the key's hash, modulo the shard count."""
    return (key_hash & 0xFFFFF) % shards


def write_answers(ops):
    """Completion times of the writes that got a definite answer, ascending."""
    return sorted(op["complete"] for op in ops
                  if op.get("op") != "get" and op.get("outcome") in DEFINITE)


def writes_flowing_again(answers, t_kill, t_end, horizon_ns=3e9):
    """The longest stretch without a definite write answer that begins within `horizon_ns` of the
    kill, among the answers in [t_kill, t_end]: (start, end). Writes flow again at its end."""
    window = [t for t in answers if t_kill <= t <= t_end]
    gap_start, gap_end, prev = t_kill, t_kill, t_kill
    for t in window + [t_end]:
        if t - prev > gap_end - gap_start and prev <= t_kill + horizon_ns:
            gap_start, gap_end = prev, t
        prev = t
    return gap_start, gap_end


def replicas(m, shard):
    """Primary, in-sync backups and joining backups of `shard` in a map (cluster_map.h JSON)."""
    owners = m["owners"]
    reps = (m.get("replicas") or [[o] for o in owners])[shard]
    joining = (m.get("joining") or {}).get(str(shard), [])
    return [owners[shard]] + [r for r in reps if r != owners[shard]] + list(joining)


def key_classes(m, victim, key_hashes):
    """Per key: "affected" (the victim was its shard's primary), "backup" (the victim was another
    replica of its shard) or "untouched" (the victim held no replica of it)."""
    out = {}
    for key, h in key_hashes.items():
        s = shard_of(h, m["shards"])
        if m["owners"][s] == victim:
            out[key] = "affected"
        elif victim in replicas(m, s):
            out[key] = "backup"
        else:
            out[key] = "untouched"
    return out


def readers(ops):
    """Clients that issued only GETs (history_load --get_only_threads)."""
    writers = {op["client"] for op in ops if op["op"] != "get"}
    return {op["client"] for op in ops} - writers


def rate(ops, keys, kind, t0, t1, get_clients=None):
    """Definite answers per second among ops on `keys` of `kind` ("get" or "write") that
    completed in [t0, t1); GETs only from `get_clients` when given."""
    if t1 <= t0:
        return None
    n = sum(1 for op in ops
            if op["key"] in keys and (op["op"] == "get") == (kind == "get")
            and (kind != "get" or get_clients is None or op["client"] in get_clients)
            and op.get("outcome") in DEFINITE and t0 <= op["complete"] < t1)
    return n / ((t1 - t0) / 1e9)


def unaffected_ratios(ops, rounds, maps, key_hashes, before_ns=1e9):
    """For each round (r, victim, t_kill, t_promoted, t_restart, t_full): the throughput of GETs
    and of writes on keys whose shard's primary was not the victim, from the kill to writes
    flowing again on the keys whose primary it was (writes_flowing_again), over the same keys'
    throughput in the `before_ns` before the kill; GETs only of the clients that issue nothing
    else (readers) when the history has any (after the
    previous round had restored R). Returns one dict per round: round, victim, window_ms, and
    per (class, kind) with class "unaffected" (backup + untouched), "backup" or "untouched"
    (key_classes): (before, during, ratio), ratio None when the keys had no operations before;
    None when no key is in the class."""
    # GETs of clients that write too wait whenever their own write waits: count only the
    # readers' GETs when there are any.
    get_clients = readers(ops) or None
    out = []
    prev_full = 0
    for r, victim, t_kill, _t_prom, t_restart, t_full, *_ in rounds:
        classes = key_classes(maps[r], victim, key_hashes)
        # The outage of the affected keys (all writes when no key is affected): the writes of
        # the other keys may flow throughout.
        affected = {k for k, c in classes.items() if c == "affected"}
        answers = write_answers([op for op in ops if not affected or op["key"] in affected])
        _, t_back = writes_flowing_again(answers, t_kill, t_restart)
        res = {"round": r, "victim": victim, "window_ms": (t_back - t_kill) / 1e6}
        groups = {
            "unaffected": {k for k, c in classes.items() if c != "affected"},
            "backup": {k for k, c in classes.items() if c == "backup"},
            "untouched": {k for k, c in classes.items() if c == "untouched"},
        }
        for cls, keys in groups.items():
            for kind in ("get", "write"):
                if not keys:
                    res[(cls, kind)] = None
                    continue
                before = rate(ops, keys, kind, max(t_kill - before_ns, prev_full), t_kill,
                              get_clients)
                during = rate(ops, keys, kind, t_kill, t_back, get_clients)
                ratio = during / before if before and during is not None else None
                res[(cls, kind)] = (before, during, ratio)
        out.append(res)
        prev_full = t_full
    return out


def p50_min(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[len(xs) // 2], xs[0]


def load_run(out_dir):
    """The kill test's rounds and unaffected_ratios over them, from OUT_DIR's files."""
    ops = [json.loads(line) for line in open(os.path.join(out_dir, "h.jsonl")) if line.strip()]
    rounds = [list(map(int, line.split())) for line in open(os.path.join(out_dir, "rounds.txt"))
              if line.strip()]
    key_hashes = {}
    for line in open(os.path.join(out_dir, "keys.txt")):
        if line.strip():
            k, h = line.split()
            key_hashes[k] = int(h)
    maps = {r[0]: json.load(open(os.path.join(out_dir, f"map-before-{r[0]}.json")))
            for r in rounds}
    return rounds, unaffected_ratios(ops, rounds, maps, key_hashes)


def main_unaffected(out_dir):
    rounds, res = load_run(out_dir)
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    for x in res:
        parts = []
        for cls in ("unaffected", "backup", "untouched"):
            for kind in ("get", "write"):
                v = x[(cls, kind)]
                if v is not None:
                    parts.append(f"{cls} {kind} {v[0]:.0f} -> {v[1]:.0f}/s ({fmt(v[2])})")
        print(f"round {x['round']}: server {x['victim']}, kill -> writes flowing "
              f"{x['window_ms']:.0f} ms: " + "; ".join(parts))
    names = {"unaffected": "unaffected (primary elsewhere)",
             "backup": "  of which the killed server was a backup",
             "untouched": "  of which it held no replica"}
    for cls in ("unaffected", "backup", "untouched"):
        for kind in ("get", "write"):
            pm = p50_min(x[(cls, kind)][2] if x[(cls, kind)] else None for x in res)
            if pm is None:
                print(f"{names[cls]}: {kind}s: no data (no such keys or no operations before)")
            else:
                n = sum(1 for x in res if x[(cls, kind)] and x[(cls, kind)][2] is not None)
                print(f"{names[cls]}: {kind}s: throughput during / before the failover: "
                      f"p50 {pm[0]:.2f}, min {pm[1]:.2f}, n {n}")


# Process names folded into the classes the cpu report prints, first prefix first (the rest:
# "other").
CPU_CLASSES = (("kvserver", "kvserver"), ("kvcoord", "kvcoord"), ("etcdctl", "test harness"),
               ("etcd", "etcd"),
               ("history_load", "load (history_load)"), ("swapper", "idle"),
               ("python", "test harness"), ("bash", "test harness"),
               ("kvcli", "test harness"), ("sleep", "test harness"), ("pyenv", "test harness"),
               ("dirname", "test harness"), ("date", "test harness"), ("readlink", "test harness"),
               ("awk", "test harness"), ("cat", "test harness"), ("perf", "perf"))


def cpu_class(comm):
    for prefix, name in CPU_CLASSES:
        if comm.startswith(prefix):
            return name
    return "other"


def cpu_shares(samples, windows, hz):
    """samples: (time_s, comm) of a system-wide sampling at `hz` per CPU; windows: (start_s,
    end_s). Returns {class: CPUs busy on average over the windows}."""
    counts = collections.Counter()
    seconds = sum(b - a for a, b in windows)
    windows = sorted(windows)
    for t, comm in samples:
        for a, b in windows:
            if a <= t < b:
                counts[cpu_class(comm)] += 1
                break
    return {k: v / hz / seconds for k, v in counts.items()} if seconds > 0 else {}


def main_cpu(out_dir, samples_path, hz=499):
    rounds, res = load_run(out_dir)
    samples = []
    for line in open(samples_path, errors="replace"):
        m = re.match(r"\s*(.+?)\s+\d+\s+([\d.]+):", line)
        if m:
            samples.append((float(m.group(2)), m.group(1)))
    during, before = [], []
    for r, x in zip(rounds, res):
        t_kill = r[2] / 1e9
        if x["window_ms"] > 1000:  # the coordinator killed too: a lease expiry, not work
            continue
        during.append((t_kill, t_kill + x["window_ms"] / 1e3))
        before.append((t_kill - 1.0, t_kill))
    if not during:
        print("cpu: no round with a window under 1 s")
        return
    d, b = cpu_shares(samples, during, hz), cpu_shares(samples, before, hz)
    print(f"CPUs busy (of {os.cpu_count()}), during the failover windows ({len(during)} rounds, "
          f"{sum(y - x for x, y in during) * 1000:.0f} ms in all) / in the second before each kill:")
    for k in sorted(set(d) | set(b), key=lambda k: -d.get(k, 0)):
        print(f"  {k:22s} {d.get(k, 0):5.2f} / {b.get(k, 0):5.2f}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "unaffected":
        main_unaffected(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "cpu":
        main_cpu(sys.argv[2], sys.argv[3])
    else:
        print("usage: failover_analysis.py unaffected OUT_DIR | cpu OUT_DIR SAMPLES",
              file=sys.stderr)
        sys.exit(2)
