"""Development probe (device tool): small-M (M < BLOCK_M) GEMM time with row indices clamped by
tl.where (as shipped) vs masked row loads. Not part of the package."""

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gemmkit  # noqa: E402
import gemmkit.kernels.gemm as G  # noqa: E402
import gemmkit.kernels.quant as Q  # noqa: E402
from gemmkit import quant  # noqa: E402
from gemmkit.core import dense  # noqa: E402
from gemmkit.ops import a8w8, a16w16  # noqa: E402
from gemmkit.tools.timing import time_graph_us  # noqa: E402


@triton.jit
def load_k_tile_masked(src, off_r, off_k, R, K, stride_r, stride_k, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                       TMA: tl.constexpr, K_MAJOR: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    if TMA:
        if K_MAJOR:
            tile = src.load([off_r, off_k])
        else:
            tile = src.load([off_k, off_r]).T
    else:
        rk = tl.max_contiguous(tl.multiple_of(off_k + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        rr = tl.max_contiguous(tl.multiple_of(off_r + tl.arange(0, BLOCK_R), BLOCK_R), BLOCK_R)
        if INDEX_64:
            rr = rr.to(tl.int64)
            rk = rk.to(tl.int64)
        ptrs = src + rr[:, None] * stride_r + rk[None, :] * stride_k
        if EVEN_K:
            tile = tl.load(ptrs, mask=rr[:, None] < R, other=0.0)
        else:
            tile = tl.load(ptrs, mask=(rr[:, None] < R) & (rk[None, :] < K), other=0.0)
    return tile


N = K = 4096
ws16 = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(5)]
qs = [quant.quantize_fp8(w.float(), "row") for w in ws16]
for variant in ("clamped rows (shipped)", "masked rows"):
    if variant == "masked rows":
        G.load_k_tile = load_k_tile_masked
        Q.load_k_tile = load_k_tile_masked
        Q.rows_absmax = triton.jit(Q.rows_absmax.fn)
        G.rows_absmax = Q.rows_absmax
        dense._kernels["gemm"] = triton.jit(G.gemm_kernel.fn)
        a16w16._plans.clear(), a8w8._plans.clear()
    for M in (1, 2, 16, 17):
        xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in ws16]
        t16 = time_graph_us([lambda x=x, w=w: gemmkit.gemm_a16w16(x, w) for x, w in zip(xs, ws16)])
        t8 = time_graph_us([lambda x=x, q=q: gemmkit.gemm_a8w8(x, q[0], None, q[1].reshape(1, N)) for x, q in zip(xs, qs)])
        ref = xs[0].float() @ ws16[0].float().T
        err = ((gemmkit.gemm_a16w16(xs[0], ws16[0]).float() - ref).norm() / ref.norm()).item()
        print(f"{variant:22s} M={M:2d}: a16w16 {t16:6.2f} µs (err {err:.1e}), a8w8 dynamic {t8:6.2f} µs", flush=True)
