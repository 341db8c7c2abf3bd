"""Where gemm_a16w4 runs the Hopper INT4 decode kernel (kernels/gemm_w4_decode.py), and its launch.

The kernel takes decode-sized calls on sm_90 (CUDA, Gluon, GEMMKIT_GLUON not 0): M <= DECODE_MAX_M
rows of bf16 / fp16 x (from 3 rows only K <= LONG_K), K a multiple of 128, INT4 scale groups of 32,
64, 128 or a multiple of 128 (or one per channel), or MXFP4 weights with bf16 x (gemm_a16wfp4; up to
MX_DECODE_MAX_M rows), no explicit config. Everything else runs the tl kernel
(core/config._derive_packed). scripts/w4_decode_sweep.py (tuning/w4_gluon/w4_decode_sweep_h100.txt,
7 layers, weights rotated through 3 copies): at M = 1 this kernel ran 1.05x to 1.18x the tl kernel
on every layer, at M = 4 0.96x to 1.12x (the 0.96 at K = 28672), at M = 16 0.87x to 1.09x (it
stays with the tl kernel there). MXFP4 (`--fp4`, w4_decode_sweep_fp4_h100.txt): 1.4x to 1.9x the tl
kernel at M = 1, 4 and 16 on every layer (its tl loop decodes e2m1 in 32-wide groups, 8 steps of a
256-deep tile), 1.2x to 1.6x at M = 32 and 1.3x to 2.3x at M = 64 (w4_decode_sweep_fp4_m32_64_h100.txt,
where the tl kernel reads 0.35 to 0.55 TB/s); KS_TARGET 4 there (MX_KS_TARGET). INT4 in groups of 32
(`--group 32`, w4_decode_sweep_g32_h100.txt): 1.9x to 2.8x the tl kernel at M = 1, 4 and 16 (the tl
kernel's 32-deep decode steps run at 0.77x to 1.0x cuBLAS there), groups of 64 (`--group 64`,
w4_decode_sweep_g64_h100.txt) 1.24x to 1.45x at M = 1 and 0.99x to 1.32x at M = 16: up to
SMALL_DECODE_MAX_M rows. From WIDE_M rows the sweeps' best split was longer slices and fewer
programs (groups of 32 / 64 at M = 16: KS 8 and 4 per SM, 10% to 30% faster than KS 2 and 6 per SM;
MXFP4 at 16 to 64 rows: KS 4, 4 per SM).

Its work split (decode_split): K steps of 128; KS steps per slice (x of a slice is staged in shared
memory once per program: the divisor of the step count nearest KS_TARGET, MX_KS_TARGET for MXFP4,
WIDE_KS_TARGET from WIDE_M rows, as many as the shared memory holds), SLICES = steps / KS slices, and
PROGRAMS_PER_SM (WIDE_PROGRAMS_PER_SM from WIDE_M rows) programs per SM, each taking one slice and
every (programs / SLICES)-th 64-row weight tile of it.
"""

from __future__ import annotations

import functools

import torch

from .device import DeviceInfo
from .hopper_ws import ws_enabled
from .plan import _get_device, contiguous_strides, extent_bytes, kernel_tail, overlapping_input, zeroed_buffer

DECODE_MAX_M = 4
LONG_K = 16384  # from 3 rows, K up to this (8192 x 28672 at M = 4: 0.96x the tl kernel)
MX_DECODE_MAX_M = 64  # MXFP4: 1.2x to 2.3x the tl kernel at M = 1 to 64 on every layer measured
KS_TARGET = 2
MX_KS_TARGET = 4
WIDE_M = 5  # from here (MXFP4, INT4 groups of 32 / 64): fewer, longer programs
WIDE_KS_TARGET = 8  # INT4 groups of 32 / 64 from WIDE_M rows (MXFP4 keeps MX_KS_TARGET)
WIDE_PROGRAMS_PER_SM = 4
SMALL_GROUPS = (32, 64)  # INT4 groups applied before the product (a thread's values of a step lie in one)
SMALL_DECODE_MAX_M = 16  # groups of 32: 1.9x to 2.8x the tl kernel at M = 1, 4 and 16
PROGRAMS_PER_SM = 6
BLOCK_N, BLOCK_K = 64, 128
PER_CALL = ("w_desc", "x", "ws", "wz", "y", "bias", "sums")
STAGES = 4  # 4 KB of packed weight per stage (8 measured slower)
SMEM_RESERVE = 1024  # barriers and alignment
FINISH_BLOCK = (16, 128)


@functools.lru_cache(maxsize=1)
def finish_kernel():
    from ..kernels import reduce

    return reduce.finish_sums


@functools.lru_cache(maxsize=1)
def decode_kernel():
    from ..kernels import gemm_w4_decode

    return gemm_w4_decode.w4_decode_kernel


def group_shift(group: int, K: int) -> int | None:
    """log2(group / 128) for groups of 128 * 2^s, a shift past every step for one group per
    channel (group == K), else None (groups this kernel does not take)."""
    if group == K:
        return 30
    if group % BLOCK_K or (group // BLOCK_K) & (group // BLOCK_K - 1):
        return None
    return (group // BLOCK_K).bit_length() - 1


def slice_steps(steps: int, target: int | None = None, max_ks: int | None = None) -> int:
    """KS: the divisor of `steps` nearest `target` (KS_TARGET; the larger on a tie: fewer slices to
    sum), at most max_ks (what the shared memory holds of x: max_slice_steps)."""
    target = KS_TARGET if target is None else target
    fits = [d for d in range(1, steps + 1) if steps % d == 0 and (max_ks is None or d <= max_ks)]
    return min(fits, key=lambda d: (abs(d - target), -d))


def x_rows(M: int) -> int:
    """BM: the rows of x per program (wgmma's N), a power of two from 16."""
    return max(16, 1 << (M - 1).bit_length())


def max_slice_steps(bm: int, dev: DeviceInfo) -> int:
    """The most K steps of x (bm rows, 16-bit, and their fp32 sums) that fit in shared memory beside
    the weight stages (a prime step count can make the nearest divisor large: 13 steps of 64 rows
    would need 213 KB)."""
    free = dev.smem_per_block - STAGES * BLOCK_N * BLOCK_K // 2 - SMEM_RESERVE
    return max(1, free // (bm * (2 * BLOCK_K + 4)))


def decode_sizes_ok(M: int, N: int, K: int, group: int, mxfp4: bool) -> bool:
    """The sizes and scale groups the decode kernel takes (module docstring)."""
    if M < 1 or N < 1 or K < 1 or K % BLOCK_K:
        return False
    if mxfp4:
        return M <= MX_DECODE_MAX_M
    if group in SMALL_GROUPS:
        return M <= SMALL_DECODE_MAX_M
    return M <= DECODE_MAX_M and (M <= 2 or K <= LONG_K) and group_shift(group, K) is not None


def decode_split(M: int, N: int, K: int, dev: DeviceInfo, mxfp4: bool) -> tuple[int, int, int, int]:
    """(KS, SLICES, programs, programs per SM at most) of a call (module docstring, "Its work split")."""
    steps = K // BLOCK_K
    wide = M >= WIDE_M
    target = MX_KS_TARGET if mxfp4 else WIDE_KS_TARGET if wide else KS_TARGET
    ks = slice_steps(steps, target, max_slice_steps(x_rows(M), dev))
    slices = steps // ks
    per_sm = WIDE_PROGRAMS_PER_SM if wide else PROGRAMS_PER_SM
    return ks, slices, slices * max(1, min(-(-N // BLOCK_N), per_sm * dev.num_sms // slices)), per_sm


def w4_decode_ok(dev: DeviceInfo, x2, w_q, M: int, N: int, K: int, group: int, config, mxfp4: bool = False) -> bool:
    """Whether gemm_a16w4 (gemm_a16wfp4: mxfp4, bf16 x only) takes this call to the decode kernel
    (module docstring): also K-contiguous x and 16-byte aligned weight rows (TMA)."""
    dtypes = (torch.bfloat16,) if mxfp4 else (torch.bfloat16, torch.float16)
    return (config is None and decode_sizes_ok(M, N, K, group, mxfp4) and x2.dtype in dtypes
            and (x2.stride(1) == 1 or K == 1) and w_q.stride(0) % 16 == 0 and w_q.data_ptr() % 16 == 0
            and ws_enabled(dev, x2.device))


class W4DecodePlan:
    """y = activation(x @ dequant(w_q)^T + bias) through w4_decode_kernel, for fixed tensor facts
    (mxfp4: w_q MXFP4 codes, w_scale e8m0). Called like the ops' other plans: run(x, w_q, bias, y,
    x_scale (unused), w_scale, ..., w_zero)."""

    def __init__(self, dev: DeviceInfo, x2, w_q, w_zero, y2, M, N, K, group, bias, activation, out_dtype, out_shape,
                 flatten_x, mxfp4: bool = False):
        from .launcher import CachedLaunch

        self.M, self.N, self.K = M, N, K
        self.out_dtype, self.out_shape, self.flatten_x = out_dtype, tuple(out_shape), flatten_x
        self.out_strides = contiguous_strides(self.out_shape)
        self.device = x2.device
        self.device_index = x2.device.index or 0
        ks, self.slices, programs, _ = decode_split(M, N, K, dev, mxfp4)
        self.has_zero = w_zero is not None
        self.y_strides = (N, 1) if y2 is None else y2.stride()
        self.kernel = decode_kernel()
        self.launch = CachedLaunch(self.kernel, (programs,), 4, 1, self.device_index)
        from triton.experimental.gluon import language as gl

        from .hopper_ws import _Descriptors

        self.w_desc = _Descriptors((N, K // 8), (w_q.stride(0) // 4, 1), (BLOCK_N, 16),
                                   gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
        small = not mxfp4 and group in SMALL_GROUPS
        self.values = dict(M=M, N=N, K=K, SLICES=self.slices, stride_xm=x2.stride(0), STAGES=STAGES,
                           stride_ym=self.y_strides[0], stride_yn=self.y_strides[1],
                           group_shift=0 if mxfp4 or small else group_shift(group, K), BM=x_rows(M), KS=ks,
                           FP16=x2.dtype == torch.float16, HAS_ZERO=self.has_zero, HAS_BIAS=bias is not None,
                           ACTIVATION=activation, SLICED=self.slices > 1, MXFP4=mxfp4,
                           GROUP_WORDS=group // 8 if small else 0)
        if self.slices > 1:
            self.finish = CachedLaunch(finish_kernel(), (-(-M // FINISH_BLOCK[0]), -(-N // FINISH_BLOCK[1])), 4, 1,
                                       self.device_index)
            self.finish_tail = (M, N, *self.y_strides, bias is not None, activation, *FINISH_BLOCK)
        self.tail = None
        self.x_extent, self.w_extent = extent_bytes(x2), extent_bytes(w_q)
        self.y_extent = 0 if y2 is None else extent_bytes(y2)

    def _tail(self, w_scale, w_zero):
        zn, zk = w_zero.stride() if w_zero is not None else (0, 0)
        return kernel_tail(self.kernel, PER_CALL, dict(self.values, stride_sn=w_scale.stride(0),
                                                        stride_sk=w_scale.stride(1), stride_zn=zn, stride_zk=zk))

    def run(self, x, w_q, bias, y, _x_scale, w_scale, *rest):
        if _get_device() != self.device_index:  # launches go to the current device
            with torch.cuda.device(self.device_index):
                return self._run(x, w_q, bias, y, w_scale, rest[-1] if rest else None)
        return self._run(x, w_q, bias, y, w_scale, rest[-1] if rest else None)

    def _run(self, x, w_q, bias, y, w_scale, w_zero):
        M, N = self.M, self.N
        if self.tail is None:  # (w_scale's and w_zero's strides: the plan key fixes them)
            self.tail = self._tail(w_scale, w_zero)
        if self.flatten_x:
            x = x.reshape(M, self.K)
        out = torch.empty_strided(self.out_shape, self.out_strides, dtype=self.out_dtype,
                                  device=self.device) if y is None else y
        c = out.view(M, N) if len(self.out_shape) != 2 else out
        if y is not None:
            clash = overlapping_input(y, self.y_extent, (("x", x, self.x_extent), ("w_q", w_q, self.w_extent)))
            if clash:
                raise ValueError(f"y shares memory with {clash}: the output must not overlap an input "
                                 "(other programs would still read what one has written)")
        w_desc = self.w_desc(w_q.view(torch.int32))
        if self.slices == 1:
            self.launch((w_desc, x, w_scale, w_zero, c, bias, None), self.tail)
            return out
        sums = zeroed_buffer(self.device, self.device_index, M * N, torch.float32)  # (finish_sums leaves it zero)
        self.launch((w_desc, x, w_scale, w_zero, c, bias, sums), self.tail)
        self.finish((sums, c, bias), self.finish_tail)
        return out

    __call__ = run
