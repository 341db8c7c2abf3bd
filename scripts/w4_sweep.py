"""Sweep gemm_a16w4 / gemm_a16wfp4 decode configs on the GPU (explicit configs through the op)."""

import itertools
import sys

import torch
import triton.testing

import gemmkit
from gemmkit import quant
from probe_sweep import sweep

torch.manual_seed(0)
out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
for (N, K), M, fmt in itertools.product([(6144, 4096), (4096, 14336), (28672, 4096), (8192, 8192)], (16, 64),
                                        ("int4", "mxfp4")):
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    if fmt == "int4":
        q, s, z = quant.quantize_int4(w, 128, False)
        wd = quant.dequantize_int4(q, s, z, 128, torch.bfloat16)
        fn = lambda cfg: gemmkit.gemm_a16w4(x, q, s, z, group_size=128, config=cfg)  # noqa: E731
    else:
        q, s = quant.quantize_mxfp4(w)
        wd = quant.dequantize_mxfp4(q, s, torch.bfloat16)
        fn = lambda cfg: gemmkit.gemm_a16wfp4(x, q, s, config=cfg)  # noqa: E731
    base = triton.testing.do_bench_cudagraph(lambda: torch.nn.functional.linear(x, wd))
    t0 = triton.testing.do_bench_cudagraph(lambda: fn(None))
    print(f"{fmt} M={M} N={N} K={K}: cuBLAS {base * 1e3:.1f} us, derived {t0 * 1e3:.1f} us ({base / t0:.2f}x)", file=out)
    configs = []
    for bm, bn, bk, warps, stages in itertools.product((16 if M == 16 else 64,), (64, 128), (128, 256), (4,), (3, 4)):
        tiles = -(-M // bm) * -(-N // bn)
        for sk in sorted({1, max(1, min(2 * 132 // tiles, K // bk // 4, 16)), max(1, min(132 // tiles, K // bk // 4, 16))}):
            configs.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=warps, num_stages=stages))
    sweep(fn, x.float() @ wd.float().T, configs, base, out)
