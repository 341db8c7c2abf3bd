"""Grouped GEMM for mixture-of-experts: every expert's rows times its own weight, in one launch.

Rows are grouped by expert: expert e owns rows [offsets[e], offsets[e + 1]) of the (sorted)
problem. The offsets stay on the device (no host synchronization: CUDA-graph capturable, the
same plan for every routing of the same token count); the kernel reads the tile count from them.
Monotonicity of the offsets cannot be checked without a synchronization: it is unchecked (an
empty or negative range owns no row; offsets past the problem's rows never store past them; negative offsets are
clamped to 0 by the tl kernel, not by the warp-specialized one) unless GEMMKIT_DEBUG=1, which checks offsets and
indices.
Rows of the output that no expert's range covers are left unwritten.
"""

from __future__ import annotations

import dataclasses

import torch

from ..core import validate as v
from ..core.config import fit_to_smem, gated_tiles
from ..core.device import device_info
from ..core.epilogue import EpilogueSpec, torch_activation
from ..core.formats import Scale, dense
from ..core.grouped import (GroupedPlan, check_k_major, family_config_for, group_bias_stride, group_epilogue,
                            index_extent)
from ..core.hopper_ws import ws_grouped_plan
from ..core.plan import PlanCache, plan_key
from ..core.tracing import is_compiling as _is_compiling, library as _library
from ..kernels import modes
from .a8w8_blockscale import GROUP as BLOCK  # DeepSeek-V3's 1 x 128 / 128 x 128 scale blocks

_IN_DTYPES = (torch.bfloat16, torch.float16)
_INDEX_DTYPES = (torch.int32, torch.int64)
_WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)

# the fixed grouped tiles below: one program per tile over the whole K (a derived config's persistent schedule,
# K-sliced last wave or split-K dropped with it: STREAM_K without PERSISTENT is not a config)
_ONE_PROGRAM_PER_TILE = dict(PERSISTENT=False, STREAM_K=False, SPLIT_K=1, WARP_SPECIALIZE=False)


def grouped_config(kind: str, gated: bool, config, rows: int, N: int, K: int, dev, a_fmt, b_fmt, out_bytes: int):
    """The config of a grouped GEMM of `rows` rows per expert on average (the caller's, else the table's or a
    derived one, then the measured fixed tiles below where they apply). gated: two B tiles per K step and two
    accumulators (the shared memory of two; gated_tiles: 8 warps from 128 x 128)."""
    if gated:
        two_b = dataclasses.replace(b_fmt, bits=2 * b_fmt.bits)
        cfg = family_config_for(config, rows, N, K, dev, a_fmt, two_b, out_bytes, None)
        if config is None:
            if rows >= 64:  # 128x128x64 tiles, 8 warps, 3 stages, one program per tile (tuning/
                # gated_grouped_probe_h100.txt: 1.59x the derived 2-stage persistent tiles on Mixtral-8x7B at 4096
                # tokens, 1.31x the derived 64x32 on DeepSeek-V3 at 2048 (Zipf), level on Qwen3-30B-A3B)
                cfg = dataclasses.replace(cfg, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3,
                                          **_ONE_PROGRAM_PER_TILE, EPILOGUE_SUBTILE=False)
            cfg = fit_to_smem(gated_tiles(cfg), dev, a_fmt, two_b, out_bytes)
        return cfg
    cfg = family_config_for(config, rows, N, K, dev, a_fmt, b_fmt, out_bytes,
                            None if kind == "a8w8_blockscale" else "grouped_" + kind)  # (untuned: derived)
    if kind == "a8w8_blockscale" and config is None and rows >= 8:
        # 64x128x128 tiles, 4 warps, 3 stages, one program per tile (tuning/grouped_block_probe_h100.txt:
        # 1.1x to 2.4x the 128x64 tiles the dense rule derives, and the best of 16 tile configs on
        # DeepSeek-V3 (512, 4096 tokens, Zipf) and Qwen3-30B-A3B (4096) experts)
        cfg = fit_to_smem(dataclasses.replace(cfg, BLOCK_M=64, BLOCK_N=128, BLOCK_K=BLOCK, num_warps=4,
                                              num_stages=3, **_ONE_PROGRAM_PER_TILE), dev, a_fmt, b_fmt, out_bytes)
    return cfg


_plans = PlanCache()



def check_sizes(m_sizes) -> None:
    v.check_tensor("m_sizes", m_sizes, _INDEX_DTYPES)
    if m_sizes.ndim != 1:
        raise ValueError(f"m_sizes must be 1-D (E,), got shape {tuple(m_sizes.shape)}")


def offsets_from_sizes(m_sizes: torch.Tensor) -> torch.Tensor:
    """(E + 1,) int32 cumulative offsets of (E,) per-expert row counts, on the device (no sync)."""
    check_sizes(m_sizes)
    out = torch.zeros(m_sizes.shape[0] + 1, dtype=torch.int32, device=m_sizes.device)
    torch.cumsum(m_sizes, 0, out=out[1:])
    return out


def _offsets(expert_offsets, m_sizes):
    if (expert_offsets is None) == (m_sizes is None):
        raise ValueError("pass exactly one of expert_offsets ((E + 1,) int32 cumulative) and m_sizes ((E,) int32)")
    return offsets_from_sizes(m_sizes) if expert_offsets is None else expert_offsets


def grouped_gemm_a16w16(x, w, expert_offsets=None, *, m_sizes=None, gather_idx=None, scatter_idx=None,
                        routing_weights=None, bias=None, activation=None, out_dtype=None, config=None):
    """y[r] = activation(x[g(r)] @ w[e(r)].T + bias[e(r)]) * weight, for the rows r of each expert.

    x: (T, K) bf16/fp16 (K or row unit stride). w: (E, N, K), x's dtype, each w[e] with a unit
    stride. expert_offsets: (E + 1,) int32 on x's device, cumulative (expert e owns sorted rows
    [offsets[e], offsets[e + 1])); or m_sizes=(E,) row counts. gather_idx: None (x's rows are
    already sorted by expert: R = T rows) or (R,) int32/int64 token row of each sorted row
    (`gemmkit.moe.sort_by_expert`; no separate permute pass). scatter_idx: None (output row r is
    sorted row r) or (R,) int32/int64 destination row of each sorted row. routing_weights: None or
    R float values (e.g. topk_weights (T, k), contiguous) multiplying each row after the
    activation, indexed by the destination row. bias: (E, N) or (N,). Output (R, N), out_dtype
    (default x's). No autograd.
    """
    if _is_compiling():  # torch.compile records torch.ops.gemmkit.grouped_gemm_a16w16 (gemmkit.library)
        return _library().traced_grouped_gemm_a16w16(x, w, expert_offsets, m_sizes, gather_idx, scatter_idx,
                                                     routing_weights, bias, activation, out_dtype, config)
    offsets = _offsets(expert_offsets, m_sizes)
    return _grouped(x, w, offsets, gather_idx, scatter_idx, routing_weights, bias, None, None, activation,
                    out_dtype, config, "a16w16")


def grouped_gemm_a8w8(x, w, x_scale, w_scale, expert_offsets=None, *, m_sizes=None, gather_idx=None,
                      scatter_idx=None, routing_weights=None, bias=None, activation=None, out_dtype=torch.bfloat16,
                      config=None):
    """grouped_gemm_a16w16 with FP8 (e4m3/e5m2) or INT8 operands and scales, fp32 (int32) accumulation.

    x: (T, K), w: (E, N, K), K-contiguous. x_scale: float32, one value, or per token (T,) / (T, 1)
    (per row of x: with gather_idx, read through it). w_scale: float32, one value, one per
    expert ((E,) / (E, 1)), or per channel (E, N) / (E, 1, N) (contiguous). FP8 dots use
    Hopper's fast accumulation.
    """
    if _is_compiling():
        return _library().traced_grouped_gemm_a8w8(x, w, x_scale, w_scale, expert_offsets, m_sizes, gather_idx,
                                                   scatter_idx, routing_weights, bias, activation, out_dtype, config)
    offsets = _offsets(expert_offsets, m_sizes)
    return _grouped(x, w, offsets, gather_idx, scatter_idx, routing_weights, bias, x_scale, w_scale, activation,
                    out_dtype, config, "a8w8")


def grouped_gemm_a8w8_blockscale(x, w, x_scale, w_scale, expert_offsets=None, *, m_sizes=None, gather_idx=None,
                                 scatter_idx=None, routing_weights=None, bias=None, activation=None,
                                 out_dtype=torch.bfloat16, config=None):
    """grouped_gemm_a8w8 with DeepSeek-V3 block scales (the routed experts of its FP8 checkpoints).

    x: (T, K) float8_e4m3fn / e5m2, K-contiguous; x_scale: float32 (T, ceil(K / 128)), one per
    token and 128-wide K group, any 2-D layout (row- or column-major), indexed by x's rows (with
    gather_idx: read through it). w: (E, N, K) fp8, K-contiguous; w_scale: float32
    (E, ceil(N / 128), ceil(K / 128)), one per expert and 128 x 128 block, any strides. Each
    128-wide K block's partial product is promoted to fp32 and scaled in the K loop (ragged K and
    N fine; BLOCK_K must divide 128). Offsets, indices, weights, bias, activation, out_dtype as
    grouped_gemm_a16w16's; output (R, N), bf16 by default.
    """
    if _is_compiling():
        return _library().traced_grouped_gemm_a8w8_blockscale(x, w, x_scale, w_scale, expert_offsets, m_sizes,
                                                              gather_idx, scatter_idx, routing_weights, bias,
                                                              activation, out_dtype, config)
    offsets = _offsets(expert_offsets, m_sizes)
    return _grouped(x, w, offsets, gather_idx, scatter_idx, routing_weights, bias, x_scale, w_scale, activation,
                    out_dtype, config, "a8w8_blockscale")


def _grouped(x, w, offsets, gather_idx, scatter_idx, routing_weights, bias, x_scale, w_scale, activation, out_dtype,
             config, kind):
    key = plan_key((x, w, offsets, gather_idx, scatter_idx, routing_weights, bias, x_scale, w_scale),
                   (kind, activation, out_dtype, None if config is None else v.config_key(config)))
    try:
        plan = _plans.lookup(key)
    except (KeyError, TypeError):
        plan = _plans.plan_for(key, _make_plan, x, w, offsets, gather_idx, scatter_idx, routing_weights, bias,
                               x_scale, w_scale, activation, out_dtype, config, kind)
    if v.debug_checks():
        debug_check(x, offsets, gather_idx, scatter_idx, plan.rows)
    return plan.run(x, w, offsets, gather_idx, scatter_idx, routing_weights, bias, x_scale, w_scale)


def debug_check(x, offsets, gather_idx, scatter_idx, rows: int) -> None:
    """GEMMKIT_DEBUG=1: the checks that need the values (a host synchronization)."""
    o = offsets.cpu()
    if o[0] < 0 or bool((o[1:] < o[:-1]).any()) or o[-1] > rows:
        raise ValueError(f"expert_offsets must be non-decreasing within [0, {rows}], got {o.tolist()}")
    if gather_idx is not None and gather_idx.numel() and (gather_idx.min() < 0 or gather_idx.max() >= x.shape[0]):
        raise ValueError(f"gather_idx values must lie in [0, {x.shape[0]})")
    if scatter_idx is not None and scatter_idx.numel():
        if scatter_idx.min() < 0 or scatter_idx.max() >= rows:
            raise ValueError(f"scatter_idx values must lie in [0, {rows})")
        if torch.unique(scatter_idx).numel() != scatter_idx.numel():
            raise ValueError("scatter_idx must not repeat a destination row")


def _check_index(name, t, R, device):
    if t is None:
        return
    v.check_tensor(name, t, _INDEX_DTYPES)
    if t.ndim != 1 or t.shape[0] != R:
        raise ValueError(f"{name} must be 1-D with {R} entries (one per sorted row), got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but x is on {device}")
    if R > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous")


def grouped_gated_a16w16(x, w_gate_up, offsets, *, gather_idx=None, activation="silu", config=None):
    """(R, I) = activation(x[g(r)] @ gate[e(r)].T) * (x[g(r)] @ up[e(r)].T) per sorted row r, in one
    grouped launch with the gated epilogue (two accumulators per tile, the (R, 2I) product never
    written): w_gate_up (E, 2I, K), gate rows first (moe.moe_mlp's layout); x, offsets and
    gather_idx as grouped_gemm_a16w16's. Output in x's dtype; torch.ops.gemmkit.grouped_gated_a16w16
    under torch.compile."""
    if _is_compiling():  # torch.ops.gemmkit.grouped_gated_a16w16 (gemmkit.library)
        return _library().traced_grouped_gated_a16w16(x, w_gate_up, offsets, gather_idx, activation, config)
    inter = gated_weight_shape(w_gate_up)[1] // 2
    gate, up = w_gate_up[:, :inter], w_gate_up[:, inter:]
    key = plan_key((x, gate, offsets, gather_idx), ("gated", activation, None if config is None else v.config_key(config)))
    try:
        plan = _plans.lookup(key)
    except (KeyError, TypeError):
        plan = _plans.plan_for(key, _make_plan, x, gate, offsets, gather_idx, None, None, None, None, None, activation,
                               None, config, "a16w16", True)
    if v.debug_checks():
        debug_check(x, offsets, gather_idx, None, plan.rows)
    if isinstance(plan, _Degenerate):
        return plan(x, gate, offsets, gather_idx, None, None, None, None, None).to(x.dtype)
    return plan.run(x, gate, offsets, gather_idx, None, None, None, None, None, up)


def gated_weight_shape(w_gate_up) -> tuple:
    """(E, 2I, K) of a gated grouped GEMM's gate/up weight, checked."""
    if not isinstance(w_gate_up, torch.Tensor) or w_gate_up.ndim != 3 or w_gate_up.shape[1] % 2:
        raise ValueError(f"w_gate_up must be (E, 2I, K) (gate rows, then up rows), got "
                         f"{getattr(w_gate_up, 'shape', w_gate_up)!r}")
    return tuple(w_gate_up.shape)


def _make_plan(x, w, offsets, gather_idx, scatter_idx, routing_weights, bias, x_scale, w_scale, activation,
               out_dtype, config, kind, gated=False):
    if kind == "a16w16":
        v.check_tensor("x", x, _IN_DTYPES)
        v.check_tensor("w", w, _IN_DTYPES)
        v.check_same_dtype("w", w, x)
    elif kind == "a8w8_blockscale":
        v.check_tensor("x", x, FP8)
        v.check_tensor("w", w, FP8)
    else:
        v.check_tensor("x", x, FP8 + (torch.int8,))
        v.check_tensor("w", w, FP8 + (torch.int8,))
        if (x.dtype == torch.int8) != (w.dtype == torch.int8):
            raise TypeError(f"x is {x.dtype} but w is {w.dtype}: int8 pairs only with int8, fp8 only with fp8")
    activation = v.check_activation(activation)
    v.check_tensor("expert_offsets", offsets, (torch.int32,))
    device = v.check_devices(x=x, w=w, expert_offsets=offsets, bias=bias, x_scale=x_scale, w_scale=w_scale,
                             routing_weights=routing_weights)
    v.check_no_autograd(x=x, w=w, bias=bias, routing_weights=routing_weights, x_scale=x_scale, w_scale=w_scale)
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (T, K), got shape {tuple(x.shape)}")
    if w.ndim != 3:
        raise ValueError(f"w must be 3-D (E, N, K), got shape {tuple(w.shape)}")
    T, K = x.shape
    E, N, Kw = w.shape
    if Kw != K:
        raise ValueError(f"w has shape {tuple(w.shape)}: its K ({Kw}) differs from x's ({K})")
    if offsets.ndim != 1 or offsets.shape[0] != E + 1:
        raise ValueError(f"expert_offsets must be 1-D with E + 1 = {E + 1} entries (cumulative, starting at 0), "
                         f"got shape {tuple(offsets.shape)}")
    if offsets.stride(0) != 1 and E > 0:
        raise ValueError("expert_offsets must be contiguous")
    R = gather_idx.shape[0] if gather_idx is not None and gather_idx.ndim == 1 else T
    _check_index("gather_idx", gather_idx, R, device)
    _check_index("scatter_idx", scatter_idx, R, device)
    if routing_weights is not None:
        v.check_tensor("routing_weights", routing_weights, _WEIGHT_DTYPES)
        if routing_weights.numel() != R or not routing_weights.is_contiguous():
            raise ValueError(f"routing_weights must be contiguous with {R} values (one per output row, e.g. "
                             f"topk_weights (T, k)), got shape {tuple(routing_weights.shape)}")
    scale_strides = None
    if kind == "a8w8_blockscale":
        stride_biasg, out_dtype, a_scale, b_scale, s_bsg, scale_strides = _block_scales(
            x, w, bias, x_scale, w_scale, out_dtype, T, E, N, K)
    else:
        stride_biasg, out_dtype, a_scale, _, b_scale, s_bsg = group_epilogue(
            kind, x, w, bias, x_scale, w_scale, out_dtype, E, N, "E", ({(T,), (T, 1)}, set(), set()),
            (set(), {(E, N), (E, 1, N)}, {(E,), (E, 1)}))
    s_asg = 0  # per-token x scales are read through the rows (gathered or not), not per expert
    if R == 0 or N == 0 or E == 0 or K == 0:
        return _Degenerate(R, N, out_dtype, device, activation, bias, E, K)
    v.check_layout("x", x)
    v.check_layout("w[0]", w[0])
    dev = device_info(device)
    if kind == "a8w8_blockscale":
        a_fmt, b_fmt = dense(x.dtype, a_scale, BLOCK), dense(w.dtype, b_scale, BLOCK, BLOCK)
    else:
        a_fmt, b_fmt = dense(x.dtype, a_scale), dense(w.dtype, b_scale)
    if kind == "a16w16" or (kind == "a8w8" and x.dtype in FP8):  # the warp-specialized kernel with the expert map
        # (Hopper, many rows per expert)
        plan = ws_grouped_plan(dev, x, w, R, bias, gather=gather_idx is not None, scatter=scatter_idx is not None,
                               weighted=routing_weights is not None, activation=activation, out_dtype=out_dtype,
                               config=config, gated=gated, x_scale=x_scale if kind == "a8w8" else None,
                               w_scale=w_scale if kind == "a8w8" else None)
        if plan is not None:
            return plan
    rows = max(1, -(-R // E))  # per expert on average: what the configs are chosen by
    cfg = grouped_config(kind, gated, config, rows, N, K, dev, a_fmt, b_fmt, out_dtype.itemsize)
    plan = GroupedPlan(modes.MAP_GROUPED, x, w, (R, N), (N, 1), R, E, a_fmt, b_fmt,
                       EpilogueSpec(activation, bias is not None, gated=gated), cfg, dev, out_dtype=out_dtype,
                       group_strides=dict(stride_asg=s_asg, stride_bsg=s_bsg, stride_biasg=stride_biasg),
                       gather=gather_idx is not None, index_extent=max(index_extent(x, w), R * N),
                       auto_config=config is None, scale_strides=scale_strides)
    plan.rows = R
    return plan


def _block_scales(x, w, bias, x_scale, w_scale, out_dtype, T, E, N, K):
    """(bias group stride, out_dtype, A / B scale kinds, B's expert stride, the scales' strides)
    of grouped_gemm_a8w8_blockscale, checked."""
    stride_biasg = group_bias_stride(bias, E, N, "E", v.BIAS_DTYPES)
    out_dtype = v.check_out_dtype(out_dtype, None, torch.bfloat16)
    G = -(-K // BLOCK)
    for name, s, shape, what in (("x_scale", x_scale, (T, G), "one per token and 128-wide K group"),
                                 ("w_scale", w_scale, (E, -(-N // BLOCK), G), "one per expert and 128 x 128 block")):
        v.check_tensor(name, s, (torch.float32,))
        if tuple(s.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(s.shape)}; expected {shape} ({what})")
    check_k_major(x, w)
    strides = dict(stride_asm=x_scale.stride(0), stride_ask=x_scale.stride(1), stride_bsn=w_scale.stride(1),
                   stride_bsk=w_scale.stride(2))
    return stride_biasg, out_dtype, Scale.KBLOCK, Scale.KBLOCK, w_scale.stride(0), strides


class _Degenerate:
    """R, N, E or K is 0: no launch. K == 0 gives activation(bias) per row; with experts unknown
    on the host, a per-expert bias needs K > 0."""

    def __init__(self, R, N, out_dtype, device, activation, bias, E, K):
        self.rows, self.shape, self.dtype, self.device, self.activation = R, (R, N), out_dtype, device, activation
        if K == 0 and R and N and E and bias is not None and bias.ndim == 2:
            raise ValueError("K == 0 with a per-expert bias (E, N) is not supported")
        self.run = self.__call__

    def __call__(self, x, w, offsets, gather_idx, scatter_idx, routing_weights, bias, x_scale, w_scale):
        y = torch.zeros(self.shape, dtype=torch.float32, device=self.device)
        if bias is not None and self.shape[0] and self.shape[1]:
            y = y + bias.float()
        y = torch_activation(y, self.activation)
        if routing_weights is not None and self.shape[0]:
            w_ = routing_weights.reshape(-1).float()
            idx = torch.arange(self.shape[0], device=self.device) if scatter_idx is None else scatter_idx.long()
            y = y * w_[idx][:, None]
        if scatter_idx is not None and self.shape[0]:
            out = torch.empty_like(y)
            out[scatter_idx.long()] = y
            y = out
        return y.to(self.dtype)


