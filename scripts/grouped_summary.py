"""The figures BENCHMARKS.md's sixteenth section derives from this session's measurements (no device needed):
geomeans of scripts/grouped_ws_probe.py's ratios by rows per expert and route, the library's rule evaluated on
them (each problem's tl and expert-map routes were timed, so the rule's pick has a measured ratio), and the bench
tables' geomeans by token range.

    python3 scripts/grouped_summary.py [DIR]   (DIR: tuning/grouped_ws)
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gemmkit.core import hopper_ws as hw  # noqa: E402
from ragged_summary import geomean  # noqa: E402  (scripts/: this script's directory)


def probe(path):
    """Per line: (model, routing, layer, T, R, E-average rows, {route: ratio to _grouped_mm or to tl})."""
    out = []
    for line in open(path):
        m = re.match(r"(\S+):(\S+) (\S+) T=(\d+) \(R=(\d+), (\d+) rows/expert\)", line)
        if not m:
            continue
        r = {}
        g = re.search(r"gathered: tl [\d.]+ \(([\d.]+)x\) ws [\d.]+ \(([\d.]+)x\)", line)
        r["gathered tl"], r["gathered ws"] = float(g[1]), float(g[2])
        s = re.search(r"sorted: tl [\d.]+ \(([\d.]+)x\) ws [\d.]+ \(([\d.]+)x\)", line)
        r["sorted tl"], r["sorted ws"] = float(s[1]), float(s[2])
        for key, pat in (("gated ws/tl", r"gated: tl [\d.]+ ws [\d.]+ \(([\d.]+)x tl\)"),
                         ("scattered ws/tl", r"scattered, weighted: tl [\d.]+ ws [\d.]+ \(([\d.]+)x tl\)")):
            x = re.search(pat, line)
            if x:
                r[key] = float(x[1])
        out.append((m[1], m[2], m[3], int(m[4]), int(m[5]), int(m[6]), r))
    return out


def bench(path):
    """{heading: [(shape, M, ratio)]} of a gemmkit bench markdown file."""
    out, head = {}, None
    for line in open(path):
        if line.startswith("## "):
            head = line[3:].split(" (")[0]
            out[head] = []
        m = re.match(r"\| (\S+) \| (\d+) \| \d+ \| \d+ \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|", line)
        if m and head:
            out[head].append((m[1], int(m[2]), float(m[3])))
    return out


def main(d):
    rows = probe(os.path.join(d, "grouped_ws_probe_final_b484e67_h100.txt"))
    print(f"probe {len(rows)} problems (grouped_ws_probe_final_b484e67_h100.txt), gathered rows, ratio to _grouped_mm:")
    for lo, hi in ((0, 16), (16, 64), (64, 128), (128, 512), (512, 10**9)):
        sel = [r for *_, per, r in rows if lo <= per < hi]
        if sel:
            print(f"  {lo}..{hi} rows per expert ({len(sel)}): tl {geomean([r['gathered tl'] for r in sel]):.3f} "
                  f"(min {min(r['gathered tl'] for r in sel):.2f}), expert map {geomean([r['gathered ws'] for r in sel]):.3f} "
                  f"(min {min(r['gathered ws'] for r in sel):.2f})")
    def pick(R, per, r):
        if per < hw.GROUPED_MIN_ROWS or R < hw.GROUPED_MIN_TOTAL:
            return r["gathered tl"]
        return r["sorted ws"] if per >= hw.GROUPED_PERMUTE_ROWS else r["gathered ws"]

    rule = [pick(R, per, r) for *_, R, per, r in rows]
    print(f"  the rule (expert map from {hw.GROUPED_MIN_ROWS} rows per expert and {hw.GROUPED_MIN_TOTAL} rows; from "
          f"{hw.GROUPED_PERMUTE_ROWS} rows per expert the sorted rows' ratio, the copy not timed): {geomean(rule):.3f} "
          f"(min {min(rule):.2f}); tl everywhere {geomean([r['gathered tl'] for *_, r in rows]):.3f}")
    for key in ("gated ws/tl", "scattered ws/tl"):
        for lo, hi in ((0, 128), (128, 10**9)):
            sel = [r[key] for *_, per, r in rows if key in r and lo <= per < hi]
            if sel:
                print(f"  {key} at {lo}..{hi} rows per expert ({len(sel)}): {geomean(sel):.3f} (min {min(sel):.2f})")
    for name in ("bench_grouped_a6a2fcf_h100.md", "bench_moe_mlp_0b0f8c1_h100.md", "bench_grouped_48a8d11_h200.md",
                 "bench_moe_mlp_48a8d11_h200.md", "bench_grouped_a8w8_ea81b3a_h100.md"):
        tables = bench(os.path.join(d, name))
        every = []
        print(f"\n{name}:")
        for head, t in tables.items():
            every += [x for *_, x in t]
            lo = [x for _, M, x in t if M <= 512]
            hi = [x for _, M, x in t if M >= 2048]
            print(f"  {head}: {geomean([x for *_, x in t]):.3f} (min {min(x for *_, x in t):.2f}); <= 512 tokens "
                  f"{geomean(lo):.3f} (min {min(lo):.2f}); >= 2048 tokens {geomean(hi):.3f} (min {min(hi):.2f})")
        print(f"  all {len(every)}: {geomean(every):.3f} (min {min(every):.2f})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tuning", "grouped_ws"))
