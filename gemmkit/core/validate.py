"""Argument checks shared by the ops. Every check runs before any launch and names the argument."""

from __future__ import annotations

import math
import os

import torch
from torch.autograd import forward_ad
from torch.compiler import is_compiling

from .config import GemmConfig
from .device import interpreter_active
from .epilogue import torch_activation

ACTIVATIONS = ("none", "relu", "gelu_tanh", "silu")
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


_functorch_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)


def check_tensor(name: str, t, dtypes=None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not is_compiling() and _functorch_wrapped(t):  # (a C function Dynamo does not trace)
        raise TypeError(f"{name} is a torch.func tensor (vmap, grad, vjp, jvp, jacrev ...): gemmkit ops do not run "
                        "under torch.func transforms; use torch.autograd (backward / autograd.grad) instead")
    if forward_ad._current_level >= 0 and forward_ad.unpack_dual(t).tangent is not None:
        # (plan_key makes no key inside a dual level, so every call there is checked)
        raise ValueError(f"{name} carries a forward-mode tangent (torch.autograd.forward_ad): gemmkit ops have no "
                         "forward-mode derivative (reverse mode: gemmkit.autograd)")
    if t.layout != torch.strided or t.is_nested:
        kind = "nested" if t.is_nested else str(t.layout).replace("torch.", "")
        raise TypeError(f"{name} is a {kind} tensor: gemmkit ops take dense (strided) tensors (call .to_dense())")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; expected one of: {allowed}")
    return t


def check_devices(**tensors) -> torch.device:
    """All given tensors on one device, a CUDA one (or the CPU under TRITON_INTERPRET=1)."""
    device = None
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        check_tensor(name, t)
        if device is None:
            device, first = t.device, name
            if device.type == "cuda":
                continue
            if device.type == "cpu" and interpreter_active():
                continue
            raise ValueError(
                f"{name} is on {device}: gemmkit kernels run on CUDA devices "
                "(CPU tensors only under the Triton interpreter, TRITON_INTERPRET=1)"
            )
        elif t.device != device:
            raise ValueError(f"{name} is on {t.device} but {first} is on {device}")
    return device


def check_activation(activation) -> str:
    if activation is None:
        return "none"
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not one of {ACTIVATIONS} (or None)")
    return activation


def check_out_dtype(out_dtype, y, default: torch.dtype) -> torch.dtype:
    if out_dtype is None:
        out_dtype = y.dtype if isinstance(y, torch.Tensor) else default
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype={out_dtype} is not one of bfloat16, float16, float32")
    return out_dtype


def as_rows(name: str, x: torch.Tensor):
    """(*, K) -> ((M, K) view or copy, leading shape). A 1-D x is one row."""
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least 1 dimension, got a 0-d tensor")
    if x.ndim == 2:
        return x, x.shape[:1]
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1]), x.shape[:-1]


def check_weight(name: str, w: torch.Tensor, K: int) -> int:
    if w.ndim != 2:
        raise ValueError(f"{name} must be 2-D (N, K), got shape {tuple(w.shape)}")
    if w.shape[1] != K:
        raise ValueError(f"{name} has shape {tuple(w.shape)}: its K ({w.shape[1]}) differs from x's ({K})")
    return w.shape[0]


def check_bias(bias, N: int, dtypes) -> None:
    if bias is None:
        return
    check_tensor("bias", bias, dtypes)
    if bias.ndim != 1 or bias.shape[0] != N:
        raise ValueError(f"bias must have shape ({N},), got {tuple(bias.shape)}")
    if N > 1 and bias.stride(0) != 1:
        raise ValueError("bias must have unit stride (call .contiguous())")


def check_layout(name: str, t: torch.Tensor) -> None:
    from .dense import operand_layout

    if operand_layout(t) is None:
        raise ValueError(f"{name} needs one dimension with unit stride (call .contiguous())")


def check_k_major(K: int, **operands) -> None:
    """8-bit (and packed) tensor-core operands are K-major: stride 1 along K (the last dim)."""
    for name, t in operands.items():
        if K > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must be K-contiguous (stride 1 along K): 8-bit tensor-core operands are "
                             "K-major (call .contiguous())")


def check_no_overlap(name: str, t: torch.Tensor) -> None:
    """A 2-D output whose elements are all distinct memory (no stride-0 or interleaved rows)."""
    R, C = t.shape
    (s_small, n_small), (s_big, n_big) = sorted([(abs(t.stride(0)), R), (abs(t.stride(1)), C)])
    if (n_small > 1 and s_small == 0) or (n_big > 1 and n_small > 1 and s_big < s_small * n_small):
        raise ValueError(f"{name} has elements that share memory (strides {tuple(t.stride())} for shape "
                         f"{tuple(t.shape)}): every output element needs its own location")


def debug_checks() -> bool:
    """GEMMKIT_DEBUG=1: also the checks that read values (a host synchronization), e.g. expert offsets and ids."""
    return os.environ.get("GEMMKIT_DEBUG", "") not in ("", "0")


def check_same_dtype(name: str, t, x) -> None:
    """`t` in x's (16-bit) dtype: the 16-bit ops take one type for both operands."""
    if t.dtype != x.dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but x has {x.dtype}; both must be the same 16-bit type")


def needs_grad(*tensors) -> bool:
    """Grad mode on and one of `tensors` requiring grad: the call takes the op's differentiable form
    (gemmkit.autograd)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def check_no_autograd(**tensors) -> None:
    if torch.is_grad_enabled():
        for name, t in tensors.items():
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise ValueError(
                    f"{name} requires grad, but this gemmkit op has no backward (gemmkit.autograd lists the "
                    "ones that have): call it under torch.no_grad() / torch.inference_mode(), or pass detached "
                    "tensors"
                )


def config_key(config):
    """A hashable stand-in for `config` in plan keys (a fresh object when it has none)."""
    if config is None or isinstance(config, GemmConfig):
        return config
    if isinstance(config, dict):
        try:  # with the types: 1 == True and 4 == 4.0, but only the latter of each pair is valid
            return tuple(sorted((k, type(val).__name__, val) for k, val in config.items()))
        except TypeError:
            pass
    return object()


def check_out(y, lead, M: int, N: int, dtype: torch.dtype, device: torch.device):
    """Check a user-given y; returns it as (M, N), or None when y is None."""
    if y is None:
        return None
    check_tensor("y", y)
    if tuple(y.shape) != (*lead, N):
        raise ValueError(f"y must have shape {(*lead, N)}, got {tuple(y.shape)}")
    if y.dtype != dtype:
        raise TypeError(f"y has dtype {y.dtype} but the result dtype is {dtype}")
    if y.device != device:
        raise ValueError(f"y is on {y.device} but x is on {device}")
    if y.ndim == 2:
        y2 = y
    else:
        try:
            y2 = y.view(M, N)
        except RuntimeError:
            raise ValueError("y's leading dimensions cannot be flattened without a copy") from None
    check_no_overlap("y", y2)
    return y2


def check_inputs(x, w, activation, k_major: bool = False, **others):
    """(activation, device, x as (M, K), x's leading shape, M, N, K): the checks of the input side
    every GEMM op makes (activation name, one CUDA device for x, w and `others`, no autograd, x
    (*, K) flattened to rows, w (N, K) of x's K; with k_major, x and w K-contiguous)."""
    activation = check_activation(activation)
    device = check_devices(x=x, w=w, **others)
    check_no_autograd(x=x, w=w, **others)
    x2, lead = as_rows("x", x)
    M, K = x2.shape
    N = check_weight("w", w, K)
    if k_major:
        check_k_major(K, x=x2, w=w)
    return activation, device, x2, tuple(lead), M, N, K


BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_output(y, lead, M: int, N: int, K: int, out_dtype, default_dtype, device, activation, bias=None):
    """(out_dtype, y as (M, N) or None, a DegeneratePlan when M, N or K is 0 else None): the
    checks of the output side every GEMM op makes (bias (N,), dtype, shape, device, distinct
    elements, one unit-stride dimension)."""
    check_bias(bias, N, BIAS_DTYPES)
    out_dtype = check_out_dtype(out_dtype, y, default_dtype)
    y2 = check_out(y, lead, M, N, out_dtype, device)
    if M == 0 or N == 0 or K == 0:
        return out_dtype, y2, DegeneratePlan((*lead, N), out_dtype, device, activation)
    if y2 is not None:
        check_layout("y", y2)
    return out_dtype, y2, None


class DegeneratePlan:
    """M, N or K is zero: an empty result, or (K == 0) activation(bias) broadcast; no kernel."""

    def __init__(self, out_shape, dtype, device, activation):
        self.out_shape, self.dtype, self.device, self.activation = tuple(out_shape), dtype, device, activation
        self.run = self.__call__  # every plan's quickest entry point (see gemmkit.core.dense.DensePlan)

    def __call__(self, x, w, bias=None, y=None, *scales):
        out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device) if y is None else y
        if out.numel():
            acc = torch.zeros(self.out_shape, dtype=torch.float32, device=self.device)
            if bias is not None:
                acc += bias.float()
            out.copy_(torch_activation(acc, self.activation))
        return out


