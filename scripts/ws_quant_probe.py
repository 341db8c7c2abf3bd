"""Probe (device tool, H100): dynamic block-scaled FP8 (bf16 x quantized per 1 x 128 group in the
call) through the warp-specialized kernel that quantizes x itself (ops/a8w8_blockscale WS_QUANT,
kernels/gemm_ws.py A_QUANT) against the quantizer-then-GEMM path (quantize_fp8_blockwise, then the
static kernel) and the static GEMM alone on x quantized beforehand, in one CUDA-graph timing per
problem; inputs rotated over 3 sets. Prints times, the ratios static / dynamic (the issue's
measure) and each result's error against the float reference of the quantized operands.

    python3 scripts/ws_quant_probe.py [--m M ...] [--shapes N K ...]
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gemmkit.ops import a8w8_blockscale as bs  # noqa: E402
from gemmkit.quant import dequantize_fp8_blockwise, quantize_fp8_blockwise  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402

DSV3 = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (36864, 7168),
        (7168, 18432)]
SETS = 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--shapes", type=int, nargs="+", help="N K pairs instead of DeepSeek-V3's layers")
    args = ap.parse_args()
    shapes = list(zip(args.shapes[::2], args.shapes[1::2])) if args.shapes else DSV3
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    ratios = {"in-kernel": [], "quantizer": []}
    for N, K in shapes:
        for M in args.m:
            sets = []
            for _ in range(SETS):
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                wq, ws = quantize_fp8_blockwise(torch.randn(N, K, device="cuda") / K**0.5, (128, 128))
                xq, xs = quantize_fp8_blockwise(x, (1, 128), scale_layout="col")
                sets.append((x, wq, ws, xq, xs))
            x, wq, ws, xq, xs = sets[0]
            ref = dequantize_fp8_blockwise(xq, xs) @ dequantize_fp8_blockwise(wq, ws, (128, 128)).T
            calls = {
                "in-kernel": [lambda s=s: bs.gemm_a8w8_blockscale(s[0], s[1], None, s[2]) for s in sets],
                "quantizer": [lambda s=s: bs._dynamic_path(s[0], s[1], s[2], "quantize") for s in sets],
                "static": [lambda s=s: bs.gemm_a8w8_blockscale(s[3], s[1], s[4], s[2]) for s in sets],
            }
            errs = {k: rel_error(c[0](), ref) for k, c in calls.items()}
            names = list(calls)
            t = dict(zip(names, time_graphs_us(*[calls[k] for k in names], rep_ms=6, retries=5)))
            for k in ratios:
                ratios[k].append(t["static"] / t[k])
            print(f"M={M:5d} N={N:5d} K={K:5d}  " + "  ".join(f"{k} {t[k]:8.1f} us" for k in names)
                  + f"  | static/dynamic: in-kernel {t['static'] / t['in-kernel']:.3f} quantizer "
                  f"{t['static'] / t['quantizer']:.3f}  err " + " / ".join(f"{errs[k]:.1e}" for k in names),
                  flush=True)
            sets = calls = ref = None
            torch.cuda.empty_cache()
    for k, v in ratios.items():
        print(f"geomean static/dynamic, {k}: {math.exp(sum(map(math.log, v)) / len(v)):.3f}, min {min(v):.3f}")


if __name__ == "__main__":
    main()
