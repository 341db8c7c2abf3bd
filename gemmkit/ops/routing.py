"""The launches of kernels/routing.py for gemmkit.moe.sort_by_expert: a plan per (ids shape, dtype, device,
num_experts), the kernels launched directly after the first call (core/launcher.CachedLaunch).

Up to SINGLE_MAX slots (T * k) one program sorts them; above, blocks of `block_slots(n)` slots in three launches
(measured on the H100, scripts/routing_probe.py: one program's tl.sort of 2048 slots took 17.6 us against 12.8
for two blocks; blocks of 512 led to 16384 slots, 1024 at 32768, 2048 at 131072, where the one program summing
the blocks' counts in order costs more with smaller blocks).
MAX_BINS bounds the experts the kernels take (bins = E + 2, a power of two in registers); more experts,
and CPU tensors outside the Triton interpreter, sort with torch ops (`sort_by_expert_torch`).
"""

from __future__ import annotations

import torch

from ..core import validate as v
from ..core.config import next_pow2
from ..core.device import interpreter_active
from ..core.launcher import CachedLaunch
from ..core.plan import PlanCache, plan_key

SINGLE_MAX = 1024
BLOCK_MIN, BLOCK_MAX, BLOCKS = 512, 2048, 32  # blocks of BLOCK_MIN .. BLOCK_MAX slots, about BLOCKS of them
MAX_BINS = 4096
_plans = PlanCache()


def sort_by_expert_torch(flat: torch.Tensor, num_experts: int, k: int):
    """(gather_idx, scatter_idx, expert_offsets) of flat (T * k,) int32 / int64 ids by torch ops (a stable
    argsort): the route for CPU tensors outside the interpreter and for more than MAX_BINS - 2 experts. Ids outside
    [0, E) are clamped to -1 / E first, so that their slots keep flat order, as the kernels keep them."""
    clamped = flat.clamp(-1, num_experts)
    order = torch.argsort(clamped, stable=True)
    sorted_ids = clamped[order].contiguous()
    # searchsorted instead of bincount: bincount on CUDA reads the maximum back to the host
    bounds = torch.arange(num_experts + 1, device=flat.device, dtype=sorted_ids.dtype)
    offsets = torch.searchsorted(sorted_ids, bounds, out_int32=True)
    return (torch.div(order, max(k, 1), rounding_mode="floor").to(torch.int32), order.to(torch.int32), offsets)


def block_slots(n: int) -> int:
    """Slots per block of the three-launch sort of n > SINGLE_MAX slots."""
    return min(BLOCK_MAX, max(BLOCK_MIN, next_pow2(-(-n // BLOCKS))))


def kernels_take(flat: torch.Tensor, num_experts: int) -> bool:
    """True where kernels/routing.py sorts these ids (a CUDA tensor, or the CPU under the interpreter)."""
    return (flat.is_cuda or interpreter_active()) and num_experts + 2 <= MAX_BINS


def sort_by_expert_kernels(flat: torch.Tensor, num_experts: int, k: int):
    """sort_by_expert_torch's results by kernels/routing.py; flat: contiguous (n,) int32 / int64 ids."""
    key = plan_key((flat,), (num_experts, k))
    return _plans.plan_for(key, RoutingPlan, flat, num_experts, k)(flat)


class RoutingPlan:
    """The sort of n = flat.numel() ids among num_experts experts (flat on one device, contiguous)."""

    def __init__(self, flat: torch.Tensor, num_experts: int, k: int):
        v.check_devices(topk_ids=flat)
        n = flat.numel()
        if n >= 2**31 - BLOCK_MAX:
            raise ValueError(f"sort_by_expert: {n} routed slots; the kernels index them with int32")
        self.n, self.E, self.device = n, num_experts, flat.device
        self.bins = next_pow2(num_experts + 2)
        di = flat.device.index or 0
        if n <= SINGLE_MAX:
            from ..kernels.routing import sort_routing_single_kernel

            block = max(16, next_pow2(n))
            self.single = CachedLaunch(sort_routing_single_kernel, (1,), 8 if block >= 2048 else 4, 1, di)
            self.tail = (n, num_experts, max(k, 1), block, self.bins)
        else:
            from ..kernels.routing import routing_counts_kernel, routing_place_kernel, routing_starts_kernel

            self.single = None
            block = block_slots(n)
            self.blocks = -(-n // block)
            warps = 8 if block >= 2048 else 4
            self.counts = CachedLaunch(routing_counts_kernel, (self.blocks,), warps, 1, di)
            self.starts = CachedLaunch(routing_starts_kernel, (1,), 4, 1, di)
            self.place = CachedLaunch(routing_place_kernel, (self.blocks,), warps, 1, di)
            self.counts_tail = (n, num_experts, block, self.bins)
            self.starts_tail = (self.blocks, num_experts, self.bins)
            self.place_tail = (n, num_experts, max(k, 1), block, self.bins)

    def __call__(self, flat):
        n, dev = self.n, self.device
        gather = torch.empty(n, dtype=torch.int32, device=dev)
        scatter = torch.empty(n, dtype=torch.int32, device=dev)
        offsets = torch.empty(self.E + 1, dtype=torch.int32, device=dev)
        if n == 0:
            return gather, scatter, offsets.zero_()
        if self.single is not None:
            self.single((flat, gather, scatter, offsets), self.tail)
            return gather, scatter, offsets
        work = torch.empty((2, self.blocks, self.bins), dtype=torch.int32, device=dev)
        counts, starts = work[0], work[1]
        self.counts((flat, counts), self.counts_tail)
        self.starts((counts, starts, offsets), self.starts_tail)
        self.place((flat, starts, gather, scatter), self.place_tail)
        return gather, scatter, offsets
