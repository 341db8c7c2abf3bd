"""Where gemm_a16w4 runs the Hopper INT4 decode kernel (kernels/gemm_w4_decode.py), and its launch;
then the same for the prefill kernel (kernels/gemm_w4_prefill.py, W4PrefillPlan: 65 to 511 rows, to
1023 on wide layers) and, at the end, for the warp-specialized GEMM with the 4-bit weight as A
(kernels/gemm_ws.py W_FORMAT, W4TilePlan: 512 to 1024 rows where its tiles fill their waves).

The kernel takes decode-sized calls on sm_90 (CUDA, Gluon, GEMMKIT_GLUON not 0): M <= DECODE_MAX_M
rows of bf16 / fp16 x (INT4 groups of 128 or more also from INT4_WIDE_MIN_M to INT4_WIDE_MAX_M rows,
above INT4_WIDE_ANY_MAX_M only on weights of INT4_WIDE_MIN_WEIGHT elements or more, with the WIDE
split), K a multiple of 128, INT4
scale groups of 32, 64 (up to SMALL_DECODE_MAX_M rows), 128 or a multiple of 128 (or one per
channel), or MXFP4 weights with bf16 x (gemm_a16wfp4; up to MX_DECODE_MAX_M rows), no explicit
config. Everything else runs the tl kernel (core/config._derive_packed). Measured with
scripts/w4_decode_sweep.py (tuning/w4_gluon/, 7 Llama-3 layers, weights rotated through 3 copies,
against the tl kernel in the same process): at M = 1 this kernel ran 1.05x to 1.18x the tl kernel
on every layer with one-step loads (w4_decode_sweep_h100.txt); INT4 in groups of 128 at 12 and 16
rows (w4_decode_sweep_short_m12_16_h100.txt, both with graph-captured zeroing once per graph):
1.11x to 1.21x the tl kernel's table picks on the layers of N >= 10240, 0.89x to 1.02x on the others;
with the sums' vector atomics (below; w4_decode_sweep_sums_h100.txt) 1.02x to 1.23x at 9, 12 and 16
rows on every layer of 2^25 weights or more and 0.96x to 0.99x on the smaller Llama-3-8B qkv; with
LONG's 6 programs per SM (below) every layer takes the kernel up to 16 rows (DECODE_MAX_M's comment).
From 17 rows (w4_decode_sweep_wide_int4_h100.txt, WIDE):
1.3x to 2.1x the tl kernel at M = 32 on all 7 layers, 1.05x to 1.28x at M = 64 on the layers of 2^25
weights or more and 0.85x on Llama-3-8B qkv (6144 x 4096). MXFP4 (`--fp4`): 1.3x to 3.0x the tl kernel at 1 to 64 rows (its tl
loop decodes e2m1 in 32-wide groups; the box sweeps with SHORT / LONG, at 64 rows WIDE in
w4_decode_sweep_rows128_fp4_h100.txt); INT4 in groups of 32 (`--group 32`): 1.7x to 3.3x (the tl
kernel's 32-deep decode steps run at 0.77x to 1.0x cuBLAS there), groups of 64 1.24x to 1.45x at M =
1 and 0.99x to 1.32x at M = 16 (w4_decode_sweep_g64_h100.txt).

Its work split (decode_split): K steps of 128; KS steps per slice (x of a slice is staged in shared
memory once per program: the divisor of the step count nearest the split's KS target, as many as the
shared memory holds), SLICES = steps / KS slices, and up to the split's programs per SM, each taking
one slice and every (programs / SLICES)-th weight tile of it (64 rows, one warp group; or 128, two),
its weight loaded BOX_STEPS steps (128 contiguous bytes of each row) per TMA load, the split's
stages of them in flight. Four splits (`--box` sweeps,
tuning/w4_gluon/w4_decode_sweep_box*_h100.txt): SHORT (KS 2, 2 stages, 6 per SM) up to SHORT_MAX_M
rows, SHORT_INT4 (5 per SM) in its place for INT4 groups of 128 or more (below), LONG (KS 4, 2
stages, 6 per SM) from there and for INT4 groups of 128 or more at one row where a layer gives each
SM LONG_WORK or more weight tile-steps of 64 x 128, at two to four rows LONG_WORK_ROWS or more, and
WIDE (KS 8, 2
stages, 1 per SM, 128-row tiles: two warp groups sharing the staged x) for MXFP4 from WIDE_MIN_M
rows and INT4 groups of 128 or more from INT4_WIDE_MIN_M (M = 64: 1.03x to 1.18x LONG, geomean 1.09;
w4_decode_sweep_rows128*_h100.txt: 128-row tiles measured level with LONG at 1 and 16 rows; INT4
from 17 rows: the first paragraph; one program per SM is all
its 160 KB of shared memory allows, and asking for 2 measured the same,
w4_decode_sweep_wide_fp4_h100.txt). Against the one-step loads before (KS 2 or 4, 4 stages, 6 or 4
per SM): INT4 g128 M = 1 1.02x to 1.11x, M = 4 0.98x to 1.13x; MXFP4 and INT4 groups of 32 at M = 1
1.15x to 1.29x that split (KS 2, 4 stages, 6 per SM) with one-step loads. Where a Triton version's
registers hold fewer programs per SM than the split asks, the plan launches fewer
(W4DecodePlan._fit_residency).
LONG was KS 4 with 4 stages and 4 programs per SM, all the shared memory of 4 such programs allows
(x of 4 steps and 4 loads of 8 KB each); with 2 stages 6 fit, and the kernel, bound by its own
decode and tensor-core latencies rather than by loads in flight (BENCHMARKS.md, eleventh session:
with no weight loads at all a 16-row call takes 0.76x to 0.84x its time, a 64-row one all of it),
gains from the extra programs: `--occupancy` (w4_occupancy_*_h100.txt) and `--long-ab`
(w4_long_ab_*_h100.txt): INT4 g128 1.04x to 1.16x at 8 rows on every Llama-3 layer (geomean 1.10),
1.05x / 1.04x at 12 / 16 rows, on the held-out layers 1.06x / 1.02x at 8 / 16 rows (0.97x to 1.18x); MXFP4 1.07x to
1.12x at 8 and 16 rows, 1.01x to 1.05x at 32; INT4 groups of 32 1.04x to 1.12x. At one row the old
LONG_WORK stays (LONG 0.87x to 0.99x SHORT_INT4 below it, `--long-work`, w4_long_work*_h100.txt); from
two rows LONG ran 1.01x to 1.15x SHORT_INT4 (with the finish launch) on the layers of 48 or more
tile-steps per SM (Llama-3-8B down, 70B qkv and o) and 0.85x to 0.99x on the held-out layers under it
(w4_two_rows*_h100.txt, w4_long_work*_h100.txt).

The K slices' sums. Each program adds its tiles' fp32 sums to a zeroed (M, N) buffer by atomics;
then finish_sums, launched as a programmatic dependent of the decode kernel (PDL, kernels/gdc.py;
0.98x to 1.04x a plain launch at M = 1), runs the epilogue; FINISH_HERE = True makes the last program
of each tile group to arrive run it instead (the kernel's docstring; probes and tests).
scripts/w4_overhead_probe.py (w4_overhead_h100.txt) split a sliced call's time: finish_sums and the
gap before it 2.7 to 4 us, of which about 2.3 us was the buffer's zeroing, captured before every
call until the graphs were given one zeroing each (core/plan.zeroed_buffer; capture_zeroing_h100.txt:
1.02x to 1.31x on every sliced INT4 call). The finish launch starts early only where PDL can place
its programs beside the decode kernel's, not where those fill the register file (80 registers x 128
threads x 6 programs): at one row SHORT_INT4's 5 programs per SM ran 1.09x to 1.15x SHORT's 6 with
the finish launch (w4_decode_sweep_short*_h100.txt), and 6 or 7 per SM measured level on the H200
(w4_one_row*_h200.txt). The in-kernel finish was taken at two rows under
SHORT_INT4 until the eleventh session (`--finish`, `--short`, w4_decode_sweep_finish*_h100.txt,
w4_decode_sweep_short*_h100.txt: 1.02x to 1.15x the launch then); measured again with the zeroing
once per graph (`--long-work --m 2 3`, w4_two_rows*_h100.txt) the launch ran 1.00x to 1.13x it on
every layer (geomean 1.04 on the Llama-3 layers, 1.11 on the held-out ones), and under LONG, WIDE
and the other formats' SHORT the launch was faster everywhere before (the in-kernel finish 0.5x to
0.97x, more so the more round trips its epilogue takes). SHORT_INT4 and SHORT from 1 to
SHORT_MAX_M rows (`--short-rows`, w4_decode_sweep_short_rows*_h100.txt: INT4 g128 at 3 and 4 rows
1.0x to 1.09x LONG, 1.14x to 1.16x on the smallest layer with the finish launch, at 8 rows 0.90x to
1.17x; MXFP4 and INT4 groups of 32 at 3 and 4 rows 1.03x to 1.30x on six layers, 0.94x to 1.02x on
Llama-3-70B down).

The sums' layout (`--sums`, w4_decode_sweep_sums*_h100.txt): (M, N) takes one atomic per value
(masked to x's M rows); (N, BM), whole rows of x's BM rows, lets each thread add its two
neighbouring columns in one vector atomic (F32x2) at the price of x's padding rows (zeros; put
back to zero by the finish all the same, in case a NaN scale made them NaN). At M = 16 (no padding)
1.065x (INT4, geomean of 7 layers, 1.0x to 1.21x) and 1.079x (MXFP4); at 12 rows 1.01x, at 9 0.99x;
at 32 rows 1.0x and at 64 0.87x (the finish's reads of the transposed sums are strided by 64 values):
hence SUMS_T_ROWS, 12 to 16.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from .device import DeviceInfo
from .hopper_ws import ws_enabled
from .plan import contiguous_strides, extent_bytes, kernel_tail, on_device, overlapping_input, zeroed_buffer

DECODE_MAX_M = 16  # INT4 groups of 128 or more on every layer up to here: with LONG's 6 programs per SM the
# kernel ran 1.01x to 1.42x the tl kernel at 9 rows on the seven held-out layers under 2^25 weights (geomean 1.15),
# 0.96x to 1.38x at 12 (1.09), 0.98x to 1.38x at 16 (1.09); 4096 x 4096 and 6144 x 4096 level or up to 4% behind
# at 12 and 16 rows: w4_long_ab_int4_small*_h100.txt, w4_long_ab_int4_h100.txt); 1.02x to 1.23x on every layer from
# 2^25 weights before that (w4_decode_sweep_sums_h100.txt)
# INT4 groups of 128 or more from 17 to 64 rows: WIDE, 1.3x to 2.1x the tl kernel's table picks at M = 32
# and 1.05x to 1.28x at M = 64 on the layers from 2^25 weights, 0.85x on the smaller Llama-3-8B qkv
# (6144 x 4096; 1.3x at M = 32) (w4_decode_sweep_wide_int4_h100.txt); on smaller layers 1.16x to 1.68x at 20
# and 32 rows, 0.80x to 1.13x at 48 and 64 (w4_decode_sweep_wide_int4_small_h100.txt)
INT4_WIDE_MIN_M, INT4_WIDE_MAX_M, INT4_WIDE_ANY_MAX_M, INT4_WIDE_MIN_WEIGHT = 17, 64, 32, 1 << 25
MX_DECODE_MAX_M = 64  # MXFP4: 1.3x to 3.0x the tl kernel at M = 1 to 64 on every layer measured
SMALL_GROUPS = (32, 64)  # INT4 groups applied before the product (a thread's values of a step lie in one)
SMALL_DECODE_MAX_M = 16  # groups of 32: 1.7x to 3.3x the tl kernel at M = 1 and 16


@dataclasses.dataclass(frozen=True)
class Split:
    """A work split's knobs: the KS target, weight loads in flight per program, programs per SM,
    weight rows per tile (64: one warp group; 128: two, sharing the program's staged x)."""
    ks_target: int
    stages: int
    per_sm: int
    bn: int = 64


SHORT = Split(ks_target=2, stages=2, per_sm=6)
SHORT_INT4 = Split(ks_target=2, stages=2, per_sm=5)  # INT4 groups >= 128: register room beside them (docstring)
LONG = Split(ks_target=4, stages=2, per_sm=6)
WIDE = Split(ks_target=8, stages=2, per_sm=1, bn=128)
SHORT_MAX_M = 4  # SHORT / SHORT_INT4 up to 4 rows: at 3 and 4 rows 1.0x to 1.16x LONG (INT4 g128), 0.94x to 1.30x
# (MXFP4, INT4 groups of 32), 0.90x to 1.17x at 8 rows (w4_decode_sweep_short_rows*_h100.txt)
WIDE_MIN_M = 33  # MXFP4 from here (64-row x tiles): WIDE
LONG_WORK = 96  # 64 x 128 weight tile-steps per SM from which INT4 g >= 128 takes LONG at one row ...
LONG_WORK_ROWS = 48  # ... and at two to four rows (module docstring)
BOX_STEPS = 2  # K steps per TMA load: 128 contiguous bytes of each of 64 rows
PDL = True  # finish_sums launched as a programmatic dependent of the decode kernel (kernels/gdc.py)
FINISH_HERE = None  # True: the K slices' sums finished in the kernel (probes, tests); None / False: finish_sums
FIN_V = 8  # fp32 values per thread in one round trip of the in-kernel epilogue (FINISH_HERE)
SUMS_T = True  # the sums (N, BM) by vector atomics at SUMS_T_ROWS rows (sums_transposed) ...
SUMS_T_ROWS = range(12, 17)  # ... 16-row x tiles with at most a quarter of padding
BLOCK_N, BLOCK_K = 64, 128
PER_CALL = ("w_desc", "x", "ws", "wz", "y", "bias", "sums", "counters")
SMEM_RESERVE = 1024  # barriers and alignment
FINISH_BLOCK = (16, 128)


@functools.lru_cache(maxsize=1)
def finish_kernel():
    from ..kernels import reduce

    return reduce.finish_sums


@functools.lru_cache(maxsize=None)
def decode_words_layout(bn: int):
    from ..kernels import gemm_w4_decode

    return gemm_w4_decode.words_layout(bn)


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


def slice_steps(steps: int, target: int, max_ks: int | None = None) -> int:
    """KS: the divisor of `steps` nearest `target` (the larger on a tie: fewer slices to sum), at
    most max_ks (what the shared memory holds of x: max_slice_steps)."""
    fits = [d for d in range(1, steps + 1) if steps % d == 0 and (max_ks is None or d <= max_ks)]
    return min(fits, key=lambda d: (abs(d - target), -d))


def x_rows(M: int) -> int:
    """BM: the rows of x per program (wgmma's N), a power of two from 16."""
    return max(16, 1 << (M - 1).bit_length())


def max_slice_steps(bm: int, dev: DeviceInfo, stages: int, bn: int = BLOCK_N) -> int:
    """The most K steps of x (bm rows, 16-bit, and their fp32 sums) that fit in shared memory beside
    `stages` weight loads of bn rows (a prime step count can make the nearest divisor large: 13 steps
    of 64 rows would need 213 KB)."""
    free = dev.smem_per_block - stages * BOX_STEPS * bn * BLOCK_K // 2 - SMEM_RESERVE
    return max(1, free // (bm * (2 * BLOCK_K + 4)))


def decode_sizes_ok(M: int, N: int, K: int, group: int, mxfp4: bool) -> bool:
    """The sizes and scale groups the decode kernel takes (module docstring)."""
    if M < 1 or N < 1 or K < 1 or K % BLOCK_K:
        return False
    if mxfp4:
        return M <= MX_DECODE_MAX_M
    if group in SMALL_GROUPS:
        return M <= SMALL_DECODE_MAX_M
    rows_ok = (M <= DECODE_MAX_M
               or INT4_WIDE_MIN_M <= M <= INT4_WIDE_MAX_M and (M <= INT4_WIDE_ANY_MAX_M or N * K >= INT4_WIDE_MIN_WEIGHT))
    return rows_ok and group_shift(group, K) is not None


def box_steps(ks: int) -> int:
    """K steps per TMA load: the largest power of two up to BOX_STEPS dividing KS."""
    box = 1
    while box * 2 <= BOX_STEPS and ks % (box * 2) == 0:
        box *= 2
    return box


@dataclasses.dataclass(frozen=True)
class DecodeSplit:
    """A call's launch: KS steps per K slice, SLICES slices, programs (a multiple of SLICES), at most
    per_sm programs per SM, `stages` weight loads of `box` steps in flight per program, bn-row tiles."""
    ks: int
    slices: int
    programs: int
    per_sm: int
    stages: int
    box: int
    bn: int


def split_kind(M: int, N: int, K: int, dev: DeviceInfo, group: int, mxfp4: bool) -> Split:
    """SHORT, SHORT_INT4, LONG or WIDE (module docstring)."""
    after_scale = not mxfp4 and group not in SMALL_GROUPS  # INT4 groups of 128 or more
    if (mxfp4 and M >= WIDE_MIN_M) or (after_scale and M >= INT4_WIDE_MIN_M):
        return WIDE
    if M > SHORT_MAX_M:
        return LONG
    work = -(-N // BLOCK_N) * (K // BLOCK_K)
    if not after_scale:
        return SHORT
    return LONG if work >= (LONG_WORK if M == 1 else LONG_WORK_ROWS) * dev.num_sms else SHORT_INT4


def decode_split(M: int, N: int, K: int, dev: DeviceInfo, group: int, mxfp4: bool) -> DecodeSplit:
    """The launch of a call (module docstring, "Its work split")."""
    kind = split_kind(M, N, K, dev, group, mxfp4)
    steps = K // BLOCK_K
    ks = slice_steps(steps, kind.ks_target, max_slice_steps(x_rows(M), dev, kind.stages, kind.bn))
    slices = steps // ks
    programs = slices * max(1, min(-(-N // kind.bn), kind.per_sm * dev.num_sms // slices))
    return DecodeSplit(ks, slices, programs, kind.per_sm, kind.stages, box_steps(ks), kind.bn)


def sums_transposed(M: int) -> bool:
    """Whether the K slices' sums are kept (N, BM), whole rows of x_rows(M) added by vector atomics
    (x's padding rows' zeros with them), rather than (M, N) with one atomic per value: at
    SUMS_T_ROWS rows (module docstring)."""
    return SUMS_T and M in SUMS_T_ROWS


def finish_rounds(split: DecodeSplit, M: int, N: int) -> int:
    """L2 round trips of the in-kernel epilogue (FINISH_HERE): a tile group's M (transposed sums:
    x_rows(M)) x rows sums, FIN_V per thread of its bn // 16 warps at a time."""
    tiles = -(-N // split.bn)
    group_rows = -(-tiles // (split.programs // split.slices)) * split.bn
    rows = x_rows(M) if sums_transposed(M) else M
    return -(-rows * group_rows // (FIN_V * 32 * (split.bn // 16)))


def finish_in_kernel(split: DecodeSplit) -> bool:
    """Whether the last program of each tile group runs the sliced epilogue (no finish_sums launch):
    only where FINISH_HERE asks for it (module docstring: the finish launch measured faster on every
    layer since the launches' zeroing moved to once per graph)."""
    return split.slices > 1 and bool(FINISH_HERE)


SM90_REGISTERS, SM90_SMEM, SM90_THREADS = 65536, 233472, 2048  # per SM; each program also holds 1 KB of shared memory


def resident_programs(registers: int, shared_bytes: int, warps: int) -> int:
    """Programs of `warps` warps an sm_90 SM holds at once (registers allocated per thread in 8s)."""
    regs = -(-max(registers, 24) // 8) * 8
    return min(SM90_REGISTERS // (regs * 32 * warps), SM90_SMEM // (shared_bytes + 1024), SM90_THREADS // (32 * warps))


def pdl_ok() -> bool:
    """Whether finish_sums is launched as a programmatic dependent (this Triton has grid dependency control)."""
    from ..kernels.gdc import PDL_AVAILABLE

    return PDL and PDL_AVAILABLE


def w4_decode_ok(dev: DeviceInfo, x2, w_q, M: int, N: int, K: int, group: int, config, mxfp4: bool = False) -> bool:
    """Whether gemm_a16w4 (gemm_a16wfp4: mxfp4, bf16 x only) takes this call to the decode kernel
    (module docstring): also K-contiguous x and 16-byte aligned weight rows (TMA)."""
    dtypes = (torch.bfloat16,) if mxfp4 else (torch.bfloat16, torch.float16)
    return (config is None and decode_sizes_ok(M, N, K, group, mxfp4) and x2.dtype in dtypes
            and (x2.stride(1) == 1 or K == 1) and w_q.stride(0) % 16 == 0 and w_q.data_ptr() % 16 == 0
            and ws_enabled(dev, x2.device))


def _scales_tail(kernel, per_call: tuple, values: dict, w_scale, w_zero) -> tuple:
    """The 4-bit kernels' arguments after the per-call ones: `values` with the scales' and zero points'
    strides."""
    zn, zk = w_zero.stride() if w_zero is not None else (0, 0)
    return kernel_tail(kernel, per_call, dict(values, stride_sn=w_scale.stride(0), stride_sk=w_scale.stride(1),
                                              stride_zn=zn, stride_zk=zk))


class _W4Plan:
    """What the Hopper 4-bit plans share: the call's facts, run() as the ops' other plans
    (run(x, w_q, bias, y, x_scale (unused), w_scale, ..., w_zero)) on the plan's device, and the output."""

    def _facts(self, x2, w_q, y2, M, N, K, out_dtype, out_shape, flatten_x):
        self.M, self.N, self.K = M, N, K
        self.out_dtype, self.out_shape, self.flatten_x = out_dtype, tuple(out_shape), flatten_x
        self.out_strides = contiguous_strides(self.out_shape)
        self.device = x2.device
        self.device_index = x2.device.index or 0
        self.y_strides = (N, 1) if y2 is None else y2.stride()
        self.x_extent, self.w_extent = extent_bytes(x2), extent_bytes(w_q)
        self.y_extent = 0 if y2 is None else extent_bytes(y2)
        self.tail = None

    def run(self, x, w_q, bias, y, _x_scale, w_scale, *rest):
        return on_device(self.device_index, self._run, x, w_q, bias, y, w_scale, rest[-1] if rest else None)

    __call__ = run

    def _finish_launch(self, sums_strides, bias, activation, pdl: bool):
        """finish_sums over the K slices' fp32 sums (self.sums_rows rows of x, strides sums_strides), as
        self.finish and self.finish_tail; pdl: launched as the kernel's programmatic dependent."""
        from .launcher import CachedLaunch

        grid = (-(-self.sums_rows // FINISH_BLOCK[0]), -(-self.N // FINISH_BLOCK[1]))
        self.finish = CachedLaunch(finish_kernel(), grid, 4, 1, self.device_index, pdl=pdl)
        self.finish_tail = (self.M, self.N, self.sums_rows, *sums_strides, *self.y_strides, bias is not None,
                            activation, *FINISH_BLOCK, pdl)

    def _output(self, x, w_q, y, w_scale, w_zero):
        """(x as (M, K), the output, its (M, N) view), the kernel's tail built on the first call (the
        plan key fixes w_scale's and w_zero's strides); y checked against the inputs' memory."""
        if self.tail is None:
            self.tail = self._tail(w_scale, w_zero)
        if self.flatten_x:
            x = x.reshape(self.M, self.K)
        out = torch.empty_strided(self.out_shape, self.out_strides, dtype=self.out_dtype,
                                  device=self.device) if y is None else y
        c = out.view(self.M, self.N) if len(self.out_shape) != 2 else out
        if y is not None:
            clash = overlapping_input(y, self.y_extent, (("x", x, self.x_extent), ("w_q", w_q, self.w_extent)))
            if clash:
                raise ValueError(f"y shares memory with {clash}: the output must not overlap an input "
                                 "(other programs would still read what one has written)")
        return x, out, c


class W4DecodePlan(_W4Plan):
    """y = activation(x @ dequant(w_q)^T + bias) through w4_decode_kernel, for fixed tensor facts
    (mxfp4: w_q MXFP4 codes, w_scale e8m0). Called like the ops' other plans: run(x, w_q, bias, y,
    x_scale (unused), w_scale, ..., w_zero)."""

    def __init__(self, dev: DeviceInfo, x2, w_q, w_zero, y2, M, N, K, group, bias, activation, out_dtype, out_shape,
                 flatten_x, mxfp4: bool = False):
        from .launcher import CachedLaunch

        self._facts(x2, w_q, y2, M, N, K, out_dtype, out_shape, flatten_x)
        split = decode_split(M, N, K, dev, group, mxfp4)
        self.split, self.num_sms, self.fitted = split, dev.num_sms, False
        self.slices = split.slices
        self.has_zero = w_zero is not None
        self.kernel = decode_kernel()
        self.num_warps = split.bn // 16
        self.launch = CachedLaunch(self.kernel, (split.programs,), self.num_warps, 1, self.device_index)
        from triton.experimental.gluon import language as gl

        from .hopper_ws import _Descriptors

        self.finish_here = finish_in_kernel(split)
        pdl = self.slices > 1 and not self.finish_here and pdl_ok()
        self.groups = split.programs // split.slices
        self.w_desc = _Descriptors((N, K // 8), (w_q.stride(0) // 4, 1), (split.bn, 16 * split.box),
                                   gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
        small = not mxfp4 and group in SMALL_GROUPS
        self.values = dict(M=M, N=N, K=K, SLICES=self.slices, stride_xm=x2.stride(0), STAGES=split.stages,
                           stride_ym=self.y_strides[0], stride_yn=self.y_strides[1],
                           group_shift=0 if mxfp4 or small else group_shift(group, K), BM=x_rows(M), KS=split.ks,
                           FP16=x2.dtype == torch.float16, HAS_ZERO=self.has_zero, HAS_BIAS=bias is not None,
                           ACTIVATION=activation, SLICED=self.slices > 1, MXFP4=mxfp4,
                           GROUP_WORDS=group // 8 if small else 0, BOX=split.box, PDL=pdl, BN=split.bn,
                           WORDS=decode_words_layout(split.bn), FINISH_HERE=self.finish_here,
                           FIN_V=FIN_V, SUMS_T=sums_transposed(M))
        # the sums' rows (x's padding rows too where transposed: they are zeroed with the others)
        self.sums_rows = x_rows(M) if sums_transposed(M) else M
        if self.slices > 1 and not self.finish_here:
            self._finish_launch((1, self.sums_rows) if sums_transposed(M) else (N, 1), bias, activation, pdl)

    def _tail(self, w_scale, w_zero):
        return _scales_tail(self.kernel, PER_CALL, self.values, w_scale, w_zero)

    def _run(self, x, w_q, bias, y, w_scale, w_zero):
        x, out, c = self._output(x, w_q, y, w_scale, w_zero)
        N = self.N
        w_desc = self.w_desc(w_q.view(torch.int32))
        if not self.fitted and self.launch.kernel is not None:
            self._fit_residency()
        if self.slices == 1:
            self.launch((w_desc, x, w_scale, w_zero, c, bias, None, None), self.tail)
            return out
        # (left zero by the launch that finishes them)
        sums = zeroed_buffer(self.device, self.device_index, self.sums_rows * N, torch.float32)
        if self.finish_here:
            counters = zeroed_buffer(self.device, self.device_index, self.groups, torch.int32)
            self.launch((w_desc, x, w_scale, w_zero, c, bias, sums, counters), self.tail)
            return out
        self.launch((w_desc, x, w_scale, w_zero, c, bias, sums, None), self.tail)
        self.finish((sums, c, bias), self.finish_tail)
        return out

    def _fit_residency(self):
        """After the first launch: fewer programs where the compiled kernel's registers or shared
        memory hold fewer per SM than the split's per_sm (they differ between Triton versions:
        Triton 3.6 gives the MXFP4 SHORT kernel 81 registers, 5 programs per SM), so that all run
        at once instead of a second, thin wave. (The program count is a runtime value.)"""
        self.fitted = True
        kernel = self.launch.kernel
        regs, shared = getattr(kernel, "n_regs", 0), getattr(kernel.metadata, "shared", 0)
        if not regs:
            return
        resident = max(1, resident_programs(regs, shared, self.num_warps))
        if resident >= self.split.per_sm:
            return
        tiles = -(-self.N // self.split.bn)
        programs = self.slices * max(1, min(tiles, resident * self.num_sms // self.slices))
        self.launch.grid = (programs, 1, 1)
        self.groups = programs // self.slices


# ---------------------------------------------------------------------------------------------
# prefill sizes: kernels/gemm_w4_prefill.py
#
# W4PrefillPlan: x permuted into the kernels' K order (packed.permute_k_kernel), then the prefill kernel
# (one launch; with K slices finish_sums after it). Measured with scripts/w4_prefill_probe.py against the
# dequantizing route and the tl kernel in the same process (tuning/w4_gluon/w4_prefill_*_h100.txt,
# twelfth session) and with `gemmkit bench` (bench_a16w4_prefill_*): INT4 g128 on the Llama-3 layers at
# M = 128 geomean 1.07x cuBLAS bf16 (the tl kernel 0.70x), at M = 256 0.69x (dequantizing 0.44x); MXFP4
# 1.06x / 0.69x (0.41x at 256 before). Tiles (prefill_tile): 128 weight rows by 256 of x where those
# make a wave of the SMs (the most tensor-core work per decoded step: 1.0x to 1.4x the 128-row x tiles
# from 1024 rows), else 64 by 128 with two programs per SM (at 128 rows 1.1x to 1.8x the 128-row weight
# tiles: one program decodes while the other's product runs, and twice the tiles). K slices
# (prefill_splits) where the tiles fill under PREFILL_SPLIT_BELOW of the programs: at 128 rows 1.1x to
# 1.4x on the layers of N <= 4608 (w4_prefill_narrow_*), at 256 rows slower (the sums' atomics and
# finish cost more than the idle programs; hence 0.3). x's permuting pass reads and writes whole vectors
# (2 to 6 us at 256 rows; its first form's gather loads took 6 to 19 us: w4_prefill_xpass_*). From
# PREFILL_MAX_M + 1 rows the dequantizing route measured level at 512 and up to 1.7x faster from 768 but on
# the widest layers (PREFILL_WIDE_MAX_M), and from 2048 rows faster everywhere (gemm_w4_prefill's
# docstring says what bounds the kernel).

PREFILL_MIN_M, PREFILL_MAX_M = 65, 511  # gemm_a16w4 / gemm_a16wfp4 take the prefill kernel at these rows (where
# w4_prefill_ok; from 512 rows the dequantizing route ran level or faster: BENCHMARKS.md, twelfth session) ...
PREFILL_WIDE_MAX_M, PREFILL_WIDE_WAVES = 1023, 3  # ... and up to here where its 128 x 256 tiles make this many
# waves of the SMs (28672 x 4096 at 512 / 768 / 1024 rows: 1.29x / 1.14x / 1.02x the dequantizing route; 0.91x at
# 2048; layers of fewer tiles 0.55x to 1.04x from 768 rows: w4_prefill_mid_*_h100.txt)
PREFILL_BN = None  # weight rows per tile: 128 (two warp groups, one program per SM) or 64 (one, two per SM);
# None: prefill_tile's rule
PREFILL_PER_SM = {128: 1, 64: 2}
PREFILL_GROUP_M = 8  # x's tile rows per sweep of the weight's tiles
PREFILL_BM = (128, 256)  # x rows per tile (prefill_rows)
PREFILL_MAX_STAGES = 5
PERMUTE_ROWS = 32  # x's rows per program of permute_k_kernel
PREFILL_SPLIT_BELOW = 0.3  # K slices where the tiles fill less of the SMs' programs than this ...
PREFILL_MIN_SLICE_STEPS = 8  # ... each of at least this many 128-deep steps


@functools.lru_cache(maxsize=1)
def prefill_kernel():
    from ..kernels import gemm_w4_prefill

    return gemm_w4_prefill.w4_prefill_kernel


@functools.lru_cache(maxsize=1)
def permute_kernel():
    from ..kernels import packed

    return packed.permute_k_kernel


def _wide_tiles(M: int, N: int) -> int:
    """The prefill kernel's tiles of 128 weight rows by the widest x tile (PREFILL_BM)."""
    return -(-M // max(PREFILL_BM)) * -(-N // 128)


def prefill_sizes_ok(M: int, N: int, K: int, group: int, mxfp4: bool, dev: DeviceInfo) -> bool:
    """The sizes and scale groups the prefill kernel takes: PREFILL_MIN_M to PREFILL_MAX_M rows (to
    PREFILL_WIDE_MAX_M where the 128 x 256 tiles make PREFILL_WIDE_WAVES waves of the SMs), K a multiple of
    128; INT4 groups of 32, 64, 128 * 2^s or one per channel; MXFP4."""
    wide = M <= PREFILL_WIDE_MAX_M and _wide_tiles(M, N) >= PREFILL_WIDE_WAVES * dev.num_sms
    if M < PREFILL_MIN_M or (M > PREFILL_MAX_M and not wide) or N < 1 or K < BLOCK_K or K % BLOCK_K:
        return False
    return mxfp4 or group in SMALL_GROUPS or group_shift(group, K) is not None


def w4_prefill_ok(dev: DeviceInfo, x2, w_q, M: int, N: int, K: int, group: int, config, mxfp4: bool = False) -> bool:
    """Whether gemm_a16w4 (gemm_a16wfp4: mxfp4, bf16 x only) takes this call to the prefill kernel:
    no explicit config, prefill_sizes_ok, 16-byte aligned weight rows (TMA), sm_90 with Gluon."""
    dtypes = (torch.bfloat16,) if mxfp4 else (torch.bfloat16, torch.float16)
    return (config is None and prefill_sizes_ok(M, N, K, group, mxfp4, dev) and x2.dtype in dtypes
            and w_q.stride(0) % 16 == 0 and w_q.data_ptr() % 16 == 0 and ws_enabled(dev, x2.device))


def prefill_rows(M: int, N: int, dev: DeviceInfo, bn: int = 128, per_sm: int = 1) -> int:
    """BM: the rows of x per output tile, the widest of PREFILL_BM (no wider than M) whose (BM x bn)
    tiles make a wave of the SMs' programs (the narrowest where none does): each step's decode then
    feeds the most tensor-core work."""
    held = [bm for bm in PREFILL_BM if _stages_held(bm, bn, per_sm, dev) >= 2 and (bm <= M or bm == min(PREFILL_BM))]
    fits = [bm for bm in held if -(-M // bm) * -(-N // bn) >= dev.num_sms * per_sm]
    return max(fits) if fits else min(held or PREFILL_BM)


def prefill_tile(M: int, N: int, dev: DeviceInfo) -> tuple[int, int, int]:
    """(BM, BN, programs per SM): 128-row weight tiles by 256 rows of x where those tiles make a wave of
    the SMs (the most tensor-core work per decoded step), else 64-row weight tiles by 128 rows of x, two
    programs per SM (more tiles; one program decodes while the other's product runs). PREFILL_BN
    forces the weight tile."""
    bn = PREFILL_BN
    if bn is None:
        bn = 128 if M >= max(PREFILL_BM) and _wide_tiles(M, N) >= dev.num_sms else 64
    per_sm = PREFILL_PER_SM[bn]
    return prefill_rows(M, N, dev, bn, per_sm), bn, per_sm


def prefill_splits(M: int, N: int, K: int, bm: int, bn: int, per_sm: int, dev: DeviceInfo) -> int:
    """K slices: 1 where the tiles fill PREFILL_SPLIT_BELOW of the programs the SMs hold, else the
    largest divisor of the steps that brings the units to at most those programs, each slice at least
    PREFILL_MIN_SLICE_STEPS steps (their fp32 sums meet by atomics, finish_sums stores y)."""
    tiles, slots, steps = -(-M // bm) * -(-N // bn), per_sm * dev.num_sms, K // BLOCK_K
    if tiles >= PREFILL_SPLIT_BELOW * slots:
        return 1
    fits = [d for d in range(1, steps + 1)
            if steps % d == 0 and tiles * d <= slots and steps // d >= PREFILL_MIN_SLICE_STEPS]
    return max(fits, default=1)


def _stages_held(bm: int, bn: int, per_sm: int, dev: DeviceInfo) -> int:
    stage = bn * BLOCK_K // 2 + bm * BLOCK_K * 2
    return (min(dev.smem_per_block, SM90_SMEM // per_sm - 1024) - SMEM_RESERVE) // stage


def prefill_stages(bm: int, bn: int, per_sm: int, dev: DeviceInfo) -> int:
    """Pipeline stages: as many (weight words and x tile) as the shared memory of per_sm programs holds,
    at most PREFILL_MAX_STAGES."""
    return max(2, min(PREFILL_MAX_STAGES, _stages_held(bm, bn, per_sm, dev)))


PREFILL_CALL = ("w_desc", "x_desc", "ws", "wz", "y", "bias", "sums")


class W4PrefillPlan(_W4Plan):
    """y = activation(x @ dequant(w_q)^T + bias) through permute_k_kernel (x into the kernels' K order)
    and w4_prefill_kernel (with K slices, then finish_sums), for fixed tensor facts; called as
    W4DecodePlan."""

    def __init__(self, dev: DeviceInfo, x2, w_q, w_zero, y2, M, N, K, group, bias, activation, out_dtype, out_shape,
                 flatten_x, mxfp4: bool = False):
        from triton.experimental.gluon import language as gl

        from .hopper_ws import _Descriptors
        from .launcher import CachedLaunch

        self._facts(x2, w_q, y2, M, N, K, out_dtype, out_shape, flatten_x)
        self.x_dtype = x2.dtype
        bm, bn, per_sm = prefill_tile(M, N, dev)
        self.splits = prefill_splits(M, N, K, bm, bn, per_sm, dev)
        self.sums_rows = -(-M // 16) * 16  # the K slices' sums (N, sums_rows): x's rows, padded for vector atomics
        units = -(-M // bm) * -(-N // bn) * self.splits
        self.kernel = prefill_kernel()
        self.launch = CachedLaunch(self.kernel, (min(units, per_sm * dev.num_sms),), bn // 16, 1, self.device_index)
        if self.splits > 1:
            self._finish_launch((1, self.sums_rows), bias, activation, False)
        self.permute = CachedLaunch(permute_kernel(), (-(-M // PERMUTE_ROWS), K // BLOCK_K), 4, 1, self.device_index)
        self.permute_tail = (M, K, x2.stride(0), x2.stride(1), PERMUTE_ROWS,
                             M * K >= 2**31 or M * x2.stride(0) >= 2**31)
        self.w_desc = _Descriptors((N, K // 8), (w_q.stride(0) // 4, 1), (bn, 16),
                                   gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
        self.x_desc = _Descriptors((M, K), (K, 1), (bm, BLOCK_K),
                                   gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
        small = not mxfp4 and group in SMALL_GROUPS
        self.values = dict(M=M, N=N, K=K, SPLITS=self.splits, MP=self.sums_rows, SLICED=self.splits > 1,
                           stride_ym=self.y_strides[0], stride_yn=self.y_strides[1],
                           group_shift=0 if mxfp4 or small else group_shift(group, K), BM=bm, BN=bn,
                           STAGES=prefill_stages(bm, bn, per_sm, dev), GROUP_M=PREFILL_GROUP_M,
                           FP16=x2.dtype == torch.float16, HAS_ZERO=w_zero is not None, HAS_BIAS=bias is not None,
                           ACTIVATION=activation, MXFP4=mxfp4, GROUP_WORDS=group // 8 if small else 0,
                           WORDS=decode_words_layout(bn))

    def _tail(self, w_scale, w_zero):
        return _scales_tail(self.kernel, PREFILL_CALL, self.values, w_scale, w_zero)

    def _run(self, x, w_q, bias, y, w_scale, w_zero):
        x, out, c = self._output(x, w_q, y, w_scale, w_zero)
        xp = torch.empty((self.M, self.K), dtype=self.x_dtype, device=self.device)
        self.permute((x, xp), self.permute_tail)
        w_desc, x_desc = self.w_desc(w_q.view(torch.int32)), self.x_desc(xp)
        if self.splits == 1:
            self.launch((w_desc, x_desc, w_scale, w_zero, c, bias, None), self.tail)
            return out
        # (left zero by finish_sums)
        sums = zeroed_buffer(self.device, self.device_index, self.sums_rows * self.N, torch.float32)
        self.launch((w_desc, x_desc, w_scale, w_zero, c, bias, sums), self.tail)
        self.finish((sums, c, bias), self.finish_tail)
        return out


# ---------------------------------------------------------------------------------------------
# The 4-bit weight in the warp-specialized GEMM (kernels/gemm_ws.py, W_FORMAT INT4 / MXFP4): the kernel computes
# y^T = w x^T with the weight as A, a decoder partition writing each K block's values of a tile's weight rows into
# shared memory, where the consumers' products read them as they read x's tiles (W4TilePlan).

TILE_MIN_M, TILE_MAX_M = 512, 1024  # rows at which gemm_a16w4 / gemm_a16wfp4 take W4TilePlan where the prefill kernel
# does not (its wide layers to 1023 rows) ...
TILE_MIN_WAVE_USE = 0.9  # ... and where its tiles fill this share of their waves of the SMs. Against the other routes in
# the same run (scripts/w4_tile_route_stats.py on tuning/w4_tile/w4_tile_route_pairs_*; BENCHMARKS.md, thirteenth
# session): 0.99x to 1.34x them on the 14 problems this rule takes (geomean 1.10), 0.69x to 1.25x on the 19 others
# of 512 to 1024 rows (0.93), 0.60x to 0.96x from 2048 rows (0.85: the dequantizing route's A16W16 GEMM is faster)
TILE_FORCE = None  # (weight rows per tile, x's parts) forced for every W4TilePlan (probes); None: tile_shape


def tile_group_shift(group: int, K: int) -> int | None:
    """The kernel's group_shift for INT4 groups of 64 * 2^s (one group per channel: past every K
    block), 0 for groups of 32 (applied per word), None for groups it does not take."""
    if group == K:
        return 30
    if group == 32:
        return 0
    if group % 64 or (group // 64) & (group // 64 - 1):
        return None
    return (group // 64).bit_length() - 1


def tile_shape(M: int) -> tuple[int, tuple[int, int]]:
    """(weight rows, x's row parts) of a tile: 128 weight rows (two consumer warp groups share each decoded
    K block) by 256 of x's rows (two parts of 128: the most product per decoded value), or 128 / 64 where x
    has no more rows. Tiles of 128 x 128 measured 0.45x to 0.85x the 256-wide ones at 384 to 1024 rows
    (w4_tile_route_*_h100.txt)."""
    if TILE_FORCE is not None:
        return TILE_FORCE
    return 128, (128, 128) if M > 128 else ((128, 0) if M > 64 else (64, 0))


def tile_sizes_ok(M: int, N: int, dev: DeviceInfo) -> bool:
    """TILE_MIN_M to TILE_MAX_M rows where tile_shape's tiles fill TILE_MIN_WAVE_USE of their waves of the SMs."""
    from .hopper_ws import _wave_use

    rows, parts = tile_shape(M)
    tiles = -(-N // rows) * -(-M // sum(parts))
    return TILE_MIN_M <= M <= TILE_MAX_M and _wave_use(tiles, dev.num_sms) >= TILE_MIN_WAVE_USE


def w4_tile_ok(dev: DeviceInfo, x2, w_q, M: int, N: int, K: int, group: int, config, activation: str,
               mxfp4: bool = False) -> bool:
    """Whether gemm_a16w4 (gemm_a16wfp4: mxfp4, bf16 x only) takes this call to the warp-specialized GEMM with
    a 4-bit weight: tile_sizes_ok, no explicit config, no activation, K a multiple of 64, INT4 groups of 32,
    64 * 2^s or one per channel (or MXFP4), x and the packed weight TMA-addressable, sm_90 with Gluon."""
    from .hopper_ws import _tma_operand

    dtypes = (torch.bfloat16,) if mxfp4 else (torch.bfloat16, torch.float16)
    return (config is None and activation == "none" and N >= 1 and tile_sizes_ok(M, N, dev) and K >= 64
            and K % 64 == 0 and x2.dtype in dtypes and (mxfp4 or tile_group_shift(group, K) is not None)
            and _tma_operand(x2) and w_q.stride(1) == 1 and w_q.stride(0) % 16 == 0 and w_q.data_ptr() % 16 == 0
            and ws_enabled(dev, x2.device))


class W4TilePlan(_W4Plan):
    """y = x @ dequant(w_q)^T + bias through gemm_ws_kernel with the 4-bit weight as A (y^T = w x^T, stored
    through y's strides swapped); with K slices (hopper_ws.ws_splits on the kernel's problem) their fp32
    partials go to a workspace in y's orientation and hopper_ws's sum_k_slices adds them. Called as
    W4DecodePlan. tiles: (weight rows, x's row parts) forced."""

    def __init__(self, dev: DeviceInfo, x2, w_q, w_scale, w_zero, y2, M, N, K, group, bias, out_dtype, out_shape,
                 flatten_x, mxfp4: bool = False, tiles=None):
        from triton.experimental.gluon import language as gl

        from . import hopper_ws as hw
        from .launcher import CachedLaunch

        self._facts(x2, w_q, y2, M, N, K, out_dtype, out_shape, flatten_x)
        rows, (n0, n1) = tiles or tile_shape(M)
        self.rows, self.parts = rows, (n0, n1)
        block_k = hw.ROW_BYTES // x2.element_size()
        op = hw._gl_dtype(x2.dtype)

        def x_desc(r):
            return hw._Descriptors((M, K), (x2.stride(0), 1), (r, block_k),
                                   gl.NVMMASharedLayout.get_default_for([r, block_k], op))

        self.a_desc = hw._Descriptors((N, K // 8), (w_q.stride(0) // 4, 1), (rows, block_k // 8),
                                      gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
        self.b0_desc = x_desc(n0)
        self.b1_desc = x_desc(n1) if n1 else self.b0_desc
        # descriptors the kernel does not read (no x scales, pointer stores)
        self.xs_desc = hw.unused_descriptor((hw.BLOCK,), torch.float32, gl.NVMMASharedLayout(
            swizzle_byte_width=0, element_bitwidth=32, rank=1), self.device)
        self.c_desc = hw.unused_descriptor((hw.HALF, 64), torch.float32, gl.NVMMASharedLayout.get_default_for(
            [hw.HALF, 64], gl.float32), self.device)
        self.splits = hw.ws_splits(N, M, K, dev.num_sms, n0 + n1, block_k, rows)
        sw = 8 if mxfp4 or group == 32 else 1
        ring = 2 * rows * sw * (x2.element_size() if mxfp4 else 8)  # (INT4: two rings of int32 pairs)
        # the transposed stores' layout conversion: a (64, part) fp32 tile per consumer warp group for fp32 outputs
        # (the K slices' partials), a few KB for 16-bit ones (codegen checks: 29 KB and 2.6 KB)
        fp32_out = self.splits > 1 or out_dtype == torch.float32
        convert = rows * max(n0, n1) * 4 if fp32_out else 4096
        stages = hw.ws_stages(n0 + n1, 0, 0, rows, extra=rows * hw.ROW_BYTES // 4, fixed=ring + convert)
        self.split_rows = -(-M // 16) * 16  # a K slice's rows in the workspace (never the constant 1)
        if self.splits > 1:  # in y's orientation: the kernel's columns are the workspace's rows
            self.slices = hw.KSlices(M, N, self.splits, self.split_rows, self.y_strides, bias is not None, self.device,
                                     self.device_index)
            self.ws_shape, self.n_pad = self.slices.shape, self.slices.n_pad
            c_strides = (1, self.n_pad)
        else:
            c_strides = (self.y_strides[1], self.y_strides[0])
        zn, zk = w_zero.stride() if w_zero is not None else (0, 0)
        self.kernel = hw.gluon_kernel().gemm_ws_kernel
        self.tail = kernel_tail(self.kernel, hw.PER_CALL, dict(
            M=N, N=M, K=K, splits=self.splits, split_rows=self.split_rows if self.splits > 1 else 0, xs_group_stride=0,
            stride_cm=c_strides[0], stride_cn=c_strides[1], stride_asm=0, stride_ask=0,
            stride_bsn=w_scale.stride(0), stride_bsk=w_scale.stride(1), stride_bzn=zn, stride_bzk=zk,
            group_shift=0 if mxfp4 else tile_group_shift(group, K), up_scale_offset=0, batch=1, a_batch_rows=N,
            b_batch_rows=0, c_batch_rows=0, bias_batch_stride=0, GROUP_M=hw.GROUP_M, STAGES=stages, SCALES=2,
            XS_TMA=False, PROMOTE=False, TWO=n1 > 0, HAS_BIAS=bias is not None and self.splits == 1, C_TMA=False,
            GATED=False, ACTIVATION="none", SHARE_C=False, GROUPS=rows // hw.HALF, W_FORMAT=2 if mxfp4 else 1,
            HAS_ZERO=w_zero is not None, SW=sw, C_T=False, **hw.NO_EXPERTS))
        self.stages = stages
        units = hw._tiles(N, M, rows, n0 + n1) * self.splits
        self.launch = CachedLaunch(self.kernel, (min(units, dev.num_sms),), 4, 1, self.device_index)

    def arguments(self, x, w_q, c, bias, w_scale, w_zero) -> tuple:
        """The kernel's per-call arguments (hopper_ws.PER_CALL) for these tensors (c: y, or the K slices'
        workspace)."""
        xd = self.b0_desc(x)
        xd1 = self.b1_desc(x) if self.b1_desc is not self.b0_desc else xd
        return (self.a_desc(w_q.view(torch.int32)), xd, xd1, self.xs_desc, c, self.c_desc, self.c_desc, bias, None,
                w_scale, w_zero, None, None, None, None, None)

    def _tail(self, w_scale, w_zero):
        return self.tail

    def _run(self, x, w_q, bias, y, w_scale, w_zero):
        x, out, c = self._output(x, w_q, y, w_scale, w_zero)
        if self.splits == 1:
            self.launch(self.arguments(x, w_q, c, bias, w_scale, w_zero), self.tail)
            return out
        ws = self.slices.workspace()
        self.launch(self.arguments(x, w_q, ws, None, w_scale, w_zero), self.tail)
        self.slices.finish(ws, c, bias)
        return out
