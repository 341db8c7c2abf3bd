"""The one place where gemmkit works around Triton CPU-interpreter defects (``TRITON_INTERPRET=1``).

Kernels stay untouched; the fixes patch the interpreter itself, once, and only when it is active.
The library applies them before its first interpreted launch, so tests, the CPU demo and users
all get the same behaviour.

Fixed here:
- ``tl.dot`` on bf16 operands: the interpreter holds bf16 as uint16 and multiplies the raw integers
  (triton 3.6 and 3.9). We widen bf16 bit patterns to float32 exactly before the product.
"""

from __future__ import annotations

import numpy as np

from .device import interpreter_active

_applied = False


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def apply_interpreter_fixes() -> None:
    """Install the fixes if the interpreter is active; idempotent and cheap after the first call."""
    global _applied
    if _applied or not interpreter_active():
        return
    import triton.language as tl
    from triton.runtime import interpreter as interp

    original_dot = interp.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            a_data = _bf16_bits_to_f32(a.data) if a.dtype.scalar == tl.bfloat16 else a.data.astype(np.float32)
            b_data = _bf16_bits_to_f32(b.data) if b.dtype.scalar == tl.bfloat16 else b.data.astype(np.float32)
            out = np.matmul(a_data, b_data, dtype=np.float32).astype(d.data.dtype) + d.data
            return interp.TensorHandle(out, d.dtype.scalar)
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    interp.InterpreterBuilder.create_dot = create_dot
    _applied = True
