"""Probe (device tool): the 4-bit weights in the warp-specialized GEMM (kernels/gemm_ws.py B_FORMAT INT4 /
MXFP4, core/hopper_w4.W4TilePlan: a decoder warp group writes each K block's values into shared memory for
the consumers' products).

First a correctness sweep through gemm_a16w4 / gemm_a16wfp4 with the route forced (ragged M, N, K; every
group size; symmetric; fp16 x; bias; fp32 output (pointer stores); strided y; 3-D x; K slices; every tile
shape; MXFP4 with extreme scales), each against a float32 reference of the dequantized weight, output
poisoned first. Then, unless --check-only, one CUDA-graph timing per problem (3 weight copies) against
F.linear bf16 on the dequantized weight: the shipped routing, the shipped routing with this route off, this
route everywhere (tile_shape's pick; the prefill kernel off), and (--variants) each tile shape forced. INT4 g128
asymmetric (--fp4: MXFP4). "Correctness" and the fp32 references say nothing typed by hand: each check compares
with torch on fresh random data.

Usage: python3 scripts/w4_tile_probe.py [OUT_FILE] [--fp4] [--check-only] [--variants] [--held-out] [--m 256 1024]
(--m last)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit import quant  # noqa: E402
from gemmkit.core import hopper_w4  # noqa: E402
from gemmkit.ops import a16w4  # noqa: E402
from gemmkit.ops import fp4 as fp4_op  # noqa: E402
from gemmkit.tools import tune  # noqa: E402

import probe_util  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--") and not a.isdigit()]
out = open(args[0], "w") if args else sys.stdout
M_LIST = [int(a) for a in sys.argv[sys.argv.index("--m") + 1:]] if "--m" in sys.argv else [128, 256, 512, 1024, 2048, 4096]
FP4 = "--fp4" in sys.argv
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192), (57344, 8192),
          (8192, 28672)]
if "--small" in sys.argv:
    SHAPES = [(6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192)]
if "--held-out" in sys.argv:
    SHAPES = [(5120, 5120), (27648, 5120), (5120, 13824), (4608, 3584), (37888, 3584), (3584, 18944), (2560, 8192)]
TILES = [(128, (128, 128)), (128, (128, 0)), (128, (64, 0)), (64, (128, 128)), (64, (128, 0))]
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, GEMMKIT_COMMIT {os.environ.get('GEMMKIT_COMMIT')}",
      file=out, flush=True)


SHIPPED = {k: getattr(hopper_w4, k) for k in ("TILE_MIN_M", "TILE_MAX_M", "TILE_MIN_WAVE_USE",
                                              "PREFILL_MIN_M")}


def route(on):
    """on: every call to W4TilePlan (the prefill kernel off); False: never; "shipped": the shipped rule."""
    for k, v in SHIPPED.items():
        setattr(hopper_w4, k, v)
    if on is True:
        hopper_w4.TILE_MIN_M, hopper_w4.TILE_MAX_M, hopper_w4.PREFILL_MIN_M = 1, 1 << 30, 1 << 30
        hopper_w4.TILE_MIN_WAVE_USE = 0
    elif on is False:
        hopper_w4.TILE_MIN_M = hopper_w4.TILE_MAX_M = 1 << 30


def check(name, got, ref, tol=2e-2):
    err = tune.rel_error(got, ref)
    ok = bool(torch.isfinite(got).all()) and err < tol
    print(f"  {'PASS' if ok else 'FAIL'} {name}: rel err {err:.2e}", file=out, flush=True)
    return ok


def int4_case(M, N, K, group, sym=False, dtype=torch.bfloat16, bias=False, out_dtype=None, y_strided=False, lead=None,
              tiles=None, scale_dtype=None):
    torch.manual_seed(M * 7 + N + K)
    x = torch.randn(*(lead or ()), M, K, device="cuda").to(dtype)
    w = torch.randn(N, K, device="cuda") / K**0.5
    wq, ws, wz = quant.quantize_int4(w, group, symmetric=sym)
    if scale_dtype is not None:
        ws = ws.to(scale_dtype)
    w16 = quant.dequantize_int4(wq, ws, wz, group, torch.float32)
    b = torch.randn(N, device="cuda").to(dtype) if bias else None
    ref = F.linear(x.float(), w16, None if b is None else b.float())
    hopper_w4.TILE_FORCE = tiles
    y = None
    if y_strided:
        y = torch.full((M, N + 8), float("nan"), device="cuda", dtype=out_dtype or dtype)[:, :N]
    got = gemmkit.gemm_a16w4(x, wq, ws, wz, group_size=group, bias=b, out_dtype=out_dtype, y=y)
    hopper_w4.TILE_FORCE = None
    plan = type(a16w4._make_plan(x, wq, ws, wz, group, b, y, None, out_dtype, None)).__name__
    return check(f"int4 M={M} N={N} K={K} g={group} sym={sym} {dtype} bias={bias} out={out_dtype} "
                 f"y_strided={y_strided} lead={lead} tiles={tiles} scales={scale_dtype} [{plan}]", got, ref)


def mx_case(M, N, K, tiles=None, extreme=False, bias=False):
    torch.manual_seed(M + N + K)
    x = torch.randn(M, K, device="cuda").bfloat16()
    w = torch.randn(N, K, device="cuda") / K**0.5
    if extreme:
        w[: N // 2] *= 2.0**60
        w[N // 2:] *= 2.0**-60
    wq, ws = quant.quantize_mxfp4(w)
    w16 = quant.dequantize_mxfp4(wq, ws, torch.float32)
    b = torch.randn(N, device="cuda").bfloat16() if bias else None
    ref = F.linear(x.float(), w16, None if b is None else b.float())
    hopper_w4.TILE_FORCE = tiles
    got = gemmkit.gemm_a16wfp4(x, wq, ws, bias=b)
    hopper_w4.TILE_FORCE = None
    plan = type(fp4_op._make_plan(x, None, wq, ws, b, None, None, None, None)).__name__
    return check(f"mxfp4 M={M} N={N} K={K} tiles={tiles} extreme={extreme} bias={bias} [{plan}]", got, ref)


def run_checks():
    results = []
    print("correctness (route forced):", file=out, flush=True)
    for M, N, K in ((1, 64, 64), (100, 1000, 512), (257, 4096, 1024), (1024, 2048, 4096), (33, 130, 192), (512, 6144, 4096)):
        results.append(int4_case(M, N, K, 64 if K % 128 else 128))
    for g in (32, 64, 128, -1):
        results.append(int4_case(300, 1536, 1024, g))
    results.append(int4_case(300, 1536, 1024, -1, sym=True))
    results.append(int4_case(200, 768, 2048, -1))  # one group per channel
    results.append(int4_case(300, 1536, 1024, 128, dtype=torch.float16))
    results.append(int4_case(300, 1536, 1024, 32, dtype=torch.float16, sym=True))
    results.append(int4_case(300, 1536, 1024, 128, bias=True))
    results.append(int4_case(300, 1536, 1024, 128, out_dtype=torch.float32))
    results.append(int4_case(300, 1536, 1024, 128, y_strided=True))
    results.append(int4_case(150, 1536, 1024, 128, lead=(2,)))
    results.append(int4_case(300, 1536, 1024, 128, scale_dtype=torch.float32))
    results.append(int4_case(64, 512, 8192, 128, bias=True))  # K slices
    for t in TILES:
        results.append(int4_case(333, 3000, 1024, 128, tiles=t))
        results.append(int4_case(333, 3000, 1024, 32, tiles=t))
    for M, N, K in ((100, 1000, 512), (512, 4096, 4096), (64, 512, 8192)):
        results.append(mx_case(M, N, K))
    results.append(mx_case(300, 1536, 1024, extreme=True, bias=True))
    for t in TILES:
        results.append(mx_case(333, 3000, 1024, tiles=t))
    print(f"correctness: {sum(results)} of {len(results)} passed", file=out, flush=True)


route(True)
if "--no-check" not in sys.argv:
    run_checks()

if "--check-only" not in sys.argv:
    for N, K in SHAPES:
        for M in M_LIST:
            torch.manual_seed(0)
            inps, ref, named = probe_util.w4_problem(M, N, K, FP4)
            variants = [("shipped", "shipped", None), ("shipped, this route off", False, None),
                        ("this route", True, None)]
            if "--variants" in sys.argv:
                variants += [(f"this route, tiles {t}", True, t) for t in TILES]
            for name, on, tiles in variants:
                route(on)
                hopper_w4.TILE_FORCE = tiles
                plans, calls = probe_util.w4_plan_calls(inps, FP4)
                hopper_w4.TILE_FORCE = None
                p = plans[0]
                desc = type(p).__name__
                if isinstance(p, hopper_w4.W4TilePlan):
                    desc += f" rows {p.rows} parts {p.parts} splits {p.splits} stages {p.stages}"
                named[f"{name} (rel err {tune.rel_error(calls[0](), ref):.1e}; {desc})"] = calls
            route(True)
            probe_util.time_and_print(named, f"M={M} N={N} K={K}:", N * K / 2, out)
            del inps, ref, named
            torch.cuda.empty_cache()
