"""Operand rows that start on the L2's 32-byte sectors.

A row-major (rows, K) operand whose row stride in bytes is not a multiple of ROW_ALIGN (FP8 with
K % 32 != 0, 16-bit types with K % 16 != 0) starts every other row inside a sector: each 128-byte
piece a TMA box (or a warp's coalesced load) reads of such a row spans five sectors, not four,
and the kernels fetching x and w in such pieces ran 1.2x to 1.8x slower than on the same values
with padded rows (scripts/align_probe.py, tuning/align/: FP8 8192 x 3696 at M = 128 / 512 / 8192
0.80x / 1.02x / 0.93x `_scaled_mm` contiguous, 1.05x / 1.28x / 1.12x padded; bf16 K = 4104 at
M = 512 0.54x -> 0.95x). Padding to 32 bytes measured as fast as to 128.

What gemmkit does about it:
- x (activations), from ALIGN_X_MIN_M rows: the ops copy it into rows padded to ROW_ALIGN bytes
  before the GEMM (`AlignedX`; the copy costs one pass over x, which the GEMM's faster reads repay
  from 128 rows: FP8 8192 x 3696 at M = 128 20.2 -> 16.5 us before the copy's ~2 us); the dynamic
  quantizers write x's quantized rows padded directly (`quant.quantize_fp8(..., aligned_rows=True)`).
- w (weights): copied per call would cost its whole size every call, so the ops warn once per
  shape instead; `align_rows(w)` stores a weight padded (same values, a view of wider storage), as
  the `gemmkit.nn` layers store theirs.
"""

from __future__ import annotations

import warnings

import torch

ROW_ALIGN = 32  # bytes
ALIGN_X_MIN_M = 128  # x copied into padded rows from this many rows


def rows_aligned(t: torch.Tensor) -> bool:
    """True unless t is a row-major (rows, K) operand (K-contiguous, more than one row) whose rows
    do not all start on a ROW_ALIGN-byte boundary."""
    if t.ndim != 2 or t.shape[0] <= 1 or t.shape[1] <= 1 or t.stride(1) != 1:
        return True
    return (t.stride(0) * t.element_size()) % ROW_ALIGN == 0 and t.data_ptr() % ROW_ALIGN == 0


def padded_width(K: int, element_size: int) -> int:
    """K rounded up to whole ROW_ALIGN-byte rows."""
    step = max(1, ROW_ALIGN // element_size)
    return -(-K // step) * step


def empty_aligned(rows: int, K: int, dtype, device) -> torch.Tensor:
    """An uninitialized (rows, K) tensor whose rows start on ROW_ALIGN-byte boundaries (a view of
    (rows, padded_width) storage; the padding is never read)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return torch.empty((rows, padded_width(K, itemsize)), dtype=dtype, device=device)[:, :K]


def align_rows(t: torch.Tensor) -> torch.Tensor:
    """t (..., K) with the same values in storage whose rows start on 32-byte boundaries: t itself
    where they already do, else a copy that is a view of wider storage (its rows' stride padded).
    Store weights this way once (gemmkit.nn layers do): the kernels read rows that straddle the
    L2's sectors up to 1.8x slower (gemmkit.core.rows). `.contiguous()`, and `Module.to` (which
    keeps only dense layouts), undo the padding."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"align_rows takes a tensor, got {type(t).__name__}")
    if t.ndim < 2:
        raise ValueError(f"align_rows takes a tensor of at least 2 dimensions, got shape {tuple(t.shape)}")
    K = t.shape[-1]
    if t.numel() == 0 or (t.stride(-1) == 1 and (t.stride(-2) * t.element_size()) % ROW_ALIGN == 0
                          and t.data_ptr() % ROW_ALIGN == 0):
        return t
    rows = empty_aligned(t.numel() // K, K, t.dtype, t.device)
    strides, stride = [], rows.stride(0)
    for n in reversed(t.shape[:-1]):
        strides.append(stride)
        stride *= n
    out = rows.as_strided(tuple(t.shape), (*reversed(strides), 1))
    out.copy_(t)
    return out


def x_copy_pays(x2: torch.Tensor, M: int) -> bool:
    """Whether an op copies x (M, K) into padded rows before the GEMM (module docstring)."""
    return M >= ALIGN_X_MIN_M and not rows_aligned(x2)


class AlignedX:
    """Runs `plan` (built for an x of padded rows) on a padded copy of x (M, K) (or (*, K): flatten_x)."""

    def __init__(self, plan, M: int, K: int, flatten_x: bool):
        self.plan, self.M, self.K, self.flatten_x = plan, M, K, flatten_x
        self.run = self.__call__

    def __call__(self, x, w, *rest):
        xa = empty_aligned(self.M, self.K, x.dtype, x.device)
        xa.copy_(x.reshape(self.M, self.K) if self.flatten_x else x)
        return self.plan.run(xa, w, *rest)


_warned: set = set()


WARN_MIN_BYTES = 1 << 20  # weights from this size warn


def warn_unaligned_weight(op: str, w: torch.Tensor) -> None:
    """Once per (op, shape, dtype): a CUDA weight of WARN_MIN_BYTES or more whose rows straddle the
    L2's sectors (rows_aligned)."""
    if not w.is_cuda or w.numel() * w.element_size() < WARN_MIN_BYTES or rows_aligned(w):
        return
    key = (op, tuple(w.shape), w.dtype)
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"{op}: the weight's rows ({w.shape[1]} x {w.element_size()} bytes) do not start on 32-byte "
                  "boundaries, which the kernels read up to 1.8x slower; store it once with "
                  "gemmkit.align_rows(w) (gemmkit.nn layers do)", stacklevel=5)
