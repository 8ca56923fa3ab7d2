#!/usr/bin/env python3
"""bench/throughput_chart.py: the SVG holds one line per backend and workload, with a point per
thread count at the right height, and bad input is refused."""
import os
import math
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import throughput_chart as tc  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


class ThroughputChartTest(unittest.TestCase):
    def draw(self, tsv):
        d = tempfile.mkdtemp()
        src, out = os.path.join(d, "m.tsv"), os.path.join(d, "c.svg")
        with open(src, "w") as f:
            f.write(tsv)
        rc = tc.main(["throughput_chart.py", src, out, "a title"])
        return rc, (ET.parse(out).getroot() if rc == 0 else None)

    def test_a_line_per_backend_and_workload_with_a_point_per_thread_count(self):
        rows = ["# header"]
        for w, base in (("a", 1000), ("c", 10000)):
            for t, scale in ((1, 1), (2, 2), (4, 3)):
                rows.append(f"{w}\t{t}\trdkv\t{base * scale}")
                rows.append(f"{w}\t{t}\tredis\t{base * 3 // 2 * scale}")
                rows.append(f"{w}\t{t}\tmemcached\t{base * 2 * scale}")
        rc, root = self.draw("\n".join(rows) + "\n")
        self.assertEqual(rc, 0)
        lines = root.findall(f"{SVG}polyline")
        self.assertEqual(len(lines), 6)  # 2 workloads x 3 backends
        for pl in lines:
            self.assertEqual(len(pl.get("points").split()), 3)  # 1, 2 and 4 threads
        titles = [t.text for t in root.iter(f"{SVG}text")]
        self.assertIn("workload A", titles)
        self.assertIn("workload C", titles)
        self.assertIn("a title", titles)
        # Within a panel, memcached's 6000 ops/s at 4 threads is drawn above redis's 4500, and
        # the points of one line rise with its throughput.
        tips = {c.find(f"{SVG}title").text: float(c.get("cy")) for c in root.iter(f"{SVG}circle")}
        self.assertEqual(len(tips), 18)
        self.assertLess(tips["memcached, 4 thread(s): 6000 ops/s"],
                        tips["redis, 4 thread(s): 4500 ops/s"])  # SVG y grows downwards
        self.assertLess(tips["rdkv, 2 thread(s): 2000 ops/s"], tips["rdkv, 1 thread(s): 1000 ops/s"])

    def test_the_axis_reaches_the_largest_value(self):
        for v in (0.5, 7, 999, 1000, 12345, 987654):
            step = tc.nice_step(v)
            self.assertGreaterEqual(step * 4, v)
            self.assertLess(step * 4, v * 4 + 1e-9)
            mantissa = step / 10 ** math.floor(math.log10(step))
            self.assertIn(round(mantissa, 6), (1, 2, 2.5, 5))

    def test_bad_input_is_refused(self):
        rc, _ = self.draw("")
        self.assertEqual(rc, 1)
        rc, _ = self.draw("a\t1\trdkv\n")  # three fields
        self.assertEqual(rc, 1)
        rc, _ = self.draw("a\t1\trdkv\tnan\n")  # no throughput (e.g. a run of 0 operations)
        self.assertEqual(rc, 1)


if __name__ == "__main__":
    unittest.main()
