"""Output shapes and dtypes of the public ops, as pure functions of the input facts.

One place for this logic: the fake (meta) implementations of the custom ops (gemmkit.library)
call it, and plans can reuse it. Every output is contiguous. Shapes may hold SymInts.
"""

from __future__ import annotations

import torch


def gemm_output(x_shape, w_shape, out_dtype, default_dtype) -> tuple[tuple, torch.dtype]:
    """(shape, dtype) of activation(x @ w.T): x (*, K), w (N, K) -> (*, N); out_dtype None ->
    default_dtype (gemm_a16w16: x's dtype; gemm_a8w8: bfloat16). Raises ValueError on shapes
    that do not multiply."""
    if len(x_shape) == 0:
        raise ValueError("x must have at least 1 dimension, got a 0-d tensor")
    if len(w_shape) != 2:
        raise ValueError(f"w must be 2-D (N, K), got shape {tuple(w_shape)}")
    if w_shape[1] != x_shape[-1]:
        raise ValueError(f"w has shape {tuple(w_shape)}: its K ({w_shape[1]}) differs from x's ({x_shape[-1]})")
    return (*x_shape[:-1], w_shape[0]), default_dtype if out_dtype is None else out_dtype


def quantize_output(t_shape, granularity: str, qdtype: torch.dtype):
    """((q shape, q dtype), (scale shape, float32)) of quantizing t (*, K): q has t's shape;
    the scale is (*, 1) per row ("row") or 0-d ("tensor")."""
    if len(t_shape) == 0:
        raise ValueError("t must have at least 1 dimension, got a 0-d tensor")
    if granularity not in ("row", "tensor"):
        raise ValueError(f"granularity={granularity!r} must be 'row' or 'tensor'")
    scale_shape = (*t_shape[:-1], 1) if granularity == "row" else ()
    return (tuple(t_shape), qdtype), (scale_shape, torch.float32)


def blockwise_output(t_shape, block_rows: int, qdtype: torch.dtype, scale_layout: str):
    """((q shape, q dtype), (scale shape, float32, scale strides)) of quantize_fp8_blockwise(t,
    (block_rows, 128)): q has t's shape (contiguous); the scale (*, G) (block_rows 1) or
    (ceil(N / 128), G), G = ceil(K / 128), row-major or (scale_layout "col") column-major."""
    if len(t_shape) == 0:
        raise ValueError("t must have at least 1 dimension, got a 0-d tensor")
    G = -(-t_shape[-1] // 128)
    shape = (*t_shape[:-1], G) if block_rows == 1 else (-(-t_shape[0] // 128), G)
    def row_major(dims):
        out, acc = [], 1
        for d in reversed(dims):
            out.append(acc)
            acc *= d
        return out[::-1], acc

    if scale_layout == "col":  # the flattened rows are the unit-stride dimension
        lead, rows = row_major(shape[:-1])
        strides = (*lead, rows)
    else:
        strides = tuple(row_major(shape)[0])
    return (tuple(t_shape), qdtype), (shape, torch.float32, tuple(strides))


def ff_output(x_shape, w_first_shape, w_down_shape, out_dtype, default_dtype, gated: bool):
    """(shape, dtype) of a feed-forward block down(act(x @ w_first^T) [* up]): x (*, H), w_first
    (2I, H) (gated, [gate; up] or interleaved) or (I, H), w_down (H_out, I) -> (*, H_out)."""
    if len(x_shape) == 0:
        raise ValueError("x must have at least 1 dimension, got a 0-d tensor")
    if len(w_first_shape) != 2 or len(w_down_shape) != 2:
        raise ValueError("the weights must be 2-D")
    if w_first_shape[1] != x_shape[-1]:
        raise ValueError(f"w_gate_up / w_up has shape {tuple(w_first_shape)}: its K differs from x's ({x_shape[-1]})")
    inter = w_first_shape[0] // 2 if gated else w_first_shape[0]
    if w_down_shape[1] != inter:
        raise ValueError(f"w_down has shape {tuple(w_down_shape)}: its K must be the intermediate size {inter}")
    return (*x_shape[:-1], w_down_shape[0]), default_dtype if out_dtype is None else out_dtype


def split_cat_output(x_shape, w_shape, y_shape, heads: int, d1: int, d2: int, out_dtype):
    """((out1 shape, out2 shape), dtype) of the fused split/cat: x (M, K), w (heads * (d1 + d2),
    K), y (M, heads, d3) -> (M, heads, d1 + d3), (M, heads, d2)."""
    if len(x_shape) != 2 or len(w_shape) != 2 or len(y_shape) != 3:
        raise ValueError("x and w must be 2-D, y 3-D")
    if w_shape[0] != heads * (d1 + d2) or w_shape[1] != x_shape[1]:
        raise ValueError(f"w has shape {tuple(w_shape)}: expected ({heads * (d1 + d2)}, {x_shape[1]})")
    M = x_shape[0]
    return ((M, heads, d1 + y_shape[2]), (M, heads, d2)), out_dtype


def packed_gemm_output(x_shape, w_shape, out_dtype, default_dtype, x_packed: bool = False):
    """(shape, dtype) of a GEMM with a packed 4-bit weight w (N, K // 2) (two values per byte):
    x (*, K), or (*, K // 2) itself packed (x_packed) -> (*, N)."""
    if len(x_shape) == 0:
        raise ValueError("x must have at least 1 dimension, got a 0-d tensor")
    K = 2 * x_shape[-1] if x_packed else x_shape[-1]
    if len(w_shape) != 2 or 2 * w_shape[1] != K:
        raise ValueError(f"w has shape {tuple(w_shape)}: for K={K} it must be (N, K // 2)")
    return (*x_shape[:-1], w_shape[0]), default_dtype if out_dtype is None else out_dtype


def grouped_output(x_shape, w_shape, gather_shape, out_dtype, default_dtype):
    """(shape, dtype) of a grouped GEMM: x (T, K), w (E, N, K), gather_idx None or (R,) ->
    (R, N) with R = T without gather_idx. Independent of the routing values (offsets, indices)."""
    if len(x_shape) != 2 or len(w_shape) != 3:
        raise ValueError(f"x must be 2-D (T, K) and w 3-D (E, N, K), got {tuple(x_shape)} and {tuple(w_shape)}")
    if w_shape[2] != x_shape[1]:
        raise ValueError(f"w has shape {tuple(w_shape)}: its K ({w_shape[2]}) differs from x's ({x_shape[1]})")
    if gather_shape is not None and len(gather_shape) != 1:
        raise ValueError(f"gather_idx must be 1-D (R,), got shape {tuple(gather_shape)}")
    R = x_shape[0] if gather_shape is None else gather_shape[0]
    return (R, w_shape[1]), default_dtype if out_dtype is None else out_dtype


def batched_output(x_shape, w_shape, out_dtype, default_dtype):
    """(shape, dtype) of a batched GEMM: x (B, M, K), w (B, N, K) or (N, K) -> (B, M, N)."""
    if len(x_shape) != 3 or len(w_shape) not in (2, 3):
        raise ValueError(f"x must be 3-D (B, M, K) and w (B, N, K) or (N, K), got {tuple(x_shape)}, {tuple(w_shape)}")
    if w_shape[-1] != x_shape[2] or (len(w_shape) == 3 and w_shape[0] != x_shape[0]):
        raise ValueError(f"w has shape {tuple(w_shape)}: expected ({x_shape[0]}, N, {x_shape[2]}) or (N, {x_shape[2]})")
    return (x_shape[0], x_shape[1], w_shape[-2]), default_dtype if out_dtype is None else out_dtype
