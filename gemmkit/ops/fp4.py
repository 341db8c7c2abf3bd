"""MXFP4 GEMMs: A16WFP4 (bf16/fp16 activations, MXFP4 weights) and AFP4WFP4 (both MXFP4).

MXFP4 (OCP MX, gemmkit.quant.quantize_mxfp4): uint8 (R, K // 2) e2m1 codes, element 2j in the
low nibble of byte j; uint8 (R, K // 32) e8m0 scales 2^(e - 127), one per 32 along K. Hopper has
no FP4 tensor cores: the tiles are decoded to 16-bit values in registers inside the K loop (HBM
carries 4 bits per value) and multiplied with bf16/fp16 dots, fp32 accumulation.
"""

from __future__ import annotations

import torch

from ..core import validate as v
from ..core.config import resolve_config
from ..core.dense import DensePlan
from ..core.hopper_w4 import W4DecodePlan, W4PrefillPlan, W4TilePlan, w4_decode_ok, w4_prefill_ok, w4_tile_ok
from ..core.device import device_info
from ..core.epilogue import EpilogueSpec
from ..core.formats import Scale, dense, packed4
from ..core.plan import PlanCache, plan_key
from ..core.tracing import is_compiling as _is_compiling, library as _library
from .a16w4 import check_group_tensor, check_packed_weight, output_checks
from .packed_prefill import DEQUANT_MIN_M, DequantThenGemm

MX_BLOCK = 32
_IN_DTYPES = (torch.bfloat16, torch.float16)
_plans = PlanCache()


def gemm_a16wfp4(x, w, w_scale, *, bias=None, activation=None, out_dtype=None, y=None, config=None):
    """activation(x @ dequant(w).T + bias), dequant(w) = e2m1(w) * 2^(w_scale - 127) per 32 along K.

    x: (M, K) (or (*, K)) bf16/fp16, K a multiple of 32. w: uint8 (N, K // 2) e2m1 codes,
    K-contiguous. w_scale: uint8 (N, K // 32) e8m0, any layout. bias: (N,) bf16/fp16/fp32.
    activation: None, "relu", "gelu_tanh", "silu". out_dtype: bf16/fp16/fp32 (default y's, else
    x's). y: optional output. config: None (on sm_90 with bf16 x the Hopper decode kernel up to 64 rows
    and the prefill kernel from 65 to 511 (1023 on wide layers), from 512 to 1024 where its tiles fill their waves (and
    no activation) the warp-specialized GEMM with the weight as A, core/hopper_w4.py; else table "a16wfp4", else derived; from
    M = DEQUANT_MIN_M, where no Hopper kernel takes the call, the weight is dequantized in one pass for
    the A16W16 GEMM: ops/packed_prefill.py), dict or GemmConfig (always the fused kernel). Differentiable in x and
    bias (the weight frozen; gemmkit.autograd): dx = dy @ dequant(w).
    """
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.gemm_a16wfp4 (gemmkit.library)
        return _library().traced_gemm_a16wfp4(x, w, w_scale, bias, activation, out_dtype, y, config)
    return _run(x, None, w, w_scale, bias, y, activation, out_dtype, config)


def gemm_afp4wfp4(x, w, x_scale, w_scale, *, bias=None, activation=None, out_dtype=torch.bfloat16, y=None,
                  config=None):
    """activation(dequant(x) @ dequant(w).T + bias) with both operands MXFP4.

    x: uint8 (M, K // 2) (or (*, K // 2)) e2m1 codes, K-contiguous; x_scale: uint8 (M, K // 32)
    (or (*, K // 32)) e8m0. w: uint8 (N, K // 2); w_scale: uint8 (N, K // 32). Both decoded to
    bf16 in registers (exact: every MXFP4 value with a normal scale is a bf16 value). out_dtype:
    bf16 (default), fp16 or fp32. Other arguments as gemm_a16wfp4.
    """
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.gemm_afp4wfp4 (gemmkit.library)
        return _library().traced_gemm_afp4wfp4(x, w, x_scale, w_scale, bias, activation, out_dtype, y, config)
    return _run(x, x_scale, w, w_scale, bias, y, activation, out_dtype, config)


def _run(x, x_scale, w, w_scale, bias, y, activation, out_dtype, config):
    """The cached plan's call (x_scale None: a 16-bit x)."""
    key = plan_key((x, x_scale, w, w_scale, bias, y),
                   (activation, out_dtype, None if config is None else v.config_key(config)))
    try:
        plan = _plans.lookup(key)
    except (KeyError, TypeError):  # a new plan (validates), or no key (bad input)
        plan = _plans.plan_for(key, _make_plan, x, x_scale, w, w_scale, bias, y, activation, out_dtype, config)
    return plan.run(x, w, bias, y, x_scale, w_scale)


def _check_k(K: int) -> None:
    if K % MX_BLOCK:
        raise ValueError(f"K={K} is not a multiple of {MX_BLOCK} (MXFP4 scales one block of 32 values)")


def _make_plan(x, x_scale, w, w_scale, bias, y, activation, out_dtype, config):
    fp4_x = x_scale is not None
    if not fp4_x and v.needs_grad(x, w_scale, bias):
        return _grad_plan(x, w, w_scale, bias, y, activation, out_dtype, config)
    v.check_tensor("x", x, (torch.uint8,) if fp4_x else _IN_DTYPES)
    activation = v.check_activation(activation)
    device = v.check_devices(x=x, x_scale=x_scale, w=w, w_scale=w_scale, bias=bias, y=y)
    v.check_no_autograd(x=x, bias=bias, y=y)
    x2, lead = v.as_rows("x", x)
    M = x2.shape[0]
    K = 2 * x2.shape[1] if fp4_x else x2.shape[1]
    _check_k(K)
    N = check_packed_weight("w", w, K)
    what = "one e8m0 scale per row and 32 values along K"
    check_group_tensor("w_scale", w_scale, (N, K // MX_BLOCK), (torch.uint8,), what)
    xs2 = None
    if fp4_x:
        if x2.shape[1] > 1 and x2.stride(1) != 1:
            raise ValueError("x must be contiguous along K (stride 1 along its bytes; call .contiguous())")
        check_group_tensor("x_scale", x_scale, (*lead, K // MX_BLOCK), (torch.uint8,), what)
        xs2 = x_scale if x_scale.ndim == 2 else x_scale.reshape(M, K // MX_BLOCK)
    out_dtype, y2, degenerate = output_checks(x2, lead, N, K, bias, y, out_dtype, torch.bfloat16 if fp4_x else x.dtype,
                                              device, activation)
    if degenerate:
        return degenerate
    dev = device_info(device)
    if not fp4_x and w4_prefill_ok(dev, x2, w, M, N, K, MX_BLOCK, config, mxfp4=True):
        return W4PrefillPlan(dev, x2, w, None, y2, M, N, K, MX_BLOCK, bias, activation, out_dtype, (*lead, N),
                             x.ndim != 2, mxfp4=True)
    if not fp4_x and w4_tile_ok(dev, x2, w, M, N, K, MX_BLOCK, config, activation, mxfp4=True):
        return W4TilePlan(dev, x2, w, w_scale, None, y2, M, N, K, MX_BLOCK, bias, out_dtype, (*lead, N), x.ndim != 2,
                          mxfp4=True)
    if config is None and M >= DEQUANT_MIN_M and not fp4_x:
        return _DequantMX(DequantThenGemm(w, w_scale, None, MX_BLOCK, False, x.dtype, activation, out_dtype))
    if not fp4_x and w4_decode_ok(dev, x2, w, M, N, K, MX_BLOCK, config, mxfp4=True):
        return W4DecodePlan(dev, x2, w, None, y2, M, N, K, MX_BLOCK, bias, activation, out_dtype, (*lead, N),
                            x.ndim != 2, mxfp4=True)
    dot = torch.bfloat16 if fp4_x else x.dtype
    a_fmt = packed4(dot, Scale.MX, MX_BLOCK) if fp4_x else dense(x.dtype)
    b_fmt = packed4(dot, Scale.MX, MX_BLOCK)
    cfg = resolve_config("afp4wfp4" if fp4_x else "a16wfp4", config, M, N, K, dev, a_fmt, b_fmt, out_dtype.itemsize)
    example_y = y2 if y2 is not None else torch.empty((M, N), dtype=out_dtype, device=device)
    plan = DensePlan(x2, w, example_y, a_fmt, b_fmt, EpilogueSpec(activation, bias is not None), cfg, dev,
                     out_dtype=out_dtype, out_shape=(*lead, N), flatten_x=x.ndim != 2,
                     inputs=dict(bias=bias, a_scale=xs2, b_scale=w_scale), auto_config=config is None,
                     logical_k=K)
    if fp4_x and x_scale.ndim != 2:
        return _FlatScale(plan)
    return plan


def _grad_plan(x, w, w_scale, bias, y, activation, out_dtype, config):
    """gemm_a16wfp4 calls whose x or bias require grad (the weight frozen): through gemmkit.autograd."""
    from .. import autograd

    return autograd.frozen_plan("gemm_a16wfp4", w_scale, y, config, lambda: _make_plan(
        x, None, w, w_scale, bias, None, activation, out_dtype, None),
        lambda x, w, bias, y, x_scale, w_scale: autograd.gemm_a16wfp4(x, w, w_scale, bias, activation, out_dtype))


class _DequantMX:
    """The prefill route (ops/packed_prefill.py) under this module's run(x, w, bias, y, x_scale, w_scale)."""

    def __init__(self, plan):
        self.plan = plan

    def run(self, x, w, bias, y, x_scale, w_scale):
        return self.plan.run(x, w, bias, y, None, w_scale)


class _FlatScale:
    """The plan, given x_scale (*, K // 32) as its (M, K // 32) view."""

    def __init__(self, gemm: DensePlan):
        self.gemm, self.M = gemm, gemm.M

    def run(self, x, w, bias, y, x_scale, w_scale):
        return self.gemm.run(x, w, bias, y, x_scale.reshape(self.M, x_scale.shape[-1]), w_scale)
