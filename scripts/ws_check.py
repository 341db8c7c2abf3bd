"""Probe (device tool): correctness of the warp-specialized kernel (core/hopper_ws.py) by x_scale
layout, persistent (at most one program per SM) and with one program per tile."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.ops import a8w8_blockscale as bs  # noqa: E402
from gemmkit.quant import dequantize_fp8_blockwise, quantize_fp8_blockwise  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402

torch.manual_seed(0)
for M, N, K in [(4096, 4096, 7168), (4096, 24576, 1536), (1000, 3000, 2000)]:
    x, w = torch.randn(M, K, device="cuda"), torch.randn(N, K, device="cuda") / K**0.5
    wq, ws = quantize_fp8_blockwise(w, (128, 128))
    for layout in ("col", "row"):
        xq, xs = quantize_fp8_blockwise(x, (1, 128), scale_layout=layout)
        ref = dequantize_fp8_blockwise(xq, xs) @ dequantize_fp8_blockwise(wq, ws, (128, 128)).T
        errs = [rel_error(gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws), ref) for _ in range(2)]
        plan = next(reversed(bs._plans.values())).gemm
        grid = plan.launch.grid
        plan.launch.grid = (-(-M // 128) * -(-N // 128), 1, 1)
        errs += [rel_error(gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws), ref) for _ in range(2)]
        plan.launch.grid = grid
        print(M, N, K, layout, xs.stride(), type(plan).__name__, plan.xs_tma, "persistent", " ".join(f"{e:.1e}" for e in errs[:2]),
              "one tile per program", " ".join(f"{e:.1e}" for e in errs[2:]), flush=True)
