"""Development probe (device tool): does Triton's M == 1 specialization slow the small-M GEMM?
Times gemm_a16w16 / gemm_a8w8 at M = 1 and M = 16 with the kernel as shipped and with a copy of
the same kernel that does not specialize M. Not part of the package."""

import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gemmkit  # noqa: E402
from gemmkit import quant  # noqa: E402
from gemmkit.core import dense  # noqa: E402
from gemmkit.ops import a8w8, a16w16  # noqa: E402
from gemmkit.tools.timing import time_graph_us  # noqa: E402

N = K = 4096
sets = [(torch.randn(N, K, device="cuda", dtype=torch.bfloat16)) for _ in range(5)]
qs = [quant.quantize_fp8(w.float(), "row") for w in sets]
for variant in ("specialized M", "M not specialized"):
    if variant != "specialized M":
        gemm, reduce = dense._jit_kernels()
        dense._kernels["gemm"] = triton.jit(gemm.fn, do_not_specialize=["M"])
        a16w16._plans.clear(), a8w8._plans.clear()
    for M in (1, 2, 16):
        xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in sets]
        t16 = time_graph_us([lambda x=x, w=w: gemmkit.gemm_a16w16(x, w) for x, w in zip(xs, sets)])
        t8 = time_graph_us([lambda x=x, q=q: gemmkit.gemm_a8w8(x, q[0], None, q[1].reshape(1, N)) for x, q in zip(xs, qs)])
        print(f"{variant:18s} M={M:2d}: a16w16 {t16:6.2f} µs, a8w8 dynamic {t8:6.2f} µs (5 rotating weights)", flush=True)
