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
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma, warpgroup_mma_init,  # noqa: E402
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from gemmkit.tools.registry import get_op  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402


@gluon.jit
def _load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, ki, off_m, off_n, STAGES: gl.constexpr):
    """TMA loads of K block ki's A and B tiles into stage ki % STAGES, arriving on its barrier."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    s = ki % STAGES
    mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(a_desc, [off_m, ki * BLOCK_K], ready.index(s), a_bufs.index(s))
    tma.async_copy_global_to_shared(b_desc, [off_n, ki * BLOCK_K], ready.index(s), b_bufs.index(s))


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
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    k_tiles = gl.cdiv(K, BLOCK_K)
    for i in gl.static_range(STAGES - 1):  # prologue: the first STAGES - 1 K blocks in flight
        if i < k_tiles:
            _load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, i, off_m, off_n, STAGES)
    rm = off_m + gl.arange(0, BLOCK_M, layout=rows_l)
    row_ok = rm < M
    sb_row = b_scale + (off_n // 128) * stride_bsn
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma)
    if DEFER:
        # two products in turn, A (even K blocks) and B (odd): each is promoted while the other
        # runs; an odd count ends with a repeat of the last block at scale 0 (its stage still holds it)
        p_b = warpgroup_mma_init(gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma))
        s_b = gl.zeros((BLOCK_M, ), dtype=gl.float32, layout=rows_l)
        for j in range(gl.cdiv(k_tiles, 2)):
            b0 = 2 * j
            s0 = b0 % STAGES
            mbarrier.wait(ready.index(s0), (b0 // STAGES) & 1)
            zero_a = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma)
            p_a = warpgroup_mma(a_bufs.index(s0), b_bufs.index(s0).permute((1, 0)), zero_a, use_acc=False,
                                is_async=True)
            done = warpgroup_mma_wait(num_outstanding=1, deps=(p_b, ))  # block b0 - 1
            acc += done * s_b[:, None]
            nk = b0 - 1 + STAGES  # block b0 - 1's stage is free (b0 = 0: the stage the prologue left empty)
            if nk < k_tiles:
                _load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, nk, off_m, off_n, STAGES)
            kb0 = (b0 * BLOCK_K) // 128
            s_a = gl.load(a_scale + rm * stride_asm + kb0 * stride_ask, mask=row_ok, other=0.0) * gl.load(
                sb_row + kb0 * stride_bsk)
            b1 = b0 + 1
            real = b1 < k_tiles
            b1c = gl.minimum(b1, k_tiles - 1)
            s1 = b1c % STAGES
            mbarrier.wait(ready.index(s1), (b1c // STAGES) & 1, pred=real)
            zero_b = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma)
            p_b = warpgroup_mma(a_bufs.index(s1), b_bufs.index(s1).permute((1, 0)), zero_b, use_acc=False,
                                is_async=True)
            done = warpgroup_mma_wait(num_outstanding=1, deps=(p_a, ))  # block b0
            acc += done * s_a[:, None]
            nk = b0 + STAGES
            if nk < k_tiles:
                _load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, nk, off_m, off_n, STAGES)
            kb1 = (b1c * BLOCK_K) // 128
            s_b = gl.load(a_scale + rm * stride_asm + kb1 * stride_ask, mask=row_ok & real, other=0.0) * gl.load(
                sb_row + kb1 * stride_bsk)
        done = warpgroup_mma_wait(num_outstanding=0, deps=(p_b, ))
        acc += done * s_b[:, None]
    else:
        for ki in range(k_tiles):
            s = ki % STAGES
            mbarrier.wait(ready.index(s), (ki // STAGES) & 1)
            kb = (ki * BLOCK_K) // 128
            sk = gl.load(a_scale + rm * stride_asm + kb * stride_ask, mask=row_ok, other=0.0) * gl.load(
                sb_row + kb * stride_bsk)
            zero = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma)
            p = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
            p = warpgroup_mma_wait(num_outstanding=0, deps=(p, ))
            acc += p * sk[:, None]
            nk = ki + STAGES - 1  # the stage block ki - 1 used is free: load block ki + STAGES - 1 there
            if nk < k_tiles:
                _load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, nk, off_m, off_n, STAGES)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    rn = off_n + gl.arange(0, BLOCK_N, layout=cols_l)
    ptrs = c + rm[:, None] * stride_cm + rn[None, :]
    gl.store(ptrs, acc.to(c.dtype.element_ty), mask=row_ok[:, None] & (rn < N)[None, :])


@gluon.jit
def _ws_producer(a_desc, b_desc, xs_desc, a0_bufs, a1_bufs, b_bufs, xs_bufs, ready, empty, off_m, off_n, M, k_tiles,
                 STAGES: gl.constexpr, PROMOTE: gl.constexpr):
    """One warp: TMA loads of the two A halves and the B tile of each K block, STAGES deep, each
    stage reused once both consumers released it."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    nbytes: gl.constexpr = 2 * a_desc.block_type.nbytes + b_desc.block_type.nbytes + (
        xs_desc.block_type.nbytes if PROMOTE == 5 else 0)
    for ki in range(k_tiles):
        s = ki % STAGES
        mbarrier.wait(empty.index(s), ((ki // STAGES) & 1) ^ 1)  # (the first round passes at once)
        mbarrier.expect(ready.index(s), nbytes)
        if PROMOTE == 5:  # the tile's 2 * HALF x scales of K block ki (x_scale as a flat (G * M,) array)
            tma.async_copy_global_to_shared(xs_desc, [ki * M + off_m], ready.index(s), xs_bufs.index(s))
        tma.async_copy_global_to_shared(a_desc, [off_m, ki * BLOCK_K], ready.index(s), a0_bufs.index(s))
        tma.async_copy_global_to_shared(a_desc, [off_m + HALF, ki * BLOCK_K], ready.index(s), a1_bufs.index(s))
        tma.async_copy_global_to_shared(b_desc, [off_n, ki * BLOCK_K], ready.index(s), b_bufs.index(s))


@gluon.jit
def _ws_consumer(a_bufs, b_bufs, xs_bufs, ready, empty, turn, c, a_scale, b_scale, row0, off_n, M, N, k_tiles, stride_cm,
                 stride_asm, stride_ask, stride_bsn, stride_bsk, STAGES: gl.constexpr, HALF: gl.constexpr,
                 BLOCK_N: gl.constexpr, ROLE: gl.constexpr, ORDERED: gl.constexpr, PROMOTE: gl.constexpr):
    """One warp group: rows [row0, row0 + HALF) of the tile. Waits for each K block's product and
    promotes it, while the other consumer's product runs on the tensor cores. ORDERED: the two
    take turns on the tensor cores (ping-pong): each issues its product of block ki only once
    the other's has completed (turn barriers), so that one promotes while the other multiplies.
    PROMOTE: 0 (False) the tensor cores accumulate, no scales; 1 (True) scales loaded from global
    memory right after each product is issued; 2 promotion without scales; 5 x scales from the
    stage (TMA), w's loaded as in 1. 0 and 2 are timing references (not block-scaled results)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma)
    rm = row0 + gl.arange(0, HALF, layout=rows_l)
    row_ok = rm < M
    sb_row = b_scale + (off_n // 128) * stride_bsn
    acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=mma)
    if not PROMOTE:  # timing reference: the tensor cores' own accumulation, one product in flight
        for ki in range(k_tiles):
            s = ki % STAGES
            mbarrier.wait(ready.index(s), (ki // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((ki + STAGES - 1) % STAGES), count=1, pred=ki > 0)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        k_tiles = 0
    # K block ki's scales (BLOCK_K = 128: block ki is scale group ki) are loaded one block ahead, right
    # after a product is issued: the fence before each product (wgmma.fence) waits for every register
    # load in flight, so a scale load issued before it puts its latency between two products (1.5x at
    # 4096^2 x 7168, tuning/gluon_blockscale_probe_h100.txt), one issued after it runs under the product
    sa_cur = gl.load(a_scale + rm * stride_asm, mask=row_ok, other=0.0)
    sb_cur = gl.load(sb_row)
    for ki in range(k_tiles):
        s = ki % STAGES
        mbarrier.wait(ready.index(s), (ki // STAGES) & 1)
        if ORDERED:  # role 0 waits for role 1's product of block ki - 1 (ki = 0: passes), role 1 for role 0's of ki
            mbarrier.wait(turn.index(ROLE), (ki + 1 - ROLE) & 1)
        zero = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=mma)
        p = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
        kn = gl.minimum(ki + 1, k_tiles - 1)
        sa_nxt = sa_cur
        sb_nxt = sb_cur
        if PROMOTE != 5:
            sa_nxt = gl.load(a_scale + rm * stride_asm + kn * stride_ask, mask=row_ok, other=0.0)
        sb_nxt = gl.load(sb_row + kn * stride_bsk)
        p = warpgroup_mma_wait(num_outstanding=0, deps=(p, ))
        if PROMOTE == 5:  # this block's x scales from the stage (before the stage is released)
            sa_cur = xs_bufs.index(s).slice(ROLE * HALF, HALF).load(rows_l)
        if ORDERED:
            mbarrier.arrive(turn.index(1 - ROLE), count=1)
        mbarrier.arrive(empty.index(s), count=1)
        if PROMOTE == 2:  # timing reference: the promotion without its scales
            acc += p
        else:
            acc += p * (sa_cur * sb_cur)[:, None]
        sa_cur = sa_nxt
        sb_cur = sb_nxt
    rn = off_n + gl.arange(0, BLOCK_N, layout=cols_l)
    gl.store(c + rm[:, None] * stride_cm + rn[None, :], acc.to(c.dtype.element_ty),
             mask=row_ok[:, None] & (rn < N)[None, :])


@gluon.jit
def blockscale_ws_kernel(a_desc, b_desc, xs_desc, c, a_scale, b_scale, M, N, K, stride_cm, stride_asm, stride_ask,
                         stride_bsn, stride_bsk, STAGES: gl.constexpr, ORDERED: gl.constexpr,
                         PROMOTE: gl.constexpr):
    """A (2 x HALF) x BLOCK_N tile per program: a producer warp and two consumer warp groups
    (DeepGEMM's arrangement); BLOCK_K = 128 = the scale group."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    off_m = gl.program_id(0) * (2 * HALF)
    off_n = gl.program_id(1) * BLOCK_N
    a0_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, HALF, BLOCK_K], a_desc.layout)
    a1_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, HALF, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    xs_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 2 * HALF], xs_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    k_tiles = gl.cdiv(K, BLOCK_K)
    gl.warp_specialize([
        (_ws_consumer, (a0_bufs, b_bufs, xs_bufs, ready, empty, turn, c, a_scale, b_scale, off_m, off_n, M, N, k_tiles,
                        stride_cm, stride_asm, stride_ask, stride_bsn, stride_bsk, STAGES, HALF, BLOCK_N, 0, ORDERED, PROMOTE)),
        (_ws_consumer, (a1_bufs, b_bufs, xs_bufs, ready, empty, turn, c, a_scale, b_scale, off_m + HALF, off_n, M, N, k_tiles,
                        stride_cm, stride_asm, stride_ask, stride_bsn, stride_bsk, STAGES, HALF, BLOCK_N, 1, ORDERED, PROMOTE)),
        (_ws_producer, (a_desc, b_desc, xs_desc, a0_bufs, a1_bufs, b_bufs, xs_bufs, ready, empty, off_m, off_n, M,
                        k_tiles, STAGES, PROMOTE)),
    ], [4, 1], [232, 40])


def run_ws(x, w, xs, ws, block_n=128, stages=4, ordered=False, promote=True):
    M, K = x.shape
    N = w.shape[0]
    a_layout = gl.NVMMASharedLayout.get_default_for([64, 128], gl.float8e4nv)
    b_layout = gl.NVMMASharedLayout.get_default_for([block_n, 128], gl.float8e4nv)
    a_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [64, 128], a_layout)
    b_desc = TensorDescriptor(w, list(w.shape), list(w.stride()), [block_n, 128], b_layout)
    assert xs.stride(0) == 1 and M % 4 == 0, "the probe's TMA x scales: column-major, M a multiple of 4"
    xs_flat = xs.t().reshape(-1)  # (G, M) row-major, flat
    xs_layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
    xs_desc = TensorDescriptor(xs_flat, [xs_flat.numel()], [1], [128], xs_layout)
    c = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    grid = (triton.cdiv(M, 128), triton.cdiv(N, block_n))
    blockscale_ws_kernel[grid](a_desc, b_desc, xs_desc, c, xs, ws, M, N, K, c.stride(0), xs.stride(0), xs.stride(1),
                               ws.stride(0), ws.stride(1), STAGES=stages, ORDERED=ordered, PROMOTE=promote, num_warps=4)
    return c


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

        def add(name, fn, check=True):
            """Time fn with the others if it runs (and, checked, matches the reference)."""
            try:
                out = fn()
            except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                print(f"  {name}: {type(e).__name__}: {str(e)[-700:]}", flush=True)
                return
            err = rel_error(out, ref)
            if check and err > 2e-2:
                print(f"  {name}: wrong result (rel err {err:.2e})", flush=True)
                return
            calls[name] = fn

        # (the deferred form of `run`: ptxas serializes its wgmma, C7514; tuning/README.md)
        for stages in (3, 4):
            for block, warps in (((128, 128, 128), 8), ((64, 128, 128), 4)):
                add(f"gluon waiting {block} w{warps} s{stages}",
                    lambda s=stages, b=block, wp=warps: run(x, w, xs, ws, b, s, False, wp))
        for block_n, stages, ordered, promote in ((128, 4, False, True), (128, 4, False, 5), (128, 5, False, 5),
                                                  (128, 6, False, 5)):
            add(f"gluon warp-specialized 128x{block_n}x128 s{stages}{' ping-pong' if ordered else ''}"
                f"{', x scales by TMA' if promote == 5 else ''}",
                lambda bn=block_n, st=stages, o=ordered, pr=promote: run_ws(x, w, xs, ws, bn, st, o, pr))
        for block_n, stages, promote in ((128, 4, False), (256, 3, False), (128, 4, 2)):  # not block-scaled
            what = "promotion without scale loads" if promote else "NO promotion"
            add(f"gluon warp-specialized 128x{block_n}x128 s{stages}, {what} (timing reference)",
                lambda bn=block_n, st=stages, pr=promote: run_ws(x, w, xs, ws, bn, st, False, pr), check=False)
        times = time_graphs_us(*[[f] for f in calls.values()], rep_ms=10)
        for name, t in zip(calls, times):
            print(f"  {t:8.1f} us {flops / t / 1e6:7.1f} TFLOP/s  {name}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
