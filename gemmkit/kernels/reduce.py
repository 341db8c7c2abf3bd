"""Split-K inside one launch: the K slices of a tile meet through a workspace and a counter.

Each of a tile's SPLIT_K work items stores its partial product, then bumps the tile's counter;
the one that arrives last sums every partial in slice order (so the result does not depend on
the arrival order) and runs the epilogue, and puts the counter back to zero for the next launch.
Nobody waits for anybody: no deadlock whatever the number of programs resident.
"""

import triton
import triton.language as tl

from .memory import store_tile, tile_indices


@triton.jit
def split_k_fixup(acc, ws, counters, tile, pid_k, off_m, off_n, M, N,
                  SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_64: tl.constexpr):
    """(is_last, total): total is the sum over the K slices of tile `tile` when this work item
    (slice `pid_k`) arrived last, else its own `acc`. `ws`: (SPLIT_K, M, N) contiguous."""
    store_tile(ws + pid_k * M * N, acc, off_m, off_n, M, N, N, 1, BLOCK_M, BLOCK_N, False, INDEX_64)
    # every thread's partial is written before the release below publishes it at GPU scope
    tl.debug_barrier()
    arrived = tl.atomic_add(counters + tile, 1, sem="acq_rel", scope="gpu")
    last = arrived == SPLIT_K - 1
    total = acc
    if last:
        rm, rn = tile_indices(off_m, off_n, BLOCK_M, BLOCK_N, INDEX_64)
        ptrs = ws + rm[:, None] * N + rn[None, :]
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        total = tl.zeros_like(acc)
        for s in tl.static_range(SPLIT_K):
            # .cg: read at L2, where the other programs' stores are, never a stale L1 line (this
            # program's own slice is read too, then replaced by its registers: one mask for all)
            part = tl.load(ptrs + s * M * N, mask=mask, other=0, cache_modifier=".cg")
            total += tl.where(pid_k == s, acc, part)
        tl.store(counters + tile, 0)
    return last, total
