"""A8W8 blockscale: FP8 operands with 1x128 activation and 128x128 weight scales (DeepSeek-V3)."""

from __future__ import annotations

import dataclasses

import torch

from ..core import validate as v
from ..core.config import resolve_config
from ..core.dense import DensePlan
from ..core.device import device_info
from ..core.epilogue import EpilogueSpec
from ..core.formats import Scale, dense, quantized_in_kernel
from ..core.plan import PlanCache, plan_key

OP = "a8w8_blockscale"
GROUP = 128  # scale block: 1 x 128 of x, 128 x 128 of w
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_plans = PlanCache()


def gemm_a8w8_blockscale(x, w, x_scale, w_scale, bias=None, *, activation=None, out_dtype=torch.bfloat16, y=None,
                         config=None):
    """activation(dequant(x) @ dequant(w).T + bias) with DeepSeek-V3 block scales, fp32 accumulation.

    x: (M, K) or (*, K) float8_e4m3fn / float8_e5m2, K-contiguous; x_scale: float32 (M, G) or
    (*, G), G = ceil(K / 128): one scale per token and 128-wide K group, in any 2-D layout
    (row-major, or column-major as engines store it for TMA: `s.t().contiguous().t()`).
    w: (N, K) fp8, K-contiguous; w_scale: float32 (ceil(N / 128), G), any layout.
    Dynamic form: x in bf16/fp16 with x_scale=None, quantized per 1 x 128 group inside the GEMM.
    Each 128-wide K block's partial product is promoted to fp32 and multiplied by its two scales
    in the K loop (exactly the block structure; ragged last groups of K and N included).
    bias: (N,) bf16/fp16/fp32. activation: None, "relu", "gelu_tanh", "silu". out_dtype: bf16
    (default), fp16 or fp32. y: optional preallocated output. config: None (tuned table, else
    derived; BLOCK_K must divide 128), a dict or a GemmConfig.
    """
    key = plan_key((x, w, x_scale, w_scale, bias, y),
                   (activation, out_dtype, None if config is None else v.config_key(config)))
    try:
        plan = _plans[key]
        _plans.move_to_end(key)  # least recently used plans are evicted first
    except (KeyError, TypeError):  # a new plan (validates), or no key (bad input)
        plan = _plans.plan_for(key, _make_plan, x, w, x_scale, w_scale, bias, y, activation, out_dtype, config)
    return plan.run(x, w, bias, y, x_scale, w_scale)


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


def _make_plan(x, w, x_scale, w_scale, bias, y, activation, out_dtype, config):
    v.check_tensor("x", x, FP8 + (torch.bfloat16, torch.float16))
    v.check_tensor("w", w, FP8)
    dynamic = x.dtype in (torch.bfloat16, torch.float16)
    if dynamic and x_scale is not None:
        raise ValueError("x is 16-bit: pass x_scale=None (quantized per 1 x 128 group in the GEMM), or quantize x "
                         "first (gemmkit.quant.quantize_fp8_blockwise)")
    if not dynamic and x_scale is None:
        raise ValueError("x_scale is required when x is already quantized: float32 (M, ceil(K / 128))")
    activation, device, x2, lead, M, N, K = v.check_inputs(x, w, activation, x_scale=x_scale, w_scale=w_scale,
                                                           bias=bias, y=y)
    G = -(-K // GROUP)
    xs2 = None if dynamic else _check_scale("x_scale", x_scale, (*lead, G))
    ws2 = _check_scale("w_scale", w_scale, (-(-N // GROUP), G))
    v.check_bias(bias, N, _BIAS_DTYPES)
    out_dtype, y2, degenerate = v.check_output(y, lead, M, N, K, out_dtype, torch.bfloat16, device, activation)
    if degenerate:
        return degenerate
    v.check_k_major(K, x=x2, w=w)
    dev = device_info(device)
    if dynamic:
        a_fmt = quantized_in_kernel(x.dtype, w.dtype, "group", GROUP)
    else:
        a_fmt = dense(x.dtype, Scale.KBLOCK, GROUP)
    b_fmt = dense(w.dtype, Scale.KBLOCK, GROUP, GROUP)
    cfg = resolve_config(OP, config, M, N, K, dev, a_fmt, b_fmt, out_dtype.itemsize)
    if dynamic and cfg.BLOCK_K != GROUP and cfg.BLOCK_K < K:  # the kernel quantizes x per K tile
        if config is not None:
            raise ValueError(f"config: BLOCK_K={cfg.BLOCK_K}; a 16-bit x is quantized per 128-wide K tile: "
                             f"BLOCK_K must be {GROUP}")
        cfg = dataclasses.replace(cfg, BLOCK_K=GROUP)
    example_y = y2 if y2 is not None else torch.empty((M, N), dtype=out_dtype, device=device)
    return _Plan(DensePlan(x2, w, example_y, a_fmt, b_fmt, EpilogueSpec(activation, bias is not None), cfg, dev,
                           out_dtype=out_dtype, out_shape=(*lead, N), flatten_x=x.ndim != 2,
                           inputs=dict(bias=bias, a_scale=xs2, b_scale=ws2), auto_config=config is None),
                 lead if xs2 is not None and x_scale.ndim != 2 else None)


class _Plan:
    """The dense plan, given x_scale as the 2-D (M, G) view its checked layout allows."""

    def __init__(self, gemm: DensePlan, flatten_scale):
        self.gemm, self.M = gemm, gemm.M
        self.run = gemm.run if flatten_scale is None else self._flattened

    def _flattened(self, x, w, bias, y, x_scale, w_scale):
        return self.gemm.run(x, w, bias, y, x_scale.view(self.M, -1), w_scale)
