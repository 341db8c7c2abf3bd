"""Quantization to FP8 and INT8 (Triton kernels) and reference dequantizers.

`quantize_fp8` / `quantize_int8` return ``(q, scale)`` with ``t ≈ dequantize(q, scale)``:
- granularity "row" (per token): one pass over t, one scale per row; scale has shape (*, 1).
- granularity "tensor": one scale for all of t, a 0-d float32 tensor; dynamic (from the absolute
  maximum: two passes) or static (``scale=`` given: one pass).
A scale maps t onto the target's range: scale = absmax / qmax (qmax 448 for e4m3, 57344 for
e5m2, 127 for int8); conversion saturates and rounds to nearest even (int8 as torch.round);
an all-zero row gets scale 0; a row whose absmax is below qmax * 2^-126 gets scale 2^-126 (the
least normal float32, so 1 / scale stays finite). NaNs do not enter the absmax (a row of NaNs
only gets scale NaN); they stay NaN in FP8 and become 0 in INT8.

Formats for the block-scaled and 4-bit GEMMs (layouts in each function's docstring):
- `quantize_fp8_blockwise`: DeepSeek-V3 block-wise FP8, 1x128 (activations) or 128x128 (weights)
  blocks, float32 or UE8M0 (power-of-two) scales, row- or column-major scale storage (Triton).
- `quantize_int4`, `from_gptq`, `from_awq`: 4-bit weight-only groups, packed two per byte, with
  scales and zero points (torch: weight-time work).
- `quantize_mxfp4`: OCP MX FP4 (e2m1 values, e8m0 scale per 32) (torch).
Dequantizers (`dequantize_*`) are torch references.
"""

from __future__ import annotations

import math

import torch

from .core import validate as v
from .core.config import next_pow2
from .core.plan import PlanCache, contiguous_strides, plan_key
from .core.rows import padded_width
from .core.launcher import CachedLaunch
from .core.tracing import is_compiling as _is_compiling, library as _library

FP8_TARGETS = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
_IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_ONE_PASS_ELEMENTS = 16384  # a program keeps up to this many elements of its rows in registers
_INT32_MAX = 2**31 - 1
_plans = PlanCache()


def quantize_fp8(t, granularity: str = "row", dtype=torch.float8_e4m3fn, scale=None):
    """Quantize t (*, K) (bf16, fp16 or fp32) to `dtype` (float8_e4m3fn or float8_e5m2). scale (static,
    granularity "tensor"): a 1-element float32 tensor holding a positive finite value, which is not read on the
    host (no synchronization: CUDA-graph capturable); 0 gives zeros, a negative one flips signs."""
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.quantize_fp8 (gemmkit.library)
        return _library().traced_quantize_fp8(t, granularity, dtype, scale)
    if dtype not in FP8_TARGETS:
        raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    return _quantize(t, granularity, dtype, FP8_TARGETS[dtype], scale)


def quantize_int8(t, granularity: str = "row", scale=None):
    """Quantize t (*, K) (bf16, fp16 or fp32) to int8 (symmetric, round half to even). scale: as quantize_fp8's."""
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.quantize_int8 (gemmkit.library)
        return _library().traced_quantize_int8(t, granularity, scale)
    return _quantize(t, granularity, torch.int8, "int8", scale)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Reference dequantization (torch ops): q * scale in float32, cast to dtype."""
    return (q.to(torch.float32) * scale.to(torch.float32)).to(dtype)


def _quantize(t, granularity, qdtype, quant, scale, aligned_rows: bool = False):
    """aligned_rows (the ops' dynamic x, (M, K)): q's rows start on 32-byte boundaries (a view of padded
    storage: gemmkit.core.rows)."""
    key = plan_key((t, scale), (granularity, quant, aligned_rows))
    return _plans.plan_for(key, _make_plan, t, granularity, qdtype, quant, scale, aligned_rows)(t, scale)


def _make_plan(t, granularity, qdtype, quant, scale, aligned_rows=False):
    v.check_tensor("t", t, _IN_DTYPES)
    if granularity not in ("row", "tensor"):
        raise ValueError(f"granularity={granularity!r} must be 'row' or 'tensor'")
    if scale is not None:
        v.check_tensor("scale", scale, (torch.float32,))
    check_static_scale(granularity, scale)
    device = v.check_devices(t=t, scale=scale)
    v.check_no_autograd(t=t, scale=scale)
    if t.ndim == 0:
        raise ValueError("t must have at least 1 dimension, got a 0-d tensor")
    if aligned_rows and t.ndim != 2:
        raise ValueError("aligned_rows: t must be 2-D (M, K)")
    return QuantizePlan(t, granularity, qdtype, quant, scale is not None, device, aligned_rows)


def check_static_scale(granularity, scale) -> None:
    """A static scale (scale= given): one element, with granularity "tensor" (the quantizers and their fakes)."""
    if scale is not None and (granularity != "tensor" or scale.numel() != 1):
        raise ValueError("scale= (static quantization) must be a 1-element float32 tensor, with granularity='tensor'")


def _row_strides(t, R: int, C: int):
    """(row stride, column stride, 64-bit indexing needed) of a non-empty t viewed as (R, C)."""
    s_r, s_c = t.reshape(R, C).stride()
    return s_r, s_c, (R - 1) * abs(s_r) + (C - 1) * abs(s_c) > _INT32_MAX or R * C > _INT32_MAX


class QuantizePlan:
    """Quantization of tensors with fixed facts (see gemmkit.core.dense.plan_key)."""

    def __init__(self, t, granularity, qdtype, quant, static, device, aligned_rows=False):
        from .kernels.quant import absmax_kernel, quantize_rows_kernel, quantize_tensor_kernel

        self.shape, self.qdtype, self.device, self.granularity, self.static = t.shape, qdtype, device, granularity, static
        self.q_strides = contiguous_strides(t.shape)
        if aligned_rows:  # (t is (M, K))
            self.q_strides = (padded_width(t.shape[1], qdtype.itemsize), 1)
        self.q_row = self.q_strides[0] if aligned_rows else (t.shape[-1] if t.ndim else 1)
        self.row_scale_shape = (*t.shape[:-1], 1)
        self.row_scale_strides = contiguous_strides(self.row_scale_shape)
        C = t.shape[-1] if t.ndim else 1
        R = t.numel() // C if C else 0
        self.R, self.C = R, C
        self.empty = R == 0 or C == 0
        if self.empty:
            return
        s_r, s_c, index_64 = _row_strides(t, R, C)
        index_64 = index_64 or (R - 1) * self.q_row + C > _INT32_MAX
        di = device.index or 0
        if granularity == "row":
            one_pass = next_pow2(C) <= _ONE_PASS_ELEMENTS
            block_c = next_pow2(C) if one_pass else 4096
            block_r = max(1, min(64, _ONE_PASS_ELEMENTS // block_c)) if one_pass else 1
            warps = 8 if block_r * block_c >= 8192 else 4
            self.rows = CachedLaunch(quantize_rows_kernel, (-(-R // block_r),), warps, 1, di)
            self.rows_tail = (R, C, s_r, s_c, self.q_row, quant, block_r, block_c, one_pass, C % block_c == 0,
                              index_64)
        else:
            block_c = min(4096, next_pow2(C))
            block_r = max(1, min(64, 8192 // block_c))
            grid = (-(-R // block_r),)
            if not static:
                self.absmax = CachedLaunch(absmax_kernel, grid, 4, 1, di)
                self.absmax_tail = (R, C, s_r, s_c, block_r, block_c, C % block_c == 0, index_64)
            self.tensor = CachedLaunch(quantize_tensor_kernel, grid, 4, 1, di)
            self.tensor_tail = (R, C, s_r, s_c, self.q_row, quant, not static, block_r, block_c, C % block_c == 0,
                                index_64)

    def __call__(self, t, scale=None):
        q = torch.empty_strided(self.shape, self.q_strides, dtype=self.qdtype, device=self.device)
        if self.static:  # the given scale is the result's
            out_scale = scale.reshape(())
        elif self.granularity == "row":
            out_scale = torch.empty_strided(self.row_scale_shape, self.row_scale_strides, dtype=torch.float32,
                                            device=self.device)
        else:
            out_scale = torch.zeros((), dtype=torch.float32, device=self.device)
        if self.empty:
            if self.granularity == "row":
                out_scale.zero_()
            return q, out_scale
        t2 = t.reshape(self.R, self.C)
        if self.granularity == "row":
            self.rows((t2, q, out_scale), self.rows_tail)
        elif self.static:
            self.tensor((t2, q, scale, out_scale), self.tensor_tail)
        else:
            amax = torch.zeros((), dtype=torch.float32, device=self.device)
            self.absmax((t2, amax), self.absmax_tail)
            self.tensor((t2, q, amax, out_scale), self.tensor_tail)
        return q, out_scale


# ---------------------------------------------------------------------------------------------
# block-wise FP8 (DeepSeek-V3)

_BLOCKS = ((1, 128), (128, 128))
_SCALE_FORMATS = ("float32", "ue8m0")
_SCALE_LAYOUTS = ("row", "col")
_block_plans = PlanCache()


def quantize_fp8_blockwise(t, block=(1, 128), dtype=torch.float8_e4m3fn, scale_format: str = "float32",
                           scale_layout: str = "row"):
    """Block-wise FP8 quantization (DeepSeek-V3 / DeepGEMM): returns (q, scale), q contiguous of
    t's shape in `dtype` (float8_e4m3fn or float8_e5m2), scale float32.

    - block=(1, 128), activations: t (*, K) bf16/fp16/fp32, any strides; one scale per row and
      128-wide group of K: scale (*, ceil(K / 128)), scale[..., g] covering columns
      [128 g, 128 g + 128) (the last group may be shorter).
    - block=(128, 128), weights: t (N, K) 2-D; scale (ceil(N / 128), ceil(K / 128)), one per
      128x128 block (edge blocks may be smaller).
    scale = absmax / qmax (qmax 448 for e4m3, 57344 for e5m2) as in `quantize_fp8`: an all-zero
    block gets 0, a nonzero absmax below qmax * 2^-126 the scale 2^-126. scale_format="ue8m0":
    the scale rounded up to a power of two, 2^ceil(log2(absmax / qmax)), so that no value
    saturates (what DeepSeek-V3.1 / DeepGEMM use on Hopper), still stored as float32; an
    all-zero block gets 2^-126 (a valid e8m0 exponent; its values quantize to 0, so it
    dequantizes to exact zeros). scale_layout="col": the same logical scale tensor stored
    column-major (scale.t() contiguous for 2-D; for (*, G) the flattened rows are the unit-stride
    dim), the layout TMA engines and torch._scaled_mm's block-wise scaling read.
    Conversion saturates and rounds to nearest even; NaNs are left out of the absmax and stay
    NaN; an inf gives its block scale inf (the block then dequantizes to NaN).
    One Triton pass: each program reads its block once (absmax, scale, convert)."""
    if dtype not in FP8_TARGETS:
        raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.quantize_fp8_blockwise (gemmkit.library)
        return _library().traced_quantize_fp8_blockwise(t, block, dtype, scale_format, scale_layout)
    key = plan_key((t,), (block, dtype, scale_format, scale_layout))
    return _block_plans.plan_for(key, _make_block_plan, t, block, dtype, scale_format, scale_layout)(t)


def _make_block_plan(t, block, dtype, scale_format, scale_layout):
    v.check_tensor("t", t, _IN_DTYPES)
    block = check_block_args(t, block, scale_format, scale_layout)
    device = v.check_devices(t=t)
    v.check_no_autograd(t=t)
    return BlockQuantizePlan(t, block, dtype, scale_format == "ue8m0", scale_layout == "col", device)


def check_block_args(t, block, scale_format, scale_layout) -> tuple:
    """quantize_fp8_blockwise's arguments checked (the op and its fake): the block as a tuple of ints."""
    try:
        block = tuple(int(b) for b in block)
    except (TypeError, ValueError):
        block = None
    if block not in _BLOCKS:
        raise ValueError(f"block must be (1, 128) (activations) or (128, 128) (weights), got {block!r}")
    if scale_format not in _SCALE_FORMATS:
        raise ValueError(f"scale_format={scale_format!r} must be one of {_SCALE_FORMATS}")
    if scale_layout not in _SCALE_LAYOUTS:
        raise ValueError(f"scale_layout={scale_layout!r} must be one of {_SCALE_LAYOUTS}")
    if t.ndim == 0:
        raise ValueError("t must have at least 1 dimension, got a 0-d tensor")
    if block[0] > 1 and t.ndim != 2:
        raise ValueError(f"t must be 2-D (N, K) for block={block}, got shape {tuple(t.shape)}")
    return block


class BlockQuantizePlan:
    """Block-wise quantization of tensors with fixed facts (see gemmkit.core.dense.plan_key)."""

    def __init__(self, t, block, qdtype, ue8m0, col, device):
        from .kernels.quant import quantize_blocks_kernel

        self.shape, self.qdtype, self.device, self.col = t.shape, qdtype, device, col
        self.q_strides = contiguous_strides(t.shape)
        C = t.shape[-1]
        R = t.numel() // C if C else math.prod(t.shape[:-1])
        group = block[1]
        G = -(-C // group)
        row_scales = block[0] == 1
        self.R, self.C = R, C
        self.scale_rows = R if row_scales else -(-R // block[0])
        self.scale_shape = (*t.shape[:-1], G) if row_scales else (self.scale_rows, G)
        self.G = G
        self.empty = R == 0 or C == 0
        if self.empty:
            return
        s_r, s_c, index_64 = _row_strides(t, R, C)
        block_r = min(32, next_pow2(R)) if row_scales else block[0]
        warps = 8 if block_r * group >= 8192 else 4
        grid = (-(-R // block_r), G)
        self.launch = CachedLaunch(quantize_blocks_kernel, grid, warps, 1, device.index or 0)
        s_sr, s_sg = (1, self.scale_rows) if col else (G, 1)
        self.tail = (R, C, s_r, s_c, C, s_sr, s_sg, FP8_TARGETS[qdtype], block_r, group, row_scales, ue8m0,
                     C % group == 0, index_64)

    def __call__(self, t):
        q = torch.empty_strided(self.shape, self.q_strides, dtype=self.qdtype, device=self.device)
        rows, G = self.scale_rows, self.G
        if self.col:  # (rows, G) with unit stride down the rows, viewed as the logical shape
            scale = torch.empty((G, rows), dtype=torch.float32, device=self.device).t().view(self.scale_shape)
        else:
            scale = torch.empty(self.scale_shape, dtype=torch.float32, device=self.device)
        if self.empty:
            return q, scale.zero_()
        self.launch((t.reshape(self.R, self.C), q, scale), self.tail)
        return q, scale


def dequantize_fp8_blockwise(q, scale, block=(1, 128), dtype=torch.float32):
    """Reference (torch) dequantization of `quantize_fp8_blockwise`'s result: q (*, K) (block
    (1, 128)) or (N, K) (block (128, 128)), scale as returned (any strides); q * scale of its
    block, computed in float32, cast to dtype."""
    v.check_tensor("q", q, tuple(FP8_TARGETS))
    v.check_tensor("scale", scale, (torch.float32,))
    block = tuple(block) if isinstance(block, (tuple, list)) else block
    if block not in _BLOCKS:
        raise ValueError(f"block must be (1, 128) or (128, 128), got {block!r}")
    if q.ndim == 0 or (block[0] > 1 and q.ndim != 2):
        raise ValueError(f"q has shape {tuple(q.shape)}: block {block} needs {'(N, K)' if block[0] > 1 else '(*, K)'}")
    K = q.shape[-1]
    lead = q.shape[:-1] if block[0] == 1 else (-(-q.shape[0] // block[0]),)
    want = (*lead, -(-K // block[1]))
    if tuple(scale.shape) != want:
        raise ValueError(f"scale must have shape {want} for q of shape {tuple(q.shape)} and block {block}, "
                         f"got {tuple(scale.shape)}")
    s = scale.repeat_interleave(block[1], dim=-1)[..., :K]
    if block[0] > 1:
        s = s.repeat_interleave(block[0], dim=0)[: q.shape[0]]
    return (q.to(torch.float32) * s).to(dtype)


# ---------------------------------------------------------------------------------------------
# 4-bit weights (torch: quantization and import run once per weight, at load time)

_INT4_GROUPS = (32, 64, 128)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ int32 holds logical column 8c + AWQ_ORDER[i]
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # logical column 8c + j sits at nibble AWQ_REVERSE_ORDER[j]


def _same_device(**tensors) -> None:
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first = (name, t.device)
        elif t.device != first[1]:
            raise ValueError(f"{name} is on {t.device} but {first[0]} is on {first[1]}")


def _check_2d(name, t, dtypes):
    v.check_tensor(name, t, dtypes)
    if t.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Pack integers 0..15 (N, K) (K even, any integer dtype) into uint8 (N, K // 2): element
    2j in the low nibble of byte j, element 2j + 1 in the high nibble."""
    q = q.to(torch.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def unpack_int4(w_q: torch.Tensor) -> torch.Tensor:
    """Unpack uint8 (N, K // 2) (`pack_int4`'s layout) into uint8 (N, K) with values 0..15."""
    _check_2d("w_q", w_q, (torch.uint8,))
    return torch.stack((w_q & 15, w_q >> 4), dim=-1).reshape(w_q.shape[0], 2 * w_q.shape[1])


def _group_size(group_size, K: int, allowed=None) -> int:
    if group_size is None or (isinstance(group_size, int) and not isinstance(group_size, bool) and group_size == -1):
        return K
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0 \
            or (allowed is not None and group_size not in allowed):
        raise ValueError(f"group_size={group_size!r} must be one of {allowed or 'the positive integers'} "
                         "or None / -1 (one group per channel)")
    if K % group_size:
        raise ValueError(f"group_size={group_size} must divide K={K}")
    return group_size


def quantize_int4(w, group_size=128, symmetric: bool = False):
    """INT4 weight-only quantization (GPTQ/AWQ-compatible groups): returns (w_q, w_scale, w_zero).

    w (N, K) bf16/fp16/fp32, finite, K even and a multiple of group_size (32, 64, 128, or
    None / -1: one group of K per channel). Group g of row n covers columns
    [g * group_size, (g + 1) * group_size).
    - w_q uint8 (N, K // 2): unsigned 4-bit values, element 2j in the low nibble of byte j,
      2j + 1 in the high nibble (`unpack_int4`).
    - w_scale (N, K // group_size) in w's dtype.
    - w_zero uint8 (N, K // group_size), zero points in [0, 15]; None when symmetric.
    Dequantization: w ≈ (q - z) * s, z = w_zero (8 when symmetric). Asymmetric (GPTQ's min/max
    rule, zero always representable): lo = min(min(group), 0), hi = max(max(group), 0),
    s = (hi - lo) / 15 rounded to w's dtype, z = clamp(round(-lo / s), 0, 15),
    q = clamp(round(w / s) + z, 0, 15). Symmetric: s = absmax / 7 rounded to w's dtype,
    q = clamp(round(w / s), -8, 7) + 8. Rounding is half to even (torch.round), computed in
    float32 with the stored (rounded) scale. An all-zero group gets s = 0 and q = z (z = 0
    when asymmetric), which dequantizes to exact zeros."""
    _check_2d("w", w, _IN_DTYPES)
    N, K = w.shape
    if K == 0 or K % 2:
        raise ValueError(f"w has K={K}: K must be even and positive (two values per byte)")
    gs = _group_size(group_size, K, _INT4_GROUPS)
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be a bool, got {type(symmetric).__name__}")
    wf = w.detach().to(torch.float32).reshape(N, K // gs, gs)
    if not torch.isfinite(wf).all():
        raise ValueError("w has NaN or inf values: INT4 groups need finite weights")
    if symmetric:
        s = (wf.abs().amax(dim=-1) / 7).to(w.dtype)
        sf = s.to(torch.float32)[..., None]
        q = torch.where(sf > 0, wf / sf, 0.0).round().clamp(-8, 7) + 8
        z = None
    else:
        lo = wf.amin(dim=-1).clamp(max=0.0)
        hi = wf.amax(dim=-1).clamp(min=0.0)
        s = ((hi - lo) / 15).to(w.dtype)
        sf = s.to(torch.float32)
        zf = torch.where(sf > 0, -lo / sf, 0.0).round().clamp(0, 15)
        q = (torch.where(sf[..., None] > 0, wf / sf[..., None], 0.0).round() + zf[..., None]).clamp(0, 15)
        z = zf.to(torch.uint8)
    return pack_int4(q.reshape(N, K)), s, z


def dequantize_int4(w_q, w_scale, w_zero=None, group_size=128, dtype=torch.float32):
    """Reference (torch) dequantization: w_q uint8 (N, K // 2) (`quantize_int4`'s packing),
    w_scale (N, K // group_size) bf16/fp16/fp32, w_zero uint8 (N, K // group_size) or None
    (symmetric: zero point 8); group_size None / -1 means one group of K. Returns
    (q - z) * s (N, K), computed in float32, cast to dtype."""
    _check_2d("w_q", w_q, (torch.uint8,))
    _check_2d("w_scale", w_scale, _IN_DTYPES)
    N, K = w_q.shape[0], 2 * w_q.shape[1]
    gs = _group_size(group_size, K)
    if tuple(w_scale.shape) != (N, K // gs):
        raise ValueError(f"w_scale must have shape {(N, K // gs)} for w_q {tuple(w_q.shape)} and "
                         f"group_size={group_size}, got {tuple(w_scale.shape)}")
    if w_zero is not None:
        _check_2d("w_zero", w_zero, (torch.uint8,))
        if w_zero.shape != w_scale.shape:
            raise ValueError(f"w_zero must have w_scale's shape {tuple(w_scale.shape)}, got {tuple(w_zero.shape)}")
    _same_device(w_q=w_q, w_scale=w_scale, w_zero=w_zero)
    q = unpack_int4(w_q).to(torch.float32).reshape(N, K // gs, gs)
    z = 8.0 if w_zero is None else w_zero.to(torch.float32)[..., None]
    return ((q - z) * w_scale.to(torch.float32)[..., None]).reshape(N, K).to(dtype)


def _unpack_int32_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int32 (R, C) -> int64 (R, 8 C): nibble i (bits [4i, 4i + 4)) of packed[:, c] at column 8c + i."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=packed.device)
    return ((packed.to(torch.int64)[..., None] >> shifts) & 15).reshape(packed.shape[0], 8 * packed.shape[1])


def _check_packed(qweight, qzeros, scales, K: int, N: int):
    """(G, group_size) after checking the shapes shared by the GPTQ and AWQ layouts."""
    if scales.ndim != 2 or scales.shape[1] != N or scales.shape[0] == 0:
        raise ValueError(f"scales must have shape (G, N={N}), got {tuple(scales.shape)}")
    G = scales.shape[0]
    if K % G:
        raise ValueError(f"scales has {G} groups, which do not divide K={K}")
    if tuple(qzeros.shape) != (G, N // 8):
        raise ValueError(f"qzeros must have shape (G, N // 8) = {(G, N // 8)}, got {tuple(qzeros.shape)}")
    _same_device(qweight=qweight, qzeros=qzeros, scales=scales)
    return G, K // G


def from_gptq(qweight, qzeros, scales, g_idx=None, bits: int = 4):
    """Import a GPTQ (AutoGPTQ / GPTQModel "v1" format) 4-bit layer into gemmkit's INT4 layout:
    returns (w_q, w_scale, w_zero, group_size, perm), dequantizing to w = (q - z) * s as
    `dequantize_int4(w_q, w_scale, w_zero, group_size)`.

    - qweight int32 (K // 8, N): value k of column n at bits [4i, 4i + 4) of qweight[k // 8, n],
      i = k % 8.
    - qzeros int32 (G, N // 8): zero of column n at nibble n % 8 of qzeros[g, n // 8], stored as
      z - 1 (the v1 off-by-one): the zero is the stored nibble + 1, so w_zero lies in [1, 16]
      (16 where the nibble is 15, as AutoGPTQ's own kernels compute; kernels must read w_zero
      as a byte, not a nibble).
    - scales (G, N) fp16 (bf16/fp32 accepted): w_scale = scales.T, same dtype.
    - g_idx (K,) int: the group of each input channel (act-order). When it is not
      arange(K) // group_size, K is permuted once so that groups are contiguous (stable sort by
      g_idx) and perm (int64 (K,)) is returned: y = x[..., perm] @ dequantized.T. Each group must
      have group_size channels. Otherwise perm is None.
    group_size = K // G."""
    if bits != 4:
        raise ValueError(f"bits={bits!r}: only 4-bit GPTQ checkpoints are supported")
    _check_2d("qweight", qweight, (torch.int32,))
    _check_2d("qzeros", qzeros, (torch.int32,))
    _check_2d("scales", scales, _IN_DTYPES)
    K, N = 8 * qweight.shape[0], qweight.shape[1]
    if N % 8:
        raise ValueError(f"qweight has N={N} columns: GPTQ packs qzeros 8 columns per int32, N must be a multiple of 8")
    G, gs = _check_packed(qweight, qzeros, scales, K, N)
    q = _unpack_int32_nibbles(qweight.t())  # (N, K)
    zero = (_unpack_int32_nibbles(qzeros) + 1).t().to(torch.uint8)
    perm = None
    if g_idx is not None:
        v.check_tensor("g_idx", g_idx, (torch.int32, torch.int64))
        if tuple(g_idx.shape) != (K,):
            raise ValueError(f"g_idx must have shape (K,) = ({K},), got {tuple(g_idx.shape)}")
        _same_device(qweight=qweight, g_idx=g_idx)
        g_idx = g_idx.to(torch.int64)
        if ((g_idx < 0) | (g_idx >= G)).any():
            raise ValueError(f"g_idx has groups outside [0, {G})")
        if not torch.equal(g_idx, torch.arange(K, device=g_idx.device) // gs):
            if not (torch.bincount(g_idx, minlength=G) == gs).all():
                raise ValueError(f"g_idx must give every group group_size={gs} channels")
            perm = torch.sort(g_idx, stable=True).indices
            q = q[:, perm]
    return pack_int4(q), scales.t().contiguous(), zero.contiguous(), gs, perm


def _unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """AWQ int32 (R, C) -> int64 (R, 8 C) in logical column order (undoing AWQ_ORDER)."""
    R = packed.shape[0]
    C = packed.shape[1]
    return _unpack_int32_nibbles(packed).reshape(R, C, 8)[..., list(AWQ_REVERSE_ORDER)].reshape(R, 8 * C)


def from_awq(qweight, qzeros, scales):
    """Import an AWQ (llm-awq / AutoAWQ GEMM format) 4-bit layer into gemmkit's INT4 layout:
    returns (w_q, w_scale, w_zero, group_size, perm=None), dequantizing to w = (q - z) * s.

    - qweight int32 (K, N // 8), packed along N in AutoAWQ's interleaved order: nibble i (bits
      [4i, 4i + 4)) of qweight[k, c] holds column 8c + AWQ_ORDER[i], AWQ_ORDER =
      (0, 2, 4, 6, 1, 3, 5, 7); equivalently column 8c + j sits at nibble AWQ_REVERSE_ORDER[j] =
      (0, 4, 1, 5, 2, 6, 3, 7)[j] (AutoAWQ's unpack + reverse_awq_order).
    - qzeros int32 (G, N // 8), packed the same way; zero points as stored (no off-by-one).
    - scales (G, N) fp16 (bf16/fp32 accepted): w_scale = scales.T.
    group_size = K // G."""
    _check_2d("qweight", qweight, (torch.int32,))
    _check_2d("qzeros", qzeros, (torch.int32,))
    _check_2d("scales", scales, _IN_DTYPES)
    K, N = qweight.shape[0], 8 * qweight.shape[1]
    if K % 2:
        raise ValueError(f"qweight has K={K} rows: K must be even (two values per byte)")
    G, gs = _check_packed(qweight, qzeros, scales, K, N)
    q = _unpack_awq(qweight).t()
    zero = _unpack_awq(qzeros).t().to(torch.uint8).contiguous()
    return pack_int4(q), scales.t().contiguous(), zero, gs, None


# ---------------------------------------------------------------------------------------------
# MXFP4 (OCP Microscaling Formats v1.0: e2m1 elements, one e8m0 scale per 32)

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# |v| past a bound moves up one code: ties round to the even code (">" where the lower code is
# even, ">=" where it is odd)
_E2M1_BOUNDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))
MX_BLOCK = 32


def e2m1_values(device=None, dtype=torch.float32) -> torch.Tensor:
    """The 16 e2m1 values by code (bit 3 the sign, bits 0-2 the magnitude): 0, 0.5, 1, 1.5, 2,
    3, 4, 6, then -0, -0.5, ..., -6."""
    mags = torch.tensor(_E2M1, dtype=torch.float32, device=device)
    return torch.cat((mags, -mags)).to(dtype)


def _pow2(n: torch.Tensor) -> torch.Tensor:
    """2^n as float32 for integers -126 <= n <= 127 (exact: built from the exponent bits)."""
    return ((n.to(torch.int32) + 127) << 23).view(torch.float32)


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """uint8 e8m0 -> float32: 2^(e - 127) (e = 0: 2^-127, a float32 subnormal); 255 is NaN."""
    e = scale.to(torch.int32)
    bits = torch.where(e == 0, 1 << 22, e << 23)
    return torch.where(e == 255, float("nan"), bits.view(torch.float32))


def quantize_mxfp4(t):
    """MXFP4 quantization (OCP MX): returns (q, scale) for t (*, K) bf16/fp16/fp32, K % 32 == 0.

    - q uint8 (*, K // 2): e2m1 codes (`e2m1_values`), element 2j in the low nibble of byte j,
      2j + 1 in the high nibble (as gpt-oss checkpoints store them).
    - scale uint8 (*, K // 32): e8m0, the block of 32 elements [32 b, 32 b + 32) is scaled by
      2^(scale - 127).
    Per the spec, the scale exponent is floor(log2(absmax)) - 2 (2 = e2m1's largest exponent),
    clamped to the e8m0 range [-127, 127]; elements are v / 2^exponent rounded to the nearest
    e2m1 value, ties to the even code, saturating to ±6 (absmax / scale lies in [4, 8), so the
    largest values of a block can saturate). An all-zero block gets scale 0 (2^-127) and
    codes 0. e2m1 has no NaN or inf: a block holding either gets scale 255 (NaN), codes 0, and
    dequantizes to NaN. Values that round to zero are coded +0.
    Vectorized torch (no Triton kernel yet): a weight-time conversion here; activations for an
    FP4 GEMM would want an in-kernel or Triton quantizer."""
    v.check_tensor("t", t, _IN_DTYPES)
    if t.ndim == 0:
        raise ValueError("t must have at least 1 dimension, got a 0-d tensor")
    K = t.shape[-1]
    if K % MX_BLOCK:
        raise ValueError(f"t has K={K}: MXFP4 needs K to be a multiple of {MX_BLOCK}")
    x = t.detach().to(torch.float32).reshape(*t.shape[:-1], K // MX_BLOCK, MX_BLOCK)
    amax = x.abs().amax(dim=-1)
    finite = torch.isfinite(x).all(dim=-1)
    exp = torch.frexp(amax).exponent - 1 - 2  # amax = m 2^e with m in [0.5, 1): floor(log2) = e - 1
    exp = torch.where(amax > 0, exp, -127).clamp(-127, 127)
    scale = torch.where(finite, exp + 127, 255).to(torch.uint8)
    vals = x * _pow2(torch.where(finite, -exp, 0).clamp(max=127))[..., None]  # exact: a power of two
    vals = torch.where(finite[..., None], vals, 0.0)
    mag = vals.abs()
    code = torch.zeros(mag.shape, dtype=torch.uint8, device=t.device)
    for bound, inclusive in _E2M1_BOUNDS:
        code += (mag >= bound) if inclusive else (mag > bound)
    code = torch.where((vals < 0) & (code > 0), code | 8, code).reshape(*t.shape[:-1], K)
    return code[..., 0::2] | (code[..., 1::2] << 4), scale


def dequantize_mxfp4(q, scale, dtype=torch.float32):
    """Reference (torch) dequantization of `quantize_mxfp4`'s result: q uint8 (*, K // 2),
    scale uint8 (*, K // 32); returns e2m1(q) * 2^(scale - 127) (*, K) in dtype."""
    v.check_tensor("q", q, (torch.uint8,))
    v.check_tensor("scale", scale, (torch.uint8,))
    if q.ndim == 0:
        raise ValueError("q must have at least 1 dimension, got a 0-d tensor")
    K = 2 * q.shape[-1]
    want = (*q.shape[:-1], K // MX_BLOCK)
    if K % MX_BLOCK or tuple(scale.shape) != want:
        raise ValueError(f"scale must have shape {want} for q of shape {tuple(q.shape)} (K = {K}, a multiple "
                         f"of {MX_BLOCK}), got {tuple(scale.shape)}")
    _same_device(q=q, scale=scale)
    codes = torch.stack((q & 15, q >> 4), dim=-1).reshape(*q.shape[:-1], K // MX_BLOCK, MX_BLOCK)
    vals = e2m1_values(q.device)[codes.to(torch.int64)] * e8m0_to_float(scale)[..., None]
    return vals.reshape(*q.shape[:-1], K).to(dtype)
