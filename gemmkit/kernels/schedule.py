"""Tile scheduling: which output tile (and K slice) a work item is.

A tile map says how many tiles there are and where tile t lies; the kernel's persistent loop and
its split-K / stream-K bookkeeping see tiles only through `tile_grid` and `map_tile`, so a new
schedule (a batch of problems, experts whose row counts live on the device) is one more TILE_MAP
case here. Today: MAP_DENSE, one (M, N) grid in grouped order.
"""

import triton
import triton.language as tl

from .modes import MAP_DENSE


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
    """(pid_m, pid_n) of tile `tile_id` in the map's order."""
    tl.static_assert(TILE_MAP == MAP_DENSE, "unknown tile map")
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
