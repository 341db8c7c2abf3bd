"""Top-k routings sorted by expert on the device (gemmkit.moe.sort_by_expert): a stable counting sort.

Every routed slot (flat index i = t * k + j of the (T, k) ids, n = T * k of them) falls in a bin: 0 for
ids < 0, 1 + e for expert e, E + 1 for ids >= E. Sorted row r then holds the slots of bin 0, then
expert 0's, ..., each in flat-index order (stable), and expert_offsets[e] = the number of slots in bins
<= e (ids < e). Inside a block of slots the order comes from tl.sort of (bin, index) keys; across
blocks from per-block bin counts:
- up to one block of slots: sort_routing_single_kernel, one program does it all;
- more: routing_counts_kernel (each block's bin counts), routing_starts_kernel (one program: the
  offsets and where each block's run of each bin lands), routing_place_kernel (each block's slots to
  their sorted rows).
Outputs: scatter[r] = the flat index of sorted row r, gather[r] = its token (flat // k), int32.
"""

import triton
import triton.language as tl


@triton.jit
def _block_bins(ids_ptr, start, n, E, BLOCK: tl.constexpr):
    """(valid, bin) of slots start .. start + BLOCK - 1."""
    offs = start + tl.arange(0, BLOCK)
    valid = offs < n
    ids = tl.load(ids_ptr + offs, mask=valid, other=0)
    return valid, (tl.minimum(tl.maximum(ids, -1), E) + 1).to(tl.int32)


@triton.jit
def _sorted_block(valid, bins, BLOCK: tl.constexpr, BINS: tl.constexpr):
    """(bin, block-local index) of a block's slots in (bin, index) order, the invalid ones (past n) last."""
    keys = tl.where(valid, bins, BINS) * BLOCK + tl.arange(0, BLOCK)
    keys = tl.sort(keys)
    return keys // BLOCK, keys % BLOCK


@triton.jit
def _store_offsets(offsets_ptr, counts, E, BINS: tl.constexpr):
    """expert_offsets[e] = slots in bins <= e, e = 0 .. E, from the bin counts; returns the inclusive sums."""
    ends = tl.cumsum(counts, 0)
    e = tl.arange(0, BINS)
    tl.store(offsets_ptr + e, ends, mask=e <= E)
    return ends


@triton.jit
def sort_routing_single_kernel(ids_ptr, gather_ptr, scatter_ptr, offsets_ptr, n, E, k,
                               BLOCK: tl.constexpr, BINS: tl.constexpr):
    """All n <= BLOCK slots in one program: its sorted block is the whole order."""
    valid, bins = _block_bins(ids_ptr, 0, n, E, BLOCK)
    _, src = _sorted_block(valid, bins, BLOCK, BINS)
    r = tl.arange(0, BLOCK)
    tl.store(scatter_ptr + r, src, mask=r < n)
    tl.store(gather_ptr + r, src // k, mask=r < n)
    _store_offsets(offsets_ptr, tl.histogram(bins, BINS, mask=valid), E, BINS)


@triton.jit
def routing_counts_kernel(ids_ptr, counts_ptr, n, E, BLOCK: tl.constexpr, BINS: tl.constexpr):
    """counts[b, :] = the bin counts of block b's slots."""
    b = tl.program_id(0)
    valid, bins = _block_bins(ids_ptr, b * BLOCK, n, E, BLOCK)
    tl.store(counts_ptr + b * BINS + tl.arange(0, BINS), tl.histogram(bins, BINS, mask=valid))


@triton.jit
def routing_starts_kernel(counts_ptr, starts_ptr, offsets_ptr, blocks, E, BINS: tl.constexpr):
    """One program. expert_offsets from the summed counts; starts[b, bin] = the sorted row of block b's
    first slot in `bin` minus that slot's position in the block's sorted order (so that a slot at
    position p lands in row starts[b, bin] + p)."""
    e = tl.arange(0, BINS)
    total = tl.zeros([BINS], dtype=tl.int32)
    for b in range(blocks):
        total += tl.load(counts_ptr + b * BINS + e)
    seen = _store_offsets(offsets_ptr, total, E, BINS) - total  # where each bin's rows begin
    for b in range(blocks):
        c = tl.load(counts_ptr + b * BINS + e)
        tl.store(starts_ptr + b * BINS + e, seen - (tl.cumsum(c, 0) - c))
        seen += c


@triton.jit
def routing_place_kernel(ids_ptr, starts_ptr, gather_ptr, scatter_ptr, n, E, k,
                         BLOCK: tl.constexpr, BINS: tl.constexpr):
    """Block b's slots to their sorted rows."""
    b = tl.program_id(0)
    valid, bins = _block_bins(ids_ptr, b * BLOCK, n, E, BLOCK)
    sbin, local = _sorted_block(valid, bins, BLOCK, BINS)
    p = tl.arange(0, BLOCK)
    placed = p < n - b * BLOCK  # (the valid slots sort first)
    row = tl.load(starts_ptr + b * BINS + sbin, mask=placed, other=0) + p
    src = b * BLOCK + local
    tl.store(scatter_ptr + row, src, mask=placed)
    tl.store(gather_ptr + row, src // k, mask=placed)
