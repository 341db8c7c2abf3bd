"""Probe (device tool, H100): tall tiles of the warp-specialized Gluon kernel (256 rows: two consumer warp groups of
128 rows each, core/hopper_ws.TALL) against the library's plans and torch, in one process. Three sets:
- batched (torch.bmm the baseline): the library's call, and the swapped operands (the weight's rows as the tiles'
  rows, x's rows as their columns) in tall tiles at the widths of least wave cost (hopper_ws._wave_cost, 256 rows);
- gated (the fused feed-forward's gated GEMM; F.linear to 2I then silu(g) * u the baseline): the library's gated
  plan against tall gated tiles of 64 + 64 columns;
- dense (F.linear the baseline): gemm_a16w16's plan against tall tiles at the widths of least wave cost, swapped
  where M is not a multiple of 128.
--wide: instead of tall tiles, 128-row tiles wider than 256 columns (a 256-wide part and a second of WIDE_WIDTHS'
16 to 64: 272 to 320 columns; 64 x 320 accumulators per warp group fit its registers), swapped or not as above
(routes "wide..."; no gated set).
Every route's result is checked against a float32 reference first; one interleaved CUDA-graph timing per problem.

    python3 scripts/tall_tiles_probe.py [OUT] [--set batched gated dense] [--widths N] [--wide]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core import hopper_ws as hw  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402
from probe_util import print_geomeans, timed_row  # noqa: E402

BATCHED = [(8, 300, 4096, 4096), (8, 777, 2048, 2048), (16, 333, 1024, 4096), (32, 77, 2048, 2048),
           (8, 1000, 1536, 2048), (8, 1000, 4096, 1024), (8, 200, 4096, 4096), (8, 450, 5120, 5120),
           (8, 512, 4096, 4096), (8, 256, 4096, 8192)]
GATED = [(256, 18944, 3584), (256, 14336, 4096), (256, 28672, 8192), (512, 18944, 3584), (512, 14336, 4096),
         (256, 13824, 5120), (256, 11008, 4096)]
DENSE = [(300, 4096, 4096), (300, 8192, 8192), (777, 6144, 4096), (777, 4096, 14336), (450, 5120, 5120),
         (1000, 1536, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (2048, 7168, 16384), (4096, 28672, 4096),
         (1024, 14336, 4096), (2048, 8192, 2048)]
TALL_WIDTHS = tuple(p for p in hw.WIDTHS if p[0] + p[1] <= 192)  # (accumulators of 128 rows: 192 columns fit)
WIDE_WIDTHS = ((256, 16), (256, 32), (256, 64))
WIDE_DENSE = [(300, 4096, 4096), (300, 8192, 8192), (280, 5120, 5120), (600, 4096, 4096), (300, 14336, 4096),
              (512, 5120, 4096), (1024, 5120, 5120), (2048, 2560, 8192), (512, 9216, 4096), (1024, 4608, 4096),
              (2048, 5120, 5120)]
SETS = 3
SMS = 132


WIDE = False  # (--wide)


def tall_widths(M, N, batch, count):
    """The `count` widths of TALL_WIDTHS whose waves of 256-row tiles over M x N (per entry) cost least (--wide:
    of WIDE_WIDTHS, 128-row tiles)."""
    if WIDE:
        return sorted(WIDE_WIDTHS, key=lambda p: (hw._wave_cost(M, N, p, SMS, hw.BLOCK, batch),
                                                  -(p[0] + p[1])))[:count]
    return sorted(TALL_WIDTHS, key=lambda p: (hw._wave_cost(M, N, p, SMS, hw.TALL, batch), -(p[0] + p[1])))[:count]


def _tiles(p):
    return (hw.BLOCK if WIDE else hw.TALL, p)


def _name(swap, p):
    return f"{'wide' if WIDE else 'tall'}{'_swap' if swap else ''}{p[0]}+{p[1]}"


def plan(x2, w2, M, N, K, tiles, swap=False, batch=None, gated=None, out_shape=None):
    return hw.WSPlan(x2, w2, None, M, N, K, "none", None, None, None, torch.bfloat16, out_shape or (M, N), False,
                     SMS, promote=False, tiles=tiles, swap=swap, batch=batch, gated=gated)


def check(name, fn, ref, out):
    err = rel_error(fn(), ref)
    ok = err < 2e-2
    if not ok:
        print(f"  WRONG {name}: rel err {err:.2e}", file=out, flush=True)
    return ok


def _row(calls, ratios):
    """timed_row's line, and the best tall / wide route's ratio as "best new" (route names differ by problem)."""
    times, line = timed_row(calls, ratios)
    base = times[next(iter(calls))]
    tall = [t for k, t in times.items() if k.startswith(("tall", "wide"))]
    if tall:
        ratios.setdefault("best new", []).append(base / min(tall))
    return line


def batched_rows(args, out, ratios):
    for B, M, N, K in BATCHED:
        sets = [(torch.randn(B, M, K, device="cuda", dtype=torch.bfloat16),
                 torch.randn(B, N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5) for _ in range(SETS)]
        x0, w0 = sets[0]
        ref = torch.bmm(x0.float(), w0.float().transpose(1, 2))
        calls = {"bmm": [lambda x=x, w=w: torch.bmm(x, w.transpose(1, 2)) for x, w in sets],
                 "lib": [lambda x=x, w=w: gemmkit.batched_gemm_a16w16(x, w) for x, w in sets]}
        for p in tall_widths(N, M, B, args.widths):
            pl = plan(x0.view(B * M, K), w0.view(B * N, K), M, N, K, _tiles(p), swap=True, batch=(B, N),
                      out_shape=(B, M, N))
            calls[_name(True, p)] = [lambda x=x, w=w, pl=pl: pl.run(x.view(B * M, K), w.view(B * N, K),
                                                                                 None, None, None, None)
                                                 for x, w in sets]
        calls = {k: v for k, v in calls.items() if k == "bmm" or check(k, v[0], ref, out)}
        line = _row(calls, ratios)
        print(f"batched {B}x{M}x{N}x{K}: {line}", file=out, flush=True)


def gated_rows(args, out, ratios):
    for M, N, K in GATED:  # N: the intermediate size
        sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                 torch.randn(2 * N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5) for _ in range(SETS)]
        x0, w0 = sets[0]
        g, u = (x0.float() @ w0.float().T).chunk(2, dim=1)
        ref = F.silu(g) * u

        def torch_seq(x, w):
            g, u = F.linear(x, w).chunk(2, dim=1)
            return F.silu(g) * u

        calls = {"torch": [lambda x=x, w=w: torch_seq(x, w) for x, w in sets]}
        for name, tiles in (("lib", None), ("tall64+64", (hw.TALL, (64, 64)))):
            pl = plan(x0, w0[:N], M, N, K, tiles, gated=("silu", (0, 1)))
            calls[name] = [lambda x=x, w=w, pl=pl: pl.run(x, w[:N], None, None, None, None, w[N:]) for x, w in sets]
        calls = {k: v for k, v in calls.items() if k == "torch" or check(k, v[0], ref, out)}
        line = _row(calls, ratios)
        print(f"gated {M}x{N}x{K}: {line}", file=out, flush=True)


def dense_rows(args, out, ratios):
    for M, N, K in (WIDE_DENSE if WIDE else DENSE):
        sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                 torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5) for _ in range(SETS)]
        x0, w0 = sets[0]
        ref = x0.float() @ w0.float().T
        calls = {"F.linear": [lambda x=x, w=w: F.linear(x, w) for x, w in sets],
                 "lib": [lambda x=x, w=w: gemmkit.gemm_a16w16(x, w) for x, w in sets]}
        swap = M % hw.BLOCK != 0
        for p in (tall_widths(N, M, 1, args.widths) if swap else tall_widths(M, N, 1, args.widths)):
            pl = plan(x0, w0, M, N, K, _tiles(p), swap=swap)
            calls[_name(swap, p)] = [
                lambda x=x, w=w, pl=pl: pl.run(x, w, None, None, None, None) for x, w in sets]
        calls = {k: v for k, v in calls.items() if k == "F.linear" or check(k, v[0], ref, out)}
        line = _row(calls, ratios)
        print(f"dense {M}x{N}x{K}: {line}", file=out, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--set", nargs="+", default=["batched", "gated", "dense"])
    ap.add_argument("--widths", type=int, default=2, help="tall widths per problem (least wave cost first)")
    ap.add_argument("--wide", action="store_true")
    args = ap.parse_args()
    global WIDE
    WIDE = args.wide
    out = open(args.out, "w") if args.out else sys.stdout
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16; CUDA-graph us per call; "
          "ratio = baseline / route", file=out, flush=True)
    torch.manual_seed(0)
    for name, fn in (("batched", batched_rows), ("gated", gated_rows), ("dense", dense_rows)):
        if name in args.set:
            ratios = {}
            fn(args, out, ratios)
            print_geomeans(ratios, {"batched": "torch.bmm", "gated": "the torch sequence",
                                    "dense": "F.linear"}[name], out)


if __name__ == "__main__":
    main()
