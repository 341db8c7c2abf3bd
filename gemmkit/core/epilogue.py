"""Epilogue specs: what a plan's epilogue does between the K loop and the store (host side).

The operand scales come from the operands' formats (gemmkit.core.formats: per-tensor and per-row
scales are applied here, K-block scales in the K loop); the spec adds the rest. Kernel side:
gemmkit/kernels/epilogue.py.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIVATIONS = ("none", "relu", "gelu_tanh", "silu")


def torch_activation(t, activation):
    """activation(t) by torch ops, as kernels/epilogue.py computes it (gelu_tanh: gelu's tanh form); None or "none":
    t. The host side's one copy (degenerate problems, unfused paths, the differentiable ops)."""
    import torch.nn.functional as F

    if activation in (None, "none"):
        return t
    if activation == "relu":
        return F.relu(t)
    if activation == "silu":
        return F.silu(t)
    if activation == "gelu_tanh":
        return F.gelu(t, approximate="tanh")
    raise ValueError(f"activation={activation!r} is not one of {ACTIVATIONS} (or None)")


@dataclass(frozen=True)
class EpilogueSpec:
    """out = activation(acc * scales + bias) * mul + add, cast to the output dtype.

    bias: an (N,) vector is added. mul / add: an input broadcastable to (M, N) (a scalar, a row
    (1, N), a column (M, 1) or a full (M, N) tensor, passed with stride 0 along broadcast
    dimensions) multiplies / is added after the activation.
    gated (fused feed-forward): two weights, gate and up (same shape and layout), one K loop with
    two accumulators; `activation` applies to the gate and the product with up is the result
    (the scales of each side first; bias, mul and add after): out = act(gate) * up * mul + add.
    """

    activation: str = "none"
    bias: bool = False
    mul: bool = False
    add: bool = False
    gated: bool = False

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} is not one of {ACTIVATIONS}")
        if self.gated and self.bias:
            raise ValueError("a gated epilogue takes no bias")
