"""Probe (device tool): where the Hopper INT4 decode kernel's time goes at decode sizes. For each
layer and M: the whole gemm_a16w4 call (decode kernel + finish_sums), the decode launch alone,
finish_sums alone, F.linear bf16 and tinygemm (torch._weight_int4pack_mm), all CUDA-graph replay
over ROTATE weight copies, same process. With --ncu-once: one call of each (no timing), for
`ncu` to profile (the kernels' own durations and stall reasons, outside any graph).

Usage: python3 scripts/w4_overhead_probe.py [OUT_FILE] [--ncu-once] [--m 1 16] (--m last)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gemmkit.core import hopper_w4  # noqa: E402
from gemmkit.core.plan import zeroed_buffer  # noqa: E402
from gemmkit.ops import a16w4  # noqa: E402
from gemmkit.tools import registry  # noqa: E402

import probe_util  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--") and not a.isdigit()]
out = open(args[0], "w") if args else sys.stdout
M_LIST = ([int(a) for a in sys.argv[sys.argv.index("--m") + 1:] if a.isdigit()] if "--m" in sys.argv else [1, 16])
NCU = "--ncu-once" in sys.argv
SHAPES = [(4096, 4096), (4096, 14336), (8192, 8192), (57344, 8192)]
ROTATE = 1 if NCU else 3
hopper_w4.DECODE_MAX_M = 64


def parts(inp):
    """(whole call, decode launch alone, finish alone) for one input set."""
    plan = a16w4._make_plan(inp["x"], inp["wq"], inp["ws"], inp["wz"], 128, None, None, None, None, None)
    assert isinstance(plan, hopper_w4.W4DecodePlan), type(plan)
    rest = (None, None, None, None, None, inp["wz"])

    def whole():
        return plan.run(inp["x"], inp["wq"], None, None, None, inp["ws"], *rest)

    whole()  # builds the tail
    M, N = plan.M, plan.N
    y = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    w_desc = plan.w_desc(inp["wq"].view(torch.int32))
    sums = zeroed_buffer(plan.device, plan.device_index, M * N, torch.float32) if plan.slices > 1 else None

    def decode_only():
        plan.launch((w_desc, inp["x"], inp["ws"], inp["wz"], y, None, sums), plan.tail)

    def finish_only():
        plan.finish((sums, y, None), plan.finish_tail)

    return whole, decode_only, (finish_only if plan.slices > 1 else None), plan


print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, INT4 g128 asymmetric, {ROTATE} weight copies",
      file=out, flush=True)
for N, K in SHAPES:
    for M in M_LIST:
        torch.manual_seed(0)
        inps = [registry._tinygemm_inputs(M, N, K, "bf16", "cuda") for _ in range(ROTATE)]
        ps = [parts(inp) for inp in inps]
        plan = ps[0][3]
        wbytes = N * K / 2 + N * (K // 128) * 3
        named = {"F.linear bf16": [lambda inp=inp: F.linear(inp["x"], inp["w16"]) for inp in inps],
                 "tinygemm": [lambda inp=inp: registry._tinygemm(inp) for inp in inps],
                 "gemm_a16w4 (decode + finish)": [p[0] for p in ps],
                 "decode launch alone": [p[1] for p in ps]}
        if ps[0][2] is not None:
            named["finish_sums alone"] = [p[2] for p in ps]
        if NCU:
            for calls in named.values():
                calls[0]()
            torch.cuda.synchronize()
            continue
        v = plan.values
        probe_util.time_and_print(named, f"M={M} N={N} K={K}: KS={v['KS']} SLICES={plan.slices} "
                                  f"programs={plan.launch.grid[0]}", wbytes, out, digits=2)
        del inps, ps, named
        torch.cuda.empty_cache()
