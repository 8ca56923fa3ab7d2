#!/usr/bin/env python3
"""bench/failover_analysis.py on small hand-made histories (no cluster)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import failover_analysis as fa  # noqa: E402

MS = 1_000_000


def op(kind, key, complete_ms, outcome="ok", client=0):
    return {"client": client, "op": kind, "key": key, "invoke": complete_ms * MS - 1,
            "complete": complete_ms * MS, "outcome": outcome}


class FailoverAnalysisTest(unittest.TestCase):
    # 4 servers, 4 shards, R=3: shard s has primary s, then s+1, s+2 (mod 4).
    MAP = {"shards": 4, "owners": [0, 1, 2, 3],
           "replicas": [[0, 1, 2], [1, 2, 3], [2, 3, 0], [3, 0, 1]]}
    # Key "kS" is in shard S (hash S: bits 0..19 modulo 4).
    KEYS = {"k0": 0, "k1": 1, "k2": 2, "k3": 3}

    def test_shard_of_uses_the_low_20_bits(self):
        self.assertEqual(fa.shard_of((7 << 20) | 5, 4), 1)
        self.assertEqual(fa.shard_of(0xFFFFF, 6), 0xFFFFF % 6)

    def test_key_classes(self):
        c = fa.key_classes(self.MAP, 1, self.KEYS)
        self.assertEqual(c, {"k0": "backup", "k1": "affected", "k2": "untouched", "k3": "backup"})

    def test_writes_flowing_again_is_the_end_of_the_longest_gap_after_the_kill(self):
        # Answers every 10 ms, none from 1020 to 1400 (a gap after the kill at 1005), then on.
        answers = [ms * MS for ms in list(range(1000, 1021, 10)) + list(range(1400, 3000, 10))]
        self.assertEqual(fa.writes_flowing_again(answers, 1005 * MS, 3000 * MS),
                         (1020 * MS, 1400 * MS))

    def test_ratio_of_the_unaffected_keys(self):
        ops = []
        # Before the kill at t=2000 ms: k0 and k2 get 10 GETs and 10 PUTs each in 1000-2000 ms.
        for i in range(10):
            for k in ("k0", "k2"):
                ops.append(op("get", k, 1000 + 100 * i))
                ops.append(op("put", k, 1000 + 100 * i + 50))
        # During 2000-2200 ms (writes stop on k1 until 2200): k2's GETs at the same rate, its
        # writes at half; k0 nothing (waits on the dead backup); an unknown outcome not counted.
        ops += [op("get", "k2", 2050), op("get", "k2", 2150), op("put", "k2", 2100),
                op("put", "k0", 2120, outcome="unknown")]
        # Writes on k1 (primary: the victim) stop at the kill and flow again at 2200, every 10 ms.
        ops += [op("put", "k1", ms) for ms in list(range(1900, 2000, 10)) +
                list(range(2200, 2500, 10))]
        rounds = [[1, 1, 2000 * MS, 2100 * MS, 2500 * MS, 2600 * MS]]
        res = fa.unaffected_ratios(ops, rounds, {1: self.MAP}, self.KEYS, before_ns=1000 * MS)
        self.assertEqual(len(res), 1)
        x = res[0]
        self.assertAlmostEqual(x["window_ms"], 200)
        before, during, ratio = x[("untouched", "get")]
        self.assertAlmostEqual(before, 10)   # k2: 10 GETs in 1 s
        self.assertAlmostEqual(during, 10)   # 2 in 0.2 s
        self.assertAlmostEqual(ratio, 1.0)
        self.assertAlmostEqual(x[("untouched", "write")][2], 0.5)
        # Unaffected = k0, k2 (k3 has no ops): GETs 20/s before, 10/s during.
        self.assertAlmostEqual(x[("unaffected", "get")][2], 0.5)
        self.assertAlmostEqual(x[("unaffected", "write")][2], 0.25)
        # Of which k0 (the victim was its backup): its GETs stopped; k3 had no ops at all.
        self.assertEqual(x[("backup", "get")][2], 0.0)
        self.assertEqual(fa.p50_min([1.0, 0.5, None, 0.8]), (0.8, 0.5))

    def test_only_the_readers_gets_count_when_there_are_readers(self):
        # Client 1 only reads k0 (10/s before, 10/s during); client 0 reads and writes k0 and
        # is stuck in a write during the failover.
        ops = [op("get", "k0", 1000 + 100 * i, client=1) for i in range(10)]
        ops += [op("get", "k0", 1000 + 100 * i + 50, client=0) for i in range(10)]
        ops += [op("put", "k0", 1000 + 100 * i + 60, client=0) for i in range(10)]
        ops += [op("get", "k0", 2050, client=1), op("get", "k0", 2150, client=1)]
        ops += [op("put", "k1", ms, client=2) for ms in list(range(1900, 2000, 10)) +
                list(range(2200, 2500, 10))]
        self.assertEqual(fa.readers(ops), {1})
        rounds = [[1, 1, 2000 * MS, 2100 * MS, 2500 * MS, 2600 * MS]]
        x = fa.unaffected_ratios(ops, rounds, {1: self.MAP}, self.KEYS, before_ns=1000 * MS)[0]
        self.assertAlmostEqual(x[("backup", "get")][2], 1.0)
        self.assertEqual(x[("backup", "write")][2], 0.0)


class CpuSharesTest(unittest.TestCase):
    def test_processes_fold_into_classes(self):
        self.assertEqual(fa.cpu_class("kvserver"), "kvserver")
        self.assertEqual(fa.cpu_class("swapper"), "idle")
        self.assertEqual(fa.cpu_class("python3"), "test harness")
        self.assertEqual(fa.cpu_class("etcdctl"), "test harness")
        self.assertEqual(fa.cpu_class("etcd"), "etcd")
        self.assertEqual(fa.cpu_class("kworker/1:0"), "other")

    def test_shares_count_only_samples_inside_the_windows(self):
        # 10 Hz per CPU, 2 windows of 0.5 s: 1 CPU-second of samples possible per CPU.
        samples = [(0.1 * i, "kvserver") for i in range(10)]        # 0.0 .. 0.9: 5 in windows
        samples += [(0.05 + 0.1 * i, "swapper") for i in range(10)]  # 5 in windows
        samples += [(3.0, "etcd")]                                   # outside both
        shares = fa.cpu_shares(samples, [(0.0, 0.3), (0.5, 0.7)], hz=10)
        # kvserver: 0.0, 0.1, 0.2, 0.5, 0.6 -> 5 samples / 10 Hz / 0.5 s = 1.0 CPU.
        self.assertAlmostEqual(shares["kvserver"], 1.0)
        # swapper: 0.05, 0.15, 0.25, 0.55, 0.65 -> 1.0 CPU idle.
        self.assertAlmostEqual(shares["idle"], 1.0)
        self.assertNotIn("etcd", shares)
        self.assertEqual(fa.cpu_shares(samples, [], hz=10), {})


if __name__ == "__main__":
    unittest.main()
