"""Gradients of the 16-bit GEMMs, computed by gemmkit's own kernels (training).

Ops with a backward: gemm_a16w16, batched_gemm_a16w16, fused_gemm_a16w16_mul_add, ff_a16w16_gated,
ff_a16w16, fused_gemm_a16w16_split_cat. A call whose tensors require grad (grad mode on) runs x @ w.T + bias
through an autograd.Function eagerly (`linear`, `batched_linear`) and through `torch.ops.gemmkit.gemm_a16w16` /
`batched_gemm_a16w16` under torch.compile, whose backward is registered below with the same formulas (with
create_graph=True the backward's GEMMs are differentiable in turn). What the inference kernels fuse into the
epilogue (the activation, `* a + b`, `act(gate) * up`, split/cat) runs as torch ops on the GEMM's output while
training, so that torch differentiates it from the saved pre-activation instead of a GEMM recomputing it: the
pre-activation is rounded to the output dtype first (as with F.linear then the activation; mul/add keeps it in
float32), where the fused inference epilogue rounds once.

    y = x @ w.T + b    dx = dy @ w       gemm_a16w16(dy, w.T)       (w.T: a (K, N) view the kernels read N-major)
                       dw = dy.T @ x     gemm_a16w16(dy.T, x.T)     (M is the reduction; both views, no copy)
                       db = sum of dy over the rows, in float32
The gradients have their inputs' dtypes; dy enters the GEMMs in x's dtype (16-bit operands: a float32
output's gradient is rounded once).

Frozen quantized weights (QLoRA-style training of adapters around a quantized base layer): gemm_a16w4,
gemm_a16wfp4, and gemm_a8w8 / gemm_a8w8_blockscale with a 16-bit x quantized in the op (dynamic): gradients for x
and bias only, dx = dy @ W with W the dequantized weight in x's dtype (once per backward: the 4-bit weights by
kernels/packed.py's pass, the 8-bit ones by torch ops, N x K x 2 bytes held while dx's GEMM runs; under
torch.compile all by torch ops). For the 8-bit ops the gradient goes straight through x's quantization (as
TransformerEngine's and bitsandbytes' FP8 / INT8 layers do). Scales refuse requires_grad ("frozen").

Not differentiable (they refuse inputs that require grad): the 8-bit ops on an already quantized x, gemm_afp4wfp4,
fused_gemm_a8w8_split_cat and the grouped (mixture-of-experts) ops; nor a preallocated `y=` or `config=`.
"""

from __future__ import annotations

import math

import torch

from .core import validate as v
from .core.epilogue import torch_activation
from .core.tracing import is_compiling, library


def _ops():
    library()  # (registers torch.ops.gemmkit.*, and the backward below)
    return torch.ops.gemmkit


class GradPlan:
    """An op's plan for calls whose inputs require grad: run(...) forwards to `fn` with the op's own arguments."""

    def __init__(self, fn):
        self.run = fn


def check_grad_call(op: str, y, config) -> None:
    """The arguments an op's differentiable path does not take."""
    if y is not None:
        raise ValueError(f"{op}: y= (a preallocated output) cannot be used with autograd (inputs that require "
                         "grad, grad mode on): leave y None, or call under torch.no_grad()")
    if config is not None:
        raise ValueError(f"{op}: config= applies to calls without autograd; differentiable calls (inputs that "
                         "require grad, grad mode on) take the tuned or derived configs")


def checked(op: str, y, config, inference_plan) -> None:
    """The checks of an op's differentiable path: the arguments it does not take (check_grad_call), then those of
    the same call without autograd, by inference_plan() (the op's plan, built or looked up with grad mode off)."""
    check_grad_call(op, y, config)
    with torch.no_grad():
        inference_plan()


# ---------------------------------------------------------------------------------------------
# the differentiable forms of the public ops (their eager and traced calls with inputs that require grad)


def gemm_a16w16(x, w, bias, activation, out_dtype):
    activation = v.check_activation(activation)
    return torch_activation(linear(x, w, bias, out_dtype), activation)


def batched_gemm_a16w16(x, w, bias, activation, out_dtype):
    activation = v.check_activation(activation)
    return torch_activation(batched_linear(x, w, bias, out_dtype), activation)


def fused_gemm_a16w16_mul_add(x, w, a, b, out_dtype):
    """(x @ w.T) * a + b, the products and sums in float32: a and b floats or tensors that fused._operand
    accepted (broadcastable to the output; one element: a scalar), taken in float32 before they are broadcast (so
    that their gradients are summed in float32)."""
    p = linear(x, w, None, torch.float32)
    a, b = (t.reshape(()).float() if isinstance(t, torch.Tensor) and t.numel() == 1
            else t.float() if isinstance(t, torch.Tensor) else t for t in (a, b))
    return (p * a + b).to(x.dtype if out_dtype is None else out_dtype)


def fused_gemm_a16w16_split_cat(x, w, y, heads, d1, d2, out_dtype):
    """(cat([p1, y], -1), p2) of p = x @ w.T viewed as (M, heads, d1 + d2), split at d1; both contiguous."""
    dtype = x.dtype if out_dtype is None else out_dtype
    p = linear(x, w, None, dtype).view(x.shape[0], heads, d1 + d2)
    return torch.cat([p[..., :d1], y.to(dtype)], -1), p[..., d1:].contiguous()


def ff_a16w16_gated(x, w_gate_up, w_up, w_down, activation, layout, out_dtype):
    """down(act(x @ gate.T) * (x @ up.T)): one GEMM over w_gate_up's 2I rows ([gate; up] or alternating, as
    fused.gate_up_views reads them), or two with a separate w_up; the intermediate in x's dtype."""
    activation = v.check_activation(activation)
    if w_up is None:
        gu = linear(x, w_gate_up, None, None)
        I = w_gate_up.shape[0] // 2
        g, u = (gu[..., :I], gu[..., I:]) if layout == "concat" else (gu[..., 0::2], gu[..., 1::2])
    else:
        g, u = linear(x, w_gate_up, None, None), linear(x, w_up, None, None)
    return linear(torch_activation(g, activation) * u, w_down, None, out_dtype)


def ff_a16w16(x, w_up, w_down, activation, out_dtype):
    v.check_activation(activation)
    return linear(gemm_a16w16(x, w_up, None, activation, None), w_down, None, out_dtype)


def _frozen(kind, x, bias, activation, out_dtype, weight, traced):
    """activation(x @ W.T + bias) with a frozen quantized W = weight (w, w_scale, w_zero, extra: _FrozenLinear's),
    differentiable in x and bias: the Function eagerly, traced() (the torch.ops.gemmkit op, no activation) while
    torch.compile traces."""
    activation = v.check_activation(activation)
    y = traced() if is_compiling() else _FrozenLinear.apply(x, bias, out_dtype, kind, *weight)
    return torch_activation(y, activation)


def gemm_a16w4(x, w_q, w_scale, w_zero, group, bias, activation, out_dtype):
    """A frozen INT4 weight (group: the checked group size, K for one per channel)."""
    per_channel = group == 2 * w_q.shape[1]
    return _frozen("int4", x, bias, activation, out_dtype, (w_q, w_scale, w_zero, group), lambda: _ops().gemm_a16w4(
        x, w_q, w_scale, w_zero, None if per_channel else group, bias, None, out_dtype))


def gemm_a16wfp4(x, w, w_scale, bias, activation, out_dtype):
    """A frozen MXFP4 weight."""
    return _frozen("mxfp4", x, bias, activation, out_dtype, (w, w_scale, None, 32), lambda: _ops().gemm_a16wfp4(
        x, w, w_scale, bias, None, out_dtype))


def gemm_a8w8_dynamic(x, w, w_scale, bias, activation, out_dtype, fast_accum):
    """A frozen FP8 / INT8 weight, x 16-bit and quantized per token in the op (x's gradient straight through)."""
    return _frozen("a8w8", x, bias, activation, out_dtype, (w, w_scale, None, fast_accum), lambda: _ops().gemm_a8w8(
        x, w, None, w_scale, bias, None, out_dtype, fast_accum))


def gemm_a8w8_blockscale_dynamic(x, w, w_scale, bias, activation, out_dtype):
    """A frozen block-scaled FP8 weight (128 x 128 blocks; x quantized per 1 x 128 group in the op)."""
    return _frozen("blockscale", x, bias, activation, out_dtype, (w, w_scale, None, None),
                   lambda: _ops().gemm_a8w8_blockscale(x, w, None, w_scale, bias, None, out_dtype))


def frozen_plan(op: str, w_scale, y, config, inference_plan, run) -> GradPlan:
    """The plan of an op with a frozen quantized weight for calls whose x or bias require grad: the scale refuses
    requires_grad, then the checks of the differentiable path (`checked`); run(...) takes the op's plan arguments."""
    check_frozen(op, w_scale=w_scale)
    checked(op, y, config, inference_plan)
    return GradPlan(run)


def check_frozen_call(op: str, w_scale, y, config) -> None:
    """The same checks while torch.compile traces (the inference checks run in the custom op's fake)."""
    check_frozen(op, w_scale=w_scale)
    check_grad_call(op, y, config)


def check_frozen(op: str, **scales) -> None:
    """A quantized weight's scales do not take gradients."""
    for name, t in scales.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise ValueError(f"{op}: {name} requires grad, but the quantized weight is frozen (gradients flow to x "
                             "and bias only): pass it detached")


def linear(x, w, bias, out_dtype):
    """x @ w.T + bias, differentiable: an autograd.Function eagerly (fewer Python layers per call than the
    torch.library op's autograd wrapper: BENCHMARKS.md, nineteenth session), the op while torch.compile traces."""
    if is_compiling():
        return _ops().gemm_a16w16(x, w, bias, None, out_dtype)
    return _Linear.apply(x, w, bias, out_dtype)


def batched_linear(x, w, bias, out_dtype):
    if is_compiling():
        return _ops().batched_gemm_a16w16(x, w, bias, None, out_dtype)
    return _BatchedLinear.apply(x, w, bias, out_dtype)


# ---------------------------------------------------------------------------------------------
# the backward formulas, for the eager Functions (GEMMs through the public ops) and the torch.library ops


def _eager_gemm(a, b, out_dtype):
    from .ops.a16w16 import gemm_a16w16 as gemm

    return gemm(a, b, out_dtype=out_dtype)


def _eager_batched(a, b, out_dtype):
    from .ops.batched import batched_gemm_a16w16 as batched

    return batched(a, b, out_dtype=out_dtype)


def _op_gemm(a, b, out_dtype):
    return torch.ops.gemmkit.gemm_a16w16(a, b, None, None, out_dtype)


def _op_batched(a, b, out_dtype):
    return torch.ops.gemmkit.batched_gemm_a16w16(a, b, None, None, out_dtype)


def _grad_operand(dy, x):
    """dy in x's dtype, with a unit stride the kernels can use (an expanded gradient, e.g. of a sum, is copied)."""
    dz = dy.to(x.dtype)
    return dz if dz.is_contiguous() else dz.contiguous()


def _rows(t):
    """t (*, C) as (rows, C) (a view where its strides allow)."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _bias_grad(dy, bias, dims):
    return dy.float().sum(dims).to(bias.dtype)


def linear_grads(x, w, bias, dy, needs, gemm):
    """(dx, dw, dbias) of x @ w.T + bias (those `needs` asks for, else None); gemm(a, b, out_dtype) = a @ b.T."""
    dz = _rows(_grad_operand(dy, x))
    dx = gemm(dz, w.t(), x.dtype).view(x.shape) if needs[0] else None
    dw = gemm(dz.t(), _rows(x).t(), w.dtype) if needs[1] else None
    db = _bias_grad(_rows(dy), bias, 0) if bias is not None and needs[2] else None
    return dx, dw, db


def batched_linear_grads(x, w, bias, dy, needs, gemm, batched):
    """(dx, dw, dbias) of x[b] @ w[b].T + bias (w (B, N, K) or one (N, K)); batched(a, b, out_dtype) per entry."""
    B, M, K = x.shape
    N = w.shape[-2]
    dz = _grad_operand(dy, x)
    dx = dw = db = None
    if needs[0]:
        dx = batched(dz, w.transpose(-1, -2), x.dtype) if w.ndim == 3 else gemm(dz.view(B * M, N), w.t(),
                                                                               x.dtype).view(B, M, K)
    if needs[1]:
        if w.ndim == 3:  # (an expanded weight's gradient per entry: autograd sums them)
            dw = batched(dz.transpose(1, 2), x.transpose(1, 2), w.dtype)
        else:  # one weight: one GEMM over the B * M rows
            dw = gemm(dz.view(B * M, N).t(), x.reshape(B * M, K).t(), w.dtype)
    if bias is not None and needs[2]:
        db = _bias_grad(dy, bias, (0, 1) if bias.ndim == 1 else 1)
    return dx, dw, db


def frozen_linear_grads(x, bias, dy, needs, dequantized, gemm):
    """(dx, dbias) of x @ W.T + bias with a frozen W, W = dequantized() (N, K) in x's dtype (made only for dx)."""
    dx = db = None
    if needs[0]:
        dz = _rows(_grad_operand(dy, x))
        dx = gemm(dz, dequantized().t(), x.dtype).view(x.shape)
    if bias is not None and needs[1]:
        db = _bias_grad(_rows(dy), bias, 0)
    return dx, db


def weight_rows(w, w_scale, dtype):
    """(N, K) `dtype` of an 8-bit weight scaled per channel ((N,) / (1, N) / (N, 1)) or per tensor: w times its
    scale, the scale in `dtype` (one allocation of N x K x 2 bytes)."""
    s = w_scale.to(dtype).reshape(-1)
    return w.to(dtype).mul_(s if s.numel() == 1 else s[:, None])


def weight_blocks(w, w_scale, dtype):
    """(N, K) `dtype` of a block-scaled FP8 weight, w_scale (ceil(N / 128), ceil(K / 128)) (DeepSeek-V3)."""
    N, K = w.shape
    s = w_scale.to(dtype).repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :K]
    return w.to(dtype).mul_(s)


class _FrozenLinear(torch.autograd.Function):
    """x @ W.T + bias with a frozen quantized W, through gemmkit's inference op; kind: "int4" (w_zero None or uint8,
    extra: the group size), "mxfp4", "a8w8" (x quantized per token in the op; extra: fast_accum) or "blockscale".
    Backward: frozen_linear_grads, W dequantized to x's dtype (the 4-bit weights by kernels/packed.py's pass)."""

    @staticmethod
    def forward(ctx, x, bias, out_dtype, kind, w, w_scale, w_zero, extra):
        ctx.save_for_backward(x, bias, w, w_scale, w_zero)
        ctx.kind, ctx.extra = kind, extra
        if kind == "int4":
            from .ops.a16w4 import gemm_a16w4 as op

            return op(x, w, w_scale, w_zero, group_size=extra if extra != 2 * w.shape[1] else None, bias=bias,
                      out_dtype=out_dtype)
        if kind == "mxfp4":
            from .ops.fp4 import gemm_a16wfp4 as op

            return op(x, w, w_scale, bias=bias, out_dtype=out_dtype)
        if kind == "a8w8":
            from .ops.a8w8 import gemm_a8w8 as op

            return op(x, w, None, w_scale, bias, out_dtype=out_dtype, fast_accum=extra)
        from .ops.a8w8_blockscale import gemm_a8w8_blockscale as op

        return op(x, w, None, w_scale, bias, out_dtype=out_dtype)

    @staticmethod
    def backward(ctx, dy):
        x, bias, w, w_scale, w_zero = ctx.saved_tensors
        dx, db = frozen_linear_grads(x, bias, dy, ctx.needs_input_grad, lambda: _dequantized(
            ctx.kind, w, w_scale, w_zero, ctx.extra, x.dtype), _eager_gemm)
        return dx, db, None, None, None, None, None, None


def _dequantized(kind, w, w_scale, w_zero, extra, dtype):
    if kind in ("int4", "mxfp4"):
        from .ops.packed_prefill import dequantize_packed

        K = 2 * w.shape[1]
        # (one group per channel: the pass takes a power of two)
        group = 32 if kind == "mxfp4" else extra if extra != K else 1 << (K - 1).bit_length()
        return dequantize_packed(w, w_scale, w_zero, group, kind == "int4", dtype)
    return weight_rows(w, w_scale, dtype) if kind == "a8w8" else weight_blocks(w, w_scale, dtype)


def _function(name, forward, grads):
    """An autograd.Function of x @ w.T + bias: forward(x, w, bias, out_dtype) (gemmkit's inference op, called with
    grad mode off), backward grads(x, w, bias, dy, needs) -> (dx, dw, dbias)."""

    def fwd(ctx, x, w, bias, out_dtype):
        ctx.save_for_backward(x, w, bias)
        return forward(x, w, bias, out_dtype)

    def bwd(ctx, dy):
        return (*grads(*ctx.saved_tensors, dy, ctx.needs_input_grad), None)

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd)})


def _eager_linear(x, w, bias, out_dtype):
    from .ops.a16w16 import gemm_a16w16 as gemm

    return gemm(x, w, bias, out_dtype=out_dtype)


def _eager_batched_linear(x, w, bias, out_dtype):
    from .ops.batched import batched_gemm_a16w16 as batched

    return batched(x, w, bias, out_dtype=out_dtype)


_Linear = _function("_Linear", _eager_linear, lambda x, w, bias, dy, needs: linear_grads(
    x, w, bias, dy, needs, _eager_gemm))
_BatchedLinear = _function("_BatchedLinear", _eager_batched_linear, lambda x, w, bias, dy, needs: batched_linear_grads(
    x, w, bias, dy, needs, _eager_gemm, _eager_batched))


def _setup(ctx, inputs, output):
    x, w, bias, activation, out_dtype = inputs
    ctx.save_for_backward(x, w, bias)
    ctx.activation, ctx.out_dtype = activation, out_dtype


def _through_activation(ctx, dy, forward):
    """dy times the activation's derivative at the pre-activation, which a call of the op with an activation
    did not keep (the public ops never pass one with autograd: the activation runs in torch): recomputed by
    forward(), through the differentiable op where the backward itself is differentiated (create_graph=True)."""
    if ctx.activation in (None, "none"):
        return dy
    create = torch.is_grad_enabled()
    with torch.enable_grad():
        z = forward()
        if not (create and z.requires_grad):
            z = z.detach().requires_grad_()
        return torch.autograd.grad(torch_activation(z, ctx.activation), z, dy, create_graph=create)[0]


def _gemm_backward(ctx, dy):
    x, w, bias = ctx.saved_tensors
    dy = _through_activation(ctx, dy, lambda: torch.ops.gemmkit.gemm_a16w16(x, w, bias, None, dy.dtype))
    return (*linear_grads(x, w, bias, dy, ctx.needs_input_grad, _op_gemm), None, None)


def _batched_backward(ctx, dy):
    x, w, bias = ctx.saved_tensors
    dy = _through_activation(ctx, dy, lambda: torch.ops.gemmkit.batched_gemm_a16w16(x, w, bias, None, dy.dtype))
    return (*batched_linear_grads(x, w, bias, dy, ctx.needs_input_grad, _op_gemm, _op_batched), None, None)


def _setup_a16w4(ctx, inputs, output):
    x, w_q, w_scale, w_zero, group_size, bias, activation, out_dtype = inputs
    check_frozen("gemm_a16w4", w_scale=w_scale)
    ctx.save_for_backward(x, w_q, w_scale, w_zero, bias)
    ctx.group_size, ctx.activation = group_size, activation


def _a16w4_backward(ctx, dy):
    from .quant import dequantize_int4

    x, w_q, w_scale, w_zero, bias = ctx.saved_tensors
    dy = _through_activation(ctx, dy, lambda: torch.ops.gemmkit.gemm_a16w4(x, w_q, w_scale, w_zero, ctx.group_size,
                                                                            bias, None, dy.dtype))
    # (the forward's weight: x's dtype((q - z) * x's dtype(s)))
    group = ctx.group_size if not isinstance(ctx.group_size, torch.SymInt) else int(ctx.group_size)  # (dynamic shapes)
    dx, db = frozen_linear_grads(x, bias, dy, (ctx.needs_input_grad[0], ctx.needs_input_grad[5]), lambda: (
        dequantize_int4(w_q, w_scale.to(x.dtype), w_zero, group, x.dtype)), _op_gemm)
    return dx, None, None, None, None, db, None, None


def _setup_a16wfp4(ctx, inputs, output):
    x, w, w_scale, bias, activation, out_dtype = inputs
    check_frozen("gemm_a16wfp4", w_scale=w_scale)
    ctx.save_for_backward(x, w, w_scale, bias)
    ctx.activation = activation


def _a16wfp4_backward(ctx, dy):
    from .quant import dequantize_mxfp4

    x, w, w_scale, bias = ctx.saved_tensors
    dy = _through_activation(ctx, dy, lambda: torch.ops.gemmkit.gemm_a16wfp4(x, w, w_scale, bias, None, dy.dtype))
    dx, db = frozen_linear_grads(x, bias, dy, (ctx.needs_input_grad[0], ctx.needs_input_grad[3]),
                                 lambda: dequantize_mxfp4(w, w_scale, x.dtype), _op_gemm)
    return dx, None, None, db, None, None


def _setup_8bit(op: str, blocks: bool):
    """The setup_context of gemm_a8w8 / gemm_a8w8_blockscale: a 16-bit x (quantized in the op) and frozen scales."""

    def setup(ctx, inputs, output):
        x, w, x_scale, w_scale, bias = inputs[:5]
        check_frozen(op, w_scale=w_scale)
        if x_scale is not None and x.requires_grad:
            raise ValueError(f"{op}: an already quantized x has no gradient; pass x in bf16 / fp16 with x_scale=None "
                             "(quantized in the op; its gradient goes straight through the quantization)")
        ctx.save_for_backward(x, w, w_scale, bias)
        ctx.activation, ctx.blocks = inputs[5], blocks

    return setup


def _a8w8_backward(ctx, dy):
    x, w, w_scale, bias = ctx.saved_tensors
    if ctx.blocks:
        fwd = lambda: torch.ops.gemmkit.gemm_a8w8_blockscale(x, w, None, w_scale, bias, None, dy.dtype)  # noqa: E731
    else:
        fwd = lambda: torch.ops.gemmkit.gemm_a8w8(x, w, None, w_scale, bias, None, dy.dtype)  # noqa: E731
    dy = _through_activation(ctx, dy, fwd)
    dx, db = frozen_linear_grads(x, bias, dy, (ctx.needs_input_grad[0], ctx.needs_input_grad[4]), lambda: (
        weight_blocks if ctx.blocks else weight_rows)(w, w_scale, x.dtype), _op_gemm)
    return (dx, None, None, None, db) + (None,) * (2 if ctx.blocks else 3)


def register() -> None:
    """Registers the backward of torch.ops.gemmkit.gemm_a16w16, batched_gemm_a16w16, gemm_a16w4, gemm_a16wfp4,
    gemm_a8w8 and gemm_a8w8_blockscale (gemmkit.library calls it once, after defining the ops)."""
    torch.library.register_autograd("gemmkit::gemm_a16w16", _gemm_backward, setup_context=_setup)
    torch.library.register_autograd("gemmkit::batched_gemm_a16w16", _batched_backward, setup_context=_setup)
    torch.library.register_autograd("gemmkit::gemm_a16w4", _a16w4_backward, setup_context=_setup_a16w4)
    torch.library.register_autograd("gemmkit::gemm_a16wfp4", _a16wfp4_backward, setup_context=_setup_a16wfp4)
    torch.library.register_autograd("gemmkit::gemm_a8w8", _a8w8_backward,
                                    setup_context=_setup_8bit("gemm_a8w8", False))
    torch.library.register_autograd("gemmkit::gemm_a8w8_blockscale", _a8w8_backward,
                                    setup_context=_setup_8bit("gemm_a8w8_blockscale", True))
