"""Probe (device tool, Hopper): does a block-scaled FP8 K loop that keeps one tensor-core product
in flight while it promotes the previous one close the gap to cuBLASLt?

gemm_kernel (Triton's tl) waits for each K block's product before promoting it (PTX
`wgmma.wait_group 0` once per K step; BENCHMARKS.md, "FP8 promotion"). This probe writes that K
loop in Gluon (Triton's lower-level language, sm_90 only here), where the wait is explicit:
block k's product is issued, then the kernel waits until only it is outstanding
(`warpgroup_mma_wait(num_outstanding=1)`) and promotes block k-1's product under it. One program
per output tile, TMA loads STAGES deep. Not part of the package: a measurement of what the
approach buys before anything is built on it.

    python3 scripts/gluon_blockscale_probe.py [M N K ...]   (triples; default DeepSeek-V3 layers at M = 4096)
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from gemmkit.tools.registry import get_op  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402


@gluon.jit
def blockscale_kernel(a_desc, b_desc, c, a_scale, b_scale, M, N, K, stride_cm, stride_asm, stride_ask, stride_bsn,
                      stride_bsk, STAGES: gl.constexpr, DEFER: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_N, 256 // a_desc.dtype.primitive_bitwidth])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma)
    off_m = gl.program_id(0) * BLOCK_M
    off_n = gl.program_id(1) * BLOCK_N
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
    k_tiles = gl.cdiv(K, BLOCK_K)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    for s in gl.static_range(STAGES - 1):  # prologue: the first STAGES - 1 K blocks in flight
        if s < k_tiles:
            mbarrier.expect(ready.index(s), nbytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, s * BLOCK_K], ready.index(s), a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [off_n, s * BLOCK_K], ready.index(s), b_bufs.index(s))
    rm = off_m + gl.arange(0, BLOCK_M, layout=rows_l)
    row_ok = rm < M
    sb_row = b_scale + (off_n // 128) * stride_bsn
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma)
    p_prev = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma)
    s_prev = gl.zeros((BLOCK_M, ), dtype=gl.float32, layout=rows_l)
    for ki in range(k_tiles):
        s = ki % STAGES
        mbarrier.wait(ready.index(s), (ki // STAGES) & 1)
        kb = (ki * BLOCK_K) // 128
        sa = gl.load(a_scale + rm * stride_asm + kb * stride_ask, mask=row_ok, other=0.0)
        sk = sa * gl.load(sb_row + kb * stride_bsk)
        zero = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma)  # (ignored: use_acc=False)
        p = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
        if DEFER:  # block ki - 1's product is done once only block ki's is outstanding
            p_prev = warpgroup_mma_wait(num_outstanding=1, deps=(p_prev, ))
            acc += p_prev * s_prev[:, None]
            p_prev = p
            s_prev = sk
        else:
            p = warpgroup_mma_wait(num_outstanding=0, deps=(p, ))
            acc += p * sk[:, None]
        # the stage block ki - 1 used is free now (its product is complete): load block ki + STAGES - 1
        nk = ki + STAGES - 1
        if nk < k_tiles:
            ns = nk % STAGES
            mbarrier.expect(ready.index(ns), nbytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, nk * BLOCK_K], ready.index(ns), a_bufs.index(ns))
            tma.async_copy_global_to_shared(b_desc, [off_n, nk * BLOCK_K], ready.index(ns), b_bufs.index(ns))
    if DEFER:
        p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(p_prev, ))
        acc += p_prev * s_prev[:, None]
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
    rn = off_n + gl.arange(0, BLOCK_N, layout=cols_l)
    ptrs = c + rm[:, None] * stride_cm + rn[None, :]
    gl.store(ptrs, acc.to(c.dtype.element_ty), mask=row_ok[:, None] & (rn < N)[None, :])


def run(x, w, xs, ws, block=(128, 128, 128), stages=4, defer=True, warps=8):
    M, K = x.shape
    N = w.shape[0]
    bm, bn, bk = block
    a_layout = gl.NVMMASharedLayout.get_default_for([bm, bk], gl.float8e4nv)
    b_layout = gl.NVMMASharedLayout.get_default_for([bn, bk], gl.float8e4nv)
    a_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk], a_layout)
    b_desc = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, bk], b_layout)
    c = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn))
    blockscale_kernel[grid](a_desc, b_desc, c, xs, ws, M, N, K, c.stride(0), xs.stride(0), xs.stride(1),
                            ws.stride(0), ws.stride(1), STAGES=stages, DEFER=defer, num_warps=warps)
    return c


def main(argv):
    nums = list(map(int, argv))
    shapes = [tuple(nums[i:i + 3]) for i in range(0, len(nums), 3)] or [
        (4096, 7168, 7168), (4096, 2112, 7168), (4096, 24576, 1536), (4096, 7168, 16384), (4096, 4096, 7168),
        (4096, 7168, 2048), (256, 7168, 16384), (256, 4096, 7168)]
    op = get_op("a8w8_blockscale")
    import gemmkit

    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for M, N, K in shapes:
        inp = op.make_inputs(M, N, K, "e4m3", "cuda")  # x scales column-major, as engines store them
        x, w, xs, ws = inp["x"], inp["w"], inp["xs"], inp["ws"]
        ref = op.reference(inp)
        flops = 2.0 * M * N * K
        print(f"M={M} N={N} K={K}", flush=True)
        calls = {"torch block-wise _scaled_mm": lambda: op.baseline(inp),
                 "gemmkit (tl, table)": lambda: gemmkit.gemm_a8w8_blockscale(x, w, xs, ws)}
        for defer in (False, True):
            for stages in (3, 4):
                for block, warps in (((128, 128, 128), 8), ((64, 128, 128), 4)):
                    name = f"gluon {'deferred' if defer else 'waiting'} {block} w{warps} s{stages}"
                    fn = (lambda d=defer, s=stages, b=block, wp=warps: run(x, w, xs, ws, b, s, d, wp))
                    try:
                        err = rel_error(fn(), ref)
                    except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                        print(f"  {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                        continue
                    if err > 2e-2:
                        print(f"  {name}: wrong result (rel err {err:.2e})", flush=True)
                        continue
                    calls[name] = fn
        times = time_graphs_us(*[[f] for f in calls.values()], rep_ms=10)
        for name, t in zip(calls, times):
            print(f"  {t:8.1f} us {flops / t / 1e6:7.1f} TFLOP/s  {name}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
