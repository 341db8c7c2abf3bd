"""Epilogue: what happens to an accumulator tile between the K loop and the store."""

import triton
import triton.language as tl

# Scale modes of the epilogue (A_SCALE / B_SCALE): none, one scalar, one value per row of A
# (per token) or per row of B (per output channel) loaded from memory, or (A only) the tile's
# per-row scales already in registers (computed in-kernel by dynamic quantization).
SCALE_NONE = tl.constexpr(0)
SCALE_TENSOR = tl.constexpr(1)
SCALE_VECTOR = tl.constexpr(2)
SCALE_ROWS_IN_REGISTERS = tl.constexpr(3)


@triton.jit
def activation(x, ACTIVATION: tl.constexpr):
    """Apply ACTIVATION ("none", "relu", "gelu_tanh", "silu") to an fp32 tile."""
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN, as in torch.relu
    elif ACTIVATION == "gelu_tanh":
        # 0.5 x (1 + tanh(u)) == x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
        x = x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    elif ACTIVATION == "silu":
        x = x * tl.sigmoid(x)
    return x


@triton.jit
def finish_tile(
    acc,
    off_m,
    off_n,
    M,
    N,
    bias,
    a_scale,
    a_rows,
    b_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    A_SCALE: tl.constexpr,
    B_SCALE: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    """(acc * a_scale * b_scale + bias) then ACTIVATION, in fp32, for the tile at (off_m, off_n).

    `bias` is None or an (N,) vector; `a_scale` an (M,) or 1-element vector, or with
    SCALE_ROWS_IN_REGISTERS `a_rows`, the tile's (BLOCK_M,) scales; `b_scale` an (N,) or 1-element
    vector; as selected by A_SCALE / B_SCALE.
    """
    out = acc.to(tl.float32)
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    if A_SCALE == SCALE_TENSOR:
        out = out * tl.load(a_scale)
    elif A_SCALE == SCALE_VECTOR:
        out = out * tl.load(a_scale + rm, mask=rm < M, other=0.0)[:, None]
    elif A_SCALE == SCALE_ROWS_IN_REGISTERS:
        out = out * a_rows[:, None]
    if B_SCALE == SCALE_TENSOR:
        out = out * tl.load(b_scale)
    elif B_SCALE == SCALE_VECTOR:
        out = out * tl.load(b_scale + rn, mask=rn < N, other=0.0)[None, :]
    if bias is not None:
        out = out + tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    return activation(out, ACTIVATION)
