"""4-bit operands (INT4 groups, MXFP4): packed tiles unpacked and dequantized in registers.

A 4-bit operand of logical shape (R, K) is stored as uint8 (R, K // 2): element 2j in the low
nibble of byte j, element 2j + 1 in the high nibble (gemmkit.quant). Its scales are per row and
K group of GROUP columns; a K tile may hold one group (BLOCK_K <= GROUP, GROUP % BLOCK_K == 0) or
several (BLOCK_K % GROUP == 0): both powers of two, so one of the two always holds. Hopper has no
FP4/INT4 tensor cores: the tiles become 16-bit values here, then feed ordinary 16-bit dots, so
HBM carries 4 bits per value.
"""

import triton
import triton.language as tl

from .memory import tile_indices


@triton.jit
def load_packed(src, off_r, off_k, R, K, stride_r, stride_k, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    """The (BLOCK_R, BLOCK_K) 4-bit codes (uint8, 0..15) at (off_r, off_k) of a packed (R, K)
    operand: src points at byte (0, 0), strides in bytes. Rows past R and columns past K read 0."""
    rr, rb = tile_indices(off_r, off_k // 2, BLOCK_R, BLOCK_K // 2, INDEX_64)
    ptrs = src + rr[:, None] * stride_r + rb[None, :] * stride_k
    if EVEN_K:
        p = tl.load(ptrs, mask=rr[:, None] < R, other=0)
    else:
        p = tl.load(ptrs, mask=(rr[:, None] < R) & (rb[None, :] < K // 2), other=0)
    return tl.reshape(tl.join(p & 15, p >> 4), (BLOCK_R, BLOCK_K))


@triton.jit
def group_values(src, off_r, off_k, R, K, stride_r, stride_k, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP: tl.constexpr):
    """(BLOCK_R, NG) per-row values of the NG = ceil(BLOCK_K / GROUP) K groups the tile covers
    (stride_k 0: one value per row)."""
    NG: tl.constexpr = (BLOCK_K + GROUP - 1) // GROUP
    rr = off_r + tl.arange(0, BLOCK_R)
    kg = off_k // GROUP + tl.arange(0, NG)
    ptrs = src + rr[:, None] * stride_r + kg[None, :] * stride_k
    return tl.load(ptrs, mask=(rr[:, None] < R) & (kg[None, :] * GROUP < K), other=0)


@triton.jit
def per_group(v, s, t, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    """v * s + t with s, t (BLOCK_R, NG) broadcast over their K groups of the (BLOCK_R, BLOCK_K) v."""
    NG: tl.constexpr = (BLOCK_K + GROUP - 1) // GROUP
    if NG == 1:
        out = v * s + t
    else:
        v3 = tl.reshape(v, (BLOCK_R, NG, BLOCK_K // NG))
        out = tl.reshape(v3 * s[:, :, None] + t[:, :, None], (BLOCK_R, BLOCK_K))
    return out


@triton.jit
def e8m0_float(e):
    """uint8 e8m0 -> float32 2^(e - 127) (e = 0: the subnormal 2^-127; 255: NaN)."""
    e = e.to(tl.int32)
    bits = tl.where(e == 0, 1 << 22, tl.where(e == 255, 0x7FC00000, e << 23))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def e2m1_float(c):
    """e2m1 codes (0..15: bit 3 the sign, bits 1-2 the exponent, bit 0 the mantissa) -> float32:
    0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. The code's bits placed in an fp16's sign,
    low exponent and top mantissa bits make that value times 2^-14 (e = 0: a subnormal), which
    converts exactly."""
    c = c.to(tl.uint16)
    bits = ((c & 7) << 9) | ((c & 8) << 12)
    return bits.to(tl.float16, bitcast=True).to(tl.float32) * 16384.0


@triton.jit
def int4_tile(b, b_scale, b_zero, off_n, off_k, N, K, stride_bn, stride_bk, stride_bsn, stride_bsk, stride_bzn,
              stride_bzk, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr, EVEN_K: tl.constexpr,
              INDEX_64: tl.constexpr):
    """(q - z) * s as fp32 (BLOCK_N, BLOCK_K): q the packed uint4 tile, s the group scales, z the
    uint8 zero points (any byte value; 8 where b_zero is None, symmetric)."""
    q = load_packed(b, off_n, off_k, N, K, stride_bn, stride_bk, BLOCK_N, BLOCK_K, EVEN_K, INDEX_64)
    s = group_values(b_scale, off_n, off_k, N, K, stride_bsn, stride_bsk, BLOCK_N, BLOCK_K, GROUP).to(tl.float32)
    if b_zero is None:
        zs = s * -8.0
    else:
        zs = -group_values(b_zero, off_n, off_k, N, K, stride_bzn, stride_bzk, BLOCK_N, BLOCK_K,
                           GROUP).to(tl.float32) * s
    return per_group(q.to(tl.float32), s, zs, BLOCK_N, BLOCK_K, GROUP)


@triton.jit
def mxfp4_tile(src, scale, off_r, off_k, R, K, stride_r, stride_k, stride_sr, stride_sk, BLOCK_R: tl.constexpr,
               BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    """e2m1(q) * 2^(e - 127) as fp32 (BLOCK_R, BLOCK_K) of a packed MXFP4 (R, K) operand with
    uint8 e8m0 scales (R, K // 32)."""
    q = load_packed(src, off_r, off_k, R, K, stride_r, stride_k, BLOCK_R, BLOCK_K, EVEN_K, INDEX_64)
    s = e8m0_float(group_values(scale, off_r, off_k, R, K, stride_sr, stride_sk, BLOCK_R, BLOCK_K, 32))
    return per_group(e2m1_float(q), s, tl.zeros_like(s), BLOCK_R, BLOCK_K, 32)
