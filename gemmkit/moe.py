"""Mixture-of-experts helpers on top of the grouped GEMM (gemmkit.ops.grouped): routing sorted by
expert on the device, and a whole MoE MLP.

Top-k combine (deterministic, no atomics): the down projection's grouped GEMM writes each
(token, slot) row, times its routing weight, in x's dtype to its own row t * k + j of a (T * k, H)
buffer (scatter_idx = the flat (token, slot) index); the k rows of a token are then summed by one
reduction over k (torch, fp32 accumulation, slot order).
"""

from __future__ import annotations

import torch

from .core.epilogue import torch_activation
from .core.tracing import is_compiling, library
from .core.validate import debug_checks
from .ops import routing
from .ops.grouped import (FP8, grouped_gated_a16w16, grouped_gemm_a8w8, grouped_gemm_a8w8_blockscale,
                          grouped_gemm_a16w16)


def sort_by_expert(topk_ids: torch.Tensor, num_experts: int):
    """(gather_idx, scatter_idx, expert_offsets) of a top-k routing, on the device, no host sync.

    topk_ids: (T, k) integer expert ids in [0, num_experts) (not checked: a host synchronization; an id outside
    sorts outside every expert's rows, which no grouped GEMM then writes). Sorted row r (stable by expert, then
    by flat (token, slot) index) reads token gather_idx[r] = flat // k and lands in flat row
    scatter_idx[r] = t * k + j; expert e owns sorted rows [expert_offsets[e], expert_offsets[e + 1]).
    All int32; expert_offsets has num_experts + 1 entries. A stable counting sort on the device
    (kernels/routing.py: 2 to 20 us on the H100 where torch's argsort path took 20 to 95 us); more than 4094
    experts, and CPU tensors outside the Triton interpreter, take torch's argsort.
    """
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.ndim != 2:
        raise ValueError(f"topk_ids must be a 2-D (T, k) tensor, got {getattr(topk_ids, 'shape', topk_ids)!r}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype.is_complex or topk_ids.dtype == torch.bool:
        raise TypeError(f"topk_ids must hold integer expert ids, got {topk_ids.dtype}")
    if not isinstance(num_experts, int) or isinstance(num_experts, bool) or not 1 <= num_experts < 2**31 - 1:
        raise ValueError(f"num_experts must be an int in [1, 2**31 - 1) (int32 offsets), got {num_experts!r}")
    if is_compiling():  # torch.compile records torch.ops.gemmkit.sort_by_expert (gemmkit.library)
        return library().traced_sort_by_expert(topk_ids, num_experts)
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1)
    if flat.dtype not in (torch.int32, torch.int64):  # (narrow ids: the bounds up to num_experts would wrap)
        if flat.dtype.itemsize < 4:
            flat = flat.to(torch.int32)
        else:  # (unsigned 32 / 64-bit: values from 2**63 would wrap negative; only their order past E matters)
            flat = flat.to(torch.float64).clamp_(max=num_experts).to(torch.int64)
    flat = flat.contiguous()
    if routing.kernels_take(flat, num_experts):
        return routing.sort_by_expert_kernels(flat, num_experts, k)
    return routing.sort_by_expert_torch(flat, num_experts, k)


def moe_mlp(x, topk_ids, topk_weights, w_gate_up, w_down, activation: str = "silu", *, w_gate_up_scale=None,
            w_down_scale=None, config=None, fused_activation: bool = True):
    """sum_j topk_weights[t, j] * down_e(act(gate_e(x_t)) * up_e(x_t)), e = topk_ids[t, j].

    x: (T, H) bf16/fp16. topk_ids: (T, k) int, values in [0, E): unchecked (a host synchronization) unless
    GEMMKIT_DEBUG=1, which raises for others (an id outside leaves its slot's row unwritten: its token's sum is
    undefined). topk_weights: (T, k) float32/bf16/fp16 (contiguous).
    w_gate_up: (E, 2I, H) (gate rows first, then up: the fused layout), w_down: (E, H, I), x's
    dtype. activation: "silu" (SwiGLU) or "gelu_tanh". Returns (T, H) in x's dtype.

    Two grouped GEMMs: gate/up reads x's rows through gather_idx (no permute pass) and, with
    fused_activation=True (default), computes act(gate) * up in its epilogue (two accumulators,
    `grouped_gated_a16w16`) and writes only the sorted (T * k, I) product; fused_activation=False
    writes the (T * k, 2I) product and runs the activation in torch (measured 1.0-1.4x slower).
    Down writes each row, weighted, in x's dtype to its (token, slot) row, then a sum over k in
    fp32 (module docstring). No host synchronization.

    FP8 weights (float8_e4m3fn / e5m2) with float32 scales, two schemes:
    - per channel: w_gate_up_scale (E, 2I), w_down_scale (E, H) (or one per expert, (E,));
      x and the intermediate are quantized per token (`quant.quantize_fp8`), grouped_gemm_a8w8;
    - DeepSeek-V3 block scales: w_gate_up_scale (E, ceil(2I / 128), ceil(H / 128)), w_down_scale
      (E, ceil(H / 128), ceil(I / 128)); x and the intermediate are quantized per 1 x 128 group
      (`quant.quantize_fp8_blockwise`), grouped_gemm_a8w8_blockscale.
    The gate/up GEMM writes the (T * k, 2I) product in x's dtype and the activation runs in torch
    (the gated epilogue takes 16-bit operands only); fused_activation is ignored.
    """
    if activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"activation must be 'silu' or 'gelu_tanh', got {activation!r}")
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise ValueError(f"x must be 2-D (T, H), got {getattr(x, 'shape', x)!r}")
    if not isinstance(w_gate_up, torch.Tensor) or w_gate_up.ndim != 3 or w_gate_up.shape[1] % 2:
        raise ValueError(f"w_gate_up must be (E, 2I, H), got {getattr(w_gate_up, 'shape', w_gate_up)!r}")
    if not isinstance(w_down, torch.Tensor) or w_down.ndim != 3 or w_down.shape[0] != w_gate_up.shape[0] \
            or 2 * w_down.shape[2] != w_gate_up.shape[1] or w_down.shape[1] != x.shape[1]:
        raise ValueError(f"w_down must be (E, H, I) = ({w_gate_up.shape[0]}, {x.shape[1]}, {w_gate_up.shape[1] // 2}), "
                         f"got {getattr(w_down, 'shape', w_down)!r}")
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.ndim != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids must be (T, k) with T = {x.shape[0]}, got {getattr(topk_ids, 'shape', topk_ids)!r}")
    if not isinstance(topk_weights, torch.Tensor) or tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}")
    if topk_weights.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"topk_weights has dtype {topk_weights.dtype}; expected float32, bfloat16 or float16")
    T, k = topk_ids.shape
    E, I2, H = w_gate_up.shape
    # (a check of values: eager only; torch.compile cannot guard on them)
    if (debug_checks() and not is_compiling() and topk_ids.numel()
            and not bool(((topk_ids >= 0) & (topk_ids < E)).all())):
        raise ValueError(f"topk_ids values must lie in [0, {E}) (GEMMKIT_DEBUG check)")
    fp8 = w_gate_up.dtype in FP8
    if fp8 != (w_down.dtype in FP8) or (w_gate_up_scale is None) != (w_down_scale is None) or fp8 != (
            w_gate_up_scale is not None):
        raise ValueError("FP8 weights come with both w_gate_up_scale and w_down_scale (float32); 16-bit weights with "
                         f"neither (got w_gate_up {w_gate_up.dtype}, w_down {w_down.dtype}, scales "
                         f"{'given' if w_gate_up_scale is not None else 'None'})")
    gather_idx, scatter_idx, offsets = sort_by_expert(topk_ids, E)
    weights = topk_weights.contiguous()
    if fp8:
        return _moe_mlp_fp8(x, gather_idx, scatter_idx, offsets, weights, w_gate_up, w_down, w_gate_up_scale,
                            w_down_scale, activation, config, T, k, H)
    if fused_activation:
        a = grouped_gated_a16w16(x, w_gate_up, offsets, gather_idx=gather_idx, activation=activation, config=config)
    else:
        h = grouped_gemm_a16w16(x, w_gate_up, offsets, gather_idx=gather_idx, config=config)  # (T k, 2I) sorted
        a = _activation(h, activation, x.dtype)
    y = grouped_gemm_a16w16(a, w_down, offsets, scatter_idx=scatter_idx, routing_weights=weights,
                            config=config)  # (T k, H), row t k + j
    return y.view(T, k, H).sum(dim=1)  # one reduction kernel, fp32 accumulation


def _activation(h, activation: str, dtype):
    """act(gate) * up of a (rows, 2I) [gate | up] product, in fp32, rounded to `dtype`."""
    gate, up = h.chunk(2, dim=-1)
    return (torch_activation(gate.float(), activation) * up.float()).to(dtype)


def _moe_mlp_fp8(x, gather_idx, scatter_idx, offsets, weights, w_gate_up, w_down, s_gate_up, s_down, activation,
                 config, T, k, H):
    """moe_mlp with FP8 weights: per-channel (row-wise) or DeepSeek-V3 block scales (see moe_mlp)."""
    from . import quant

    block = s_gate_up.ndim == 3
    qdtype = w_gate_up.dtype

    def quantize(t):
        if block:
            return quant.quantize_fp8_blockwise(t, (1, 128), qdtype)
        return quant.quantize_fp8(t, "row", qdtype)

    def gemm(a, a_scale, w, w_scale, **kw):
        if block:
            return grouped_gemm_a8w8_blockscale(a, w, a_scale, w_scale, offsets, out_dtype=x.dtype, config=config,
                                                **kw)
        return grouped_gemm_a8w8(a, w, a_scale, w_scale, offsets, out_dtype=x.dtype, config=config, **kw)

    xq, xs = quantize(x)
    h = gemm(xq, xs, w_gate_up, s_gate_up, gather_idx=gather_idx)  # (T k, 2I) sorted rows
    aq, as_ = quantize(_activation(h, activation, x.dtype))
    y = gemm(aq, as_, w_down, s_down, scatter_idx=scatter_idx, routing_weights=weights)  # (T k, H), row t k + j
    return y.view(T, k, H).sum(dim=1)
