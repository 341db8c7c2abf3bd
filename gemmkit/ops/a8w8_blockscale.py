"""A8W8 blockscale: FP8 operands with 1x128 activation and 128x128 weight scales (DeepSeek-V3)."""

from __future__ import annotations

import dataclasses

import torch

from ..core import validate as v
from ..core.config import GemmConfig, fit_to_smem, load_table, resolve_config, select_config
from ..core.dense import DensePlan
from ..core.device import device_info
from ..core.hopper_ws import ws_plan
from ..core.epilogue import EpilogueSpec
from ..core.formats import Scale, dense, quantized_in_kernel
from ..core.rows import plan_on_aligned_x, warn_unaligned_weight
from ..core.plan import PlanCache, capturing, plan_key
from ..core.tracing import is_compiling as _is_compiling, library as _library

OP = "a8w8_blockscale"
GROUP = 128  # scale block: 1 x 128 of x, 128 x 128 of w
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# Dynamic 1x128 quantization of a 16-bit x, called eagerly with M <= FUSED_QUANT_MAX_M: inside the
# GEMM (one launch; table "a8w8_blockscale_dynamic"). Otherwise, and always under CUDA-graph
# capture (where only GPU time counts), quantize_fp8_blockwise (column-major scales) then the
# static GEMM (TMA for x at large M). The lead sets the threshold from `gemmkit bench
# a8w8_blockscale_dynamic` / `a8w8_blockscale_dynamic_fused` on the GPU.
FUSED_QUANT_MAX_M = 64
_plans = PlanCache()


def gemm_a8w8_blockscale(x, w, x_scale, w_scale, bias=None, *, activation=None, out_dtype=torch.bfloat16, y=None,
                         config=None):
    """activation(dequant(x) @ dequant(w).T + bias) with DeepSeek-V3 block scales, fp32 accumulation.

    x: (M, K) or (*, K) float8_e4m3fn / float8_e5m2, K-contiguous; x_scale: float32 (M, G) or
    (*, G), G = ceil(K / 128): one scale per token and 128-wide K group, in any 2-D layout
    (row-major, or column-major as engines store it for TMA: `s.t().contiguous().t()`).
    w: (N, K) fp8, K-contiguous; w_scale: float32 (ceil(N / 128), G), any layout.
    Dynamic form: x in bf16/fp16 with x_scale=None, quantized to w's type per 1 x 128 group:
    inside the GEMM when called eagerly with M <= FUSED_QUANT_MAX_M, else (and under CUDA-graph
    capture) by quantize_fp8_blockwise first; both round the same way.
    Each 128-wide K block's partial product is promoted to fp32 and multiplied by its two scales
    in the K loop (exactly the block structure; ragged last groups of K and N included).
    bias: (N,) bf16/fp16/fp32. activation: None, "relu", "gelu_tanh", "silu". out_dtype: bf16
    (default), fp16 or fp32. y: optional preallocated output. config: None (tuned table, else
    derived; BLOCK_K must divide 128), a dict or a GemmConfig. Differentiable in a 16-bit (dynamic) x and bias, the
    weight frozen (gemmkit.autograd): dx = dy @ dequant(w), straight through x's quantization.
    """
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.gemm_a8w8_blockscale (gemmkit.library)
        return _library().traced_gemm_a8w8_blockscale(x, w, x_scale, w_scale, bias, activation, out_dtype, y,
                                                       config)
    key = plan_key((x, w, x_scale, w_scale, bias, y),
                   (activation, out_dtype, None if config is None else v.config_key(config)))
    try:
        plan = _plans[key]
        _plans.move_to_end(key)  # least recently used plans are evicted first
    except (KeyError, TypeError):  # a new plan (validates), or no key (bad input)
        plan = _plans.plan_for(key, _make_plan, x, w, x_scale, w_scale, bias, y, activation, out_dtype, config)
    return plan.run(x, w, bias, y, x_scale, w_scale)


def _dynamic_path(x, w, w_scale, path, *, out_dtype=torch.bfloat16, config=None):
    """gemm_a8w8_blockscale(x, w, None, w_scale) for a 16-bit x through one path, eager or
    captured: "fused" (quantized per 1x128 group inside the GEMM, one launch) or "quantize"
    (quantize_fp8_blockwise then the static GEMM). What the bench and the tuner time."""
    if path not in ("fused", "quantize"):
        raise ValueError(f"path must be 'fused' or 'quantize', got {path!r}")
    key = plan_key((x, w, w_scale), (path, out_dtype, None if config is None else v.config_key(config)))
    plan = _plans.plan_for(key, _make_plan, x, w, None, w_scale, None, None, None, out_dtype, config, path)
    return plan.run(x, w, None, None, None, w_scale)


def _grad_plan(x, w, w_scale, bias, y, activation, out_dtype, config):
    """Dynamic calls whose x or bias require grad (the weight frozen): through gemmkit.autograd."""
    from .. import autograd

    return autograd.frozen_plan("gemm_a8w8_blockscale", w_scale, y, config, lambda: _make_plan(
        x, w, None, w_scale, bias, None, activation, out_dtype, None),
        lambda x, w, bias, y, x_scale, w_scale: autograd.gemm_a8w8_blockscale_dynamic(x, w, w_scale, bias,
                                                                                       activation, out_dtype))


def _check_scale(name: str, s, shape) -> torch.Tensor:
    """A float32 scale tensor of this logical shape, as a 2-D view (any strides)."""
    v.check_tensor(name, s, (torch.float32,))
    if tuple(s.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(s.shape)}; expected {tuple(shape)} "
                         f"(one scale per {'1 x 128' if name == 'x_scale' else '128 x 128'} block)")
    if s.ndim != 2:
        try:
            s = s.view(-1, s.shape[-1])
        except RuntimeError:
            raise ValueError(f"{name}'s leading dimensions cannot be flattened without a copy") from None
    return s


def _make_plan(x, w, x_scale, w_scale, bias, y, activation, out_dtype, config, dynamic_path="auto"):
    if dynamic_path == "auto" and x_scale is None and v.needs_grad(x, w_scale, bias) \
            and getattr(x, "dtype", None) in (torch.bfloat16, torch.float16):
        return _grad_plan(x, w, w_scale, bias, y, activation, out_dtype, config)
    v.check_tensor("x", x, FP8 + (torch.bfloat16, torch.float16))
    v.check_tensor("w", w, FP8)
    dynamic = x.dtype in (torch.bfloat16, torch.float16)
    if dynamic and x_scale is not None:
        raise ValueError("x is 16-bit: pass x_scale=None (quantized per 1 x 128 group in the GEMM), or quantize x "
                         "first (gemmkit.quant.quantize_fp8_blockwise)")
    if not dynamic and x_scale is None:
        raise ValueError("x_scale is required when x is already quantized: float32 (M, ceil(K / 128))")
    activation, device, x2, lead, M, N, K = v.check_inputs(x, w, activation, k_major=True, x_scale=x_scale,
                                                           w_scale=w_scale, bias=bias, y=y)
    G = -(-K // GROUP)
    xs2 = None if dynamic else _check_scale("x_scale", x_scale, (*lead, G))
    ws2 = _check_scale("w_scale", w_scale, (-(-N // GROUP), G))
    out_dtype, y2, degenerate = v.check_output(y, lead, M, N, K, out_dtype, torch.bfloat16, device, activation,
                                               bias)
    if degenerate:
        return degenerate
    dev = device_info(device)
    b_fmt = dense(w.dtype, Scale.KBLOCK, GROUP, GROUP)
    epilogue = EpilogueSpec(activation, bias is not None)
    example_y = y2 if y2 is not None else torch.empty((M, N), dtype=out_dtype, device=device)
    common = dict(out_dtype=out_dtype, out_shape=(*lead, N), auto_config=config is None)
    warn_unaligned_weight("gemm_a8w8_blockscale", w)
    if not dynamic:
        def build(xa, flat):  # (xa: x, or a copy in rows on the L2's sectors: core/rows.py)
            gemm = ws_plan(dev, xa, w, y2, M, N, K, scales="kblock", x_scale=xs2, w_scale=ws2, bias=bias,
                           activation=activation, config=config, out_dtype=out_dtype, out_shape=(*lead, N),
                           flatten_x=flat)
            if gemm is None:  # else sm_90: the warp-specialized promoting kernel (core/hopper_ws.py)
                a_fmt = dense(x.dtype, Scale.KBLOCK, GROUP)
                cfg = resolve_config(OP, config, M, N, K, dev, a_fmt, b_fmt, out_dtype.itemsize)
                gemm = DensePlan(xa, w, example_y, a_fmt, b_fmt, epilogue, cfg, dev, flatten_x=flat,
                                 inputs=dict(bias=bias, a_scale=xs2, b_scale=ws2), **common)
            return _Plan(gemm, lead if x_scale.ndim != 2 else None)

        return plan_on_aligned_x(x2, w, M, N, dev, x.ndim != 2, build)
    fused = gemm = None
    if dynamic_path == "fused" or (dynamic_path == "auto" and M <= FUSED_QUANT_MAX_M):
        a_fmt = quantized_in_kernel(x.dtype, w.dtype, "group", GROUP)
        table = OP + "_dynamic"
        if config is None and load_table(dev.name, table) is not None:
            cfg = select_config(table, M, N, K, dev, a_fmt, b_fmt, out_dtype.itemsize)
        else:
            cfg = resolve_config(OP, config, M, N, K, dev, a_fmt, b_fmt, out_dtype.itemsize)
        if cfg.BLOCK_K != GROUP and cfg.BLOCK_K < K:  # the kernel quantizes x per K tile
            if config is not None:
                raise ValueError(f"config: BLOCK_K={cfg.BLOCK_K}; a 16-bit x is quantized per 128-wide K tile: "
                                 f"BLOCK_K must be {GROUP}")
            cfg = dataclasses.replace(cfg, BLOCK_K=GROUP)
        cfg = fit_to_smem(cfg, dev, a_fmt, b_fmt, out_dtype.itemsize)
        fused = DensePlan(x2, w, example_y, a_fmt, b_fmt, epilogue, cfg, dev, flatten_x=x.ndim != 2,
                          inputs=dict(bias=bias, b_scale=ws2), **common)
    if dynamic_path != "fused":
        if config is not None and dynamic_path == "auto":  # the same configs are valid whichever path runs
            cfg = GemmConfig.from_dict(config)
            if cfg.BLOCK_K != GROUP and cfg.BLOCK_K < K:
                raise ValueError(f"config: BLOCK_K={cfg.BLOCK_K}; a 16-bit x is quantized per 128-wide K tile: "
                                 f"BLOCK_K must be {GROUP}")
        a_fmt = dense(w.dtype, Scale.KBLOCK, GROUP)  # what the quantizer returns: x in w's type
        cfg = resolve_config(OP, config, M, N, K, dev, a_fmt, b_fmt, out_dtype.itemsize)
        xq = torch.empty((M, K), dtype=w.dtype, device=device)  # (facts only)
        xs = torch.empty((G, M), dtype=torch.float32, device=device).t()  # column-major, as quantized
        gemm = ws_plan(dev, xq, w, y2, M, N, K, scales="kblock", x_scale=xs, w_scale=ws2, bias=bias,
                       activation=activation, config=config, out_dtype=out_dtype, out_shape=(*lead, N),
                       flatten_x=False)
        if gemm is None:
            gemm = DensePlan(xq, w, example_y, a_fmt, b_fmt, epilogue, cfg, dev, flatten_x=False,
                             inputs=dict(bias=bias, a_scale=xs, b_scale=ws2), **common)
    return _Dynamic(gemm, fused, M, K, w.dtype, x.ndim != 2, always_fused=dynamic_path == "fused")


class _Dynamic:
    """x in 16 bits: quantized per 1x128 group inside the GEMM (`fused`), or by
    quantize_fp8_blockwise then the static GEMM (`gemm`)."""

    def __init__(self, gemm, fused, M, K, qdtype, flatten_x, always_fused=False):
        self.gemm, self.fused, self.M, self.K, self.qdtype, self.flatten_x = gemm, fused, M, K, qdtype, flatten_x
        self.always_fused = always_fused
        self.run = self.__call__

    def __call__(self, x, w, bias, y, x_scale, w_scale):
        if self.fused is not None and (self.always_fused or self.gemm is None or not capturing()):
            return self.fused.run(x, w, bias, y, None, w_scale)
        from ..quant import quantize_fp8_blockwise

        xq, xs = quantize_fp8_blockwise(x.reshape(self.M, self.K) if self.flatten_x else x, (1, GROUP),
                                        self.qdtype, scale_layout="col")
        return self.gemm.run(xq, w, bias, y, xs, w_scale)


class _Plan:
    """The plan (DensePlan, or hopper_ws.WSPlan), given x_scale as the 2-D (M, G) view its checked
    layout allows."""

    def __init__(self, gemm, flatten_scale):
        self.gemm, self.M = gemm, gemm.M
        self.run = gemm.run if flatten_scale is None else self._flattened

    def _flattened(self, x, w, bias, y, x_scale, w_scale):
        return self.gemm.run(x, w, bias, y, x_scale.view(self.M, -1), w_scale)
