"""Probe (device tool): host cost per eager call of the warp-specialized kernel's plan (core/hopper_ws.py)
against the tl kernel's (GEMMKIT_GLUON=0), back-to-back eager calls of a problem small enough for
the host to show (torch.cuda events around 200 calls), and the GPU time of one call (CUDA graph)."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core import config as config_mod  # noqa: E402
from gemmkit.quant import quantize_fp8_blockwise  # noqa: E402
from gemmkit.tools.timing import time_graph_us  # noqa: E402

for M, N, K in [(256, 4096, 2048), (1024, 7168, 7168)]:
    x, w = torch.randn(M, K, device="cuda"), torch.randn(N, K, device="cuda") / K**0.5
    xq, xs = quantize_fp8_blockwise(x, (1, 128), scale_layout="col")
    wq, ws = quantize_fp8_blockwise(w, (128, 128))
    for gluon in ("1", "0"):
        os.environ["GEMMKIT_GLUON"] = gluon
        config_mod.clear_caches()
        call = lambda: gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws)  # noqa: E731
        for _ in range(10):
            call()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            call()
        host = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 200 * 1e6
        gpu = time_graph_us([call], rep_ms=5)
        print(f"M={M} N={N} K={K} {'ws' if gluon == '1' else 'tl'}: host {host:6.1f} us/call, eager {wall:6.1f} us/call, "
              f"graph {gpu:6.1f} us", flush=True)
