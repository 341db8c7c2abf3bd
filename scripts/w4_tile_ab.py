"""Probe (device tool): where the 4-bit B GEMM's time goes (kernels/gemm_ws.py B_FORMAT INT4): the same call with
the decoder's work cut (GEMMKIT_DEC_WORK: 0 no decode, 1 decode without the shared-memory stores, 2 all; each
value in its own process, as the kernel reads it at compile time), against F.linear bf16 and gemm_a16w16 on the
dequantized weight, in one CUDA-graph run per problem.

Usage: GEMMKIT_DEC_WORK=1 [GEMMKIT_DEC=8,48,184] python3 scripts/w4_tile_ab.py [OUT_FILE]
(before c72bd98 the route was forced by TILE_MIN_M alone: from f121112 its M = 1024 / 4096 rows ran other routes)
--ncu (an ncu target): two calls at M = 4096 on 8192 x 8192, nothing timed:
ncu -k regex:gemm_ws_kernel --launch-skip 1 --launch-count 1 --section SourceCounters --section WarpStateStats
  --section SchedulerStats -o p python3 scripts/w4_tile_ab.py --ncu
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch.nn.functional as F  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core import hopper_w4  # noqa: E402
from gemmkit.kernels import gemm_ws  # noqa: E402

import probe_util  # noqa: E402

work = int(os.environ.get("GEMMKIT_DEC_WORK", "2"))
gemm_ws.DEC_WORK = gl.constexpr(work)
# GEMMKIT_DEC="warps,registers,consumer registers": the decoder partition's size (default: the kernel's)
dec = os.environ.get("GEMMKIT_DEC")
if dec:
    w, r, c = (int(v) for v in dec.split(","))
    gemm_ws.DEC_WARPS, gemm_ws.DEC_REGS, gemm_ws.DEC_CONSUMER_REGS = gl.constexpr(w), gl.constexpr(r), gl.constexpr(c)
    work = f"{work}, decoder {dec}"
# every call to W4TilePlan (the prefill kernel and the wave rule off)
hopper_w4.TILE_MIN_M, hopper_w4.TILE_MAX_M, hopper_w4.TILE_MIN_WAVE_USE, hopper_w4.PREFILL_MIN_M = 1, 1 << 30, 0, 1 << 30
if "--ncu" in sys.argv:
    inp = probe_util.int4_inputs(4096, 8192, 8192)
    for _ in range(2):
        gemmkit.gemm_a16w4(inp["x"], inp["wq"], inp["ws"], inp["wz"], group_size=128)
    sys.exit(0)
out = open(sys.argv[1], "a") if len(sys.argv) > 1 else sys.stdout
for M, N, K in ((4096, 8192, 8192), (1024, 28672, 4096), (256, 28672, 4096)):
    inps = [probe_util.int4_inputs(M, N, K) for _ in range(3)]
    plans, calls = probe_util.w4_plan_calls(inps, False)
    assert isinstance(plans[0], hopper_w4.W4TilePlan), type(plans[0])
    named = {"F.linear bf16": [lambda inp=inp: F.linear(inp["x"], inp["w16"]) for inp in inps],
             "gemm_a16w16": [lambda inp=inp: gemmkit.gemm_a16w16(inp["x"], inp["w16"]) for inp in inps],
             f"W4TilePlan, DEC_WORK {work}": calls}
    probe_util.time_and_print(named, f"M={M} N={N} K={K} (DEC_WORK {work}):", N * K / 2, out)
