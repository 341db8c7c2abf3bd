"""The shared dense GEMM kernel, composed from the scheduling, memory and epilogue pieces.

C = activation(A @ B^T * scales + bias): A (M, K), B (N, K) (nn.Linear weight layout), C (M, N).
Every dense op of gemmkit launches `gemm_kernel` with its own constexpr switches; nothing here is
specific to one op.
"""

import triton
import triton.language as tl

from .epilogue import SCALE_ROWS_IN_REGISTERS, finish_tile
from .memory import load_k_tile, store_tile
from .quant import quantize_values, rows_absmax, scales_from_absmax
from .reduce import split_k_fixup
from .schedule import work_item


@triton.jit
def _finish_and_store(
    acc, c, off_m, off_n, M, N, stride_cm, stride_cn, bias, a_scale, b_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, C_TMA: tl.constexpr, INDEX_64: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, ACTIVATION: tl.constexpr,
):
    out = finish_tile(acc, off_m, off_n, M, N, bias, a_scale, b_scale, BLOCK_M, BLOCK_N, A_SCALE, B_SCALE, ACTIVATION)
    if C_TMA:
        out = out.to(c.dtype)
    else:
        out = out.to(c.dtype.element_ty)
    store_tile(c, out, off_m, off_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N, C_TMA, INDEX_64)


@triton.jit
def gemm_kernel(
    a, b, c,  # operands and output: pointers, or tensor descriptors where *_TMA
    ws, counters,  # split-K partials (SPLIT_K, M, N) and per-tile arrival counters; None if SPLIT_K == 1
    bias, a_scale, b_scale,  # pointers or None
    M, N, K,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr,
    A_TMA: tl.constexpr, A_K_MAJOR: tl.constexpr,
    B_TMA: tl.constexpr, B_K_MAJOR: tl.constexpr,
    C_TMA: tl.constexpr,
    EVEN_K: tl.constexpr, INDEX_64: tl.constexpr, INT_DOT: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, ACTIVATION: tl.constexpr,
    FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
    A_QUANT: tl.constexpr,
):
    """One program per work item (classic grid) or per SM (persistent grid), striding over
    work items (tile, K slice). With SPLIT_K > 1, each work item writes its partial product to
    `ws` ((SPLIT_K, M, N) contiguous, accumulator type) and the last of a tile's SPLIT_K work
    items to arrive sums the partials and runs the epilogue (one launch; `counters`: one int32
    per tile, zero on entry, left zero on exit).

    A_K_MAJOR / B_K_MAJOR: the operand's K dimension has unit stride (else its row dimension has).
    EVEN_K: K % BLOCK_K == 0. INDEX_64: pointer offsets need 64 bits. INT_DOT: int8 operands,
    int32 accumulation. FLATTEN: flatten the work loop and the K loop into one pipelined loop.
    A_QUANT ("" or "e4m3", "e5m2", "int8"): A is 16-bit and quantized per row on the fly (dynamic
    per-token scales over the whole of K, computed by each program for its rows; needs pointer
    loads of A; the scales reach the epilogue in registers).
    """
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_work = num_pid_m * num_pid_n * SPLIT_K
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_per_split = tl.cdiv(k_tiles, SPLIT_K)
    # The epilogue recomputes its tile from its own counter: it then does not depend on the
    # loads of the next tile, which the flattened loop issues while this epilogue runs.
    work_c = pid - num_programs
    for work in tl.range(pid, num_work, num_programs, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n, pid_k = work_item(work, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if SPLIT_K == 1:
            k_lo = 0
            k_hi = k_tiles
        else:
            k_lo = pid_k * k_per_split
            k_hi = min(k_lo + k_per_split, k_tiles)
        if INT_DOT:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if A_QUANT != "":
            a_amax = rows_absmax(a, off_m, M, K, stride_am, stride_ak, BLOCK_M, BLOCK_K, A_K_MAJOR, EVEN_K, INDEX_64)
            a_rows_scale, a_rows_inv = scales_from_absmax(a_amax, A_QUANT)
        for ki in range(k_lo, k_hi):
            off_k = ki * BLOCK_K
            x = load_k_tile(a, off_m, off_k, M, K, stride_am, stride_ak,
                            BLOCK_M, BLOCK_K, A_TMA, A_K_MAJOR, EVEN_K, INDEX_64)
            if A_QUANT != "":
                x = quantize_values(x, a_rows_inv[:, None], A_QUANT)
            w = load_k_tile(b, off_n, off_k, N, K, stride_bn, stride_bk,
                            BLOCK_N, BLOCK_K, B_TMA, B_K_MAJOR, EVEN_K, INDEX_64)
            if INT_DOT:
                acc += tl.dot(x, w.T, out_dtype=tl.int32)
            else:
                acc = tl.dot(x, w.T, acc)

        work_c += num_programs
        pid_m, pid_n, pid_k = work_item(work_c, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if A_QUANT != "":
            a_scale_tile = a_rows_scale
            a_mode: tl.constexpr = SCALE_ROWS_IN_REGISTERS
        else:
            a_scale_tile = a_scale
            a_mode: tl.constexpr = A_SCALE
        if SPLIT_K > 1:
            last, acc = split_k_fixup(acc, ws, counters, pid_m * num_pid_n + pid_n, pid_k, off_m, off_n, M, N,
                                      SPLIT_K, BLOCK_M, BLOCK_N, INDEX_64)
            if last:
                _finish_and_store(acc, c, off_m, off_n, M, N, stride_cm, stride_cn, bias, a_scale_tile, b_scale,
                                  BLOCK_M, BLOCK_N, C_TMA, INDEX_64, a_mode, B_SCALE, ACTIVATION)
        elif EPILOGUE_SUBTILE:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            acc0, acc1 = tl.split(halves)
            _finish_and_store(acc0, c, off_m, off_n, M, N, stride_cm, stride_cn, bias, a_scale_tile, b_scale,
                              BLOCK_M, BLOCK_N // 2, C_TMA, INDEX_64, a_mode, B_SCALE, ACTIVATION)
            _finish_and_store(acc1, c, off_m, off_n + BLOCK_N // 2, M, N, stride_cm, stride_cn, bias, a_scale_tile,
                              b_scale, BLOCK_M, BLOCK_N // 2, C_TMA, INDEX_64, a_mode, B_SCALE, ACTIVATION)
        else:
            _finish_and_store(acc, c, off_m, off_n, M, N, stride_cm, stride_cn, bias, a_scale_tile, b_scale,
                              BLOCK_M, BLOCK_N, C_TMA, INDEX_64, a_mode, B_SCALE, ACTIVATION)
