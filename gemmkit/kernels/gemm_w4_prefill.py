"""Hopper (sm_90) 4-bit weight-only GEMM for prefill sizes (Gluon): y (M, N) = x @ dequant(w)^T, INT4 in
groups or MXFP4, from core/hopper_w4.PREFILL_MIN_M to PREFILL_MAX_M rows (PREFILL_WIDE_MAX_M on wide layers;
core/hopper_w4.py routes).

The decode kernel's product (kernels/gemm_w4_decode.py) with x streamed instead of staged: each
program takes work units in turn (persistent; a unit is a (BN weight rows x BM rows of x) output tile
and one of SPLITS K slices, tiles grouped GROUP_M rows of x at a time so that the programs running at
once share x's rows and the weight's tiles in L2), and per 128-deep K step TMA brings the step's
packed weight (BN rows x 64 bytes) and x's (BM, 128) tile into one of STAGES stages. Each warp group
(BN = 64: one, BN = 128: two) decodes its 64 weight rows into wgmma's left operand in registers (the
decode kernel's PTX and relabelling: the K order within each 128-wide block is permuted, position kp
holding column host_true_k(kp)), applies the scales to the decoded values, and multiplies with x's
tile from shared memory, the product left in flight while the previous step's stage, its product done in
both warp groups, is refilled.

x must come in the same permuted K order, and TMA cannot reorder elements within a row: the caller
passes xp, x with each 128-wide K block permuted by kernels/packed.py permute_k_kernel (one
memory-bound pass over x).

The scales are applied before the product, in x's dtype (INT4: (q - z) * s, exact but for the
product's rounding, as the dequantizing route rounds it; MXFP4: e2m1 * 2^(e - 127), exact): with
BM >= 128 columns per tile the decoded values are far fewer per thread than the accumulator's, so
this costs less than the decode kernel's fp32 correction of each step's product.

What bounds it (BENCHMARKS.md, twelfth session; tuning/w4_gluon/w4_prefill_*): ncu at M = 4096 (128 x 256
tiles) puts 43% of the warps' stall samples on barriers (the warp groups' per-step barrier, and the loop's back
edge, where ptxas waits for the warp group's own product because the decoded registers are rewritten there) and
the products' peak time at 59% of the kernel's. Two K steps per iteration (distinct registers, the product left in
flight while the next step is decoded: scripts/w4_prefill_unroll_probe.py) compute correctly in this loop but ran
only 1.01x to 1.05x; two warp-specialized consumers and a TMA warp compile with every product serialized (ptxas
C7514: any read of the accumulator after the loop, BENCHMARKS.md lists what was tried).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait

from .gemm_w4_decode import BLOCK_K, _cta_barrier, _decode_groups, _decode_mx, _finish, _step_scales, _tma_load


@gluon.jit
def _tile_mn(t, tiles_m, tiles_n, GROUP_M: gl.constexpr):
    """(tile row of x, tile of weight rows) of output tile t: GROUP_M tile rows of x at a time, x's
    rows fastest, so that the programs running at once read each weight tile once from HBM."""
    width = GROUP_M * tiles_n
    first_m = (t // width) * GROUP_M
    size_m = gl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (t % width) % size_m, (t % width) // size_m


@gluon.jit
def _advance(u, k, tm, tn, k0, P, KS, units, SPLITS, tiles_m, tiles_n, GROUP_M: gl.constexpr):
    """The (work unit, step) after (u, k) in a program's stream (units u, u + P, ...; a unit is a tile
    and one of SPLITS K slices of KS steps, k counting within it), with the unit's tile (tm, tn) and
    first K step k0: the tile map's divisions only when a unit ends (past the last unit: the last's)."""
    k += 1
    if k == KS:
        k = 0
        u += P
        last = gl.minimum(u, units - 1)
        tile = last // SPLITS
        tm, tn = _tile_mn(tile, tiles_m, tiles_n, GROUP_M)
        k0 = (last - tile * SPLITS) * KS
    return u, k, tm, tn, k0


@gluon.jit
def _load(w_desc, x_desc, wbuf, xbuf, bars, slot, tm, tn, k, BM: gl.constexpr, BN: gl.constexpr):
    """TMA loads of K step k of tile (tm, tn): the weight words (BN rows x 16 words) and x's tile (BM
    rows x 128) into stage `slot` (rows past N or M read zero)."""
    mbarrier.expect(bars.index(slot), BN * 64 + BM * BLOCK_K * x_desc.dtype.primitive_bitwidth // 8)
    _tma_load(w_desc, [tn * BN, k * 16], bars.index(slot), wbuf.index(slot))
    _tma_load(x_desc, [tm * BM, k * BLOCK_K], bars.index(slot), xbuf.index(slot))


@gluon.jit
def w4_prefill_kernel(w_desc, x_desc, ws, wz, y, bias, sums, M, N, K, SPLITS, MP, stride_sn, stride_sk, stride_zn,
                      stride_zk, stride_ym, stride_yn, group_shift,
                      BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                      FP16: gl.constexpr, HAS_ZERO: gl.constexpr, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
                      MXFP4: gl.constexpr, GROUP_WORDS: gl.constexpr, WORDS: gl.constexpr, SLICED: gl.constexpr):
    """y (M, N) = ACTIVATION(x @ dequant(w)^T + bias). w_desc: a TMA descriptor of the packed weight
    (gemmkit's INT4 or MXFP4 layout, uint8 (N, K // 2)) viewed as int32 (N, K // 8), block (BN, 16);
    x_desc: of xp (M, K) bf16 (fp16: FP16) in the permuted K order (module docstring), block
    (BM, 128); K a multiple of 128. INT4: ws (N, G) scales, wz (N, G) uint8 zero points (HAS_ZERO;
    else 8), step k in group k >> group_shift, or GROUP_WORDS (4, 8): groups of 32 or 64. MXFP4 (bf16
    x): ws (N, K // 32) uint8 e8m0 scales. BN = 64 per warp group (WORDS = words_layout(BN)); BM up
    to 256 (wgmma's N). Persistent: program p takes work units p, p + programs, ..., a unit being an
    output tile and one of SPLITS K slices (SPLITS divides K // 128). SLICED (SPLITS > 1): each unit's
    fp32 sum is added to sums (N, MP), zeros (MP: M rounded up to 16; x's rows past M add zeros), by
    atomics, and reduce.finish_sums stores y; else y is stored here."""
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    KS = K // BLOCK_K // SPLITS
    units = tiles_m * tiles_n * SPLITS
    total = gl.cdiv(gl.maximum(units - pid, 0), P) * KS
    DT: gl.constexpr = x_desc.dtype
    BASE: gl.constexpr = 1024.0 if FP16 else 128.0  # the decoded values' offset (gemm_w4_decode._decode_ptx)
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BN // 16, 1],
                                                    instr_shape=[16, BM, 16])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    ROWS: gl.constexpr = gl.SliceLayout(1, WORDS)  # the scales' rows, as the words hold them
    wbuf = gl.allocate_shared_memory(gl.int32, [STAGES, BN, 16], w_desc.layout)
    xbuf = gl.allocate_shared_memory(DT, [STAGES, BM, BLOCK_K], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    u0 = gl.minimum(pid, units - 1)
    tm, tn = _tile_mn(u0 // SPLITS, tiles_m, tiles_n, GROUP_M)
    k0 = (u0 % SPLITS) * KS
    # the loads run STAGES - 1 steps ahead: (lu, lk) the next one's unit and step
    lu = pid
    lk = 0
    ltm = tm
    ltn = tn
    lk0 = k0
    for i in gl.static_range(STAGES - 1):
        if i < total:
            _load(w_desc, x_desc, wbuf, xbuf, bars, i, ltm, ltn, lk0 + lk, BM, BN)
            lu, lk, ltm, ltn, lk0 = _advance(lu, lk, ltm, ltn, lk0, P, KS, units, SPLITS, tiles_m, tiles_n, GROUP_M)
    u = pid
    k = 0
    s0, z0 = _step_scales(ws, wz, tn * BN, k0, group_shift, N, stride_sn, stride_sk, stride_zn, stride_zk, ROWS,
                          HAS_ZERO, BASE, MXFP4, GROUP_WORDS, DT, WORDS, BN, True)
    acc = gl.zeros([BN, BM], gl.float32, acc_l)
    for j in range(total):
        slot = j % STAGES
        mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
        words = wbuf.index(slot).load(WORDS)
        if MXFP4:
            a = _decode_mx(words, s0, a_l)
        else:
            a = _decode_groups(words, s0, z0, a_l, FP16)
        acc = warpgroup_mma(a, xbuf.index(slot).permute((1, 0)), acc, is_async=True)
        # the previous step's product is done: its stage can be refilled once every warp group says so
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        _cta_barrier()
        if j + STAGES - 1 < total:
            _load(w_desc, x_desc, wbuf, xbuf, bars, (j + STAGES - 1) % STAGES, ltm, ltn, lk0 + lk, BM, BN)
            lu, lk, ltm, ltn, lk0 = _advance(lu, lk, ltm, ltn, lk0, P, KS, units, SPLITS, tiles_m, tiles_n, GROUP_M)
        # the next step's scales, loaded while this product runs but only now: the proxy fence before
        # the TMA loads above and the fence before the next product both wait for every load in flight
        u1, k1, tm1, tn1, k01 = _advance(u, k, tm, tn, k0, P, KS, units, SPLITS, tiles_m, tiles_n, GROUP_M)
        s0, z0 = _step_scales(ws, wz, tn1 * BN, k01 + k1, group_shift, N, stride_sn, stride_sk, stride_zn, stride_zk,
                              ROWS, HAS_ZERO, BASE, MXFP4, GROUP_WORDS, DT, WORDS, BN, True)
        if k == KS - 1:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            rm = tm * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, acc_l))
            if SLICED:  # sums (N, MP): a thread's two neighbouring columns of x's rows in one vector atomic
                rn = tn * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, acc_l))
                gl.atomic_add(sums + rn[:, None] * MP + rm[None, :], acc, mask=(rn < N)[:, None] & (rm < MP)[None, :],
                              sem="relaxed")
            else:
                _finish(acc, y, bias, tn * BN, rm, M, N, stride_ym, stride_yn, gl.SliceLayout(1, acc_l), HAS_BIAS,
                        ACTIVATION)
            acc = gl.zeros([BN, BM], gl.float32, acc_l)
        u = u1
        k = k1
        tm = tm1
        tn = tn1
        k0 = k01
