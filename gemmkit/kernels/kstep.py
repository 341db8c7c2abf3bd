"""The K loop, composed from an A producer, a B producer and a promotion rule (kernels/modes.py).

A tile's product over the K tiles k_lo <= ki < k_hi is: an optional A prologue (the per-row absmax
of A_QUANT_ROW), then per K tile `x = A producer`, `w = B producer`, and the tensor-core product
joined to the accumulator as PROMOTE says. Every switch is a constexpr: a path that does not use
a piece compiles as if the piece did not exist (gemmkit.tools.codegen checks the plain persistent
TMA loop against a bare tutorial-09 kernel).
"""

import triton
import triton.language as tl

from .memory import load_k_halves, load_k_tile, load_rows_k_tile
from .modes import (A_GATHER, A_MXFP4, A_QUANT_GROUP, A_QUANT_ROW, B_DENSE, B_INT4, PROMOTE_KBLOCK, PROMOTE_NONE,
                    PROMOTE_TILE, SCALE_KBLOCK)
from .packed import packed_a_halves, packed_b_halves
from .quant import quantize_values, rows_absmax, scales_from_absmax


@triton.jit
def a_prologue(a, off_m, k_lo, k_hi, M, K, stride_am, stride_ak, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
               A_K_MAJOR: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr, A_PRODUCER: tl.constexpr,
               QUANT: tl.constexpr):
    """(row scales, their inverses) of the tile's A rows over the K tiles [k_lo, k_hi) for
    A_QUANT_ROW (a split-K slice or stream-K piece scans only its own range: each piece is
    quantized and scaled on its own); unused zeros otherwise."""
    if A_PRODUCER == A_QUANT_ROW:
        amax = rows_absmax(a, off_m, k_lo, k_hi, M, K, stride_am, stride_ak, BLOCK_M, BLOCK_K, A_K_MAJOR, EVEN_K,
                           INDEX_64)
        row_scale, row_inv = scales_from_absmax(amax, QUANT)
    else:
        row_scale = tl.zeros((BLOCK_M,), dtype=tl.float32)
        row_inv = row_scale
    return row_scale, row_inv


@triton.jit
def produce_a(a, a_scale, off_m, off_k, M, K, stride_am, stride_ak, stride_asm, stride_ask, row_inv,
              BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, A_TMA: tl.constexpr, A_K_MAJOR: tl.constexpr,
              EVEN_K: tl.constexpr, INDEX_64: tl.constexpr, A_PRODUCER: tl.constexpr, QUANT: tl.constexpr,
              a_idx=None):
    """(A tile (BLOCK_M, BLOCK_K) for the dot, its per-row scales where the producer made them).
    A_GATHER: the rows `a_idx` (BLOCK_M,) of A. (Packed 4-bit operands: packed_k_product.)"""
    if A_PRODUCER == A_GATHER:
        x = load_rows_k_tile(a, a_idx, off_k, K, stride_am, stride_ak, BLOCK_K, EVEN_K, INDEX_64)
    else:
        x = load_k_tile(a, off_m, off_k, M, K, stride_am, stride_ak, BLOCK_M, BLOCK_K, A_TMA, A_K_MAJOR, EVEN_K,
                        INDEX_64)
    if A_PRODUCER == A_QUANT_ROW:
        x = quantize_values(x, row_inv[:, None], QUANT)
        s = row_inv
    elif A_PRODUCER == A_QUANT_GROUP:
        s, inv = scales_from_absmax(tl.max(tl.abs(x.to(tl.float32)), axis=1), QUANT)
        x = quantize_values(x, inv[:, None], QUANT)
    else:
        s = row_inv
    return x, s


@triton.jit
def produce_b(b, off_n, off_k, N, K, stride_bn, stride_bk, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              B_TMA: tl.constexpr, B_K_MAJOR: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    """B tile (BLOCK_N, BLOCK_K) for the dot, as stored (B_DENSE; packed 4-bit B: packed_k_product)."""
    return load_k_tile(b, off_n, off_k, N, K, stride_bn, stride_bk, BLOCK_N, BLOCK_K, B_TMA, B_K_MAJOR, EVEN_K,
                       INDEX_64)


@triton.jit
def packed_k_product(a, b, a_scale, b_scale, b_zero, off_m, off_n, k_lo, k_hi, M, N, K, stride_am, stride_ak,
                     stride_bn, stride_asm, stride_ask, stride_bsn, stride_bsk, stride_bzn, stride_bzk,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_K: tl.constexpr,
                     A_PRODUCER: tl.constexpr, B_PRODUCER: tl.constexpr, A_WORDS: tl.constexpr,
                     FAST_UNPACK: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    """fp32 sum over the K tiles k_lo <= ki < k_hi of A @ B^T for a packed 4-bit B (B_INT4 with
    GROUP_K-wide scale groups, or B_MXFP4) and a 16-bit A (or A_MXFP4). Each K tile is taken in
    steps of SUB = min(BLOCK_K, GROUP_K) columns, one scale group each: the step's packed bytes
    decode to B's even and odd columns (kernels/packed.py), which meet A's even and odd columns
    in two dots; nothing is interleaved back."""
    SUB: tl.constexpr = BLOCK_K if BLOCK_K < GROUP_K else GROUP_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(k_lo, k_hi):
        for j in tl.static_range(BLOCK_K // SUB):
            off_k = ki * BLOCK_K + j * SUB
            if A_PRODUCER == A_MXFP4:
                x_lo, x_hi = packed_a_halves(a, a_scale, off_m, off_k, M, K, stride_am, stride_asm, stride_ask,
                                             BLOCK_M, SUB, FAST_UNPACK, EVEN_K, INDEX_64)
            else:
                x_lo, x_hi = load_k_halves(a, off_m, off_k, M, K, stride_am, stride_ak, BLOCK_M, SUB, A_WORDS,
                                           EVEN_K, INDEX_64)
            w_lo, w_hi = packed_b_halves(b, b_scale, b_zero, off_n, off_k, N, K, stride_bn, stride_bsn, stride_bsk,
                                         stride_bzn, stride_bzk, x_lo.dtype, BLOCK_N, SUB, GROUP_K,
                                         B_PRODUCER == B_INT4, FAST_UNPACK, EVEN_K, INDEX_64)
            acc = tl.dot(x_lo, w_lo.T, acc)
            acc = tl.dot(x_hi, w_hi.T, acc)
    return acc


@triton.jit
def kblock_scales(a_scale, b_scale, a_rows, off_m, off_n, off_k, M, N, stride_asm, stride_ask, stride_bsn, stride_bsk,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr,
                  GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, a_idx=None):
    """The (BLOCK_M, 1) x (1, BLOCK_N) scale product of the K group holding column off_k: A's per
    row (loaded for SCALE_KBLOCK, else `a_rows` from the producer; gathered rows: A's rows
    `a_idx`), B's per GROUP_N rows of B."""
    kg = off_k // GROUP_K
    if A_SCALE == SCALE_KBLOCK:
        if a_idx is not None:  # (rows past the tile's group read row 0's: their outputs are dropped)
            sa = tl.load(a_scale + a_idx.to(tl.int64) * stride_asm + kg * stride_ask)
        else:
            rm = off_m + tl.arange(0, BLOCK_M)
            sa = tl.load(a_scale + rm * stride_asm + kg * stride_ask, mask=rm < M, other=0.0)
    else:
        sa = a_rows
    if B_SCALE == SCALE_KBLOCK:
        if BLOCK_N <= GROUP_N:  # one scale for the tile's columns (tiles never straddle a group)
            sb = tl.load(b_scale + (off_n // GROUP_N) * stride_bsn + kg * stride_bsk)
            s = sa[:, None] * sb
        else:
            rn = off_n + tl.arange(0, BLOCK_N)
            sb = tl.load(b_scale + (rn // GROUP_N) * stride_bsn + kg * stride_bsk, mask=rn < N, other=0.0)
            s = sa[:, None] * sb[None, :]
    else:
        s = sa[:, None]
    return s


@triton.jit
def dense_k_product(
    a, b, a_scale, b_scale, off_m, off_n, k_lo, k_hi, M, N, K, stride_am, stride_ak, stride_bn, stride_bk,
    stride_asm, stride_ask, stride_bsn, stride_bsk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    A_TMA: tl.constexpr, A_K_MAJOR: tl.constexpr, B_TMA: tl.constexpr, B_K_MAJOR: tl.constexpr,
    EVEN_K: tl.constexpr, INDEX_64: tl.constexpr, ACC_INT: tl.constexpr,
    A_PRODUCER: tl.constexpr, PROMOTE: tl.constexpr, QUANT: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr,
    a_idx=None, b2=None, GATED: tl.constexpr = False, scale_n=None,
):
    """k_range_product for a B operand as stored (B_DENSE)."""
    row_scale, row_inv = a_prologue(a, off_m, k_lo, k_hi, M, K, stride_am, stride_ak, BLOCK_M, BLOCK_K, A_K_MAJOR,
                                    EVEN_K, INDEX_64, A_PRODUCER, QUANT)
    if ACC_INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if GATED:
        tl.static_assert(not ACC_INT and PROMOTE != PROMOTE_KBLOCK, "gated: float dots, tile or no promotion")
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(k_lo, k_hi):
        off_k = ki * BLOCK_K
        x, a_rows = produce_a(a, a_scale, off_m, off_k, M, K, stride_am, stride_ak, stride_asm, stride_ask, row_inv,
                              BLOCK_M, BLOCK_K, A_TMA, A_K_MAJOR, EVEN_K, INDEX_64, A_PRODUCER, QUANT, a_idx)
        w = produce_b(b, off_n, off_k, N, K, stride_bn, stride_bk, BLOCK_N, BLOCK_K, B_TMA, B_K_MAJOR, EVEN_K, INDEX_64)
        if ACC_INT:
            acc += tl.dot(x, w.T, out_dtype=tl.int32)
        elif PROMOTE == PROMOTE_NONE:
            acc = tl.dot(x, w.T, acc)
        elif PROMOTE == PROMOTE_TILE:
            acc += tl.dot(x, w.T)
        else:
            tl.static_assert(PROMOTE == PROMOTE_KBLOCK, "unknown promotion")
            acc += tl.dot(x, w.T) * kblock_scales(a_scale, b_scale, a_rows, off_m,
                                                  off_n if scale_n is None else scale_n, off_k, M, N, stride_asm,
                                                  stride_ask, stride_bsn, stride_bsk, BLOCK_M, BLOCK_N, A_SCALE,
                                                  B_SCALE, GROUP_K, GROUP_N, a_idx)
        if GATED:
            w_up = produce_b(b2, off_n, off_k, N, K, stride_bn, stride_bk, BLOCK_N, BLOCK_K, B_TMA, B_K_MAJOR, EVEN_K,
                             INDEX_64)
            if PROMOTE == PROMOTE_NONE:
                acc_up = tl.dot(x, w_up.T, acc_up)
            else:
                acc_up += tl.dot(x, w_up.T)
    if A_PRODUCER == A_QUANT_ROW:
        acc = acc.to(tl.float32) * row_scale[:, None]
        if GATED:
            acc_up = acc_up * row_scale[:, None]
    if GATED:
        acc = tl.join(acc, acc_up)
    return acc


@triton.jit
def k_range_product(
    a, b, a_scale, b_scale, off_m, off_n, k_lo, k_hi, M, N, K, stride_am, stride_ak, stride_bn, stride_bk,
    stride_asm, stride_ask, stride_bsn, stride_bsk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    A_TMA: tl.constexpr, A_K_MAJOR: tl.constexpr, B_TMA: tl.constexpr, B_K_MAJOR: tl.constexpr,
    EVEN_K: tl.constexpr, INDEX_64: tl.constexpr, ACC_INT: tl.constexpr,
    A_PRODUCER: tl.constexpr, B_PRODUCER: tl.constexpr, PROMOTE: tl.constexpr, QUANT: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr,
    b_zero, stride_bzn, stride_bzk, a_idx=None, b2=None, GATED: tl.constexpr = False,
    A_WORDS: tl.constexpr = False, FAST_UNPACK: tl.constexpr = False, scale_n=None,
):
    """(sum over the K tiles k_lo <= ki < k_hi of A[off_m:, k] @ B[off_n:, k]^T, the rows' scales):
    fp32, or int32 with ACC_INT (8-bit integer dots, PROMOTE_NONE). With A_QUANT_ROW the sum comes
    back already multiplied by the rows' scales (fp32), with PROMOTE_KBLOCK by the block scales.
    A_GATHER: `a_idx` holds the tile's A row indices. scale_n: the tile's first column for the
    K-block scales of B where off_n is a descriptor row instead (a grouped map's B descriptor spans
    every group's rows: off_n = g * N + column).

    GATED (fused feed-forward): each K step also loads the tile of a second B operand `b2` (the
    up projection; same shape, strides and layout as `b`, the gate projection) and feeds it to a
    second accumulator with the same A tile; the result is the (BLOCK_M, BLOCK_N, 2) pair
    tl.join(gate, up), fp32 (PROMOTE_NONE / PROMOTE_TILE only).

    A packed 4-bit B (B_INT4, B_MXFP4): packed_k_product (A_WORDS, FAST_UNPACK are its switches)."""
    if B_PRODUCER != B_DENSE:
        tl.static_assert(not GATED and not ACC_INT and PROMOTE == PROMOTE_NONE, "4-bit B: plain float dots")
        acc = packed_k_product(a, b, a_scale, b_scale, b_zero, off_m, off_n, k_lo, k_hi, M, N, K, stride_am,
                               stride_ak, stride_bn, stride_asm, stride_ask, stride_bsn, stride_bsk, stride_bzn,
                               stride_bzk, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_K, A_PRODUCER, B_PRODUCER, A_WORDS,
                               FAST_UNPACK, EVEN_K, INDEX_64)
    else:
        acc = dense_k_product(a, b, a_scale, b_scale, off_m, off_n, k_lo, k_hi, M, N, K, stride_am, stride_ak,
                              stride_bn, stride_bk, stride_asm, stride_ask, stride_bsn, stride_bsk, BLOCK_M, BLOCK_N,
                              BLOCK_K, A_TMA, A_K_MAJOR, B_TMA, B_K_MAJOR, EVEN_K, INDEX_64, ACC_INT, A_PRODUCER,
                              PROMOTE, QUANT, A_SCALE, B_SCALE, GROUP_K, GROUP_N, a_idx, b2, GATED, scale_n)
    return acc
