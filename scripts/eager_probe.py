"""Development probe (device tool): host cost vs GPU time of the small-M eager paths.

For each call: host µs (wall time to issue 200 back-to-back calls, measured before synchronizing,
so it is the host's cost alone while the launch queue does not fill), eager µs (per-call time of
back-to-back calls, events) and graph µs (CUDA-graph replay). Not part of the package;
`gemmkit bench` produces the reported figures."""

import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gemmkit  # noqa: E402
from gemmkit import quant  # noqa: E402
from gemmkit.ops.a8w8 import fused_dynamic_gemm  # noqa: E402
from gemmkit.tools.timing import time_eager_us, time_graph_us  # noqa: E402


def host_us(fn, n=200):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


for N, K in ((4096, 4096), (6144, 4096)):
    w16 = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    wq, ws = quant.quantize_fp8(w16.float(), "row")
    ws = ws.reshape(1, N)
    for M in (1, 16):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        xq, xs = quant.quantize_fp8(x, "row")
        rows = {
            "F.linear bf16": lambda: F.linear(x, w16),
            "gemm_a16w16": lambda: gemmkit.gemm_a16w16(x, w16),
            "quantize_fp8 row": lambda: quant.quantize_fp8(x, "row"),
            "gemm_a8w8 static": lambda: gemmkit.gemm_a8w8(xq, wq, xs, ws),
            "gemm_a8w8 dynamic": lambda: gemmkit.gemm_a8w8(x, wq, None, ws),
            "fused_dynamic_gemm": lambda: fused_dynamic_gemm(x, wq, ws),
        }
        for name, fn in rows.items():
            h = host_us(fn)
            e = time_eager_us([fn])
            g = time_graph_us([fn])
            print(f"{N}x{K} M={M:2d} {name:20s} host {h:6.2f}  eager {e:6.2f}  graph {g:6.2f} µs", flush=True)

import cProfile  # noqa: E402
import pstats  # noqa: E402

for name, fn in (("gemm_a16w16", lambda: gemmkit.gemm_a16w16(x, w16)),
                 ("gemm_a8w8 dynamic", lambda: gemmkit.gemm_a8w8(x, wq, None, ws))):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    print(f"--- {name}: 2000 calls")
    pstats.Stats(prof).sort_stats("tottime").print_stats(10)
