"""A8W8: FP8 (e4m3 / e5m2) or INT8 operands with per-tensor, per-token and per-channel scales."""

from __future__ import annotations

import dataclasses

import torch

from ..core import validate as v
from ..core.config import EXACT_MAX_BLOCK_K, GemmConfig, fit_to_smem, load_table, resolve_config, select_config
from ..core.dense import DensePlan
from ..core.device import device_info
from ..core.hopper_ws import ws_plan
from ..core.epilogue import EpilogueSpec
from ..core.formats import Scale, dense, quantized_in_kernel
from ..core.plan import PlanCache, capturing, plan_key
from ..core.rows import ALIGN_X_MIN_M, ROW_ALIGN, empty_aligned, plan_on_aligned_x, warn_unaligned_weight
from ..core.tracing import is_compiling as _is_compiling, library as _library

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_X_DTYPES = FP8 + (torch.int8, torch.bfloat16, torch.float16)
_W_DTYPES = FP8 + (torch.int8,)
# Dynamic quantization of a 16-bit x, called eagerly with M <= 16 (or M <= FUSED_QUANT_MAX_M and a
# weight of at most FUSED_QUANT_MAX_WEIGHT elements): inside the GEMM (one launch: the host's
# launch cost exceeds the GPU time; see README, "Host cost"), with a config of its own (table
# "<op>_dynamic", tuned by `gemmkit tune a8w8_dynamic`). Otherwise, and always under CUDA-graph
# capture (where only GPU time counts), the one-pass quantizer then the GEMM: each program of the
# fused GEMM repeats the absmax pass over its rows, which costs more GPU time than a second launch
# saves once M grows (BENCHMARKS.md, a8w8_dynamic; tuning/tune_a8w8_dynamic.jsonl).
FUSED_QUANT_MAX_M = 64
FUSED_QUANT_MAX_WEIGHT = 1 << 25  # N * K elements, for M > 16
_plans = PlanCache()


def gemm_a8w8(x, w, x_scale, w_scale, bias=None, *, activation=None, out_dtype=torch.bfloat16, y=None, config=None,
              fast_accum=True):
    """activation((x * x_scale) @ (w * w_scale).T + bias), accumulated in fp32 (int32 for int8).

    x: (M, K) (or (*, K)), w: (N, K), both K-contiguous (stride 1 along K, as fp8/int8 tensor
    cores need): float8_e4m3fn / float8_e5m2 in any combination, or both int8.
    x_scale: float32, one value (any shape of 1 element: per tensor) or M values ((M, 1), (M,),
    or x's leading shape with or without a trailing 1, as quantize_fp8 returns it: per token).
    w_scale: float32, one value or N values ((1, N), (N,) or (N, 1): per channel).
    Dynamic per-token quantization: pass x in bf16/fp16 with x_scale=None; x is quantized to w's
    type (inside the GEMM when called eagerly with small M, else by a one-pass quantizer first;
    both round the same way).
    bias: (N,) bf16/fp16/fp32. activation: None, "relu", "gelu_tanh", "silu".
    out_dtype: bf16 (default), fp16 or fp32. y: optional preallocated output (M, N).
    config: None (tuned table, else derived from the device), a dict or a GemmConfig.
    fast_accum=True (default): FP8 dots accumulate with Hopper's fast, reduced-precision
    accumulation inside each K tile (Triton's sm_90 default), like
    torch._scaled_mm(..., use_fast_accum=True). fast_accum=False: each K tile's partial sum is
    promoted to fp32 (every BLOCK_K, at most 128, elements of K), like _scaled_mm's default
    accumulation, with configs of its own (table a8w8_fp8_exact). INT8 accumulation is exact
    either way. Differentiable in a 16-bit (dynamic) x and bias, the weight frozen (gemmkit.autograd): dx = dy @ (w *
    w_scale), straight through x's quantization.
    """
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.gemm_a8w8 (gemmkit.library)
        return _library().traced_gemm_a8w8(x, w, x_scale, w_scale, bias, activation, out_dtype, y, config,
                                           fast_accum)
    cfg_key = None if config is None else v.config_key(config)
    key = plan_key((x, w, x_scale, w_scale, bias, y), (activation, out_dtype, cfg_key, fast_accum, type(fast_accum)))
    try:
        plan = _plans[key]
        _plans.move_to_end(key)  # least recently used plans are evicted first
    except (KeyError, TypeError):  # a new plan (validates), or no key (bad input)
        plan = _plans.plan_for(key, _make_plan, x, w, x_scale, w_scale, bias, y, activation, out_dtype, config,
                               fast_accum)
    return plan.run(x, w, bias, y, x_scale, w_scale)


def fused_dynamic_gemm(x, w, w_scale, *, config=None, out_dtype=torch.bfloat16):
    """gemm_a8w8(x, w, None, w_scale) for a 16-bit x, always through the GEMM that quantizes x per
    token itself (one launch), eager or captured: what `gemmkit tune a8w8_dynamic` measures."""
    key = plan_key((x, w, w_scale), ("fused", out_dtype, v.config_key(config)))
    plan = _plans.plan_for(key, _make_plan, x, w, None, w_scale, None, None, None, out_dtype, config, True, "fused")
    return plan(x, w, None, None, None, w_scale)


def _scale_kind(name: str, s, shapes, what: str) -> Scale:
    """TENSOR for a scale of one float32 value, ROW for one of the given shapes (contiguous)."""
    v.check_tensor(name, s, (torch.float32,))
    if s.numel() == 1:
        return Scale.TENSOR
    if tuple(s.shape) not in shapes:
        raise ValueError(f"{name} has shape {tuple(s.shape)}: expected one value (per tensor) or {what}")
    if not s.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous())")
    return Scale.ROW


def check_fast_accum(fast_accum) -> None:
    if not isinstance(fast_accum, bool):
        raise TypeError(f"fast_accum must be a bool, got {type(fast_accum).__name__}")


def _make_plan(x, w, x_scale, w_scale, bias, y, activation, out_dtype, config, fast_accum, dynamic_path="auto"):
    if dynamic_path == "auto" and x_scale is None and v.needs_grad(x, w_scale, bias) \
            and getattr(x, "dtype", None) in (torch.bfloat16, torch.float16):
        return _grad_plan(x, w, w_scale, bias, y, activation, out_dtype, config, fast_accum)
    v.check_tensor("x", x, _X_DTYPES)
    v.check_tensor("w", w, _W_DTYPES)
    dynamic = x.dtype in (torch.bfloat16, torch.float16)
    if dynamic:
        if x_scale is not None:
            raise ValueError("x is 16-bit: pass x_scale=None for dynamic per-token quantization, "
                             "or quantize x first (gemmkit.quant)")
    elif (x.dtype == torch.int8) != (w.dtype == torch.int8):
        raise TypeError(f"x is {x.dtype} but w is {w.dtype}: int8 pairs only with int8, fp8 only with fp8")
    elif x_scale is None:
        raise ValueError("x_scale is required when x is already quantized")
    check_fast_accum(fast_accum)
    activation, device, x2, lead, M, N, K = v.check_inputs(x, w, activation, k_major=True, x_scale=x_scale,
                                                           w_scale=w_scale, bias=bias, y=y)
    token_shapes = {(M, 1), (M,), (*lead, 1), lead}  # x (*, K): quantize_fp8's (*, 1) too
    a_kind = Scale.ROW if dynamic else _scale_kind("x_scale", x_scale, token_shapes,
                                                   f"per token: {M} values, ({M}, 1), ({M},) or (*x.shape[:-1], 1)")
    b_fmt = dense(w.dtype, _scale_kind("w_scale", w_scale, {(1, N), (N,), (N, 1)},
                                       f"per channel: (1, {N}), ({N},) or ({N}, 1)"))
    out_dtype, y2, degenerate = v.check_output(y, lead, M, N, K, out_dtype, torch.bfloat16, device, activation,
                                               bias)
    if degenerate:
        return degenerate
    dev = device_info(device)
    op = "a8w8_int8" if w.dtype == torch.int8 else "a8w8_fp8"
    # fp32 promotion per K tile: its own table (the fast-accumulation tables were timed without the
    # promotion, and their 256-deep K tiles would promote half as often), else the promoting rule
    table = op + "_exact" if not fast_accum and op == "a8w8_fp8" else op
    a_fmt = dense(w.dtype if dynamic else x.dtype, a_kind)  # a dynamic x is quantized to w's type
    cfg = resolve_config(table, config, M, N, K, dev, a_fmt, b_fmt, out_dtype.itemsize)
    if not fast_accum:
        cfg = _exact_block_k(cfg, config is not None)
    example_y = y2 if y2 is not None else torch.empty((M, N), dtype=out_dtype, device=device)
    epilogue = EpilogueSpec(activation, bias is not None)
    common = dict(out_dtype=out_dtype, out_shape=(*lead, N), flatten_x=x.ndim != 2, auto_config=config is None,
                  exact_accumulation=not fast_accum)
    fp8 = op == "a8w8_fp8"  # sm_90: the warp-specialized kernel where it measured faster (core/hopper_ws.py)
    ws_common = dict(scales="rowcol", w_scale=w_scale, bias=bias, activation=activation, config=config,
                     out_dtype=out_dtype, out_shape=(*lead, N), promote=not fast_accum)
    warn_unaligned_weight("gemm_a8w8", w)
    if not dynamic:
        def build(xa, flat):  # (xa: x, or a copy in rows on the L2's sectors: core/rows.py)
            ws = ws_plan(dev, xa, w, y2, M, N, K, x_scale=x_scale, flatten_x=flat, **ws_common) if fp8 else None
            return ws or DensePlan(xa, w, example_y, a_fmt, b_fmt, epilogue, cfg, dev,
                                   inputs=dict(bias=bias, a_scale=x_scale, b_scale=w_scale),
                                   **dict(common, flatten_x=flat))

        return plan_on_aligned_x(x2, w, M, N, dev, x.ndim != 2, build)
    from ..quant import FP8_TARGETS, _quantize

    # the quantizer writes x's rows padded where they would straddle the L2's sectors (core/rows.py)
    aligned = M >= ALIGN_X_MIN_M and K % ROW_ALIGN != 0
    target = "int8" if w.dtype == torch.int8 else FP8_TARGETS[w.dtype]

    def quantize(t):
        return _quantize(t, "row", w.dtype, target, None, aligned)

    # what the quantizer returns (facts only)
    xq = empty_aligned(M, K, w.dtype, device) if aligned else torch.empty((M, K), dtype=w.dtype, device=device)
    xs = torch.empty((M, 1), dtype=torch.float32, device=device)
    gemm = ws_plan(dev, xq, w, y2, M, N, K, x_scale=xs, flatten_x=False, **ws_common) if fp8 else None
    gemm = gemm or DensePlan(xq, w, example_y, a_fmt, b_fmt, epilogue, cfg, dev,
                             inputs=dict(bias=bias, a_scale=xs, b_scale=w_scale), **dict(common, flatten_x=False))
    fused = None
    if dynamic_path == "fused" or (M <= FUSED_QUANT_MAX_M and (M <= 16 or N * K <= FUSED_QUANT_MAX_WEIGHT)):
        fused_op = op + "_dynamic"
        fused_a = quantized_in_kernel(x.dtype, w.dtype, "row")
        if config is None and load_table(dev.name, fused_op) is not None:
            cfg = select_config(fused_op, M, N, K, dev, fused_a, b_fmt, out_dtype.itemsize)
        if not fast_accum:
            cfg = _exact_block_k(cfg, config is not None)
        fused_cfg = fit_to_smem(cfg, dev, fused_a, b_fmt, out_dtype.itemsize)
        fused = DensePlan(x2, w, example_y, fused_a, b_fmt, epilogue, fused_cfg, dev,
                          inputs=dict(bias=bias, b_scale=w_scale), **common)
    return _Dynamic(quantize, gemm, fused, M, K, x.ndim != 2, always_fused=dynamic_path == "fused")


def _grad_plan(x, w, w_scale, bias, y, activation, out_dtype, config, fast_accum):
    """Dynamic calls whose x or bias require grad (the weight frozen): through gemmkit.autograd."""
    from .. import autograd

    return autograd.frozen_plan("gemm_a8w8", w_scale, y, config, lambda: _make_plan(
        x, w, None, w_scale, bias, None, activation, out_dtype, None, fast_accum),
        lambda x, w, bias, y, x_scale, w_scale: autograd.gemm_a8w8_dynamic(x, w, w_scale, bias, activation,
                                                                            out_dtype, fast_accum))


def _exact_block_k(cfg: GemmConfig, given: bool) -> GemmConfig:
    """fast_accum=False: partial sums promoted at least every EXACT_MAX_BLOCK_K elements of K (a
    table's or derived deeper K tile is cut to that; a caller's is refused)."""
    if cfg.BLOCK_K <= EXACT_MAX_BLOCK_K:
        return cfg
    if given:
        raise ValueError(f"config: BLOCK_K={cfg.BLOCK_K}; fast_accum=False promotes every K tile to fp32, at "
                         f"least every {EXACT_MAX_BLOCK_K} elements of K: BLOCK_K must be <= {EXACT_MAX_BLOCK_K}")
    return dataclasses.replace(cfg, BLOCK_K=EXACT_MAX_BLOCK_K)


class _Dynamic:
    """x in 16 bits: quantize per token inside the GEMM (`fused`), or quantizer then GEMM."""

    def __init__(self, quantize, gemm, fused, M, K, flatten_x, always_fused=False):
        self.quantize, self.gemm, self.fused, self.M, self.K, self.flatten_x = quantize, gemm, fused, M, K, flatten_x
        self.always_fused = always_fused
        self.run = self.__call__

    def __call__(self, x, w, bias, y, x_scale, w_scale):
        if self.fused is not None and (self.always_fused or not capturing()):
            return self.fused.run(x, w, bias, y, None, w_scale)
        xq, xs = self.quantize(x.reshape(self.M, self.K) if self.flatten_x else x)
        return self.gemm(xq, w, bias, y, xs, w_scale)
