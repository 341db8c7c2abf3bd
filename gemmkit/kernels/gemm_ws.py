"""Hopper (sm_90) warp-specialized GEMM (Gluon): bf16 / fp16 / FP8 operands, tiles of 128 rows and
fitted column widths, FP8 products promoted to fp32 per K block where asked.

Why a second kernel: Triton's tl code for sm_90 neither splits producer and consumer warps nor
keeps a tensor-core product in flight while it promotes the previous one (every promoting K
step waits for all of its tensor-core work, PTX `wgmma.wait_group 0`, and the block scales'
register loads stall the fence before the next product: BENCHMARKS.md, "FP8 promotion"), and its
tiles are powers of two wide. Here the roles are split, as DeepGEMM and CUTLASS's cooperative
kernels do: a producer warp brings each K block's two 64-row A halves, the B tile's column
part(s) and (SCALES_KBLOCK, XS_TMA) the tile's 128 activation scales into shared memory by TMA,
STAGES deep; two consumer warp groups of 64 rows each multiply.
PROMOTE (FP8: block scales, gemm_a8w8(fast_accum=False)): each group waits for its own product
and promotes it while the other group's product runs on the tensor cores
(scripts/gluon_blockscale_probe.py measured the arrangement: tuning/gluon_blockscale_probe_h100.txt).
Otherwise the tensor cores accumulate (bf16 / fp16, FP8 fast accumulation), one K block's
products in flight while the next block's are issued.

Tiles are 128 x (N0 + N1) x BLOCK_K (BLOCK_K = 128 bytes of a row: 64 bf16 / fp16, 128 FP8 = the
scale group), each column part a power of two wide with its own product and accumulator, so that
tile widths such as 144, 160 or 192 fill the SMs' waves where powers of two leave a ragged last
one (the host picks them: core/hopper_ws.py); persistent programs (at most one per SM) in
grouped order.
SCALES_KBLOCK: DeepSeek-V3 block scales, x_scale (M, G) per token and K group, w_scale
(ceil(N / 128), G); each block's product is multiplied by its two scales as it is promoted
(parts of 128 columns, one weight scale group each).
SCALES_ROWCOL: per-token (or per-tensor) x and per-channel (or per-tensor) w scales, applied once
in the epilogue. SCALES_NONE: no scales (bf16 / fp16).
The tile with an optional bias, cast to c's dtype, stored by TMA from shared memory (C_TMA) or
through pointers.
GATED (the fused feed-forward's gated GEMM): the two column parts are the gate and up products
of the same columns, and the tile stored is act(gate) * up (kernels/epilogue.py's activation).
W_FORMAT INT4 / MXFP4 (gemm_a16w4 / gemm_a16wfp4, core/hopper_w4.W4TilePlan): a 4-bit weight is A
(the kernel computes y^T = w x^T, 128 weight rows by up to 256 of x's per tile), its packed words
come by TMA with x's tile, and a decoder partition (_decoder, DEC_WARPS warps) writes each K block's
values into the A buffers, from which the consumers' products read them as they read x's (no
register operand: the products stay in flight); the tile is stored transposed in 16-byte vectors
along the weight's rows (stored value by value, the CUDA 12 ptxas serialized every product: C7514,
BENCHMARKS.md, thirteenth session).
C_T: the same transposed store for dense bf16 / fp16 operands the host swaps (the weight as A, x's rows as the
tiles' fitted width) where 128-row tiles would pad M (300 rows in 384; BENCHMARKS.md, fifteenth session).

Only for CUDA sm_90 with Gluon (core/hopper_ws.py decides); everything else runs the tl kernel.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .epilogue import activation
from .gemm_w4_decode import _DECODE_E2M1, _cta_barrier, _scaled

# Triton 3.6 names the TMA copies async_copy_global_to_shared / _shared_to_global; later versions
# async_load / async_store
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
# (and the cp.async copy async_copy_global_to_shared / async_load)
_cp_async = async_copy.async_load if hasattr(async_copy, "async_load") else async_copy.async_copy_global_to_shared

SCALES_KBLOCK = gl.constexpr(0)
SCALES_ROWCOL = gl.constexpr(1)
SCALES_NONE = gl.constexpr(2)
# C_TMA: 0 pointer stores, 1 TMA stores, C_TMA_INSIDE TMA stores of the rows inside their batch entry (ragged M)
C_TMA_INSIDE = gl.constexpr(2)
# the weight's storage (W_FORMAT): 16-bit or FP8 values (B, read by TMA), or 4-bit: then the weight is A, its
# values written into shared memory by a decoder partition (_decoder) and x is B
W_DENSE = gl.constexpr(0)
W_INT4 = gl.constexpr(1)
W_MXFP4 = gl.constexpr(2)
DEC_ROWS = gl.constexpr(64)  # weight rows the decoder turns into A's values at a time (a consumer's rows)
DEC_WORK = gl.constexpr(2)  # (probes, scripts/w4_tile_ab.py: 0 no decoding, 1 no stores; wrong products)
DEC_WARPS = gl.constexpr(4)  # the decoder's warps: 4 of 80 registers ran 1.05x to 1.16x 8 of 48 (the consumers at
DEC_REGS = gl.constexpr(80)  # 192 / 184; tuning/w4_tile/w4_tile_ab_decoder_a256111_h100.txt) ...
DEC_CONSUMER_REGS = gl.constexpr(192)  # ... and the second consumer's registers beside them
GATHER_WARPS = gl.constexpr(4)  # the producer's warps where it gathers A's rows (A_GATHER: cp.async, 16 bytes a copy)
# ... and the registers of (the second consumer, the producer) beside them, 16-bit / FP8 operands, the sum of the
# others' (232, 40): the fewest for the producer that did not spill (40 / 56 did); FP8 spilled in the producer below 72
# with Triton 3.6 (the device's) and in the consumer below 208 with Triton 3.9 (gemmkit.tools.codegen checks both)
GATHER_REGS = gl.constexpr(([216, 56], [200, 72] if triton.__version__.startswith("3.6") else [208, 64]))


def _pairs_ptx(magic: int, fp16: bool) -> str:
    """One INT4 word ($4; element 2j in the low nibble of byte j) to four registers $0..$3: register j holds
    elements 2j and 2j + 1 as 16-bit floats (q - z) s, given the pairs $5 = (s, s) and $6 = (BASE + z, BASE + z).
    With u the word shifted right by 4 (byte j's high nibble in u's byte j's low one), PRMT puts byte j of the
    word and of u in bytes 0 and 2, and LOP3 keeps their low nibbles under MAGIC (MAGIC | q = BASE + q, exact);
    the zero point's subtraction is exact too: one rounding, by the product."""
    t = "f16x2" if fp16 else "bf16x2"
    lines = ["{", ".reg .b32 t, u;", "shr.u32 u, $4, 4;"]
    for j in range(4):
        lines += [f"prmt.b32 t, $4, u, 0x{(4 + j) << 8 | j:04X};",
                  f"lop3.b32 t, t, 0x000F000F, 0x{magic:02X}00{magic:02X}00, 0xEA;",
                  f"sub.rn.{t} t, t, $6;", f"mul.rn.{t} ${j}, t, $5;"]
    return "\n".join(lines + ["}"])


_PAIRS_BF16 = gl.constexpr(_pairs_ptx(0x43, False))
_PAIRS_FP16 = gl.constexpr(_pairs_ptx(0x64, True))

# A 16-bit tile of 128-byte rows seen as int32 (the same bytes: the swizzle moves 16-byte pieces). Triton 3.6 names
# the shared memory reinterpretation _reinterpret, later versions reinterpret.
_WORDS_128B = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
if hasattr(gl.shared_memory_descriptor, "reinterpret"):
    @gluon.jit
    def _as_int32(buf, rows: gl.constexpr, cols: gl.constexpr):
        return buf.reinterpret(gl.int32, [rows, cols], _WORDS_128B)
else:
    @gluon.jit
    def _as_int32(buf, rows: gl.constexpr, cols: gl.constexpr):
        return buf._reinterpret(gl.int32, [rows, cols], _WORDS_128B)


@gluon.jit
def _grouped_pid(pid, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """(tile-row, tile-column) of tile pid in grouped order: GROUP_M tile-rows walked column by column
    (kernels/schedule.py grouped_tile; a Gluon kernel cannot call the tl one)."""
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    in_group = pid % per_group
    return first_m + in_group % group_m, in_group // group_m


@gluon.jit
def _grouped_tile(pid, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(off_m, off_n) of program pid in grouped order (_grouped_pid)."""
    pid_m, pid_n = _grouped_pid(pid, gl.cdiv(M, BLOCK_M), gl.cdiv(N, BLOCK_N), GROUP_M)
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@gluon.jit
def _units(M, N, batch, splits, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """(tiles of one batch entry, work units of the launch): a unit is a tile of an entry and one of
    `splits` K slices."""
    tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    return tiles, tiles * batch * splits


@gluon.jit
def _expert_units(expert_offsets, num_experts, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  EXPERTS: gl.constexpr, NW: gl.constexpr):
    """(cumulative tile-rows per expert (EXPERTS,), work units) of the expert map, read from the device's
    offsets (expert e owns rows [offsets[e], offsets[e + 1]): cdiv(rows, BLOCK_M) tile-rows, none for an
    empty or negative range) by a partition of NW warps; no host synchronization (kernels/schedule.py
    group_grid / group_rows for the tl kernel: a Gluon kernel cannot call those)."""
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    e = gl.arange(0, EXPERTS, layout=lay)
    lo = gl.load(expert_offsets + e, mask=e < num_experts, other=0)
    hi = gl.minimum(gl.load(expert_offsets + e + 1, mask=e < num_experts, other=0), M)  # (as _expert_unit)
    tiles_m = (gl.maximum(hi - lo, 0) + BLOCK_M - 1) // BLOCK_M
    cum = gl.associative_scan(tiles_m, 0, _add)  # (Triton 3.6's Gluon has no cumsum)
    return cum, gl.max(cum, 0) * gl.cdiv(N, BLOCK_N)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _expert_unit(unit, cum, expert_offsets, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 GROUP_M: gl.constexpr):
    """(expert, first row, off_n, end row) of work unit `unit` of the expert map (_expert_units): the
    experts' tile-rows one after the other, walked in grouped order; rows are x's (sorted) rows, the end at most
    M (unchecked offsets past the rows store none past them)."""
    pid_m, pid_n = _grouped_pid(unit, gl.max(cum, 0), gl.cdiv(N, BLOCK_N), GROUP_M)
    before = cum <= pid_m
    expert = gl.sum(before.to(gl.int32), 0)
    first_tile = gl.max(gl.where(before, cum, 0), 0)  # cum[expert - 1] (cum does not decrease)
    lo = gl.load(expert_offsets + expert)  # (not clamped at 0 as the tl map does: the FP8 gathering variant then
    # spilled with Triton 3.6; a negative offset is unchecked here, GEMMKIT_DEBUG=1 checks it)
    return expert, lo + (pid_m - first_tile) * BLOCK_M, pid_n * BLOCK_N, gl.minimum(
        gl.load(expert_offsets + expert + 1), M)


@gluon.jit
def _work_units(M, N, batch, splits, expert_offsets, num_experts, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                EXPERTS: gl.constexpr, NW: gl.constexpr):
    """(the map's state, work units of the launch) of the tile map the producer and the consumers walk: the expert
    map's running sum (EXPERTS > 0: _expert_units), else the tiles of a batch entry (_units)."""
    if EXPERTS > 0:
        state, units = _expert_units(expert_offsets, num_experts, M, N, BLOCK_M, BLOCK_N, EXPERTS, NW)
    else:
        state, units = _units(M, N, batch, splits, BLOCK_M, BLOCK_N)
    return state, units


@gluon.jit
def _work(unit, state, M, N, batch, splits, k_tiles, expert_offsets, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          GROUP_M: gl.constexpr, EXPERTS: gl.constexpr):
    """(batch entry or expert, off_m, off_n, K slice, first and end K block, end row) of work unit `unit`
    (_work_units' state): the expert map's rows are x's sorted rows, [off_m, end row) the expert's; a batch
    entry's rows are its own, M of them."""
    if EXPERTS > 0:
        entry, off_m, off_n, row_end = _expert_unit(unit, state, expert_offsets, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        sp = 0
        k0 = 0
        k1 = k_tiles
    else:
        entry, off_m, off_n, sp, k0, k1 = _unit(unit, state, M, N, batch, splits, k_tiles, BLOCK_M, BLOCK_N, GROUP_M)
        row_end = M
    return entry, off_m, off_n, sp, k0, k1, row_end


@gluon.jit
def _unit(unit, tiles, M, N, batch, splits, k_tiles, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          GROUP_M: gl.constexpr):
    """(batch entry, off_m, off_n, K slice, first and end K block) of work unit `unit`: units
    slice-major (programs that run together read the same K range; slices of cdiv(k_tiles, splits)
    K blocks), then entry-major, each entry's tiles in grouped order (_grouped_tile)."""
    entry_tiles = tiles * batch
    sp = unit // entry_tiles
    tile = unit - sp * entry_tiles
    entry = tile // tiles
    off_m, off_n = _grouped_tile(tile - entry * tiles, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    per = gl.cdiv(k_tiles, splits)
    k0 = sp * per
    return entry, off_m, off_n, sp, k0, gl.minimum(k0 + per, k_tiles)


@gluon.jit
def _producer(a_desc, b0_desc, b1_desc, xs_desc, a0_bufs, a1_bufs, b0_bufs, b1_bufs, xs_bufs, ready, empty, M, N,
              k_tiles, splits, xs_group_stride, batch, a_batch_rows, b_batch_rows, GROUP_M: gl.constexpr,
              STAGES: gl.constexpr,
              XS_TMA: gl.constexpr, TWO: gl.constexpr, GATED: gl.constexpr, GROUPS: gl.constexpr,
              PACKED: gl.constexpr, expert_offsets, num_experts, EXPERTS: gl.constexpr, a_src, a_rows, stride_am, K,
              A_GATHER: gl.constexpr):
    """One warp (A_GATHER: GATHER_WARPS): for each of the program's tiles, TMA loads of each K block's A rows
    (GROUPS boxes of HALF rows, one per consumer warp group; PACKED: one box of the 4-bit weight's words for all
    of them, into a0_bufs), B column part(s) and (XS_TMA) the tile's activation scales into the next
    stage, once the consumers (and the decoder) have released it; it runs ahead into the next tile
    while the consumers finish the last one. Batched (batch entries): entry b's A rows start at row
    b * a_batch_rows of a_desc, its B rows at b * b_batch_rows of b0_desc / b1_desc.
    A_GATHER: A's rows r of the tile are a_src's rows a_rows[r] (r < M; stride_am apart, K values each),
    copied by cp.async (no TMA gather on Hopper) a step ahead of the stage's second arrival on `ready`
    (_copied; the first is the TMA loads' expect). Needs STAGES >= 3: the consumers release stage j - 2 before
    they wait for step j, which the producer completes while it fills step j + 1."""
    if PACKED:  # one box of the packed weight's words for the tile's rows
        HALF: gl.constexpr = a_desc.block_type.shape[0] // GROUPS
        a_bytes: gl.constexpr = a_desc.block_type.nbytes
    else:
        HALF: gl.constexpr = a_desc.block_type.shape[0]
        a_bytes: gl.constexpr = GROUPS * a_desc.block_type.nbytes
    A_K: gl.constexpr = a_desc.block_type.shape[1]  # A's K block in its elements
    B_K: gl.constexpr = b0_desc.block_type.shape[1]
    N0: gl.constexpr = b0_desc.block_type.shape[0]
    if GATED:  # the gate and up tiles of the same N0 columns
        BLOCK_N: gl.constexpr = N0
        b_bytes: gl.constexpr = 2 * b0_desc.block_type.nbytes
    elif TWO:
        BLOCK_N: gl.constexpr = N0 + b1_desc.block_type.shape[0]
        b_bytes: gl.constexpr = b0_desc.block_type.nbytes + b1_desc.block_type.nbytes
    else:
        BLOCK_N: gl.constexpr = N0
        b_bytes: gl.constexpr = b0_desc.block_type.nbytes
    if XS_TMA:
        nbytes: gl.constexpr = a_bytes + b_bytes + xs_desc.block_type.nbytes
    elif A_GATHER:  # (only B by TMA)
        nbytes: gl.constexpr = b_bytes
    else:
        nbytes: gl.constexpr = a_bytes + b_bytes
    if A_GATHER:  # (a thread's copy: 16 bytes of a row, VEC values)
        VEC: gl.constexpr = 128 // a0_bufs.dtype.primitive_bitwidth
        GL: gl.constexpr = gl.BlockedLayout([1, VEC], [4, 8], [GATHER_WARPS, 1], [1, 0])
        rr = gl.arange(0, HALF, layout=gl.SliceLayout(1, GL))
        kk = gl.arange(0, A_K, layout=gl.SliceLayout(0, GL))
        NW: gl.constexpr = GATHER_WARPS
    else:
        NW: gl.constexpr = 1
    it = 0
    state, units = _work_units(M, N, batch, splits, expert_offsets, num_experts, GROUPS * HALF, BLOCK_N, EXPERTS, NW)
    for unit in range(gl.program_id(0), units, gl.num_programs(0)):
        entry, off_m, off_n, _sp, k0, k1, _end = _work(unit, state, M, N, batch, splits, k_tiles, expert_offsets,
                                                       GROUPS * HALF, BLOCK_N, GROUP_M, EXPERTS)
        a_m = entry * a_batch_rows + off_m  # (the expert map: a_batch_rows 0, off_m x's row)
        b_n = entry * b_batch_rows + off_n
        if A_GATHER:  # the tile's source rows (rows past M: none, zeros)
            r0 = a_m + rr
            ok0 = r0 < M
            # (rows 16 bytes aligned: stride_am a multiple of VEC, which Triton assumes only of multiples of 16)
            src0 = gl.multiple_of(gl.load(a_rows + r0, mask=ok0, other=0).to(gl.int64) * stride_am, [VEC])
            ok1 = r0 + HALF < M
            src1 = gl.multiple_of(gl.load(a_rows + r0 + HALF, mask=ok1, other=0).to(gl.int64) * stride_am, [VEC])
        for ki in range(k0, k1):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)  # (the first round passes at once)
            if A_GATHER:
                k = ki * A_K + kk
                k_ok = gl.max_constancy(k < K, [VEC])[None, :]  # (K % VEC == 0: whole 16-byte copies or none)
                _cp_async(a0_bufs.index(s), a_src + src0[:, None] + k[None, :], mask=ok0[:, None] & k_ok)
                if GROUPS == 2:
                    _cp_async(a1_bufs.index(s), a_src + src1[:, None] + k[None, :], mask=ok1[:, None] & k_ok)
                async_copy.commit_group()
            mbarrier.expect(ready.index(s), nbytes)
            if XS_TMA:  # x_scale column-major: group ki's scales of rows off_m.. are contiguous
                _tma_load(xs_desc, [ki * xs_group_stride + off_m], ready.index(s), xs_bufs.index(s))
            if not A_GATHER:
                _tma_load(a_desc, [a_m, ki * A_K], ready.index(s), a0_bufs.index(s))
                if GROUPS == 2 and not PACKED:
                    _tma_load(a_desc, [a_m + HALF, ki * A_K], ready.index(s), a1_bufs.index(s))
            _tma_load(b0_desc, [b_n, ki * B_K], ready.index(s), b0_bufs.index(s))
            if GATED:
                _tma_load(b1_desc, [b_n, ki * B_K], ready.index(s), b1_bufs.index(s))
            elif TWO:
                _tma_load(b1_desc, [b_n + N0, ki * B_K], ready.index(s), b1_bufs.index(s))
            if A_GATHER:
                if it > 0:  # the step before's copies, done, made visible to the tensor cores (the async proxy)
                    _copied(ready.index((it - 1) % STAGES), 1)
            it += 1
    if A_GATHER:
        if it > 0:
            _copied(ready.index((it - 1) % STAGES), 0)


@gluon.jit
def _copied(bar, PENDING: gl.constexpr):
    """A_GATHER: once all but the last PENDING of the partition's cp.async groups are done, fenced for the
    async proxy (the consumers' products read them) by every thread, one arrival on `bar` (the stage's
    `ready`; the consumers' wait then needs no fence of their own between their products)."""
    async_copy.wait_group(PENDING)
    fence_async_shared()
    _cta_barrier()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _finish(acc, c, c_desc, c_smem, bias, b_scale, sa, row0, rm, row_ok, n0, N, stride_cm, stride_cn, stride_bsn,
            SUB: gl.constexpr, K_INSTR: gl.constexpr, SCALES: gl.constexpr, HAS_BIAS: gl.constexpr,
            C_TMA: gl.constexpr, PENDING: gl.constexpr, BIAS_ROWS: gl.constexpr = False, inside=True, rw=None,
            VEC_ROWS: gl.constexpr = False):
    """Epilogue of one SUB-wide column part of a warp group's rows: (SCALES_ROWCOL) the row scales
    `sa` and the columns' scales, the bias, the cast to c's dtype, then a masked pointer store,
    or (C_TMA) the part into its buffer `c_smem` and a TMA store from there that runs on while the
    warp group starts its next tile (PENDING: the stores issued since the previous one out of
    this buffer, which may still run); C_TMA_INSIDE: by TMA where the rows lie inside their batch
    entry (`inside`), else by pointers. BIAS_ROWS: the bias is per row (the weight's rows as A). rw: each row's
    weight (fp32, rm's layout), multiplying it after the bias (the expert map's routing weights). VEC_ROWS:
    pointer stores in 16-byte vectors along c's rows (the rows scattered)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, SUB, K_INSTR])
    rn = n0 + gl.arange(0, SUB, layout=gl.SliceLayout(0, mma))
    col_ok = rn < N
    if SCALES == SCALES_ROWCOL:  # per channel (stride 0: one value per tensor)
        acc = acc * sa[:, None] * gl.load(b_scale + rn * stride_bsn, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS and BIAS_ROWS:
        acc += gl.load(bias + rm, mask=row_ok, other=0.0).to(gl.float32)[:, None]
    elif HAS_BIAS:
        acc += gl.load(bias + rn, mask=col_ok, other=0.0).to(gl.float32)[None, :]
    if rw is not None:
        acc = acc * rw[:, None]
    if C_TMA == C_TMA_INSIDE:
        if inside:
            _tma_part(acc, c_desc, c_smem, row0, n0, PENDING)
        else:
            gl.store(c + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c.dtype.element_ty),
                     mask=row_ok[:, None] & col_ok[None, :])
    elif C_TMA:
        _tma_part(acc, c_desc, c_smem, row0, n0, PENDING)
    elif BIAS_ROWS:  # (the transposed tile: 16-byte vectors along its rows, c's contiguous dimension)
        _store_in(acc, c, rm, row_ok, n0, N, stride_cm, stride_cn, SUB,
                  gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1]))
    elif VEC_ROWS:
        _store_in(acc, c, rm, row_ok, n0, N, stride_cm, stride_cn, SUB,
                  gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))
    else:
        gl.store(c + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])


@gluon.jit
def _store_in(acc, c, rm, row_ok, n0, N, stride_cm, stride_cn, SUB: gl.constexpr, LAYOUT: gl.constexpr):
    """A part's masked pointer store, converted to LAYOUT first (16-byte vectors along c's contiguous dimension)."""
    out = gl.convert_layout(acc.to(c.dtype.element_ty), LAYOUT)
    rm_s = gl.convert_layout(rm, gl.SliceLayout(1, LAYOUT))
    rn_s = n0 + gl.arange(0, SUB, layout=gl.SliceLayout(0, LAYOUT))
    gl.store(c + rm_s[:, None] * stride_cm + rn_s[None, :] * stride_cn, out,
             mask=gl.convert_layout(row_ok, gl.SliceLayout(1, LAYOUT))[:, None] & (rn_s < N)[None, :])


@gluon.jit
def _tma_part(acc, c_desc, c_smem, row0, n0, PENDING: gl.constexpr):
    """The part into its output buffer, then a TMA store of it at (row0, n0)."""
    out = acc.to(c_desc.dtype)
    tma.store_wait(PENDING)  # this buffer's store of the previous tile has read it
    c_smem.store(out)
    fence_async_shared()
    _tma_store(c_desc, [row0, n0], c_smem)


@gluon.jit
def _gate_tile(gate, up, sa, b_scale, n0, N, stride_bsn, up_scale_offset, SUB: gl.constexpr, K_INSTR: gl.constexpr,
               SCALES: gl.constexpr, ACTIVATION: gl.constexpr):
    """ACTIVATION(gate) * up of a warp group's gate and up accumulators (HALF, SUB) in fp32, each
    scaled first for SCALES_ROWCOL: by the rows' `sa` and its columns' weight scales, the gate's at
    b_scale[n * stride_bsn], the up projection's at b_scale[up_scale_offset + n * stride_bsn]."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, SUB, K_INSTR])
    if SCALES == SCALES_ROWCOL:
        rn = n0 + gl.arange(0, SUB, layout=gl.SliceLayout(0, mma))
        col_ok = rn < N
        up = up * sa[:, None] * gl.load(b_scale + up_scale_offset + rn * stride_bsn, mask=col_ok, other=0.0)[None, :]
        gate = gate * sa[:, None] * gl.load(b_scale + rn * stride_bsn, mask=col_ok, other=0.0)[None, :]
    return activation(gate, ACTIVATION) * up


@gluon.jit
def _consumer(a_bufs, b0_bufs, b1_bufs, xs_bufs, ready, empty, decoded, c, c0_desc, c1_desc, c0_smem, c1_smem, bias, a_scale,
              b_scale, M, N, k_tiles, splits, split_rows, stride_cm, stride_cn, stride_asm, stride_ask, stride_bsn,
              stride_bsk, up_scale_offset, batch, c_batch_rows, bias_batch_stride, GROUP_M: gl.constexpr,
              STAGES: gl.constexpr, HALF: gl.constexpr,
              N0: gl.constexpr, N1: gl.constexpr, K_INSTR: gl.constexpr, ROLE: gl.constexpr, SCALES: gl.constexpr,
              XS_TMA: gl.constexpr, PROMOTE: gl.constexpr, HAS_BIAS: gl.constexpr, C_TMA: gl.constexpr,
              GATED: gl.constexpr, ACTIVATION: gl.constexpr, SHARE_C: gl.constexpr, GROUPS: gl.constexpr,
              PACKED: gl.constexpr, C_T: gl.constexpr, expert_offsets, num_experts, bs_batch_stride,
              EXPERTS: gl.constexpr, A_GATHER: gl.constexpr, c_rows, row_weights, C_SCATTER: gl.constexpr,
              ROW_WEIGHTS: gl.constexpr, a_rows):
    """One warp group: rows [ROLE * HALF, (ROLE + 1) * HALF) of each of the program's tiles
    (GROUPS * HALF rows: one group per tile of HALF rows, or two), in
    column parts of N0 and (N1 > 0) N1 columns, each its own product and accumulator.
    PROMOTE: per K block and part, issue the product, wait for it, promote it (times the block's
    scales for SCALES_KBLOCK) while the other group's runs; one product at a time is held beside
    the accumulators. The next block's scales are loaded right after the last product is issued:
    the fence before each product waits for register loads in flight, so a load issued before it
    would put its latency between two products.
    Else the tensor cores accumulate, one K block's products in flight while the next are issued.
    GATED: the two parts are the gate and up products of the same N0 columns; the tile stored is
    ACTIVATION(gate) * up (each times its scales for SCALES_ROWCOL) in N0 columns.
    PACKED (a 4-bit weight as A, accumulating): a stage's A tile is read once the decoder has written it
    (`decoded`); the bias is per row, and K slice s of a tile goes to rows s * split_rows.. of x's (c's
    rows: the kernel's columns). C_T (dense operands swapped by the caller: A the weight, B x): the same
    transposed store and per-row bias, batch entry e's output at e * c_batch_rows rows of c (x's rows)."""
    mma0: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                   instr_shape=[16, N0, K_INSTR])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma0)
    TWO: gl.constexpr = N1 > 0
    if TWO:
        W1: gl.constexpr = N1
    else:
        W1: gl.constexpr = N0  # (an accumulator that is never used)
    mma1: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                   instr_shape=[16, W1, K_INSTR])
    rows1_l: gl.constexpr = gl.SliceLayout(1, mma1)
    # the stores a part's output buffer may leave in flight when it is written again: the other part's,
    # where each part has a buffer of its own
    PEND: gl.constexpr = 1 if TWO and not GATED and not SHARE_C else 0
    if GATED:
        BLOCK_N: gl.constexpr = N0
    else:
        BLOCK_N: gl.constexpr = N0 + N1
    it = 0
    state, units = _work_units(M, N, batch, splits, expert_offsets, num_experts, GROUPS * HALF, BLOCK_N, EXPERTS, 4)
    for unit in range(gl.program_id(0), units, gl.num_programs(0)):
        entry, off_m, off_n, sp, k0, k1, row_end = _work(unit, state, M, N, batch, splits, k_tiles, expert_offsets,
                                                         GROUPS * HALF, BLOCK_N, GROUP_M, EXPERTS)
        if SCALES == SCALES_NONE:
            b_scale_e = b_scale
        else:  # (the expert's weight scales)
            b_scale_e = b_scale + entry * bs_batch_stride
        rm = off_m + ROLE * HALF + gl.arange(0, HALF, layout=rows_l)
        row_ok = rm < row_end
        acc0 = gl.zeros((HALF, N0), dtype=gl.float32, layout=mma0)
        acc1 = gl.zeros((HALF, W1), dtype=gl.float32, layout=mma1)
        if PROMOTE:
            if SCALES == SCALES_KBLOCK:
                sb_row = b_scale_e + (off_n // N0) * stride_bsn
                has1 = off_n + N0 < N  # (TWO: the tile's second weight scale group exists)
                sa_cur = gl.load(a_scale + rm * stride_asm + k0 * stride_ask, mask=row_ok, other=0.0)
                sb0 = gl.load(sb_row + k0 * stride_bsk)
                sb1 = gl.load(sb_row + stride_bsn + k0 * stride_bsk, mask=TWO and has1, other=0.0)
            for ki in range(k0, k1):
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                # this block's scales from its stage, read before the product is issued: read after its
                # wait, the last K block's came out wrong for the second warp group with persistent tiles
                # (the stage refilled first; scripts/ws_check.py)
                if SCALES == SCALES_KBLOCK and XS_TMA:
                    sa_cur = xs_bufs.index(s).slice(ROLE * HALF, HALF).load(rows_l)
                zero = gl.zeros((HALF, N0), dtype=gl.float32, layout=mma0)
                p = warpgroup_mma(a_bufs.index(s), b0_bufs.index(s).permute((1, 0)), zero, use_acc=False,
                                  is_async=True)
                if TWO:
                    p = warpgroup_mma_wait(num_outstanding=0, deps=(p, ))
                    if SCALES == SCALES_KBLOCK:
                        acc0 += p * (sa_cur * sb0)[:, None]
                    else:
                        acc0 += p
                    zero1 = gl.zeros((HALF, W1), dtype=gl.float32, layout=mma1)
                    p1 = warpgroup_mma(a_bufs.index(s), b1_bufs.index(s).permute((1, 0)), zero1, use_acc=False,
                                       is_async=True)
                if SCALES == SCALES_KBLOCK:
                    kn = gl.minimum(ki + 1, k1 - 1)
                    sa_nxt = sa_cur
                    if not XS_TMA:
                        sa_nxt = gl.load(a_scale + rm * stride_asm + kn * stride_ask, mask=row_ok, other=0.0)
                    sb0_nxt = gl.load(sb_row + kn * stride_bsk)
                    sb1_nxt = gl.load(sb_row + stride_bsn + kn * stride_bsk, mask=TWO and has1, other=0.0)
                if TWO:
                    p1 = warpgroup_mma_wait(num_outstanding=0, deps=(p1, ))
                    mbarrier.arrive(empty.index(s), count=1)
                    if SCALES == SCALES_KBLOCK:
                        acc1 += p1 * gl.convert_layout(sa_cur * sb1, rows1_l)[:, None]
                    else:
                        acc1 += p1
                else:
                    p = warpgroup_mma_wait(num_outstanding=0, deps=(p, ))
                    mbarrier.arrive(empty.index(s), count=1)
                    if SCALES == SCALES_KBLOCK:
                        acc0 += p * (sa_cur * sb0)[:, None]
                    else:
                        acc0 += p
                if SCALES == SCALES_KBLOCK:
                    sa_cur = sa_nxt
                    sb0 = sb0_nxt
                    sb1 = sb1_nxt
                it += 1
        else:  # the tensor cores accumulate: this K block's products run while the next block's are issued
            prev = 0
            for ki in range(k0, k1):
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                if PACKED:
                    mbarrier.wait(decoded.index(s), (it // STAGES) & 1)
                acc0 = warpgroup_mma(a_bufs.index(s), b0_bufs.index(s).permute((1, 0)), acc0, is_async=True)
                if TWO:
                    acc1 = warpgroup_mma(a_bufs.index(s), b1_bufs.index(s).permute((1, 0)), acc1, is_async=True)
                    acc0, acc1 = warpgroup_mma_wait(num_outstanding=2, deps=(acc0, acc1))
                else:
                    acc0 = warpgroup_mma_wait(num_outstanding=1, deps=(acc0, ))
                mbarrier.arrive(empty.index(prev), count=1, pred=ki > k0)  # the previous block's stage is read
                prev = s
                it += 1
            if TWO:
                acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
            else:
                acc0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, ))
            mbarrier.arrive(empty.index(prev), count=1)
        # (split_rows: a K slice's rows in the workspace c; c_batch_rows: a batch entry's rows in c)
        row0 = sp * split_rows + entry * c_batch_rows + off_m + ROLE * HALF
        if PACKED or C_T:  # (c is the output transposed: x's rows (a K slice's, an entry's) are the kernel's columns)
            c_e = c + (sp * split_rows + entry * c_batch_rows) * stride_cn
        else:
            c_e = c + entry * c_batch_rows * stride_cm
        if HAS_BIAS:
            bias_e = bias + entry * bias_batch_stride
        else:
            bias_e = bias
        if SCALES == SCALES_ROWCOL and A_GATHER:  # per token: the gathered row's
            sa = gl.load(a_scale + gl.load(a_rows + rm, mask=row_ok, other=0) * stride_asm, mask=row_ok, other=0.0)
        elif SCALES == SCALES_ROWCOL:  # per token (stride 0: one value per tensor)
            sa = gl.load(a_scale + rm * stride_asm, mask=row_ok, other=0.0)
        else:
            sa = rm.to(gl.float32)  # (unused)
        inside = off_m + (ROLE + 1) * HALF <= row_end  # (C_TMA_INSIDE: this group's rows lie inside the entry)
        if GATED:
            out = _gate_tile(acc0, acc1, sa, b_scale_e, off_n, N, stride_bsn, up_scale_offset, N0, K_INSTR, SCALES,
                             ACTIVATION)
            _finish(out, c_e, c0_desc, c0_smem, bias_e, b_scale, sa, row0, rm, row_ok, off_n, N, stride_cm, stride_cn,
                    stride_bsn, N0, K_INSTR, SCALES_NONE, False, C_TMA, PEND, False, inside)
        else:
            # (the expert map: C_SCATTER, row r stored at c's row c_rows[r]; ROW_WEIGHTS, times row_weights[that row])
            if C_SCATTER:
                rm_c = gl.load(c_rows + rm, mask=row_ok, other=0)
            else:
                rm_c = rm
            if ROW_WEIGHTS:
                rw = gl.load(row_weights + rm_c, mask=row_ok, other=0.0).to(gl.float32)
            else:
                rw = None
            _finish(acc0, c_e, c0_desc, c0_smem, bias_e, b_scale_e, sa, row0, rm_c, row_ok, off_n, N, stride_cm,
                    stride_cn, stride_bsn, N0, K_INSTR, SCALES, HAS_BIAS, C_TMA, PEND, PACKED or C_T, inside, rw,
                    C_SCATTER)
        if TWO and not GATED:
            rm1 = off_m + ROLE * HALF + gl.arange(0, HALF, layout=rows1_l)
            if C_SCATTER:
                rm1_c = gl.convert_layout(rm_c, rows1_l)
            else:
                rm1_c = rm1
            if ROW_WEIGHTS:
                rw1 = gl.convert_layout(rw, rows1_l)
            else:
                rw1 = None
            _finish(acc1, c_e, c1_desc, c1_smem, bias_e, b_scale_e, gl.convert_layout(sa, rows1_l), row0, rm1_c,
                    rm1 < row_end,
                    off_n + N0, N, stride_cm, stride_cn, stride_bsn, W1, K_INSTR, SCALES, HAS_BIAS, C_TMA, PEND,
                    PACKED or C_T, inside, rw1, C_SCATTER)
    if C_TMA:
        tma.store_wait(0)  # the last stores read the c buffers: finished before the program ends


@gluon.jit
def _packed_scales(b_scale, b_zero, off_n, ki, N, stride_bsn, stride_bsk, stride_bzn, stride_bzk, group_shift,
                   HAS_ZERO: gl.constexpr, BN: gl.constexpr, SW: gl.constexpr, SL: gl.constexpr):
    """The raw scales (and zero points: HAS_ZERO) of weight rows off_n.. at 64-deep K block ki as (BN, SW)
    tiles (rows past N: 0), for _scale_values: SW = 1, INT4 groups of 64 * 2^group_shift (or one per
    channel); SW = 8, one per word: INT4 groups of 32, MXFP4's e8m0 blocks of 32. Nothing here waits for
    the loads."""
    rn = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, SL))
    ok = (rn < N)[:, None]
    if SW == 1:
        col = gl.full([1], 0, gl.int32, gl.SliceLayout(0, SL)) + (ki >> group_shift)
    else:
        col = ki * 2 + gl.arange(0, 8, layout=gl.SliceLayout(0, SL)) // 4
    s = gl.load(b_scale + rn[:, None] * stride_bsn + col[None, :] * stride_bsk, mask=ok, other=0)
    if HAS_ZERO:
        z = gl.load(b_zero + rn[:, None] * stride_bzn + col[None, :] * stride_bzk, mask=ok, other=0)
    else:
        z = s
    return s, z


@gluon.jit
def _scale_values(s, z, W_FORMAT: gl.constexpr, HAS_ZERO: gl.constexpr, BASE: gl.constexpr, DT: gl.constexpr):
    """What the decoder's ring holds of _packed_scales' loads: INT4, the int32 pairs (s, s) and (BASE + z,
    BASE + z) of x's dtype (zero point 8 without HAS_ZERO) that _pairs_ptx takes; MXFP4, e8m0 as the bf16
    2^(e - 127) twice (e = 0: 2^-127; 255: NaN; rows past N: 2^-127 times zero words)."""
    if W_FORMAT == W_MXFP4:
        e = s.to(gl.int32)
        bits = gl.where(e == 0, 0x40, gl.where(e == 255, 0x7FC0, e << 7))
        sv = bits.to(gl.int16).to(gl.bfloat16, bitcast=True)
        zv = sv
    else:  # INT4: int32 pairs for _pairs_ptx, (s, s) and (BASE + z, BASE + z)
        if HAS_ZERO:
            zd = (z.to(gl.float32) + BASE).to(DT)
        else:
            zd = gl.full(s.shape, BASE + 8.0, DT, s.type.layout)
        sd = s.to(DT)
        sv = _pair(sd, sd)
        zv = _pair(zd, zd)
    return sv, zv


@gluon.jit
def _pair(lo, hi):
    """The int32 of two 16-bit floats, lo in the low half."""
    return (lo.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF) | (hi.to(gl.int16, bitcast=True).to(gl.int32) << 16)


@gluon.jit
def _load_rows(wq, sc, zb, r0: gl.constexpr, W_FORMAT: gl.constexpr, WL: gl.constexpr):
    """(words, scales, BASE + zero points) of rows r0 .. r0 + DEC_ROWS of a K block's packed words `wq` (rows x
    BLOCK_K / 8 int32, 8 consecutive K values per word) and its scales' ring slots sc / zb, in WL."""
    words = wq.slice(r0, DEC_ROWS).load(WL)
    s = sc.slice(r0, DEC_ROWS).load(WL)
    if W_FORMAT == W_MXFP4:
        z = s
    else:
        z = zb.slice(r0, DEC_ROWS).load(WL)
    return words, s, z


@gluon.jit
def _decode_rows(words, s, z, dst, W_FORMAT: gl.constexpr, FP16: gl.constexpr):
    """_load_rows' words as x's dtype values (q - z) s (INT4) or e2m1 * 2^(e - 127) (MXFP4) into the A tile
    `dst` (DEC_ROWS rows), in K order."""
    if DEC_WORK == 0:
        return
    if W_FORMAT == W_MXFP4:
        o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
            _DECODE_E2M1, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [words], dtype=(gl.bfloat16,) * 8, is_pure=True, pack=2)
        v0, v1, v2, v3 = _scaled(o0, s), _scaled(o1, s), _scaled(o2, s), _scaled(o3, s)
        v4, v5, v6, v7 = _scaled(o4, s), _scaled(o5, s), _scaled(o6, s), _scaled(o7, s)
        # register i holds element i of each word: (row, word, i0, i1, i2) -> (row, word, i2, i1, i0), K order
        t = gl.join(gl.join(gl.join(v0, v1), gl.join(v2, v3)), gl.join(gl.join(v4, v5), gl.join(v6, v7)))
        t = gl.reshape(gl.permute(t, [0, 1, 4, 3, 2]), [DEC_ROWS, 8 * words.shape[1]])
        dst.store(t)
    else:  # INT4: each register two neighbouring values of a word, stored as int32 in the 16-bit tile's bytes
        words, s = gl.broadcast(words, s)
        words, z = gl.broadcast(words, z)
        p0, p1, p2, p3 = gl.inline_asm_elementwise(_PAIRS_FP16 if FP16 else _PAIRS_BF16, "=r,=r,=r,=r,r,r,r",
                                                   [words, s, z], dtype=(gl.int32,) * 4, is_pure=True, pack=1)
        # (row, word, pair j0, j1) -> (row, word, j1, j0): int32 column 4 w + j holds K 8 w + 2 j, + 1
        t = gl.permute(gl.join(gl.join(p0, p1), gl.join(p2, p3)), [0, 1, 3, 2])
        t = gl.reshape(t, [DEC_ROWS, 4 * words.shape[1]])
        if DEC_WORK == 1:
            if gl.program_id(0) < 0:
                _as_int32(dst, DEC_ROWS, 4 * words.shape[1]).store(t)
        else:
            _as_int32(dst, DEC_ROWS, 4 * words.shape[1]).store(t)


@gluon.jit
def _step_after(unit, ki, k1, off_m, tiles, units, M, N, splits, k_tiles, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(unit, K block, end K block, off_m) of the step after (unit, ki) in a program's stream of units
    (past its last unit: the launch's last unit's)."""
    ki += 1
    if ki >= k1:
        unit += gl.num_programs(0)
        _e, off_m, _n, _s, ki, k1 = _unit(gl.minimum(unit, units - 1), tiles, M, N, 1, splits, k_tiles, BLOCK_M,
                                          BLOCK_N, GROUP_M)
    return unit, ki, k1, off_m


@gluon.jit
def _decoder(wq_bufs, a0_bufs, a1_bufs, sc_ring, zb_ring, ready, empty, decoded, b_scale, b_zero, M, N, k_tiles,
             splits, stride_bsn, stride_bsk, stride_bzn, stride_bzk, group_shift, GROUP_M: gl.constexpr,
             STAGES: gl.constexpr, BLOCK_N: gl.constexpr, W_FORMAT: gl.constexpr, HAS_ZERO: gl.constexpr,
             FP16: gl.constexpr, SW: gl.constexpr, GROUPS: gl.constexpr):
    """DEC_WARPS warps (W_FORMAT INT4 / MXFP4: the weight is A, its rows the kernel's M): for each K block of
    the program's tiles, once its stage's packed words have come, writes the weight's values of the tile's
    GROUPS * DEC_ROWS rows into the stage's A buffers (a0_bufs: the first DEC_ROWS rows, a1_bufs: the next),
    then releases them to the consumers (`decoded`) and the words to the producer (`empty`). The scales of
    the block after the next are loaded while this one is decoded and stored, converted, to the two-slot
    ring (sc_ring, zb_ring: (2, rows, SW)) one block later: their latency is never waited for."""
    BM: gl.constexpr = GROUPS * DEC_ROWS
    DT: gl.constexpr = a0_bufs.dtype
    BASE: gl.constexpr = 1024.0 if FP16 else 128.0  # the decoded values' offset (gemm_w4_decode._decode_ptx)
    WL: gl.constexpr = gl.BlockedLayout([1, 2], [8, 4], [DEC_WARPS, 1], [1, 0])  # a thread: two words of a row
    if SW == 1:
        SL: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [DEC_WARPS, 1], [1, 0])
    else:
        SL: gl.constexpr = WL
    tiles, units = _units(M, N, 1, splits, BM, BLOCK_N)
    pid = gl.program_id(0)
    _e, m_a, _n, _s, k_a, e_a = _unit(pid, tiles, M, N, 1, splits, k_tiles, BM, BLOCK_N, GROUP_M)
    s_n, z_n = _packed_scales(b_scale, b_zero, m_a, k_a, M, stride_bsn, stride_bsk, stride_bzn, stride_bzk,
                              group_shift, HAS_ZERO, BM, SW, SL)
    sv, zv = _scale_values(s_n, z_n, W_FORMAT, HAS_ZERO, BASE, DT)
    sc_ring.index(0).store(sv)
    zb_ring.index(0).store(zv)
    lu, lk, le, lm = _step_after(pid, k_a, e_a, m_a, tiles, units, M, N, splits, k_tiles, BM, BLOCK_N, GROUP_M)
    s_n, z_n = _packed_scales(b_scale, b_zero, lm, lk, M, stride_bsn, stride_bsk, stride_bzn, stride_bzk,
                              group_shift, HAS_ZERO, BM, SW, SL)
    lu, lk, le, lm = _step_after(lu, lk, le, lm, tiles, units, M, N, splits, k_tiles, BM, BLOCK_N, GROUP_M)
    _cta_barrier()
    it = 0
    for unit in range(pid, units, gl.num_programs(0)):
        _e, off_m, _n, _s, k0, k1 = _unit(unit, tiles, M, N, 1, splits, k_tiles, BM, BLOCK_N, GROUP_M)
        for ki in range(k0, k1):
            s = it % STAGES
            r = it % 2
            # the next block's scales (loaded a block ago) into the other slot (read two blocks ago: the
            # barrier below has passed since), and the loads of the one after
            sv, zv = _scale_values(s_n, z_n, W_FORMAT, HAS_ZERO, BASE, DT)
            sc_ring.index(1 - r).store(sv)
            zb_ring.index(1 - r).store(zv)
            s_n, z_n = _packed_scales(b_scale, b_zero, lm, lk, M, stride_bsn, stride_bsk, stride_bzn, stride_bzk,
                                      group_shift, HAS_ZERO, BM, SW, SL)
            lu, lk, le, lm = _step_after(lu, lk, le, lm, tiles, units, M, N, splits, k_tiles, BM, BLOCK_N, GROUP_M)
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            # both halves' words read before either is decoded (the reads' latency once, not after a store)
            w0, s0, z0 = _load_rows(wq_bufs.index(s), sc_ring.index(r), zb_ring.index(r), 0, W_FORMAT, WL)
            if GROUPS == 2:
                w1, s1, z1 = _load_rows(wq_bufs.index(s), sc_ring.index(r), zb_ring.index(r), DEC_ROWS, W_FORMAT, WL)
            _decode_rows(w0, s0, z0, a0_bufs.index(s), W_FORMAT, FP16)
            if GROUPS == 2:
                _decode_rows(w1, s1, z1, a1_bufs.index(s), W_FORMAT, FP16)
            fence_async_shared()  # the values are read by the tensor cores (the async proxy)
            _cta_barrier()  # every thread's values and fence: then one arrival for the partition
            mbarrier.arrive(decoded.index(s), count=1)
            mbarrier.arrive(empty.index(s), count=1)
            it += 1


@gluon.jit
def gemm_ws_kernel(a_desc, b0_desc, b1_desc, xs_desc, c, c0_desc, c1_desc, bias, a_scale, b_scale, b_zero,
                   expert_offsets, a_src, a_rows, c_rows, row_weights, M, N, K, splits, split_rows, xs_group_stride, stride_cm, stride_cn, stride_asm,
                   stride_ask, stride_bsn, stride_bsk, stride_bzn, stride_bzk, group_shift,
                   up_scale_offset, batch, a_batch_rows, b_batch_rows, c_batch_rows, bias_batch_stride, num_experts,
                   bs_batch_stride, stride_am, GROUP_M: gl.constexpr, STAGES: gl.constexpr, SCALES: gl.constexpr,
                   XS_TMA: gl.constexpr, PROMOTE: gl.constexpr, TWO: gl.constexpr, HAS_BIAS: gl.constexpr,
                   C_TMA: gl.constexpr, GATED: gl.constexpr = False, ACTIVATION: gl.constexpr = "none",
                   SHARE_C: gl.constexpr = False, GROUPS: gl.constexpr = 2, W_FORMAT: gl.constexpr = 0,
                   HAS_ZERO: gl.constexpr = False, SW: gl.constexpr = 1, C_T: gl.constexpr = False,
                   EXPERTS: gl.constexpr = 0, A_GATHER: gl.constexpr = False, C_SCATTER: gl.constexpr = False,
                   ROW_WEIGHTS: gl.constexpr = False):
    """c (M, N) = x (a_desc: (M, K), boxes of HALF x BLOCK_K) @ w (b0_desc / b1_desc: (N, K), boxes
    of N0 / N1 x BLOCK_K) in (2 * HALF) x (N0 + N1) tiles (N1 = 0 unless TWO), persistent: program
    p takes work units p, p + programs, ... (4 warps launched: the first consumer; a second
    consumer warp group and a producer warp are added). A unit is a tile (in grouped order) and
    one of `splits` K slices; splits > 1: slice s of the tile goes to rows s * split_rows + .. of
    c, an fp32 workspace (split_rows >= M) that kernels/reduce.py sum_k_slices adds up (no bias
    here). C_TMA: c0_desc / c1_desc (boxes of HALF x N0 / N1 over c) store the output, else
    pointer stores through c. SHARE_C (TWO, N1 == N0, C_TMA): one output buffer per warp group for
    both parts, the second part waiting for the first's store (shared memory for a stage more).
    GATED (fused feed-forward, no promotion, one slice): b0_desc is the gate weight (N, K) and
    b1_desc the up weight (N, K, same box); c (M, N) = ACTIVATION(x @ gate^T) * (x @ up^T) in
    2 * HALF x N0 tiles, no bias (SCALES_ROWCOL: the up weight's scales at b_scale + up_scale_offset).
    GROUPS = 1 (the tensor cores' accumulation, not gated): tiles of HALF rows, one consumer warp
    group (more tiles where those of 2 * HALF rows leave SMs idle).
    Batched (batch > 1; one K slice, no scales): `batch` independent problems of (M, N, K) whose
    rows lie at a_batch_rows / b_batch_rows / c_batch_rows per entry in the descriptors' and c's
    rows (b_batch_rows 0: one weight for every entry), bias_batch_stride elements apart in bias; a
    tile's rows past M (or columns past N) read the next entry's, and are not stored: with M not a
    multiple of the tile's rows C_TMA is C_TMA_INSIDE (a warp group's rows that cross the entry's
    end stored by pointers).
    W_FORMAT INT4 / MXFP4 (a 4-bit weight; bf16 / fp16 x, MXFP4: bf16; accumulating, one batch entry, not
    gated, pointer stores): the kernel computes c^T = w x^T, the weight being A: a_desc is over the packed
    weight (gemmkit's layout, uint8 (M, K // 2): M is the weight's rows here) viewed as int32 (M, K // 8), one
    box of GROUPS * 64 rows x BLOCK_K / 8 words per tile and K block, and b0_desc / b1_desc over x (N, K), N
    its rows; a decoder partition (_decoder) writes each K block's values into the A buffers: INT4 (q - z) s
    in x's dtype, scales b_scale (M, G) with zero points b_zero (M, G) uint8 (HAS_ZERO; else 8), groups of
    64 * 2^group_shift K (SW = 1) or 32 (SW = 8); MXFP4 e2m1 with b_scale (M, K // 32) uint8 e8m0 (SW = 8).
    The caller passes c's strides swapped (stride_cm along the weight's rows) and a per-row bias; with
    splits > 1 slice s goes to c's rows (x's) s * split_rows... K a multiple of BLOCK_K.
    C_T (bf16 / fp16 whose rows the tiles' rows would pad: core/hopper_ws.ws_ragged_tiles, ws_batched_swap): the
    caller swaps the dense operands, a_desc over the weight (M: its rows) and b0_desc / b1_desc over x (N: x's
    rows (per entry), a fitted tile width of them), c's strides swapped as for W_FORMAT, a per-row bias, entry e's
    output at row e * c_batch_rows of c, K slice s at row s * split_rows of the workspace (pointer stores,
    accumulating, no scales).
    EXPERTS > 0 (grouped GEMM, mixture-of-experts; a power of two >= num_experts): expert e owns x's and c's rows
    [expert_offsets[e], expert_offsets[e + 1]) (int32, on the device: the work units are counted there) and
    multiplies them by its weight, rows e * b_batch_rows.. of b0_desc (b1_desc: GATED's up weight at the same
    rows of its own view); tiles (in grouped order over the experts' tile-rows one after the other) read past
    their expert's rows into the next one's and store only its own (C_TMA_INSIDE or pointer stores); bias per
    expert at bias_batch_stride, weight scales (SCALES_ROWCOL / SCALES_KBLOCK) at bs_batch_stride per expert.
    A_GATHER (with the expert map; a_desc unused but for its box's layout): A's row r is a_src's row a_rows[r]
    (int32 / int64, r < M; rows stride_am elements apart; K a multiple of 16 bytes' values), copied by the
    producer's cp.async (GATHER_WARPS warps); SCALES_ROWCOL's per-token scales are read through a_rows too.
    C_SCATTER (the expert map, not gated, pointer stores): row r of the product goes to c's row c_rows[r];
    ROW_WEIGHTS: times row_weights[its row of c] (after the bias; moe_mlp's down projection)."""
    PACKED: gl.constexpr = W_FORMAT != W_DENSE
    if PACKED:
        HALF: gl.constexpr = DEC_ROWS
        BLOCK_K: gl.constexpr = b0_desc.block_type.shape[1]
        OP_DT: gl.constexpr = b0_desc.dtype
    else:
        HALF: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        OP_DT: gl.constexpr = a_desc.dtype
    N0: gl.constexpr = b0_desc.block_type.shape[0]
    if TWO:
        N1: gl.constexpr = b1_desc.block_type.shape[0]
    else:
        N1: gl.constexpr = 0
    K_INSTR: gl.constexpr = 256 // OP_DT.primitive_bitwidth  # one wgmma's K: 32 bytes
    gl.static_assert(PROMOTE or SCALES != SCALES_KBLOCK, "block scales apply as each block is promoted")
    gl.static_assert(SCALES != SCALES_KBLOCK or (N0 == 128 and (not TWO or N1 == 128)),
                     "block-scaled column parts of one weight scale group")
    gl.static_assert(not GATED or (TWO and N1 == N0 and not PROMOTE and not HAS_BIAS and SCALES != SCALES_KBLOCK),
                     "gated: equal gate and up parts, the tensor cores' accumulation, no bias")
    gl.static_assert(not SHARE_C or (TWO and N1 == N0 and C_TMA != 0), "a shared output buffer: two equal parts")
    gl.static_assert(GROUPS == 2 or (GROUPS == 1 and not PROMOTE and not GATED), "one warp group: accumulating tiles")
    gl.static_assert(not PACKED or (not PROMOTE and not GATED and C_TMA == 0 and SCALES == SCALES_NONE),
                     "4-bit weight: accumulating, pointer stores")
    gl.static_assert(EXPERTS == 0 or (not PACKED and not C_T), "the expert map: dense operands, not swapped")
    gl.static_assert(not A_GATHER or (EXPERTS > 0 and not XS_TMA and STAGES >= 3), "gathered rows: the expert map")
    gl.static_assert(not (C_SCATTER or ROW_WEIGHTS) or (EXPERTS > 0 and not GATED and C_TMA == 0),
                     "scattered / weighted rows: the expert map, pointer stores")
    gl.static_assert(not C_T or (not PACKED and not PROMOTE and not GATED and C_TMA == 0 and SCALES == SCALES_NONE),
                     "swapped dense operands: bf16 / fp16, accumulating, pointer stores")
    if PACKED:  # the words by TMA; the values the decoder writes, laid out as x's tiles
        wq_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, GROUPS * HALF, BLOCK_K // 8], a_desc.layout)
        a_layout: gl.constexpr = b0_desc.layout
    else:
        a_layout: gl.constexpr = a_desc.layout
    a0_bufs = gl.allocate_shared_memory(OP_DT, [STAGES, HALF, BLOCK_K], a_layout)
    if GROUPS == 2:
        a1_bufs = gl.allocate_shared_memory(OP_DT, [STAGES, HALF, BLOCK_K], a_layout)
    else:  # (unused)
        a1_bufs = a0_bufs
    if not PACKED:
        wq_bufs = a0_bufs  # (unused)
    b0_bufs = gl.allocate_shared_memory(b0_desc.dtype, [STAGES, N0, BLOCK_K], b0_desc.layout)
    if TWO:
        b1_bufs = gl.allocate_shared_memory(b1_desc.dtype, [STAGES, N1, BLOCK_K], b1_desc.layout)
    else:  # (unused)
        b1_bufs = b0_bufs
    if PACKED:  # the decoder's scales
        ring_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        if W_FORMAT == W_INT4:  # (_scale_values' int32 pairs)
            sc_ring = gl.allocate_shared_memory(gl.int32, [2, GROUPS * HALF, SW], ring_l)
            zb_ring = gl.allocate_shared_memory(gl.int32, [2, GROUPS * HALF, SW], ring_l)
        else:
            sc_ring = gl.allocate_shared_memory(OP_DT, [2, GROUPS * HALF, SW], ring_l)
            zb_ring = sc_ring  # (unused)
    xs_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 2 * HALF], xs_desc.layout)
    if C_TMA:  # per warp group, a buffer per column part
        cA0 = gl.allocate_shared_memory(c0_desc.dtype, [HALF, N0], c0_desc.layout)
        if GROUPS == 2:
            cB0 = gl.allocate_shared_memory(c0_desc.dtype, [HALF, N0], c0_desc.layout)
        else:  # (unused)
            cB0 = cA0
        if TWO and not GATED and not SHARE_C:
            cA1 = gl.allocate_shared_memory(c1_desc.dtype, [HALF, N1], c1_desc.layout)
            if GROUPS == 2:
                cB1 = gl.allocate_shared_memory(c1_desc.dtype, [HALF, N1], c1_desc.layout)
            else:  # (unused)
                cB1 = cA1
        else:  # (unused)
            cA1 = cA0
            cB1 = cB0
    else:  # (unused)
        cA0 = xs_bufs
        cB0 = xs_bufs
        cA1 = xs_bufs
        cB1 = xs_bufs
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    if PACKED:
        decoded = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    else:  # (unused)
        decoded = ready
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=2 if A_GATHER else 1)  # (A_GATHER: the copies' arrival too)
        mbarrier.init(empty.index(i), count=GROUPS + 1 if PACKED else GROUPS)  # (the decoder's words)
        if PACKED:
            mbarrier.init(decoded.index(i), count=1)
    k_tiles = gl.cdiv(K, BLOCK_K)
    # (the partitions' argument tuples are written out in each call: a tuple kept in a variable holds no strings
    # (ACTIVATION) and passes its constexprs on as plain values (N1, TWO, ...: tried with Triton 3.9's Gluon))
    if GROUPS == 2 and PACKED:
        gl.warp_specialize([
            (_consumer, (a0_bufs, b0_bufs, b1_bufs, xs_bufs, ready, empty, decoded, c, c0_desc, c1_desc, cA0, cA1, bias,
                         a_scale, b_scale, M, N, k_tiles, splits, split_rows, stride_cm, stride_cn, stride_asm,
                         stride_ask, stride_bsn, stride_bsk, up_scale_offset, batch, c_batch_rows, bias_batch_stride,
                         GROUP_M, STAGES, HALF, N0, N1, K_INSTR, 0, SCALES, XS_TMA, PROMOTE, HAS_BIAS, C_TMA, GATED,
                         ACTIVATION, SHARE_C, GROUPS, PACKED, C_T, expert_offsets, num_experts, bs_batch_stride,
                         EXPERTS, A_GATHER, c_rows, row_weights, C_SCATTER, ROW_WEIGHTS,
                         a_rows)),
            (_consumer, (a1_bufs, b0_bufs, b1_bufs, xs_bufs, ready, empty, decoded, c, c0_desc, c1_desc, cB0, cB1, bias,
                         a_scale, b_scale, M, N, k_tiles, splits, split_rows, stride_cm, stride_cn, stride_asm,
                         stride_ask, stride_bsn, stride_bsk, up_scale_offset, batch, c_batch_rows, bias_batch_stride,
                         GROUP_M, STAGES, HALF, N0, N1, K_INSTR, 1, SCALES, XS_TMA, PROMOTE, HAS_BIAS, C_TMA, GATED,
                         ACTIVATION, SHARE_C, GROUPS, PACKED, C_T, expert_offsets, num_experts, bs_batch_stride,
                         EXPERTS, A_GATHER, c_rows, row_weights, C_SCATTER, ROW_WEIGHTS,
                         a_rows)),
            (_producer, (a_desc, b0_desc, b1_desc, xs_desc, wq_bufs, a1_bufs, b0_bufs, b1_bufs, xs_bufs, ready,
                         empty, M, N, k_tiles, splits, xs_group_stride, batch, a_batch_rows, b_batch_rows, GROUP_M,
                         STAGES, XS_TMA, TWO, GATED, GROUPS, PACKED, expert_offsets, num_experts, EXPERTS, a_src,
                         a_rows, stride_am, K, A_GATHER)),
            (_decoder, (wq_bufs, a0_bufs, a1_bufs, sc_ring, zb_ring, ready, empty, decoded, b_scale, b_zero, M, N,
                        k_tiles, splits, stride_bsn, stride_bsk, stride_bzn, stride_bzk, group_shift, GROUP_M, STAGES,
                        N0 + N1, W_FORMAT, HAS_ZERO, OP_DT == gl.float16, SW, GROUPS)),
        ], [4, 1, DEC_WARPS], [DEC_CONSUMER_REGS, 40, DEC_REGS])
    elif GROUPS == 2:
        gl.warp_specialize([
            (_consumer, (a0_bufs, b0_bufs, b1_bufs, xs_bufs, ready, empty, decoded, c, c0_desc, c1_desc, cA0, cA1, bias,
                         a_scale, b_scale, M, N, k_tiles, splits, split_rows, stride_cm, stride_cn, stride_asm,
                         stride_ask, stride_bsn, stride_bsk, up_scale_offset, batch, c_batch_rows, bias_batch_stride,
                         GROUP_M, STAGES, HALF, N0, N1, K_INSTR, 0, SCALES, XS_TMA, PROMOTE, HAS_BIAS, C_TMA, GATED,
                         ACTIVATION, SHARE_C, GROUPS, PACKED, C_T, expert_offsets, num_experts, bs_batch_stride,
                         EXPERTS, A_GATHER, c_rows, row_weights, C_SCATTER, ROW_WEIGHTS,
                         a_rows)),
            (_consumer, (a1_bufs, b0_bufs, b1_bufs, xs_bufs, ready, empty, decoded, c, c0_desc, c1_desc, cB0, cB1, bias,
                         a_scale, b_scale, M, N, k_tiles, splits, split_rows, stride_cm, stride_cn, stride_asm,
                         stride_ask, stride_bsn, stride_bsk, up_scale_offset, batch, c_batch_rows, bias_batch_stride,
                         GROUP_M, STAGES, HALF, N0, N1, K_INSTR, 1, SCALES, XS_TMA, PROMOTE, HAS_BIAS, C_TMA, GATED,
                         ACTIVATION, SHARE_C, GROUPS, PACKED, C_T, expert_offsets, num_experts, bs_batch_stride,
                         EXPERTS, A_GATHER, c_rows, row_weights, C_SCATTER, ROW_WEIGHTS,
                         a_rows)),
            (_producer, (a_desc, b0_desc, b1_desc, xs_desc, a0_bufs, a1_bufs, b0_bufs, b1_bufs, xs_bufs, ready,
                         empty, M, N, k_tiles, splits, xs_group_stride, batch, a_batch_rows, b_batch_rows, GROUP_M,
                         STAGES, XS_TMA, TWO, GATED, GROUPS, PACKED, expert_offsets, num_experts, EXPERTS, a_src,
                         a_rows, stride_am, K, A_GATHER)),
        ], [4, GATHER_WARPS if A_GATHER else 1], GATHER_REGS[OP_DT.primitive_bitwidth == 8] if A_GATHER else [232, 40])
    elif PACKED:  # one consumer warp group
        gl.warp_specialize([
            (_consumer, (a0_bufs, b0_bufs, b1_bufs, xs_bufs, ready, empty, decoded, c, c0_desc, c1_desc, cA0, cA1, bias,
                         a_scale, b_scale, M, N, k_tiles, splits, split_rows, stride_cm, stride_cn, stride_asm,
                         stride_ask, stride_bsn, stride_bsk, up_scale_offset, batch, c_batch_rows, bias_batch_stride,
                         GROUP_M, STAGES, HALF, N0, N1, K_INSTR, 0, SCALES, XS_TMA, PROMOTE, HAS_BIAS, C_TMA, GATED,
                         ACTIVATION, SHARE_C, GROUPS, PACKED, C_T, expert_offsets, num_experts, bs_batch_stride,
                         EXPERTS, A_GATHER, c_rows, row_weights, C_SCATTER, ROW_WEIGHTS,
                         a_rows)),
            (_producer, (a_desc, b0_desc, b1_desc, xs_desc, wq_bufs, a1_bufs, b0_bufs, b1_bufs, xs_bufs, ready,
                         empty, M, N, k_tiles, splits, xs_group_stride, batch, a_batch_rows, b_batch_rows, GROUP_M,
                         STAGES, XS_TMA, TWO, GATED, GROUPS, PACKED, expert_offsets, num_experts, EXPERTS, a_src,
                         a_rows, stride_am, K, A_GATHER)),
            (_decoder, (wq_bufs, a0_bufs, a1_bufs, sc_ring, zb_ring, ready, empty, decoded, b_scale, b_zero, M, N,
                        k_tiles, splits, stride_bsn, stride_bsk, stride_bzn, stride_bzk, group_shift, GROUP_M, STAGES,
                        N0 + N1, W_FORMAT, HAS_ZERO, OP_DT == gl.float16, SW, GROUPS)),
        ], [1, DEC_WARPS], [40, DEC_REGS])
    else:  # one consumer warp group
        gl.warp_specialize([
            (_consumer, (a0_bufs, b0_bufs, b1_bufs, xs_bufs, ready, empty, decoded, c, c0_desc, c1_desc, cA0, cA1, bias,
                         a_scale, b_scale, M, N, k_tiles, splits, split_rows, stride_cm, stride_cn, stride_asm,
                         stride_ask, stride_bsn, stride_bsk, up_scale_offset, batch, c_batch_rows, bias_batch_stride,
                         GROUP_M, STAGES, HALF, N0, N1, K_INSTR, 0, SCALES, XS_TMA, PROMOTE, HAS_BIAS, C_TMA, GATED,
                         ACTIVATION, SHARE_C, GROUPS, PACKED, C_T, expert_offsets, num_experts, bs_batch_stride,
                         EXPERTS, A_GATHER, c_rows, row_weights, C_SCATTER, ROW_WEIGHTS,
                         a_rows)),
            (_producer, (a_desc, b0_desc, b1_desc, xs_desc, a0_bufs, a1_bufs, b0_bufs, b1_bufs, xs_bufs, ready,
                         empty, M, N, k_tiles, splits, xs_group_stride, batch, a_batch_rows, b_batch_rows, GROUP_M,
                         STAGES, XS_TMA, TWO, GATED, GROUPS, PACKED, expert_offsets, num_experts, EXPERTS, a_src,
                         a_rows, stride_am, K, A_GATHER)),
        ], [GATHER_WARPS if A_GATHER else 1], [GATHER_REGS[OP_DT.primitive_bitwidth == 8][1] if A_GATHER else 40])
