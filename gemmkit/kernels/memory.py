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
def load_k_halves(src, off_r, off_k, R, K, stride_r, stride_k, BLOCK_R: tl.constexpr, SUB: tl.constexpr,
                  WORDS: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    """The even and odd columns (BLOCK_R, SUB // 2) each of the (BLOCK_R, SUB) tile at (off_r,
    off_k) of a 16-bit (R, K) operand, K even: the partners of a packed 4-bit operand's low and
    high nibbles. WORDS (unit stride along K, 4-byte aligned rows): one 32-bit load per pair of
    columns, split in registers; else two strided loads. Past R or K: zeros."""
    if WORDS:
        rr, rw = tile_indices(off_r, off_k // 2, BLOCK_R, SUB // 2, INDEX_64)
        ptrs = src.to(tl.pointer_type(tl.int32)) + rr[:, None] * (stride_r // 2) + rw[None, :]
        if EVEN_K:
            w = tl.load(ptrs, mask=rr[:, None] < R, other=0)
        else:
            w = tl.load(ptrs, mask=(rr[:, None] < R) & (rw[None, :] < K // 2), other=0)
        even = (w & 0xFFFF).to(tl.int16).to(src.dtype.element_ty, bitcast=True)
        odd = (w >> 16).to(tl.int16).to(src.dtype.element_ty, bitcast=True)
    else:
        rr, rh = tile_indices(off_r, off_k // 2, BLOCK_R, SUB // 2, INDEX_64)
        ptrs = src + rr[:, None] * stride_r + (2 * rh)[None, :] * stride_k
        mask = (rr[:, None] < R) & (rh[None, :] < K // 2)
        even = tl.load(ptrs, mask=mask, other=0.0)
        odd = tl.load(ptrs + stride_k, mask=mask, other=0.0)
    return even, odd


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


@triton.jit
def store_split_cat(
    c, c2, cat_src, value, off_m, off_n, M, N, d1, dh, d3, stride_c1m, stride_c1h, stride_c2m, stride_c2h,
    stride_sm, stride_sh, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D3: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """OUT_SPLIT_CAT (the MLA kv_b_proj pattern): store the tile of the (M, H * dh) product, dh =
    d1 + d2, split per head: column h * dh + j goes to c[m, h, j] (j < d1; c is (M, H, d1 + d3))
    or c2[m, h, j - d1] (c2 is (M, H, d2)); and for each head starting in this tile's columns,
    copy cat_src[m, h, :d3] (M, H, d3) to c[m, h, d1:] for the tile's rows. Last dims unit-stride."""
    rm, rn = tile_indices(off_m, off_n, BLOCK_M, BLOCK_N, INDEX_64)
    h = rn // dh
    j = rn - h * dh
    row_ok = rm[:, None] < M
    first = j < d1
    p1 = c + rm[:, None] * stride_c1m + (h * stride_c1h + j)[None, :]
    tl.store(p1, value, mask=row_ok & (first & (rn < N))[None, :])
    p2 = c2 + rm[:, None] * stride_c2m + (h * stride_c2h + j - d1)[None, :]
    tl.store(p2, value, mask=row_ok & ((~first) & (rn < N))[None, :])
    if BLOCK_D3 > 0:
        rd = tl.arange(0, BLOCK_D3)
        h_lo = tl.cdiv(off_n, dh)
        h_hi = tl.minimum(tl.cdiv(off_n + BLOCK_N, dh), N // dh)
        for hh in range(h_lo, h_hi):
            mask = row_ok & (rd[None, :] < d3)
            src = tl.load(cat_src + rm[:, None] * stride_sm + hh * stride_sh + rd[None, :], mask=mask)
            tl.store(c + rm[:, None] * stride_c1m + hh * stride_c1h + d1 + rd[None, :], src.to(c.dtype.element_ty),
                     mask=mask)


@triton.jit
def copy_rows_kernel(src, dst, R, C, stride_src, stride_dst, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                     VEC: tl.constexpr, INDEX_64: tl.constexpr):
    """dst[r, :C] = src[r, :C] for R rows of C words each (unit stride along a row), at row strides
    that are multiples of VEC words (C too): the rows move in VEC-word vectors."""
    rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    if INDEX_64:
        rr = rr.to(tl.int64)
    if VEC > 1:  # (a stride of 1 arrives as a constant, which takes no hint)
        stride_src = tl.multiple_of(stride_src, VEC)
        stride_dst = tl.multiple_of(stride_dst, VEC)
    src_rows = src + rr[:, None] * stride_src
    dst_rows = dst + rr[:, None] * stride_dst
    for c0 in range(0, C, BLOCK_C):
        rc = tl.max_contiguous(tl.multiple_of(c0 + tl.arange(0, BLOCK_C), BLOCK_C), BLOCK_C)
        mask = (rr < R)[:, None] & (rc < C)[None, :]
        tl.store(dst_rows + rc[None, :], tl.load(src_rows + rc[None, :], mask=mask), mask=mask)
