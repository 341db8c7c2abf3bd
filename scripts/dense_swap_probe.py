"""Probe (device tool, H100): gemm_a16w16 at M not a multiple of 128 (the tiles' rows), its own route
against the Gluon kernel with swapped operands (the weight's rows as the tiles' 128 rows, x's rows as their
columns at a fitted width; kernels/gemm_ws.py C_T, K slices where the tiles are few), F.linear (cuBLAS) the
baseline; each route checked against it first, then one interleaved CUDA-graph timing per problem.

    python3 scripts/dense_swap_probe.py [OUT] [--m M ...] [--nk N K ...] [--widths N0 N1 ...]

Routes: own (the library's pick), before (its pick without RAGGED_RULE), ws128 / ws64 (the Gluon kernel, tiles
of 128 / 64 rows at the width of least wave cost, K slices where the tiles are few), swap (swapped at the width
of least wave cost), and s<N0>+<N1> (swapped at each --widths pair). --rule-only: own and before only.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core import config as config_mod  # noqa: E402
from gemmkit.core import hopper_ws  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402
from probe_util import dense_baseline, dense_sets, print_geomeans, timed_row  # noqa: E402

NK = [4096, 4096, 14336, 4096, 4096, 14336, 1280, 8192, 6144, 4096, 8192, 8192, 5120, 5120, 2560, 8192]
MS = [200, 300, 450, 640, 777, 1000]
SETS = 3


def fitted(M, N, rows):
    """The width of least wave cost for tiles of `rows` rows (ws_tiles' candidates)."""
    widths = hopper_ws.ROWS64_WIDTHS[False] if rows == 64 else hopper_ws._widths(False, M)
    return min(widths, key=lambda p: (hopper_ws._wave_cost(M, N, p, 132, rows), -(p[0] + p[1])))


def swapped_cost(M, N, parts):
    """The swapped tiles' wave cost (_wave_cost in the kernel's orientation: N rows, M columns)."""
    return hopper_ws._wave_cost(N, M, parts, 132)


def plan_with(x, w, parts=None, rows=None, old=False):
    """gemm_a16w16's plan for x, w: its own (parts None), swapped at `parts`, or (rows 128 / 64) the Gluon
    kernel's tiles of that many rows at the width ws_tiles would fit (the rule bypassed)."""
    saved = hopper_ws.ws_dense_swap, hopper_ws.ws_direct_ok, hopper_ws.ws_tiles
    hopper_ws.RAGGED_RULE = not old
    if parts is not None:
        hopper_ws.ws_dense_swap = lambda *a: parts
        hopper_ws.ws_direct_ok = lambda *a: True
    if rows is not None:
        hopper_ws.ws_direct_ok = lambda *a: True
        hopper_ws.ws_tiles = lambda M, N, sms, fp8: (rows, fitted(M, N, rows))
    try:
        config_mod.clear_caches()
        gemmkit.gemm_a16w16(x, w)
        from gemmkit.ops import a16w16

        return next(reversed(a16w16._plans.values()))
    finally:
        hopper_ws.ws_dense_swap, hopper_ws.ws_direct_ok, hopper_ws.ws_tiles = saved
        hopper_ws.RAGGED_RULE = True
        config_mod.clear_caches()


def routes_of(M, N, args) -> dict:
    """The routes timed for one problem: name -> plan_with keywords."""
    if args.rule_only:
        return {"own": {}, "before": dict(old=True)}
    fixed = [tuple(args.widths[i:i + 2]) for i in range(0, len(args.widths), 2)]
    best = min(hopper_ws.WIDTHS, key=lambda p: (swapped_cost(M, N, p), -(p[0] + p[1])))
    return {"own": {}, "before": dict(old=True), "ws128": dict(rows=128), "ws64": dict(rows=64),
            "swap": dict(parts=best), **{f"s{p[0]}+{p[1]}": dict(parts=p) for p in fixed if p != best}}


def probe(M, N, K, routes: dict, ratios: dict, out) -> str:
    """Check each route's result against F.linear on fresh inputs, time them in one run; the printable row."""
    sets = dense_sets(M, N, K, False, SETS)
    ref = dense_baseline(*sets[0]).float()
    calls = {"F.linear": [lambda s=s: dense_baseline(*s) for s in sets]}
    kinds = {}
    for name, route in routes.items():
        plan = plan_with(sets[0][0], sets[0][1], **route)
        run = getattr(plan, "run", plan)
        kinds[name] = (f"{type(plan).__name__} rows {getattr(plan, 'rows', '-')} parts "
                       f"{getattr(plan, 'parts', '-')} splits {getattr(plan, 'splits', '-')}"
                       + (" swap" if getattr(plan, "swap", False) else ""))
        err = rel_error(run(sets[0][0], sets[0][1], None, None, None, None), ref)
        if err > 2e-2:
            print(f"  {name}: wrong result (rel err {err:.2e})", file=out, flush=True)
            continue
        calls[name] = [lambda s=s, r=run: r(s[0], s[1], None, None, None, None) for s in sets]
    _, line = timed_row(calls, ratios)
    return f"M={M:5d} N={N:5d} K={K:5d}  {line}  | " + ", ".join(f"{k}: {v}" for k, v in kinds.items())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--m", type=int, nargs="+", default=MS)
    ap.add_argument("--nk", type=int, nargs="+", default=NK)
    ap.add_argument("--widths", type=int, nargs="+", default=[])
    ap.add_argument("--rule-only", action="store_true", help="time own and before only")
    args = ap.parse_args()
    out = open(args.out, "w") if args.out else sys.stdout
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16; CUDA-graph us per call; "
          "ratio = F.linear / route; swap: x's rows as the tiles' columns at the width of least wave cost", file=out,
          flush=True)
    ratios = {}
    for N, K in zip(args.nk[::2], args.nk[1::2]):
        for M in args.m:
            print(probe(M, N, K, routes_of(M, N, args), ratios, out), file=out, flush=True)
            torch.cuda.empty_cache()  # (the problem's inputs, freed with probe's frame)
    print_geomeans(ratios, "F.linear", out)


if __name__ == "__main__":
    main()
