"""Probe (device tool): gemm_a16w16 at M = 128 (and other small M) on the held-out layers with
explicit tl configs (small tiles with deep pipelines, as cuBLAS's sm_90 kernels take there:
tuning/fitted/cublas_kernels_bf16_h100.txt), against F.linear and gemmkit's own pick, under
CUDA-graph replay. Prints each problem's configs sorted by time.

Usage: python3 scripts/small_m_probe.py [OUT_FILE] [--m M ...]
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from probe_util import a16w16_config_calls  # noqa: E402

args = sys.argv[1:]
out = open(args[0], "w") if args and not args[0].startswith("--") else sys.stdout
MS = [int(a) for a in args[args.index("--m") + 1:]] if "--m" in args else [128]
T = dict(TMA=True)
CONFIGS = {
    "64x64x64 w4 s10": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=10, **T),
    "64x64x128 w4 s6": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=6, **T),
    "64x64x64 w4 s8 split-K 2": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=8, SPLIT_K=2, **T),
    "64x128x64 w4 s6": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=6, **T),
    "64x128x64 w4 s6 split-K 2": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=6, SPLIT_K=2, **T),
    "64x128x128 w4 s4": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=4, **T),
    "128x64x64 w4 s8": dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=8, **T),
    "64x64x64 w4 s10 stream-K": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=10, PERSISTENT=True,
                                     STREAM_K=True, **T),
}
models = json.load(open(os.path.join(os.path.dirname(gemmkit.__file__), "tools", "models.json")))
shapes = sorted({tuple(nk) for name, m in models.items() if name.startswith("heldout-") for nk in m["layers"].values()})
print(torch.cuda.get_device_name(), torch.__version__, file=out, flush=True)
for M in MS:
    for N, K in shapes:
        calls = a16w16_config_calls(M, N, K, CONFIGS, out)
        names = list(calls)
        times = time_graphs_us(*[[calls[n]] for n in names], rep_ms=5, retries=3)
        base = times[0]
        print(f"M={M} N={N} K={K}: " + "  ".join(f"{n} {base / t:.2f}" for n, t in sorted(zip(names, times),
                                                                                   key=lambda p: p[1])),
              file=out, flush=True)
        torch.cuda.empty_cache()
