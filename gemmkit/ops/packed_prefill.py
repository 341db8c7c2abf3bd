"""The prefill route of the 4-bit weight ops (gemm_a16w4, gemm_a16wfp4).

From DEQUANT_MIN_M rows on, decoding the packed weight in the K loop costs more than the
tensor-core work it feeds (each weight tile is decoded once per tile-row of x), so a call with
no explicit config dequantizes the weight to x's dtype in one memory-bound pass
(kernels/packed.py dequantize_kernel: reads 4 bits, writes 16 bits per weight) and runs the A16W16
GEMM on it; vLLM's AWQ path switches the same way. An explicit `config` always runs the fused
kernel with that config. On sm_90 the Hopper prefill kernel (core/hopper_w4.W4PrefillPlan) takes
the calls from 65 to 511 rows (to 1023 on wide layers) first: decoding in registers for the tensor cores, it ran 1.6x this
route at 256 rows; from 512 rows this route measured level or faster (BENCHMARKS.md, twelfth session).
"""

from __future__ import annotations

import torch

from ..core.device import interpreter_active
from ..core.launcher import CachedLaunch
from ..core.plan import PlanCache, plan_key
from .a16w16 import gemm_a16w16

DEQUANT_MIN_M = 256


class DequantizeLaunch:
    """One launch of kernels/packed.py dequantize_kernel for packed weights with the facts of the
    example tensors (a plan key pins them): w (N, K // 2) uint8; INT4 scales (N, K // group) and
    uint8 zero points or None (8), or MXFP4 uint8 e8m0 scales (N, K // 32). Call (w, w_scale,
    w_zero) -> the (N, K) `dtype` weight. Through Triton the first time, directly after (core/launcher)."""

    def __init__(self, w, w_scale, w_zero, group: int, int4: bool, dtype: torch.dtype):
        from ..kernels.packed import dequantize_kernel  # (after the interpreter choice, as every kernel)

        N, K = w.shape[0], 2 * w.shape[1]
        group = group if int4 else 32
        sub = min(128, group)
        s_sn, s_sk = w_scale.stride()
        z_sn, z_sk = (0, 0) if w_zero is None else w_zero.stride()
        one_group = w_scale.shape[1] == 1  # per channel: stride 0 along K
        self.shape, self.dtype, self.device = (N, K), dtype, w.device
        self.launch = CachedLaunch(dequantize_kernel, (-(-N // 128), -(-K // sub)), 4, 3, w.device.index or 0)
        self.tail = (N, K, w.stride(0), s_sn, 0 if one_group else s_sk, z_sn, 0 if one_group else z_sk, K,
                     128, sub, group, int4, w.is_cuda and not interpreter_active(), K % sub == 0, N * K >= 2**31)

    def __call__(self, w, w_scale, w_zero) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        if out.numel():
            self.launch((w, w_scale, w_zero, out), self.tail)
        return out


_launches = PlanCache(256)


def dequantize_packed(w, w_scale, w_zero, group: int, int4: bool, dtype: torch.dtype) -> torch.Tensor:
    """(N, K) `dtype` weight of a packed 4-bit (N, K // 2) uint8 `w`: INT4 ((q - z) * s, scales
    (N, K // group), uint8 zero points or None for 8) or MXFP4 (uint8 e8m0 scales (N, K // 32)). Its launch
    is kept per facts of the tensors (the backward of the frozen 4-bit ops: gemmkit.autograd)."""
    key = plan_key((w, w_scale, w_zero), (group, int4, dtype))
    return _launches.plan_for(key, DequantizeLaunch, w, w_scale, w_zero, group, int4, dtype)(w, w_scale, w_zero)


class DequantThenGemm:
    """A plan of the prefill route for weights with the facts of the example tensors:
    run(x, w, bias, y, a_scale, b_scale, ..., b_zero) as DensePlan.run."""

    def __init__(self, w, w_scale, w_zero, group: int, int4: bool, dtype: torch.dtype, activation,
                 out_dtype: torch.dtype):
        self.dequantize = DequantizeLaunch(w, w_scale, w_zero, group, int4, dtype)
        self.activation, self.out_dtype = activation, out_dtype

    def run(self, x, w, bias, y, a_scale=None, b_scale=None, mul=None, add=None, c2=None, b2=None, cat_src=None,
            b_zero=None):
        return gemm_a16w16(x, self.dequantize(w, b_scale, b_zero), bias, activation=self.activation,
                           out_dtype=self.out_dtype, y=y)
