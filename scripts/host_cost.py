"""Development probe (device tool): eager per-call and graph time of the pieces of the bf16 and
dynamic-FP8 paths at small M. Not part of the package; `gemmkit bench` produces reported figures."""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gemmkit  # noqa: E402
from gemmkit import quant  # noqa: E402
from gemmkit.tools.timing import time_eager_us, time_graph_us  # noqa: E402

N = K = 4096
w16 = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
wq, ws = quant.quantize_fp8(w16.float(), "row")
ws = ws.reshape(1, N)
for M in (1, 16, 64):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    xq, xs = quant.quantize_fp8(x, "row")
    rows = {
        "F.linear bf16": lambda: F.linear(x, w16),
        "gemm_a16w16": lambda: gemmkit.gemm_a16w16(x, w16),
        "quantize_fp8 row": lambda: quant.quantize_fp8(x, "row"),
        "gemm_a8w8 prequantized": lambda: gemmkit.gemm_a8w8(xq, wq, xs, ws),
        "gemm_a8w8 dynamic": lambda: gemmkit.gemm_a8w8(x, wq, None, ws),
    }
    for name, fn in rows.items():
        print(f"M={M:3d} {name:24s} eager {time_eager_us([fn]):7.2f} µs   graph {time_graph_us([fn]):7.2f} µs", flush=True)
