"""Probe (device tool): which kernel cuBLAS(Lt) runs for each held-out layer at medium M, beside
gemm_a16w16's config and both times (CUDA-graph replay, same run). The cuBLAS kernel names
(nvjet_*: tile MxN, K step and stages, cluster shape, schedule) say what tiling reaches its
figure on shapes whose tile waves fit 132 SMs badly.

Usage: python3 scripts/cublas_kernels_probe.py [OUT_FILE] [--fp8] [--m M ...]
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core.config import select_config  # noqa: E402
from gemmkit.core.device import device_info  # noqa: E402
from gemmkit.tools.configs import describe  # noqa: E402
from gemmkit.tools.registry import get_op  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402

args = sys.argv[1:]
out = open(args[0], "w") if args and not args[0].startswith("--") else sys.stdout
FP8 = "--fp8" in args
MS = [int(a) for a in args[args.index("--m") + 1:]] if "--m" in args else [128, 512, 2048]
models = json.load(open(os.path.join(os.path.dirname(gemmkit.__file__), "tools", "models.json")))
shapes = sorted({tuple(nk) for name, m in models.items() if name.startswith("heldout-")
                 for nk in m["layers"].values()})


def kernel_names(call):
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


dev = device_info(torch.device("cuda"))
print(torch.cuda.get_device_name(), torch.__version__, "fp8" if FP8 else "bf16", file=out, flush=True)
for M in MS:
    for N, K in shapes:
        if FP8:
            from gemmkit.quant import quantize_fp8
            (xq, xs), (wq, ws) = (quantize_fp8(torch.randn(M, K, device="cuda"), "row"),
                                  quantize_fp8(torch.randn(N, K, device="cuda"), "row"))
            ws = ws.reshape(1, N)
            base = lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16,  # noqa
                                            use_fast_accum=True)
            own = lambda: gemmkit.gemm_a8w8(xq, wq, xs, ws)  # noqa: E731
            op = get_op("a8w8")
        else:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
            base = lambda: F.linear(x, w)  # noqa: E731
            own = lambda: gemmkit.gemm_a16w16(x, w)  # noqa: E731
            op = get_op("a16w16")
        cfg = select_config(op.table, M, N, K, dev, *op.formats, 2)
        names = kernel_names(base)
        tb, to = time_graphs_us([base], [own], rep_ms=10, retries=3)
        tiles = -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
        print(f"M={M:5d} N={N:6d} K={K:6d} torch {tb:8.1f} us  gemmkit {to:8.1f} us  ratio {tb / to:5.2f}  "
              f"{2 * M * N * K / tb / 1e6:5.0f} TF/s | {' + '.join(names)} | {describe(cfg)} tiles={tiles}",
              file=out, flush=True)
        torch.cuda.empty_cache()
