"""Host side of the shared dense GEMM: plans, operand layouts, TMA descriptors, grid, launch.

A `DensePlan` holds everything about a call that depends only on shapes, strides, dtypes,
devices and pointer alignments. Ops build one after validating their arguments and cache it under
`plan_key(...)`; a repeated call with the same key skips validation, config lookup and Triton's
argument binding, and costs one dict lookup plus the launch.
"""

from __future__ import annotations

import dataclasses

import torch
from triton.runtime.errors import OutOfResources

from .config import GemmConfig, min_block_k, register_plan_cache, select_config
from .device import DeviceInfo
from .launcher import CachedLaunch, hook_set, launch_hooks

_INT32_MAX = 2**31 - 1
_get_device = getattr(torch._C, "_cuda_getDevice", None)
_grad_enabled = torch.is_grad_enabled
_stream_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
_kernels: dict = {}


def _jit_kernel():
    """The Triton kernel, imported on first use: TRITON_INTERPRET is read when it is defined."""
    if not _kernels:
        from ..kernels.gemm import gemm_kernel

        _kernels["gemm"] = gemm_kernel
    return _kernels["gemm"]


def capturing() -> bool:
    """True while the current CUDA stream is being captured into a graph."""
    return torch.cuda.is_initialized() and _stream_capturing()


_counters: dict = {}


def split_k_counters(device: torch.device, device_index: int, n: int) -> torch.Tensor:
    """n int32 zeros for the split-K arrival counters of one launch (the kernel leaves them zero).

    Eagerly: one buffer per (device, stream), reused; launches on one stream run in order, and
    launches on different streams get different buffers. Under graph capture: a fresh zeroed
    buffer per call (its zeroing is captured with the GEMM), so graphs share nothing."""
    if device.type != "cuda":
        key = (device.type, 0)
    elif capturing():
        return torch.zeros(n, dtype=torch.int32, device=device)
    else:
        key = (device_index, torch._C._cuda_getCurrentRawStream(device_index))
    buf = _counters.get(key)
    if buf is None or buf.numel() < n:
        buf = _counters[key] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return buf


# ---------------------------------------------------------------------------------------------
# plan cache keys


def plan_key(tensors, extras):
    """A key covering every fact a plan depends on, or None (then: build a plan, which validates
    and raises on bad input): per tensor its shape, strides, dtype, device, pointer alignment and
    requires_grad, and the grad mode (plans refuse autograd inputs). It may still be unhashable
    (an odd argument in `extras`): PlanCache.plan_for then builds the plan."""
    try:
        return (tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15,
                                                t.requires_grad) for t in tensors]), extras, _grad_enabled())
    except (AttributeError, RuntimeError, NotImplementedError):  # not a tensor; sparse or nested
        return None


class PlanCache(dict):
    """Plans by key, bounded: a serving process sees many distinct M values."""

    def __init__(self, capacity: int = 4096):
        super().__init__()
        self.capacity = capacity
        register_plan_cache(self)

    def plan_for(self, key, build, *args):
        """The plan cached under `key`, else `build(*args)` (which validates), cached."""
        try:
            return self[key]  # (a None key is never stored)
        except KeyError:
            pass
        except TypeError:  # unhashable key: a plan for this call only
            key = None
        plan = build(*args)
        if key is not None:
            if len(self) >= self.capacity:
                self.clear()
            self[key] = plan
        return plan


# ---------------------------------------------------------------------------------------------
# layouts and descriptors


def contiguous_strides(shape) -> tuple:
    """Strides of a contiguous tensor of this shape (for torch.empty_strided, which parses its
    arguments faster than torch.empty: 4.0 vs 5.8 µs on the H100 host, scripts/host_probe.py)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def operand_layout(t: torch.Tensor):
    """(k_major, stride_rows, stride_k) of a 2-D operand (rows, K) with a unit-stride dimension.

    A size-1 dimension may have any stride; it is given the stride of a contiguous layout.
    Returns None when neither dimension has unit stride.
    """
    R, Kd = t.shape
    sr, sk = t.stride()
    if sk == 1 or Kd == 1:
        return True, (sr if R > 1 else max(Kd, 1)), 1
    if sr == 1 or R == 1:
        return False, 1, (sk if Kd > 1 else max(R, 1))
    return None


def _tma_ok(t: torch.Tensor, outer_stride: int, block) -> bool:
    """A TMA descriptor can address t: 16-byte aligned base and row stride (a stride-0,
    broadcast operand takes the pointer path), boxes of at most 256 per dimension."""
    return (t.data_ptr() % 16 == 0 and outer_stride > 0 and (outer_stride * t.element_size()) % 16 == 0
            and max(block) <= 256)


class _Descriptor:
    """Builds the host TensorDescriptor of one operand per call. Its layout was validated when the
    plan was built and the plan key pins it, so later calls skip TensorDescriptor's checks."""

    def __init__(self, shape, strides, block, transposed: bool):
        self.shape, self.strides, self.block, self.transposed = list(shape), list(strides), list(block), transposed

    def __call__(self, t: torch.Tensor, checked: bool):
        from triton.tools.tensor_descriptor import TensorDescriptor

        if not checked:
            return TensorDescriptor(t, self.shape, self.strides, self.block)
        d = object.__new__(TensorDescriptor)
        d.base, d.shape, d.strides, d.block_shape, d.padding = t, self.shape, self.strides, self.block, "zero"
        return d


def _operand_descriptor(t, layout, block_r, block_k):
    R, Kd = t.shape
    k_major, s_r, s_k = layout
    if k_major and _tma_ok(t, s_r, (block_r, block_k)):
        return _Descriptor((R, Kd), (s_r, 1), (block_r, block_k), False)
    if not k_major and _tma_ok(t, s_k, (block_r, block_k)):
        return _Descriptor((Kd, R), (s_k, 1), (block_k, block_r), True)
    return None


def _max_offset(t: torch.Tensor) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))


def resolve_config(op: str, config, M: int, N: int, K: int, dev: DeviceInfo, in_bytes, out_bytes) -> GemmConfig:
    """The caller's config (checked against the operand width), else the table's or a derived one."""
    if config is None:
        return select_config(op, M, N, K, dev, in_bytes, out_bytes)
    if not isinstance(config, (dict, GemmConfig)):
        raise TypeError(f"config must be None, a dict or a GemmConfig, got {type(config).__name__}")
    cfg = GemmConfig.from_dict(config)
    if cfg.BLOCK_K < min_block_k(in_bytes):
        raise ValueError(f"config: BLOCK_K={cfg.BLOCK_K} is below {min_block_k(in_bytes)}, the least "
                         f"{8 * in_bytes}-bit tensor-core dots take")
    return cfg


# ---------------------------------------------------------------------------------------------
# the plan


class TensorFacts:
    """What a plan needs of a tensor (shape, strides, dtype, element size, device, 16-byte
    alignment), without keeping the tensor alive."""

    __slots__ = ("shape", "_stride", "dtype", "_element_size", "device", "_ptr_mod16")

    def __init__(self, t: torch.Tensor):
        self.shape, self._stride, self.dtype = tuple(t.shape), tuple(t.stride()), t.dtype
        self._element_size, self.device, self._ptr_mod16 = t.element_size(), t.device, t.data_ptr() % 16

    def stride(self):
        return self._stride

    def element_size(self):
        return self._element_size

    def data_ptr(self):  # only its alignment is known
        return self._ptr_mod16


def shrink_config(cfg: GemmConfig, least_block_k: int = 16) -> GemmConfig | None:
    """A config needing less shared memory (fewer stages, a split epilogue, smaller tiles)."""
    if cfg.num_stages > 2:
        return dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
    if cfg.TMA and not cfg.EPILOGUE_SUBTILE and cfg.BLOCK_N >= 32:
        return dataclasses.replace(cfg, EPILOGUE_SUBTILE=True)
    if cfg.BLOCK_K > least_block_k:
        return dataclasses.replace(cfg, BLOCK_K=cfg.BLOCK_K // 2)
    if cfg.BLOCK_N > 16:
        return dataclasses.replace(cfg, BLOCK_N=cfg.BLOCK_N // 2, EPILOGUE_SUBTILE=False)
    return None


class DensePlan:
    """y (M, N) = activation(x (M, K) @ w (N, K)^T * scales + bias) for fixed tensor facts.

    Built from validated example arguments (M, N, K >= 1). Call it with tensors that have the
    same facts (the plan key guarantees it). `out_shape`: the shape returned to the user ((M, N)
    or (*, N)); x is reshaped to (M, K) when `flatten_x`. With `auto_config` (the config was not
    the caller's choice), a config that turns out not to fit the device at its first launch is
    shrunk until it does.
    """

    def __init__(self, x2, w, y2, bias, activation: str, cfg: GemmConfig, dev: DeviceInfo, *,
                 out_dtype, out_shape, flatten_x: bool, a_scale_mode: int = 0, b_scale_mode: int = 0,
                 a_quant: str = "", auto_config: bool = False):
        self.x, self.w, self.y = TensorFacts(x2), TensorFacts(w), TensorFacts(y2)
        self.M, self.K = x2.shape
        self.N = w.shape[0]
        self.activation, self.dev, self.auto_config = activation, dev, auto_config
        self.a_scale_mode, self.b_scale_mode, self.a_quant = a_scale_mode, b_scale_mode, a_quant
        self.out_dtype, self.out_shape, self.flatten_x = out_dtype, tuple(out_shape), flatten_x
        self.device = x2.device
        self.device_index = x2.device.index or 0
        self.cuda = x2.device.type == "cuda"
        self.int_dot = w.dtype == torch.int8
        self._configure(cfg)

    def _configure(self, cfg: GemmConfig) -> None:
        x2, w, y2, dev, a_quant = self.x, self.w, self.y, self.dev, self.a_quant
        M, N, K = self.M, self.N, self.K
        self.cfg = cfg
        bm, bn, bk = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
        # in-kernel quantization of A keeps its scales in registers: no TMA for A, no split epilogue
        split_k = cfg.SPLIT_K

        x_layout, w_layout = operand_layout(x2), operand_layout(w)
        want_tma = cfg.TMA and dev.has_tma
        self.a_desc = _operand_descriptor(x2, x_layout, bm, bk) if want_tma and not a_quant else None
        self.b_desc = _operand_descriptor(w, w_layout, bn, bk) if want_tma else None
        self.c_desc = None
        s_cm, s_cn = y2.stride()
        subtile = cfg.EPILOGUE_SUBTILE and split_k == 1 and not a_quant
        if split_k == 1 and want_tma and (s_cn == 1 or N == 1):
            bn_store = bn // 2 if subtile else bn
            s_cm_eff = s_cm if M > 1 else N
            if _tma_ok(y2, s_cm_eff, (bm, bn_store)):
                self.c_desc = _Descriptor((M, N), (s_cm_eff, 1), (bm, bn_store), False)
        index_64 = max(_max_offset(x2), _max_offset(w), _max_offset(y2)) > _INT32_MAX

        num_tiles = -(-M // bm) * -(-N // bn)
        num_work = num_tiles * split_k
        grid = min(num_work, dev.num_sms) if cfg.PERSISTENT else num_work
        sk_tiles = 0
        if cfg.STREAM_K and split_k == 1:
            # one program per SM (fewer if there are fewer K iterations than SMs); the ragged last
            # wave plus one full wave (or every tile, if there are fewer tiles than programs) is
            # shared out by K iterations: two tiles' worth at most per program keeps the pieces
            # of a tile few (little fix-up) and still balances the SMs
            grid = min(dev.num_sms, num_tiles * -(-K // bk))
            ragged = num_tiles % grid
            sk_tiles = num_tiles if num_tiles < grid else (grid + ragged if ragged else 0)
        self.stream_k = sk_tiles > 0
        flatten = cfg.PERSISTENT and split_k == 1 and not a_quant
        warp_specialize = cfg.WARP_SPECIALIZE and flatten and self.a_desc is not None and self.b_desc is not None
        a_km, s_am, s_ak = x_layout
        b_km, s_bn, s_bk = w_layout
        act, a_mode, b_mode = self.activation, self.a_scale_mode, self.b_scale_mode
        # gemm_kernel's parameters after (a, b, c, bias, a_scale, b_scale), in signature order
        self.gemm_tail = (
            M, N, K, s_am, s_ak, s_bn, s_bk, s_cm, s_cn, sk_tiles,
            bm, bn, bk, cfg.GROUP_M, split_k, self.stream_k,
            self.a_desc is not None, a_km, self.b_desc is not None, b_km, self.c_desc is not None,
            K % bk == 0, index_64, self.int_dot,
            a_mode, b_mode, act,
            flatten, warp_specialize, subtile, a_quant,
        )
        # partial tiles (kernels/reduce.py): one block per (tile, K slice), or two per program
        self.pieces = split_k > 1 or self.stream_k
        self.ws_shape = (2 * grid if self.stream_k else num_tiles * split_k, bm, bn)
        self.ws_dtype = torch.int32 if self.int_dot else torch.float32
        self.num_tiles = num_tiles
        self.gemm = CachedLaunch(_jit_kernel(), (grid,), cfg.num_warps, cfg.num_stages, self.device_index)
        self._launch_regular = self._per_call()
        # run(x, w, bias, y, a_scale, b_scale): the quickest way to call this plan (the direct
        # launch once the first call has compiled the kernel)
        self.run = self._call

    def __call__(self, x, w, bias=None, y=None, a_scale=None, b_scale=None):
        return self.run(x, w, bias, y, a_scale, b_scale)

    def _call(self, x, w, bias, y, a_scale, b_scale):
        # (torch.cuda.current_device() without its lazy-init check: a CUDA plan has CUDA tensors)
        if self.cuda and _get_device() != self.device_index:
            with torch.cuda.device(self.device_index):
                return self._run(x, w, bias, y, a_scale, b_scale)
        return self._run(x, w, bias, y, a_scale, b_scale)

    def _run(self, x, w, bias, y, a_scale, b_scale):
        try:
            out = self._launch_regular(x, w, bias, y, a_scale, b_scale)
        except OutOfResources:
            smaller = (shrink_config(self.cfg, min_block_k(self.w.element_size()))
                       if self.auto_config and self.gemm.kernel is None else None)
            if smaller is None:
                raise
            self._configure(smaller)
            return self._run(x, w, bias, y, a_scale, b_scale)
        if self.run == self._call and self.gemm.kernel is not None:
            parts = self.gemm.direct_parts()
            if parts is not None:
                self.run = self._per_call(parts)
        return out

    def _per_call(self, direct=None):
        """The work of one call as a flat function of (x, w, bias, y, a_scale, b_scale), each
        decision the plan fixes taken here once. direct=None: launch through CachedLaunch
        (Triton's regular path the first time: compiles and validates the layouts). direct (from
        CachedLaunch.direct_parts, after the first launch): call Triton's C launcher with raw
        pointers, what every later call on the plan's device does; eagerly, a decode-sized GEMM
        costs the host more than the GPU (README, "Host cost")."""
        M, N, K, idx, device = self.M, self.N, self.K, self.device_index, self.device
        out_shape, out_dtype, tail = self.out_shape, self.out_dtype, self.gemm_tail
        flatten_x, view_out = self.flatten_x, len(self.out_shape) != 2
        a_desc, b_desc, c_desc = self.a_desc, self.b_desc, self.c_desc
        pieces, ws_shape, ws_dtype, num_tiles = self.pieces, self.ws_shape, self.ws_dtype, self.num_tiles
        out_strides, ws_strides = contiguous_strides(out_shape), contiguous_strides(ws_shape)
        empty, gemm, flat = torch.empty_strided, self.gemm, direct is not None
        if flat:
            launch, gx, gy, gz, function, lead = direct
            stream, hook, slow = torch._C._cuda_getCurrentRawStream, launch_hooks(), self._call

        def per_call(x, w, bias, y, a_scale, b_scale):
            if flat and (_get_device() != idx or hook_set(hook)):  # another device current, or a profiler
                return slow(x, w, bias, y, a_scale, b_scale)
            if flatten_x:
                x = x.reshape(M, K)
            out = empty(out_shape, out_strides, dtype=out_dtype, device=device) if y is None else y
            c = out.view(M, N) if view_out else out
            if pieces:  # (both held until the launch is queued: a freed block may be handed out again)
                ws = empty(ws_shape, ws_strides, dtype=ws_dtype, device=device)
                counters = split_k_counters(device, idx, num_tiles)
            else:
                ws = counters = None
            if flat:
                launch(gx, gy, gz, stream(idx), function, *lead,
                       x.data_ptr() if a_desc is None else a_desc(x, True),
                       w.data_ptr() if b_desc is None else b_desc(w, True),
                       c.data_ptr() if c_desc is None else c_desc(c, True),
                       None if ws is None else ws.data_ptr(),
                       None if counters is None else counters.data_ptr(),
                       None if bias is None else bias.data_ptr(),
                       None if a_scale is None else a_scale.data_ptr(),
                       None if b_scale is None else b_scale.data_ptr(),
                       *tail)
            else:
                checked = gemm.kernel is not None  # layouts were validated when the first call built the descriptors
                gemm((x if a_desc is None else a_desc(x, checked), w if b_desc is None else b_desc(w, checked),
                      c if c_desc is None else c_desc(c, checked), ws, counters, bias, a_scale, b_scale), tail)
            return out

        return per_call
