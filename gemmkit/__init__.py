"""gemmkit: Triton GEMM kernels for NVIDIA Hopper, with tuned configs, tests and benchmarks.

Public names are imported lazily: the Triton kernels are defined on first use, after the caller
had the chance to choose the CPU interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

from .registry import OPS as _OPS

_EXPORTS = {
    **{name: entry.module for name, entry in _OPS.items()},
    "GemmConfig": "gemmkit.core.config",
    "select_config": "gemmkit.core.config",
    "device_info": "gemmkit.core.device",
    "align_rows": "gemmkit.core.rows",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in ("quant", "ops", "core", "tools", "moe", "nn", "autograd", "library"):
        return importlib.import_module(f"gemmkit.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gemmkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
