"""Host side of the warp-specialized Gluon kernel (kernels/gemm_ws.py, sm_90).

`ws_plan(...)` returns a plan for the problems where that kernel measured faster than the shared
tl kernel on the H100 (BENCHMARKS.md, "Promoting FP8 GEMM, warp-specialized" and "Fitted tile
widths"), else None and the op builds its DensePlan as before:
- CUDA device of compute capability 9.0, Triton with Gluon, no interpreter, GEMMKIT_GLUON not "0";
- the library's own config (a caller's `config` is a tl config: it always gets the tl kernel);
- no activation (bias and every output dtype are handled);
- x and w K-contiguous with 16-byte aligned rows and bases (TMA descriptors);
- sizes where it measured faster: promoting FP8 (block scales, fast_accum=False) by ws_shape_ok
  (M >= WS_MIN_M, K >= WS_MIN_K, half a wave of 128 x 128 tiles, a third with block scales, and no
  thin second wave; fewer tiles favour the tl kernel's split-K / stream-K); the tensor cores'
  own accumulation (bf16 / fp16, FP8 fast accumulation) by ws_direct_ok, in tiles of 128 rows
  and the width ws_parts fits to the SMs' waves; batched with M per entry that 128-row tiles pad, swapped
  operands where x's rows as fitted tile widths pad less (ws_batched_swap).
Block-scaled (SCALES_KBLOCK): x_scale's 128 values of a tile and K block come by TMA with the
stage when x_scale is column-major with a group stride of a multiple of 4 and a 16-byte aligned
base (as quantize_fp8_blockwise(scale_layout="col") and DeepGEMM's TMA-aligned layout store it);
any other layout is read with register loads in the K loop.
"""

from __future__ import annotations

import functools
import os

import torch

from .device import DeviceInfo
from .plan import contiguous_strides, extent_bytes, kernel_tail, on_device, overlapping_input

WS_MIN_M = 256
WS_MIN_K = 512
GLUON_ENV = "GEMMKIT_GLUON"
BLOCK = 128  # tile rows (two warp groups of 64), FP8 K block (= the scale group), promoting tile columns
HALF = 64
ROW_BYTES = 128  # one K block of a tile row: BLOCK_K = 64 bf16 / fp16, 128 FP8
SMEM_BYTES = 232448  # sm_90's shared memory per block (opt-in maximum)
SMEM_RESERVE = 1024  # the barriers and the buffers' alignment (6 stages of 128 x 128 beside the
# output buffers needed 312 bytes more than SMEM_BYTES: gemmkit.tools.codegen's checks)
MAX_STAGES = 8  # (5 measured 3% slower for FP8 at M = 512 and 2048: tuning/fitted/ws_stages_h100.txt)
NARROW_BF16_MIN_M = 256
BF16_ANY_WIDTH_M = 1024
BF16_WAVE_M = 384  # bf16 / fp16 from this many rows: this kernel where its tiles fill BF16_WAVE_USE of their
BF16_WAVE_USE = 0.9  # waves, or make one or two waves BF16_FEW_WAVES_USE full (ws_direct_ok)
BF16_FEW_WAVES_USE = 0.8
# column parts (N0, N1) of the widths fitted tiles take: each a power of two with its own product
WIDTHS = ((64, 0), (64, 16), (64, 32), (128, 0), (128, 16), (128, 32), (128, 64), (128, 128))
PART_COST = 64  # per-tile work of a K block that does not scale with its width (the 128-row A tile), in columns
DIRECT_MIN_K = 1024
MIN_SLICE_K_BLOCKS = 4
REDUCE_BLOCK = (32, 128)
FITTED_GAIN = 0.85  # bf16 / fp16: ws_direct_ok's threshold
GROUP_M = 8
PER_CALL = ("a_desc", "b0_desc", "b1_desc", "xs_desc", "c", "c0_desc", "c1_desc", "bias", "a_scale",
            "b_scale", "b_zero", "expert_offsets", "a_src", "a_rows", "c_rows", "row_weights")  # the kernel's leading
# parameters
# the kernel's 4-bit weight arguments (kernels/gemm_ws.py W_FORMAT; core/hopper_w4.W4TilePlan) for the dense plans
DENSE_W = dict(stride_bzn=0, stride_bzk=0, group_shift=0, W_FORMAT=0, HAS_ZERO=False, SW=1)
# the kernel's expert-map arguments where there is none (kernels/gemm_ws.py EXPERTS; GroupedWSPlan)
NO_EXPERTS = dict(num_experts=1, bs_batch_stride=0, EXPERTS=0, stride_am=0, A_GATHER=False, C_SCATTER=False,
                  ROW_WEIGHTS=False)
C_TMA = True  # 16-bit outputs stored by TMA from shared memory (off: pointer stores; scripts/ws_probe.py --no-c-tma)
SHARE_C = True  # 128 x (128 + 128) tiles: one output buffer per warp group for both parts, a stage more
RAGGED_C_TMA = True  # batched, M not a multiple of the tiles' rows: TMA stores of the rows inside an entry
RAGGED_BATCHED = True  # batched with such M on this kernel (else the tl kernel)
SWAP_BATCHED = True  # batched with such M: x's rows as the tiles' columns where that pads less (ws_batched_swap)
SWAP_GAIN = 1.0


@functools.lru_cache(maxsize=1)
def gluon_kernel():
    """The Gluon module (kernels/gemm_ws.py), or None where Triton has no usable Gluon."""
    try:
        from ..kernels import gemm_ws
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    except Exception:  # noqa: BLE001 - any Triton without this Gluon API: the tl kernel serves
        return None
    return gemm_ws if TensorDescriptor is not None else None


def _tma_operand(t: torch.Tensor) -> bool:
    """A (rows, K) operand a TMA descriptor can address: K-contiguous, 16-byte aligned."""
    return (t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
            and t.stride(0) >= t.shape[1])


def ws_shape_ok(M: int, N: int, K: int, num_sms: int, kblock: bool) -> bool:
    """The problem sizes for which the promoting kernel measured faster than the tl kernel
    (scripts/ws_probe.py --any-size, tuning/ws/ws_any*_h100.txt, tuning/fitted/ws_split_*_h100.txt):
    M >= WS_MIN_M, K >= WS_MIN_K, not a thin second wave of 128 x 128 tiles (up to a quarter of the
    SMs: one tile more for a few programs, which the tl kernel's stream-K splits; 0.79x / 1.09x
    at 136 tiles) and, without block scales, at least half a wave (at M = 256: 1.05x to 1.45x
    the tl kernel from 72 tiles up; at 64 tiles 0.90x to 0.97x, in K slices 0.85x to 0.97x).
    Block-scaled tiles that fill less than half of the SMs run in K slices (ws_splits): 1.10x
    to 1.33x the tl kernel at M = 256 on the DeepSeek-V3 layers (34 to 64 tiles), whose promoting
    K loop loses more to its scale loads."""
    tiles = -(-M // BLOCK) * -(-N // BLOCK)
    enough = kblock or 2 * tiles >= num_sms
    return M >= WS_MIN_M and K >= WS_MIN_K and enough and not num_sms < tiles <= num_sms + num_sms // 4


def _wave_use(tiles: int, num_sms: int) -> float:
    """The share of the SMs' tile slots that `tiles` fill over their waves."""
    return tiles / (-(-tiles // num_sms) * num_sms)


def ws_block_n(M: int, N: int, num_sms: int, kblock: bool) -> int:
    """Tile columns: without block scales 256 (two 128-wide products per K block and warp group:
    half the B traffic per product of the 128-wide tile; 1.02x to 1.10x faster at M = 1024 and
    4096 with TMA stores, tuning/ws/ws_exact_bn*_h100.txt) where such tiles fill 90% of a wave
    or more and their waves fill at least 90% of what 128-wide tiles' do (1024 x 6144: 192 tiles
    of 256 ran 0.83x the 384 of 128), else 128. Block-scaled tiles stay 128 wide: at 256 the
    scaled promotion of two accumulators spilled (ptxas: 968 bytes of spill stores) and ran 2.5x
    slower."""
    tiles_m = -(-M // BLOCK)
    wide, narrow = tiles_m * -(-N // 256), tiles_m * -(-N // BLOCK)
    if kblock or 10 * wide < 9 * num_sms or _wave_use(wide, num_sms) < 0.9 * _wave_use(narrow, num_sms):
        return BLOCK
    return 256


def _tiles(M: int, N: int, rows: int, width: int) -> int:
    """The rows x width tiles of an M x N output."""
    return -(-M // rows) * -(-N // width)


def _wave_cost(M: int, N: int, parts: tuple[int, int], num_sms: int, rows: int = BLOCK, batch: int = 1) -> float:
    """The time of the waves of rows x (N0 + N1) tiles (of `batch` M x N problems) over the SMs, a 128-row
    tile's time taken as its width plus PART_COST, a 64-row tile's as half of that."""
    width = parts[0] + parts[1]
    return -(-batch * _tiles(M, N, rows, width) // num_sms) * (width + PART_COST) * rows // BLOCK


def _widths(fp8: bool, M: int) -> tuple:
    """The tile widths the kernel without promotion takes: all for FP8; bf16 / fp16 tiles
    narrower than 128 from NARROW_BF16_MIN_M rows (with STAGES capped at 5 they measured no
    faster than the tl kernel's, 0.77x to 1.25x, geomean 0.96 at M = 256 and 512:
    tuning/fitted/ws_any_a16w16_heldout_h100.txt; with up to 8 stages 96-wide tiles ran 1.05x
    to 1.15x it on the narrow held-out layers at M = 512: tuning/fitted/ws_stages_h100.txt)."""
    return WIDTHS if fp8 or M >= NARROW_BF16_MIN_M else tuple(p for p in WIDTHS if p[0] >= BLOCK)


def ws_parts(M: int, N: int, num_sms: int, fp8: bool) -> tuple[int, int]:
    """Column parts (N0, N1) of the tiles without promotion: the width whose waves of 128-row
    tiles over the SMs take the least time (_wave_cost), the widest on ties. As cuBLAS's sm_90
    kernels do (tiles 144 to 320 wide on the held-out layers at M = 512 to 2048:
    tuning/fitted/cublas_kernels_*_h100.txt), a width that fills one wave beats a power of two
    that leaves a ragged second: at M = 512, N = 5120, 128 tiles of 160 against 160 of 128."""
    return min(_widths(fp8, M), key=lambda p: (_wave_cost(M, N, p, num_sms), -(p[0] + p[1])))


ROWS64 = True  # tiles of 64 rows where they fill the SMs' waves better (ws_tiles)
ROWS64_MIN_M = {False: 256, True: 128}  # by fp8
# widths of 64-row tiles: (N0, N1); bf16 / fp16 tiles of 64 x 64 measured 0.88x to 0.93x the
# default plan at M = 128 and 256 (tuning/fitted/ws_rows64_bf16_h100.txt)
ROWS64_WIDTHS = {False: ((64, 16), (64, 32), (128, 0), (128, 32), (128, 64)),
                 True: ((64, 0), (64, 16), (64, 32), (128, 0), (128, 32), (128, 64), (128, 128))}
ROWS64_GAIN = 0.9
ROWS64_GAIN_BF16_LARGE = (1024, 0.97)  # bf16 from this many rows: under 0.97x
ROWS64_BF16_MIN_USE = 0.55  # bf16: below, the tl kernel's split-K (or K slices) serves the 128-row tiles


RAGGED_RULE = True  # bf16 / fp16, M not a multiple of 128: ws_ragged_tiles
RAGGED_MIN_M = 96
RAGGED_ROWS64_PENALTY = 0.85
RAGGED_SWAP_PENALTY = 1.05


def _ragged(M: int, K: int, fp8: bool) -> bool:
    """bf16 / fp16 problems whose M the 128-row tiles pad (RAGGED_MIN_M <= M < BF16_ANY_WIDTH_M), K >= DIRECT_MIN_K:
    ws_ragged_tiles decides them."""
    return RAGGED_RULE and not fp8 and M % BLOCK != 0 and RAGGED_MIN_M <= M < BF16_ANY_WIDTH_M and K >= DIRECT_MIN_K


def ws_ragged_tiles(M: int, N: int, num_sms: int, swap_ok: bool = True) -> tuple[int, tuple[int, int], bool]:
    """(rows, column parts, swapped) of a bf16 / fp16 problem with M not a multiple of 128 (_ragged): of 128-row
    tiles (ws_parts' width), 64-row tiles (ROWS64_WIDTHS) and swapped operands (x's rows as the columns of 128-row
    weight tiles, any of WIDTHS; y's rows a multiple of 16 elements), the one whose waves take the least time
    (_wave_cost; the 64-row tiles' divided by RAGGED_ROWS64_PENALTY: one consumer warp group keeps the tensor
    cores less busy; the swapped ones' times RAGGED_SWAP_PENALTY: their epilogue stores by pointers; ties: 128
    rows, then 64, then swapped). On 40 problems of 200 to 1000 rows (not multiples
    of 128) x 8 layers (scripts/dense_swap_probe.py, tuning/ragged/dense_swap2_h100.txt) its picks' measured ratios
    make 0.895x cuBLAS against 0.906 for the best timed route per problem and 0.856 for the rule before it, whose
    tl kernel and 64-row tiles ran as low as 0.56x (300 x 2560 x 8192 -> 0.82x); the 64-row penalty fitted there
    (0.8 to 0.9 within 0.2%, 0.75 2% lower). At 100 to 170 rows (24 problems, dense_swap_ranges_h100.txt) 0.935
    against 0.869 (best 0.954); from 1024 rows (1300, 2500) the rule before it (the Gluon kernel's 128- or 64-row
    tiles) was as good as any of the three: not taken there. The swapped tiles add 0.3% over the 64 problems
    (0.909 against 0.906 without them; penalties 1.0 to 1.1 alike), their wins large (300 x 8192 x 8192 0.79x ->
    0.85x, 777 x 6144 x 4096 0.81x -> 0.86x), a loss where their cost came within 3% (900 x 7168 x 8192: 0.72x
    against 0.82x before; ragged_rule_heldout_d0d71b8_h100.txt): hence 1.05. (These geomeans:
    scripts/ragged_summary.py, tuning/ragged/ragged_summary.txt.)"""
    p128 = ws_parts(M, N, num_sms, False)
    p64 = min(ROWS64_WIDTHS[False], key=lambda p: (_wave_cost(M, N, p, num_sms, HALF), -(p[0] + p[1])))
    options = [(_wave_cost(M, N, p128, num_sms), 0, (BLOCK, p128, False)),
               (_wave_cost(M, N, p64, num_sms, HALF) / RAGGED_ROWS64_PENALTY, 1, (HALF, p64, False))]
    if swap_ok and N % 16 == 0:  # (the transposed tiles' 16-byte stores along y's rows)
        psw = min(WIDTHS, key=lambda p: (_wave_cost(N, M, p, num_sms), -(p[0] + p[1])))
        options.append((_wave_cost(N, M, psw, num_sms) * RAGGED_SWAP_PENALTY, 2, (BLOCK, psw, True)))
    return min(options)[2]


def ws_tiles(M: int, N: int, num_sms: int, fp8: bool) -> tuple[int, tuple[int, int]]:
    """(rows, column parts) of the tiles without promotion: 128 rows at ws_parts' width, or 64 rows
    (one consumer warp group), as cuBLAS's 64-row kernels on narrow layers (96 x 64 tiles at
    512 x 1280 x 8192: tuning/fitted/cublas_kernels_bf16_h100.txt), from ROWS64_MIN_M rows where
    such tiles' waves take under ROWS64_GAIN of the 128-row pick's time (_wave_cost;
    bf16 from 1024 rows under 0.97x) and fill the SMs at least as well (bf16: where the 128-row
    tiles use ROWS64_BF16_MIN_USE of the SMs or more). Fitted on scripts/ws_rows_probe.py's runs
    (tuning/fitted/ws_rows64_*_h100.txt): on the held-out layers at M = 128 to 2048 the problems it
    takes at 0.9x ran 1.03x to 1.17x the default plan (bf16, 11; 512 x 2560 x 8192: 0.78x -> 0.91x
    cuBLAS) and 0.98x to 1.38x (FP8, 16); on the tuned models' layers at M = 128 to 4096 0.98x to
    1.09x (bf16, 7) and 0.97x to 1.30x (FP8, 40). The 0.97x of bf16 from 1024 rows adds 11
    problems of models.json's layers at 1.02x to 1.18x (N = 4608, 7168, 14336 at M = 1024 and 2048:
    2048 x 7168 x 16384 0.82x -> 0.86x cuBLAS); at 256 and 512 rows it lost up to 0.92x on N >= 28672
    (ws_rows64_ab_gain097_bf16_a7bf7e9_h100.txt). bf16 / fp16 with M not a multiple of 128: ws_ragged_tiles
    (the tiles it would take if not swapped)."""
    if _ragged(M, DIRECT_MIN_K, fp8):
        return ws_ragged_tiles(M, N, num_sms, swap_ok=False)[:2]
    parts = ws_parts(M, N, num_sms, fp8)
    if not ROWS64 or M < ROWS64_MIN_M[fp8]:
        return BLOCK, parts
    use = _wave_use(_tiles(M, N, BLOCK, parts[0] + parts[1]), num_sms)
    if not fp8 and use < ROWS64_BF16_MIN_USE:
        return BLOCK, parts
    best = min(ROWS64_WIDTHS[fp8], key=lambda p: (_wave_cost(M, N, p, num_sms, HALF), -(p[0] + p[1])))
    use64 = _wave_use(_tiles(M, N, HALF, best[0] + best[1]), num_sms)
    gain = ROWS64_GAIN_BF16_LARGE[1] if not fp8 and M >= ROWS64_GAIN_BF16_LARGE[0] else ROWS64_GAIN
    if _wave_cost(M, N, best, num_sms, HALF) < gain * _wave_cost(M, N, parts, num_sms) and use64 >= use:
        return HALF, best
    return BLOCK, parts


def ws_direct_ok(M: int, N: int, K: int, num_sms: int, fp8: bool) -> bool:
    """The problem sizes for which the kernel without promotion measured faster than the tl kernel
    (scripts/ws_probe.py --any-size, tuning/fitted/ws_any_*_h100.txt): M >= WS_MIN_M,
    K >= DIRECT_MIN_K and, for bf16, a fitted width (ws_parts) whose waves take at most
    FITTED_GAIN of the time of the best power-of-two width's: where a power of two fits as well,
    the tl kernel's tuned tiles ran as fast or faster (0.83x to 1.01x; at M = 512 and 2048 on the
    held-out layers the kernel everywhere and the tl kernel everywhere both measured 0.923x
    cuBLAS, ws_any_a16w16_heldout_512_2048_h100.txt). FP8 at any width: 0.92x to 1.67x the tl
    kernel at M = 512 (ws_any_a8w8_heldout_h100.txt), 0.94x to 1.43x at M = 1024 to 8192 on the
    model and held-out layers (geomean 1.03 and 1.04: ws_any_a8w8_*_large_h100.txt), 0.96x to
    1.74x at M = 256, in K slices where the tiles are few (ws_split_heldout_h100.txt). From 128
    rows up to WS_MIN_M, both types, where the tl kernel's 64 x 128 tiles (bf16: derive_config's
    one_wave rule) make more than a wave: at M = 128 1.02x to 1.32x the tl kernel for bf16 (N >=
    9216; with fewer tiles 0.61x to 0.98x), 1.00x to 1.60x for FP8 (7 layers, geomean 1.14; with
    fewer tiles 0.86x to 1.00x, geomean 0.94, on 21: ws_split_heldout_h100.txt). bf16 at any
    width from BF16_ANY_WIDTH_M rows, with SHARE_C's fourth stage for 256-wide tiles: on the
    held-out layers at M = 1024 / 2048 / 8192 1.06x / 1.02x / 1.02x the tl kernel (256-wide tiles
    0.91x to 1.11x; ws_any_a16w16_heldout_share_c_h100.txt), on the model layers at M = 4096 0.99x
    to 1.26x (1.05x; ws_share_c_h100.txt, where without SHARE_C 256-wide tiles ran 0.95x to 1.03x).
    And wherever ws_tiles takes 64-row tiles (K >= DIRECT_MIN_K), and bf16 / fp16 with M not a multiple of 128
    rows from RAGGED_MIN_M (ws_ragged_tiles). bf16 / fp16 from BF16_WAVE_M rows where the 128-row tiles at
    ws_parts' width fill BF16_WAVE_USE of their waves, or make one or two waves at least BF16_FEW_WAVES_USE full: on the 56
    layers of the tuned and held-out models at M = 512 (scripts/ws_rows_probe.py --ab --knob FITTED_GAIN=1.0,
    tuning/fitted/fitted_gain_ab_h100.txt) those ran 0.97x to 1.67x the tl kernel's tuned or derived tiles
    (512 x 4096 x 7168: 0.57x -> 0.95x cuBLAS, 512 x 3584 x 18944 0.76x -> 0.87x), the others (several waves under
    0.9 full: N = 28672, 51200, 14336) 0.87x to 1.03x; at M = 256 the kernel everywhere ran 0.83x to 1.06x the rule
    (geomean 0.95): not taken there. At M = 512 to 896 (--knob BF16_WAVE_M=100000, wave_rule_ab_h100.txt) the 110
    problems it moves ran 0.97x to 1.83x (geomean 1.07); one wave of 98 tiles (0.74 full) 0.82x to 1.15x: hence
    BF16_FEW_WAVES_USE. At M = 384 (--knob BF16_WAVE_M=384 against 512, wave_rule_384_ab_h100.txt) the 20 problems
    it moves ran 0.93x to 1.62x (geomean 1.08; the 56 layers 0.894 -> 0.916x cuBLAS). The kernel everywhere from 384
    rows (--knob BF16_WAVE_USE=0.0, wave_use0_ab_h100.txt): 1.7 to 1.8 waves 0.85 full ran 0.97x to 1.34x the tl
    kernel (768 x 7168 x 16384: 0.65x -> 0.84x cuBLAS, a table entry of 1024 rows), more waves under 0.9 full 0.87x to
    1.10x (N = 28672 at 384 and 512 rows 0.87x to 0.96x but once): hence two waves."""
    if _ragged(M, K, fp8):
        return True
    if K >= DIRECT_MIN_K and ws_tiles(M, N, num_sms, fp8)[0] == HALF:
        return True
    if BLOCK <= M < WS_MIN_M and K >= DIRECT_MIN_K:
        return -(-M // HALF) * -(-N // BLOCK) > num_sms
    if M < WS_MIN_M or K < DIRECT_MIN_K:
        return False
    if fp8 or M >= BF16_ANY_WIDTH_M:
        return True
    parts = ws_parts(M, N, num_sms, fp8)
    if M >= BF16_WAVE_M:
        tiles = _tiles(M, N, BLOCK, parts[0] + parts[1])
        use = _wave_use(tiles, num_sms)
        if use >= BF16_WAVE_USE or (tiles <= 2 * num_sms and use >= BF16_FEW_WAVES_USE):
            return True
    fitted = _wave_cost(M, N, parts, num_sms)
    return fitted <= FITTED_GAIN * min(_wave_cost(M, N, p, num_sms) for p in _widths(fp8, M) if p[1] in (0, p[0]))


def ws_splits(M: int, N: int, K: int, num_sms: int, block_n: int, block_k: int, rows: int = BLOCK) -> int:
    """K slices per tile: where the rows x block_n tiles fill less than half of the SMs, as many as
    the SMs hold (each at least MIN_SLICE_K_BLOCKS K blocks deep), summed by a second kernel
    (kernels/reduce.py sum_k_slices); else 1."""
    tiles = _tiles(M, N, rows, block_n)
    k_blocks = -(-K // block_k)
    if 2 * tiles > num_sms:
        return 1
    splits = max(1, min(num_sms // tiles, k_blocks // MIN_SLICE_K_BLOCKS))
    return -(-k_blocks // -(-k_blocks // splits))  # (no empty slice)


@functools.lru_cache(maxsize=1)
def reduce_kernels():
    """kernels/reduce.py (its sum_k_slices adds the K slices' partials), imported once."""
    from ..kernels import reduce

    return reduce


GATED_WIDTHS = (64, 128)
GATED_MIN_M = 128
GATED_PART_COST = 16  # (in columns) fitted to tuning/gated_ws/gated_ws_probe_h100.txt


def ws_gated_width(M: int, N: int, num_sms: int) -> int:
    """Columns W of the gated tiles (128 rows x W gate + W up columns). One row of tiles (M <= 128,
    weight-bound): 64, more programs streaming the weights (faster on 8 of 10 layers, at most 3%
    slower on the others). Else the width whose waves take the least time, a tile's time taken as
    2W + GATED_PART_COST, the wider on ties: of the 50 problems of M >= 256 in
    tuning/gated_ws/gated_ws_probe_h100.txt it picks the faster width, or one within 2%, on 48 (e.g.
    1024 x 7168 x 8192: 7 waves of 64 in 353 us against 4 of 128 in 393; PART_COST = 64, the
    ungated kernel's fit, picked the slower one on 9), the other two within 4% (1024 x 13824 x
    5120, where the same 128-wide plan also timed 397 us against 450 in that run)."""
    if M <= BLOCK:
        return GATED_WIDTHS[0]

    def cost(w):
        tiles = -(-M // BLOCK) * -(-N // w)
        return -(-tiles // num_sms) * (2 * w + GATED_PART_COST)

    return min(GATED_WIDTHS, key=lambda w: (cost(w), -w))


def ws_gated_ok(M: int, N: int, K: int, num_sms: int) -> bool:
    """The gated problems (N: the intermediate size) this kernel takes: M >= GATED_MIN_M and
    K >= DIRECT_MIN_K. On 10 MLP shapes (7 held out) x M in 128..4096 (scripts/gated_ws_probe.py,
    tuning/gated_ws/gated_ws_probe_h100.txt), at the width ws_gated_width picks, it ran 0.98x
    to 1.90x the tl kernel's gated GEMM (geomean 1.33: the tl gated tiles are not persistent,
    their two accumulators and two B tiles leave no room) and faster than the two-GEMM form
    (ops/fused._gated_two_gemms) at every problem."""
    return M >= GATED_MIN_M and K >= DIRECT_MIN_K


def ws_enabled(dev: DeviceInfo, device: torch.device) -> bool:
    """The warp-specialized kernel can run here (sm_90 CUDA, Gluon, not disabled by GEMMKIT_GLUON=0)."""
    return (device.type == "cuda" and not dev.interpreter and tuple(dev.capability) == (9, 0)
            and os.environ.get(GLUON_ENV, "1") != "0" and gluon_kernel() is not None)


# bf16 / fp16 problems the kernel would take but for an operand that is not K-contiguous (the backward's
# dy @ w and dy.T @ x: gemmkit.autograd), run by the tl kernel in 128 x 256 tiles: the tables' entries there are the
# tl kernel's picks for K-major operands, whose 128 x 128 tiles ran such dx at 0.81x to 0.90x cuBLAS where these
# ran 0.97x to 1.04x (12 problems, Qwen2.5-7B and Llama-3 layers at 2048 / 8192 rows, dx and dw:
# tuning/train/train_probe_configs_bd49ab8_h100.txt, c0; one dx 1.12x -> 1.00x)
MN_MAJOR_CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=16, num_warps=8, num_stages=3, TMA=True,
                       PERSISTENT=True)


def ws_mn_major_config(dev: DeviceInfo, x2, w, M: int, N: int, K: int):
    """MN_MAJOR_CONFIG (a GemmConfig) for a bf16 / fp16 problem of ws_direct_ok's sizes whose x or w is not a TMA
    (rows, K) operand of this kernel, on a device that runs it; else None (the table's or derived config)."""
    if (x2.dtype not in (torch.bfloat16, torch.float16) or (_tma_operand(x2) and _tma_operand(w))
            or not ws_direct_ok(M, N, K, dev.num_sms, False) or not ws_enabled(dev, x2.device)):
        return None
    from .config import GemmConfig

    return GemmConfig(**MN_MAJOR_CONFIG)


def _tma_output(y2, N: int, out_dtype) -> bool:
    """The output is stored by TMA: 16-bit, unit column stride, 16-byte aligned rows and base (a
    fresh output is)."""
    s_cm, s_cn = (N, 1) if y2 is None else y2.stride()
    return (C_TMA and out_dtype in (torch.bfloat16, torch.float16) and s_cn == 1 and (s_cm * 2) % 16 == 0
            and (y2 is None or y2.data_ptr() % 16 == 0))


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def ws_plan(dev: DeviceInfo, x2, w, y2, M: int, N: int, K: int, *, scales: str, x_scale, w_scale, bias, activation,
            config, out_dtype, out_shape, flatten_x: bool, promote: bool = True):
    """A WSPlan for this problem if it qualifies (module docstring), else None. activation: as
    validate.check_activation returns it ("none"). scales: "kblock" (x_scale (M, G), w_scale
    (ceil(N / 128), G): the 2-D views run() will get), "rowcol" (x_scale one or M values,
    w_scale one or N values, contiguous), both FP8, or "none" (bf16 / fp16, promote=False).
    promote: FP8 products promoted to fp32 per K block (always with "kblock"), else the tensor
    cores accumulate."""
    promote = promote or scales == "kblock"
    if scales == "none":
        dtypes_ok = not promote and x2.dtype in (torch.bfloat16, torch.float16)
    else:
        dtypes_ok = x2.dtype in _FP8
    sizes_ok = (ws_shape_ok(M, N, K, dev.num_sms, scales == "kblock") if promote
                else ws_direct_ok(M, N, K, dev.num_sms, x2.dtype in _FP8))
    if (config is not None or activation != "none" or not dtypes_ok or not sizes_ok
            or not ws_enabled(dev, x2.device) or not (_tma_operand(x2) and _tma_operand(w))
            or (M * N >= 2**31 and not _tma_output(y2, N, out_dtype))):  # pointer stores: 32-bit offsets
        return None
    swap = ws_dense_swap(M, N, K, dev.num_sms) if scales == "none" and M * N < 2**31 else None
    return WSPlan(x2, w, y2, M, N, K, scales, x_scale, w_scale, bias, out_dtype, out_shape, flatten_x, dev.num_sms,
                  promote, tiles=None if swap is None else (BLOCK, swap), swap=swap is not None)


def ws_dense_swap(M: int, N: int, K: int, num_sms: int) -> tuple | None:
    """Column parts of a bf16 / fp16 problem computed with swapped operands where ws_ragged_tiles takes them,
    else None."""
    if _ragged(M, K, False):
        rows, parts, swap = ws_ragged_tiles(M, N, num_sms)
        return parts if swap else None
    return None


def ws_gated_plan(dev: DeviceInfo, x2, gate, up, y2, M: int, N: int, K: int, *, x_scale, w_scale, up_scale,
                  activation: str, config, out_dtype, out_shape, flatten_x: bool):
    """A gated WSPlan (act(x @ gate^T) * (x @ up^T), N = the intermediate size) if the problem
    qualifies (ws_gated_ok, TMA-addressable operands, gate and up with the same strides), else
    None. bf16 / fp16 x and weights; or FP8 x quantized per token (x_scale, one or M values) with
    FP8 weights scaled per channel (w_scale: the gate's at n * stride, the up weight's at offset +
    n * stride, up_scale = (offset, stride)) or per tensor, the tensor cores accumulating."""
    fp8 = x2.dtype in _FP8
    dtypes_ok = gate.dtype == x2.dtype if not fp8 else gate.dtype in _FP8
    if (config is not None or not dtypes_ok or not ws_gated_ok(M, N, K, dev.num_sms)
            or not ws_enabled(dev, x2.device) or gate.stride() != up.stride()
            or not (_tma_operand(x2) and _tma_operand(gate) and _tma_operand(up))
            or (M * N >= 2**31 and not _tma_output(y2, N, out_dtype))):
        return None
    return WSPlan(x2, gate, y2, M, N, K, "rowcol" if fp8 else "none", x_scale, w_scale, None, out_dtype, out_shape,
                  flatten_x, dev.num_sms, promote=False, gated=(activation, up_scale))


def ws_batched_swap(B: int, M: int, N: int, tiles: tuple, num_sms: int) -> tuple | None:
    """Column parts (N0, N1) for a batched problem of M rows per entry computed with its operands swapped (the
    weight's rows as the tiles' 128 rows, x's rows as their fitted columns: y^T = w x^T per entry), or None
    for the tiles ws_tiles picked (rows, parts). Only for M not a multiple of those tiles' rows (their last
    tile per entry pads it: 300 rows in 384), N a multiple of 16 (the transposed tile's 16-byte stores along
    y's rows), where the swapped tiles' waves (_wave_cost over every entry) take under SWAP_GAIN of theirs."""
    rows, parts = tiles
    if not SWAP_BATCHED or M % rows == 0 or N % 16:
        return None
    best = min(WIDTHS, key=lambda p: (_wave_cost(N, M, p, num_sms, batch=B), -(p[0] + p[1])))
    swapped, picked = _wave_cost(N, M, best, num_sms, batch=B), _wave_cost(M, N, parts, num_sms, rows, B)
    return best if swapped < SWAP_GAIN * picked else None


class BatchedWSPlan:
    """Batched bf16 / fp16 y[b] = x[b] @ w[b].T (+ bias) through one WSPlan over the entries' row
    stacks; called as the batched op's plans are: run(x, w, None, None, None, None, bias, None, None)
    with x (B, M, K) and w (B, N, K) of the planned strides (w's batch stride 0: one weight)."""

    def __init__(self, plan: "WSPlan", x_rows: tuple, w_rows: tuple):
        self.plan, self.x_rows, self.w_rows = plan, x_rows, w_rows
        self.rows, self.parts = plan.rows, plan.parts

    def run(self, x, w, offsets, a_rows, c_rows, row_weights, bias, a_scale, b_scale):
        x2 = torch.as_strided(x, self.x_rows, (x.stride(1), 1))
        w2 = torch.as_strided(w, self.w_rows, (w.stride(1), 1))
        return self.plan.run(x2, w2, bias, None, None, None)


def ws_batched_plan(dev: DeviceInfo, x, w, bias, activation: str, out_dtype, config) -> "BatchedWSPlan | None":
    """A batched plan on this kernel for x (B, M, K) and w (B, N, K) (or a weight shared with batch
    stride 0), both bf16 / fp16, K-contiguous, x's entries stacked at a uniform row stride, M a
    multiple of the tiles' rows or (RAGGED_BATCHED) any M, where the (B * M)-row problem qualifies as
    ws_direct_ok / ws_tiles decide for a dense one, no activation, the library's config; else None. On the H100 (`gemmkit
    bench batched_a16w16@b8`, tuning/fitted/batched_b8_e1a4a97_h100.md) 0.98x to 1.01x torch.bmm
    where the tl kernel ran 0.90x and 0.96x."""
    B, M, K = x.shape
    N = w.shape[1]
    if (config is not None or activation != "none" or x.dtype not in (torch.bfloat16, torch.float16)
            or w.dtype != x.dtype or not ws_enabled(dev, x.device) or x.stride(2) != 1 or w.stride(2) != 1
            or (B > 1 and x.stride(0) != M * x.stride(1)) or B * M * N >= 2**31):
        return None
    if w.stride(0) == 0 or B == 1:
        b_rows = 0
    elif w.stride(0) == N * w.stride(1):
        b_rows = N
    else:
        return None
    x_rows, w_rows = (B * M, K), (B * b_rows or N, K)
    x2 = torch.as_strided(x, x_rows, (x.stride(1), 1))
    w2 = torch.as_strided(w, w_rows, (w.stride(1), 1))
    m_eff = B * -(-M // BLOCK) * BLOCK
    tiles = ws_tiles(m_eff, N, dev.num_sms, False)
    # ragged M (tiles reading into the next entry, their rows past M stored by pointers): RAGGED_BATCHED
    if (B > 1 and M % tiles[0] and not RAGGED_BATCHED) or not (_tma_operand(x2) and _tma_operand(w2)
                                                                and ws_direct_ok(m_eff, N, K, dev.num_sms, False)):
        return None
    swap = ws_batched_swap(B, M, N, tiles, dev.num_sms) if B > 1 else None
    plan = WSPlan(x2, w2, None, M, N, K, "none", None, None, bias, out_dtype, (B, M, N), False, dev.num_sms,
                  promote=False, tiles=tiles if swap is None else (BLOCK, swap), batch=(B, b_rows),
                  swap=swap is not None)
    return BatchedWSPlan(plan, x_rows, w_rows)


# grouped bf16 / fp16 on this kernel from GROUPED_MIN_ROWS rows per expert on average and GROUPED_MIN_TOTAL rows in
# all (scripts/grouped_ws_probe.py, tuning/grouped_ws/: from 16 rows per expert it held >= 0.97x _grouped_mm on
# Qwen3-30B-A3B and DeepSeek-V3 under both routings where the tl kernel fell to 0.46x on skewed ones; below, at
# 2 to 4 rows per expert, the tl kernel's small tiles read the weights faster on balanced routings)
GROUPED_MIN_ROWS = 16
GROUPED_MIN_TOTAL = 512
# the gated grouped GEMM (moe_mlp's gate / up) from 128 rows per expert: below, its tl kernel's fixed 128 x 128 tiles
# ran 1.03x to 1.13x the expert map's on balanced routings (tuning/grouped_ws/grouped_ws_probe_*_h100.txt)
GROUPED_GATED_MIN_ROWS = 128
# FP8 (grouped_gemm_a8w8) from any rows per expert (still GROUPED_MIN_TOTAL rows): at 64 tokens (2 to 4 rows per
# expert) the expert map ran 1.01x to 1.39x `_scaled_grouped_mm` where the tl kernel ran 0.72x to 0.93x
# (tuning/grouped_ws/bench_grouped_64tokens_forced_*_h100.md, bench_grouped_a8w8_*_h100.md)
GROUPED_FP8_MIN_ROWS = 0
GROUPED_GATHER = True  # ... also with gathered rows (copied by the producer's cp.async: no TMA gather on Hopper)
# from this many rows per expert on average gathered rows are permuted into a sorted copy first (TMA loads): there
# the products are compute-bound and the copy costs less than the gathering producer (Mixtral-8x7B at 512 and 1024
# rows per expert: 0.88x / 0.82x _grouped_mm gathered in the kernel, 1.03x / 0.96x on sorted rows)
GROUPED_PERMUTE_ROWS = 512


class GroupedWSPlan:
    """Grouped (mixture-of-experts) bf16 / fp16 GEMM through one WSPlan with the expert map: expert e's sorted
    rows [offsets[e], offsets[e + 1]) of x times w[e] (w (E, N, K)); gated: activation(x w_gate^T) * (x w_up^T)
    per expert (w the gate, b2 the up weight, each (E, I, K) views of one (E, 2I, K) tensor). Called as the
    grouped op's plans are (GroupedPlan.run's arguments); gathered rows (a_rows): the kernel's producer copies
    them (A_GATHER), or (permute) they are copied in order first."""

    def __init__(self, plan: "WSPlan", R: int, N: int, w_rows: tuple, permute: bool):
        self.plan, self.rows, self.shape, self.w_rows, self.permute = plan, R, (R, N), w_rows, permute

    def run(self, x, w, offsets, a_rows, c_rows, row_weights, bias, a_scale, b_scale, b2=None):
        plan = self.plan
        if self.permute:  # (gathered rows into a sorted copy: GROUPED_PERMUTE_ROWS; per-token scales alike)
            x = x.index_select(0, a_rows)
            if a_scale is not None and a_scale.numel() > 1:
                a_scale = a_scale.reshape(-1).index_select(0, a_rows)
            a_rows = None
        w2 = torch.as_strided(w, self.w_rows, (w.stride(1), 1))
        up = None if b2 is None else torch.as_strided(b2, self.w_rows, (b2.stride(1), 1))
        out = torch.empty(self.shape, dtype=plan.out_dtype, device=plan.device)
        on_device(plan.device_index, plan.launch, plan.arguments(x, w2, out, bias, a_scale, b_scale, up, offsets,
                                                                  a_rows, c_rows, row_weights), plan.tail)
        return out


def ws_grouped_plan(dev: DeviceInfo, x, w, R: int, bias, *, gather: bool, scatter: bool, weighted: bool,
                    activation: str, out_dtype, config, gated: bool = False, x_scale=None,
                    w_scale=None) -> "GroupedWSPlan | None":
    """A grouped plan on this kernel, or None (the tl kernel's GroupedPlan then): x (T, K) and w (E, N, K)
    bf16 / fp16, or FP8 with x_scale (one value or per token) and w_scale (one value, per expert or (E, N) per
    channel; checked by the op) and the tensor cores' fast accumulation, K-contiguous and TMA-aligned, each
    expert's weight rows evenly spaced, R sorted rows of at least GROUPED_MIN_ROWS per expert on average, rows
    read in order or gathered (GROUPED_GATHER), stored in order or scattered and weighted (not gated), no
    activation (gated, 16-bit: w is the gate half of an (E, 2I, K) weight whose up half, laid out alike, comes
    with each call; `activation` of the gate), a 16-bit output, the library's config."""
    E, N, K = w.shape
    fp8 = x.dtype in _FP8
    if (config is not None or (gated and (scatter or weighted or fp8)) or (activation != "none" and not gated)
            or (gather and not GROUPED_GATHER) or x.dtype not in (torch.bfloat16, torch.float16, *_FP8)
            or w.dtype != x.dtype or fp8 != (x_scale is not None and w_scale is not None)
            or out_dtype not in (torch.bfloat16, torch.float16) or not ws_enabled(dev, x.device)
            or R < max((GROUPED_GATED_MIN_ROWS if gated else GROUPED_FP8_MIN_ROWS if fp8 else GROUPED_MIN_ROWS) * E,
                       GROUPED_MIN_TOTAL)
            or K < WS_MIN_K or R * N >= 2**31 or x.stride(1) != 1 or w.stride(2) != 1
            or (E > 1 and w.stride(0) % w.stride(1)) or (N > 1 and w.stride(1) < K)):
        return None
    b_rows = w.stride(0) // w.stride(1) if E > 1 else N
    w_rows = ((E - 1) * b_rows + N, K)
    w2 = torch.as_strided(w, w_rows, (w.stride(1), 1))
    if not (_tma_operand(x) and _tma_operand(w2)):  # (gathered: 16-byte copies of x's rows)
        return None
    # (permuted: x stands for its sorted copy, (R, K) contiguous, in the plan)
    permute = gather and R >= GROUPED_PERMUTE_ROWS * E and x.stride(0) == K
    gather = gather and not permute
    if gather and (K * x.element_size()) % 16:  # (the producer copies whole 16-byte pieces of a row)
        return None
    scales, bs_expert, ws = "none", 0, None
    if fp8:  # per channel: (E, N) contiguous, N apart per expert; per expert: one value each, 1 apart
        scales = "rowcol"
        per_channel = w_scale.numel() == E * N and N > 1
        bs_expert = N if per_channel else 1 if w_scale.numel() == E > 1 else 0
        ws = w_scale if per_channel else w_scale.reshape(-1)[:1]  # (WSPlan's stride along N: per channel or none)
    tiles = None if gated else ws_tiles(R, N, dev.num_sms, fp8)
    plan = WSPlan(x, w2, None, R, N, K, scales, x_scale, ws, bias, out_dtype, (R, N), False, dev.num_sms,
                  promote=False, gated=(activation, (0, 1)) if gated else None, tiles=tiles,
                  experts=(E, b_rows, bs_expert), gather=gather, scatter=(scatter, weighted))
    return GroupedWSPlan(plan, R, N, w_rows, permute)


_GL_DTYPES = {}


def _gl_dtype(dtype):
    from triton.experimental.gluon import language as gl

    if not _GL_DTYPES:
        _GL_DTYPES.update({torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5,
                           torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32})
    return _GL_DTYPES[dtype]


class _Descriptors:
    """The per-call TMA descriptors of one plan: built (and validated) by Gluon's TensorDescriptor on
    the first call, later as copies of the first with the new base tensor (the plan key pins
    shape, strides, alignment and dtype; what a copy keeps)."""

    def __init__(self, shape, strides, block, layout):
        self.args, self.template = (list(shape), list(strides), list(block), layout), None

    def __call__(self, t):
        if self.template is None:
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

            self.template = TensorDescriptor(t, *self.args)
            return self.template
        d = object.__new__(type(self.template))
        d.__dict__.update(self.template.__dict__)
        d.base = t
        return d


def unused_descriptor(shape: tuple, dtype, layout, device) -> object:
    """A TMA descriptor over zeros of `shape` for a kernel argument the launch never reads (an x-scale box
    without block scales, an output box with pointer stores): built once per plan."""
    strides = contiguous_strides(tuple(shape))
    return _Descriptors(shape, strides, shape, layout)(torch.zeros(shape, dtype=dtype, device=device))


class KSlices:
    """The K slices' fp32 partials: a workspace of `splits` blocks of split_rows rows of N (padded to 16 bytes),
    slice s at rows s * split_rows, in y's orientation, and the launch of kernels/reduce.py's sum_k_slices that
    adds them (in slice order) into y (M, N) with the bias. Set up once per plan."""

    def __init__(self, M: int, N: int, splits: int, split_rows: int, y_strides, has_bias: bool, device,
                 device_index: int):
        from .launcher import CachedLaunch

        self.split_rows, self.n_pad, self.device = split_rows, -(-N // 4) * 4, device
        self.shape = (splits * split_rows, self.n_pad)
        self.launch = CachedLaunch(reduce_kernels().sum_k_slices, (-(-M // REDUCE_BLOCK[0]), -(-N // REDUCE_BLOCK[1])),
                                   4, 1, device_index)
        self.tail = (M, N, splits, split_rows, self.n_pad, *y_strides, has_bias, *REDUCE_BLOCK)

    def workspace(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=torch.float32, device=self.device)

    def finish(self, ws, y, bias) -> None:
        """y = the slices' sum (+ bias), cast to y's dtype."""
        self.launch((ws, y, bias), self.tail)


def ws_stages(width: int, out_bytes: int, out_width: int | None = None, rows: int = BLOCK, extra: int = 0,
              fixed: int = 0) -> int:
    """Pipeline stages of rows x width tiles (B rows per K block): as many as shared memory holds
    beside the output buffers of rows x out_width (default width; out_bytes per element, 0: pointer
    stores) and `fixed` bytes more, each stage `extra` bytes more (a 4-bit A's packed words), at most
    MAX_STAGES."""
    stage = (rows + width) * ROW_BYTES + BLOCK * 4 + extra  # A, B and a tile's x scales
    out = rows * (width if out_width is None else out_width) * out_bytes
    return min(MAX_STAGES, (SMEM_BYTES - SMEM_RESERVE - out - fixed) // stage)


class WSPlan:
    """y (M, N) = x @ w.T through gemm_ws_kernel (FP8 promoted per K block or not; bf16 / fp16),
    for fixed tensor facts. Called as run(x, w, bias, y, x_scale, w_scale) like the ops' other
    plans; launched through Triton the first time, then directly (core/launcher.CachedLaunch).
    gated=(activation, (up scale offset, stride)): y = activation(x @ w.T) * (x @ w2.T), w the gate
    and w2 the up weight (run(..., w2=up)), in tiles of ws_gated_width columns of each.
    swap (bf16 / fp16, batched or not, `tiles` (128, parts)): the kernel computes y^T = w x^T (per entry), the
    weight's rows as the tiles' rows and x's as their columns, and stores the tiles transposed by pointers (C_T;
    K slices into the workspace in y's orientation)."""

    def __init__(self, x2, w, y2, M, N, K, scales, x_scale, w_scale, bias, out_dtype, out_shape, flatten_x, num_sms,
                 promote=True, gated=None, tiles=None, batch=None, swap=False, experts=None, gather=False,
                 scatter=(False, False)):
        from triton.experimental.gluon import language as gl

        from .launcher import CachedLaunch

        self.M, self.N, self.K = M, N, K
        # batched (batch=(B, weight rows per entry: N, or 0 for one weight)): x2 / w / the output are the
        # (B * M, K) / (B * N or N, K) / (B * M, N) row stacks of the entries
        self.batch, b_rows = batch or (1, 0)
        # experts=(E, the weight's rows per expert, its scales' stride per expert): x2 / the output are the experts'
        # sorted rows (M of them), w the experts' weights one after the other (kernels/gemm_ws.py EXPERTS)
        self.experts = experts
        if experts is not None:
            b_rows = experts[1]
        MB = self.batch * M
        self.out_dtype, self.out_shape, self.flatten_x = out_dtype, tuple(out_shape), flatten_x
        self.out_strides = contiguous_strides(self.out_shape)
        self.device = x2.device
        self.device_index = x2.device.index or 0
        self.kblock = scales == "kblock"
        self.promote = promote = promote or self.kblock
        block_k = ROW_BYTES // x2.element_size()
        op_dtype = _gl_dtype(x2.dtype)
        self.swap = swap
        w_rows = (experts[0] - 1) * b_rows + N if experts is not None else self.batch * b_rows or N

        def desc(rows, stride, box):
            return _Descriptors((rows, K), (stride, 1), (box, block_k),
                                gl.NVMMASharedLayout.get_default_for([box, block_k], op_dtype))

        self.a_desc = desc(w_rows, w.stride(0), HALF) if swap else desc(MB, x2.stride(0), HALF)
        self.gather = gather  # (the expert map: A's rows gathered from x2 by the kernel; a_desc for its layout only)
        self.scatter = scatter  # (the expert map: rows stored at c_rows, times row_weights: pointer stores)
        if gather:
            layout = gl.NVMMASharedLayout.get_default_for([HALF, block_k], op_dtype)
            unused = unused_descriptor((HALF, block_k), x2.dtype, layout, x2.device)
            self.a_desc = lambda t: unused
        self.gated = gated is not None
        if self.gated:
            width = ws_gated_width(M, N, num_sms)
            self.parts = (width, width)
        elif promote:
            wide = ws_block_n(M, N, num_sms, self.kblock) == 2 * BLOCK
            self.parts = (BLOCK, BLOCK) if wide else (BLOCK, 0)
        else:
            self.rows, self.parts = tiles or ws_tiles(M, N, num_sms, x2.dtype in _FP8)
        if self.gated or promote:
            self.rows = BLOCK
        n0, n1 = self.parts
        self.block_n = n0 if self.gated else n0 + n1  # (output columns per tile)

        def b_desc(rows):
            return desc(MB, x2.stride(0), rows) if swap else desc(w_rows, w.stride(0), rows)

        self.b0_desc = b_desc(n0)
        self.b1_desc = b_desc(n1) if n1 else self.b0_desc  # (gated: over the up weight, a descriptor of its own)
        xs_layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
        xs_group_stride = 0
        if self.kblock:
            G = x_scale.shape[1]
            s0, s1 = x_scale.stride()
            self.xs_tma = (s0 == 1 and (s1 % 4 == 0 or G == 1) and x_scale.data_ptr() % 16 == 0 and (s1 >= M or G == 1))
            xs_group_stride = s1 if G > 1 else 0
            self.xs_extent = (G - 1) * xs_group_stride + M
            scale_strides = (s0, s1, *w_scale.stride())
        elif scales == "rowcol":
            self.xs_tma = False
            per_channel = w_scale.numel() > 1
            if self.gated:
                up_offset, up_stride = gated[1]
            else:
                up_offset, up_stride = 0, 1
            scale_strides = (int(x_scale.numel() > 1), 0, up_stride if per_channel else 0, 0)
        else:
            self.xs_tma = False
            scale_strides = (0, 0, 0, 0)
        self.xs_desc = _Descriptors((self.xs_extent if self.xs_tma else BLOCK,), (1,), (BLOCK,), xs_layout)
        # (scales by register loads: a descriptor the kernel does not read)
        self._xs_const = None if self.xs_tma else unused_descriptor((BLOCK,), torch.float32, xs_layout, self.device)
        if scales != "rowcol" or w_scale.numel() == 1:
            up_offset = 0
        self.y_strides = (N, 1) if y2 is None else y2.stride()
        km, kn = (N, M) if swap else (M, N)  # the kernel's rows and columns
        if self.gated or self.batch > 1 or experts is not None:
            self.splits = 1
        else:
            self.splits = ws_splits(km, kn, K, num_sms, self.block_n, block_k, self.rows)
        self.ragged = False
        if self.splits > 1:  # K slices summed apart: into an fp32 workspace, slice s at rows s * split_rows
            # (swap: x's rows are the kernel's columns; never the constant 1, as W4TilePlan's)
            self.split_rows = -(-M // 16) * 16 if swap else -(-M // self.rows) * self.rows
            self.slices = KSlices(M, N, self.splits, self.split_rows, self.y_strides, bias is not None, self.device,
                                  self.device_index)
            self.ws_shape, self.reduce_tail = self.slices.shape, self.slices.tail
            c_strides, c_dtype, self.c_tma = (self.slices.n_pad, 1), torch.float32, not swap
            if swap:
                c_strides = c_strides[::-1]
        else:
            self.split_rows = 0
            c_strides, c_dtype, self.c_tma = self.y_strides, out_dtype, _tma_output(y2, N, out_dtype)
            # ragged M: a tile's rows past its entry's end stored by pointers (kernels/gemm_ws.py C_TMA_INSIDE)
            self.ragged = self.c_tma and ((self.batch > 1 and M % self.rows != 0) or experts is not None)
            if (self.ragged and not RAGGED_C_TMA) or swap or any(scatter):
                self.c_tma = self.ragged = False
            if swap:  # the kernel's rows are y's columns
                c_strides = c_strides[::-1]

        def c_desc(cols):
            layout = gl.NVMMASharedLayout.get_default_for([HALF, cols], _gl_dtype(c_dtype))
            if self.c_tma:
                return _Descriptors((MB if self.splits == 1 else self.ws_shape[0], N), (c_strides[0], 1),
                                    (HALF, cols), layout)
            return unused_descriptor((HALF, cols), c_dtype, layout, self.device)  # (pointer stores)

        self.c0_desc = c_desc(n0)
        self.c1_desc = c_desc(n1) if n1 and not self.gated else self.c0_desc
        kernel = gluon_kernel().gemm_ws_kernel
        s_am, s_ak, s_bn, s_bk = scale_strides
        self.share_c = SHARE_C and n1 == n0 and self.c_tma and not self.gated
        # swap: the transposed stores' layout conversion, as W4TilePlan's (a (64, part) tile per warp group in fp32)
        convert = (self.rows * max(n0, n1) * 4 if c_dtype == torch.float32 else 4096) if swap else 0
        if scatter[0]:  # (scattered rows: 16-byte vector stores along them, a warp group's part converted at once:
            # 160-wide tiles with 4096 bytes reserved overflowed, scripts/gpu_fuzz.py seed 31)
            convert = HALF * max(n0, n1) * c_dtype.itemsize
        self.stages = ws_stages(n0 + n1, c_dtype.itemsize if self.c_tma else 0, n0 if self.share_c else self.block_n,
                                self.rows, fixed=convert)
        self.tail = kernel_tail(kernel, PER_CALL, dict(
            M=km, N=kn, K=K, splits=self.splits, split_rows=self.split_rows, xs_group_stride=xs_group_stride,
            stride_cm=c_strides[0], stride_cn=c_strides[1],
            stride_asm=s_am, stride_ask=s_ak, stride_bsn=s_bn, stride_bsk=s_bk, up_scale_offset=up_offset,
            GROUP_M=GROUP_M, STAGES=self.stages, SCALES={"kblock": 0, "rowcol": 1, "none": 2}[scales],
            XS_TMA=self.xs_tma, PROMOTE=promote, TWO=n1 > 0, HAS_BIAS=bias is not None and self.splits == 1,
            C_TMA=(2 if self.ragged else 1) if self.c_tma else 0, GATED=self.gated,
            ACTIVATION=gated[0] if self.gated else "none", SHARE_C=self.share_c,
            GROUPS=self.rows // HALF, batch=self.batch,
            a_batch_rows=0 if experts is not None else b_rows if swap else M, b_batch_rows=M if swap else b_rows,
            c_batch_rows=0 if experts is not None else M,
            bias_batch_stride=bias.stride(0) if bias is not None and bias.ndim == 2 else 0, C_T=swap, **DENSE_W,
            **(NO_EXPERTS if experts is None else dict(num_experts=experts[0], bs_batch_stride=experts[2],
                                                      EXPERTS=max(2, 1 << (experts[0] - 1).bit_length()),
                                                      stride_am=x2.stride(0), A_GATHER=gather,
                                                      C_SCATTER=scatter[0], ROW_WEIGHTS=scatter[1]))))
        units = _tiles(km, kn, self.rows, self.block_n) * self.splits * self.batch
        if experts is not None:  # (an upper bound: every expert may end in a partial tile-row)
            units = (-(-M // self.rows) + experts[0]) * -(-N // self.block_n)
        self.launch = CachedLaunch(kernel, (min(units, num_sms),), 4, 1,
                                   self.device_index)  # persistent: at most one program per SM
        self.x_extent, self.w_extent = extent_bytes(x2), extent_bytes(w)
        self.y_extent = 0 if y2 is None else extent_bytes(y2)

    def arguments(self, x, w, c, bias, x_scale, w_scale, w2=None, offsets=None, a_rows=None, c_rows=None,
                  row_weights=None) -> tuple:
        """The kernel's PER_CALL arguments for these tensors (x (M, K), c (M, N); gated: w2 the up
        weight; the expert map: its offsets, (gather) the x rows of A's rows, (scatter) c's rows of the
        product's, the rows' weights)."""
        xs_desc = self.xs_desc(torch.as_strided(x_scale, (self.xs_extent,), (1,))) if self.xs_tma else self._xs_const
        b = x if self.swap else w
        b0 = self.b0_desc(b)
        if self.gated:
            b1 = self.b1_desc(w2)
        else:
            b1 = self.b1_desc(b) if self.b1_desc is not self.b0_desc else b0
        if self.c_tma:
            c0 = self.c0_desc(c)
            c1 = self.c1_desc(c) if self.c1_desc is not self.c0_desc else c0
        else:
            c0, c1 = self.c0_desc, self.c1_desc
        return (self.a_desc(w if self.swap else x), b0, b1, xs_desc, c, c0, c1, bias, x_scale, w_scale, None, offsets,
                x if self.gather else None, a_rows, c_rows, row_weights)

    def run(self, x, w, bias, y, x_scale, w_scale, w2=None):
        return on_device(self.device_index, self._run, x, w, bias, y, x_scale, w_scale, w2)

    def _run(self, x, w, bias, y, x_scale, w_scale, w2=None):
        M, N = self.M, self.N
        if y is not None:
            inputs = (("x", x, self.x_extent), ("w", w, self.w_extent))
            if w2 is not None:
                inputs += (("w_up", w2, self.w_extent),)
            clash = overlapping_input(y, self.y_extent, inputs)
            if clash:
                raise ValueError(f"y shares memory with {clash}: the output must not overlap an input "
                                 "(other programs would still read what one has written)")
        if self.flatten_x:
            x = x.reshape(M, self.K)
        out = torch.empty_strided(self.out_shape, self.out_strides, dtype=self.out_dtype,
                                  device=self.device) if y is None else y
        c = out.view(self.batch * M, N) if len(self.out_shape) != 2 else out
        if self.splits == 1:
            self.launch(self.arguments(x, w, c, bias, x_scale, w_scale, w2), self.tail)
            return out
        ws = self.slices.workspace()
        self.launch(self.arguments(x, w, ws, None, x_scale, w_scale), self.tail)
        self.slices.finish(ws, c, bias)
        return out

    __call__ = run
