"""`GatedMLP`: a Llama / Qwen-style gated MLP (down(act(gate(x)) * up(x))) in two gemmkit launches.

Buffers (no autograd; they follow .to() and state_dict): `gate_up_weight` (2I, H) = [gate; up]
(the concatenated layout the gated kernel reads in place), `down_weight` (H_out, I); with
scheme="fp8" both are float8_e4m3fn with per-channel float32 scales `gate_up_scale` (2I,) and
`down_scale` (H_out,), activations quantized per token inside the ops. Separate gate/up linears
and the interleaved layout are re-laid out once, when the layer is built (`from_module`,
`load_gate_up`), never per call.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import quant
from ..core.rows import empty_aligned
from ..ops.fused import ff_a8w8_gated, ff_a16w16_gated
from .layers import _DTYPES, ALIGN, PaddedRowsModule, _name, check_scheme

SCHEMES = ("bf16", "fp8")
# act_fn class names of torch and HF transformers -> gemmkit's activation
_ACTIVATIONS = {"SiLU": "silu", "SiLUActivation": "silu", "ReLU": "relu", "GELUTanh": "gelu_tanh",
                "PytorchGELUTanh": "gelu_tanh", "NewGELUActivation": "gelu_tanh", "FastGELUActivation": "gelu_tanh"}


def activation_of(act_fn) -> str | None:
    """gemmkit's name for a module's act_fn (None: not one gemmkit fuses)."""
    if isinstance(act_fn, nn.GELU):
        return "gelu_tanh" if act_fn.approximate == "tanh" else None
    return _ACTIVATIONS.get(type(act_fn).__name__)


def mlp_linears(mlp):
    """(gate_up (2I, H) weight or None, gate, up, down linears, activation) of a gated MLP module,
    or a string saying why it is not one gemmkit can take."""
    act = activation_of(getattr(mlp, "act_fn", None))
    if act is None:
        return f"act_fn {type(getattr(mlp, 'act_fn', None)).__name__} is not SiLU, ReLU or tanh-GELU"
    down = getattr(mlp, "down_proj", None)
    fused = getattr(mlp, "gate_up_proj", None)
    gate, up = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
    linears = [down] + ([fused] if fused is not None else [gate, up])
    if any(type(m) is not nn.Linear for m in linears):
        return "needs nn.Linear gate_proj/up_proj (or gate_up_proj) and down_proj"
    if any(m.bias is not None for m in linears):
        return "biased projections are not supported"
    return fused, gate, up, down, act


class GatedMLP(PaddedRowsModule):
    """down(act(gate(x)) * up(x)): x (*, hidden) in `dtype` -> (*, out_features) in `dtype`.

    scheme: "bf16" (16-bit weights, ff_a16w16_gated) or "fp8" (e4m3 weights per channel,
    ff_a8w8_gated). activation: "silu", "gelu_tanh" or "relu"."""

    padded_weights = ("gate_up_weight", "down_weight")

    def _follows_dtype(self) -> tuple:
        return () if self.scheme == "fp8" else self.padded_weights

    def __init__(self, hidden: int, intermediate: int, *, out_features: int | None = None, activation: str = "silu",
                 scheme: str = "bf16", dtype=torch.bfloat16, device=None):
        super().__init__()
        check_scheme(scheme, SCHEMES, dtype)
        out_features = hidden if out_features is None else out_features
        for name, n in (("hidden", hidden), ("intermediate", intermediate), ("out_features", out_features)):
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
            if scheme == "fp8" and n % ALIGN:
                raise ValueError(f"{name}={n}: fp8 needs multiples of {ALIGN}")
        self.hidden, self.intermediate, self.out_features = hidden, intermediate, out_features
        if activation not in ("silu", "gelu_tanh", "relu"):  # (what the gated kernels apply to the gate)
            raise ValueError(f"activation={activation!r} must be 'silu', 'gelu_tanh' or 'relu'")
        self.activation, self.scheme, self.dtype = activation, scheme, dtype
        wdt = torch.float8_e4m3fn if scheme == "fp8" else dtype
        # (rows padded to 32 bytes where the row's bytes are not a multiple: gemmkit.align_rows)
        self.register_buffer("gate_up_weight", empty_aligned(2 * intermediate, hidden, wdt, device).zero_())
        self.register_buffer("down_weight", empty_aligned(out_features, intermediate, wdt, device).zero_())
        if scheme == "fp8":
            self.register_buffer("gate_up_scale", torch.ones(2 * intermediate, dtype=torch.float32, device=device))
            self.register_buffer("down_scale", torch.ones(out_features, dtype=torch.float32, device=device))

    @torch.no_grad()
    def load_gate_up(self, gate_up=None, *, gate=None, up=None, layout: str = "concat") -> None:
        """Set the gate/up weights (any float dtype): one (2I, H) tensor in `layout` ("concat":
        [gate; up]; "interleaved": rows alternating gate, up), or gate= and up= (I, H) each;
        stored concatenated (re-laid out here, once)."""
        if gate_up is not None:
            if layout == "interleaved":
                gate, up = gate_up[0::2], gate_up[1::2]
            elif layout == "concat":
                gate, up = gate_up.chunk(2)
            else:
                raise ValueError(f"layout={layout!r} must be 'concat' or 'interleaved'")
        elif gate is None or up is None:
            raise ValueError("load_gate_up takes one (2I, H) gate_up tensor, or both gate= and up= (I, H)")
        w = torch.cat([gate, up])
        if tuple(w.shape) != tuple(self.gate_up_weight.shape):
            raise ValueError(f"gate/up weights have shape {tuple(w.shape)} together, expected "
                             f"{tuple(self.gate_up_weight.shape)}")
        self._store(w, "gate_up_weight", "gate_up_scale")

    @torch.no_grad()
    def load_down(self, down) -> None:
        """Set the down weight (H_out, I), any float dtype."""
        if tuple(down.shape) != tuple(self.down_weight.shape):
            raise ValueError(f"down weight has shape {tuple(down.shape)}, expected {tuple(self.down_weight.shape)}")
        self._store(down, "down_weight", "down_scale")

    def _store(self, w, name, scale_name):
        if self.scheme == "fp8":
            wq, ws = quant.quantize_fp8(w.to(self.dtype).contiguous(), "row")
            getattr(self, name).copy_(wq)
            getattr(self, scale_name).copy_(ws.reshape(-1))
        else:
            getattr(self, name).copy_(w)

    @classmethod
    def from_module(cls, mlp: nn.Module, *, scheme: str = "bf16", dtype=None) -> "GatedMLP":
        """A GatedMLP computing what a Llama/Qwen-style MLP module does: attributes gate_proj,
        up_proj (or a fused gate_up_proj, [gate; up]), down_proj (bias-free nn.Linear) and act_fn."""
        found = mlp_linears(mlp)
        if isinstance(found, str):
            raise ValueError(f"GatedMLP cannot replace {type(mlp).__name__}: {found}")
        fused, gate, up, down, act = found
        first = fused if fused is not None else gate
        dtype = first.weight.dtype if dtype is None else dtype
        if dtype not in _DTYPES:
            raise TypeError(f"the MLP is {_name(first.weight.dtype)}: pass dtype=torch.bfloat16 or torch.float16")
        inter = down.in_features
        layer = cls(first.in_features, inter, out_features=down.out_features, activation=act, scheme=scheme,
                    dtype=dtype, device=first.weight.device)
        if first.weight.is_meta:  # (a model built on the meta device: the form only, its values loaded later)
            return layer
        if fused is not None:
            layer.load_gate_up(fused.weight.detach())
        else:
            layer.load_gate_up(gate=gate.weight.detach(), up=up.weight.detach())
        layer.load_down(down.weight.detach())
        return layer

    def forward(self, x):
        if not isinstance(x, torch.Tensor) or x.dtype != self.dtype or x.ndim == 0 or x.shape[-1] != self.hidden:
            raise ValueError(f"GatedMLP input must be a {_name(self.dtype)} tensor (*, {self.hidden}), got "
                             f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
        if self.scheme == "fp8":
            return ff_a8w8_gated(x, self.gate_up_weight, self.gate_up_scale, self.down_weight, self.down_scale,
                                 self.activation, out_dtype=self.dtype)
        return ff_a16w16_gated(x, self.gate_up_weight, self.down_weight, self.activation)

    def extra_repr(self) -> str:
        return (f"hidden={self.hidden}, intermediate={self.intermediate}, out_features={self.out_features}, "
                f"activation={self.activation}, scheme={self.scheme}, dtype={_name(self.dtype)}")
