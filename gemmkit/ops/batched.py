"""Batched GEMM: B independent (M, N) problems of the same shape in one launch (MAP_BATCHED)."""

from __future__ import annotations

import torch

from ..core import validate as v
from ..core.device import device_info
from ..core.epilogue import EpilogueSpec, torch_activation
from ..core.formats import dense
from ..core.grouped import GroupedPlan, family_config_for, group_epilogue, index_extent
from ..core.hopper_ws import ws_batched_plan
from ..core.plan import PlanCache, plan_key
from ..core.tracing import is_compiling as _is_compiling, library as _library
from ..kernels import modes
from . import a8w8, a16w16
from .grouped import FP8, _IN_DTYPES, _Degenerate

_plans = PlanCache()
# one weight for every entry (batch stride 0) and x's entries evenly stacked: one GEMM over the (B * M)-row stack
SHARED_WEIGHT_AS_ONE = True



def batched_gemm_a16w16(x, w, bias=None, *, activation=None, out_dtype=None, config=None):
    """y[b] = activation(x[b] @ w[b].T + bias[b]), like torch.bmm(x, w.transpose(1, 2)).

    x: (B, M, K) bf16/fp16; w: (B, N, K) of x's dtype, or (N, K) / an expand()ed (B, N, K) with
    batch stride 0 (one weight for every batch entry: with x's entries evenly stacked, one GEMM of B * M
    rows). Each x[b], w[b] needs a unit-stride dimension. bias: (N,) or (B, N) contiguous. Output
    (B, M, N) contiguous, out_dtype (default x's). Differentiable (gemmkit.autograd: x, w, bias).
    """
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.batched_gemm_a16w16 (gemmkit.library)
        return _library().traced_batched_gemm_a16w16(x, w, bias, activation, out_dtype, config)
    return _batched(x, w, bias, None, None, activation, out_dtype, config, "a16w16")


def batched_gemm_a8w8(x, w, x_scale, w_scale, bias=None, *, activation=None, out_dtype=torch.bfloat16, config=None):
    """batched_gemm_a16w16 with FP8 / INT8 operands (K-contiguous) and float32 scales.

    x_scale: one value, or per token (B, M, 1) / (B, M). w_scale: one value, one per batch entry
    (B,) / (B, 1), or per channel (B, 1, N) / (B, N) / (1, N) / (N,) (shared).
    """
    if _is_compiling():
        return _library().traced_batched_gemm_a8w8(x, w, x_scale, w_scale, bias, activation, out_dtype, config)
    return _batched(x, w, bias, x_scale, w_scale, activation, out_dtype, config, "a8w8")


def _batched(x, w, bias, x_scale, w_scale, activation, out_dtype, config, kind):
    key = plan_key((x, w, bias, x_scale, w_scale), (kind, activation, out_dtype,
                                                   None if config is None else v.config_key(config)))
    try:
        plan = _plans.lookup(key)
    except (KeyError, TypeError):
        plan = _plans.plan_for(key, _make_plan, x, w, bias, x_scale, w_scale, activation, out_dtype, config, kind)
    return plan.run(x, w, None, None, None, None, bias, x_scale, w_scale)


def _make_plan(x, w, bias, x_scale, w_scale, activation, out_dtype, config, kind):
    if kind == "a16w16" and v.needs_grad(x, w, bias):  # (gemmkit.autograd, after the same call's checks without)
        from .. import autograd

        autograd.checked("batched_gemm_a16w16", None, config,
                         lambda: _make_plan(x, w, bias, x_scale, w_scale, activation, out_dtype, None, kind))
        return autograd.GradPlan(lambda x, w, offsets, a_rows, c_rows, row_weights, bias, a_scale, b_scale:
                                 autograd.batched_gemm_a16w16(x, w, bias, activation, out_dtype))
    dtypes = _IN_DTYPES if kind == "a16w16" else FP8 + (torch.int8,)
    v.check_tensor("x", x, dtypes)
    v.check_tensor("w", w, dtypes)
    if kind == "a16w16":
        v.check_same_dtype("w", w, x)
    if kind == "a8w8" and (x.dtype == torch.int8) != (w.dtype == torch.int8):
        raise TypeError(f"x is {x.dtype} but w is {w.dtype}: int8 pairs only with int8, fp8 only with fp8")
    activation = v.check_activation(activation)
    device = v.check_devices(x=x, w=w, bias=bias, x_scale=x_scale, w_scale=w_scale)
    v.check_no_autograd(x=x, w=w, bias=bias, x_scale=x_scale, w_scale=w_scale)
    if x.ndim != 3:
        raise ValueError(f"x must be 3-D (B, M, K), got shape {tuple(x.shape)}")
    B, M, K = x.shape
    if w.ndim == 2:
        w = w.unsqueeze(0).expand(B, *w.shape)
    if w.ndim != 3 or w.shape[0] != B or w.shape[2] != K:
        raise ValueError(f"w must be (B, N, K) = ({B}, N, {K}) or (N, {K}), got shape {tuple(w.shape)}")
    N = w.shape[1]
    s_biasg, out_dtype, a_kind, s_asg, b_kind, s_bsg = group_epilogue(
        kind, x, w, bias, x_scale, w_scale, out_dtype, B, N, "B", (set(), {(B, M, 1), (B, M)}, set()),
        ({(1, N), (N,)}, {(B, 1, N), (B, N)}, {(B,), (B, 1)}))
    if B == 0 or M == 0 or N == 0 or K == 0:
        return _BatchedDegenerate(B, M, N, out_dtype, device, activation)
    v.check_layout("x[0]", x[0])
    v.check_layout("w[0]", w[0])
    if (SHARED_WEIGHT_AS_ONE and config is None and B > 1 and w.stride(0) == 0 and (bias is None or bias.ndim == 1)
            and x.stride(2) == 1 and x.stride(0) == M * x.stride(1)
            and (kind == "a16w16" or (s_bsg == 0 and (x_scale.numel() == 1 or x_scale.is_contiguous())))):
        return _SharedWeightPlan(kind, x, w, bias, x_scale, w_scale, activation, out_dtype)
    dev = device_info(device)
    if kind == "a16w16":  # sm_90: the warp-specialized kernel over the entries' row stacks, where it qualifies
        ws = ws_batched_plan(dev, x, w, bias, activation, out_dtype, config)
        if ws is not None:
            return ws
    a_fmt, b_fmt = dense(x.dtype, a_kind), dense(w.dtype, b_kind)
    cfg = family_config_for(config, M, N, K, dev, a_fmt, b_fmt, out_dtype.itemsize,
                            "batched_a16w16" if kind == "a16w16" else None, batch=B)
    return GroupedPlan(modes.MAP_BATCHED, x[0], w, (B, M, N), (N, 1), M, B, a_fmt, b_fmt,
                       EpilogueSpec(activation, bias is not None), cfg, dev, out_dtype=out_dtype,
                       group_strides=dict(stride_ag=x.stride(0), stride_cg=M * N, stride_asg=s_asg, stride_bsg=s_bsg,
                                          stride_biasg=s_biasg),
                       gather=False, index_extent=max(index_extent(x, w), B * M * N), auto_config=config is None)


class _SharedWeightPlan:
    """x (B, M, K) with its entries evenly stacked and one weight (N, K) for all of them (a 2-D w, or batch stride
    0): gemm_a16w16's plan (gemm_a8w8's: x's scales per tensor or per token in order, w's per tensor or per
    channel shared by the entries) for the (B * M)-row stack, built once, its output viewed as (B, M, N): no tile
    padding per entry, the dense ops' rules and tables (a caller's config keeps the batched kernel: it is that
    kernel's config)."""

    def __init__(self, kind, x, w, bias, x_scale, w_scale, activation, out_dtype):
        B, M, K = x.shape
        N = w.shape[-2]
        self.stack, self.row_stride, self.shape = (B * M, K), x.stride(1), (B, M, N)
        x2, w2 = self._rows(x), self._weight(w)
        act = None if activation == "none" else activation
        if kind == "a16w16":
            self.inner = a16w16._make_plan(x2, w2, bias, None, act, out_dtype, None)
        else:
            self.inner = a8w8._make_plan(x2, w2, self._x_scale(x_scale), self._w_scale(w_scale), bias, None, act,
                                         out_dtype, None, True)

    def _rows(self, x):
        return torch.as_strided(x, self.stack, (self.row_stride, 1))

    @staticmethod
    def _weight(w):
        return w if w.ndim == 2 else w[0]

    def _x_scale(self, s):
        return s if s is None or s.numel() == 1 else s.reshape(self.stack[0], 1)

    def _w_scale(self, s):
        return s if s is None or s.numel() == 1 else s.reshape(1, self.shape[2])

    def run(self, x, w, offsets, a_rows, c_rows, row_weights, bias, a_scale, b_scale):
        out = self.inner.run(self._rows(x), self._weight(w), bias, None, self._x_scale(a_scale),
                             self._w_scale(b_scale))
        return out.view(self.shape)


class _BatchedDegenerate:
    def __init__(self, B, M, N, out_dtype, device, activation):
        self.inner = _Degenerate(B * M, N, out_dtype, device, activation, None, 1, 0)
        self.shape = (B, M, N)
        self.run = self.__call__

    def __call__(self, x, w, offsets, a_rows, c_rows, row_weights, bias, a_scale, b_scale):
        y = self.inner(None, None, None, None, None, None, None, None, None).view(self.shape)
        if bias is not None and y.numel():
            y = _with_bias(y, bias, self.inner.activation)
        return y


def _with_bias(y, bias, activation):
    b = bias.float() if bias.ndim == 1 else bias.float()[:, None, :]
    return torch_activation(torch.zeros(y.shape, dtype=torch.float32, device=y.device) + b, activation).to(y.dtype)
