"""Operand rows that start on the L2's 32-byte sectors.

A row-major (rows, K) operand whose row stride in bytes is not a multiple of ROW_ALIGN (FP8 with
K % 32 != 0, 16-bit types with K % 16 != 0) starts every other row inside a sector: each 128-byte
piece a TMA box (or a warp's coalesced load) reads of such a row spans five sectors, not four,
and the kernels fetching x and w in such pieces ran 1.2x to 1.8x slower than on the same values
with padded rows (scripts/align_probe.py, tuning/align/: FP8 8192 x 3696 at M = 128 / 512 / 8192
0.80x / 1.02x / 0.93x `_scaled_mm` contiguous, 1.05x / 1.28x / 1.12x padded; bf16 K = 4104 at
M = 512 0.54x -> 0.95x). Padding to 32 bytes measured as fast as to 128.

What gemmkit does about it:
- x (activations): where w's rows are off the sectors too, the ops copy x into rows padded to
  ROW_ALIGN bytes before the GEMM if the GEMM is long enough to repay the copy (`x_copy_pays`,
  `AlignedX`: FP8 8192 x 3696 at M = 512 / 2048 / 8192 33.8 / 126.6 / 500.6 us -> 27.6 / 108.7 /
  432.7 us with x padded, before the copy); the dynamic paths' quantizer writes x's rows padded
  at no cost (quant._quantize(..., aligned_rows=True)).
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
    return torch.empty((rows, padded_width(K, dtype.itemsize)), dtype=dtype, device=device)[:, :K]


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


def dense_state(state: dict, keys) -> None:
    """A state_dict's padded weights as dense copies (what safetensors and most checkpoint tools require);
    loading copies them back into the layer's padded rows."""
    for key in keys:
        t = state.get(key)
        if t is not None and not t.is_contiguous():
            state[key] = t.contiguous()


ALIGN_X_GAIN = 0.2  # the share of a GEMM's time both operands off the sectors cost (measured 0.2 to 0.3)
COPY_FIXED_US = 2.0  # a second launch in the call: its gap under CUDA graphs and its tail
FORCE_X_COPY = None  # tests: True / False instead of the rule


def x_copy_pays(x2: torch.Tensor, w: torch.Tensor, M: int, N: int, dev) -> bool:
    """Whether an op copies x (M, K) into padded rows before the GEMM with w (N, K): from ALIGN_X_MIN_M
    rows, where x's and w's rows both straddle the sectors and ALIGN_X_GAIN of the GEMM's time (its
    FLOPs at 70% and its bytes at 80% of the device's peaks) exceeds the copy's (x read and written
    at 80%, plus COPY_FIXED_US). With one operand aligned, the other's rows cost 0% to 8% from 128
    rows (FP8 8192 x 3696; bf16 up to 26% at M = 512, K = 4104), less than such a copy."""
    if rows_aligned(x2):
        return False
    if FORCE_X_COPY is not None:
        return FORCE_X_COPY
    if M < ALIGN_X_MIN_M or rows_aligned(w):
        return False
    K, size = x2.shape[1], x2.element_size()
    tflops = dev.peak_tflops(8 * size) or (1979.0 if size == 1 else 989.0)
    tbps = dev.peak_tbps() or 3.35
    gemm_us = max(2 * M * N * K / (0.7 * tflops * 1e6), (M * K + N * K + M * N) * size / (0.8 * tbps * 1e6))
    copy_us = COPY_FIXED_US + 2 * M * K * size / (0.8 * tbps * 1e6)
    return ALIGN_X_GAIN * gemm_us > copy_us


def plan_on_aligned_x(x2: torch.Tensor, w: torch.Tensor, M: int, N: int, dev, flatten_x: bool, build):
    """An op's plan for x2 (M, K) and w (N, K): build(x, flatten_x) on x2 itself, or, where x_copy_pays, built for
    a padded copy of x (never flattened) and wrapped in AlignedX, which makes that copy on each call."""
    if not x_copy_pays(x2, w, M, N, dev):
        return build(x2, flatten_x)
    xa = empty_aligned(M, x2.shape[1], x2.dtype, x2.device)
    return AlignedX(build(xa, False), x2, M, x2.shape[1], flatten_x)


class AlignedX:
    """Runs `plan` (built for an x of padded rows) on a padded copy of x (M, K) (or (*, K): flatten_x),
    made by copy_rows_kernel (torch's copy into the strided view ran at 0.4 to 0.7 TB/s)."""

    def __init__(self, plan, x2: torch.Tensor, M: int, K: int, flatten_x: bool):
        from ..kernels.memory import copy_rows_kernel
        from .launcher import CachedLaunch

        self.plan, self.M, self.K, self.flatten_x = plan, M, K, flatten_x
        self.dtype, self.device = x2.dtype, x2.device
        self.shape = (M, padded_width(K, x2.element_size()))  # (the padded copy's storage)
        row_bytes = K * x2.element_size()
        width = self.shape[1] * x2.element_size()
        # the rows as words: int32 where every row and its stride allow it
        self.word = torch.int32 if row_bytes % 4 == 0 and (x2.stride(0) * x2.element_size()) % 4 == 0 \
            and x2.data_ptr() % 4 == 0 else torch.uint8
        size = 4 if self.word == torch.int32 else 1
        C, s_src, s_dst = row_bytes // size, x2.stride(0) * x2.element_size() // size, width // size
        vec = 16 // size
        if C % vec or s_src % vec or x2.data_ptr() % 16:
            vec = 1
        block_c = min(512 if size == 4 else 2048, max(16, 1 << (C - 1).bit_length()))
        block_r = max(1, 2048 // block_c) if size == 4 else max(1, 8192 // block_c)
        self.copy = CachedLaunch(copy_rows_kernel, (-(-M // block_r),), 4, 1, self.device.index or 0)
        self.copy_tail = (M, C, s_src, s_dst, block_r, block_c, vec, max(M * s_src, M * s_dst) >= 2**31)
        self.run = self.__call__

    def __call__(self, x, w, *rest):
        xa = torch.empty(self.shape, dtype=self.dtype, device=self.device)[:, :self.K]
        x2 = x.reshape(self.M, self.K) if self.flatten_x else x
        self.copy((x2.view(self.word) if x2.dtype != self.word else x2, xa.view(self.word)), self.copy_tail)
        return self.plan.run(xa, w, *rest)

    def __getattr__(self, name):  # (the inner plan's facts: cfg, M, ...)
        if name == "plan":
            raise AttributeError(name)
        return getattr(self.plan, name)


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
