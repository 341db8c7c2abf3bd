"""Hopper (sm_90) FP8 GEMM that promotes every 128-deep K block to fp32, warp-specialized (Gluon).

Why a second kernel: the shared tl kernel (kernels/gemm.py) promotes correctly but, in Triton's
code, every promoting K step waits for all of its tensor-core work (PTX `wgmma.wait_group 0`) and
the block scales' register loads stall the fence before the next product (BENCHMARKS.md, "FP8
promotion"). Here the roles are split, as DeepGEMM does: a producer warp brings each K block's A
halves, B tile and (SCALES == SCALES_KBLOCK, XS_TMA) the tile's 128 activation scales into shared
memory by TMA, STAGES deep; two consumer warp groups of 64 rows each multiply, wait for their own
product and promote it while the other group's product runs on the tensor cores
(scripts/gluon_blockscale_probe.py measured the arrangement: tuning/gluon_blockscale_probe_h100.txt).
(The same kernel without promotion, 128 x 256 tiles and one product in flight, ran at 0.98x the
tl kernel's fast-accumulation tables: tuning/ws/fast_accumulation_mode.patch, ws_fast_probe_h100.txt.)

Tiles are 128 x BLOCK_N x 128 (BLOCK_N 128, or 256 in two 128-wide parts; BLOCK_K = 128 bytes of
FP8 = the scale group), persistent programs (at most one per SM) in grouped order.
SCALES_KBLOCK: DeepSeek-V3 block scales, x_scale (M, G) per token and K group, w_scale
(ceil(N / 128), G); each block's product is multiplied by its two scales as it is promoted.
SCALES_ROWCOL: per-token (or per-tensor) x and per-channel (or per-tensor) w scales, applied once
in the epilogue; the K loop promotes unscaled (gemm_a8w8(fast_accum=False)).
The (BLOCK_M, BLOCK_N) tile with an optional bias, cast to c's dtype, stored by TMA from shared memory
(C_TMA) or through pointers.

Only for CUDA sm_90 with Gluon (core/hopper_ws.py decides); everything else runs the tl kernel.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

# Triton 3.6 names the TMA copies async_copy_global_to_shared / _shared_to_global; later versions
# async_load / async_store
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global

SCALES_KBLOCK = gl.constexpr(0)
SCALES_ROWCOL = gl.constexpr(1)


@gluon.jit
def _grouped_tile(pid, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(off_m, off_n) of program pid in grouped order: GROUP_M tile-rows walked column by column
    (kernels/schedule.py grouped_tile; a Gluon kernel cannot call the tl one)."""
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    in_group = pid % per_group
    return (first_m + in_group % group_m) * BLOCK_M, (in_group // group_m) * BLOCK_N


@gluon.jit
def _producer(a_desc, b_desc, xs_desc, a0_bufs, a1_bufs, b_bufs, xs_bufs, ready, empty, M, N, k_tiles, xs_group_stride,
              GROUP_M: gl.constexpr, STAGES: gl.constexpr, XS_TMA: gl.constexpr):
    """One warp: for each of the program's tiles, TMA loads of each K block's two A halves, B tile
    and (XS_TMA) the tile's activation scales into the next stage, once both consumers have
    released it; it runs ahead into the next tile while the consumers finish the last one."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    if XS_TMA:
        nbytes: gl.constexpr = 2 * a_desc.block_type.nbytes + b_desc.block_type.nbytes + xs_desc.block_type.nbytes
    else:
        nbytes: gl.constexpr = 2 * a_desc.block_type.nbytes + b_desc.block_type.nbytes
    it = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 2 * HALF) * gl.cdiv(N, BLOCK_N), gl.num_programs(0)):
        off_m, off_n = _grouped_tile(tile, M, N, 2 * HALF, BLOCK_N, GROUP_M)
        for ki in range(k_tiles):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)  # (the first round passes at once)
            mbarrier.expect(ready.index(s), nbytes)
            if XS_TMA:  # x_scale column-major: group ki's scales of rows off_m.. are contiguous
                _tma_load(xs_desc, [ki * xs_group_stride + off_m], ready.index(s), xs_bufs.index(s))
            _tma_load(a_desc, [off_m, ki * BLOCK_K], ready.index(s), a0_bufs.index(s))
            _tma_load(a_desc, [off_m + HALF, ki * BLOCK_K], ready.index(s), a1_bufs.index(s))
            _tma_load(b_desc, [off_n, ki * BLOCK_K], ready.index(s), b_bufs.index(s))
            it += 1


@gluon.jit
def _finish(acc, c, c_desc, c_smem, bias, b_scale, sa, row0, rm, row_ok, n0, N, stride_cm, stride_cn, stride_bsn,
            SUB: gl.constexpr, SCALES: gl.constexpr, HAS_BIAS: gl.constexpr, C_TMA: gl.constexpr,
            PENDING: gl.constexpr):
    """Epilogue of one SUB-wide column part of a warp group's rows: (SCALES_ROWCOL) the row scales
    `sa` and the columns' scales, the bias, the cast to c's dtype, then a masked pointer store,
    or (C_TMA) the part into its buffer `c_smem` and a TMA store from there that runs on while the
    warp group starts its next tile (PENDING: the stores issued since the previous one out of
    this buffer, which may still run)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SUB, 32])
    rn = n0 + gl.arange(0, SUB, layout=gl.SliceLayout(0, mma))
    col_ok = rn < N
    if SCALES == SCALES_ROWCOL:  # per channel (stride 0: one value per tensor)
        acc = acc * sa[:, None] * gl.load(b_scale + rn * stride_bsn, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += gl.load(bias + rn, mask=col_ok, other=0.0).to(gl.float32)[None, :]
    if C_TMA:
        out = acc.to(c_desc.dtype)
        tma.store_wait(PENDING)  # this buffer's store of the previous tile has read it
        c_smem.store(out)
        fence_async_shared()
        _tma_store(c_desc, [row0, n0], c_smem)
    else:
        gl.store(c + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])


@gluon.jit
def _consumer(a_bufs, b_bufs, xs_bufs, ready, empty, c, c_desc, c_smem, bias, a_scale, b_scale, M, N, k_tiles,
              stride_cm, stride_cn, stride_asm, stride_ask, stride_bsn, stride_bsk, GROUP_M: gl.constexpr,
              STAGES: gl.constexpr, HALF: gl.constexpr, BLOCK_N: gl.constexpr, ROLE: gl.constexpr,
              SCALES: gl.constexpr, XS_TMA: gl.constexpr, HAS_BIAS: gl.constexpr, C_TMA: gl.constexpr):
    """One warp group: rows [ROLE * HALF, (ROLE + 1) * HALF) of each of the program's tiles, in
    column parts of SUB = 128 (BLOCK_N = 256: two, each its own product and accumulator, so that
    one product at a time is held beside the accumulators). Per K block and part: issue the
    product, wait for it, promote it (times the block's scales for SCALES_KBLOCK) while the other
    group's runs. The next block's scales are loaded right after the last product is issued: the
    fence before each product waits for register loads in flight, so a load issued before it
    would put its latency between two products."""
    SUB: gl.constexpr = 128  # = the weight scale group
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SUB, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    TWO: gl.constexpr = BLOCK_N == 2 * SUB
    it = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 2 * HALF) * gl.cdiv(N, BLOCK_N), gl.num_programs(0)):
        off_m, off_n = _grouped_tile(tile, M, N, 2 * HALF, BLOCK_N, GROUP_M)
        rm = off_m + ROLE * HALF + gl.arange(0, HALF, layout=rows_l)
        row_ok = rm < M
        acc0 = gl.zeros((HALF, SUB), dtype=gl.float32, layout=mma)
        acc1 = gl.zeros((HALF, SUB), dtype=gl.float32, layout=mma)
        if SCALES == SCALES_KBLOCK:
            sb_row = b_scale + (off_n // SUB) * stride_bsn
            has1 = off_n + SUB < N  # (TWO: the tile's second weight scale group exists)
            sa_cur = gl.load(a_scale + rm * stride_asm, mask=row_ok, other=0.0)
            sb0 = gl.load(sb_row)
            sb1 = gl.load(sb_row + stride_bsn, mask=TWO and has1, other=0.0)
        for ki in range(k_tiles):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            # this block's scales from its stage, read before the product is issued: read after its
            # wait, the last K block's came out wrong for the second warp group with persistent tiles
            # (the stage refilled first; scripts/ws_check.py)
            if SCALES == SCALES_KBLOCK and XS_TMA:
                sa_cur = xs_bufs.index(s).slice(ROLE * HALF, HALF).load(rows_l)
            zero = gl.zeros((HALF, SUB), dtype=gl.float32, layout=mma)
            p = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).slice(0, SUB).permute((1, 0)), zero, use_acc=False,
                              is_async=True)
            if TWO:
                p = warpgroup_mma_wait(num_outstanding=0, deps=(p, ))
                if SCALES == SCALES_KBLOCK:
                    acc0 += p * (sa_cur * sb0)[:, None]
                else:
                    acc0 += p
                zero = gl.zeros((HALF, SUB), dtype=gl.float32, layout=mma)
                p = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).slice(SUB, SUB).permute((1, 0)), zero,
                                  use_acc=False, is_async=True)
            if SCALES == SCALES_KBLOCK:
                kn = gl.minimum(ki + 1, k_tiles - 1)
                sa_nxt = sa_cur
                if not XS_TMA:
                    sa_nxt = gl.load(a_scale + rm * stride_asm + kn * stride_ask, mask=row_ok, other=0.0)
                sb0_nxt = gl.load(sb_row + kn * stride_bsk)
                sb1_nxt = gl.load(sb_row + stride_bsn + kn * stride_bsk, mask=TWO and has1, other=0.0)
            p = warpgroup_mma_wait(num_outstanding=0, deps=(p, ))
            mbarrier.arrive(empty.index(s), count=1)
            if TWO:
                if SCALES == SCALES_KBLOCK:
                    acc1 += p * (sa_cur * sb1)[:, None]
                else:
                    acc1 += p
            else:
                if SCALES == SCALES_KBLOCK:
                    acc0 += p * (sa_cur * sb0)[:, None]
                else:
                    acc0 += p
            if SCALES == SCALES_KBLOCK:
                sa_cur = sa_nxt
                sb0 = sb0_nxt
                sb1 = sb1_nxt
            it += 1
        sa = gl.load(a_scale + rm * stride_asm, mask=row_ok, other=0.0)  # (SCALES_ROWCOL: per token)
        row0 = off_m + ROLE * HALF
        _finish(acc0, c, c_desc, c_smem.index(0), bias, b_scale, sa, row0, rm, row_ok, off_n, N, stride_cm,
                stride_cn, stride_bsn, SUB, SCALES, HAS_BIAS, C_TMA, BLOCK_N // SUB - 1)
        if TWO:
            _finish(acc1, c, c_desc, c_smem.index(1), bias, b_scale, sa, row0, rm, row_ok, off_n + SUB, N, stride_cm,
                    stride_cn, stride_bsn, SUB, SCALES, HAS_BIAS, C_TMA, 1)
    if C_TMA:
        tma.store_wait(0)  # the last stores read c_smem: finished before the program ends


@gluon.jit
def fp8_ws_kernel(a_desc, b_desc, xs_desc, c, c_desc, bias, a_scale, b_scale, M, N, K, xs_group_stride, stride_cm,
                  stride_cn, stride_asm, stride_ask, stride_bsn, stride_bsk, GROUP_M: gl.constexpr,
                  STAGES: gl.constexpr, SCALES: gl.constexpr, XS_TMA: gl.constexpr, HAS_BIAS: gl.constexpr,
                  C_TMA: gl.constexpr):
    """c (M, N) = promoted FP8 product of x (a_desc: (M, K), boxes of HALF x 128) and w (b_desc:
    (N, K), boxes of 128 x 128) in (2 * HALF) x 128 tiles, persistent: program p takes tiles p,
    p + programs, ... in grouped order (4 warps launched: the first consumer; a second consumer
    warp group and a producer warp are added). C_TMA: c_desc (boxes of HALF x 128 over c) stores
    the output, else pointer stores through c."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    gl.static_assert(BLOCK_N == 128 or BLOCK_N == 256, "tiles of one or two 128-wide column parts")
    a0_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, HALF, BLOCK_K], a_desc.layout)
    a1_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, HALF, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    xs_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 2 * HALF], xs_desc.layout)
    if C_TMA:  # per warp group, a buffer per 128-wide column part
        c0_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_N // 128, HALF, 128], c_desc.layout)
        c1_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_N // 128, HALF, 128], c_desc.layout)
    else:  # (unused)
        c0_smem = xs_bufs
        c1_smem = xs_bufs
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    k_tiles = gl.cdiv(K, BLOCK_K)
    gl.warp_specialize([
        (_consumer, (a0_bufs, b_bufs, xs_bufs, ready, empty, c, c_desc, c0_smem, bias, a_scale, b_scale, M, N,
                     k_tiles, stride_cm, stride_cn, stride_asm, stride_ask, stride_bsn, stride_bsk, GROUP_M, STAGES,
                     HALF, BLOCK_N, 0, SCALES, XS_TMA, HAS_BIAS, C_TMA)),
        (_consumer, (a1_bufs, b_bufs, xs_bufs, ready, empty, c, c_desc, c1_smem, bias, a_scale, b_scale, M, N,
                     k_tiles, stride_cm, stride_cn, stride_asm, stride_ask, stride_bsn, stride_bsk, GROUP_M, STAGES,
                     HALF, BLOCK_N, 1, SCALES, XS_TMA, HAS_BIAS, C_TMA)),
        (_producer, (a_desc, b_desc, xs_desc, a0_bufs, a1_bufs, b_bufs, xs_bufs, ready, empty, M, N, k_tiles,
                     xs_group_stride, GROUP_M, STAGES, XS_TMA)),
    ], [4, 1], [232, 40])
