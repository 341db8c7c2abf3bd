"""Operand formats: what the host knows about each GEMM operand's storage and scales.

Config selection (shared-memory estimate, least BLOCK_K), plans (kernel switches) and the tools
take an `OperandFormat` per operand instead of a byte width and mode integers. The scale kinds and
producers are the kernel's own enums (gemmkit.kernels.modes), defined once there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from ..kernels import modes


class Scale(enum.IntEnum):
    """How an operand is scaled (kernels/modes.py SCALE_*)."""

    NONE = modes.SCALE_NONE.value
    TENSOR = modes.SCALE_TENSOR.value  # one value
    ROW = modes.SCALE_ROW.value  # one per row: per token (A), per output channel (B)
    KBLOCK = modes.SCALE_KBLOCK.value  # one per (group_rows rows, group_k columns) block, in the K loop
    GROUP = modes.SCALE_GROUP.value  # 4-bit INT4: one per row and group_k columns (+ zero points), in the producer
    MX = modes.SCALE_MX.value  # 4-bit MXFP4: one e8m0 per row and 32 columns, in the producer


_QUANT_TARGET = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2", torch.int8: "int8"}


@dataclass(frozen=True)
class OperandFormat:
    """One operand of C = A @ B^T as the kernel reads it.

    dtype: the stored element type (the type the tensor cores see). bits: bits per element in
    memory. scale: its scale kind; group_k / group_rows: the block of one scale (Scale.KBLOCK).
    quantize: A only, a 16-bit operand quantized in the kernel to `dtype`: "row" (per row, over
    the tile's K range) or "group" (per row and group_k-wide K group); `stored` is then the
    16-bit type in memory.
    """

    dtype: torch.dtype
    bits: int
    scale: Scale = Scale.NONE
    group_k: int = 0
    group_rows: int = 1
    quantize: str = ""
    stored: torch.dtype | None = None

    @property
    def bytes(self) -> float:
        """Bytes per element as loaded from memory."""
        return self.bits / 8

    @property
    def dot_bits(self) -> int:
        """Width of the elements the tensor cores multiply."""
        return torch.finfo(self.dtype).bits if self.dtype.is_floating_point else torch.iinfo(self.dtype).bits

    @property
    def integer(self) -> bool:
        return not self.dtype.is_floating_point

    @property
    def quant_target(self) -> str:
        """The in-kernel quantization target ("e4m3", "e5m2", "int8"), or ""."""
        return _QUANT_TARGET[self.dtype] if self.quantize else ""

    def min_block_k(self) -> int:
        """Smallest BLOCK_K its dots take: 8-bit dots need K >= 32 (Triton refuses less); a 4-bit
        operand's K steps feed its even and odd columns to two dots of K / 2 >= 16."""
        return 32 if self.dot_bits <= 8 or self.bits == 4 else 16

    def max_block_k(self) -> int | None:
        """Largest BLOCK_K: a K tile must not straddle two K-block scales."""
        return self.group_k if (self.scale == Scale.KBLOCK or self.quantize == "group") else None


def dense(dtype: torch.dtype, scale: Scale = Scale.NONE, group_k: int = 0, group_rows: int = 1) -> OperandFormat:
    """An operand stored as `dtype`, one element per value."""
    bits = torch.finfo(dtype).bits if dtype.is_floating_point else torch.iinfo(dtype).bits
    return OperandFormat(dtype, bits, scale, group_k, group_rows)


def quantized_in_kernel(stored: torch.dtype, target: torch.dtype, per: str, group_k: int = 0) -> OperandFormat:
    """A 16-bit A operand quantized to `target` in the kernel, per "row" or per "group"."""
    return OperandFormat(target, torch.finfo(stored).bits, Scale.NONE, group_k, 1, per, stored)


def check_block_k(block_k: int, *formats: OperandFormat) -> str | None:
    """Why BLOCK_K does not suit the operands, or None."""
    least = max(f.min_block_k() for f in formats)
    if block_k < least:
        return f"BLOCK_K={block_k} is below {least}, the least {min(f.dot_bits for f in formats)}-bit tensor-core dots take"
    for f in formats:
        most = f.max_block_k()
        if most and (block_k > most or most % block_k):
            return f"BLOCK_K={block_k} must divide the {most}-wide K groups of the scales"
    return None


def packed4(dtype: torch.dtype, scale: Scale, group_k: int) -> OperandFormat:
    """A 4-bit operand stored two per byte (INT4 with Scale.GROUP, MXFP4 with Scale.MX), dequantized
    in registers to `dtype` (the 16-bit type the tensor cores see). group_k: the scales' K group
    (a power of two; per-channel INT4 passes next_pow2(K)); BLOCK_K and the group divide one
    another, so no BLOCK_K limit."""
    return OperandFormat(dtype, 4, scale, group_k, 1)


def packed_producer(fmt: OperandFormat, operand: str) -> int:
    """The producer of a 4-bit operand (kernels/modes.py), "a" or "b"; None if not packed."""
    if fmt.bits != 4:
        return None
    if operand == "a":
        return modes.A_MXFP4.value
    return {Scale.GROUP: modes.B_INT4, Scale.MX: modes.B_MXFP4}[fmt.scale].value
