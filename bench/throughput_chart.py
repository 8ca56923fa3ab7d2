#!/usr/bin/env python3
"""Draws throughput against client threads, one panel per YCSB workload and one line per store,
as a self-contained SVG (no plotting library needed).

    bench/throughput_chart.py MEDIANS.tsv OUT.svg [TITLE]

MEDIANS.tsv is what bench/compare.sh writes next to its table: one line per cell,
"workload<TAB>threads<TAB>store<TAB>ops_per_s" (the median over the repeats). Exit 1 with a
message when the file holds no usable row.
"""

import math
import sys
from collections import defaultdict
from html import escape

COLORS = {"rdkv": "#d62728", "redis": "#1f77b4", "memcached": "#2ca02c"}
FALLBACK = ["#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
PANEL_W, PANEL_H = 300, 240
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 62, 16, 34, 44


def read_rows(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split("\t")
            if len(parts) != 4:
                raise ValueError(f"{path}:{n}: expected 4 tab-separated fields, got {len(parts)}")
            w, t, store, ops = parts
            value = float(ops)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{path}:{n}: throughput {ops!r} is not a finite count")
            rows.append((w.upper(), int(t), store, value))
    return rows


def nice_step(v, ticks=4):
    """A round tick step so that `ticks` steps reach at least v."""
    if v <= 0:
        return 1.0
    raw = v / ticks
    exp = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * exp >= raw:
            return m * exp
    return 10 * exp


def fmt_ops(v):
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def panel(out, x0, workload, series, threads, colors):
    """One workload's panel with its top-left corner at (x0, 0)."""
    plot_w = PANEL_W - MARGIN_L - MARGIN_R
    plot_h = PANEL_H - MARGIN_T - MARGIN_B
    left, top = x0 + MARGIN_L, MARGIN_T
    step = nice_step(max(v for pts in series.values() for _, v in pts))
    ticks = 4
    ymax = step * ticks
    # Threads are evenly spaced categories (1, 2, 4, 8 ...), in the order given.
    xs = {t: left + (i + 0.5) * plot_w / len(threads) for i, t in enumerate(threads)}

    def y(v):
        return top + plot_h - v / ymax * plot_h

    out.append(f'<text x="{x0 + PANEL_W / 2:.1f}" y="20" text-anchor="middle" '
               f'font-weight="bold">workload {escape(workload)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" '
               f'fill="none" stroke="#888"/>')
    for k in range(ticks + 1):
        v = step * k
        yy = y(v)
        out.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{left + plot_w}" y2="{yy:.1f}" '
                   f'stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{fmt_ops(v)}</text>')
    for t, xx in xs.items():
        out.append(f'<text x="{xx:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{t}</text>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h + 34}" '
               f'text-anchor="middle">client threads</text>')
    out.append(f'<text x="{x0 + 14}" y="{top + plot_h / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 {x0 + 14} {top + plot_h / 2:.1f})">ops/s</text>')
    for store, pts in series.items():
        pts = sorted(pts, key=lambda p: threads.index(p[0]))
        coords = " ".join(f"{xs[t]:.1f},{y(v):.1f}" for t, v in pts)
        color = colors[store]
        out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
        for t, v in pts:
            out.append(f'<circle cx="{xs[t]:.1f}" cy="{y(v):.1f}" r="3.5" fill="{color}">'
                       f'<title>{escape(store)}, {t} thread(s): {v:.0f} ops/s</title></circle>')


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        rows = read_rows(argv[1])
    except (OSError, ValueError) as e:
        print(f"throughput_chart: {e}", file=sys.stderr)
        return 1
    if not rows:
        print(f"throughput_chart: {argv[1]} holds no rows", file=sys.stderr)
        return 1
    title = argv[3] if len(argv) > 3 else "throughput vs client threads"
    workloads = sorted({w for w, _, _, _ in rows})
    threads = sorted({t for _, t, _, _ in rows})
    stores = []
    for _, _, s, _ in rows:
        if s not in stores:
            stores.append(s)
    colors = {}
    for i, s in enumerate(stores):
        colors[s] = COLORS.get(s, FALLBACK[i % len(FALLBACK)])
    by_w = defaultdict(lambda: defaultdict(list))
    for w, t, s, v in rows:
        by_w[w][s].append((t, v))

    width = PANEL_W * len(workloads)
    height = PANEL_H + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    for i, w in enumerate(workloads):
        panel(out, i * PANEL_W, w, by_w[w], threads, colors)
    # Legend and title under the panels.
    ly = PANEL_H + 22
    x = 20
    for s in stores:
        out.append(f'<line x1="{x}" y1="{ly}" x2="{x + 24}" y2="{ly}" stroke="{colors[s]}" '
                   f'stroke-width="3"/>')
        out.append(f'<text x="{x + 30}" y="{ly + 4}">{escape(s)}</text>')
        x += 40 + 8 * len(s) + 20
    out.append(f'<text x="20" y="{ly + 26}" fill="#444">{escape(title)}</text>')
    out.append("</svg>")
    with open(argv[2], "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
