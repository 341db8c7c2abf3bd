"""Probe (device tool, for ncu): the stream-K tail alone, one launch per variant.

512 x 384 x 4096 with 128x128x64 tiles (12 tiles): whole tiles (data-parallel) and the same 12
tiles in 8 K slices each (the tail core/dense.py stream_k_tail gave 512x4608x4096). Run as
`ncu -k regex:gemm_kernel --section ... python3 scripts/streamk_tail_ncu.py`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core import config as config_mod  # noqa: E402
from gemmkit.core import dense  # noqa: E402

M, N, K = 512, 384, 4096
CFG = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=6, TMA=True, PERSISTENT=True,
           EPILOGUE_SUBTILE=True, STREAM_K=True)
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
rule = dense.stream_k_tail
for tail in [(0, 1), (12, 8)] * 2:  # twice: the first launches compile
    dense.stream_k_tail = lambda *a, t=tail: t
    config_mod.clear_caches()
    gemmkit.gemm_a16w16(x, w, config=CFG)
    torch.cuda.synchronize()
