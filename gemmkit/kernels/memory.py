"""Tile loads and stores, through TMA tensor descriptors or masked pointers.

Both operands of C = A @ B^T are addressed the same way: as a logical (rows, K) matrix, A as (M, K)
and B as (N, K) (the nn.Linear weight layout). A load returns a (BLOCK_R, BLOCK_K) tile.
"""

import triton
import triton.language as tl


@triton.jit
def tile_indices(off_r, off_c, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INDEX_64: tl.constexpr):
    """Row and column indices of the (BLOCK_R, BLOCK_C) tile at (off_r, off_c), offsets being
    multiples of the block sizes (hinted, so accesses along a unit-stride dim vectorize)."""
    rr = tl.max_contiguous(tl.multiple_of(off_r + tl.arange(0, BLOCK_R), BLOCK_R), BLOCK_R)
    rc = tl.max_contiguous(tl.multiple_of(off_c + tl.arange(0, BLOCK_C), BLOCK_C), BLOCK_C)
    if INDEX_64:
        rr = rr.to(tl.int64)
        rc = rc.to(tl.int64)
    return rr, rc


@triton.jit
def load_k_tile(
    src,
    off_r,
    off_k,
    R,
    K,
    stride_r,
    stride_k,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TMA: tl.constexpr,
    K_MAJOR: tl.constexpr,
    EVEN_K: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """Load the (BLOCK_R, BLOCK_K) tile at (off_r, off_k) of a logical (R, K) operand.

    TMA: `src` is a tensor descriptor over the storage, (R, K) if K_MAJOR else (K, R) (then the
    tile is transposed on the way, which is free: it only changes the shared-memory layout).
    Elements past R or K read as zero.
    Pointers: `src` points at element (0, 0); any strides. Elements past R or K read as zero.
    """
    if TMA:
        if K_MAJOR:
            tile = src.load([off_r, off_k])
        else:
            tile = src.load([off_k, off_r]).T
    else:
        rr, rk = tile_indices(off_r, off_k, BLOCK_R, BLOCK_K, INDEX_64)
        ptrs = src + rr[:, None] * stride_r + rk[None, :] * stride_k
        # Rows past R are masked (zero-filled) rather than clamped to a valid row: with R not a
        # multiple of BLOCK_R, clamped indices made decode-sized GEMMs (M < 16) markedly slower.
        if EVEN_K:
            tile = tl.load(ptrs, mask=rr[:, None] < R, other=0.0)
        else:
            tile = tl.load(ptrs, mask=(rr[:, None] < R) & (rk[None, :] < K), other=0.0)
    return tile


@triton.jit
def store_tile(
    dst,
    value,
    off_m,
    off_n,
    M,
    N,
    stride_m,
    stride_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TMA: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """Store a (BLOCK_M, BLOCK_N) tile at (off_m, off_n) of an (M, N) matrix; out-of-range
    elements are dropped. TMA: `dst` is a descriptor with block [BLOCK_M, BLOCK_N]."""
    if TMA:
        dst.store([off_m, off_n], value)
    else:
        rm, rn = tile_indices(off_m, off_n, BLOCK_M, BLOCK_N, INDEX_64)
        ptrs = dst + rm[:, None] * stride_m + rn[None, :] * stride_n
        tl.store(ptrs, value, mask=(rm[:, None] < M) & (rn[None, :] < N))


# ---------------------------------------------------------------------------------------------
# MoE family: gathered A rows, scattered C rows


@triton.jit
def _rows_cols(rows, off_c, BLOCK_C: tl.constexpr, INDEX_64: tl.constexpr):
    """(row indices, the BLOCK_C column indices at off_c), 64-bit with INDEX_64."""
    rc = tl.max_contiguous(tl.multiple_of(off_c + tl.arange(0, BLOCK_C), BLOCK_C), BLOCK_C)
    rr = rows
    if INDEX_64:
        rr = rr.to(tl.int64)
        rc = rc.to(tl.int64)
    return rr, rc


@triton.jit
def load_rows_k_tile(src, rows, off_k, K, stride_r, stride_k, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                     INDEX_64: tl.constexpr):
    """The (len(rows), BLOCK_K) tile at columns off_k.. of rows `rows` (any valid row indices:
    rows past a group's end are read and their products dropped by the store). Pointers."""
    rr, rk = _rows_cols(rows, off_k, BLOCK_K, INDEX_64)
    ptrs = src + rr[:, None] * stride_r + rk[None, :] * stride_k
    if EVEN_K:
        tile = tl.load(ptrs)
    else:
        tile = tl.load(ptrs, mask=rk[None, :] < K, other=0.0)
    return tile


@triton.jit
def store_rows_tile(dst, value, rows, row_ok, off_n, N, stride_m, stride_n, BLOCK_N: tl.constexpr,
                    INDEX_64: tl.constexpr):
    """Store a tile's rows at rows `rows` of an (*, N) matrix (rows where `row_ok` is false and
    columns past N are dropped). Pointers."""
    rr, rn = _rows_cols(rows, off_n, BLOCK_N, INDEX_64)
    ptrs = dst + rr[:, None] * stride_m + rn[None, :] * stride_n
    tl.store(ptrs, value, mask=row_ok[:, None] & (rn[None, :] < N))
