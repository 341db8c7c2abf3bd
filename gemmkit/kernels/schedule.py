"""Tile scheduling: which output tile (and K slice) a work item is.

A tile map says how many tiles there are and where tile t lies; the kernel's persistent loop and
its split-K / stream-K bookkeeping see tiles only through `tile_grid` and `map_tile`, so a new
schedule (a batch of problems, experts whose row counts live on the device) is one more TILE_MAP
case here. Today: MAP_DENSE, one (M, N) grid in grouped order.
"""

import triton
import triton.language as tl

from .modes import MAP_BATCHED, MAP_DENSE, MAP_GROUPED


@triton.jit
def grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Map a linear tile id to (pid_m, pid_n) in grouped order: GROUP_M tile-rows are walked
    column by column, so programs running together share A rows and B columns in L2."""
    tiles_per_group = GROUP_M * num_pid_n
    group = tile_id // tiles_per_group
    first_m = group * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    in_group = tile_id % tiles_per_group
    pid_m = first_m + in_group % group_m
    pid_n = in_group // group_m
    return pid_m, pid_n


@triton.jit
def tile_grid(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TILE_MAP: tl.constexpr):
    """(tile-rows, tile-columns, tiles) of the map."""
    tl.static_assert(TILE_MAP == MAP_DENSE, "unknown tile map")
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    return num_pid_m, num_pid_n, num_pid_m * num_pid_n


@triton.jit
def map_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr, TILE_MAP: tl.constexpr):
    """(pid_m, pid_n) of tile `tile_id` in the map's order (MAP_GROUPED / MAP_BATCHED: pid_m is a
    virtual tile-row, see group_rows)."""
    tl.static_assert(TILE_MAP == MAP_DENSE or TILE_MAP == MAP_GROUPED or TILE_MAP == MAP_BATCHED,
                     "unknown tile map")
    return grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)


@triton.jit
def work_item(work_id, num_pid_m, num_pid_n, num_tiles, GROUP_M: tl.constexpr, TILE_MAP: tl.constexpr):
    """Map a work id in [0, tiles * SPLIT_K) to (pid_m, pid_n, pid_k).

    The K slice is the slowest index: programs that run at the same time work on the same K
    range of neighbouring tiles, which keeps that slice of A and B hot in L2.
    """
    pid_k = work_id // num_tiles
    pid_m, pid_n = map_tile(work_id % num_tiles, num_pid_m, num_pid_n, GROUP_M, TILE_MAP)
    return pid_m, pid_n, pid_k


# ---------------------------------------------------------------------------------------------
# MoE / batched family: grouped and batched tile maps


@triton.jit
def group_grid(M, N, num_groups, group_offsets, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               NUM_GROUPS_P2: tl.constexpr, TILE_MAP: tl.constexpr):
    """(virtual tile-rows, tile-columns, tiles, cumulative tile-rows per group) of a grouped or
    batched map, read on the device (no host synchronization).

    MAP_GROUPED: group g owns rows [group_offsets[g], group_offsets[g + 1]) of A and C (an empty
    or negative range owns no tile), cdiv(rows, BLOCK_M) tile-rows each; `cum` (NUM_GROUPS_P2,)
    holds the inclusive running sum over groups. MAP_BATCHED: num_groups groups of M rows
    (`cum` unused)."""
    num_pid_n = tl.cdiv(N, BLOCK_N)
    if TILE_MAP == MAP_GROUPED:
        g = tl.arange(0, NUM_GROUPS_P2)
        lo = tl.maximum(tl.load(group_offsets + g, mask=g < num_groups, other=0), 0)  # (as group_rows clamps)
        hi = tl.minimum(tl.load(group_offsets + g + 1, mask=g < num_groups, other=0), M)
        rows = tl.maximum(hi - lo, 0)
        cum = tl.cumsum((rows + BLOCK_M - 1) // BLOCK_M, 0)
        num_pid_m = tl.max(cum, 0)
    else:
        tl.static_assert(TILE_MAP == MAP_BATCHED, "group_grid serves MAP_GROUPED and MAP_BATCHED")
        num_pid_m = tl.cdiv(M, BLOCK_M) * num_groups
        cum = num_pid_m
    return num_pid_m, num_pid_n, num_pid_m * num_pid_n, cum


@triton.jit
def group_rows(pid_m, cum, group_offsets, M, BLOCK_M: tl.constexpr, TILE_MAP: tl.constexpr):
    """(group, first row, row end) of virtual tile-row pid_m: MAP_GROUPED rows are A's / C's
    (sorted) rows, clamped to [0, M] (offsets are not checked without GEMMKIT_DEBUG: bad ones never
    read or store outside the rows); MAP_BATCHED rows are the group's own [0, M)."""
    if TILE_MAP == MAP_GROUPED:
        before = cum <= pid_m
        g = tl.sum(before.to(tl.int32), 0)
        first_tile = tl.max(tl.where(before, cum, 0), 0)  # cum[g - 1] (cum is non-decreasing)
        lo = tl.maximum(tl.load(group_offsets + g), 0)  # (unchecked offsets outside [0, M]: no row outside)
        hi = tl.minimum(tl.load(group_offsets + g + 1), M)
        off_m = lo + (pid_m - first_tile) * BLOCK_M
    else:
        tiles_m = tl.cdiv(M, BLOCK_M)
        g = pid_m // tiles_m
        off_m = (pid_m % tiles_m) * BLOCK_M
        hi = M
    return g, off_m, hi
