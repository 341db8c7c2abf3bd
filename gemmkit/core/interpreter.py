"""The one place where gemmkit works around Triton CPU-interpreter defects (``TRITON_INTERPRET=1``).

Kernels stay untouched; the fixes patch the interpreter itself, once, and only when it is active.
The library applies them before its first interpreted launch, so tests, the CPU demo and users
all get the same behaviour.

Fixed here (seen in triton 3.6; 3.9 has the first two as well):
- ``tl.dot`` on bf16 operands: the interpreter holds bf16 as uint16 and multiplies the raw
  integers. We widen bf16 bit patterns to float32 exactly before the product.
- Float downcasts to fp8: the interpreter's round-to-nearest drops the mantissa carry (it is ORed
  into the exponent's low bit), so some values lose up to half their magnitude. Downcasts to bf16
  truncate, where GPUs round to nearest even. Both now go through torch's exact conversions;
  fp8 saturates to the largest finite value, as the GPU's ``cvt.rn.satfinite`` does.
- Arithmetic on bf16 values (``+ - * /``): the interpreter applies numpy's integer ops to the
  uint16 bit patterns. We widen both sides to float32 exactly, compute, and round to nearest even
  as the GPU's bf16 instructions do.
- ``tl.maximum`` / ``tl.minimum`` on floats (default ``propagate_nan``): numpy's maximum keeps a
  NaN operand, the GPU's ``max.f32`` / ``min.f32`` return the other one (as the interpreter's own
  ``tl.max`` reduction, ``np.nanmax``, already does). Now ``np.fmax`` / ``np.fmin``, so absolute
  maxima skip NaNs on both.
"""

from __future__ import annotations

import numpy as np
import torch

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

    # storage dtype of the interpreter (numpy) and the torch dtype of the same bits
    torch_of = {
        tl.float32: (np.float32, torch.float32, None),
        tl.float16: (np.float16, torch.float16, None),
        tl.bfloat16: (np.uint16, torch.bfloat16, None),
        tl.float8e4nv: (np.uint8, torch.float8_e4m3fn, 448.0),
        tl.float8e5: (np.uint8, torch.float8_e5m2, 57344.0),
    }
    fixed_targets = (tl.bfloat16, tl.float8e4nv, tl.float8e5)

    def exact_downcast(data: np.ndarray, src, dst) -> np.ndarray:
        src_np, src_torch, _ = torch_of[src]
        dst_np, dst_torch, sat = torch_of[dst]
        t = torch.from_numpy(np.ascontiguousarray(data).view(src_np).copy()).view(src_torch).to(torch.float32)
        if sat is not None:
            t = t.clamp(-sat, sat)  # NaN stays NaN
        out = t.to(dst_torch)
        return out.view({1: torch.uint8, 2: torch.int16}[out.element_size()]).numpy().view(dst_np)

    def wants_fix(src, dst_type, rounding_mode=None) -> bool:
        dst = dst_type.scalar
        return (dst in fixed_targets and src.dtype.scalar in torch_of and src.dtype.scalar != dst
                and rounding_mode != interp._ir.ROUNDING_MODE.RTZ)

    original_fp_to_fp = interp.InterpreterBuilder.create_fp_to_fp
    original_cast = interp.InterpreterBuilder.cast_impl
    original_dot = interp.InterpreterBuilder.create_dot

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if wants_fix(src, dst_type, rounding_mode):
            return interp.TensorHandle(exact_downcast(src.data, src.dtype.scalar, dst_type.scalar), dst_type.scalar)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    def cast_impl(self, src, dst_type):
        if wants_fix(src, dst_type):
            return interp.TensorHandle(exact_downcast(src.data, src.dtype.scalar, dst_type.scalar), dst_type.scalar)
        return original_cast(self, src, dst_type)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            a_data = _bf16_bits_to_f32(a.data) if a.dtype.scalar == tl.bfloat16 else a.data.astype(np.float32)
            b_data = _bf16_bits_to_f32(b.data) if b.dtype.scalar == tl.bfloat16 else b.data.astype(np.float32)
            out = np.matmul(a_data, b_data, dtype=np.float32).astype(d.data.dtype) + d.data
            return interp.TensorHandle(out, d.dtype.scalar)
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def bf16_binary(np_op, original):
        def op(self, lhs, rhs):
            if lhs.dtype.scalar == tl.bfloat16:
                out = np_op(_bf16_bits_to_f32(lhs.data), _bf16_bits_to_f32(rhs.data))
                return interp.TensorHandle(exact_downcast(out, tl.float32, tl.bfloat16), tl.bfloat16)
            return original(self, lhs, rhs)
        return op

    for name, np_op in (("create_fadd", np.add), ("create_fsub", np.subtract), ("create_fmul", np.multiply),
                        ("create_fdiv", np.divide), ("create_precise_divf", np.divide)):
        setattr(interp.InterpreterBuilder, name, bf16_binary(np_op, getattr(interp.InterpreterBuilder, name)))
    interp.InterpreterBuilder.create_maxnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmax)
    interp.InterpreterBuilder.create_minnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmin)
    interp.InterpreterBuilder.create_fp_to_fp = create_fp_to_fp
    interp.InterpreterBuilder.cast_impl = cast_impl
    interp.InterpreterBuilder.create_dot = create_dot
    _applied = True
