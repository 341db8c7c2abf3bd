"""Tile scheduling: which output tile (and K slice) a program works on."""

import triton
import triton.language as tl


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
def work_item(work_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Map a work id in [0, tiles * SPLIT_K) to (pid_m, pid_n, pid_k).

    The K slice is the slowest index: programs that run at the same time work on the same K
    range of neighbouring tiles, which keeps that slice of A and B hot in L2.
    """
    num_mn = num_pid_m * num_pid_n
    pid_k = work_id // num_mn
    pid_m, pid_n = grouped_tile(work_id % num_mn, num_pid_m, num_pid_n, GROUP_M)
    return pid_m, pid_n, pid_k
