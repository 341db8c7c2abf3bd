"""Hopper (sm_90) 4-bit weight-only GEMM for decode sizes (Gluon): y (M <= 64, N) = x @ dequant(w)^T,
INT4 in groups or MXFP4 (core/hopper_w4.py routes; BENCHMARKS.md, seventh session).

The product is computed transposed, y^T = W x^T, so that the weight is wgmma's left operand and
can come from registers: TMA brings BOX consecutive 128-deep K steps' packed weight (64 rows x 64 BOX
contiguous bytes: 128 per row for BOX = 2) into shared memory, STAGES such loads deep; each thread
reads whole 32-bit words of a step (two 128-bit loads),
decodes them in place (PRMT / SHR / LOP3: 0x4300 | q is the bf16
128 + q, 0x6400 | q the fp16 1024 + q) and hands the values to the tensor cores with no layout
conversion, while x^T, the right operand, is read by the tensor cores from shared memory.

Why the K order is permuted. wgmma's register operand gives a thread the columns {2q, 2q+1,
2q+8, 2q+9} (+16j) of its rows (q = lane % 4); a word holds 8 consecutive columns of one row
(gemmkit's INT4 layout: element 2j in the low nibble of byte j), so a word-loading thread holds
its columns in another order. Instead of moving values between threads, the product runs over a
permuted K: within each 128-wide block, position k' of the operands holds column
host_true_k(k') (below), for the weight by construction of the register tile (a join / permute /
reshape that is a pure relabelling) and for x because it is staged into shared memory in that
order. A sum over K does not depend on the order.

Each 128-deep K step's product is taken with the weight as 128 + q (or 1024 + q) and fp32
accumulation; the zero point and group scale are applied to it in fp32 with the step's x sums:
sum_k x (q - z) s = s (sum_k x (128 + q) - (128 + z) sum_k x), one scale group per step (groups
of 128 or a multiple of it, or one per channel). Smaller groups (32, 64) and MXFP4's e8m0 blocks
of 32 are applied to the decoded values instead, before the product: in the permuted order a
thread's values of a row and step are its words 4q .. 4q + 3, one block of 32.

Work split: program p takes K slice p % SLICES (KS steps; x of the slice staged once) and the
64-row weight tiles p // SLICES, + P / SLICES, ... as one stream of (tile, step) iterations,
STAGES - 1 loads of BOX steps in flight (KS a multiple of BOX: a load never crosses tiles). With
SLICES > 1 each finished tile's fp32 sum is added to a zeroed (M, N) workspace by atomics, and
either a second launch (kernels/reduce.py finish_sums) runs the epilogue (bias, activation, cast)
and puts the workspace back to zero for the next launch, or (FINISH_HERE) the last of the SLICES
programs sharing a tile group to arrive at the group's counter does: one GPU-scope release per
program, after its last tile, then the group's M x rows sums read in a flat range (FIN_V values per
thread per L2 round trip), the epilogue, and zeros and the counter put back. (A counter per tile,
released after every tile, measured slower on the H100, tuning/w4_gluon/bench_counter_h100.md: the
release stalls each program once per tile.) core/hopper_w4.py says where each is used.

PDL: finish_sums is launched as a programmatic dependent of this kernel (kernels/gdc.py), which
lets it start as soon as every program here has started; it then waits for this grid to complete.

scripts/w4_decode_sweep.py measured the work split against the tl kernel on the H100 (tuning/w4_gluon/).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma

from .epilogue import activation
from .gdc import gdc_launch_dependents

# Triton 3.6 names the CTA barrier thread_barrier and the TMA load async_copy_global_to_shared,
# later versions barrier and async_load
_cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared

BLOCK_N = gl.constexpr(64)  # weight rows per warp group (wgmma's M); a tile: BN = 64 or 128 rows, BN // 16 warps
BLOCK_K = gl.constexpr(128)  # K per step: 16 packed words per row


def _decode_ptx(magic: int) -> str:
    """Two words ($8: word 2c, $9: word 2c + 1 of a row) to eight registers $0..$7: register i
    holds element i of each word (low half: $8's) as the 16-bit float MAGIC | q. Per byte j: PRMT
    puts byte j of both words in bytes 0 and 2, LOP3 takes the low nibbles (element 2j), SHR and
    LOP3 the high ones (element 2j + 1)."""
    lines = ["{", ".reg .b32 t, u;"]
    for j in range(4):
        sel = j | (j << 4) | ((4 + j) << 8) | ((4 + j) << 12)
        lines += [f"prmt.b32 t, $8, $9, 0x{sel:04X};",
                  f"lop3.b32 ${2 * j}, t, 0x000F000F, 0x{magic:04X}{magic:04X}, 0xEA;",
                  "shr.u32 u, t, 4;",
                  f"lop3.b32 ${2 * j + 1}, u, 0x000F000F, 0x{magic:04X}{magic:04X}, 0xEA;"]
    return "\n".join(lines + ["}"])


def _e2m1_ptx() -> str:
    """As _decode_ptx for MXFP4 codes (bit 3 the sign, bits 0-2 the magnitude): register i holds
    element i of each word as the bf16 of its bits, the magnitude at bits 6-8 and the sign at
    bit 15 (e2m1(c) * 2^-126; kernels/packed.py _e2m1_bits). Per nibble: AND keeps it, one
    multiply places two copies of it (by 2^6 + 2^12 for a low nibble, 2^2 + 2^8 for a high one:
    the copies do not overlap), AND keeps the magnitude of the first and the sign of the second."""
    lines = ["{", ".reg .b32 t, a;"]
    for j in range(4):
        sel = j | (j << 4) | ((4 + j) << 8) | ((4 + j) << 12)
        lines.append(f"prmt.b32 t, $8, $9, 0x{sel:04X};")
        for hi, (keep, mul) in enumerate(((0x000F000F, 0x1040), (0x00F000F0, 0x104))):
            lines += [f"and.b32 a, t, 0x{keep:08X};", f"mul.lo.u32 a, a, 0x{mul:X};",
                      f"and.b32 ${2 * j + hi}, a, 0x81C081C0;"]
    return "\n".join(lines + ["}"])


_DECODE_BF16 = gl.constexpr(_decode_ptx(0x4300))
_DECODE_FP16 = gl.constexpr(_decode_ptx(0x6400))
_DECODE_E2M1 = gl.constexpr(_e2m1_ptx())

# one step's words (64 rows x 16 words): thread (warp w, lane 4g + q) holds rows 16w + g and
# 16w + g + 8, words 4q .. 4q + 3 of each (two 128-bit loads)
def words_layout(bn: int):
    """The layout of one step's words of a bn-row tile (bn // 16 warps)."""
    warps = [[16 << i, 0] for i in range((bn // 16).bit_length() - 1)]
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [8, 0]], lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
        warp_bases=warps, block_bases=[], shape=[bn, 16])



# the register tile's relabelling: (row, c3, c2, c1, c0, i0, i1, i2) -> (row, i2, i1, i0, c1, c3, c2, c0)
PERM = (0, 7, 6, 5, 3, 1, 2, 4)  # (written out in _decode: Triton 3.6's permute takes no constexpr)


def host_true_k(kp: int) -> int:
    """The column (within a 128-wide K block) at permuted position kp: kp's bits are, from the
    lowest, c0, c2, c3, c1 (word w = c0 + 2 c1 + 4 c2 + 8 c3) and the element i of the word
    (3 bits), so column 8 w + i (the kernel's relabellings, PERM and X_PERM, put the values there)."""
    c0, c2, c3, c1 = kp & 1, (kp >> 1) & 1, (kp >> 2) & 1, (kp >> 3) & 1
    return 8 * (c0 + 2 * c1 + 4 * c2 + 8 * c3) + (kp >> 4)


# x's relabelling: (row, c3, c2, c1, c0, i2, i1, i0) of its K order -> (row, i2, i1, i0, c1, c3, c2, c0)
X_PERM = (0, 5, 6, 7, 3, 1, 2, 4)  # (written out in _permuted_x, as PERM in _decode)


@gluon.jit
def _permuted_x(xp):
    """x's (BM, 128) step in the permuted K order (position kp holds column host_true_k(kp)): a relabelling
    of the values, column bits (c3, c2, c1, c0, i2, i1, i0) -> (i2, i1, i0, c1, c3, c2, c0)."""
    t = gl.permute(gl.reshape(xp, [xp.shape[0], 2, 2, 2, 2, 2, 2, 2]), [0, 5, 6, 7, 3, 1, 2, 4])
    return gl.reshape(t, [xp.shape[0], BLOCK_K])


@gluon.jit
def _stage_x(x, xs, xsum, rmx, tk, kstep, q, M, stride_xm, SUMS: gl.constexpr):
    """x's K step kstep (rows rmx < M, zeros past them) into xs[q] in the permuted K order, read in K
    order (16-byte loads); SUMS: and its rows' fp32 sums into xsum[q]."""
    xp = gl.load(x + rmx[:, None] * stride_xm + (kstep * BLOCK_K + tk)[None, :], mask=(rmx < M)[:, None], other=0.0)
    xs.index(q).store(_permuted_x(xp))
    if SUMS:
        xsum.index(q).store(gl.sum(xp.to(gl.float32), axis=1))


@gluon.jit
def _issue(w_desc, wbuf, bars, b, first_tile, tile_stride, kstep0, KS: gl.constexpr, STAGES: gl.constexpr,
           BOX: gl.constexpr, BN: gl.constexpr):
    """TMA load of box b's words (BN rows x 16 BOX words: BOX consecutive steps of one tile; rows
    past N read zero) into its stage."""
    tn, stn = _tile_step(b * BOX, first_tile, tile_stride, KS)
    slot = b % STAGES
    mbarrier.expect(bars.index(slot), BN * 64 * BOX)
    _tma_load(w_desc, [tn * BN, (kstep0 + stn) * 16], bars.index(slot), wbuf.index(slot))


@gluon.jit
def _group(ws, wz, off_n, g, N, stride_sn, stride_sk, stride_zn, stride_zk, ROWS: gl.constexpr,
           HAS_ZERO: gl.constexpr, BASE: gl.constexpr, BN: gl.constexpr):
    """(scale, BASE + zero point) fp32 of the tile's rows in scale group g (zero point 8 without wz)."""
    rn = off_n + gl.arange(0, BN, layout=ROWS)
    s = gl.load(ws + rn * stride_sn + g * stride_sk, mask=rn < N, other=0.0).to(gl.float32)
    if HAS_ZERO:
        z = gl.load(wz + rn * stride_zn + g * stride_zk, mask=rn < N, other=0).to(gl.float32) + BASE
    else:
        z = gl.full([BN], BASE + 8.0, gl.float32, ROWS)
    return s, z


@gluon.jit
def _mx_scales(ws, off_n, kstep, N, stride_sn, stride_sk, WORDS: gl.constexpr, BN: gl.constexpr):
    """(BN, 16) bf16 2^(e - 127) of each word's e8m0 scale (32 values: four words of a row) in
    the words' layout; e = 0: 2^-127, e = 255: NaN (kernels/packed.py e8m0_float)."""
    rn = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, WORDS))
    g = kstep * 4 + gl.arange(0, 16, layout=gl.SliceLayout(0, WORDS)) // 4
    e = gl.load(ws + rn[:, None] * stride_sn + g[None, :] * stride_sk, mask=(rn < N)[:, None], other=127)
    e = e.to(gl.int32)
    bits = gl.where(e == 0, 0x40, gl.where(e == 255, 0x7FC0, e << 7))
    return bits.to(gl.int16).to(gl.bfloat16, bitcast=True)


@gluon.jit
def _scaled(o, sc):
    return o * 8.507059173023462e37 * sc  # 2^126 (the bits' value is e2m1 * 2^-126), then 2^(e - 127): exact


@gluon.jit
def _decode_mx(words, sc, A_LAYOUT: gl.constexpr):
    """The (64, 128) register tile e2m1(q) * 2^(e - 127) in bf16 of one step's MXFP4 words with
    their scales sc (_mx_scales), as _decode."""
    o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
        _DECODE_E2M1, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [words], dtype=(gl.bfloat16,) * 8, is_pure=True, pack=2)
    return _relabel(_scaled(o0, sc), _scaled(o1, sc), _scaled(o2, sc), _scaled(o3, sc), _scaled(o4, sc),
                    _scaled(o5, sc), _scaled(o6, sc), _scaled(o7, sc), A_LAYOUT)


@gluon.jit
def _word_groups(ws, wz, off_n, kstep, N, stride_sn, stride_sk, stride_zn, stride_zk, HAS_ZERO: gl.constexpr,
                 BASE: gl.constexpr, GROUP_WORDS: gl.constexpr, DT: gl.constexpr, WORDS: gl.constexpr,
                 BN: gl.constexpr):
    """(BN, 16) DT tiles (scale, BASE + zero point) of each word's INT4 group (GROUP_WORDS words of a
    row: groups of 32 or 64) in the words' layout."""
    rn = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, WORDS))
    g = kstep * (16 // GROUP_WORDS) + gl.arange(0, 16, layout=gl.SliceLayout(0, WORDS)) // GROUP_WORDS
    s = gl.load(ws + rn[:, None] * stride_sn + g[None, :] * stride_sk, mask=(rn < N)[:, None], other=0.0)
    if HAS_ZERO:
        z = gl.load(wz + rn[:, None] * stride_zn + g[None, :] * stride_zk, mask=(rn < N)[:, None], other=0)
        z = z.to(gl.float32) + BASE
    else:
        z = gl.full([BN, 16], BASE + 8.0, gl.float32, WORDS)
    return s.to(DT), z.to(DT)


@gluon.jit
def _int4_registers(words, FP16: gl.constexpr):
    """The eight (64, 16) registers of _decode_ptx: element i of each word, MAGIC | q."""
    if FP16:
        out = gl.inline_asm_elementwise(_DECODE_FP16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [words],
                                        dtype=(gl.float16,) * 8, is_pure=True, pack=2)
    else:
        out = gl.inline_asm_elementwise(_DECODE_BF16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [words],
                                        dtype=(gl.bfloat16,) * 8, is_pure=True, pack=2)
    return out


@gluon.jit
def _decode_groups(words, s, z, A_LAYOUT: gl.constexpr, FP16: gl.constexpr):
    """The (64, 128) register tile (q - z) s in DT of one step's INT4 words with their groups'
    tiles (_word_groups; the zero point with BASE, exact), as _decode: small groups are applied
    before the product, a thread's values of a row and step lying in one group of 32 (its words
    4q .. 4q + 3) or 64."""
    o0, o1, o2, o3, o4, o5, o6, o7 = _int4_registers(words, FP16)
    return _relabel((o0 - z) * s, (o1 - z) * s, (o2 - z) * s, (o3 - z) * s, (o4 - z) * s, (o5 - z) * s,
                    (o6 - z) * s, (o7 - z) * s, A_LAYOUT)


@gluon.jit
def _step_scales(ws, wz, off_n, kstep, group_shift, N, stride_sn, stride_sk, stride_zn, stride_zk,
                 ROWS: gl.constexpr, HAS_ZERO: gl.constexpr, BASE: gl.constexpr, MXFP4: gl.constexpr,
                 GROUP_WORDS: gl.constexpr, DT: gl.constexpr, WORDS: gl.constexpr, BN: gl.constexpr,
                 ROW_TILES: gl.constexpr):
    """The scales a K step needs: MXFP4, the (BN, 16) tile of _mx_scales (twice); INT4 groups of 32
    or 64 (GROUP_WORDS), the tiles of _word_groups; else the rows' (scale, BASE + zero point) of
    _group, fp32 in ROWS, or, ROW_TILES (ROWS = SliceLayout(1, WORDS)), as (BN, 1) DT tiles that
    broadcast over the step's words (the prefill kernel applies them before the product)."""
    if MXFP4:
        s = _mx_scales(ws, off_n, kstep, N, stride_sn, stride_sk, WORDS, BN)
        z = s
    elif GROUP_WORDS > 0:
        s, z = _word_groups(ws, wz, off_n, kstep, N, stride_sn, stride_sk, stride_zn, stride_zk, HAS_ZERO, BASE,
                            GROUP_WORDS, DT, WORDS, BN)
    else:
        s, z = _group(ws, wz, off_n, kstep >> group_shift, N, stride_sn, stride_sk, stride_zn, stride_zk, ROWS,
                      HAS_ZERO, BASE, BN)
        if ROW_TILES:
            s = gl.expand_dims(s.to(DT), 1)
            z = gl.expand_dims(z.to(DT), 1)
    return s, z


@gluon.jit
def _relabel(o0, o1, o2, o3, o4, o5, o6, o7, A_LAYOUT: gl.constexpr):
    """The (BN, 128) tile of the eight registers' values in the permuted K order, in A_LAYOUT."""
    t = gl.join(gl.join(gl.join(o0, o1), gl.join(o2, o3)), gl.join(gl.join(o4, o5), gl.join(o6, o7)))
    # (row, word, i0, i1, i2) -> (row, c3, c2, c1, c0, i0, i1, i2) -> PERM
    t = gl.permute(gl.reshape(t, [o0.shape[0], 2, 2, 2, 2, 2, 2, 2]), [0, 7, 6, 5, 3, 1, 2, 4])
    return gl.convert_layout(gl.reshape(t, [o0.shape[0], BLOCK_K]), A_LAYOUT)


@gluon.jit
def _decode(words, A_LAYOUT: gl.constexpr, FP16: gl.constexpr):
    """The (64, 128) register tile MAGIC | q of one step's words in the permuted K order, in the
    layout of wgmma's left operand (the reshapes and the permute only relabel registers)."""
    o0, o1, o2, o3, o4, o5, o6, o7 = _int4_registers(words, FP16)
    return _relabel(o0, o1, o2, o3, o4, o5, o6, o7, A_LAYOUT)


@gluon.jit
def _tile_step(j, first_tile, tile_stride, KS: gl.constexpr):
    return first_tile + (j // KS) * tile_stride, j % KS


@gluon.jit
def _finish(acc, y, bias, off_n, rm, M, N, stride_ym, stride_yn, ROWS: gl.constexpr, HAS_BIAS: gl.constexpr,
            ACTIVATION: gl.constexpr):
    """Store the (BN, BM) transposed tile: + bias, activation, cast to y's dtype."""
    rn = off_n + gl.arange(0, acc.shape[0], layout=ROWS)
    if HAS_BIAS:
        acc += gl.load(bias + rn, mask=rn < N, other=0.0).to(gl.float32)[:, None]
    acc = activation(acc, ACTIVATION)
    gl.store(y + rm[None, :] * stride_ym + rn[:, None] * stride_yn, acc.to(y.dtype.element_ty),
             mask=(rm < M)[None, :] & (rn < N)[:, None])


@gluon.jit
def _finish_group(sums, y, bias, first_tile, tile_stride, M, N, stride_ym, stride_yn, HAS_BIAS: gl.constexpr,
                  ACTIVATION: gl.constexpr, BN: gl.constexpr, FIN_V: gl.constexpr, SUMS_T: gl.constexpr,
                  BM: gl.constexpr):
    """The epilogue of a tile group's sums (tiles first_tile, + tile_stride, ...; the last of its
    SLICES programs runs it): y = ACTIVATION(sums + bias) cast, sums put back to zero. Its M x rows
    values are taken as one flat range, FIN_V per thread at a time (one L2 round trip for many
    tiles, none for x's padding rows)."""
    warps: gl.constexpr = BN // 16
    fin_l: gl.constexpr = gl.BlockedLayout([FIN_V], [32], [warps], [0])
    e = gl.arange(0, FIN_V * 32 * warps, layout=fin_l)
    n_rows = gl.cdiv(gl.cdiv(N, BN) - first_tile, tile_stride) * BN
    if SUMS_T:  # x's padding rows too: zeros, or NaN from a NaN scale, put back to zero all the same
        total = BM * n_rows
    else:
        total = M * n_rows
    for e0 in range(0, total, FIN_V * 32 * warps):
        ee = e0 + e
        m = ee // n_rows
        idx = ee - m * n_rows
        rn = (first_tile + (idx // BN) * tile_stride) * BN + idx % BN
        mask = (ee < total) & (rn < N)
        if SUMS_T:
            at = sums + rn * BM + m
        else:
            at = sums + m * N + rn
        # .cg: the other programs' sums are at L2, never in this SM's L1
        acc = gl.load(at, mask=mask, other=0.0, cache_modifier=".cg")
        gl.store(at, gl.zeros([FIN_V * 32 * warps], gl.float32, fin_l), mask=mask)
        if HAS_BIAS:
            acc += gl.load(bias + rn, mask=mask, other=0.0).to(gl.float32)
        acc = activation(acc, ACTIVATION)
        gl.store(y + m * stride_ym + rn * stride_yn, acc.to(y.dtype.element_ty), mask=mask & (m < M))


@gluon.jit
def _step(acc, words, xs, xsum, s0, z0, st, a_l: gl.constexpr, COLS: gl.constexpr, FP16: gl.constexpr,
          MXFP4: gl.constexpr, GROUP_WORDS: gl.constexpr, BM: gl.constexpr):
    """acc + one 128-deep step's product of the decoded words with x's step st (its scales s0, z0)."""
    acc_l: gl.constexpr = acc.type.layout
    if MXFP4:
        acc = warpgroup_mma(_decode_mx(words, s0, a_l), xs.index(st).permute((1, 0)), acc)
    elif GROUP_WORDS > 0:
        acc = warpgroup_mma(_decode_groups(words, s0, z0, a_l, FP16), xs.index(st).permute((1, 0)), acc)
    else:
        part = warpgroup_mma(_decode(words, a_l, FP16), xs.index(st).permute((1, 0)),
                             gl.zeros([acc.shape[0], BM], gl.float32, acc_l), use_acc=False)
        acc += s0[:, None] * (part - z0[:, None] * xsum.index(st).load(COLS)[None, :])
    return acc


@gluon.jit
def w4_decode_kernel(w_desc, x, ws, wz, y, bias, sums, counters, M, N, K, SLICES, stride_xm, stride_sn, stride_sk, stride_zn,
                     stride_zk, stride_ym, stride_yn, group_shift,
                     BM: gl.constexpr, KS: gl.constexpr, STAGES: gl.constexpr, FP16: gl.constexpr,
                     HAS_ZERO: gl.constexpr, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr, SLICED: gl.constexpr,
                     MXFP4: gl.constexpr, GROUP_WORDS: gl.constexpr, BOX: gl.constexpr, PDL: gl.constexpr,
                     BN: gl.constexpr, WORDS: gl.constexpr, FINISH_HERE: gl.constexpr, FIN_V: gl.constexpr,
                     SUMS_T: gl.constexpr):
    """y (M, N) = ACTIVATION(x @ ((q - z) s)^T + bias) for x (M <= BM, K) bf16 (fp16: FP16), unit
    stride along K; w_desc: a TMA descriptor of the packed weight (gemmkit's INT4 layout, uint8
    (N, K // 2)) viewed as int32 (N, K // 8), block (BN, 16 BOX): BOX consecutive K steps of a BN-row
    tile per load (KS a multiple of BOX; BN 64 or 128 rows, one warp group per 64, WORDS =
    words_layout(BN)); ws (N, G) scales, wz (N, G) uint8
    zero points (HAS_ZERO), K step k in group k >> group_shift; K a multiple of 128 and of
    KS * SLICES steps. SLICED (SLICES > 1): the tiles' fp32 sums are added to sums, zeros, (M, N)
    or, SUMS_T, (N, BM) (x's padding rows' zeros included: vector atomics, for M near BM),
    and y is stored by reduce.finish_sums or, FINISH_HERE, by the last of the SLICES programs of a
    tile group to arrive (counters: one int32 per group, zeros, left zero; FIN_V values per thread
    per load); else y is stored here. Programs: a multiple of SLICES.
    MXFP4 (bf16 x): the weight's codes are e2m1 and ws (N, K // 32) its uint8 e8m0 scales, applied
    to the decoded values before the product (a thread's values of a row and step share one
    32-wide scale block: its words 4q .. 4q + 3); wz, group_shift unused. GROUP_WORDS (4 or 8):
    INT4 groups of 32 or 64, applied to the decoded values before the product likewise (in x's
    dtype, as the tl kernel does); 0: groups of 128 or more, applied after each step's product.
    PDL: the launch that follows (finish_sums, launched as a programmatic dependent) may start now;
    it waits for this grid's completion before reading sums."""
    if PDL:
        gdc_launch_dependents()
    pid = gl.program_id(0)
    sl = pid % SLICES
    first_tile = pid // SLICES
    tile_stride = gl.num_programs(0) // SLICES
    total = gl.cdiv(gl.maximum(gl.cdiv(N, BN) - first_tile, 0), tile_stride) * KS
    boxes = total // BOX
    kstep0 = sl * KS
    if FP16:
        BASE: gl.constexpr = 1024.0
        DT: gl.constexpr = gl.float16
    else:
        BASE: gl.constexpr = 128.0
        DT: gl.constexpr = gl.bfloat16
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BN // 16, 1],
                                                    instr_shape=[16, BM, 16])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    ROWS: gl.constexpr = gl.SliceLayout(1, acc_l)
    COLS: gl.constexpr = gl.SliceLayout(0, acc_l)
    wbuf = gl.allocate_shared_memory(gl.int32, [STAGES, BN, 16 * BOX], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    xs = gl.allocate_shared_memory(DT, [KS, BM, BLOCK_K],
                                   gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
    xsum = gl.allocate_shared_memory(gl.float32, [KS, BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    fence_async_shared()
    # the first STAGES - 1 boxes' weights and two steps' scales are in flight while x is staged
    for i in gl.static_range(STAGES - 1):
        if i < boxes:
            _issue(w_desc, wbuf, bars, i, first_tile, tile_stride, kstep0, KS, STAGES, BOX, BN)
    t, st = _tile_step(0, first_tile, tile_stride, KS)
    s0, z0 = _step_scales(ws, wz, t * BN, kstep0 + st, group_shift, N, stride_sn, stride_sk, stride_zn, stride_zk,
                          ROWS, HAS_ZERO, BASE, MXFP4, GROUP_WORDS, DT, WORDS, BN, False)
    t, st = _tile_step(1, first_tile, tile_stride, KS)
    s1, z1 = _step_scales(ws, wz, t * BN, kstep0 + st, group_shift, N, stride_sn, stride_sk, stride_zn, stride_zk,
                          ROWS, HAS_ZERO, BASE, MXFP4, GROUP_WORDS, DT, WORDS, BN, False)
    x_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [BN // 16, 1], [1, 0])
    rmx = gl.arange(0, BM, layout=gl.SliceLayout(1, x_l))
    tk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, x_l))
    for q in gl.static_range(KS):
        _stage_x(x, xs, xsum, rmx, tk, kstep0 + q, q, M, stride_xm, not MXFP4 and GROUP_WORDS == 0)
    fence_async_shared()
    rm = gl.arange(0, BM, layout=COLS)
    acc = gl.zeros([BN, BM], gl.float32, acc_l)
    for b in range(boxes):
        # every thread has read box b - 1's stage (and, at b = 0, stored x): refill it
        _cta_barrier()
        if b + STAGES - 1 < boxes:
            _issue(w_desc, wbuf, bars, b + STAGES - 1, first_tile, tile_stride, kstep0, KS, STAGES, BOX, BN)
        slot = b % STAGES
        mbarrier.wait(bars.index(slot), (b // STAGES) & 1)
        for h in gl.static_range(BOX):
            j = b * BOX + h
            t2, st2 = _tile_step(gl.minimum(j + 2, total - 1), first_tile, tile_stride, KS)
            s2, z2 = _step_scales(ws, wz, t2 * BN, kstep0 + st2, group_shift, N, stride_sn, stride_sk,
                                  stride_zn, stride_zk, ROWS, HAS_ZERO, BASE, MXFP4, GROUP_WORDS, DT, WORDS, BN, False)
            t, st = _tile_step(j, first_tile, tile_stride, KS)
            if BOX == 1:
                words = wbuf.index(slot).load(WORDS)
            else:
                words = wbuf.index(slot).slice(h * 16, 16, dim=1).load(WORDS)
            acc = _step(acc, words, xs, xsum, s0, z0, st, a_l, COLS, FP16, MXFP4, GROUP_WORDS, BM)
            if st == KS - 1:
                if SLICED:
                    rn = t * BN + gl.arange(0, BN, layout=ROWS)
                    if SUMS_T:  # whole rows of BM: a thread's two neighbouring columns in one vector atomic
                        gl.atomic_add(sums + rn[:, None] * BM + rm[None, :], acc, mask=(rn < N)[:, None],
                                      sem="relaxed")
                    else:
                        gl.atomic_add(sums + rm[None, :] * N + rn[:, None], acc,
                                      mask=(rm < M)[None, :] & (rn < N)[:, None], sem="relaxed")
                else:
                    _finish(acc, y, bias, t * BN, rm, M, N, stride_ym, stride_yn, ROWS, HAS_BIAS, ACTIVATION)
                acc = gl.zeros([BN, BM], gl.float32, acc_l)
            s0 = s1
            z0 = z1
            s1 = s2
            z1 = z2
    if SLICED and FINISH_HERE:
        # every thread's atomics are issued before the release below publishes them at GPU scope
        _cta_barrier()
        arrived = gl.atomic_add(counters + first_tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SLICES - 1:
            _finish_group(sums, y, bias, first_tile, tile_stride, M, N, stride_ym, stride_yn, HAS_BIAS, ACTIVATION,
                          BN, FIN_V, SUMS_T, BM)
            gl.store(counters + first_tile, 0)
