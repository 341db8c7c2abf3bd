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


def packed_gemm_output(x_shape, w_shape, out_dtype, default_dtype, x_packed: bool = False):
    """(shape, dtype) of a GEMM with a packed 4-bit weight w (N, K // 2) (two values per byte):
    x (*, K), or (*, K // 2) itself packed (x_packed) -> (*, N)."""
    if len(x_shape) == 0:
        raise ValueError("x must have at least 1 dimension, got a 0-d tensor")
    K = 2 * x_shape[-1] if x_packed else x_shape[-1]
    if len(w_shape) != 2 or 2 * w_shape[1] != K:
        raise ValueError(f"w has shape {tuple(w_shape)}: for K={K} it must be (N, K // 2)")
    return (*x_shape[:-1], w_shape[0]), default_dtype if out_dtype is None else out_dtype
