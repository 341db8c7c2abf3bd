"""A16W16: bf16/fp16 activations and weights, fp32 accumulation."""

from __future__ import annotations

import torch

from ..core import validate as v
from ..core.config import resolve_config, with_epilogue_inputs
from ..core.dense import DensePlan
from ..core.device import device_info
from ..core.epilogue import EpilogueSpec
from ..core.formats import dense
from ..core.hopper_ws import ws_mn_major_config, ws_plan
from ..core.plan import PlanCache, plan_key
from ..core.rows import plan_on_aligned_x, warn_unaligned_weight
from ..core.tracing import is_compiling as _is_compiling, library as _library

OP = "a16w16"
_IN_DTYPES = (torch.bfloat16, torch.float16)
_plans = PlanCache()


def gemm_a16w16(x, w, bias=None, *, activation=None, out_dtype=None, y=None, config=None):
    """activation(x @ w.T + bias), like ``F.linear`` followed by an activation.

    x: (M, K) (or (*, K), or (K,)), bf16 or fp16. w: (N, K), the dtype of x (nn.Linear.weight).
    bias: (N,), bf16/fp16/fp32, or None. activation: None, "relu", "gelu_tanh" or "silu".
    out_dtype: bf16, fp16 or fp32; default: y's dtype if y is given, else x's.
    y: optional preallocated output of shape (M, N) (or (*, N)), written and returned.
    config: None (tuned table, else derived from the device), a dict or a GemmConfig.
    Each operand needs one unit-stride dimension (row- or column-major, any other stride).
    Accumulation is fp32; the result is rounded once to out_dtype. Differentiable (gemmkit.autograd:
    x, w, bias; not with y or config).
    """
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.gemm_a16w16 (gemmkit.library)
        return _library().traced_gemm_a16w16(x, w, bias, activation, out_dtype, y, config)
    key = plan_key((x, w, bias, y), (activation, out_dtype, None if config is None else v.config_key(config)))
    try:
        plan = _plans[key]
        _plans.move_to_end(key)  # least recently used plans are evicted first
    except (KeyError, TypeError):  # a new plan (validates), or no key (bad input)
        plan = _plans.plan_for(key, _make_plan, x, w, bias, y, activation, out_dtype, config)
    return plan.run(x, w, bias, y, None, None)


def _make_plan(x, w, bias, y, activation, out_dtype, config, mul=None, add=None):
    """The plan of one call (validates). mul / add: (M, N) epilogue inputs (views, stride 0 where
    broadcast; gemmkit.ops.fused.fused_gemm_a16w16_mul_add), checked by the caller."""
    if mul is None and add is None and v.needs_grad(x, w, bias):
        return _grad_plan(x, w, bias, y, activation, out_dtype, config)
    v.check_tensor("x", x, _IN_DTYPES)
    v.check_tensor("w", w, _IN_DTYPES)
    v.check_same_dtype("w", w, x)
    activation, device, x2, lead, M, N, K = v.check_inputs(x, w, activation, bias=bias, y=y)
    out_dtype, y2, degenerate = v.check_output(y, lead, M, N, K, out_dtype, x.dtype, device, activation, bias)
    if degenerate:
        return degenerate
    v.check_layout("x", x2)
    v.check_layout("w", w)
    warn_unaligned_weight("gemm_a16w16", w)
    return plan_on_aligned_x(x2, w, M, N, device_info(device), x.ndim != 2, lambda xa, flat: _plan(
        xa, w, bias, y2, activation, out_dtype, config, mul, add, M, N, K, lead, flat, device))


def _grad_plan(x, w, bias, y, activation, out_dtype, config):
    """Calls whose inputs require grad: through gemmkit.autograd, after the checks of the same call without."""
    from .. import autograd

    autograd.checked("gemm_a16w16", y, config, lambda: _make_plan(x, w, bias, None, activation, out_dtype, None))
    return autograd.GradPlan(lambda x, w, bias, y, mul, add: autograd.gemm_a16w16(x, w, bias, activation, out_dtype))


def _plan(x2, w, bias, y2, activation, out_dtype, config, mul, add, M, N, K, lead, flatten_x, device):
    dev = device_info(device)
    fmt = dense(x2.dtype)
    cfg = resolve_config(OP, config, M, N, K, dev, fmt, fmt, out_dtype.itemsize)
    if config is None and (mul is not None or add is not None):
        cfg = with_epilogue_inputs(cfg)
    if mul is None and add is None:  # sm_90: the warp-specialized kernel where it measured faster
        ws = ws_plan(dev, x2, w, y2, M, N, K, scales="none", x_scale=None, w_scale=None, bias=bias,
                     activation=activation, config=config, out_dtype=out_dtype, out_shape=(*lead, N),
                     flatten_x=flatten_x, promote=False)
        if ws is not None:
            return ws
        if config is None:
            cfg = ws_mn_major_config(dev, x2, w, M, N, K) or cfg
    example_y = y2 if y2 is not None else torch.empty((M, N), dtype=out_dtype, device=device)
    return DensePlan(x2, w, example_y, fmt, fmt, EpilogueSpec(activation, bias is not None, mul is not None,
                                                             add is not None), cfg, dev,
                     out_dtype=out_dtype, out_shape=(*lead, N), flatten_x=flatten_x,
                     inputs=dict(bias=bias, mul=mul, add=add), auto_config=config is None)
