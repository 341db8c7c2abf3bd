"""What every plan of the shared kernel reuses: plan keys and the LRU plan cache, kernel arguments
by name, split-K counters, and `PlanBase`, the launch machinery (the first launch through Triton,
the direct C-launcher path after it, device switches, profiler hooks, shrinking a config that
does not fit at its first launch).

A plan holds everything about a call that depends only on shapes, strides, dtypes, devices and
pointer alignments. Ops build one after validating their arguments and cache it under
`plan_key(...)`; a repeated call with the same key skips validation, config lookup and Triton's
argument binding, and costs one dict lookup plus the launch.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch.autograd import forward_ad as _forward_ad
from triton.runtime.errors import OutOfResources

from .config import register_plan_cache, shrink_config

_get_device = getattr(torch._C, "_cuda_getDevice", None)
_grad_enabled = torch.is_grad_enabled
_stream_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def on_device(index: int, fn, *args):
    """fn(*args) with CUDA device `index` current (launches go to the current device; torch.cuda.current_device()
    without its lazy-init check: a CUDA plan has CUDA tensors)."""
    if _get_device() != index:
        with torch.cuda.device(index):
            return fn(*args)
    return fn(*args)


def capturing() -> bool:
    """True while the current CUDA stream is being captured into a graph."""
    return torch.cuda.is_initialized() and _stream_capturing()


# ---------------------------------------------------------------------------------------------
# kernel arguments by name


def kernel_tail(fn, per_call: tuple, values: dict) -> tuple:
    """The arguments of `fn` after its per-call ones, in signature order, from `values` by name.

    Checked once, when a plan is built: the signature starts with the `per_call` names (the
    tensors a plan passes on every call, in that order) and `values` covers every other parameter,
    no more. Plans then launch with `(*per-call values, *tail)`, through Triton or directly."""
    names = tuple(fn.arg_names)
    if names[:len(per_call)] != tuple(per_call):
        raise AssertionError(f"{getattr(fn, '__name__', fn)}: the signature must start with {per_call}, "
                             f"got {names[:len(per_call)]}")
    rest = names[len(per_call):]
    missing = [n for n in rest if n not in values]
    unknown = [n for n in values if n not in rest]
    if missing or unknown:
        raise AssertionError(f"kernel arguments: missing {missing}, unknown {unknown}")
    return tuple(values[n] for n in rest)


# ---------------------------------------------------------------------------------------------
# plan cache keys


def plan_key(tensors, extras):
    """A key covering every fact a plan depends on, or None (then: build a plan, which validates
    and raises on bad input): per tensor its shape, strides, dtype, device, pointer alignment and
    requires_grad, and the grad mode (plans refuse autograd inputs). It may still be unhashable
    (an odd argument in `extras`): PlanCache.plan_for then builds the plan."""
    if _forward_ad._current_level >= 0:  # (inside a forward-mode dual level: no key, every call validated)
        return None
    try:
        return (tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 31,
                                                t.requires_grad) for t in tensors]), extras, _grad_enabled())
    except (AttributeError, RuntimeError, NotImplementedError):  # not a tensor; sparse or nested
        return None


class PlanCache(OrderedDict):
    """Plans by key, least recently used evicted first: a serving process sees many distinct M
    values. A hit moves the plan to the back: `lookup`, or inline in the ops' hot path
    `plan = cache[key]; cache.move_to_end(key)` (one C call less)."""

    def __init__(self, capacity: int = 4096):
        super().__init__()
        self.capacity = capacity
        register_plan_cache(self)

    def lookup(self, key):
        """The plan under `key` (KeyError if none; TypeError for an unhashable or None key)."""
        if key is None:
            raise TypeError("no key")
        plan = self[key]
        self.move_to_end(key)
        return plan

    def plan_for(self, key, build, *args):
        """The plan cached under `key`, else `build(*args)` (which validates), cached."""
        try:
            return self.lookup(key)
        except KeyError:
            pass
        except TypeError:  # unhashable or no key: a plan for this call only
            key = None
        plan = build(*args)
        if key is not None:
            while len(self) >= self.capacity:
                self.popitem(last=False)
            self[key] = plan
        return plan


# ---------------------------------------------------------------------------------------------
# tensors


def contiguous_strides(shape) -> tuple:
    """Strides of a contiguous tensor of this shape (for torch.empty_strided, which parses its
    arguments faster than torch.empty: 4.0 vs 5.8 µs on the H100 host, scripts/host_probe.py)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def extent_bytes(t) -> int:
    """Bytes from t's first element to one past its last (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


class TensorFacts:
    """What a plan needs of a tensor (shape, strides, dtype, element size, device, 16-byte
    alignment, extent), without keeping the tensor alive."""

    __slots__ = ("shape", "_stride", "dtype", "_element_size", "device", "_ptr_mod16", "extent")

    def __init__(self, t: torch.Tensor):
        self.shape, self._stride, self.dtype = tuple(t.shape), tuple(t.stride()), t.dtype
        self._element_size, self.device, self._ptr_mod16 = t.element_size(), t.device, t.data_ptr() % 16
        self.extent = extent_bytes(t)

    def stride(self):
        return self._stride

    def element_size(self):
        return self._element_size

    def data_ptr(self):  # only its alignment is known
        return self._ptr_mod16


def overlapping_input(y, y_extent: int, inputs) -> str | None:
    """The name of an input whose memory range intersects the output's, or None. `inputs`:
    (name, tensor or None, extent in bytes). A kernel writing tiles of y while other programs
    still read those bytes as input would return a wrong result; ranges are compared, so an
    output interleaved with an input in one buffer is refused too."""
    lo = y.data_ptr()
    hi = lo + y_extent
    for name, t, extent in inputs:
        if t is not None and extent:
            p = t.data_ptr()
            if p < hi and lo < p + extent:
                return name
    return None


# ---------------------------------------------------------------------------------------------
# split-K / stream-K arrival counters

_zeroed: dict = {}


def split_k_counters(device: torch.device, device_index: int, n: int) -> torch.Tensor:
    """n int32 zeros for the split-K arrival counters of one launch (the kernel leaves them zero).

    Eagerly: one buffer per (device, stream), reused; launches on one stream run in order, and
    launches on different streams get different buffers. Under graph capture: one buffer per
    (capture, stream), zeroed where the capture first needs it (a memset captured once per graph,
    not once per call: the launches after it on that stream leave it zero), or, where the
    driver cannot name the capture, a fresh zeroed buffer per call; graphs share nothing."""
    return zeroed_buffer(device, device_index, n, torch.int32)


def _driver_capture_info():
    """cuStreamGetCaptureInfo from the CUDA driver (ctypes), or None."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    for name in ("cuStreamGetCaptureInfo_v3", "cuStreamGetCaptureInfo_v2", "cuStreamGetCaptureInfo"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = ctypes.c_int
            return fn
    return None


_capture_info = None
_capture_info_tried = False


def capture_id(stream: int) -> int | None:
    """The driver's id of the graph capture under way on the raw stream `stream` (unique within
    the process), None when it cannot say. (Every version of the call takes the stream, then
    the status and id out-pointers; the optional out-pointers after them are passed as NULL.)"""
    global _capture_info, _capture_info_tried
    import ctypes

    if not _capture_info_tried:
        _capture_info_tried = True
        _capture_info = _driver_capture_info()
    if _capture_info is None:
        return None
    status, ident = ctypes.c_int(0), ctypes.c_ulonglong(0)
    rc = _capture_info(ctypes.c_void_p(stream), ctypes.byref(status), ctypes.byref(ident), None, None, None, None)
    return ident.value if rc == 0 and status.value == 1 else None  # 1: CU_STREAM_CAPTURE_STATUS_ACTIVE


def zeroed_slot(device: torch.device, device_index: int, dtype: torch.dtype):
    """(cache key, capture tag) of the zeroed buffer a launch on the current stream uses: one per
    device, stream and dtype, under graph capture one per capture too (tag: the capture's id, which
    a cached buffer must match); None under a capture the driver cannot name (a fresh buffer)."""
    if device.type != "cuda":
        return (device.type, 0, dtype), None
    stream = torch._C._cuda_getCurrentRawStream(device_index)
    if not capturing():
        return (device_index, stream, dtype), None
    tag = capture_id(stream)
    return None if tag is None else ((device_index, stream, dtype, "capture"), tag)


def zeroed_buffer(device: torch.device, device_index: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """n zeros of dtype that the launch using them leaves zero (split_k_counters' contract: one
    buffer per device, stream and dtype, and per capture under graph capture: zeroed_slot)."""
    slot = zeroed_slot(device, device_index, dtype)
    if slot is None:
        return torch.zeros(n, dtype=dtype, device=device)
    key, tag = slot
    entry = _zeroed.get(key)
    if entry is None or entry[0] != tag or entry[1].numel() < n:
        # under capture the memset is recorded here, once per graph (and where a call needs more)
        entry = _zeroed[key] = (tag, torch.zeros(max(n, 4096), dtype=dtype, device=device))
    return entry[1]


# ---------------------------------------------------------------------------------------------
# the launch machinery


class PlanBase:
    """Launch machinery shared by the plans of the shared kernel.

    A subclass's `_configure(cfg)` derives everything from a config, sets `self.cfg`,
    `self.launch` (a CachedLaunch) and `self.formats` (the (A, B) OperandFormats), and ends with
    `self._bind()`; its `_per_call(direct)` returns the flat function of one call (`direct`: the
    C-launcher parts after the first launch, else None: launch through `self.launch`). `run` is
    the quickest entry point: the regular path until the first launch has compiled the kernel,
    then the flat direct path. With `auto_config` (the config was not the caller's), a config that
    does not fit the device at its first launch is shrunk (config.shrink_config) until it does.
    """

    cuda: bool
    device_index: int
    auto_config: bool

    def _bind(self) -> None:
        self._launch_regular = self._per_call(None)
        self.run = self._call

    def __call__(self, *args):
        return self.run(*args)

    def _call(self, *args):
        return on_device(self.device_index, self._run, *args) if self.cuda else self._run(*args)

    def _run(self, *args):
        try:
            out = self._launch_regular(*args)
        except OutOfResources:
            smaller = shrink_config(self.cfg, *self.formats) if self.auto_config and self.launch.kernel is None else None
            if smaller is None:
                raise
            self._configure(smaller)
            return self._run(*args)
        if self.run == self._call and self.launch.kernel is not None:
            parts = self.launch.direct_parts()
            if parts is not None:
                self.run = self._per_call(parts)
        return out

    def _per_call(self, direct):
        raise NotImplementedError
