"""Probe: batched_gemm_a16w16 tile configs (pointer vs TMA loads, persistent or not) against
torch.bmm on the GPU, and the derived config for comparison."""

import itertools
import sys

import torch
import triton.testing

import gemmkit
from gemmkit.core.config import derive_config
from gemmkit.core.device import device_info
from gemmkit.core.formats import dense
from probe_sweep import sweep

torch.manual_seed(0)
out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
dev = device_info(torch.device("cuda"))
for B, M, N, K in ((8, 512, 4096, 4096), (8, 2048, 1024, 1024), (32, 128, 128, 4096), (64, 256, 256, 256)):
    x = torch.randn(B, M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(B, N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
    base = triton.testing.do_bench_cudagraph(lambda: torch.bmm(x, w.transpose(1, 2)))
    auto = triton.testing.do_bench_cudagraph(lambda: gemmkit.batched_gemm_a16w16(x, w))
    d = derive_config(M, N, K, dev, dense(torch.bfloat16), dense(torch.bfloat16), 2)
    print(f"B={B} M={M} N={N} K={K}: bmm {base * 1e3:.1f} us, derived {auto * 1e3:.1f} us ({base / auto:.2f}x) {d}",
          file=out, flush=True)
    ref = torch.bmm(x.float(), w.float().transpose(1, 2))
    configs = [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages, TMA=tma, PERSISTENT=pers)
               for (bm, bn), bk, warps, stages, tma, pers in itertools.product(
                   ((128, 128), (128, 256), (64, 128), (128, 64)), (64,), (4, 8), (3, 4), (True, False), (True, False))
               if not (warps == 4 and bm * bn > 128 * 128 or warps == 8 and bm * bn < 128 * 128)]
    sweep(lambda cfg: gemmkit.batched_gemm_a16w16(x, w, config=cfg), ref, configs, base, out, 4, "bmm")
