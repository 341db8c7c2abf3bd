"""Probe (device tool): the 4-bit ops' prefill route (ops/packed_prefill.py: dequantize to bf16, then the
A16W16 GEMM, from DEQUANT_MIN_M rows) against the fused tl kernel with its table / derived config at
the same rows, and F.linear bf16 on the dequantized weight, in one CUDA-graph run per problem (3 weight
copies). INT4 g128 asymmetric (--fp4: MXFP4), the Llama-3 8B / 70B layers.

Usage: python3 scripts/w4_prefill_probe.py [OUT_FILE] [--fp4] [--m 256 512 1024] (--m last)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gemmkit.ops import a16w4, fp4  # noqa: E402
from gemmkit.tools import registry, tune  # noqa: E402

import probe_util  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--") and not a.isdigit()]
out = open(args[0], "w") if args else sys.stdout
M_LIST = [int(a) for a in sys.argv[sys.argv.index("--m") + 1:]] if "--m" in sys.argv else [256, 512, 1024]
FP4 = "--fp4" in sys.argv
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192), (57344, 8192),
          (8192, 28672)]
DEFAULT = a16w4.DEQUANT_MIN_M

print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {'MXFP4' if FP4 else 'INT4 g128 asymmetric'}, "
      "3 weight copies", file=out, flush=True)
for N, K in SHAPES:
    for M in M_LIST:
        torch.manual_seed(0)
        inps = ([registry._a16wfp4_inputs(M, N, K, "bf16", "cuda") for _ in range(3)] if FP4
                else [probe_util.int4_inputs(M, N, K) for _ in range(3)])
        ref = inps[0]["x"].float() @ inps[0]["w16"].float().T
        named = {"F.linear bf16": [lambda inp=inp: F.linear(inp["x"], inp["w16"]) for inp in inps]}
        for name, min_m in (("dequantize + A16W16 (shipped)", DEFAULT), ("fused tl kernel", 1 << 30)):
            a16w4.DEQUANT_MIN_M = fp4.DEQUANT_MIN_M = min_m
            calls = probe_util.w4_plan_calls(inps, FP4)[1]
            named[f"{name} (rel err {tune.rel_error(calls[0](), ref):.1e})"] = calls
        a16w4.DEQUANT_MIN_M = fp4.DEQUANT_MIN_M = DEFAULT
        probe_util.time_and_print(named, f"M={M} N={N} K={K}:", N * K / 2, out)
        del inps, ref, named
        torch.cuda.empty_cache()
