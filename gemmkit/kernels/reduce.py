"""Tiles computed in pieces inside one launch (split-K, stream-K): partials meet through a
workspace and a per-tile counter. (sum_k_slices, at the end: the same sum in a second launch, for
the Gluon kernel's K slices; finish_sums: the epilogue of sums made by atomics, kernels/gemm_w4_decode.py.)

Each piece of a tile stores its partial product in a block of its own in the workspace (blocks are
whole (BLOCK_M, BLOCK_N) tiles, row-major, no masks), then bumps the tile's counter; the piece that
arrives last sums every block of the tile in piece order (so the result does not depend on the
arrival order), runs the epilogue and puts the counter back to zero for the next launch. Nobody
waits for anybody: no deadlock whatever the number of programs resident.

Where the pieces of a tile are: piece q (0 <= q < n_parts) is block
`first_block + q * part_stride + (first_extra if q == 0 else 0)`.
- split-K: tile t, slice s -> block t * SPLIT_K + s (first_block = t * SPLIT_K, part_stride = 1).
- stream-K: each program owns two blocks, 2p for the piece of its first tile and 2p + 1 for the
  piece of its last; the pieces of a tile come from consecutive programs p_first..p_last, and only
  p_first can be on its last tile (first_block = 2 p_first, part_stride = 2, first_extra = 1 then).
"""

import triton
import triton.language as tl

from .epilogue import finish_tile
from .gdc import gdc_wait
from .memory import load_k_tile, store_tile
from .modes import SCALE_NONE


@triton.jit
def _block_ptrs(ws, block, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    r = tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    return ws + block.to(tl.int64) * (BLOCK_M * BLOCK_N) + (r[:, None] * BLOCK_N + c[None, :])


@triton.jit
def fixup_tile(acc, ws, counters, tile, my_block, first_block, part_stride, first_extra, n_parts,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(is_last, total): the sum over the n_parts pieces of tile `tile` when this piece (stored in
    block `my_block`) arrived last, else its own `acc`. `ws`: blocks of BLOCK_M * BLOCK_N elements
    of the accumulator type; `counters`: one int32 per tile, zero on entry, left zero."""
    tl.store(_block_ptrs(ws, my_block, BLOCK_M, BLOCK_N), acc)
    # every thread's partial is written before the release below publishes it at GPU scope
    tl.debug_barrier()
    arrived = tl.atomic_add(counters + tile, 1, sem="acq_rel", scope="gpu")
    last = arrived == n_parts - 1
    total = acc
    if last:
        total = tl.zeros_like(acc)
        for q in range(0, n_parts):
            block = first_block + q * part_stride + tl.where(q == 0, first_extra, 0)
            # .cg: read at L2, where the other programs' stores are, never a stale L1 line
            total += tl.load(_block_ptrs(ws, block, BLOCK_M, BLOCK_N), cache_modifier=".cg")
        tl.store(counters + tile, 0)
    return last, total


@triton.jit
def sum_k_slices(ws, y, bias, M, N, splits, split_rows, stride_wm, stride_ym, stride_yn, HAS_BIAS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y (M, N) = the sum over s < splits of ws[s * split_rows + m, n] (fp32 partial products of K
    slices, rows stride_wm apart, unit column stride), in slice order, plus bias (N,), cast to
    y's dtype. For kernels that store the K slices of a tile apart, in another launch
    (kernels/gemm_ws.py); the shared loads, epilogue and store pieces do the work."""
    off_m = tl.program_id(0) * BLOCK_M
    off_n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(0, splits):
        acc += load_k_tile(ws + s * split_rows.to(tl.int64) * stride_wm, off_m, off_n, M, N, stride_wm, 1,
                           BLOCK_M, BLOCK_N, False, True, False, True)
    out = finish_tile(acc, off_m, off_n, M, N, bias if HAS_BIAS else None, None, None, None, None, 0, 0, 0, 0,
                      BLOCK_M, BLOCK_N, SCALE_NONE, SCALE_NONE, "none")
    store_tile(y, out.to(y.dtype.element_ty), off_m, off_n, M, N, stride_ym, stride_yn, BLOCK_M, BLOCK_N, False,
               True)


@triton.jit
def finish_sums(sums, y, bias, M, N, M_SUMS, stride_sm, stride_sn, stride_ym, stride_yn, HAS_BIAS: tl.constexpr,
                ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """y (M, N) = ACTIVATION(sums + bias) cast to y's dtype, for fp32 sums (M_SUMS >= M rows, strides
    stride_sm, stride_sn: (M, N) row-major, or (N, M_SUMS) transposed) that a kernel's K slices added
    up by atomics; all of sums is put back to zero for the next launch (the grid covers M_SUMS rows).
    PDL: launched as a programmatic dependent of that kernel (kernels/gdc.py): wait for it first."""
    if PDL:
        gdc_wait()
    off_m = tl.program_id(0) * BLOCK_M
    off_n = tl.program_id(1) * BLOCK_N
    acc = load_k_tile(sums, off_m, off_n, M_SUMS, N, stride_sm, stride_sn, BLOCK_M, BLOCK_N, False, True, False,
                      True)
    out = finish_tile(acc, off_m, off_n, M, N, bias if HAS_BIAS else None, None, None, None, None, 0, 0, 0, 0,
                      BLOCK_M, BLOCK_N, SCALE_NONE, SCALE_NONE, ACTIVATION)
    store_tile(y, out.to(y.dtype.element_ty), off_m, off_n, M, N, stride_ym, stride_yn, BLOCK_M, BLOCK_N, False,
               True)
    # every thread's load is done (its value stored above) before any thread overwrites: the
    # zeros' layout need not be the load's
    tl.debug_barrier()
    store_tile(sums, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), off_m, off_n, M_SUMS, N, stride_sm, stride_sn,
               BLOCK_M, BLOCK_N, False, True)
