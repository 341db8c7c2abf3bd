"""A bare persistent TMA GEMM in the style of Triton's tutorial 09, for comparison only.

`python -m gemmkit.tools.codegen` compiles it beside `gemm_kernel` with the same tiles to check
that composing the shared kernel from constexpr switches costs nothing in the K loop. C (M, N)
= A (M, K) @ B (N, K)^T, optionally times per-row A scales and per-column B scales; host
tensor descriptors; grouped tile order; one flattened, software-pipelined loop. Self-contained
on purpose (none of gemmkit's kernel pieces): it is the yardstick they are measured against.
"""

import triton
import triton.language as tl


@triton.jit
def _tile(tile_id, num_pid_in_group, num_pid_m, GROUP_M: tl.constexpr):
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def bare_persistent_gemm(a_desc, b_desc, c_desc, a_scale, b_scale, M, N, K,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, SCALES: tl.constexpr):
    start_pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    num_pid_in_group = GROUP_M * num_pid_n
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile(tile_id, num_pid_in_group, num_pid_m, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        tile_id_c += NUM_SMS
        pid_m, pid_n = _tile(tile_id_c, num_pid_in_group, num_pid_m, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if SCALES:
            acc = acc * tl.load(a_scale + rm, mask=rm < M)[:, None] * tl.load(b_scale + rn, mask=rn < N)[None, :]
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))
