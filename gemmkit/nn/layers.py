"""Drop-in replacements for nn.Linear running gemmkit's kernels (inference layers).

Weights, scales and bias are buffers, not Parameters: they stay frozen in a training step (Linear, GatedMLP,
Int4Linear, MXFP4Linear and the 8-bit layers with activations quantized in the op pass gradients on to their inputs
through gemmkit.autograd; FP8Linear with a static act_scale refuses inputs that require grad). They follow
`.to()`, `state_dict()` and `load_state_dict()` like parameters do, except that a dtype move
(`.to(torch.float16)`, `.half()`, a model's `.bfloat16()`) changes only the activations' dtype and
the tensors kept in it (bias, 16-bit weights): FP8 / INT8 / 4-bit weights and their scales keep their
formats, and targets other than bfloat16 / float16 change nothing. Inputs: (*, in_features) in
the layer's dtype (bfloat16 or float16) on the layer's device; outputs (*, out_features), same
dtype. Build one from an nn.Linear with `from_linear`, or construct it empty and load a
state_dict saved from a layer of the same shape and options.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import quant
from ..core.rows import align_rows, dense_state, empty_aligned, rows_aligned
from ..ops.a8w8 import gemm_a8w8
from ..ops.a8w8_blockscale import gemm_a8w8_blockscale
from ..ops.a16w16 import gemm_a16w16
from ..ops.a16w4 import check_group_size, gemm_a16w4
from ..ops.fp4 import gemm_a16wfp4

_DTYPES = (torch.bfloat16, torch.float16)


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


class PaddedRowsModule(nn.Module):
    """A module whose dense weight buffers (named in `padded_weights`) keep rows that start on 32-byte boundaries
    (gemmkit.align_rows: the kernels read rows straddling the L2's sectors up to 1.8x slower), also after `.to()`
    (which keeps dense layouts only); state_dict() holds dense copies of them.

    dtypes under `.to(dtype)`, `.half()`, `.bfloat16()`, `.float()`: the activations' dtype (`self.dtype`) and the
    buffers named by `_follows_dtype()` (bias, 16-bit weights) move to a bfloat16 / float16 target (any other target
    leaves them as they are: the kernels take only those); every other buffer (FP8 / INT8 / packed weights, float32
    or 16-bit scales) keeps its dtype, whatever torch would cast it to."""

    padded_weights: tuple = ()

    def _follows_dtype(self) -> tuple:
        """The buffers kept in the activations' dtype."""
        return ()

    def _apply(self, fn, *args, **kwargs):
        before = {name: b for name, b in self._buffers.items() if b is not None}
        target = self.dtype
        if before:  # (what fn does to the activations' dtype: a .to(dtype) / .half() / .cuda() ...)
            probe = fn(torch.empty(0, dtype=self.dtype, device=next(iter(before.values())).device))
            target = probe.dtype if probe.dtype in _DTYPES else self.dtype
        super()._apply(fn, *args, **kwargs)
        follows = self._follows_dtype()
        for name, old in before.items():
            new = self._buffers[name]
            want = target if name in follows else old.dtype
            if new.dtype != want:  # (from the buffer before the cast: torch's cast may have lost values)
                self._buffers[name] = old.to(device=new.device, dtype=want)
        self.dtype = target
        for name in self.padded_weights:
            w = self._buffers.get(name)
            if w is not None and not rows_aligned(w):
                self._buffers[name] = align_rows(w)
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        dense_state(destination, [prefix + name for name in self.padded_weights])

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """As nn.Module's, but codes (integer, FP8 or packed buffers) load only from the same dtype: copy_ would cast
        another scheme's codes (an FP8 state_dict into an Int8Linear, MXFP4 scales into INT4 ones) into wrong values;
        16-bit and float32 values (bias, scales) cast as usual. Padded rows realigned after assign=True."""
        for name, buf in self._buffers.items():
            t = state_dict.get(prefix + name)
            if buf is None or not isinstance(t, torch.Tensor) or t.dtype == buf.dtype:
                continue
            if _is_code(t.dtype) or _is_code(buf.dtype):
                error_msgs.append(f"{prefix + name}: the state_dict holds {_name(t.dtype)}, this "
                                  f"{type(self).__name__} stores {_name(buf.dtype)} codes (a state_dict of another "
                                  f"scheme or format)")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        for name in self.padded_weights:
            w = self._buffers.get(name)
            if w is not None and not w.is_meta and not rows_aligned(w):
                self._buffers[name] = align_rows(w)


def check_scheme(scheme: str, schemes: tuple, dtype) -> None:
    """A layer constructor's scheme (one of `schemes`) and activations' dtype (bfloat16 / float16), or the error."""
    if scheme not in schemes:
        raise ValueError(f"scheme={scheme!r} is not one of {schemes}")
    if dtype not in _DTYPES:
        raise TypeError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")


def _is_code(dtype) -> bool:
    """Integer and 8-bit float dtypes: quantized codes, whose values mean nothing in another dtype."""
    return not dtype.is_floating_point or torch.finfo(dtype).bits <= 8


class GemmLayer(PaddedRowsModule):
    """What the gemmkit layers share: shape, dtype, bias, input checks, from_linear, repr.

    Subclasses set `scheme` (a short description) and `weight_dtype`, and implement
    `_set_weight(w)` (store w (N, K), any float dtype, in the layer's format) and `forward`.
    A dense (N, K) weight is kept in rows that start on 32-byte boundaries (gemmkit.align_rows: the
    kernels read rows straddling the L2's sectors up to 1.8x slower), also after `.to()`; state_dict()
    holds dense copies of such weights."""

    scheme = ""
    weight_dtype = None  # None: the layer's dtype
    padded_weights = ("weight",)  # weight (N, K), one value per element (not packed): its rows are padded

    def _follows_dtype(self) -> tuple:
        # (a weight in the activations' dtype: not quantized (weight_dtype None) and not packed (padded_weights))
        return ("weight", "bias") if self.weight_dtype is None and "weight" in self.padded_weights else ("bias",)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, dtype=torch.bfloat16,
                 device=None):
        super().__init__()
        if dtype not in _DTYPES:
            raise TypeError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        self.register_buffer("weight", empty_aligned(out_features, in_features, self.weight_dtype or dtype,
                                                     device).zero_())
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @classmethod
    def unsupported(cls, linear: nn.Linear, **options) -> str | None:
        """Why this layer cannot replace `linear` with these from_linear options (None: it can)."""
        return None

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, dtype=None, **options):
        """A layer computing what `linear` does, on its device. dtype: the activations' dtype
        (default: the linear's, which must then be bfloat16 or float16). options: the
        subclass's constructor options (e.g. FP8Linear's act_scale)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_linear takes an nn.Linear, got {type(linear).__name__}")
        reason = cls.unsupported(linear, **options)
        if reason:
            raise ValueError(f"{cls.__name__} cannot replace this layer: {reason}")
        if dtype is not None and dtype not in _DTYPES:
            raise TypeError(f"dtype={dtype}: the activations' dtype must be torch.bfloat16 or torch.float16")
        dtype = linear.weight.dtype if dtype is None else dtype
        if dtype not in _DTYPES:
            raise TypeError(f"the linear layer is {_name(linear.weight.dtype)}: pass dtype=torch.bfloat16 or "
                            "torch.float16 (the activations' dtype)")
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, dtype=dtype,
                    device=linear.weight.device, **options)
        if linear.weight.is_meta:  # (a model built on the meta device: the layer's form only, its values loaded later)
            return layer
        with torch.no_grad():
            layer._set_weight(linear.weight.detach())
            if linear.bias is not None:
                layer.bias.copy_(linear.bias.detach())
        return layer

    def _check_input(self, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{type(self).__name__} input must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != self.dtype:
            raise TypeError(f"{type(self).__name__} input has dtype {_name(x.dtype)}, the layer takes "
                            f"{_name(self.dtype)} (convert it with .to({self.dtype}))")
        if x.device != self.weight.device:
            raise ValueError(f"{type(self).__name__} input is on {x.device}, the layer on {self.weight.device}")
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"{type(self).__name__} input has shape {tuple(x.shape)}: its last dimension must "
                             f"be in_features = {self.in_features}")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"dtype={_name(self.dtype)}, scheme={self.scheme}")


class Linear(GemmLayer):
    """y = x @ weight.T + bias in bfloat16/float16 (gemm_a16w16, fp32 accumulation).
    weight (N, K) in the layer's dtype; bias (N,)."""

    scheme = "a16w16"

    def _set_weight(self, w):
        self.weight.copy_(w)

    def forward(self, x):
        self._check_input(x)
        return gemm_a16w16(x, self.weight, self.bias)


class _QuantizedLayer(GemmLayer):
    """An 8-bit weight quantized per output channel: weight (N, K), weight_scale (N,) float32."""

    def __init__(self, in_features, out_features, bias=True, *, dtype=torch.bfloat16, device=None):
        super().__init__(in_features, out_features, bias, dtype=dtype, device=device)
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32, device=device))

    @classmethod
    def unsupported(cls, linear, **options):
        return _unaligned(linear)

    def _set_weight(self, w):
        wq, ws = self._quantize_weight(w)
        self.weight.copy_(wq)
        self.weight_scale.copy_(ws.reshape(-1))


class FP8Linear(_QuantizedLayer):
    """FP8 (e4m3) weight quantized per output channel: weight (N, K) float8_e4m3fn,
    weight_scale (N,) float32. Activations: quantized per token inside the op (dynamic, the
    default), or with a static per-tensor scale (act_scale=: a float or a 1-element float32
    tensor, kept as the buffer `act_scale` (1,)). Output: the layer's dtype."""

    weight_dtype = torch.float8_e4m3fn

    def __init__(self, in_features, out_features, bias=True, *, dtype=torch.bfloat16, device=None, act_scale=None):
        super().__init__(in_features, out_features, bias, dtype=dtype, device=device)
        if act_scale is not None:  # (checked on the host: the layer may be built under torch.device("meta"))
            meta = isinstance(act_scale, torch.Tensor) and act_scale.is_meta  # (its value comes with a state_dict)
            s = torch.as_tensor(act_scale, dtype=torch.float32, device="meta" if meta else "cpu").detach().reshape(-1)
            if s.numel() != 1 or (not meta and not bool(torch.isfinite(s).all() and (s > 0).all())):
                raise ValueError(f"act_scale must be one finite positive value, got {act_scale!r}")
            self.register_buffer("act_scale", s.to(device=self.weight.device))
        else:
            self.register_buffer("act_scale", None)

    @property
    def scheme(self):
        act = "static per-tensor" if self.act_scale is not None else "dynamic per-token"
        return f"fp8 e4m3 (weight per-channel, activations {act})"

    @staticmethod
    def _quantize_weight(w):
        return quant.quantize_fp8(w, "row")

    def forward(self, x):
        self._check_input(x)
        if self.act_scale is None:
            return gemm_a8w8(x, self.weight, None, self.weight_scale, self.bias, out_dtype=self.dtype)
        xq, xs = quant.quantize_fp8(x, "tensor", scale=self.act_scale)
        return gemm_a8w8(xq, self.weight, xs, self.weight_scale, self.bias, out_dtype=self.dtype)


class Int8Linear(_QuantizedLayer):
    """INT8 weight quantized per output channel (weight (N, K) int8, weight_scale (N,) float32),
    activations quantized per token inside the op (dynamic). Output: the layer's dtype."""

    scheme = "int8 (weight per-channel, activations dynamic per-token)"
    weight_dtype = torch.int8

    @staticmethod
    def _quantize_weight(w):
        return quant.quantize_int8(w, "row")

    def forward(self, x):
        self._check_input(x)
        return gemm_a8w8(x, self.weight, None, self.weight_scale, self.bias, out_dtype=self.dtype)


ALIGN = 16


def _unaligned(linear) -> str | None:
    """8-bit layers take in_features and out_features in multiples of 16: 16-byte rows (the
    TMA's alignment) and no tensor-core tile mostly padding (8-bit dots take K >= 32)."""
    if linear.in_features % ALIGN or linear.out_features % ALIGN:
        return (f"in_features={linear.in_features}, out_features={linear.out_features}: 8-bit layers need "
                f"multiples of {ALIGN}")
    return None


class BlockFP8Linear(GemmLayer):
    """DeepSeek-V3 block-wise FP8: weight (N, K) float8_e4m3fn quantized per 128x128 block,
    weight_scale (ceil(N / 128), ceil(K / 128)) float32 (scale_format="float32", or "ue8m0":
    powers of two); activations quantized per token and 128-wide K group inside the op
    (dynamic). gemm_a8w8_blockscale, fp32 accumulation with the block scales applied per
    K block. Output: the layer's dtype."""

    weight_dtype = torch.float8_e4m3fn
    BLOCK = 128

    def __init__(self, in_features, out_features, bias=True, *, dtype=torch.bfloat16, device=None,
                 scale_format="float32"):
        super().__init__(in_features, out_features, bias, dtype=dtype, device=device)
        if scale_format not in ("float32", "ue8m0"):
            raise ValueError(f"scale_format must be 'float32' or 'ue8m0', got {scale_format!r}")
        self.scale_format = scale_format
        blocks = (-(-out_features // self.BLOCK), -(-in_features // self.BLOCK))
        self.register_buffer("weight_scale", torch.ones(blocks, dtype=torch.float32, device=device))

    @property
    def scheme(self):
        return (f"fp8 e4m3 block-wise (weight 128x128 blocks, {self.scale_format} scales; "
                "activations dynamic per 1x128 group)")

    @classmethod
    def unsupported(cls, linear, **options):
        return _unaligned(linear)

    def _set_weight(self, w):
        wq, ws = quant.quantize_fp8_blockwise(w, (self.BLOCK, self.BLOCK), scale_format=self.scale_format)
        self.weight.copy_(wq)
        self.weight_scale.copy_(ws)

    def forward(self, x):
        self._check_input(x)
        return gemm_a8w8_blockscale(x, self.weight, None, self.weight_scale, self.bias, out_dtype=self.dtype)


# ---------------------------------------------------------------------------------------------
# 4-bit weights (issue 17)


class Int4Linear(GemmLayer):
    """INT4 weight in groups along K (GPTQ/AWQ-compatible), bf16/fp16 activations (gemm_a16w4).

    Buffers: weight uint8 (N, K // 2) (two 4-bit values per byte, gemmkit.quant.quantize_int4's
    packing), weight_scale (N, K // group_size) in scale_dtype (default: the layer's dtype),
    weight_zero uint8 (N, K // group_size) or None (symmetric: zero point 8), and with act_order
    perm int64 (K,): GPTQ's act-order, applied to the activations (y = x[..., perm] @ w.T).
    group_size: 32, 64, 128 or None / -1 (one group per output channel)."""

    padded_weights = ()  # (packed 4-bit codes)

    def __init__(self, in_features, out_features, bias=True, *, dtype=torch.bfloat16, device=None, group_size=128,
                 symmetric: bool = False, act_order: bool = False, scale_dtype=None):
        super().__init__(in_features, out_features, bias, dtype=dtype, device=device)
        if in_features % 2:
            raise ValueError(f"in_features={in_features} must be even (two 4-bit values per byte)")
        g = check_group_size(group_size, in_features)  # (what gemm_a16w4 runs: refused here, not at forward)
        self.group_size, self.symmetric = (None if g == in_features else g), symmetric
        groups = in_features // g
        self.register_buffer("weight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, groups, dtype=scale_dtype or dtype,
                                                        device=device))
        self.register_buffer("weight_zero", None if symmetric else
                             torch.zeros(out_features, groups, dtype=torch.uint8, device=device))
        self.register_buffer("perm", torch.arange(in_features, device=device) if act_order else None)

    @property
    def scheme(self):
        g = "per-channel" if self.group_size is None else f"group {self.group_size}"
        order = ", act-order" if self.perm is not None else ""
        return f"int4 ({g}, {'symmetric' if self.symmetric else 'asymmetric'}{order})"

    @classmethod
    def unsupported(cls, linear, group_size=128, **options):
        K = linear.in_features
        if K % 2:
            return f"in_features={K} is odd (two 4-bit values per byte)"
        try:
            check_group_size(group_size, K)
        except ValueError as e:
            return f"in_features={K} and the group size {group_size!r}: {e}"
        return None

    @classmethod
    def from_linear(cls, linear, *, dtype=None, group_size=128, symmetric: bool = False):
        """INT4-quantize an nn.Linear's weight (gemmkit.quant.quantize_int4) in groups along K
        (group_size 32, 64, 128 or None / -1: per channel)."""
        return super().from_linear(linear, dtype=dtype, group_size=group_size, symmetric=symmetric)

    def _set_weight(self, w):
        q, s, z = quant.quantize_int4(w.to(self.dtype), self.group_size, self.symmetric)
        self.weight.copy_(q)
        self.weight_scale.copy_(s)
        if z is not None:
            self.weight_zero.copy_(z)

    @classmethod
    def _from_packed(cls, imported, bias, dtype):
        w_q, w_scale, w_zero, gs, perm = imported
        dtype = w_scale.dtype if dtype is None else dtype
        if dtype not in _DTYPES:
            raise TypeError(f"the scales are {_name(w_scale.dtype)}: pass dtype=torch.bfloat16 or torch.float16 "
                            "(the activations' dtype)")
        N, K = w_q.shape[0], 2 * w_q.shape[1]
        layer = cls(K, N, bias is not None, dtype=dtype, device=w_q.device, group_size=gs if gs != K else None,
                    act_order=perm is not None, scale_dtype=w_scale.dtype)
        with torch.no_grad():
            layer.weight.copy_(w_q)
            layer.weight_scale.copy_(w_scale)
            layer.weight_zero.copy_(w_zero)
            if perm is not None:
                layer.perm.copy_(perm)
            if bias is not None:
                layer.bias.copy_(bias)
        return layer

    @classmethod
    def from_gptq(cls, qweight, qzeros, scales, g_idx=None, bias=None, *, dtype=None):
        """A layer from a GPTQ checkpoint's tensors (gemmkit.quant.from_gptq: qweight int32
        (K // 8, N), qzeros int32 (G, N // 8), scales (G, N), g_idx (K,) or None); act-order
        checkpoints keep their permutation and apply it to the activations. dtype: the
        activations' (default: the scales')."""
        return cls._from_packed(quant.from_gptq(qweight, qzeros, scales, g_idx), bias, dtype)

    @classmethod
    def from_awq(cls, qweight, qzeros, scales, bias=None, *, dtype=None):
        """A layer from an AWQ checkpoint's tensors (gemmkit.quant.from_awq: qweight int32
        (K, N // 8), qzeros int32 (G, N // 8), scales (G, N))."""
        return cls._from_packed(quant.from_awq(qweight, qzeros, scales), bias, dtype)

    def forward(self, x):
        self._check_input(x)
        if self.perm is not None:
            x = x[..., self.perm]
        return gemm_a16w4(x, self.weight, self.weight_scale, self.weight_zero, group_size=self.group_size,
                          bias=self.bias)


class MXFP4Linear(GemmLayer):
    """MXFP4 weight (OCP MX: e2m1 values, one e8m0 scale per 32 along K), bf16/fp16 activations
    (gemm_a16wfp4). Buffers: weight uint8 (N, K // 2) e2m1 codes, weight_scale uint8 (N, K // 32)."""

    scheme = "mxfp4 (weight e2m1, e8m0 scale per 32)"
    padded_weights = ()  # (packed 4-bit codes)

    def __init__(self, in_features, out_features, bias=True, *, dtype=torch.bfloat16, device=None):
        super().__init__(in_features, out_features, bias, dtype=dtype, device=device)
        if in_features % quant.MX_BLOCK:
            raise ValueError(f"in_features={in_features} must be a multiple of {quant.MX_BLOCK}")
        self.register_buffer("weight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.register_buffer("weight_scale", torch.full((out_features, in_features // quant.MX_BLOCK), 127,
                                                        dtype=torch.uint8, device=device))

    @classmethod
    def unsupported(cls, linear, **options):
        if linear.in_features % quant.MX_BLOCK:
            return f"in_features={linear.in_features} is not a multiple of {quant.MX_BLOCK}"
        return None

    def _set_weight(self, w):
        q, s = quant.quantize_mxfp4(w)
        self.weight.copy_(q)
        self.weight_scale.copy_(s)

    def forward(self, x):
        self._check_input(x)
        return gemm_a16wfp4(x, self.weight, self.weight_scale, bias=self.bias)
