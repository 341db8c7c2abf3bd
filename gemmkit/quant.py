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
"""

from __future__ import annotations

import torch

from .core import validate as v
from .core.config import next_pow2
from .core.dense import PlanCache, contiguous_strides, plan_key
from .core.launcher import CachedLaunch
from .core.tracing import is_compiling as _is_compiling, library as _library

FP8_TARGETS = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
_IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_ONE_PASS_ELEMENTS = 16384  # a program keeps up to this many elements of its rows in registers
_INT32_MAX = 2**31 - 1
_plans = PlanCache()


def quantize_fp8(t, granularity: str = "row", dtype=torch.float8_e4m3fn, scale=None):
    """Quantize t (*, K) (bf16, fp16 or fp32) to `dtype` (float8_e4m3fn or float8_e5m2)."""
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.quantize_fp8 (gemmkit.library)
        return _library().traced_quantize_fp8(t, granularity, dtype, scale)
    if dtype not in FP8_TARGETS:
        raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    return _quantize(t, granularity, dtype, FP8_TARGETS[dtype], scale)


def quantize_int8(t, granularity: str = "row", scale=None):
    """Quantize t (*, K) (bf16, fp16 or fp32) to int8 (symmetric, round half to even)."""
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.quantize_int8 (gemmkit.library)
        return _library().traced_quantize_int8(t, granularity, scale)
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
