"""`MoEExperts`: the routed experts of a mixture-of-experts block (gemmkit.moe.moe_mlp), a drop-in for the experts
modules of transformers' MoE models (MixtralExperts, Qwen3MoeExperts, ...: 3-D `gate_up_proj` (E, 2I, H) = [gate; up]
per expert and `down_proj` (E, H, I), `act_fn`, called as experts(hidden_states, top_k_index, top_k_weights)).
The router stays the model's own.

Buffers (no autograd; they follow .to() and state_dict): `gate_up_weight` (E, 2I, H), `down_weight` (E, H, I);
scheme "bf16": in the activations' dtype; "fp8": float8_e4m3fn with per-channel float32 scales `gate_up_scale`
(E, 2I) and `down_scale` (E, H), x and the intermediate quantized per token in the call; "fp8_block": float8_e4m3fn
with DeepSeek-V3 128 x 128 block scales `gate_up_scale` (E, ceil(2I / 128), ceil(H / 128)) and `down_scale`
(E, ceil(H / 128), ceil(I / 128)), x and the intermediate quantized per 1 x 128 group. Inference only: the grouped
GEMMs have no backward, so an input that requires grad under grad mode is refused (call under torch.no_grad() /
torch.inference_mode()).
"""

from __future__ import annotations

import torch
from torch import nn

from .. import quant
from ..moe import moe_mlp
from .layers import _DTYPES, PaddedRowsModule, _name, check_scheme
from .mlp import activation_of

SCHEMES = ("bf16", "fp8", "fp8_block")
ALIGN = 16  # (FP8 schemes: H and I multiples of 16, as the 8-bit dense layers)
BLOCK = 128


def experts_weights(module) -> tuple | str:
    """(gate_up (E, 2I, H), down (E, H, I), activation) of a transformers-style experts module, or a string saying
    why gemmkit cannot take it."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor) or gate_up.ndim != 3 \
            or down.ndim != 3:
        return "needs 3-D gate_up_proj (E, 2I, H) and down_proj (E, H, I) tensors"
    # (transformers' use_experts_implementation flags: the layouts moe_mlp does not take)
    for flag, want in (("is_transposed", False), ("has_bias", False), ("has_gate", True), ("is_concatenated", True)):
        if getattr(module, flag, want) != want:
            return f"{flag}={getattr(module, flag)} (gemmkit takes {flag}={want})"
    E, I2, H = gate_up.shape
    if I2 % 2 or tuple(down.shape) != (E, H, I2 // 2):
        return (f"gate_up_proj {tuple(gate_up.shape)} and down_proj {tuple(down.shape)} are not (E, 2I, H) and "
                "(E, H, I)")
    act = activation_of(getattr(module, "act_fn", None))
    if act not in ("silu", "gelu_tanh"):
        return f"act_fn {type(getattr(module, 'act_fn', None)).__name__} is not SiLU or tanh-GELU"
    return gate_up, down, act


class MoEExperts(PaddedRowsModule):
    """out[t] = sum_j top_k_weights[t, j] * down_e(act(gate_e(x_t)) * up_e(x_t)), e = top_k_index[t, j].

    forward(hidden_states (T, H) in `dtype`, top_k_index (T, k) integer ids in [0, E) (unchecked: a host
    synchronization; GEMMKIT_DEBUG=1 checks them), top_k_weights (T, k) float32 / bfloat16 / float16) -> (T, H) in
    `dtype`. scheme: "bf16", "fp8" or "fp8_block" (module docstring); activation "silu" or "gelu_tanh"."""

    def _follows_dtype(self) -> tuple:
        return ("gate_up_weight", "down_weight") if self.scheme == "bf16" else ()

    def __init__(self, num_experts: int, hidden: int, intermediate: int, *, activation: str = "silu",
                 scheme: str = "bf16", dtype=torch.bfloat16, device=None):
        super().__init__()
        check_scheme(scheme, SCHEMES, dtype)
        for name, n in (("num_experts", num_experts), ("hidden", hidden), ("intermediate", intermediate)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
            if scheme != "bf16" and name != "num_experts" and n % ALIGN:
                raise ValueError(f"{name}={n}: scheme {scheme!r} needs multiples of {ALIGN}")
        if activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"activation={activation!r} must be 'silu' or 'gelu_tanh'")
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.activation, self.scheme, self.dtype = activation, scheme, dtype
        E, H, I = num_experts, hidden, intermediate
        wdt = dtype if scheme == "bf16" else torch.float8_e4m3fn
        self.register_buffer("gate_up_weight", torch.zeros(E, 2 * I, H, dtype=wdt, device=device))
        self.register_buffer("down_weight", torch.zeros(E, H, I, dtype=wdt, device=device))
        if scheme == "fp8":
            self.register_buffer("gate_up_scale", torch.ones(E, 2 * I, dtype=torch.float32, device=device))
            self.register_buffer("down_scale", torch.ones(E, H, dtype=torch.float32, device=device))
        elif scheme == "fp8_block":
            blocks = lambda n: -(-n // BLOCK)  # noqa: E731
            self.register_buffer("gate_up_scale", torch.ones(E, blocks(2 * I), blocks(H), dtype=torch.float32,
                                                             device=device))
            self.register_buffer("down_scale", torch.ones(E, blocks(H), blocks(I), dtype=torch.float32,
                                                          device=device))

    @torch.no_grad()
    def load(self, gate_up, down) -> None:
        """Set the weights: gate_up (E, 2I, H) = [gate; up] per expert and down (E, H, I), any float dtype
        (quantized here for the FP8 schemes, once)."""
        for name, t, buf in (("gate_up", gate_up, self.gate_up_weight), ("down", down, self.down_weight)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(buf.shape):
                raise ValueError(f"{name} must have shape {tuple(buf.shape)}, got {tuple(getattr(t, 'shape', ()))}")
            if not t.dtype.is_floating_point or t.dtype.itemsize < 2:
                raise TypeError(f"{name} must hold 16- or 32-bit floats, got {t.dtype}")
        self._store(gate_up, "gate_up_weight", "gate_up_scale")
        self._store(down, "down_weight", "down_scale")

    def _store(self, w, name, scale_name) -> None:
        buf = getattr(self, name)
        if self.scheme == "bf16":
            buf.copy_(w)
            return
        E, N, K = w.shape
        src = w.to(device=buf.device, dtype=self.dtype)
        if self.scheme == "fp8":  # (per row of every expert at once)
            q, s = quant.quantize_fp8(src.reshape(E * N, K).contiguous(), "row")
            buf.copy_(q.view(E, N, K))
            getattr(self, scale_name).copy_(s.view(E, N))
            return
        for e in range(E):  # (blocks of one expert's rows: N need not be a multiple of 128)
            q, s = quant.quantize_fp8_blockwise(src[e].contiguous(), (BLOCK, BLOCK))
            buf[e].copy_(q)
            getattr(self, scale_name)[e].copy_(s)

    @classmethod
    def unsupported(cls, module: nn.Module, scheme: str = "bf16", dtype=None) -> str | None:
        """Why a MoEExperts of `scheme` cannot replace this experts module (None: it can)."""
        found = experts_weights(module)
        if isinstance(found, str):
            return found
        gate_up, down, _act = found
        if (dtype or gate_up.dtype) not in _DTYPES:
            return f"the experts are {_name(gate_up.dtype)}: pass dtype=torch.bfloat16 or torch.float16"
        if scheme != "bf16" and (gate_up.shape[2] % ALIGN or down.shape[2] % ALIGN):
            return f"scheme {scheme!r} needs H and I multiples of {ALIGN}, got H={gate_up.shape[2]}, I={down.shape[2]}"
        return None

    @classmethod
    def from_module(cls, module: nn.Module, *, scheme: str = "bf16", dtype=None) -> "MoEExperts":
        """A MoEExperts computing what a transformers-style experts module does (experts_weights), on its device;
        dtype: the activations' (default: the weights', which must then be bfloat16 or float16)."""
        if dtype is not None and dtype not in _DTYPES:  # (the scheme: checked by the constructor)
            raise TypeError(f"dtype={dtype}: the activations' dtype must be torch.bfloat16 or torch.float16")
        reason = cls.unsupported(module, scheme, dtype)
        if reason:
            raise ValueError(f"MoEExperts cannot replace {type(module).__name__}: {reason}")
        gate_up, down, act = experts_weights(module)
        E, I2, H = gate_up.shape
        layer = cls(E, H, I2 // 2, activation=act, scheme=scheme, dtype=dtype or gate_up.dtype,
                    device=gate_up.device)
        if not gate_up.is_meta:  # (a model built on the meta device: the form only, its values loaded later)
            layer.load(gate_up.detach(), down.detach())
        return layer

    def forward(self, hidden_states, top_k_index, top_k_weights):
        x = hidden_states
        if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"MoEExperts hidden_states must be a (T, {self.hidden}) tensor, got "
                             f"{tuple(getattr(x, 'shape', ())) or type(x).__name__}")
        if x.dtype != self.dtype:
            raise TypeError(f"MoEExperts hidden_states has dtype {_name(x.dtype)}, the experts take {_name(self.dtype)}")
        if x.device != self.gate_up_weight.device:
            raise ValueError(f"MoEExperts hidden_states is on {x.device}, the experts on {self.gate_up_weight.device}")
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in (x, top_k_weights)):
            raise RuntimeError("gemmkit.nn.MoEExperts is inference-only (the grouped GEMMs have no backward): call "
                               "the model under torch.no_grad() or torch.inference_mode()")
        for name, t in (("top_k_index", top_k_index), ("top_k_weights", top_k_weights)):
            if isinstance(t, torch.Tensor) and t.device != x.device:
                raise ValueError(f"MoEExperts {name} is on {t.device}, hidden_states on {x.device}")
        scales = {}
        if self.scheme != "bf16":
            scales = dict(w_gate_up_scale=self.gate_up_scale, w_down_scale=self.down_scale)
        return moe_mlp(x, top_k_index, top_k_weights, self.gate_up_weight, self.down_weight, self.activation,
                       **scales)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden={self.hidden}, intermediate={self.intermediate}, "
                f"activation={self.activation}, scheme={self.scheme}, dtype={_name(self.dtype)}")
