"""Fused feed-forward blocks and fused-epilogue GEMMs (issue 14).

- ff_a16w16_gated / ff_a8w8_gated: down(act(x @ gate^T) * (x @ up^T)) in two launches: one gated
  GEMM (one K loop, two accumulators, only the (M, I) product stored) then the down GEMM. On
  sm_90 from 128 rows the gated GEMM is the Gluon kernel's (kernels/gemm_ws.py GATED: persistent
  128 x (W gate + W up) tiles), elsewhere the tl kernel's.
- ff_a16w16: down(act(x @ up^T)), the activation fused in the first GEMM's epilogue.
- fused_gemm_a16w16_mul_add: (x @ w^T) * a + b, a and b broadcast in the epilogue.

Gate/up weight layouts, all read in place (no copy, no per-call re-layout): the gated kernel
takes the gate and up weights as two (I, K) operands with the same strides, so
  "concat" (default): w_gate_up (2I, K) = [gate; up] (HF/vLLM `gate_up_proj`) -> w[:I], w[I:];
  "interleaved": rows alternate gate, up -> w[0::2], w[1::2] (row stride 2K);
  separate: w_gate_up is the gate (I, K) and w_up the up weight (same shape and strides).
FP8 per-channel scales follow the rows: (2I,) in the weight's row order ([gate; up] for "concat"
and for separate weights, alternating for "interleaved"), or one value per tensor.
"""

from __future__ import annotations

import dataclasses

import torch

from ..core import validate as v
from ..core.config import GemmConfig, fit_to_smem, gated_tiles, resolve_config
from ..core.dense import DensePlan
from ..core.device import device_info
from ..core.epilogue import EpilogueSpec
from ..core.formats import Scale, dense, quantized_in_kernel
from ..core.hopper_ws import ws_gated_plan
from ..core.plan import PlanCache, capturing, plan_key
from ..core.tracing import is_compiling as _is_compiling, library as _library
from . import a8w8, a16w16

LAYOUTS = ("concat", "interleaved")
GATED_TABLE = "ff_gated_a16w16"
GATED_FP8_TABLE = "ff_gated_a8w8"
IN_KERNEL_QUANT_MAX_M = 16  # ff_a8w8_gated: x quantized inside the gated GEMM up to this M (eager)
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_plans = PlanCache()


# ---------------------------------------------------------------------------------------------
# gate / up layouts


def gate_up_views(w_gate_up, w_up=None, layout: str = "concat"):
    """(gate (I, K), up (I, K)) views of the gate/up weight(s) in any supported layout (no copy)."""
    v.check_tensor("w_gate_up", w_gate_up)
    if w_gate_up.ndim != 2:
        raise ValueError(f"w_gate_up must be 2-D, got shape {tuple(w_gate_up.shape)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} must be one of {LAYOUTS}")
    if w_up is not None:
        if layout != "concat":  # (separate weights have no layout; their scales are [gate; up])
            raise ValueError(f"layout={layout!r} describes one (2I, K) gate/up weight; with w_up (separate gate and "
                             "up weights) leave it 'concat' (the per-channel scales are then [gate; up])")
        v.check_tensor("w_up", w_up)
        if (w_up.shape, w_up.stride(), w_up.dtype) != (w_gate_up.shape, w_gate_up.stride(), w_gate_up.dtype):
            raise ValueError(f"w_up {tuple(w_up.shape)} {w_up.stride()} {w_up.dtype} must have the gate weight's "
                             f"shape, strides and dtype {tuple(w_gate_up.shape)} {w_gate_up.stride()} "
                             f"{w_gate_up.dtype}")
        return w_gate_up, w_up
    rows = w_gate_up.shape[0]
    if rows % 2:
        raise ValueError(f"w_gate_up has {rows} rows: [gate; up] needs an even count (2 * intermediate size)")
    if layout == "concat":
        return w_gate_up[: rows // 2], w_gate_up[rows // 2:]
    return w_gate_up[0::2], w_gate_up[1::2]


def _up_scale(w_scale, I: int, separate: bool, layout: str):
    """(kind, (offset, stride)) of the gate/up per-channel scales in one (2I,) vector."""
    v.check_tensor("w_scale", w_scale, (torch.float32,))
    if w_scale.numel() == 1:
        return Scale.TENSOR, (0, 0)
    if w_scale.numel() != 2 * I or tuple(w_scale.shape) not in {(2 * I,), (2 * I, 1), (1, 2 * I)}:
        raise ValueError(f"w_scale has shape {tuple(w_scale.shape)}: expected one value or 2*I = {2 * I} per-channel "
                         "values ((2I,) or (2I, 1)) in the rows' order")
    if not w_scale.is_contiguous():
        raise ValueError("w_scale must be contiguous (call .contiguous())")
    return Scale.ROW, ((1, 2) if layout == "interleaved" and not separate else (I, 1))


# ---------------------------------------------------------------------------------------------
# the gated GEMM: act(x @ gate^T) * (x @ up^T) -> (M, I)


def _gated_config(config, table, M, N, K, dev, a_fmt, b_fmt, out_bytes) -> GemmConfig:
    """A config for the gated GEMM: whole tiles (no split-K / stream-K: the activation needs the
    full sums), at most 128 x 128 per accumulator (two of them), shared memory for two B tiles."""
    two_b = dataclasses.replace(b_fmt, bits=2 * b_fmt.bits)
    cfg = resolve_config(table, config, M, N, K, dev, a_fmt, two_b, out_bytes)
    if config is not None:
        if cfg.SPLIT_K != 1 or cfg.STREAM_K:
            raise ValueError("config: the gated GEMM computes whole tiles (SPLIT_K=1, STREAM_K=False)")
        return cfg
    # one program per tile: with two B tiles per stage, the persistent loop's stages and its
    # epilogue did not both fit (scripts/gated_probe.py, M = 256: non-persistent 128x128x64 tiles,
    # 8 warps, 4 stages ran 1.0-1.2x torch's GEMM + silu * mul, the persistent ones 0.8-1.03x)
    cfg = dataclasses.replace(cfg, SPLIT_K=1, STREAM_K=False, PERSISTENT=False, WARP_SPECIALIZE=False,
                              EPILOGUE_SUBTILE=False)
    return fit_to_smem(gated_tiles(cfg), dev, a_fmt, two_b, out_bytes)


class _WSGated:
    """A gated WSPlan (core/hopper_ws.ws_gated_plan), called as the gated DensePlan is:
    run(x, gate, bias, y, x_scale, w_scale, mul, add, c2, up)."""

    is_ws = True

    def __init__(self, ws):
        self.ws = ws

    def run(self, x, gate, bias, y, a_scale, b_scale, mul=None, add=None, c2=None, b2=None):
        return self.ws.run(x, gate, None, y, a_scale, b_scale, b2)


class _GatedPlan:
    """The gated GEMM of a fixed problem: `plan` (x already quantized where it must be), and for a
    16-bit x with FP8 weights the quantizer in front (`quantize`), or `fused` (x quantized in the
    kernel, small M, eager)."""

    def __init__(self, plan, quantize=None, fused=None, M=0, K=0, flatten=False):
        self.plan, self.quantize, self.fused, self.M, self.K, self.flatten = plan, quantize, fused, M, K, flatten
        self.is_ws = getattr(plan, "is_ws", False)  # the warp-specialized kernel's gated tiles

    def run(self, x, gate, up, y, w_scale):
        if self.quantize is None:
            return self.plan.run(x, gate, None, y, None, w_scale, None, None, None, up)
        if self.fused is not None and not capturing():
            return self.fused.run(x, gate, None, y, None, w_scale, None, None, None, up)
        xq, xs = self.quantize(x.reshape(self.M, self.K) if self.flatten else x)
        return self.plan.run(xq, gate, None, y, xs, w_scale, None, None, None, up)


def _make_gated(x, gate, up, w_scale, up_scale, y, activation, out_dtype, config, fast_accum):
    fp8 = gate.dtype in _FP8
    v.check_tensor("x", x, a16w16._IN_DTYPES)
    v.check_tensor("w_gate_up", gate, _FP8 if fp8 else a16w16._IN_DTYPES)
    if not fp8:
        v.check_same_dtype("w_gate_up", gate, x)
    activation = v.check_activation(activation)
    device = v.check_devices(x=x, w_gate_up=gate, w_up=up, w_scale=w_scale, y=y)
    v.check_no_autograd(x=x, w_gate_up=gate, w_up=up, w_scale=w_scale, y=y)
    x2, lead = v.as_rows("x", x)
    M, K = x2.shape
    N = v.check_weight("w_gate_up", gate, K)
    out_dtype = v.check_out_dtype(out_dtype, y, x.dtype)
    y2 = v.check_out(y, lead, M, N, out_dtype, device)
    if M == 0 or N == 0 or K == 0:
        return _GatedPlan(v.DegeneratePlan((*lead, N), out_dtype, device, "none"))
    v.check_layout("x", x2)
    v.check_layout("w_gate_up", gate)
    if fp8:
        for name, t in (("x", x2), ("w_gate_up", gate)):
            if K > 1 and t.stride(1) != 1:
                raise ValueError(f"{name} must be K-contiguous (stride 1 along K) with FP8 weights")
    if y2 is not None:
        v.check_layout("y", y2)
    dev = device_info(device)
    example_y = y2 if y2 is not None else torch.empty((M, N), dtype=out_dtype, device=device)
    spec = EpilogueSpec(activation, gated=True)
    ws_common = dict(activation=activation, config=config, out_dtype=out_dtype, out_shape=(*lead, N))
    common = dict(out_dtype=out_dtype, out_shape=(*lead, N), flatten_x=x.ndim != 2, auto_config=config is None,
                  inputs=dict(b2=up), exact_accumulation=fp8 and not fast_accum)
    if not fp8:
        ws = ws_gated_plan(dev, x2, gate, up, y2, M, N, K, x_scale=None, w_scale=None, up_scale=None,
                           flatten_x=x.ndim != 2, **ws_common)
        if ws is not None:  # sm_90: the warp-specialized kernel's gated tiles (core/hopper_ws.py)
            return _GatedPlan(_WSGated(ws))
        fmt = dense(x.dtype)
        cfg = _gated_config(config, GATED_TABLE, M, N, K, dev, fmt, fmt, out_dtype.itemsize)
        return _GatedPlan(DensePlan(x2, gate, example_y, fmt, fmt, spec, cfg, dev, **common))
    kind, offsets = up_scale
    b_fmt = dense(gate.dtype, kind)
    a_fmt = dense(gate.dtype, Scale.ROW)
    cfg = _gated_config(config, GATED_FP8_TABLE, M, N, K, dev, a_fmt, b_fmt, out_dtype.itemsize)
    from ..quant import quantize_fp8

    xq = torch.empty((M, K), dtype=gate.dtype, device=device)
    xs = torch.empty((M, 1), dtype=torch.float32, device=device)
    ws = ws_gated_plan(dev, xq, gate, up, y2, M, N, K, x_scale=xs, w_scale=w_scale, up_scale=offsets,
                       flatten_x=False, **ws_common) if fast_accum else None
    if ws is not None:
        plan = _WSGated(ws)
    else:
        plan = DensePlan(xq, gate, example_y, a_fmt, b_fmt, spec, cfg, dev, up_scale=offsets,
                         **dict(common, flatten_x=False, inputs=dict(b2=up, a_scale=xs, b_scale=w_scale)))
    fused = None
    if M <= IN_KERNEL_QUANT_MAX_M:
        q_fmt = quantized_in_kernel(x.dtype, gate.dtype, "row")
        q_cfg = _gated_config(config, GATED_FP8_TABLE, M, N, K, dev, q_fmt, b_fmt, out_dtype.itemsize)
        fused = DensePlan(x2, gate, example_y, q_fmt, b_fmt, spec, q_cfg, dev, up_scale=offsets,
                          **dict(common, inputs=dict(b2=up, b_scale=w_scale)))
    return _GatedPlan(plan, lambda t: quantize_fp8(t, "row", gate.dtype), fused, M, K, x.ndim != 2)


def gated_gemm(x, gate, up, *, w_scale=None, up_scale=(Scale.NONE, (0, 0)), activation="silu", out_dtype=None,
               y=None, config=None, fast_accum=True):
    """act(x @ gate^T) * (x @ up^T): x (*, K) bf16/fp16; gate, up (I, K) with equal strides (see
    gate_up_views), x's dtype, or FP8 with `w_scale` (one value, or (2I,) with `up_scale`'s
    (kind, (offset, stride)) from _up_scale); then x is quantized per token. -> (*, I)."""
    return _gated_plan(x, gate, up, w_scale, up_scale, activation, out_dtype, y, config, fast_accum).run(
        x, gate, up, y, w_scale)


def _gated_plan(x, gate, up, w_scale, up_scale, activation, out_dtype, y, config, fast_accum) -> _GatedPlan:
    key = plan_key((x, gate, up, w_scale, y), (activation, out_dtype, up_scale, fast_accum, type(fast_accum),
                                               None if config is None else v.config_key(config)))
    try:
        return _plans.lookup(key)
    except (KeyError, TypeError):
        return _plans.plan_for(key, _make_gated, x, gate, up, w_scale, up_scale, y, activation, out_dtype, config,
                               fast_accum)


# ---------------------------------------------------------------------------------------------
# feed-forward ops


def ff_a16w16_gated(x, w_gate_up, w_down, activation="silu", *, w_up=None, layout="concat", out_dtype=None, y=None,
                    config=None, down_config=None):
    """down(act(gate(x)) * up(x)): the Llama / Qwen gated MLP in two launches.

    x: (*, H) bf16/fp16. w_gate_up: (2I, H) [gate; up] (layout="concat", HF/vLLM gate_up_proj) or
    rows alternating gate/up (layout="interleaved"), or the gate (I, H) alone with w_up (I, H).
    w_down: (H_out, I), x's dtype. activation: "silu" (default), "gelu_tanh", "relu", None.
    out_dtype / y: of the (*, H_out) result. config: the gated GEMM's (SPLIT_K=1),
    down_config: the down GEMM's. The (M, I) intermediate is rounded to x's dtype, as in torch.
    """
    if _is_compiling():
        return _library().traced_ff_a16w16_gated(x, w_gate_up, w_down, activation, w_up, layout, out_dtype, y,
                                                 config, down_config)
    gate, up = gate_up_views(w_gate_up, w_up, layout)
    _check_down(w_down, gate, x, a16w16._IN_DTYPES)
    if v.needs_grad(x, w_gate_up, w_up, w_down):
        return _ff_gated_grad(x, gate, up, w_gate_up, w_up, w_down, activation, layout, out_dtype, y, config,
                              down_config)
    plan = _gated_plan(x, gate, up, None, (Scale.NONE, (0, 0)), activation, None, None, config, True)
    if (config is None and not plan.is_ws and isinstance(x, torch.Tensor) and x.ndim
            and x.numel() >= TWO_GEMMS_MIN_M * x.shape[-1]):
        h = _gated_two_gemms(x, gate, up, activation)
    else:
        h = plan.run(x, gate, up, None, None)
    return a16w16.gemm_a16w16(h, w_down, out_dtype=out_dtype, y=y, config=down_config)


def _check_down(w_down, first, x, dtypes) -> None:
    """w_down (H_out, I) against the first GEMM's (I, H) weight, before the first GEMM is launched."""
    v.check_tensor("x", x, a16w16._IN_DTYPES)
    v.check_tensor("w_down", w_down, dtypes)
    if dtypes is a16w16._IN_DTYPES:
        v.check_same_dtype("w_down", w_down, x)
    if first.ndim == 2:
        I = first.shape[0]
        if w_down.ndim != 2 or w_down.shape[1] != I:
            raise ValueError(f"w_down must be 2-D (H_out, I): its K must be the intermediate size I = {I}, got "
                             f"shape {tuple(w_down.shape)}")
    if w_down.device != x.device:
        raise ValueError(f"w_down is on {w_down.device} but x is on {x.device}")


def _ff_gated_grad(x, gate, up, w_gate_up, w_up, w_down, activation, layout, out_dtype, y, config, down_config):
    """ff_a16w16_gated with inputs that require grad (gemmkit.autograd), after the gated GEMM's checks."""
    from .. import autograd

    autograd.checked("ff_a16w16_gated", y, config if config is not None else down_config,
                     lambda: _gated_plan(x, gate, up, None, (Scale.NONE, (0, 0)), activation, None, None, None, True))
    return autograd.ff_a16w16_gated(x, w_gate_up, w_up, w_down, activation, layout, out_dtype)


# From this many rows on, the gated product is two dense GEMMs through the tuned a16w16 tables:
# up = x @ w_up^T, then act(x @ w_gate^T) * up with `up` read in the second GEMM's epilogue (the
# (M, I) up, not the (M, 2I) intermediate, crosses memory once each way). The one-launch gated
# GEMM wins below it: at M = 256 with one program per tile it ran 1.0-1.2x torch where the two
# GEMMs ran 0.74-0.95x (scripts/gated_probe.py); its two accumulators limit its tiles at large M.
# On sm_90 the Gluon kernel's persistent gated tiles (core/hopper_ws.ws_gated_plan) beat both
# (tuning/gated_ws/gated_ws_probe_h100.txt) and take every M >= 128 instead.
TWO_GEMMS_MIN_M = 1024


def _gated_two_gemms(x, gate, up, activation):
    """act(x @ gate^T) * (x @ up^T), (*, I) in x's dtype, as two gemm_a16w16 launches."""
    u = a16w16.gemm_a16w16(x, up)
    x2, _ = v.as_rows("x", x)
    u2 = u.reshape(x2.shape[0], up.shape[0])
    key = plan_key((x, gate, u2), ("act_mul", activation))
    try:
        plan = _plans.lookup(key)
    except (KeyError, TypeError):
        plan = _plans.plan_for(key, a16w16._make_plan, x, gate, None, None, activation, None, None, u2, None)
    return plan.run(x, gate, None, None, None, None, u2, None)


def ff_a16w16(x, w_up, w_down, activation="silu", *, out_dtype=None, y=None, config=None, down_config=None):
    """down(act(x @ w_up^T)): an ungated MLP, the activation fused into the first GEMM's epilogue.
    x: (*, H) bf16/fp16; w_up: (I, H); w_down: (H_out, I). -> (*, H_out)."""
    if _is_compiling():
        return _library().traced_ff_a16w16(x, w_up, w_down, activation, out_dtype, y, config, down_config)
    v.check_tensor("w_up", w_up)
    _check_down(w_down, w_up, x, a16w16._IN_DTYPES)
    if v.needs_grad(x, w_up, w_down):
        from .. import autograd

        autograd.check_grad_call("ff_a16w16", y, config if config is not None else down_config)
        return autograd.ff_a16w16(x, w_up, w_down, activation, out_dtype)
    h = a16w16.gemm_a16w16(x, w_up, activation=activation, config=config)
    return a16w16.gemm_a16w16(h, w_down, out_dtype=out_dtype, y=y, config=down_config)


def ff_a8w8_gated(x, w_gate_up, w_gate_up_scale, w_down, w_down_scale, activation="silu", *, w_up=None,
                  layout="concat", out_dtype=torch.bfloat16, y=None, config=None, down_config=None, fast_accum=True):
    """down(act(gate(x)) * up(x)) with FP8 weights scaled per channel (or per tensor).

    x: (*, H) bf16/fp16, quantized per token dynamically (inside the gated GEMM for M <= 16 when
    eager, else by gemmkit.quantize_fp8 first); the (M, I) intermediate (x's dtype) likewise by
    the down GEMM (gemm_a8w8's dynamic path). w_gate_up: FP8 (2I, H) in `layout` (or the gate
    alone with w_up); w_gate_up_scale: float32, one value or 2I values in the rows' order.
    w_down: FP8 (H_out, I), w_down_scale: one value or H_out values. -> (*, H_out), out_dtype.
    """
    if _is_compiling():
        return _library().traced_ff_a8w8_gated(x, w_gate_up, w_gate_up_scale, w_down, w_down_scale, activation,
                                               w_up, layout, out_dtype, y, config, down_config, fast_accum)
    gate, up = gate_up_views(w_gate_up, w_up, layout)
    v.check_tensor("w_gate_up", gate, _FP8)
    _check_down(w_down, gate, x, _FP8)
    up_scale = _up_scale(w_gate_up_scale, gate.shape[0], w_up is not None, layout)
    h = gated_gemm(x, gate, up, w_scale=w_gate_up_scale, up_scale=up_scale, activation=activation, config=config,
                   out_dtype=x.dtype if isinstance(x, torch.Tensor) else None, fast_accum=fast_accum)
    return a8w8.gemm_a8w8(h, w_down, None, w_down_scale, out_dtype=out_dtype, y=y, config=down_config,
                          fast_accum=fast_accum)


# ---------------------------------------------------------------------------------------------
# (x @ w^T) * a + b

_scalars: dict = {}


def _operand(name, t, device, M, N, lead):
    """An (M, N) broadcast view of a mul/add operand (stride 0 where broadcast)."""
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        key = (float(t), device)
        s = _scalars.get(key)
        if s is None:
            if len(_scalars) > 256:
                _scalars.clear()
            s = _scalars[key] = torch.full((1,), float(t), dtype=torch.float32, device=device)
        t = s
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a float or a tensor, got {type(t).__name__}")
    v.check_tensor(name, t, (torch.bfloat16, torch.float16, torch.float32))
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but x is on {device}")
    if t.numel() == 1:
        return t.reshape(1, 1).expand(M, N)
    out_shape = (*lead, N)
    if t.ndim > len(out_shape) or any(s != 1 and s != d for s, d in zip(reversed(t.shape), reversed(out_shape))):
        # (checked by shape, not by catching broadcast_to's error: torch.compile traces this)
        raise ValueError(f"{name} has shape {tuple(t.shape)}: not broadcastable to the output {out_shape} "
                         f"(scalar, (M, 1) per row, (N,) / (1, N) per column, or (M, N))")
    full = torch.broadcast_to(t, out_shape)
    try:
        return full.view(M, N)
    except (RuntimeError, ValueError):  # (ValueError: a fake tensor's view, while tracing)
        raise ValueError(f"{name} of shape {tuple(t.shape)} cannot be addressed as an (M, N) matrix with "
                         "strides; pass it broadcast over x's flattened rows") from None


def fused_gemm_a16w16_mul_add(x, w, a, b, *, out_dtype=None, y=None, config=None):
    """(x @ w^T) * a + b in one launch (the scaling and the residual add in the epilogue, fp32).

    x: (*, K) bf16/fp16; w: (N, K) x's dtype. a, b: python floats, 1-element tensors, or tensors
    (bf16/fp16/fp32) broadcastable to the (M, N) output: (M, 1) per row, (N,) / (1, N) per column,
    (M, N) in full (e.g. the residual). out_dtype / y as gemm_a16w16. -> (*, N).
    """
    if _is_compiling():
        return _library().traced_fused_gemm_a16w16_mul_add(x, w, a, b, out_dtype, y, config)
    v.check_tensor("x", x, a16w16._IN_DTYPES)
    v.check_tensor("w", w, a16w16._IN_DTYPES)
    x2, lead = v.as_rows("x", x)
    M, K = x2.shape
    N = v.check_weight("w", w, K)
    a2 = _operand("a", a, x.device, M, N, lead)
    b2 = _operand("b", b, x.device, M, N, lead)
    if v.needs_grad(x, w, a, b):
        return _mul_add_grad(x, w, a, b, a2, b2, out_dtype, y, config)
    key = plan_key((x, w, a2, b2, y), ("mul_add", out_dtype, None if config is None else v.config_key(config)))
    try:
        plan = _plans.lookup(key)
    except (KeyError, TypeError):
        plan = _plans.plan_for(key, _make_mul_add, x, w, a2, b2, y, out_dtype, config)
    return plan.run(x, w, None, y, None, None, a2, b2)


def _mul_add_grad(x, w, a, b, a2, b2, out_dtype, y, config):
    """fused_gemm_a16w16_mul_add with inputs that require grad (gemmkit.autograd, on the caller's a and b), after
    the checks of the same call without."""
    from .. import autograd

    key = ("mul_add", out_dtype, None)  # (the inference plan's key with grad mode off: built once, then looked up)
    autograd.checked("fused_gemm_a16w16_mul_add", y, config, lambda: _plans.plan_for(
        plan_key((x, w, a2, b2, None), key), _make_mul_add, x, w, a2, b2, None, out_dtype, None))
    return autograd.fused_gemm_a16w16_mul_add(x, w, a, b, out_dtype)


class _DegenerateMulAdd:
    def __init__(self, out_shape, dtype, device):
        self.out_shape, self.dtype, self.device = out_shape, dtype, device

    def run(self, x, w, bias, y, a_scale, b_scale, mul, add):
        out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device) if y is None else y
        if out.numel():
            out.copy_((torch.zeros(mul.shape, device=self.device) * mul.float() + add.float()).view(self.out_shape))
        return out


def _make_mul_add(x, w, a2, b2, y, out_dtype, config):
    """gemm_a16w16's plan with the mul / add epilogue inputs (K == 0: b broadcast, no kernel)."""
    v.check_devices(x=x, w=w, a=a2, b=b2, y=y)
    v.check_no_autograd(x=x, w=w, a=a2, b=b2, y=y)
    if x.shape[-1] == 0 and x.dtype == w.dtype:  # (y checked as every op's: shape, dtype, device)
        x2, lead = v.as_rows("x", x)
        out_dtype, _y2, _ = v.check_output(y, lead, x2.shape[0], w.shape[0], 0, out_dtype, x.dtype, x.device, "none")
        return _DegenerateMulAdd((*lead, w.shape[0]), out_dtype, x.device)
    return a16w16._make_plan(x, w, None, y, None, out_dtype, config, mul=a2, add=b2)


# ---------------------------------------------------------------------------------------------
# split / cat (the MLA kv_b_proj pattern)


def _whole_tiles(cfg: GemmConfig, config) -> GemmConfig:
    if config is not None and (cfg.SPLIT_K != 1 or cfg.STREAM_K):
        raise ValueError("config: the split/cat GEMM computes whole tiles (SPLIT_K=1, STREAM_K=False)")
    return dataclasses.replace(cfg, SPLIT_K=1, STREAM_K=False)


def check_split_dims(heads, d1, d2) -> None:
    for name, n in (("heads", heads), ("d1", d1), ("d2", d2)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")


def _make_split_cat(x, w, x_scale, w_scale, y, heads, d1, d2, out_dtype, config):
    fp8 = w.dtype in _FP8
    check_split_dims(heads, d1, d2)
    if fp8:
        v.check_tensor("x", x, _FP8)
    else:
        v.check_tensor("x", x, a16w16._IN_DTYPES)
        v.check_tensor("w", w, a16w16._IN_DTYPES)
        v.check_same_dtype("w", w, x)
    v.check_tensor("y", y, (torch.bfloat16, torch.float16, torch.float32))
    device = v.check_devices(x=x, w=w, x_scale=x_scale, w_scale=w_scale, y=y)
    v.check_no_autograd(x=x, w=w, x_scale=x_scale, w_scale=w_scale, y=y)
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (M, K), got shape {tuple(x.shape)}")
    M, K = x.shape
    N = v.check_weight("w", w, K)
    if N != heads * (d1 + d2):
        raise ValueError(f"w has {N} rows: expected heads * (d1 + d2) = {heads * (d1 + d2)}")
    if y.ndim != 3 or y.shape[0] != M or y.shape[1] != heads:
        raise ValueError(f"y has shape {tuple(y.shape)}: expected ({M}, {heads}, d3)")
    if y.shape[2] > 1 and y.stride(2) != 1:
        raise ValueError("y must have unit stride along its last dimension")
    d3 = y.shape[2]
    out_dtype = v.check_out_dtype(out_dtype, None, torch.bfloat16 if fp8 else x.dtype)
    out1 = torch.empty((M, heads, d1 + d3), dtype=out_dtype, device=device)
    out2 = torch.empty((M, heads, d2), dtype=out_dtype, device=device)
    dev = device_info(device)
    if fp8:
        if x_scale is None:
            raise ValueError("x_scale is required (x is FP8)")
        a_fmt = dense(x.dtype, a8w8._scale_kind("x_scale", x_scale, {(M, 1), (M,)}, f"per token: ({M}, 1) or ({M},)"))
        b_fmt = dense(w.dtype, a8w8._scale_kind("w_scale", w_scale, {(1, N), (N,), (N, 1)},
                                                f"per channel: (1, {N}), ({N},) or ({N}, 1)"))
        for name, t in (("x", x), ("w", w)):
            if K > 1 and t.stride(1) != 1:
                raise ValueError(f"{name} must be K-contiguous (stride 1 along K)")
        table = "a8w8_fp8"
    else:
        a_fmt = b_fmt = dense(x.dtype)
        v.check_layout("x", x)
        v.check_layout("w", w)
        table = "a16w16"
    if M == 0 or K == 0:  # (no kernel: empty outputs, or a zero product beside y's copy)
        return _SplitCat(None, (M, heads, d1 + d3), (M, heads, d2), out_dtype, device, d3)
    cfg = _whole_tiles(resolve_config(table, config, M, N, K, dev, a_fmt, b_fmt, out_dtype.itemsize), config)
    plan = DensePlan(x, w, out1.view(M, heads * (d1 + d3)), a_fmt, b_fmt, EpilogueSpec(), cfg, dev, out_dtype=out_dtype,
                     out_shape=(M, N), flatten_x=False, inputs=dict(a_scale=x_scale, b_scale=w_scale),
                     auto_config=config is None,
                     split_cat=dict(d1=d1, dh=d1 + d2, d3=d3, out1=out1, out2=out2, src=y if d3 else None))
    return _SplitCat(plan, (M, heads, d1 + d3), (M, heads, d2), out_dtype, device, d3)


class _SplitCat:
    def __init__(self, plan, shape1, shape2, dtype, device, d3):
        self.plan, self.shape1, self.shape2, self.dtype, self.device, self.d3 = plan, shape1, shape2, dtype, device, d3

    def run(self, x, w, x_scale, w_scale, y):
        out1 = torch.empty(self.shape1, dtype=self.dtype, device=self.device)
        out2 = torch.empty(self.shape2, dtype=self.dtype, device=self.device)
        if self.plan is None:  # (M == 0 or K == 0)
            out1[..., :out1.shape[-1] - self.d3].zero_()
            out1[..., out1.shape[-1] - self.d3:].copy_(y)
            out2.zero_()
        elif out1.numel() or out2.numel():
            self.plan.run(x, w, None, out1, x_scale, w_scale, None, None, out2, None, y if self.d3 else None)
        return out1, out2


def _split_cat(x, w, x_scale, w_scale, y, heads, d1, d2, out_dtype, config):
    return _split_cat_plan(x, w, x_scale, w_scale, y, heads, d1, d2, out_dtype, config).run(x, w, x_scale, w_scale, y)


def _split_cat_plan(x, w, x_scale, w_scale, y, heads, d1, d2, out_dtype, config):
    key = plan_key((x, w, x_scale, w_scale, y), ("split_cat", heads, d1, d2, type(d1), type(d2), type(heads), out_dtype,
                                                 None if config is None else v.config_key(config)))
    try:
        return _plans.lookup(key)
    except (KeyError, TypeError):
        return _plans.plan_for(key, _make_split_cat, x, w, x_scale, w_scale, y, heads, d1, d2, out_dtype, config)


def _split_cat_grad(x, w, y, heads, d1, d2, out_dtype, config):
    """fused_gemm_a16w16_split_cat with inputs that require grad (gemmkit.autograd), after the checks of the same
    call without."""
    from .. import autograd

    autograd.checked("fused_gemm_a16w16_split_cat", None, config,
                     lambda: _split_cat_plan(x, w, None, None, y, heads, d1, d2, out_dtype, None))
    return autograd.fused_gemm_a16w16_split_cat(x, w, y, heads, d1, d2, out_dtype)


def fused_gemm_a16w16_split_cat(x, w, y, heads, d1, d2, *, out_dtype=None, config=None):
    """The MLA kv_b_proj pattern in one launch: p = x @ w^T (M, heads * (d1 + d2)) viewed as
    (M, heads, d1 + d2) and split into p1 (M, heads, d1), p2 (M, heads, d2); returns
    (cat([p1, y], -1) (M, heads, d1 + d3), p2), both contiguous, written by the GEMM's epilogue
    (no intermediate, no torch.cat). x (M, K) bf16/fp16, w (heads * (d1 + d2), K) x's dtype,
    y (M, heads, d3) bf16/fp16/fp32 with unit stride along d3 (cast to out_dtype, default x's).
    Differentiable (gemmkit.autograd: x, w, y)."""
    if _is_compiling():
        return _library().traced_fused_gemm_split_cat(x, w, None, None, y, heads, d1, d2, out_dtype, config)
    if v.needs_grad(x, w, y):
        return _split_cat_grad(x, w, y, heads, d1, d2, out_dtype, config)
    return _split_cat(x, w, None, None, y, heads, d1, d2, out_dtype, config)


def fused_gemm_a8w8_split_cat(x, w, x_scale, w_scale, y, heads, d1, d2, *, out_dtype=torch.bfloat16, config=None):
    """fused_gemm_a16w16_split_cat with FP8 x (M, K) and w (heads * (d1 + d2), K), both
    K-contiguous: x_scale per tensor or per token ((M, 1) / (M,)), w_scale per tensor or per
    channel ((N,), (1, N), (N, 1)), float32. out_dtype: bf16 (default), fp16 or fp32."""
    if _is_compiling():
        return _library().traced_fused_gemm_split_cat(x, w, x_scale, w_scale, y, heads, d1, d2, out_dtype, config)
    return _split_cat(x, w, x_scale, w_scale, y, heads, d1, d2, out_dtype, config)
