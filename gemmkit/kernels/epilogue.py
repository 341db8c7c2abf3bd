"""Epilogue: what happens to an accumulator tile between the K loop and the store."""

import triton
import triton.language as tl

from .modes import SCALE_ROW, SCALE_TENSOR


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
def _operand_tile(t, rm, rn, M, N, stride_m, stride_n):
    """The (BLOCK_M, BLOCK_N) tile of an (M, N) epilogue input at rows rm, columns rn, as fp32
    (a broadcast input has stride 0 along the broadcast dimensions)."""
    ptrs = t + rm[:, None] * stride_m + rn[None, :] * stride_n
    return tl.load(ptrs, mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0).to(tl.float32)


@triton.jit
def finish_tile(
    acc, off_m, off_n, M, N, bias, a_scale, b_scale, mul, add,
    stride_mul_m, stride_mul_n, stride_add_m, stride_add_n,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    """activation(acc * a_scale * b_scale + bias) * mul + add, in fp32, for the tile at (off_m, off_n).

    `a_scale`: (M,) or 1-element vector; `b_scale`: (N,) or 1-element vector, as A_SCALE /
    B_SCALE select (other kinds were applied in the K loop). `bias`: None or (N,). `mul`, `add`: None or (M, N) inputs
    with the given strides (0 along broadcast dimensions).
    """
    out = acc.to(tl.float32)
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    if A_SCALE == SCALE_TENSOR:
        out = out * tl.load(a_scale)
    elif A_SCALE == SCALE_ROW:
        out = out * tl.load(a_scale + rm, mask=rm < M, other=0.0)[:, None]
    if B_SCALE == SCALE_TENSOR:
        out = out * tl.load(b_scale)
    elif B_SCALE == SCALE_ROW:
        out = out * tl.load(b_scale + rn, mask=rn < N, other=0.0)[None, :]
    if bias is not None:
        out = out + tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    out = activation(out, ACTIVATION)
    if mul is not None:
        out = out * _operand_tile(mul, rm, rn, M, N, stride_mul_m, stride_mul_n)
    if add is not None:
        out = out + _operand_tile(add, rm, rn, M, N, stride_add_m, stride_add_n)
    return out


@triton.jit
def gate_tile(
    acc, off_m, off_n, M, N, a_scale, b_scale, up_scale_offset, stride_bs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    """Fused feed-forward (GATED): activation(gate) * up of the (BLOCK_M, BLOCK_N, 2) pair
    tl.join(gate, up) the gated K loop returns, each side scaled first, in fp32 (BLOCK_M, BLOCK_N).

    `a_scale` as in finish_tile (per tensor or per row). `b_scale` SCALE_TENSOR: one value for
    both; SCALE_ROW: the gate's channel n at b_scale[n * stride_bs], the up projection's at
    b_scale[up_scale_offset + n * stride_bs] (the scales follow the rows of [gate; up] or of the
    interleaved layout)."""
    gate, up = tl.split(acc)
    gate = gate.to(tl.float32)
    up = up.to(tl.float32)
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    if A_SCALE == SCALE_TENSOR:
        s = tl.load(a_scale)
        gate = gate * s
        up = up * s
    elif A_SCALE == SCALE_ROW:
        s = tl.load(a_scale + rm, mask=rm < M, other=0.0)[:, None]
        gate = gate * s
        up = up * s
    if B_SCALE == SCALE_TENSOR:
        s = tl.load(b_scale)
        gate = gate * s
        up = up * s
    elif B_SCALE == SCALE_ROW:
        gate = gate * tl.load(b_scale + rn * stride_bs, mask=rn < N, other=0.0)[None, :]
        up = up * tl.load(b_scale + up_scale_offset + rn * stride_bs, mask=rn < N, other=0.0)[None, :]
    return activation(gate, ACTIVATION) * up
