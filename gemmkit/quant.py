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
from .core.dense import PlanCache, contiguous_strides, plan_key
from .core.launcher import CachedLaunch

FP8_TARGETS = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
_IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_ONE_PASS_ELEMENTS = 16384  # a program keeps up to this many elements of its rows in registers
_INT32_MAX = 2**31 - 1
_plans = PlanCache()


def quantize_fp8(t, granularity: str = "row", dtype=torch.float8_e4m3fn, scale=None):
    """Quantize t (*, K) (bf16, fp16 or fp32) to `dtype` (float8_e4m3fn or float8_e5m2)."""
    if dtype not in FP8_TARGETS:
        raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    return _quantize(t, granularity, dtype, FP8_TARGETS[dtype], scale)


def quantize_int8(t, granularity: str = "row", scale=None):
    """Quantize t (*, K) (bf16, fp16 or fp32) to int8 (symmetric, round half to even)."""
    return _quantize(t, granularity, torch.int8, "int8", scale)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Reference dequantization (torch ops): q * scale in float32, cast to dtype."""
    return (q.to(torch.float32) * scale.to(torch.float32)).to(dtype)


def _quantize(t, granularity, qdtype, quant, scale):
    key = plan_key((t, scale), (granularity, quant))
    return _plans.plan_for(key, _make_plan, t, granularity, qdtype, quant, scale)(t, scale)


def _make_plan(t, granularity, qdtype, quant, scale):
    v.check_tensor("t", t, _IN_DTYPES)
    if granularity not in ("row", "tensor"):
        raise ValueError(f"granularity={granularity!r} must be 'row' or 'tensor'")
    if scale is not None:
        v.check_tensor("scale", scale, (torch.float32,))
        if granularity != "tensor" or scale.numel() != 1:
            raise ValueError("scale= (static quantization) must be a 1-element float32 tensor, with granularity='tensor'")
    device = v.check_devices(t=t, scale=scale)
    v.check_no_autograd(t=t, scale=scale)
    if t.ndim == 0:
        raise ValueError("t must have at least 1 dimension, got a 0-d tensor")
    return QuantizePlan(t, granularity, qdtype, quant, scale is not None, device)


class QuantizePlan:
    """Quantization of tensors with fixed facts (see gemmkit.core.dense.plan_key)."""

    def __init__(self, t, granularity, qdtype, quant, static, device):
        from .kernels.quant import absmax_kernel, quantize_rows_kernel, quantize_tensor_kernel

        self.shape, self.qdtype, self.device, self.granularity, self.static = t.shape, qdtype, device, granularity, static
        self.q_strides = contiguous_strides(t.shape)
        self.row_scale_shape = (*t.shape[:-1], 1)
        self.row_scale_strides = contiguous_strides(self.row_scale_shape)
        C = t.shape[-1] if t.ndim else 1
        R = t.numel() // C if C else 0
        self.R, self.C = R, C
        self.empty = R == 0 or C == 0
        if self.empty:
            return
        t2 = t.reshape(R, C)
        s_r, s_c = t2.stride()
        index_64 = (R - 1) * abs(s_r) + (C - 1) * abs(s_c) > _INT32_MAX or R * C > _INT32_MAX
        di = device.index or 0
        if granularity == "row":
            one_pass = next_pow2(C) <= _ONE_PASS_ELEMENTS
            block_c = next_pow2(C) if one_pass else 4096
            block_r = max(1, min(64, _ONE_PASS_ELEMENTS // block_c)) if one_pass else 1
            warps = 8 if block_r * block_c >= 8192 else 4
            self.rows = CachedLaunch(quantize_rows_kernel, (-(-R // block_r),), warps, 1, di)
            self.rows_tail = (R, C, s_r, s_c, C, quant, block_r, block_c, one_pass, C % block_c == 0, index_64)
        else:
            block_c = min(4096, next_pow2(C))
            block_r = max(1, min(64, 8192 // block_c))
            grid = (-(-R // block_r),)
            if not static:
                self.absmax = CachedLaunch(absmax_kernel, grid, 4, 1, di)
                self.absmax_tail = (R, C, s_r, s_c, block_r, block_c, C % block_c == 0, index_64)
            self.tensor = CachedLaunch(quantize_tensor_kernel, grid, 4, 1, di)
            self.tensor_tail = (R, C, s_r, s_c, C, quant, not static, block_r, block_c, C % block_c == 0, index_64)

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
    key = plan_key((t,), (block, dtype, scale_format, scale_layout))
    return _block_plans.plan_for(key, _make_block_plan, t, block, dtype, scale_format, scale_layout)(t)


def _make_block_plan(t, block, dtype, scale_format, scale_layout):
    v.check_tensor("t", t, _IN_DTYPES)
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
    device = v.check_devices(t=t)
    v.check_no_autograd(t=t)
    if t.ndim == 0:
        raise ValueError("t must have at least 1 dimension, got a 0-d tensor")
    if block[0] > 1 and t.ndim != 2:
        raise ValueError(f"t must be 2-D (N, K) for block={block}, got shape {tuple(t.shape)}")
    return BlockQuantizePlan(t, block, dtype, scale_format == "ue8m0", scale_layout == "col", device)


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
        t2 = t.reshape(R, C)
        s_r, s_c = t2.stride()
        index_64 = (R - 1) * abs(s_r) + (C - 1) * abs(s_c) > _INT32_MAX or R * C > _INT32_MAX
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
