"""Probe (device tool): 4-bit weight GEMMs at decode sizes (INT4 g128 asymmetric and MXFP4, as
`gemmkit bench a16w4 / a16wfp4` build them) with explicit tile / split-K configs, against F.linear
on the dequantized bf16 weight and the ops' own pick (gemmkit.core.config._derive_packed), under
CUDA-graph replay. "earlier rule" is the pick before PACKED_DECODE_MAX_M: 128-row x 128-deep B
tiles, split-K until the tiles cover the SMs twice.

--prefill: M = 128, 256, 512 instead, fused configs (with split-K where the tiles leave SMs idle)
against the ops' own pick, which from packed_prefill.DEQUANT_MIN_M rows dequantizes the weight and
runs the A16W16 GEMM.

Usage: python3 scripts/w4_decode_probe.py [OUT_FILE] [--fp4] [--prefill]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gemmkit.ops import a16w4, fp4  # noqa: E402
from gemmkit.tools import registry  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from probe_util import checked_calls  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
out = open(args[0], "w") if args else sys.stdout
FP4 = "--fp4" in sys.argv
PREFILL = "--prefill" in sys.argv
PREFILL_TILES = [(128, 128, 128, 8, 3), (128, 128, 64, 8, 4), (256, 128, 64, 8, 3), (128, 256, 64, 8, 3),
                 (64, 128, 128, 4, 3)]  # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)

SHAPES = [(28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]
SHAPES = [(28672, 4096), (4096, 14336), (8192, 8192)] if PREFILL else SHAPES[::2] if FP4 else SHAPES
M_LIST = [128, 256, 512] if PREFILL else [1, 16] if FP4 else [1, 16, 64]
TILES = [(32, 256, 3), (32, 256, 4), (32, 512, 3), (64, 256, 3), (64, 256, 4), (64, 512, 3), (128, 256, 3),
         (128, 512, 3)]  # (BLOCK_N, BLOCK_K, stages), 4 warps
NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count


def split_rule(M, N, K, bm, bn, bk, per_sm=3):
    tiles = -(-M // bm) * -(-N // bn)
    return max(1, min(-(-per_sm * NUM_SMS // tiles), (K // bk) // 4, 16))


def earlier_rule(M, N, K):
    bm = max(16, 1 << (M - 1).bit_length())
    tiles = -(-M // bm) * -(-N // 128)
    sk = max(1, min(2 * NUM_SMS // tiles, K // 128 // 4, 16)) if tiles < NUM_SMS else 1
    return dict(BLOCK_M=bm, BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=3, SPLIT_K=sk)


def problem(M, N, K):
    if FP4:
        inp = registry._a16wfp4_inputs(M, N, K, "bf16", "cuda")

        def run(cfg):
            return fp4.gemm_a16wfp4(inp["x"], inp["wq"], inp["ws"], config=cfg)

        wbytes = N * K / 2 + N * K / 32
    else:
        inp = registry._a16w4_inputs(M, N, K, "bf16", "cuda")

        def run(cfg):
            return a16w4.gemm_a16w4(inp["x"], inp["wq"], inp["ws"], inp["wz"], group_size=128, config=cfg)

        wbytes = N * K / 2 + N * (K // 128) * 3
    return inp, run, inp["x"].float() @ inp["w16"].float().T, wbytes


print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {'MXFP4' if FP4 else 'INT4 g128'}", file=out)
for N, K in SHAPES:
    for M in M_LIST:
        inp, run, ref, wbytes = problem(M, N, K)
        configs = {"own pick": None}
        if PREFILL:
            for bm, bn, bk, w, st in PREFILL_TILES:
                tiles = -(-M // bm) * -(-N // bn)
                r = max(1, min(2 * NUM_SMS // tiles, K // bk // 4, 16)) if tiles < NUM_SMS else 1
                for sk in sorted({1, r, min(16, 2 * r)}):
                    configs[f"{bm}x{bn}x{bk} w{w} s{st} sk{sk}"] = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                                                        num_warps=w, num_stages=st, SPLIT_K=sk)
        else:
            bm = max(16, 1 << (M - 1).bit_length())
            configs["earlier rule"] = earlier_rule(M, N, K)
            for bn, bk, st in TILES:
                r = split_rule(M, N, K, bm, bn, bk)
                for sk in sorted({max(1, r // 2), r, min(16, 2 * r)}):
                    configs[f"{bm}x{bn}x{bk} s{st} sk{sk}"] = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=4,
                                                                    num_stages=st, SPLIT_K=sk)
        calls = checked_calls({"F.linear bf16": lambda: F.linear(inp["x"], inp["w16"])}, configs, run, ref, out, 2e-2)
        names = list(calls)
        times = time_graphs_us(*[[calls[n]] for n in names], rep_ms=10, retries=3)
        base = times[0]
        print(f"M={M} N={N} K={K}:", file=out)
        for n, t in sorted(zip(names, times), key=lambda p: p[1]):
            print(f"  {t:9.1f} us  {base / t:5.2f}x F.linear  {wbytes / t / 1e3:6.0f} GB/s  {n}", file=out, flush=True)
        del inp, ref, calls
        torch.cuda.empty_cache()
