"""The figures BENCHMARKS.md's fifteenth section derives from this session's measurements (no device needed):
the ragged-M rule evaluated on the probes' measured routes (scripts/dense_swap_probe.py outputs: each problem's
128-row, 64-row and swapped plans were timed, so a rule's pick per problem has a measured ratio), and geomeans
of the bench tables by M or by subset.

    python3 scripts/ragged_summary.py [DIR]   (DIR: tuning/ragged)
"""

import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gemmkit.core import hopper_ws as hw  # noqa: E402

SMS = 132


def geomean(v):
    return math.exp(sum(map(math.log, v)) / len(v))


def probe_rows(path):
    """(M, N, K, {route: ratio}) of a dense_swap_probe.py output."""
    out = []
    for line in open(path):
        m = re.match(r"M=\s*(\d+) N=\s*(\d+) K=\s*(\d+).*\| ratio (.*?)\s*\|", line)
        if m:
            out.append((*map(int, m.groups()[:3]), {k: float(v) for k, v in re.findall(r"(\S+) ([\d.]+)", m[4])}))
    return out


def rule_pick(M, N, rows64_penalty, swap_penalty):
    """The route ws_ragged_tiles takes with these penalties (its constants patched)."""
    saved = hw.RAGGED_ROWS64_PENALTY, hw.RAGGED_SWAP_PENALTY
    hw.RAGGED_ROWS64_PENALTY, hw.RAGGED_SWAP_PENALTY = rows64_penalty, swap_penalty
    try:
        rows, _, swap = hw.ws_ragged_tiles(M, N, SMS)
    finally:
        hw.RAGGED_ROWS64_PENALTY, hw.RAGGED_SWAP_PENALTY = saved
    return "swap" if swap else "ws64" if rows == hw.HALF else "ws128"


def rule_table(name, rows):
    print(f"\n{name}: {len(rows)} problems; the library's plan then ('own') "
          f"{geomean([r['own'] for *_, r in rows]):.3f}, min {min(r['own'] for *_, r in rows):.2f}; "
          f"best of all timed routes {geomean([max(r.values()) for *_, r in rows]):.3f}")
    for swap_penalty in (1.0, 1.05, 1.1, 1e9):
        cells = []
        for rows64_penalty in (0.7, 0.75, 0.8, 0.85, 0.9, 1.0):
            v = [r[rule_pick(M, N, rows64_penalty, swap_penalty)] for M, N, K, r in rows]
            cells.append(f"{rows64_penalty}: {geomean(v):.3f} (min {min(v):.2f})")
        print(f"  swap penalty {swap_penalty:g}: rule with 64-row penalty " + ", ".join(cells))


def bench_rows(path):
    """(shape, M, ratio) of a gemmkit bench markdown table."""
    out = []
    for line in open(path):
        c = [x.strip() for x in line.split("|")]
        if len(c) > 8 and re.fullmatch(r"\d+", c[2] or "") and re.fullmatch(r"[\d.]+", c[7] or ""):
            out.append((c[1], int(c[2]), float(c[7])))
    return out


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tuning", "ragged")
    fit = [r for r in probe_rows(os.path.join(d, "dense_swap2_h100.txt")) if r[0] % 128]
    small = [r for r in probe_rows(os.path.join(d, "dense_swap_ranges_h100.txt")) if r[0] < 1024]
    rule_table("the fitting set (dense_swap2_h100.txt, M not a multiple of 128)", fit)
    rule_table("100 to 170 rows (dense_swap_ranges_h100.txt; 'own' was the rule before it there)", small)
    rule_table("both", fit + small)
    for f in ("ragged_rule_heldout_fa16c94_h100.txt", "ragged_rule_heldout_056e208_h200.txt"):
        by = {}
        for M, N, K, r in probe_rows(os.path.join(d, f)):
            by.setdefault(M, []).append((r["own"], r["before"]))
        print(f"\n{f}: rule on / off by M: " + ", ".join(
            f"{M}: {geomean([a for a, _ in v]):.3f} / {geomean([b for _, b in v]):.3f}" for M, v in sorted(by.items())))
    by = {}
    for shape, M, ratio in bench_rows(os.path.join(d, "heldout_ragged_a16w16_fa16c94_h100.md")):
        by.setdefault(M, []).append(ratio)
    print("\nheldout_ragged_a16w16_fa16c94_h100.md by M: " + ", ".join(
        f"{M}: {geomean(v):.3f} (min {min(v):.2f}, {len(v)})" for M, v in sorted(by.items())))
    b = [ratio for _, _, ratio in bench_rows(os.path.join(d, "batched_b8_a1ecfaf_h100.md"))]
    print(f"\nbatched_b8_a1ecfaf_h100.md: the first five {geomean(b[:5]):.3f}, eight {geomean(b[:8]):.3f}, "
          f"all {len(b)} {geomean(b):.3f}")
    moe = bench_rows(os.path.join(d, "moe_mlp_778bb0f_h100.md")) + bench_rows(os.path.join(d, "moe_mlp_mixtral_34b4c4b_h100.md"))
    print(f"\nmoe_mlp (778bb0f, Mixtral at 34b4c4b): {geomean([r for *_, r in moe]):.3f} over {len(moe)} points")


if __name__ == "__main__":
    main()
