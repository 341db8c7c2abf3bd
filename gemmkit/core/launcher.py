"""Kernel launches: through Triton the first time, directly afterwards.

`kernel[grid](...)` re-binds and re-specializes every argument, rebuilds its cache key, computes
launch metadata and asks the driver, for every tensor, which device its pointer lives on. On the
H100 machine's host that costs more than a decode-sized GEMM (see README, "Host cost"). gemmkit
launches through Triton once per plan (a set of shapes, strides, dtypes, devices and pointer
alignments: everything Triton specializes on) and then calls the compiled kernel directly with
raw pointers.
"""

from __future__ import annotations

import torch

from .device import interpreter_active
from .interpreter import apply_interpreter_fixes


_runtime_knobs = None


def launch_hooks():
    """Triton's launch-enter hook holder (knobs.runtime)."""
    global _runtime_knobs
    if _runtime_knobs is None:
        from triton import knobs

        _runtime_knobs = knobs.runtime
    return _runtime_knobs


def hook_set(knobs_runtime) -> bool:
    """True while a profiler (e.g. proton) hooks kernel launches: then launch the regular way."""
    hook = knobs_runtime.launch_enter_hook
    return bool(getattr(hook, "calls", hook))  # a HookChain in triton >= 3.5, else a callable or None


def profiling_hooks_active() -> bool:
    return hook_set(launch_hooks())


def launch_jit(fn, grid, args, num_warps: int, num_stages: int, pdl: bool = False):
    """Launch a @triton.jit function the regular way; returns the compiled kernel (None when
    interpreted). `args`: every parameter in signature order, tensors as tensors. pdl: launch it
    as a programmatic dependent of the kernel before it on the stream (kernels/gdc.py; CUDA)."""
    if interpreter_active():
        apply_interpreter_fixes()
        fn[grid](*args, num_warps=num_warps, num_stages=num_stages)
        return None
    if pdl:
        return fn[grid](*args, num_warps=num_warps, num_stages=num_stages, launch_pdl=True)
    return fn[grid](*args, num_warps=num_warps, num_stages=num_stages)


def launch_compiled(kernel, grid, args, device_index: int) -> None:
    """Launch a compiled kernel on the current stream. `args` as for `launch_jit`, except that
    pointers may be raw ints (data_ptr()). The caller guarantees that `args` has the
    specialization the kernel was compiled for."""
    kernel.run(
        grid[0], grid[1], grid[2], torch._C._cuda_getCurrentRawStream(device_index),
        kernel.function, kernel.packed_metadata, None, None, None, *args,
    )


def _direct_launch(kernel):
    """(kernel, C launch function, leading args) to call Triton's C launcher without its Python wrapper, or None
    where the kernel needs what the wrapper adds (scratch memory) or this Triton lays it out
    differently (then `launch_compiled` is used)."""
    run = kernel.run
    try:
        if run.global_scratch_size or run.profile_scratch_size:
            return None
        lead = (run.launch_cooperative_grid, run.launch_pdl, None, None, kernel.packed_metadata, None, None, None)
        return kernel, run.launch, lead
    except AttributeError:
        return None


def launch_direct(direct, grid, args, device_index: int) -> None:
    """`launch_compiled` through the C launcher alone; `direct` from `_direct_launch`."""
    kernel, launch, lead = direct
    launch(grid[0], grid[1], grid[2], torch._C._cuda_getCurrentRawStream(device_index), kernel.function, *lead, *args)


_Tensor = torch.Tensor


class CachedLaunch:
    """One kernel launch of fixed specialization (the caller's plan key guarantees it): the first
    call goes through Triton, compiling if needed; later calls launch the compiled kernel directly
    with raw pointers (ints: the launcher then skips its per-pointer driver query). Called with
    `head` (the leading parameters: tensors, None or descriptors) and `tail` (the rest: ints,
    bools, strings), together every parameter of `fn` in order."""

    __slots__ = ("fn", "grid", "num_warps", "num_stages", "device_index", "kernel", "direct", "pointers", "pdl")

    def __init__(self, fn, grid, num_warps: int, num_stages: int, device_index: int, pdl: bool = False):
        self.fn, self.num_warps, self.num_stages, self.device_index = fn, num_warps, num_stages, device_index
        self.pdl = pdl  # launched as a programmatic dependent (launch_jit)
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.kernel = self.direct = None
        self.pointers = ()  # which leading parameters are tensors (the same for every call)

    @property
    def ready(self) -> bool:
        """True when the next call launches directly (never under the interpreter)."""
        return self.kernel is not None and not profiling_hooks_active()

    def direct_parts(self):
        """(C launch function, grid x, y, z, kernel function, leading launcher args) for callers
        that assemble the arguments themselves after the first launch: `launch(gx, gy, gz,
        stream, function, *lead, *args)`. None before the first launch, under the interpreter, or
        where this Triton needs its Python wrapper."""
        if self.direct is None:
            return None
        kernel, launch, lead = self.direct
        return (launch, *self.grid, kernel.function, lead)

    def __call__(self, head, tail) -> None:
        if self.ready:
            args = (*[a.data_ptr() if p else a for a, p in zip(head, self.pointers)], *tail)
            if self.direct is not None:
                launch_direct(self.direct, self.grid, args, self.device_index)
            else:
                launch_compiled(self.kernel, self.grid, args, self.device_index)
        else:
            pdl = {"pdl": True} if self.pdl else {}
            self.kernel = launch_jit(self.fn, self.grid, (*head, *tail), self.num_warps, self.num_stages, **pdl)
            self.pointers = tuple(isinstance(a, _Tensor) for a in head)
            self.direct = _direct_launch(self.kernel) if self.kernel is not None else None
