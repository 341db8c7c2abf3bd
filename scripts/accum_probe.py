"""Development probe (device tool): the K-loop promotion paths against their torch baselines at
one shape, all replays interleaved (graph replay, rotating inputs): block-scaled FP8
(gemm_a8w8_blockscale vs torch._scaled_mm block-wise) and row-wise FP8 with fp32 promotion per
K tile (gemm_a8w8(fast_accum=False) vs _scaled_mm(use_fast_accum=False)), each with the configs
given as JSON. Not part of the package; `gemmkit bench` produces the reported figures.

    python scripts/accum_probe.py M N K '{"BLOCK_M": 128, ...}' ...
"""

import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gemmkit  # noqa: E402
from gemmkit.core.device import device_info  # noqa: E402
from gemmkit.tools.registry import get_op  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import input_sets, rel_error  # noqa: E402


def main(argv):
    M, N, K = map(int, argv[:3])
    configs = [None] + [json.loads(a) for a in argv[3:]]
    dev = device_info()
    op = get_op("a8w8_blockscale_vs_rowwise")  # block-quantized and row-quantized forms of one x, w
    sets = input_sets(op, M, N, K, "e4m3", dev)
    ref = op.reference(sets[0])
    names, lists = [], []

    def add(name, fn, check=None):
        if check is not None:
            err = rel_error(fn(sets[0]), check)
            if err > 2e-2:
                print(f"  WRONG (rel err {err:.2e}): {name}", flush=True)
                return
        names.append(name)
        lists.append([lambda s=s: fn(s) for s in sets])

    add("torch block-wise _scaled_mm", get_op("a8w8_blockscale").baseline, ref)
    row_ref = sets[0]["xr"].float() @ sets[0]["wr"].float().T * sets[0]["xrs"] * sets[0]["wrs"]
    add("torch row-wise _scaled_mm(use_fast_accum=False)", lambda s: torch._scaled_mm(
        s["xr"], s["wr"].t(), scale_a=s["xrs"], scale_b=s["wrs"], out_dtype=torch.bfloat16, use_fast_accum=False),
        row_ref)
    add("torch row-wise _scaled_mm(use_fast_accum=True)", op.baseline, row_ref)
    for cfg in configs:
        add(f"blockscale {cfg}", lambda s, c=cfg: gemmkit.gemm_a8w8_blockscale(s["x"], s["w"], s["xs"], s["ws"],
                                                                                 config=c), ref)
        add(f"a8w8 fast_accum=False {cfg}", lambda s, c=cfg: gemmkit.gemm_a8w8(s["xr"], s["wr"], s["xrs"], s["wrs"],
                                                                               config=c, fast_accum=False), row_ref)
    add("a8w8 fast_accum=True (table)", lambda s: gemmkit.gemm_a8w8(s["xr"], s["wr"], s["xrs"], s["wrs"]), row_ref)
    times = time_graphs_us(*lists, rep_ms=10)
    flops = 2.0 * M * N * K
    print(f"M={M} N={N} K={K}")
    for name, t in zip(names, times):
        print(f"  {t:8.1f} us {flops / t / 1e6:7.1f} TFLOP/s  {name}", flush=True)
    print_binaries()


WAIT = re.compile(r"wgmma.wait_group.sync.aligned (\d+)")


def print_binaries():
    """Registers and spills of every compiled variant of the shared kernel (Triton's JIT cache)."""
    from gemmkit.core.dense import _jit_kernel
    for caches in getattr(_jit_kernel(), "device_caches", {}).values():
        for key, k in caches[0].items():
            try:
                k._init_handles()
                print(f"  binary: {k.n_regs} registers, {k.n_spills} spills, {k.metadata.shared} B shared, "
                      f"{k.metadata.num_warps} warps; ptx waits: {sorted(set(WAIT.findall(k.asm.get('ptx', ''))))}",
                      flush=True)
            except Exception as e:  # noqa: BLE001 - the cache layout differs between Triton versions
                print(f"  binary: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
