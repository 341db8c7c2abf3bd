"""gemmkit's public ops as torch.library custom ops: ``torch.ops.gemmkit.<name>``.

Importing this module registers them (once). Under torch.compile the public functions
(gemmkit.gemm_a16w16, gemm_a8w8, quant.quantize_fp8, quant.quantize_int8) route here, so
Dynamo records one opaque op per call instead of tracing into the Triton launch; eagerly they
stay plain Python functions (no dispatcher cost).

Ops (outputs contiguous; the fake implementations take shapes and dtypes from
gemmkit.core.outputs):
  gemm_a16w16(x, w, bias, activation, out_dtype) -> y           and gemm_a16w16_out(..., y) -> ()
  gemm_a8w8(x, w, x_scale, w_scale, bias, activation, out_dtype, fast_accum=True) -> y
                                                                    and gemm_a8w8_out(..., y) -> ()
  gemm_a8w8_blockscale(x, w, x_scale, w_scale, bias, activation, out_dtype) -> y
                                                                    and gemm_a8w8_blockscale_out(..., y) -> ()
  gemm_a16w4(x, w_q, w_scale, w_zero, group_size, bias, activation, out_dtype) -> y   (and _out)
  gemm_a16wfp4(x, w, w_scale, bias, activation, out_dtype) -> y                     (and _out)
  gemm_afp4wfp4(x, w, x_scale, w_scale, bias, activation, out_dtype) -> y           (and _out)
  grouped_gemm_a16w16(x, w, expert_offsets, gather_idx, scatter_idx, routing_weights, bias, activation,
                      out_dtype) -> y (R, N)    (m_sizes= becomes offsets in torch ops first)
  grouped_gemm_a8w8(x, w, x_scale, w_scale, expert_offsets, gather_idx, scatter_idx, routing_weights, bias,
                    activation, out_dtype) -> y (R, N)
  grouped_gemm_a8w8_blockscale(x, w, x_scale, w_scale, expert_offsets, gather_idx, scatter_idx,
                               routing_weights, bias, activation, out_dtype) -> y (R, N)
  grouped_gated_a16w16(x, w_gate_up, expert_offsets, gather_idx, activation) -> y (R, I)
  batched_gemm_a16w16(x, w, bias, activation, out_dtype) -> y (B, M, N)
  batched_gemm_a8w8(x, w, x_scale, w_scale, bias, activation, out_dtype) -> y (B, M, N)
  quantize_fp8(t, granularity, dtype, scale) -> (q, scale)
  quantize_fp8_blockwise(t, block_rows, dtype, scale_format, scale_layout) -> (q, scale)
  quantize_int8(t, granularity, scale) -> (q, scale)
gemm_a16w16 and batched_gemm_a16w16 have a backward (gemmkit.autograd, registered at the end of this module).
A custom op may not return an alias of an input, so a preallocated y goes through the `_out`
variant (which mutates y and returns nothing), and a static quantization scale is returned as
a copy. `config=` is refused while tracing (pass it to eager calls or tune the table instead).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import autograd, quant
from .core import validate as v
from .core.outputs import blockwise_output, gemm_output, packed_gemm_output, quantize_output
from .ops import a8w8, a8w8_blockscale, a16w4, a16w16, fp4

LIB = "gemmkit"


def _check_traced(**tensors) -> None:
    """The eager ops' first checks of their tensor arguments (None or a torch.Tensor, none requiring grad), made
    while tracing before the custom op's schema coerces or rejects a value with its own message."""
    for name, t in tensors.items():
        if t is not None:
            v.check_tensor(name, t)
    v.check_no_autograd(**tensors)


def _check_no_config(config) -> None:
    if config is not None:
        raise ValueError("config= is not supported under torch.compile: gemmkit's custom ops take the "
                         "tuned (or derived) config; pass config= to eager calls only")


# ---------------------------------------------------------------------------------------------
# gemm_a16w16


@torch.library.custom_op(f"{LIB}::gemm_a16w16", mutates_args=())
def _a16w16(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str],
            out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return a16w16.gemm_a16w16(x, w, bias, activation=activation, out_dtype=out_dtype)


@torch.library.custom_op(f"{LIB}::gemm_a16w16_out", mutates_args=("y",))
def _a16w16_out(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str],
                out_dtype: Optional[torch.dtype], y: torch.Tensor) -> None:
    a16w16.gemm_a16w16(x, w, bias, activation=activation, out_dtype=out_dtype, y=y)


def _a16w16_output(x, w, out_dtype):
    v.check_tensor("x", x, a16w16._IN_DTYPES)
    v.check_tensor("w", w, a16w16._IN_DTYPES)
    v.check_same_dtype("w", w, x)
    return gemm_output(x.shape, w.shape, v.check_out_dtype(out_dtype, None, x.dtype), x.dtype)


def _a8w8_output(x, w, out_dtype):
    v.check_tensor("x", x, a8w8._X_DTYPES)
    v.check_tensor("w", w, a8w8._W_DTYPES)
    return gemm_output(x.shape, w.shape, v.check_out_dtype(out_dtype, None, torch.bfloat16), torch.bfloat16)


def _fake_output(shape_dtype, like):
    shape, dtype = shape_dtype
    return like.new_empty(shape, dtype=dtype)


def _check_fake_out(y, shape_dtype) -> None:
    """y against the result's (shape, dtype), with the eager ops' errors (validate.check_output)."""
    shape, dtype = shape_dtype
    if tuple(y.shape) != tuple(shape):
        raise ValueError(f"y must have shape {tuple(shape)}, got {tuple(y.shape)}")
    if y.dtype != dtype:
        raise TypeError(f"y has dtype {y.dtype} but the result dtype is {dtype}")


def _checked_output(output, x, w, bias, activation, out_dtype):
    """output(x, w, out_dtype) after the epilogue checks the op makes (activation name, bias (N,)), so that a
    traced program fails where the eager one would, not when it runs."""
    v.check_activation(activation)
    shape_dtype = output(x, w, out_dtype)
    v.check_bias(bias, shape_dtype[0][-1] if len(shape_dtype[0]) else 1, v.BIAS_DTYPES)
    return shape_dtype


def _register_gemm_fakes(op, op_out, output) -> None:
    """The fakes of a GEMM op and its _out variant, whose arguments are (x, w, ..., bias, activation, out_dtype)
    and (x, w, ..., bias, activation, out_dtype, y) (the dispatcher passes them positionally); output(x, w,
    out_dtype) gives the result's (shape, dtype)."""
    op.register_fake(lambda x, w, *rest: _fake_output(_checked_output(output, x, w, *rest[-3:]), x))
    # (_out: out_dtype None means y's dtype, as the op itself takes it)
    op_out.register_fake(lambda x, w, *rest: _check_fake_out(rest[-1], _checked_output(
        output, x, w, rest[-4], rest[-3], rest[-1].dtype if rest[-2] is None else rest[-2])))


_register_gemm_fakes(_a16w16, _a16w16_out, _a16w16_output)


def traced_gemm_a16w16(x, w, bias, activation, out_dtype, y, config):
    """gemm_a16w16 through torch.ops.gemmkit (what the public op calls while being traced)."""
    if v.needs_grad(x, w, bias):
        autograd.check_grad_call("gemm_a16w16", y, config)
        return autograd.gemm_a16w16(x, w, bias, activation, out_dtype)
    _check_no_config(config)
    if y is None:
        return torch.ops.gemmkit.gemm_a16w16(x, w, bias, activation, out_dtype)
    torch.ops.gemmkit.gemm_a16w16_out(x, w, bias, activation, y.dtype if out_dtype is None else out_dtype, y)
    return y


# ---------------------------------------------------------------------------------------------
# gemm_a8w8


@torch.library.custom_op(f"{LIB}::gemm_a8w8", mutates_args=())
def _a8w8(x: torch.Tensor, w: torch.Tensor, x_scale: Optional[torch.Tensor], w_scale: torch.Tensor,
          bias: Optional[torch.Tensor], activation: Optional[str], out_dtype: Optional[torch.dtype],
          fast_accum: bool = True) -> torch.Tensor:
    return a8w8.gemm_a8w8(x, w, x_scale, w_scale, bias, activation=activation, out_dtype=out_dtype,
                          fast_accum=fast_accum)


@torch.library.custom_op(f"{LIB}::gemm_a8w8_out", mutates_args=("y",))
def _a8w8_out(x: torch.Tensor, w: torch.Tensor, x_scale: Optional[torch.Tensor], w_scale: torch.Tensor,
              bias: Optional[torch.Tensor], activation: Optional[str], out_dtype: Optional[torch.dtype],
              y: torch.Tensor, fast_accum: bool = True) -> None:
    a8w8.gemm_a8w8(x, w, x_scale, w_scale, bias, activation=activation, out_dtype=out_dtype, y=y,
                   fast_accum=fast_accum)


@_a8w8.register_fake
def _(x, w, x_scale, w_scale, bias, activation, out_dtype, fast_accum=True):
    return _fake_output(_checked_output(_a8w8_output, x, w, bias, activation, out_dtype), x)


@_a8w8_out.register_fake
def _(x, w, x_scale, w_scale, bias, activation, out_dtype, y, fast_accum=True):
    _check_fake_out(y, _checked_output(_a8w8_output, x, w, bias, activation, y.dtype if out_dtype is None
                                       else out_dtype))


_DYNAMIC_X = (torch.bfloat16, torch.float16)  # (the 8-bit ops' x quantized in the op: differentiable)


def traced_gemm_a8w8(x, w, x_scale, w_scale, bias, activation, out_dtype, y, config, fast_accum=True):
    """gemm_a8w8 through torch.ops.gemmkit (what the public op calls while being traced)."""
    a8w8.check_fast_accum(fast_accum)
    if x_scale is None and v.needs_grad(x, w_scale, bias) and getattr(x, "dtype", None) in _DYNAMIC_X:
        autograd.check_frozen_call("gemm_a8w8", w_scale, y, config)  # (dynamic x: gradients for x and bias)
        return autograd.gemm_a8w8_dynamic(x, w, w_scale, bias, activation, out_dtype, fast_accum)
    _check_traced(x=x, w=w, x_scale=x_scale, w_scale=w_scale, bias=bias, y=y)
    _check_no_config(config)
    if y is None:
        return torch.ops.gemmkit.gemm_a8w8(x, w, x_scale, w_scale, bias, activation, out_dtype, fast_accum)
    torch.ops.gemmkit.gemm_a8w8_out(x, w, x_scale, w_scale, bias, activation,
                                    y.dtype if out_dtype is None else out_dtype, y, fast_accum)
    return y


# ---------------------------------------------------------------------------------------------
# gemm_a8w8_blockscale


@torch.library.custom_op(f"{LIB}::gemm_a8w8_blockscale", mutates_args=())
def _a8w8_blockscale(x: torch.Tensor, w: torch.Tensor, x_scale: Optional[torch.Tensor], w_scale: torch.Tensor,
                     bias: Optional[torch.Tensor], activation: Optional[str],
                     out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return a8w8_blockscale.gemm_a8w8_blockscale(x, w, x_scale, w_scale, bias, activation=activation,
                                                out_dtype=out_dtype)


@torch.library.custom_op(f"{LIB}::gemm_a8w8_blockscale_out", mutates_args=("y",))
def _a8w8_blockscale_out(x: torch.Tensor, w: torch.Tensor, x_scale: Optional[torch.Tensor], w_scale: torch.Tensor,
                         bias: Optional[torch.Tensor], activation: Optional[str], out_dtype: Optional[torch.dtype],
                         y: torch.Tensor) -> None:
    a8w8_blockscale.gemm_a8w8_blockscale(x, w, x_scale, w_scale, bias, activation=activation, out_dtype=out_dtype,
                                         y=y)


def _a8w8_blockscale_output(x, w, out_dtype):
    v.check_tensor("x", x, a8w8_blockscale.FP8 + (torch.bfloat16, torch.float16))
    v.check_tensor("w", w, a8w8_blockscale.FP8)
    return gemm_output(x.shape, w.shape, v.check_out_dtype(out_dtype, None, torch.bfloat16), torch.bfloat16)


_register_gemm_fakes(_a8w8_blockscale, _a8w8_blockscale_out, _a8w8_blockscale_output)


def traced_gemm_a8w8_blockscale(x, w, x_scale, w_scale, bias, activation, out_dtype, y, config):
    """gemm_a8w8_blockscale through torch.ops.gemmkit (what the public op calls while being traced)."""
    if x_scale is None and v.needs_grad(x, w_scale, bias) and getattr(x, "dtype", None) in _DYNAMIC_X:
        autograd.check_frozen_call("gemm_a8w8_blockscale", w_scale, y, config)  # (dynamic x: gradients for x and bias)
        return autograd.gemm_a8w8_blockscale_dynamic(x, w, w_scale, bias, activation, out_dtype)
    _check_traced(x=x, w=w, x_scale=x_scale, w_scale=w_scale, bias=bias, y=y)
    _check_no_config(config)
    if y is None:
        return torch.ops.gemmkit.gemm_a8w8_blockscale(x, w, x_scale, w_scale, bias, activation, out_dtype)
    torch.ops.gemmkit.gemm_a8w8_blockscale_out(x, w, x_scale, w_scale, bias, activation,
                                               y.dtype if out_dtype is None else out_dtype, y)
    return y


# ---------------------------------------------------------------------------------------------
# quantizers


def _unaliased(q_scale, scale):
    """A static quantization returns the given scale (reshaped): a custom op must return a copy."""
    q, s = q_scale
    return q, (s.clone() if scale is not None else s)


@torch.library.custom_op(f"{LIB}::quantize_fp8", mutates_args=())
def _quantize_fp8(t: torch.Tensor, granularity: str, dtype: torch.dtype,
                  scale: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return _unaliased(quant.quantize_fp8(t, granularity, dtype, scale), scale)


@torch.library.custom_op(f"{LIB}::quantize_int8", mutates_args=())
def _quantize_int8(t: torch.Tensor, granularity: str,
                   scale: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return _unaliased(quant.quantize_int8(t, granularity, scale), scale)


def _fake_quantized(t, granularity, qdtype, scale):
    v.check_tensor("t", t, quant._IN_DTYPES)
    quant.check_static_scale(granularity, scale)
    q, s = quantize_output(t.shape, granularity, qdtype)
    return _fake_output(q, t), _fake_output(s, t)


@_quantize_fp8.register_fake
def _(t, granularity, dtype, scale):
    if dtype not in quant.FP8_TARGETS:
        raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    return _fake_quantized(t, granularity, dtype, scale)


@_quantize_int8.register_fake
def _(t, granularity, scale):
    return _fake_quantized(t, granularity, torch.int8, scale)


@torch.library.custom_op(f"{LIB}::quantize_fp8_blockwise", mutates_args=())
def _quantize_fp8_blockwise(t: torch.Tensor, block_rows: int, dtype: torch.dtype, scale_format: str,
                            scale_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    return quant.quantize_fp8_blockwise(t, (block_rows, 128), dtype, scale_format, scale_layout)


@_quantize_fp8_blockwise.register_fake
def _(t, block_rows, dtype, scale_format, scale_layout):
    v.check_tensor("t", t, quant._IN_DTYPES)
    if dtype not in quant.FP8_TARGETS:
        raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    quant.check_block_args(t, (block_rows, 128), scale_format, scale_layout)  # (where the eager op would fail)
    (q_shape, q_dtype), (s_shape, s_dtype, s_strides) = blockwise_output(t.shape, block_rows, dtype, scale_layout)
    return t.new_empty(q_shape, dtype=q_dtype), t.new_empty_strided(s_shape, s_strides, dtype=s_dtype)


def traced_quantize_fp8_blockwise(t, block, dtype, scale_format, scale_layout):
    """quant.quantize_fp8_blockwise through torch.ops.gemmkit."""
    _check_traced(t=t)
    if tuple(block) not in ((1, 128), (128, 128)):
        raise ValueError(f"block must be (1, 128) (activations) or (128, 128) (weights), got {block!r}")
    return torch.ops.gemmkit.quantize_fp8_blockwise(t, int(block[0]), dtype, scale_format, scale_layout)


def traced_quantize_fp8(t, granularity, dtype, scale):
    """quant.quantize_fp8 through torch.ops.gemmkit."""
    _check_traced(t=t, scale=scale)
    return torch.ops.gemmkit.quantize_fp8(t, granularity, dtype, scale)


def traced_quantize_int8(t, granularity, scale):
    """quant.quantize_int8 through torch.ops.gemmkit."""
    _check_traced(t=t, scale=scale)
    return torch.ops.gemmkit.quantize_int8(t, granularity, scale)


# ---------------------------------------------------------------------------------------------
# fused feed-forward and fused-epilogue GEMMs (gemmkit.ops.fused). A preallocated y is filled
# from the op's result under tracing (one copy); eager calls write y directly.

from .core.outputs import ff_output  # noqa: E402
from .ops import fused  # noqa: E402


@torch.library.custom_op(f"{LIB}::ff_a16w16_gated", mutates_args=())
def _ff_gated(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, activation: Optional[str],
              w_up: Optional[torch.Tensor], layout: str, out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return fused.ff_a16w16_gated(x, w_gate_up, w_down, activation, w_up=w_up, layout=layout, out_dtype=out_dtype)


@_ff_gated.register_fake
def _(x, w_gate_up, w_down, activation, w_up, layout, out_dtype):
    first = w_gate_up.shape if w_up is None else (2 * w_gate_up.shape[0], w_gate_up.shape[1])
    return _fake_output(ff_output(x.shape, first, w_down.shape, out_dtype, x.dtype, True), x)


@torch.library.custom_op(f"{LIB}::ff_a16w16", mutates_args=())
def _ff(x: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, activation: Optional[str],
        out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return fused.ff_a16w16(x, w_up, w_down, activation, out_dtype=out_dtype)


@_ff.register_fake
def _(x, w_up, w_down, activation, out_dtype):
    return _fake_output(ff_output(x.shape, w_up.shape, w_down.shape, out_dtype, x.dtype, False), x)


@torch.library.custom_op(f"{LIB}::ff_a8w8_gated", mutates_args=())
def _ff_fp8(x: torch.Tensor, w_gate_up: torch.Tensor, w_gate_up_scale: torch.Tensor, w_down: torch.Tensor,
            w_down_scale: torch.Tensor, activation: Optional[str], w_up: Optional[torch.Tensor], layout: str,
            out_dtype: Optional[torch.dtype], fast_accum: bool) -> torch.Tensor:
    return fused.ff_a8w8_gated(x, w_gate_up, w_gate_up_scale, w_down, w_down_scale, activation, w_up=w_up,
                               layout=layout, out_dtype=out_dtype, fast_accum=fast_accum)


@_ff_fp8.register_fake
def _(x, w_gate_up, w_gate_up_scale, w_down, w_down_scale, activation, w_up, layout, out_dtype, fast_accum):
    first = w_gate_up.shape if w_up is None else (2 * w_gate_up.shape[0], w_gate_up.shape[1])
    return _fake_output(ff_output(x.shape, first, w_down.shape, out_dtype, torch.bfloat16, True), x)


@torch.library.custom_op(f"{LIB}::fused_gemm_a16w16_mul_add", mutates_args=())
def _mul_add(x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return fused.fused_gemm_a16w16_mul_add(x, w, a, b, out_dtype=out_dtype)


@_mul_add.register_fake
def _(x, w, a, b, out_dtype):
    shape_dtype = gemm_output(x.shape, w.shape, out_dtype, x.dtype)
    lead = tuple(x.shape[:-1])
    for name, t in (("a", a), ("b", b)):  # (the op's own check: broadcastable to the output)
        fused._operand(name, t, x.device, math.prod(lead), w.shape[0], lead)
    return _fake_output(shape_dtype, x)


def _filled(out, y):
    """out, or out copied into the preallocated y after the eager ops' checks of y (validate.check_out; y's overlap
    with the inputs needs data pointers, which tracing lacks: functionalization copies there anyway)."""
    if y is None:
        return out
    lead = tuple(out.shape[:-1])
    v.check_out(y, lead, math.prod(lead), out.shape[-1], out.dtype, out.device)
    v.check_no_autograd(y=y)
    y.copy_(out)
    return y


def traced_ff_a16w16_gated(x, w_gate_up, w_down, activation, w_up, layout, out_dtype, y, config, down_config):
    if v.needs_grad(x, w_gate_up, w_up, w_down):
        fused._check_down(w_down, fused.gate_up_views(w_gate_up, w_up, layout)[0], x, a16w16._IN_DTYPES)
        autograd.check_grad_call("ff_a16w16_gated", y, config if config is not None else down_config)
        return autograd.ff_a16w16_gated(x, w_gate_up, w_up, w_down, activation, layout, out_dtype)
    _check_no_config(config)
    _check_no_config(down_config)
    out_dtype = y.dtype if out_dtype is None and y is not None else out_dtype
    return _filled(torch.ops.gemmkit.ff_a16w16_gated(x, w_gate_up, w_down, activation, w_up, layout, out_dtype), y)


def traced_ff_a16w16(x, w_up, w_down, activation, out_dtype, y, config, down_config):
    if v.needs_grad(x, w_up, w_down):
        v.check_tensor("w_up", w_up)
        fused._check_down(w_down, w_up, x, a16w16._IN_DTYPES)
        autograd.check_grad_call("ff_a16w16", y, config if config is not None else down_config)
        return autograd.ff_a16w16(x, w_up, w_down, activation, out_dtype)
    _check_no_config(config)
    _check_no_config(down_config)
    out_dtype = y.dtype if out_dtype is None and y is not None else out_dtype
    return _filled(torch.ops.gemmkit.ff_a16w16(x, w_up, w_down, activation, out_dtype), y)


def traced_ff_a8w8_gated(x, w_gate_up, w_gate_up_scale, w_down, w_down_scale, activation, w_up, layout, out_dtype,
                         y, config, down_config, fast_accum):
    _check_traced(x=x, w_gate_up=w_gate_up, w_up=w_up, w_gate_up_scale=w_gate_up_scale, w_down=w_down,
                        w_down_scale=w_down_scale, y=y)
    a8w8.check_fast_accum(fast_accum)
    _check_no_config(config)
    _check_no_config(down_config)
    return _filled(torch.ops.gemmkit.ff_a8w8_gated(x, w_gate_up, w_gate_up_scale, w_down, w_down_scale, activation,
                                                   w_up, layout, out_dtype, fast_accum), y)


def traced_fused_gemm_a16w16_mul_add(x, w, a, b, out_dtype, y, config):
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, (int, float, torch.Tensor)) or isinstance(t, bool):
            raise TypeError(f"{name} must be a float or a tensor, got {type(t).__name__}")
    if v.needs_grad(x, w, a, b):
        autograd.check_grad_call("fused_gemm_a16w16_mul_add", y, config)
        lead = tuple(x.shape[:-1])
        for name, t in (("a", a), ("b", b)):  # (the op's checks: dtype, device, broadcastable to the output)
            if isinstance(t, torch.Tensor):
                fused._operand(name, t, x.device, math.prod(lead), w.shape[0], lead)
        return autograd.fused_gemm_a16w16_mul_add(x, w, a, b, out_dtype)
    # (ones * t: a float enters the graph as an input, where torch.full would specialize on its value and recompile
    # for every new one)
    a, b = (t if isinstance(t, torch.Tensor) else torch.ones(1, dtype=torch.float32, device=x.device) * t
            for t in (a, b))
    _check_no_config(config)
    out_dtype = y.dtype if out_dtype is None and y is not None else out_dtype
    return _filled(torch.ops.gemmkit.fused_gemm_a16w16_mul_add(x, w, a, b, out_dtype), y)


@torch.library.custom_op(f"{LIB}::fused_gemm_split_cat", mutates_args=())
def _split_cat(x: torch.Tensor, w: torch.Tensor, x_scale: Optional[torch.Tensor], w_scale: Optional[torch.Tensor],
               y: torch.Tensor, heads: int, d1: int, d2: int,
               out_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor]:
    return fused._split_cat(x, w, x_scale, w_scale, y, heads, d1, d2, out_dtype, None)


@_split_cat.register_fake
def _(x, w, x_scale, w_scale, y, heads, d1, d2, out_dtype):
    from .core.outputs import split_cat_output

    default = torch.bfloat16 if w.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else x.dtype
    (s1, s2), dtype = split_cat_output(x.shape, w.shape, y.shape, heads, d1, d2, out_dtype or default)
    return x.new_empty(s1, dtype=dtype), x.new_empty(s2, dtype=dtype)


def traced_fused_gemm_split_cat(x, w, x_scale, w_scale, y, heads, d1, d2, out_dtype, config):
    v.check_tensor("y", y, (torch.bfloat16, torch.float16, torch.float32))  # (an input here: the part cat with)
    fused.check_split_dims(heads, d1, d2)
    if x_scale is None and v.needs_grad(x, w, y):  # (the 16-bit form: differentiable)
        autograd.check_grad_call("fused_gemm_a16w16_split_cat", None, config)
        return autograd.fused_gemm_a16w16_split_cat(x, w, y, heads, d1, d2, out_dtype)
    _check_traced(x=x, w=w, x_scale=x_scale, w_scale=w_scale, y=y)
    _check_no_config(config)
    return torch.ops.gemmkit.fused_gemm_split_cat(x, w, x_scale, w_scale, y, heads, d1, d2, out_dtype)


# 4-bit weights: gemm_a16w4, gemm_a16wfp4, gemm_afp4wfp4 (each with an _out variant)


@torch.library.custom_op(f"{LIB}::gemm_a16w4", mutates_args=())
def _a16w4(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, w_zero: Optional[torch.Tensor],
           group_size: Optional[int], bias: Optional[torch.Tensor], activation: Optional[str],
           out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return a16w4.gemm_a16w4(x, w_q, w_scale, w_zero, group_size=group_size, bias=bias, activation=activation,
                            out_dtype=out_dtype)


@torch.library.custom_op(f"{LIB}::gemm_a16w4_out", mutates_args=("y",))
def _a16w4_out(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, w_zero: Optional[torch.Tensor],
               group_size: Optional[int], bias: Optional[torch.Tensor], activation: Optional[str],
               out_dtype: Optional[torch.dtype], y: torch.Tensor) -> None:
    a16w4.gemm_a16w4(x, w_q, w_scale, w_zero, group_size=group_size, bias=bias, activation=activation,
                     out_dtype=out_dtype, y=y)


def _a16w4_output(x, w, out_dtype):
    v.check_tensor("x", x, a16w4._IN_DTYPES)
    v.check_tensor("w", w, (torch.uint8,))
    return packed_gemm_output(x.shape, w.shape, v.check_out_dtype(out_dtype, None, x.dtype), x.dtype)


_register_gemm_fakes(_a16w4, _a16w4_out, _a16w4_output)


def _traced(name, args, out_dtype, y, config):
    """torch.ops.gemmkit.<name>(*args, out_dtype), or its _out variant writing y."""
    _check_no_config(config)
    if y is None:
        return getattr(torch.ops.gemmkit, name)(*args, out_dtype)
    getattr(torch.ops.gemmkit, name + "_out")(*args, y.dtype if out_dtype is None else out_dtype, y)
    return y


def traced_gemm_a16w4(x, w_q, w_scale, w_zero, group_size, bias, activation, out_dtype, y, config):
    """gemm_a16w4 through torch.ops.gemmkit (what the public op calls while being traced)."""
    if group_size is not None and type(group_size) is not int:  # (the schema's int would coerce True, 32.0)
        a16w4.check_group_size(group_size, 0)
    group_size = None if group_size == -1 else group_size
    if v.needs_grad(x, w_scale, bias):  # (the weight frozen: gradients for x and bias)
        autograd.check_frozen_call("gemm_a16w4", w_scale, y, config)
        v.check_tensor("x", x)
        K = v.as_rows("x", x)[0].shape[1]
        return autograd.gemm_a16w4(x, w_q, w_scale, w_zero, a16w4.check_group_size(group_size, K) if K else 1, bias,
                                   activation, out_dtype)
    _check_traced(x=x, w_q=w_q, w_scale=w_scale, w_zero=w_zero, bias=bias, y=y)
    return _traced("gemm_a16w4", (x, w_q, w_scale, w_zero, group_size, bias, activation), out_dtype, y, config)


@torch.library.custom_op(f"{LIB}::gemm_a16wfp4", mutates_args=())
def _a16wfp4(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: Optional[torch.Tensor],
             activation: Optional[str], out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return fp4.gemm_a16wfp4(x, w, w_scale, bias=bias, activation=activation, out_dtype=out_dtype)


@torch.library.custom_op(f"{LIB}::gemm_a16wfp4_out", mutates_args=("y",))
def _a16wfp4_out(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: Optional[torch.Tensor],
                 activation: Optional[str], out_dtype: Optional[torch.dtype], y: torch.Tensor) -> None:
    fp4.gemm_a16wfp4(x, w, w_scale, bias=bias, activation=activation, out_dtype=out_dtype, y=y)


_register_gemm_fakes(_a16wfp4, _a16wfp4_out, _a16w4_output)


def traced_gemm_a16wfp4(x, w, w_scale, bias, activation, out_dtype, y, config):
    """gemm_a16wfp4 through torch.ops.gemmkit."""
    if v.needs_grad(x, w_scale, bias):  # (the weight frozen: gradients for x and bias)
        autograd.check_frozen_call("gemm_a16wfp4", w_scale, y, config)
        return autograd.gemm_a16wfp4(x, w, w_scale, bias, activation, out_dtype)
    _check_traced(x=x, w=w, w_scale=w_scale, bias=bias, y=y)
    return _traced("gemm_a16wfp4", (x, w, w_scale, bias, activation), out_dtype, y, config)


@torch.library.custom_op(f"{LIB}::gemm_afp4wfp4", mutates_args=())
def _afp4wfp4(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
              bias: Optional[torch.Tensor], activation: Optional[str],
              out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return fp4.gemm_afp4wfp4(x, w, x_scale, w_scale, bias=bias, activation=activation, out_dtype=out_dtype)


@torch.library.custom_op(f"{LIB}::gemm_afp4wfp4_out", mutates_args=("y",))
def _afp4wfp4_out(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                  bias: Optional[torch.Tensor], activation: Optional[str], out_dtype: Optional[torch.dtype],
                  y: torch.Tensor) -> None:
    fp4.gemm_afp4wfp4(x, w, x_scale, w_scale, bias=bias, activation=activation, out_dtype=out_dtype, y=y)


def _afp4wfp4_output(x, w, out_dtype):
    v.check_tensor("x", x, (torch.uint8,))
    v.check_tensor("w", w, (torch.uint8,))
    return packed_gemm_output(x.shape, w.shape, v.check_out_dtype(out_dtype, None, torch.bfloat16), torch.bfloat16,
                              x_packed=True)


_register_gemm_fakes(_afp4wfp4, _afp4wfp4_out, _afp4wfp4_output)


def traced_gemm_afp4wfp4(x, w, x_scale, w_scale, bias, activation, out_dtype, y, config):
    """gemm_afp4wfp4 through torch.ops.gemmkit."""
    _check_traced(x=x, w=w, x_scale=x_scale, w_scale=w_scale, bias=bias, y=y)
    return _traced("gemm_afp4wfp4", (x, w, x_scale, w_scale, bias, activation), out_dtype, y, config)


# ---------------------------------------------------------------------------------------------
# MoE / batched family (issue 13): grouped_gemm_a16w16 / _a8w8, batched_gemm_a16w16 / _a8w8. The
# output shape depends on shapes only ((R, N) from x or gather_idx), never on routing values.

from .core.outputs import batched_output, grouped_output  # noqa: E402
from .ops import batched, grouped  # noqa: E402


@torch.library.custom_op(f"{LIB}::grouped_gemm_a16w16", mutates_args=())
def _grouped_a16w16(x: torch.Tensor, w: torch.Tensor, expert_offsets: torch.Tensor, gather_idx: Optional[torch.Tensor],
                    scatter_idx: Optional[torch.Tensor], routing_weights: Optional[torch.Tensor],
                    bias: Optional[torch.Tensor], activation: Optional[str],
                    out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return grouped.grouped_gemm_a16w16(x, w, expert_offsets, gather_idx=gather_idx, scatter_idx=scatter_idx,
                                       routing_weights=routing_weights, bias=bias, activation=activation,
                                       out_dtype=out_dtype)


@_grouped_a16w16.register_fake
def _(x, w, expert_offsets, gather_idx, scatter_idx, routing_weights, bias, activation, out_dtype):
    v.check_tensor("x", x, grouped._IN_DTYPES)
    v.check_tensor("w", w, grouped._IN_DTYPES)
    return _fake_output(grouped_output(x.shape, w.shape, None if gather_idx is None else gather_idx.shape,
                                       v.check_out_dtype(out_dtype, None, x.dtype), x.dtype), x)


@torch.library.custom_op(f"{LIB}::grouped_gemm_a8w8", mutates_args=())
def _grouped_a8w8(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                  expert_offsets: torch.Tensor, gather_idx: Optional[torch.Tensor], scatter_idx: Optional[torch.Tensor],
                  routing_weights: Optional[torch.Tensor], bias: Optional[torch.Tensor], activation: Optional[str],
                  out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return grouped.grouped_gemm_a8w8(x, w, x_scale, w_scale, expert_offsets, gather_idx=gather_idx,
                                     scatter_idx=scatter_idx, routing_weights=routing_weights, bias=bias,
                                     activation=activation, out_dtype=out_dtype)


def _fake_grouped_8bit(x, w, gather_idx, out_dtype, dtypes):
    """The fake output of an 8-bit grouped GEMM: (R, N), bf16 by default."""
    v.check_tensor("x", x, dtypes)
    v.check_tensor("w", w, dtypes)
    return _fake_output(grouped_output(x.shape, w.shape, None if gather_idx is None else gather_idx.shape,
                                       v.check_out_dtype(out_dtype, None, torch.bfloat16), torch.bfloat16), x)


@_grouped_a8w8.register_fake
def _(x, w, x_scale, w_scale, expert_offsets, gather_idx, scatter_idx, routing_weights, bias, activation, out_dtype):
    return _fake_grouped_8bit(x, w, gather_idx, out_dtype, grouped.FP8 + (torch.int8,))


@torch.library.custom_op(f"{LIB}::grouped_gemm_a8w8_blockscale", mutates_args=())
def _grouped_a8w8_blockscale(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                             expert_offsets: torch.Tensor, gather_idx: Optional[torch.Tensor],
                             scatter_idx: Optional[torch.Tensor], routing_weights: Optional[torch.Tensor],
                             bias: Optional[torch.Tensor], activation: Optional[str],
                             out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return grouped.grouped_gemm_a8w8_blockscale(x, w, x_scale, w_scale, expert_offsets, gather_idx=gather_idx,
                                                scatter_idx=scatter_idx, routing_weights=routing_weights, bias=bias,
                                                activation=activation, out_dtype=out_dtype)


@_grouped_a8w8_blockscale.register_fake
def _(x, w, x_scale, w_scale, expert_offsets, gather_idx, scatter_idx, routing_weights, bias, activation, out_dtype):
    return _fake_grouped_8bit(x, w, gather_idx, out_dtype, grouped.FP8)


def traced_grouped_gemm_a8w8_blockscale(x, w, x_scale, w_scale, expert_offsets, m_sizes, gather_idx, scatter_idx,
                                        routing_weights, bias, activation, out_dtype, config):
    """grouped_gemm_a8w8_blockscale through torch.ops.gemmkit."""
    _check_traced(x=x, w=w, x_scale=x_scale, w_scale=w_scale, routing_weights=routing_weights, bias=bias)
    _check_no_config(config)
    return torch.ops.gemmkit.grouped_gemm_a8w8_blockscale(x, w, x_scale, w_scale,
                                                          _traced_offsets(expert_offsets, m_sizes), gather_idx,
                                                          scatter_idx, routing_weights, bias, activation, out_dtype)


@torch.library.custom_op(f"{LIB}::grouped_gated_a16w16", mutates_args=())
def _grouped_gated_a16w16(x: torch.Tensor, w_gate_up: torch.Tensor, expert_offsets: torch.Tensor,
                          gather_idx: Optional[torch.Tensor], activation: Optional[str]) -> torch.Tensor:
    return grouped.grouped_gated_a16w16(x, w_gate_up, expert_offsets, gather_idx=gather_idx, activation=activation)


@_grouped_gated_a16w16.register_fake
def _(x, w_gate_up, expert_offsets, gather_idx, activation):
    v.check_tensor("x", x, grouped._IN_DTYPES)
    v.check_tensor("w_gate_up", w_gate_up, grouped._IN_DTYPES)
    E, I2, K = grouped.gated_weight_shape(w_gate_up)
    return _fake_output(grouped_output(x.shape, (E, I2 // 2, K), None if gather_idx is None else gather_idx.shape,
                                       None, x.dtype), x)


def traced_grouped_gated_a16w16(x, w_gate_up, expert_offsets, gather_idx, activation, config):
    """grouped_gated_a16w16 through torch.ops.gemmkit."""
    _check_traced(x=x, w_gate_up=w_gate_up)
    _check_no_config(config)
    return torch.ops.gemmkit.grouped_gated_a16w16(x, w_gate_up, expert_offsets, gather_idx, activation)


def _traced_offsets(expert_offsets, m_sizes):
    """The (E + 1,) int32 offsets, from m_sizes with torch ops that trace (no out= view)."""
    if (expert_offsets is None) == (m_sizes is None):
        raise ValueError("pass exactly one of expert_offsets ((E + 1,) int32 cumulative) and m_sizes ((E,) int32)")
    if expert_offsets is not None:
        return expert_offsets
    grouped.check_sizes(m_sizes)
    return torch.nn.functional.pad(torch.cumsum(m_sizes, 0), (1, 0)).to(torch.int32)


def traced_grouped_gemm_a16w16(x, w, expert_offsets, m_sizes, gather_idx, scatter_idx, routing_weights, bias,
                               activation, out_dtype, config):
    """grouped_gemm_a16w16 through torch.ops.gemmkit (what the public op calls while being traced)."""
    _check_traced(x=x, w=w, routing_weights=routing_weights, bias=bias)
    _check_no_config(config)
    return torch.ops.gemmkit.grouped_gemm_a16w16(x, w, _traced_offsets(expert_offsets, m_sizes), gather_idx,
                                                 scatter_idx, routing_weights, bias, activation, out_dtype)


def traced_grouped_gemm_a8w8(x, w, x_scale, w_scale, expert_offsets, m_sizes, gather_idx, scatter_idx,
                             routing_weights, bias, activation, out_dtype, config):
    """grouped_gemm_a8w8 through torch.ops.gemmkit."""
    _check_traced(x=x, w=w, x_scale=x_scale, w_scale=w_scale, routing_weights=routing_weights, bias=bias)
    _check_no_config(config)
    return torch.ops.gemmkit.grouped_gemm_a8w8(x, w, x_scale, w_scale, _traced_offsets(expert_offsets, m_sizes),
                                               gather_idx, scatter_idx, routing_weights, bias, activation, out_dtype)


@torch.library.custom_op(f"{LIB}::sort_by_expert", mutates_args=())
def _sort_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from . import moe

    return moe.sort_by_expert(topk_ids, num_experts)


@_sort_by_expert.register_fake
def _(topk_ids, num_experts):
    n = topk_ids.shape[0] * topk_ids.shape[1]
    return tuple(topk_ids.new_empty(size, dtype=torch.int32) for size in (n, n, num_experts + 1))


def traced_sort_by_expert(topk_ids, num_experts):
    """sort_by_expert through torch.ops.gemmkit (its arguments checked by the caller)."""
    _check_traced(topk_ids=topk_ids)
    return torch.ops.gemmkit.sort_by_expert(topk_ids, num_experts)


@torch.library.custom_op(f"{LIB}::batched_gemm_a16w16", mutates_args=())
def _batched_a16w16(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str],
                    out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return batched.batched_gemm_a16w16(x, w, bias, activation=activation, out_dtype=out_dtype)


@_batched_a16w16.register_fake
def _(x, w, bias, activation, out_dtype):
    v.check_tensor("x", x, grouped._IN_DTYPES)
    v.check_tensor("w", w, grouped._IN_DTYPES)
    return _fake_output(batched_output(x.shape, w.shape, v.check_out_dtype(out_dtype, None, x.dtype), x.dtype), x)


@torch.library.custom_op(f"{LIB}::batched_gemm_a8w8", mutates_args=())
def _batched_a8w8(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                  bias: Optional[torch.Tensor], activation: Optional[str],
                  out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return batched.batched_gemm_a8w8(x, w, x_scale, w_scale, bias, activation=activation, out_dtype=out_dtype)


@_batched_a8w8.register_fake
def _(x, w, x_scale, w_scale, bias, activation, out_dtype):
    v.check_tensor("x", x, grouped.FP8 + (torch.int8,))
    v.check_tensor("w", w, grouped.FP8 + (torch.int8,))
    return _fake_output(batched_output(x.shape, w.shape, v.check_out_dtype(out_dtype, None, torch.bfloat16),
                                       torch.bfloat16), x)


def traced_batched_gemm_a16w16(x, w, bias, activation, out_dtype, config):
    if v.needs_grad(x, w, bias):
        autograd.check_grad_call("batched_gemm_a16w16", None, config)
        return autograd.batched_gemm_a16w16(x, w, bias, activation, out_dtype)
    _check_no_config(config)
    return torch.ops.gemmkit.batched_gemm_a16w16(x, w, bias, activation, out_dtype)


def traced_batched_gemm_a8w8(x, w, x_scale, w_scale, bias, activation, out_dtype, config):
    _check_traced(x=x, w=w, x_scale=x_scale, w_scale=w_scale, bias=bias)
    _check_no_config(config)
    return torch.ops.gemmkit.batched_gemm_a8w8(x, w, x_scale, w_scale, bias, activation, out_dtype)


autograd.register()
