"""The shared GEMM kernel, composed from the scheduling, K-step, epilogue and reduction pieces.

C = epilogue(A @ B^T): A (M, K), B (N, K) (nn.Linear weight layout), C (M, N). Every op of gemmkit
launches `gemm_kernel` with its own constexpr switches; nothing here is specific to one op. The
host builds the argument list by parameter name from this signature (gemmkit.core.plan): the
per-call parameters (tensors, descriptors, None) come first, the rest is fixed per plan.
"""

import triton
import triton.language as tl

from .epilogue import finish_tile, gate_tile
from .kstep import k_range_product
from .memory import store_rows_tile, store_split_cat, store_tile
from .modes import (A_GATHER, A_QUANT_GROUP, A_QUANT_ROW, MAP_BATCHED, MAP_DENSE, PROMOTE_KBLOCK, SCALE_NONE,
                    SCALE_ROW)
from .reduce import fixup_tile
from .schedule import group_grid, group_rows, map_tile, tile_grid, work_item


@triton.jit
def _finish_and_store(
    acc, c, off_m, off_n, M, N, stride_cm, stride_cn, bias, a_scale, b_scale, mul, add,
    stride_mul_m, stride_mul_n, stride_add_m, stride_add_n,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, C_TMA: tl.constexpr, INDEX_64: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, ACTIVATION: tl.constexpr,
):
    out = finish_tile(acc, off_m, off_n, M, N, bias, a_scale, b_scale, mul, add, stride_mul_m, stride_mul_n,
                      stride_add_m, stride_add_n, BLOCK_M, BLOCK_N, A_SCALE, B_SCALE, ACTIVATION)
    if C_TMA:
        out = out.to(c.dtype)
    else:
        out = out.to(c.dtype.element_ty)
    store_tile(c, out, off_m, off_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N, C_TMA, INDEX_64)


@triton.jit
def _epilogue(
    acc, c, off_m, off_n, M, N, stride_cm, stride_cn, bias, a_scale, b_scale, mul, add,
    stride_mul_m, stride_mul_n, stride_add_m, stride_add_n,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, C_TMA: tl.constexpr, INDEX_64: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, ACTIVATION: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
):
    """Finish and store a whole tile, in two halves along N with EPILOGUE_SUBTILE."""
    if EPILOGUE_SUBTILE:
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        acc0, acc1 = tl.split(halves)
        _finish_and_store(acc0, c, off_m, off_n, M, N, stride_cm, stride_cn, bias, a_scale, b_scale, mul, add,
                          stride_mul_m, stride_mul_n, stride_add_m, stride_add_n,
                          BLOCK_M, BLOCK_N // 2, C_TMA, INDEX_64, A_SCALE, B_SCALE, ACTIVATION)
        _finish_and_store(acc1, c, off_m, off_n + BLOCK_N // 2, M, N, stride_cm, stride_cn, bias, a_scale,
                          b_scale, mul, add, stride_mul_m, stride_mul_n, stride_add_m, stride_add_n,
                          BLOCK_M, BLOCK_N // 2, C_TMA, INDEX_64, A_SCALE, B_SCALE, ACTIVATION)
    else:
        _finish_and_store(acc, c, off_m, off_n, M, N, stride_cm, stride_cn, bias, a_scale, b_scale, mul, add,
                          stride_mul_m, stride_mul_n, stride_add_m, stride_add_n,
                          BLOCK_M, BLOCK_N, C_TMA, INDEX_64, A_SCALE, B_SCALE, ACTIVATION)


@triton.jit
def _group_epilogue(
    acc, c, g, off_m, off_n, m_hi, N, stride_cm, stride_cn, stride_cg, bias, stride_biasg, a_scale, stride_asg,
    b_scale, stride_bsg, a_rows, c_rows, row_weights,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_64: tl.constexpr, A_PRODUCER: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, ACTIVATION: tl.constexpr,
):
    """Epilogue of a grouped / batched tile (MoE family): group g's bias and scales (offset by
    their group strides; per-token scales of gathered rows read through `a_rows`), then rows
    stored at their own positions or at `c_rows[row]`, times `row_weights[destination]`."""
    rm = off_m + tl.arange(0, BLOCK_M)
    row_ok = rm < m_hi
    g64 = g.to(tl.int64)
    if A_PRODUCER == A_GATHER and A_SCALE == SCALE_ROW:  # per token: through the gathered rows
        src = tl.load(a_rows + rm, mask=row_ok, other=0)
        acc = acc.to(tl.float32) * tl.load(a_scale + src, mask=row_ok, other=0.0)[:, None]
        a_mode: tl.constexpr = SCALE_NONE
    else:
        a_mode: tl.constexpr = A_SCALE
    bias_g = bias
    if bias is not None:
        bias_g = bias + g64 * stride_biasg
    a_scale_g = a_scale
    if a_scale is not None:
        a_scale_g = a_scale + g64 * stride_asg
    b_scale_g = b_scale
    if b_scale is not None:
        b_scale_g = b_scale + g64 * stride_bsg
    out = finish_tile(acc, off_m, off_n, m_hi, N, bias_g, a_scale_g, b_scale_g, None, None, 0, 0, 0, 0,
                      BLOCK_M, BLOCK_N, a_mode, B_SCALE, ACTIVATION)
    if c_rows is not None:
        dst = tl.load(c_rows + rm, mask=row_ok, other=0)
    else:
        dst = rm
    if row_weights is not None:
        out = out * tl.load(row_weights + dst, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    store_rows_tile(c + g64 * stride_cg, out.to(c.dtype.element_ty), dst, row_ok, off_n, N, stride_cm, stride_cn,
                    BLOCK_N, INDEX_64)


@triton.jit
def gemm_kernel(
    # per call: operands and output (pointers, or tensor descriptors where *_TMA), partial tiles
    # and per-tile arrival counters (split-K, stream-K), epilogue inputs, B's zero points
    # (packed weights), a second output, gathered A rows / scattered C rows with their weights
    # and the groups' row offsets (grouped tile maps); None where unused
    a, b, c, ws, counters, bias, a_scale, b_scale, mul, add, b_zero, c2, a_rows, c_rows, row_weights, group_offsets,
    b2,  # fused feed-forward (GATED): the up projection's weight, laid out as b (the gate's)
    cat_src,  # OUT_MAP == 1 (split/cat): the (M, H, d3) tensor copied after each head's first part
    # fixed per plan
    M, N, K,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_bsn, stride_bsk,  # K-block scales (SCALE_KBLOCK)
    stride_mul_m, stride_mul_n, stride_add_m, stride_add_n,
    stride_bzn, stride_bzk,  # 4-bit weights (INT4 groups): B's zero points (b_zero)
    sk_tiles, sk_split,  # STREAM_K: the last sk_tiles tiles (in schedule order) in sk_split K slices each
    # MoE / batched family (TILE_MAP MAP_GROUPED / MAP_BATCHED): the groups (experts, batch entries)
    # and each operand's stride between groups (0: shared by every group)
    num_groups, stride_ag, stride_bg, stride_cg, stride_asg, stride_bsg, stride_biasg, NUM_GROUPS_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, STREAM_K: tl.constexpr, TILE_MAP: tl.constexpr,
    A_TMA: tl.constexpr, A_K_MAJOR: tl.constexpr, B_TMA: tl.constexpr, B_K_MAJOR: tl.constexpr, C_TMA: tl.constexpr,
    EVEN_K: tl.constexpr, INDEX_64: tl.constexpr,
    A_PRODUCER: tl.constexpr, B_PRODUCER: tl.constexpr, QUANT: tl.constexpr, ACC_INT: tl.constexpr,
    PROMOTE: tl.constexpr, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_K: tl.constexpr,
    GROUP_N: tl.constexpr, ACTIVATION: tl.constexpr,
    FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
    # fused feed-forward: GATED stores activation(A @ b^T) * (A @ b2^T) (two accumulators, one K
    # loop); the up projection's per-channel scales at b_scale[up_scale_offset + n * stride_bs]
    up_scale_offset, stride_bs, GATED: tl.constexpr,
    # output map (fused split/cat, MLA kv_b_proj): OUT_MAP 0 stores c (M, N); 1 splits each head's
    # dh = d1 + d2 columns into c (M, H, d1 + d3) and c2 (M, H, d2) and copies cat_src into c's
    # last d3 columns (kernels/memory.py store_split_cat; BLOCK_D3 = next power of 2 >= d3, or 0)
    cat_d1, cat_dh, cat_d3, stride_c1m, stride_c1h, stride_c2m, stride_c2h, stride_sm, stride_sh,
    OUT_MAP: tl.constexpr, BLOCK_D3: tl.constexpr,
    # 4-bit B (kernels/packed.py): A_WORDS loads A's column pairs as 32-bit words; FAST_UNPACK
    # decodes nibbles with inline PTX (CUDA; the interpreter takes the plain integer ops)
    A_WORDS: tl.constexpr, FAST_UNPACK: tl.constexpr,
):
    """One program per work item (classic grid) or per SM (persistent grid), striding over
    work items (tile, K slice). Tiles computed in pieces meet through `ws` and `counters`
    (kernels/reduce.py: the last piece to arrive sums the partials and runs the epilogue; one
    launch; counters zero on entry and left zero):
    - SPLIT_K > 1: each tile in SPLIT_K slices of K; `ws` holds tiles * SPLIT_K blocks.
    - STREAM_K (persistent grid, SPLIT_K == 1): the first tiles whole, one program each
      (data-parallel waves, every program the same number); the last `sk_tiles` (the ragged last
      wave, chosen by the host) in `sk_split` K slices each, so that the last wave keeps the SMs
      busy for 1 / sk_split of a tile instead of a whole one. `ws` holds sk_tiles * sk_split
      blocks. (Shares of one range of (tile, K) iterations, the textbook form, skewed the
      programs' K positions: tiles that share operands read them at different times, and DRAM
      traffic grew 5x, scripts/streamk_probe.py.)

    The K loop (kernels/kstep.py): A_PRODUCER, B_PRODUCER and PROMOTE (kernels/modes.py); QUANT
    names the in-kernel quantization target of A ("e4m3", "e5m2", "int8" or ""); ACC_INT: int8
    dots accumulate in int32. A_K_MAJOR / B_K_MAJOR: the operand's K dimension has unit stride
    (else its row dimension has). EVEN_K: K % BLOCK_K == 0. INDEX_64: pointer offsets need 64
    bits. FLATTEN: flatten the work loop and the K loop into one pipelined loop. GROUP_K /
    GROUP_N: the K-block scales' group (SCALE_KBLOCK).

    MoE / batched family (kernels/schedule.py group_grid): MAP_GROUPED runs the tiles of every
    expert (rows [group_offsets[e], group_offsets[e + 1]) of A and C, B = b + e * stride_bg) and
    MAP_BATCHED those of num_groups (M, N) problems in one persistent launch; tile counts are read
    on the device. A_GATHER reads A's rows through `a_rows`; C's rows go to `c_rows[row]` (or
    their own row) times `row_weights[destination]`. Loads through pointers, or (A_TMA / B_TMA)
    through one descriptor over every group's rows; pointer stores.
    """
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    if TILE_MAP == MAP_DENSE:
        num_pid_m, num_pid_n, num_tiles = tile_grid(M, N, BLOCK_M, BLOCK_N, TILE_MAP)
    else:  # sizes on the device; no split-K / stream-K (the host sets SPLIT_K = 1, no STREAM_K)
        num_pid_m, num_pid_n, num_tiles, cum_rows = group_grid(M, N, num_groups, group_offsets, BLOCK_M, BLOCK_N,
                                                               NUM_GROUPS_P2, TILE_MAP)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if STREAM_K:
        tl.static_assert(SPLIT_K == 1, "stream-K replaces split-K")
        dp_tiles = num_tiles - sk_tiles
    else:
        dp_tiles = num_tiles
    num_work = dp_tiles * SPLIT_K
    k_per_split = tl.cdiv(k_tiles, SPLIT_K)
    tl.static_assert(A_PRODUCER != A_QUANT_GROUP or PROMOTE == PROMOTE_KBLOCK, "group-quantized A needs block promotion")
    tl.static_assert(not GATED or (SPLIT_K == 1 and not STREAM_K), "gated tiles are computed whole")
    tl.static_assert(OUT_MAP == 0 or (SPLIT_K == 1 and not STREAM_K and not C_TMA), "split/cat: whole tiles, pointers")
    # scales the K loop applied (per K block, or the rows' dynamic scales) are not applied again
    if A_PRODUCER == A_QUANT_ROW:
        a_mode: tl.constexpr = SCALE_NONE
        b_mode: tl.constexpr = B_SCALE
    elif PROMOTE == PROMOTE_KBLOCK:
        a_mode: tl.constexpr = SCALE_NONE
        b_mode: tl.constexpr = SCALE_NONE
    else:
        a_mode: tl.constexpr = A_SCALE
        b_mode: tl.constexpr = B_SCALE
    # The epilogue recomputes its tile from its own counter: it then does not depend on the
    # loads of the next tile, which the flattened loop issues while this epilogue runs.
    work_c = pid - num_programs
    for work in tl.range(pid, num_work, num_programs, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n, pid_k = work_item(work, num_pid_m, num_pid_n, num_tiles, GROUP_M, TILE_MAP)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if SPLIT_K == 1:
            k_lo = 0
            k_hi = k_tiles
        else:
            k_lo = pid_k * k_per_split
            k_hi = min(k_lo + k_per_split, k_tiles)
        a_t = a
        b_t = b
        b2_t = b2
        b_scale_t = b_scale
        m_hi = M
        a_idx = None
        a_row = off_m  # the tile's first row in a_t / b_t
        b_row = off_n
        if TILE_MAP != MAP_DENSE:  # the group's rows of A (batched) and of B
            g, off_m, m_hi = group_rows(pid_m, cum_rows, group_offsets, M, BLOCK_M, TILE_MAP)
            a_row = off_m
            # a descriptor spans every group's rows ((groups * rows, K), stride 0: one shared
            # group): the tile's rows sit g * (stride_g // stride_row) rows down; rows read past
            # the group's end only feed outputs the store drops
            if B_TMA:
                b_row = off_n + g * (stride_bg // stride_bn)
            else:
                b_t = b + g.to(tl.int64) * stride_bg
                if GATED:
                    b2_t = b2 + g.to(tl.int64) * stride_bg
            if TILE_MAP == MAP_BATCHED:
                if A_TMA:
                    a_row = off_m + g * (stride_ag // stride_am)
                else:
                    a_t = a + g.to(tl.int64) * stride_ag
            if A_PRODUCER == A_GATHER:
                rm = off_m + tl.arange(0, BLOCK_M)
                a_idx = tl.load(a_rows + rm, mask=rm < m_hi, other=0)
            if PROMOTE == PROMOTE_KBLOCK:  # the group's block scales of B (A's: the token rows')
                b_scale_t = b_scale + g.to(tl.int64) * stride_bsg
        acc = k_range_product(a_t, b_t, a_scale, b_scale_t, a_row, b_row, k_lo, k_hi, m_hi, N, K, stride_am, stride_ak,
                              stride_bn, stride_bk, stride_asm, stride_ask, stride_bsn, stride_bsk,
                              BLOCK_M, BLOCK_N, BLOCK_K, A_TMA, A_K_MAJOR, B_TMA, B_K_MAJOR, EVEN_K, INDEX_64, ACC_INT,
                              A_PRODUCER, B_PRODUCER, PROMOTE, QUANT, A_SCALE, B_SCALE, GROUP_K, GROUP_N,
                              b_zero, stride_bzn, stride_bzk, a_idx, b2=b2_t, GATED=GATED, A_WORDS=A_WORDS,
                              FAST_UNPACK=FAST_UNPACK, scale_n=off_n)

        work_c += num_programs
        pid_m, pid_n, pid_k = work_item(work_c, num_pid_m, num_pid_n, num_tiles, GROUP_M, TILE_MAP)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if TILE_MAP != MAP_DENSE:
            g, off_m, m_hi = group_rows(pid_m, cum_rows, group_offsets, M, BLOCK_M, TILE_MAP)
            if GATED:  # (16-bit operands: no scales) activation(gate) * up, then the group's epilogue
                acc = gate_tile(acc, off_m, off_n, m_hi, N, None, None, 0, 0, BLOCK_M, BLOCK_N, SCALE_NONE,
                                SCALE_NONE, ACTIVATION)
                _group_epilogue(acc, c, g, off_m, off_n, m_hi, N, stride_cm, stride_cn, stride_cg, bias, stride_biasg,
                                a_scale, stride_asg, b_scale, stride_bsg, a_rows, c_rows, row_weights,
                                BLOCK_M, BLOCK_N, INDEX_64, A_PRODUCER, a_mode, b_mode, "none")
            else:
                _group_epilogue(acc, c, g, off_m, off_n, m_hi, N, stride_cm, stride_cn, stride_cg, bias, stride_biasg,
                                a_scale, stride_asg, b_scale, stride_bsg, a_rows, c_rows, row_weights,
                                BLOCK_M, BLOCK_N, INDEX_64, A_PRODUCER, a_mode, b_mode, ACTIVATION)
        elif SPLIT_K > 1:
            tile = pid_m * num_pid_n + pid_n
            last, acc = fixup_tile(acc, ws, counters, tile, tile * SPLIT_K + pid_k, tile * SPLIT_K, 1, 0, SPLIT_K,
                                   BLOCK_M, BLOCK_N)
            if last:
                _epilogue(acc, c, off_m, off_n, M, N, stride_cm, stride_cn, bias, a_scale, b_scale, mul, add,
                          stride_mul_m, stride_mul_n, stride_add_m, stride_add_n,
                          BLOCK_M, BLOCK_N, C_TMA, INDEX_64, a_mode, b_mode, ACTIVATION, EPILOGUE_SUBTILE)
        elif OUT_MAP == 1:
            out = finish_tile(acc, off_m, off_n, M, N, bias, a_scale, b_scale, mul, add, stride_mul_m, stride_mul_n,
                              stride_add_m, stride_add_n, BLOCK_M, BLOCK_N, a_mode, b_mode, ACTIVATION)
            store_split_cat(c, c2, cat_src, out.to(c.dtype.element_ty), off_m, off_n, M, N, cat_d1, cat_dh, cat_d3,
                            stride_c1m, stride_c1h, stride_c2m, stride_c2h, stride_sm, stride_sh,
                            BLOCK_M, BLOCK_N, BLOCK_D3, INDEX_64)
        elif GATED:
            acc = gate_tile(acc, off_m, off_n, M, N, a_scale, b_scale, up_scale_offset, stride_bs, BLOCK_M, BLOCK_N,
                            a_mode, b_mode, ACTIVATION)
            _epilogue(acc, c, off_m, off_n, M, N, stride_cm, stride_cn, bias, a_scale, b_scale, mul, add,
                      stride_mul_m, stride_mul_n, stride_add_m, stride_add_n,
                      BLOCK_M, BLOCK_N, C_TMA, INDEX_64, SCALE_NONE, SCALE_NONE, "none", EPILOGUE_SUBTILE)
        else:
            _epilogue(acc, c, off_m, off_n, M, N, stride_cm, stride_cn, bias, a_scale, b_scale, mul, add,
                      stride_mul_m, stride_mul_n, stride_add_m, stride_add_n,
                      BLOCK_M, BLOCK_N, C_TMA, INDEX_64, a_mode, b_mode, ACTIVATION, EPILOGUE_SUBTILE)

    if STREAM_K:
        # the tail: the last sk_tiles tiles, each in sk_split K slices (unit u: slice u // sk_tiles
        # of tail tile u % sk_tiles; the slice is the slowest index, as in work_item, so programs
        # running together read the same K range of neighbouring tiles and share it in L2)
        k_per_slice = tl.cdiv(k_tiles, sk_split)
        for u in range(pid, sk_tiles * sk_split, num_programs):
            s = u // sk_tiles
            t = u % sk_tiles
            tile = dp_tiles + t
            pid_m, pid_n = map_tile(tile, num_pid_m, num_pid_n, GROUP_M, TILE_MAP)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            k_lo = s * k_per_slice
            acc = k_range_product(a, b, a_scale, b_scale, off_m, off_n, k_lo, tl.minimum(k_lo + k_per_slice, k_tiles),
                                  M, N, K, stride_am, stride_ak, stride_bn, stride_bk, stride_asm, stride_ask,
                                  stride_bsn, stride_bsk, BLOCK_M, BLOCK_N, BLOCK_K, A_TMA, A_K_MAJOR, B_TMA, B_K_MAJOR,
                                  EVEN_K, INDEX_64, ACC_INT, A_PRODUCER, B_PRODUCER, PROMOTE, QUANT, A_SCALE, B_SCALE,
                                  GROUP_K, GROUP_N, b_zero, stride_bzn, stride_bzk, A_WORDS=A_WORDS,
                                  FAST_UNPACK=FAST_UNPACK)
            last, acc = fixup_tile(acc, ws, counters, tile, t * sk_split + s, t * sk_split, 1, 0, sk_split,
                                   BLOCK_M, BLOCK_N)
            if last:
                _epilogue(acc, c, off_m, off_n, M, N, stride_cm, stride_cn, bias, a_scale, b_scale, mul, add,
                          stride_mul_m, stride_mul_n, stride_add_m, stride_add_n,
                          BLOCK_M, BLOCK_N, C_TMA, INDEX_64, a_mode, b_mode, ACTIVATION, EPILOGUE_SUBTILE)
