"""Probe (device tool): the 4-bit ops' prefill routes against F.linear bf16 on the dequantized weight, in
one CUDA-graph run per problem (3 weight copies): the shipped routing, the Hopper prefill kernel
(kernels/gemm_w4_prefill.py; shipped from hopper_w4.PREFILL_MIN_M to PREFILL_MAX_M rows) at every M,
dequantize to bf16 then the A16W16 GEMM (ops/packed_prefill.py, from DEQUANT_MIN_M rows), the fused tl
kernel with its table / derived config. INT4 g128 asymmetric (--fp4:
MXFP4), the Llama-3 8B / 70B layers (--small: four of them). --variants: also the prefill kernel with each weight
tile height forced (128 rows: two warp groups; 64: one, two programs per SM) and with no K slices.
--narrow: the narrow layers (N <= 5120) of the held-out set instead. --x-pass: also the prefill kernel without
x's permuting pass (timing only) and that pass alone. --per-sm: 64-row weight tiles with three programs per SM.

Usage: python3 scripts/w4_prefill_probe.py [OUT_FILE] [--fp4] [--small | --narrow] [--variants] [--x-pass] [--per-sm] [--m 256 512 1024]
(--m last)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gemmkit.core import hopper_w4  # noqa: E402
from gemmkit.ops import a16w4, fp4  # noqa: E402
from gemmkit.tools import tune  # noqa: E402

import probe_util  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--") and not a.isdigit()]
out = open(args[0], "w") if args else sys.stdout
M_LIST = [int(a) for a in sys.argv[sys.argv.index("--m") + 1:]] if "--m" in sys.argv else [256, 512, 1024]
FP4 = "--fp4" in sys.argv
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192), (57344, 8192),
          (8192, 28672)]
if "--narrow" in sys.argv:
    SHAPES = [(4096, 4096), (4096, 14336), (2560, 8192), (5120, 14336), (4608, 36864), (3072, 3072), (3072, 8192)]
if "--small" in sys.argv:
    SHAPES = [(6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192)]
DEFAULT, PREFILL = a16w4.DEQUANT_MIN_M, hopper_w4.PREFILL_MIN_M
KNOBS = ("PREFILL_MIN_M", "PREFILL_MAX_M", "PREFILL_BM", "PREFILL_MAX_STAGES", "PREFILL_BN", "PREFILL_SPLIT_BELOW",
         "PREFILL_PER_SM")
SHIPPED = {k: getattr(hopper_w4, k) for k in KNOBS}
ROUTES = [("shipped", {}, DEFAULT), ("prefill kernel", {"PREFILL_MAX_M": 1 << 30}, DEFAULT),
          ("dequantize + A16W16", {"PREFILL_MIN_M": 1 << 30}, DEFAULT),
          ("fused tl kernel", {"PREFILL_MIN_M": 1 << 30}, 1 << 30)]
if "--variants" in sys.argv:
    ROUTES += [("prefill kernel, 128-row weight tiles", {"PREFILL_BN": 128, "PREFILL_MAX_M": 1 << 30}, DEFAULT),
               ("prefill kernel, 64-row weight tiles, 2 per SM", {"PREFILL_BN": 64, "PREFILL_MAX_M": 1 << 30}, DEFAULT),
               ("prefill kernel, no K slices", {"PREFILL_SPLIT_BELOW": 0, "PREFILL_MAX_M": 1 << 30}, DEFAULT)]
if "--per-sm" in sys.argv:  # 64-row weight tiles with three programs per SM (two stages each)
    ROUTES += [("prefill kernel, 64-row weight tiles, 3 per SM", {"PREFILL_PER_SM": {128: 1, 64: 3}}, DEFAULT)]
X_PASS = "--x-pass" in sys.argv  # also the shipped prefill kernel without x's permuting pass (timing only: its
# sums are wrong) and that pass alone

print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {'MXFP4' if FP4 else 'INT4 g128 asymmetric'}, "
      "3 weight copies", file=out, flush=True)
for N, K in SHAPES:
    for M in M_LIST:
        torch.manual_seed(0)
        inps, ref, named = probe_util.w4_problem(M, N, K, FP4)
        for name, knobs, min_m in ROUTES:
            for k, v in {**SHIPPED, **knobs}.items():
                setattr(hopper_w4, k, v)
            a16w4.DEQUANT_MIN_M = fp4.DEQUANT_MIN_M = min_m
            plans, calls = probe_util.w4_plan_calls(inps, FP4)
            named[f"{name} (rel err {tune.rel_error(calls[0](), ref):.1e}; {type(plans[0]).__name__})"] = calls
            if X_PASS and name == "prefill kernel" and isinstance(plans[0], hopper_w4.W4PrefillPlan):
                xps = [torch.empty_like(inp["x"]) for inp in inps]
                named["x's permuting pass alone"] = [lambda p=p, inp=inp, xp=xp: p.permute((inp["x"], xp), p.permute_tail)
                                                     for p, inp, xp in zip(plans, inps, xps)]
                plans2, calls2 = probe_util.w4_plan_calls(inps, FP4)
                for p in plans2:
                    p.permute = lambda *a: None
                named["prefill kernel without the x pass (wrong sums)"] = calls2
        for k, v in SHIPPED.items():
            setattr(hopper_w4, k, v)
        a16w4.DEQUANT_MIN_M = fp4.DEQUANT_MIN_M = DEFAULT
        probe_util.time_and_print(named, f"M={M} N={N} K={K}:", N * K / 2, out)
        del inps, ref, named
        torch.cuda.empty_cache()
