"""Quantization to FP8 / INT8: scales from absolute maxima, saturating conversion, and the
standalone quantizer kernels. QUANT names the target: "e4m3" (float8_e4m3fn), "e5m2"
(float8_e5m2) or "int8". A scale s maps q = x / s onto the target's range: s = absmax / qmax.
"""

import triton
import triton.language as tl

from .memory import load_k_tile


@triton.jit
def quant_max(QUANT: tl.constexpr):
    """Largest finite value of the target type."""
    if QUANT == "e4m3":
        q = 448.0
    elif QUANT == "e5m2":
        q = 57344.0
    else:
        q = 127.0
    return q


@triton.jit
def quantize_values(v, inv_scale, QUANT: tl.constexpr):
    """v * inv_scale (broadcast), saturated to the target's range and converted to it, rounding
    to nearest even (INT8 as torch.round and CUDA's __float2int_rn do). NaN stays NaN in FP8
    and becomes 0 in INT8, which has no NaN."""
    qmax = quant_max(QUANT)
    v = tl.clamp(v.to(tl.float32) * inv_scale, -qmax, qmax, propagate_nan=tl.PropagateNan.ALL)
    if QUANT == "e4m3":
        q = v.to(tl.float8e4nv)
    elif QUANT == "e5m2":
        q = v.to(tl.float8e5)
    else:
        # adding then subtracting 1.5 * 2^23 leaves |v| <= 2^22 rounded to an integer by the FPU,
        # to nearest even (both adds survive compilation: no fast-math reassociation; adding 0.5
        # then truncating would round 0.49999997 up, the sum being 1.0 in fp32)
        v = tl.where(v == v, v, 0.0)
        q = ((v + 12582912.0) - 12582912.0).to(tl.int8)
    return q


@triton.jit
def scales_from_absmax(amax, QUANT: tl.constexpr):
    """(scale, 1 / scale) for values whose absolute maximum is `amax`; an all-zero row gets
    scale 0 and quantizes to zeros. A nonzero amax below qmax * 2^-126 is taken as that bound
    (scale 2^-126, the least normal float) so that 1 / scale stays finite."""
    qmax = quant_max(QUANT)
    amax_n = tl.maximum(amax, qmax * 1.1754943508222875e-38)
    # div_rn: a plain `/` compiles to reciprocal-and-multiply (2 ulp), which the interpreter's
    # exact division would not show
    scale = tl.where(amax > 0, tl.div_rn(amax_n, qmax), 0.0)
    inv = tl.where(amax > 0, tl.div_rn(qmax, amax_n), 0.0)
    return scale, inv


@triton.jit
def rows_absmax(src, off_r, k_lo, k_hi, R, K, stride_r, stride_k, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                K_MAJOR: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    """Absolute maximum over the K tiles k_lo <= ki < k_hi of each of the BLOCK_R rows at off_r, as
    fp32 (BLOCK_R,). The loop is software-pipelined (loads of later tiles in flight): it is
    latency-bound."""
    amax = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for ki in tl.range(k_lo, k_hi, num_stages=3):
        t = load_k_tile(src, off_r, ki * BLOCK_K, R, K, stride_r, stride_k, BLOCK_R, BLOCK_K,
                        False, K_MAJOR, EVEN_K, INDEX_64)
        amax = tl.maximum(amax, tl.max(tl.abs(t.to(tl.float32)), axis=1))
    return amax


@triton.jit
def quantize_rows_kernel(
    x, q, scale, R, C, stride_xr, stride_xc, stride_qr,
    QUANT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, ONE_PASS: tl.constexpr,
    EVEN_C: tl.constexpr, INDEX_64: tl.constexpr,
):
    """Per-row dynamic quantization of x (R, C): q (R, C) row-major, scale (R,) fp32.
    ONE_PASS (C <= BLOCK_C): each row is read once, kept in registers, reduced and converted."""
    off_r = tl.program_id(0) * BLOCK_R
    rows = off_r + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    if INDEX_64:
        rows = rows.to(tl.int64)
    if ONE_PASS:
        t = load_k_tile(x, off_r, 0, R, C, stride_xr, stride_xc, BLOCK_R, BLOCK_C, False, True, EVEN_C, INDEX_64)
        s, inv = scales_from_absmax(tl.max(tl.abs(t.to(tl.float32)), axis=1), QUANT)
        cols = tl.arange(0, BLOCK_C)
        tl.store(q + rows[:, None] * stride_qr + cols[None, :], quantize_values(t, inv[:, None], QUANT),
                 mask=row_ok[:, None] & (cols[None, :] < C))
    else:
        amax = rows_absmax(x, off_r, 0, tl.cdiv(C, BLOCK_C), R, C, stride_xr, stride_xc, BLOCK_R, BLOCK_C, True, EVEN_C, INDEX_64)
        s, inv = scales_from_absmax(amax, QUANT)
        for ci in range(0, tl.cdiv(C, BLOCK_C)):
            t = load_k_tile(x, off_r, ci * BLOCK_C, R, C, stride_xr, stride_xc, BLOCK_R, BLOCK_C,
                            False, True, EVEN_C, INDEX_64)
            cols = ci * BLOCK_C + tl.arange(0, BLOCK_C)
            tl.store(q + rows[:, None] * stride_qr + cols[None, :], quantize_values(t, inv[:, None], QUANT),
                     mask=row_ok[:, None] & (cols[None, :] < C))
    tl.store(scale + rows, s, mask=row_ok)


@triton.jit
def absmax_kernel(x, amax, R, C, stride_xr, stride_xc, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                  EVEN_C: tl.constexpr, INDEX_64: tl.constexpr):
    """amax[0] = max(amax[0], max |x|) over this program's rows (amax starts at 0)."""
    off_r = tl.program_id(0) * BLOCK_R
    row_max = rows_absmax(x, off_r, 0, tl.cdiv(C, BLOCK_C), R, C, stride_xr, stride_xc, BLOCK_R, BLOCK_C, True, EVEN_C, INDEX_64)
    row_max = tl.where(off_r + tl.arange(0, BLOCK_R) < R, row_max, 0.0)
    tl.atomic_max(amax, tl.max(row_max, axis=0))


@triton.jit
def quantize_tensor_kernel(
    x, q, scale_in, scale_out, R, C, stride_xr, stride_xc, stride_qr,
    QUANT: tl.constexpr, FROM_ABSMAX: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    EVEN_C: tl.constexpr, INDEX_64: tl.constexpr,
):
    """Quantize x (R, C) with one scale: scale_in[0] is the scale, or (FROM_ABSMAX) the tensor's
    absolute maximum, then program 0 also writes the scale to scale_out[0]."""
    off_r = tl.program_id(0) * BLOCK_R
    if FROM_ABSMAX:
        s, inv = scales_from_absmax(tl.load(scale_in), QUANT)
        if tl.program_id(0) == 0:
            tl.store(scale_out, s)
    else:
        s = tl.load(scale_in)
        inv = tl.where(s > 0, tl.minimum(tl.div_rn(1.0, s), 3.4028234663852886e38), 0.0)  # finite for a subnormal s
    rows = off_r + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    if INDEX_64:
        rows = rows.to(tl.int64)
    for ci in range(0, tl.cdiv(C, BLOCK_C)):
        t = load_k_tile(x, off_r, ci * BLOCK_C, R, C, stride_xr, stride_xc, BLOCK_R, BLOCK_C,
                        False, True, EVEN_C, INDEX_64)
        cols = ci * BLOCK_C + tl.arange(0, BLOCK_C)
        tl.store(q + rows[:, None] * stride_qr + cols[None, :], quantize_values(t, inv, QUANT),
                 mask=row_ok[:, None] & (cols[None, :] < C))


@triton.jit
def pow2_scales(s):
    """(scale, 1 / scale) with a positive scale s rounded up to a power of two (UE8M0 scales):
    adding the mantissa mask carries any nonzero mantissa into the exponent, then the mantissa is
    cleared. s = 0 (an all-zero block) becomes 2^-126, the floor `scales_from_absmax` gives tiny
    nonzero blocks; inf stays inf (1 / scale = 0). For s = fl(absmax / qmax) the result is never
    below the exact quotient: fl() rounds down onto a power of two 2^e only when
    absmax <= qmax * 2^e (qmax = 1.75 * 2^m, so the next float above qmax * 2^e is more than
    half an ulp of 2^e above it), hence |v| / scale <= qmax and nothing saturates."""
    bits = s.to(tl.int32, bitcast=True)
    p = ((bits + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)
    p = tl.where(s > 0, p, 1.1754943508222875e-38)
    return p, tl.div_rn(1.0, p)


@triton.jit
def quantize_blocks_kernel(
    x, q, scale, R, C, stride_xr, stride_xc, stride_qr, stride_sr, stride_sg,
    QUANT: tl.constexpr, BLOCK_R: tl.constexpr, GROUP: tl.constexpr, ROW_SCALES: tl.constexpr,
    UE8M0: tl.constexpr, EVEN_C: tl.constexpr, INDEX_64: tl.constexpr,
):
    """Block-wise quantization of x (R, C) to q (R, C) row-major; program (i, g) reads the
    (BLOCK_R, GROUP) block at (i * BLOCK_R, g * GROUP) once: absmax, scale, saturating convert.
    ROW_SCALES: one scale per row and group, scale[r, g] (1 x GROUP blocks, activations);
    else one per block, scale[i, g] (BLOCK_R x GROUP blocks, weights). Scales may have any
    strides (row- or column-major). UE8M0: scales rounded up to powers of two."""
    pid_r = tl.program_id(0)
    g = tl.program_id(1)
    off_r = pid_r * BLOCK_R
    off_c = g * GROUP
    t = load_k_tile(x, off_r, off_c, R, C, stride_xr, stride_xc, BLOCK_R, GROUP, False, True, EVEN_C, INDEX_64)
    amax = tl.max(tl.abs(t.to(tl.float32)), axis=1)
    rows = off_r + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    if INDEX_64:
        rows = rows.to(tl.int64)
    cols = off_c + tl.arange(0, GROUP)
    mask = row_ok[:, None] & (cols[None, :] < C)
    if ROW_SCALES:
        s, inv = scales_from_absmax(amax, QUANT)
        if UE8M0:
            s, inv = pow2_scales(s)
        tl.store(q + rows[:, None] * stride_qr + cols[None, :], quantize_values(t, inv[:, None], QUANT), mask=mask)
        tl.store(scale + rows * stride_sr + g * stride_sg, s, mask=row_ok)
    else:
        s, inv = scales_from_absmax(tl.max(amax, axis=0), QUANT)
        if UE8M0:
            s, inv = pow2_scales(s)
        tl.store(q + rows[:, None] * stride_qr + cols[None, :], quantize_values(t, inv, QUANT), mask=mask)
        tl.store(scale + pid_r * stride_sr + g * stride_sg, s)
