"""Probe (device tool, H100): the 1 x 128 activation quantizer (quantize_fp8_blockwise, column-major scales: the
dynamic block-scaled GEMM's first pass) at several program tiles, against the per-token quantizer
(quantize_fp8(..., "row")) and a device copy of the same bytes, CUDA-graph time, inputs rotated over sets that
exceed the L2. --old FILE: also a previous kernels/quant.py's quantize_blocks_kernel (one 32 x 128 block a
program, rows walked first), loaded from FILE. Prints us and TB/s (bytes read + written) per problem.

    python3 scripts/quant_block_probe.py [--m M ...] [--k K ...] [--old FILE]
"""

import argparse
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gemmkit import quant  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402

VARIANTS = ((8192, 8), (4096, 4), (16384, 8), (4096, 1), (8192, 16))


def old_launcher(path):
    spec = importlib.util.spec_from_file_location("old_quant", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def run(x, q, s):
        R, C = x.shape
        G = -(-C // 128)
        mod.quantize_blocks_kernel[(-(-R // 32), G)](x, q, s, R, C, x.stride(0), 1, C, 1, R, QUANT="e4m3", BLOCK_R=32,
                                                      GROUP=128, ROW_SCALES=True, UE8M0=False, EVEN_C=C % 128 == 0,
                                                      INDEX_64=False, num_warps=4)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--k", type=int, nargs="+", default=[512, 1536, 2048, 4096, 7168, 16384, 18432])
    ap.add_argument("--old")
    args = ap.parse_args()
    old = old_launcher(args.old) if args.old else None
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for M in args.m:
        for K in args.k:
            nbytes = M * K * 3 + M * (-(-K // 128)) * 4
            sets = max(2, min(16, 3 * l2 // (M * K * 2) + 1))
            xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
            names, calls = [], []
            ref_q, ref_s = quant.quantize_fp8_blockwise(xs[0], (1, 128), scale_layout="col")
            for tile, groups in VARIANTS:
                plan = quant.BlockQuantizePlan(xs[0], (1, 128), torch.float8_e4m3fn, False, True, xs[0].device,
                                               tile=tile, groups=groups)
                q, s = plan(xs[0])
                assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s)
                names.append(f"tile {tile} groups {groups}")
                calls.append([lambda x=x, p=plan: p(x) for x in xs])
            if old is not None:
                q = torch.empty(M, K, device="cuda", dtype=torch.float8_e4m3fn)
                s = torch.empty(-(-K // 128), M, device="cuda", dtype=torch.float32).t()
                old(xs[0], q, s)
                assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s)
                names.append("old (32 x 128 blocks, rows first)")
                calls.append([lambda x=x: old(x, q, s) for x in xs])
            names.append("per-token quantize_fp8")
            calls.append([lambda x=x: quant.quantize_fp8(x, "row") for x in xs])
            dst = [torch.empty(M * K * 3 // 2, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
            names.append("copy of the bytes")
            calls.append([lambda x=x: dst[0].view(-1)[: M * K].copy_(x.view(-1)) for x in xs])
            times = time_graphs_us(*calls, rep_ms=5)
            print(f"M={M} K={K} ({sets} sets)", flush=True)
            for n, t in zip(names, times):
                rate = (2 * M * K * 2 if n.startswith("copy") else nbytes) / t / 1e6
                print(f"  {t:8.2f} us  {rate:5.2f} TB/s  {n}", flush=True)
            del xs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
