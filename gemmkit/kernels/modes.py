"""The enums that select the shared kernel's pieces, defined once for kernels and host alike.

Kernels compare their `tl.constexpr` parameters with these; host code passes `.value` (a plain
int) as the kernel argument and names the same constants (gemmkit.core.formats maps operand
formats onto them).
"""

import triton.language as tl

# Scale kinds of an operand (A_SCALE / B_SCALE): none, one scalar, one value per row of the
# operand (per token for A, per output channel for B: applied in the epilogue), or per row and
# K group (A: 1 x GROUP_K; B: GROUP_N x GROUP_K blocks: applied in the K loop).
SCALE_NONE = tl.constexpr(0)
SCALE_TENSOR = tl.constexpr(1)
SCALE_ROW = tl.constexpr(2)
SCALE_KBLOCK = tl.constexpr(3)
# 4-bit operands (issue 17): scales per row and K group applied to the unpacked values in the
# producer, before the dot: GROUP (INT4, with zero points), MX (e8m0 2^(e - 127) per 32 along K).
SCALE_GROUP = tl.constexpr(4)
SCALE_MX = tl.constexpr(5)

# A producers (A_PRODUCER): how the K loop gets its A tile.
A_DENSE = tl.constexpr(0)  # loaded as stored (TMA or pointers)
A_QUANT_ROW = tl.constexpr(1)  # 16-bit, quantized per row over the tile's K range (absmax prologue)
A_QUANT_GROUP = tl.constexpr(2)  # 16-bit, quantized per row and BLOCK_K-wide K group (no prologue)
A_GATHER = tl.constexpr(3)  # rows gathered through `a_rows` (MoE: sorted position -> token row), pointer loads
A_MXFP4 = tl.constexpr(4)  # packed e2m1 (M, K/2) + e8m0 scales, decoded to bf16 in registers

# B producers (B_PRODUCER): how the K loop gets its B tile.
B_DENSE = tl.constexpr(0)
B_INT4 = tl.constexpr(1)  # packed uint4 (N, K/2) with group scales / zero points, dequantized in registers
B_MXFP4 = tl.constexpr(2)  # packed e2m1 (N, K/2) with e8m0 scales per 32, decoded in registers

# Accumulation (PROMOTE): how each K tile's product joins the accumulator.
PROMOTE_NONE = tl.constexpr(0)  # acc = dot(a, b, acc): the tensor cores' own accumulation
PROMOTE_TILE = tl.constexpr(1)  # acc += dot(a, b): each K tile's partial sum promoted to fp32
PROMOTE_KBLOCK = tl.constexpr(2)  # acc += dot(a, b) * a_scale[:, k] * b_scale[n, k] (block scales)

# Tile maps (TILE_MAP): which output tile a work item is.
MAP_DENSE = tl.constexpr(0)  # one (M, N) grid in grouped (L2-friendly) order
# MoE / batched family: tile-rows of every group (expert or batch entry) in one virtual column of
# tile-rows, walked in the same grouped order; B (and scales, bias, C for MAP_BATCHED) offset per group
MAP_GROUPED = tl.constexpr(1)  # experts' row ranges from `group_offsets` (E+1,) on the device
MAP_BATCHED = tl.constexpr(2)  # num_groups problems of M rows each, batch strides per operand
