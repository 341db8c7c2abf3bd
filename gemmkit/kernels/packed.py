"""4-bit operands (INT4 groups, MXFP4): packed tiles decoded in registers, kept as two halves.

A 4-bit operand of logical shape (R, K) is stored as uint8 (R, K // 2): element 2j in the low
nibble of byte j, element 2j + 1 in the high nibble (gemmkit.quant; the OCP MX layout). Hopper has
no FP4/INT4 tensor cores: tiles become 16-bit values here and feed ordinary 16-bit dots, so HBM
carries 4 bits per value.

The tiles are never interleaved back into (R, K) order: a (BLOCK_R, SUB / 2) byte tile decodes to
its low nibbles (the even K columns) and its high nibbles (the odd ones), and the K loop pairs
them with the even and odd columns of the other operand (two dots; the sum over K does not care
about the order). Interleaving (join + reshape) cost as much as the decode itself.

Decoding builds 16-bit floats from the bits, with no int-to-float conversions: 0x4300 | q is the
bf16 128 + q (0x6400 | q the fp16 1024 + q), exact, and (v - (128 + z)) * s is then two packed
16-bit instructions per pair of values. With PTX (FAST_UNPACK, CUDA only) PRMT, SHR and LOP3 on
whole words place the nibbles in the halves of 32-bit words; elsewhere (the interpreter) the same
bits come from plain integer ops.
"""

import triton
import triton.language as tl

from .memory import tile_indices


@triton.jit
def load_packed(src, off_r, off_k, R, K, stride_r, BLOCK_R: tl.constexpr, SUB: tl.constexpr,
                EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    """The (BLOCK_R, SUB // 2) bytes holding columns off_k .. off_k + SUB of a packed (R, K)
    operand (src: byte (0, 0); bytes contiguous along K). Rows past R and columns past K read 0
    (EVEN_K: no column is past K; a column mask would halve the vector width of the loads)."""
    rr, rb = tile_indices(off_r, off_k // 2, BLOCK_R, SUB // 2, INDEX_64)
    if EVEN_K:
        mask = rr[:, None] < R
    else:
        mask = (rr[:, None] < R) & (rb[None, :] < K // 2)
    return tl.load(src + rr[:, None] * stride_r + rb[None, :], mask=mask, other=0)


def _spread_pairs_ptx(body: str) -> str:
    """An inline-PTX block decoding the four bytes of $4 into $0..$3: PRMT spreads bytes 0, 1
    (t01) and 2, 3 (t23) over the halves of a word; `body` fills $0, $1 (low nibbles of t01, t23)
    and $2, $3 (high nibbles) from them, through registers a, b."""
    return ("{\n.reg .b32 t01, t23, a, b;\nprmt.b32 t01, $4, 0, 0x1100;\nprmt.b32 t23, $4, 0, 0x3322;\n"
            + body + "}\n")


def _nibbles_ptx(magic: int) -> str:
    """Each nibble ORed under a 16-bit float exponent: MAGIC | q (bf16 0x4300 | q = 128 + q, fp16
    0x6400 | q = 1024 + q): LOP3 per half-word pair, SHR first for the high nibbles."""
    lop = "lop3.b32 ${out}, {src}, 0x000F000F, 0x{m:04X}{m:04X}, 0xEA;\n"
    return _spread_pairs_ptx(lop.format(out=0, src="t01", m=magic) + lop.format(out=1, src="t23", m=magic)
                             + "shr.u32 a, t01, 4;\nshr.u32 b, t23, 4;\n"
                             + lop.format(out=2, src="a", m=magic) + lop.format(out=3, src="b", m=magic))


def _e2m1_ptx(bf16: bool) -> str:
    """e2m1 codes as the 16-bit float of their bits (see _e2m1_bits): the magnitude bits shifted
    to the bottom of the exponent field (bf16: bits 6-8, fp16: bits 9-11), the sign to bit 15
    (SHL, SHL, AND, LOP3 per half-word pair; the high nibbles shift 4 less)."""
    low, mask = (6, 0x01C001C0) if bf16 else (9, 0x0E000E00)
    code = ("shl.b32 a, {src}, {m};\nshl.b32 b, {src}, {s};\nand.b32 b, b, 0x80008000;\n"
            "lop3.b32 ${out}, a, 0x{mask:08X}, b, 0xEA;\n")
    return _spread_pairs_ptx("".join(code.format(src=src, m=low - 4 * hi, s=12 - 4 * hi, mask=mask, out=2 * hi + i)
                                     for hi in (0, 1) for i, src in enumerate(("t01", "t23"))))


_NIBBLES_BF16 = tl.constexpr(_nibbles_ptx(0x4300))
_NIBBLES_FP16 = tl.constexpr(_nibbles_ptx(0x6400))
_E2M1_BF16 = tl.constexpr(_e2m1_ptx(True))
_E2M1_FP16 = tl.constexpr(_e2m1_ptx(False))


@triton.jit
def _decode_ptx(p, ASM: tl.constexpr, BF16: tl.constexpr):
    """(low nibbles, high nibbles) of uint8 bytes p as bf16 (BF16) or fp16, through the PTX block
    ASM (four bytes per call)."""
    if BF16:
        out = tl.inline_asm_elementwise(asm=ASM, constraints="=r,=r,=r,=r,r", args=[p],
                                        dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    else:
        out = tl.inline_asm_elementwise(asm=ASM, constraints="=r,=r,=r,=r,r", args=[p],
                                        dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    return out


@triton.jit
def int4_halves(p, s, z, DTYPE: tl.constexpr, FAST_UNPACK: tl.constexpr):
    """(q - z) * s of the low and high nibbles of bytes p (R, C), as DTYPE (bf16 or fp16): s, z
    (R, 1) fp32 scales and zero points (exact in bf16 for z <= 127, in fp16 for z <= 1023)."""
    if DTYPE == tl.bfloat16:
        MAGIC: tl.constexpr = 0x4300
        base: tl.constexpr = 128.0
    else:
        MAGIC: tl.constexpr = 0x6400
        base: tl.constexpr = 1024.0
    if FAST_UNPACK:
        if DTYPE == tl.bfloat16:
            v_lo, v_hi = _decode_ptx(p, _NIBBLES_BF16, True)
        else:
            v_lo, v_hi = _decode_ptx(p, _NIBBLES_FP16, False)
    else:
        v_lo = ((p & 15).to(tl.int16) | MAGIC).to(DTYPE, bitcast=True)
        v_hi = ((p >> 4).to(tl.int16) | MAGIC).to(DTYPE, bitcast=True)
    zb = (z + base).to(DTYPE)
    sb = s.to(DTYPE)
    return (v_lo - zb) * sb, (v_hi - zb) * sb


@triton.jit
def e8m0_float(e):
    """uint8 e8m0 -> float32 2^(e - 127) (e = 0: the subnormal 2^-127; 255: NaN)."""
    e = e.to(tl.int32)
    bits = tl.where(e == 0, 1 << 22, tl.where(e == 255, 0x7FC00000, e << 23))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_bits(c, DTYPE: tl.constexpr):
    """e2m1 codes (uint8 0..15: bit 3 the sign, bits 1-2 the exponent, bit 0 the mantissa) as the
    DTYPE float of their bits: the magnitude bits at the bottom of the exponent field make the
    value (0, 0.5, 1, 1.5, 2, 3, 4, 6) times 2^-126 (bf16) or 2^-14 (fp16), a subnormal for
    exponent 0; a power-of-two product undoes that exactly."""
    c = c.to(tl.int16)
    if DTYPE == tl.bfloat16:
        v = (((c & 7) << 6) | ((c & 8) << 12)).to(tl.bfloat16, bitcast=True)
    else:
        v = (((c & 7) << 9) | ((c & 8) << 12)).to(tl.float16, bitcast=True)
    return v


@triton.jit
def mxfp4_halves(p, e, DTYPE: tl.constexpr, FAST_UNPACK: tl.constexpr):
    """e2m1(q) * 2^(e - 127) of the low and high nibbles of bytes p (R, C), as DTYPE: e (R, 1)
    uint8 e8m0 scales. bf16 multiplies by 2^126 and the scale in bf16 (exact: powers of two in
    its range); fp16, whose range is narrower, by 2^14 and then the scale in fp32."""
    if FAST_UNPACK:
        if DTYPE == tl.bfloat16:
            lo, hi = _decode_ptx(p, _E2M1_BF16, True)
        else:
            lo, hi = _decode_ptx(p, _E2M1_FP16, False)
    else:
        lo = _e2m1_bits(p & 15, DTYPE)
        hi = _e2m1_bits(p >> 4, DTYPE)
    s = e8m0_float(e)
    if DTYPE == tl.bfloat16:
        sb = s.to(tl.bfloat16)
        out_lo = lo * 8.507059173023462e37 * sb  # 2^126
        out_hi = hi * 8.507059173023462e37 * sb
    else:
        out_lo = ((lo * 16384.0).to(tl.float32) * s).to(DTYPE)
        out_hi = ((hi * 16384.0).to(tl.float32) * s).to(DTYPE)
    return out_lo, out_hi


@triton.jit
def group_value(src, off_r, off_k, R, K, stride_r, stride_k, BLOCK_R: tl.constexpr, GROUP: tl.constexpr,
                EVEN_K: tl.constexpr):
    """(BLOCK_R, 1) per-row values of the K group holding column off_k (stride_k 0: one per row);
    0 past K (a K tile wider than K would otherwise read the next row's scales: an e8m0 255 there,
    NaN, times the masked zeros is NaN)."""
    rr = off_r + tl.arange(0, BLOCK_R)
    mask = rr < R
    if not EVEN_K:
        mask = mask & (rr * 0 + off_k < K)
    return tl.load(src + rr * stride_r + (off_k // GROUP) * stride_k, mask=mask, other=0)[:, None]


@triton.jit
def packed_b_halves(b, b_scale, b_zero, off_n, off_k, N, K, stride_bn, stride_bsn, stride_bsk, stride_bzn,
                    stride_bzk, DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, SUB: tl.constexpr, GROUP: tl.constexpr,
                    INT4: tl.constexpr, FAST_UNPACK: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    """The even-column and odd-column halves (BLOCK_N, SUB // 2) of the SUB columns at off_k of a
    packed B (one scale group: SUB <= GROUP), dequantized to DTYPE. INT4: (q - z) * s with group
    scales `b_scale` and uint8 zero points `b_zero` (8 where None, symmetric); else MXFP4 with
    e8m0 scales `b_scale`."""
    p = load_packed(b, off_n, off_k, N, K, stride_bn, BLOCK_N, SUB, EVEN_K, INDEX_64)
    if INT4:
        s = group_value(b_scale, off_n, off_k, N, K, stride_bsn, stride_bsk, BLOCK_N, GROUP, EVEN_K).to(tl.float32)
        if b_zero is None:
            z = tl.full((BLOCK_N, 1), 8.0, tl.float32)
        else:
            z = group_value(b_zero, off_n, off_k, N, K, stride_bzn, stride_bzk, BLOCK_N, GROUP, EVEN_K).to(tl.float32)
        lo, hi = int4_halves(p, s, z, DTYPE, FAST_UNPACK)
    else:
        e = group_value(b_scale, off_n, off_k, N, K, stride_bsn, stride_bsk, BLOCK_N, 32, EVEN_K)
        lo, hi = mxfp4_halves(p, e, DTYPE, FAST_UNPACK)
    return lo, hi


@triton.jit
def packed_a_halves(a, a_scale, off_m, off_k, M, K, stride_am, stride_asm, stride_ask, BLOCK_M: tl.constexpr,
                    SUB: tl.constexpr, FAST_UNPACK: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    """The even-column and odd-column halves (BLOCK_M, SUB // 2) of the SUB columns at off_k of a
    packed MXFP4 A (SUB <= 32: one e8m0 scale per row), decoded to bf16."""
    p = load_packed(a, off_m, off_k, M, K, stride_am, BLOCK_M, SUB, EVEN_K, INDEX_64)
    e = group_value(a_scale, off_m, off_k, M, K, stride_asm, stride_ask, BLOCK_M, 32, EVEN_K)
    return mxfp4_halves(p, e, tl.bfloat16, FAST_UNPACK)


@triton.jit
def dequantize_kernel(b, b_scale, b_zero, out, N, K, stride_bn, stride_bsn, stride_bsk, stride_bzn, stride_bzk,
                      stride_on, BLOCK_N: tl.constexpr, SUB: tl.constexpr, GROUP: tl.constexpr, INT4: tl.constexpr,
                      FAST_UNPACK: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    """out (N, K) = the packed 4-bit B dequantized (as packed_b_halves, to out's dtype), one
    (BLOCK_N, SUB) tile per program; the halves are interleaved back here, where it is cheap
    (a memory-bound pass)."""
    off_n = tl.program_id(0) * BLOCK_N
    off_k = tl.program_id(1) * SUB
    lo, hi = packed_b_halves(b, b_scale, b_zero, off_n, off_k, N, K, stride_bn, stride_bsn, stride_bsk, stride_bzn,
                             stride_bzk, out.dtype.element_ty, BLOCK_N, SUB, GROUP, INT4, FAST_UNPACK, EVEN_K,
                             INDEX_64)
    rn, rk = tile_indices(off_n, off_k, BLOCK_N, SUB, INDEX_64)
    tl.store(out + rn[:, None] * stride_on + rk[None, :], tl.reshape(tl.join(lo, hi), (BLOCK_N, SUB)),
             mask=(rn[:, None] < N) & (rk[None, :] < K))


@triton.jit
def permute_k_kernel(x, out, M, K, stride_xm, stride_xk, BLOCK_M: tl.constexpr, INDEX_64: tl.constexpr):
    """out (M, K) contiguous = x (M, K) with each 128-wide K block in the Hopper 4-bit kernels'
    register order (kernels/gemm_w4_decode.py host_true_k): position kp holds column 8 w + i, where
    kp's bits are, from the lowest, c0, c2, c3, c1 (w = c0 + 2 c1 + 4 c2 + 8 c3) and then i. Read and
    written in K order (whole vectors); the reshape / permute / reshape relabels the values.
    Grid: (cdiv(M, BLOCK_M), K // 128)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    if INDEX_64:
        rm = rm.to(tl.int64)
    k = tl.program_id(1) * 128 + tl.arange(0, 128)
    mask = (rm < M)[:, None]
    v = tl.load(x + rm[:, None] * stride_xm + k[None, :] * stride_xk, mask=mask)
    # column bits (c3, c2, c1, c0, i) -> (i, c1, c3, c2, c0)
    v = tl.reshape(tl.permute(tl.reshape(v, [BLOCK_M, 2, 2, 2, 2, 8]), (0, 5, 3, 1, 2, 4)), [BLOCK_M, 128])
    tl.store(out + rm[:, None] * K + k[None, :], v, mask=mask)
