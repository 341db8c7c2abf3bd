"""Probe (device tool): tile configs of the block-scaled grouped FP8 GEMM (DeepSeek-V3 routed
experts), against the row-wise grouped FP8 GEMM and torch._scaled_grouped_mm on the same problem,
under CUDA-graph replay (weights far larger than the L2: one input set).
Usage: python3 scripts/grouped_block_probe.py [OUT_FILE]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gemmkit.tools import registry, tune  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402

out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
PROBLEMS = [("deepseek-v3-moe:zipf", 4096, 4096, 7168), ("deepseek-v3-moe:zipf", 4096, 7168, 2048),
            ("deepseek-v3-moe:zipf", 512, 4096, 7168), ("qwen3-30b-a3b-moe:balanced", 4096, 1536, 2048)]
TILES = [(128, 64, 4, 3), (64, 128, 4, 3), (128, 128, 4, 2), (128, 128, 8, 3), (64, 64, 4, 4), (128, 256, 8, 3),
         (256, 128, 8, 3)]


def cfg(bm, bn, warps, stages, persistent=False):
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, num_warps=warps, num_stages=stages, TMA=True,
                PERSISTENT=persistent)


for spec, T, N, K in PROBLEMS:
    block = registry.get_op(f"grouped_a8w8_blockscale@{spec}")
    inp = block.make_inputs(T, N, K, "e4m3", "cuda")
    ref = block.reference(inp)
    calls = {"derived": lambda: block.run(inp)}
    for bm, bn, w, st in TILES:
        for p in (False, True):
            c = cfg(bm, bn, w, st, p)
            try:
                err = tune.rel_error(block.run(inp, c), ref)
            except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                print(f"  {c}: {type(e).__name__}: {str(e)[:100]}", file=out)
                continue
            if err < block.tolerance:
                calls[f"{bm}x{bn} w{w} s{st}{' persistent' if p else ''}"] = lambda c=c: block.run(inp, c)
    calls["torch row-wise _scaled_grouped_mm"] = lambda: block.baseline(inp)
    from gemmkit.ops.grouped import grouped_gemm_a8w8

    calls["gemmkit row-wise grouped_a8w8"] = lambda: grouped_gemm_a8w8(inp["x_sorted"], inp["wr"], inp["xs_sorted"],
                                                                       inp["wrs"], inp["o"])
    names = list(calls)
    times = time_graphs_us(*[[calls[n]] for n in names], rep_ms=20, retries=5)
    flops = 2.0 * T * block.top_k * N * K
    print(f"{spec} T={T} N={N} K={K}:", file=out)
    for n, t in sorted(zip(names, times), key=lambda p: p[1]):
        print(f"  {t:9.1f} us {flops / t / 1e6:7.1f} TFLOP/s  {n}", file=out, flush=True)
    del inp, ref
    torch.cuda.empty_cache()
