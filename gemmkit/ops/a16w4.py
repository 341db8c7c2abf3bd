"""A16W4: bf16/fp16 activations, INT4 weights in groups (GPTQ/AWQ-compatible), fp32 accumulation.

The packed weight tile is unpacked and dequantized in registers inside the K loop (no 4-bit tensor
cores on Hopper), so HBM carries 4 bits per weight plus the group scales (and zero points).
"""

from __future__ import annotations

import torch

from ..core import validate as v
from ..core.config import next_pow2, resolve_config
from ..core.dense import DensePlan
from ..core.device import device_info
from ..core.epilogue import EpilogueSpec
from ..core.formats import Scale, dense, packed4
from ..core.hopper_w4 import W4DecodePlan, W4PrefillPlan, W4TilePlan, w4_decode_ok, w4_prefill_ok, w4_tile_ok
from ..core.plan import PlanCache, plan_key
from ..core.tracing import is_compiling as _is_compiling, library as _library
from .packed_prefill import DEQUANT_MIN_M, DequantThenGemm

OP = "a16w4"
_IN_DTYPES = (torch.bfloat16, torch.float16)
_SCALE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_BIAS_DTYPES = v.BIAS_DTYPES
_plans = PlanCache()


def gemm_a16w4(x, w_q, w_scale, w_zero=None, *, group_size=128, bias=None, activation=None, out_dtype=None, y=None,
               config=None):
    """activation(x @ dequant(w).T + bias), dequant(w) = (q - z) * s per row and K group.

    x: (M, K) (or (*, K)) bf16/fp16. w_q: uint8 (N, K // 2), K-contiguous, two 4-bit values per
    byte: element 2j in the low nibble of byte j, 2j + 1 in the high one (gemmkit.quant.quantize_int4,
    from_gptq, from_awq). group_size: a power of two >= 32 dividing K (32, 64, 128 as GPTQ/AWQ
    use), or None / -1: one group per output channel. w_scale: (N, K // group_size) bf16/fp16/fp32,
    any layout, used in x's dtype (a float32 scale is rounded to it first: the weight is x's dtype((q - z) *
    x's dtype(s)), as a dequantization to x's dtype with scales stored in it). w_zero: uint8 (N, K // group_size) zero points, or None: symmetric, zero point 8;
    exact up to 127 with bf16 x, 255 with fp16 x (4-bit formats use 0..16: GPTQ's reach 16). bias: (N,) bf16/fp16/fp32. activation: None, "relu",
    "gelu_tanh", "silu". out_dtype: bf16/fp16/fp32 (default y's, else x's). y: optional output.
    config: None (on sm_90 at decode sizes the Hopper decode kernel and from 65 to 511 rows (1023 on
    wide layers) the Hopper prefill kernel, from 512 to 1024 where its tiles fill their waves (and no activation)
    the warp-specialized GEMM with the weight as A, core/hopper_w4.py; else the tuned table "a16w4", else derived; from M =
    DEQUANT_MIN_M rows, where no Hopper kernel takes the call, the weight is dequantized in one pass and
    the A16W16 GEMM runs on it: ops/packed_prefill.py), a dict or a GemmConfig (always the fused tl
    kernel). Differentiable in x and bias (the weight frozen; gemmkit.autograd): dx = dy @ dequant(w).
    """
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.gemm_a16w4 (gemmkit.library)
        return _library().traced_gemm_a16w4(x, w_q, w_scale, w_zero, group_size, bias, activation, out_dtype, y,
                                            config)
    key = plan_key((x, w_q, w_scale, w_zero, bias, y),
                   (group_size, type(group_size), activation, out_dtype,
                    None if config is None else v.config_key(config)))
    try:
        plan = _plans.lookup(key)
    except (KeyError, TypeError):  # a new plan (validates), or no key (bad input)
        plan = _plans.plan_for(key, _make_plan, x, w_q, w_scale, w_zero, group_size, bias, y, activation, out_dtype,
                               config)
    return plan.run(x, w_q, bias, y, None, w_scale, None, None, None, None, None, w_zero)  # (.., c2, b2, cat_src, b_zero)


def _grad_plan(x, w_q, w_scale, w_zero, group_size, bias, y, activation, out_dtype, config):
    """Calls whose x or bias require grad (the weight frozen): through gemmkit.autograd."""
    from .. import autograd

    g = check_group_size(group_size, x.shape[-1]) if x.ndim and x.shape[-1] else 1
    return autograd.frozen_plan("gemm_a16w4", w_scale, y, config, lambda: _make_plan(
        x, w_q, w_scale, w_zero, group_size, bias, None, activation, out_dtype, None),
        lambda x, w_q, bias, y, _xs, w_scale, *rest: autograd.gemm_a16w4(x, w_q, w_scale, rest[-1], g, bias,
                                                                          activation, out_dtype))


def check_group_size(group_size, K: int) -> int:
    """The group size (K for None / -1), checked against K."""
    if group_size is None or (type(group_size) is int and group_size == -1):
        return K
    if type(group_size) is not int or group_size < 32 or group_size & (group_size - 1):
        raise ValueError(f"group_size={group_size!r} must be a power of two >= 32 (32, 64, 128 as GPTQ/AWQ use), "
                         "or None / -1 (one group per output channel)")
    if K % group_size:
        raise ValueError(f"K={K} is not a multiple of group_size={group_size}")
    return group_size


def check_packed_weight(name: str, w, K: int) -> int:
    """N of a packed 4-bit weight uint8 (N, K // 2), K-contiguous."""
    v.check_tensor(name, w, (torch.uint8,))
    if w.ndim != 2:
        raise ValueError(f"{name} must be 2-D uint8 (N, K // 2), two 4-bit values per byte; got shape "
                         f"{tuple(w.shape)}")
    if K % 2 or w.shape[1] != K // 2:
        raise ValueError(f"{name} has shape {tuple(w.shape)}: for x's K={K} it must be (N, {K / 2:g}) "
                         "(two 4-bit values per byte, K even)")
    if w.shape[1] > 1 and w.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous along K (stride 1 along its bytes; call .contiguous())")
    return w.shape[0]


def check_group_tensor(name: str, t, shape, dtypes, what: str) -> None:
    v.check_tensor(name, t, dtypes)
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {tuple(shape)} ({what})")


def output_checks(x2, lead, N: int, K: int, bias, y, out_dtype, default_dtype, device, activation):
    """(out_dtype, y as (M, N) or None, a DegeneratePlan when M, N or K is 0 else None) after
    checking bias, out_dtype, y and x's layout."""
    M = x2.shape[0]
    v.check_bias(bias, N, _BIAS_DTYPES)
    out_dtype = v.check_out_dtype(out_dtype, y, default_dtype)
    y2 = v.check_out(y, lead, M, N, out_dtype, device)
    if M == 0 or N == 0 or K == 0:
        return out_dtype, y2, v.DegeneratePlan((*lead, N), out_dtype, device, activation)
    v.check_layout("x", x2)
    if y2 is not None:
        v.check_layout("y", y2)
    return out_dtype, y2, None


def _make_plan(x, w_q, w_scale, w_zero, group_size, bias, y, activation, out_dtype, config):
    if v.needs_grad(x, w_scale, bias):
        return _grad_plan(x, w_q, w_scale, w_zero, group_size, bias, y, activation, out_dtype, config)
    v.check_tensor("x", x, _IN_DTYPES)
    activation = v.check_activation(activation)
    device = v.check_devices(x=x, w_q=w_q, w_scale=w_scale, w_zero=w_zero, bias=bias, y=y)
    v.check_no_autograd(x=x, w_scale=w_scale, bias=bias, y=y)
    x2, lead = v.as_rows("x", x)
    M, K = x2.shape
    N = check_packed_weight("w_q", w_q, K)
    g = check_group_size(group_size, K) if K else 1
    groups = K // g if K else 0
    what = f"one per output channel and {g}-wide K group"
    check_group_tensor("w_scale", w_scale, (N, groups), _SCALE_DTYPES, what)
    if w_zero is not None:
        check_group_tensor("w_zero", w_zero, (N, groups), (torch.uint8,), what + ", uint8 zero points")
    out_dtype, y2, degenerate = output_checks(x2, lead, N, K, bias, y, out_dtype, x.dtype, device, activation)
    if degenerate:
        return degenerate
    dev = device_info(device)
    if w4_prefill_ok(dev, x2, w_q, M, N, K, g, config):
        return W4PrefillPlan(dev, x2, w_q, w_zero, y2, M, N, K, g, bias, activation, out_dtype, (*lead, N),
                             x.ndim != 2)
    if w4_tile_ok(dev, x2, w_q, M, N, K, g, config, activation):
        return W4TilePlan(dev, x2, w_q, w_scale, w_zero, y2, M, N, K, g, bias, out_dtype, (*lead, N), x.ndim != 2)
    if config is None and M >= DEQUANT_MIN_M:
        return DequantThenGemm(w_q, w_scale, w_zero, g if g != K else next_pow2(K), True, x.dtype, activation,
                               out_dtype)
    if w4_decode_ok(dev, x2, w_q, M, N, K, g, config):
        return W4DecodePlan(dev, x2, w_q, w_zero, y2, M, N, K, g, bias, activation, out_dtype, (*lead, N),
                            x.ndim != 2)
    a_fmt = dense(x.dtype)
    b_fmt = packed4(x.dtype, Scale.GROUP, g if g != K else next_pow2(K))
    cfg = resolve_config(OP, config, M, N, K, dev, a_fmt, b_fmt, out_dtype.itemsize)
    example_y = y2 if y2 is not None else torch.empty((M, N), dtype=out_dtype, device=device)
    return DensePlan(x2, w_q, example_y, a_fmt, b_fmt, EpilogueSpec(activation, bias is not None), cfg, dev,
                     out_dtype=out_dtype, out_shape=(*lead, N), flatten_x=x.ndim != 2,
                     inputs=dict(bias=bias, b_scale=w_scale, b_zero=w_zero), auto_config=config is None)
