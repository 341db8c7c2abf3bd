"""Probe: the grouped (MoE) GEMM's derived config against the same config with TMA loads of the
expert weights (and of A where it is not gathered), and torch._grouped_mm, on the GPU."""

import dataclasses
import sys

import triton.testing

from gemmkit.core import hopper_ws
from gemmkit.ops import grouped
from gemmkit.tools.registry import get_op, model_shapes

# (the tl kernel's configs are what this probe varies: the warp-specialized expert map off; scripts/grouped_ws_probe.py
# compares the two)
hopper_ws.GROUPED_MIN_ROWS = hopper_ws.GROUPED_FP8_MIN_ROWS = hopper_ws.GROUPED_GATED_MIN_ROWS = 10**9

out = open(sys.argv[1], "w") if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else sys.stdout
for spec, model in (("qwen3-30b-a3b-moe:balanced", "qwen3-30b-a3b-moe"), ("deepseek-v3-moe:zipf", "deepseek-v3-moe")):
    op = get_op(f"grouped_a16w16@{spec}")
    for name, N, K in model_shapes([model]):
        for T in ((64, 512) if "--tiles" in sys.argv else (64, 512, 4096)):
            inp = None
            inp = op.make_inputs(T, N, K, "bf16", "cuda")
            base = triton.testing.do_bench_cudagraph(lambda: op.baseline(inp))
            auto = triton.testing.do_bench_cudagraph(lambda: op.run(inp))
            cfg = list(grouped._plans.values())[-1].cfg
            line = f"{spec} {name} T={T}: _grouped_mm {base * 1e3:.1f} us, derived {auto * 1e3:.1f} ({base / auto:.2f}x)"
            variants = [("tma", dataclasses.replace(cfg, TMA=True)),
                        ("tma-s3", dataclasses.replace(cfg, TMA=True, num_stages=min(cfg.num_stages, 3)))]
            if "--tiles" in sys.argv:
                variants = [(f"{bm}x{bn}x{bk}-s{st}", dataclasses.replace(cfg, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                                                         num_stages=st, TMA=True))
                            for bm, bn, bk, st in ((64, 64, 128, 3), (64, 128, 64, 3), (64, 128, 64, 4),
                                                   (128, 128, 64, 3), (32, 64, 128, 3))]
            for label, c in variants:
                t = triton.testing.do_bench_cudagraph(lambda: op.run(inp, config=c))
                line += f", {label} {t * 1e3:.1f} ({base / t:.2f}x)"
            print(line + f"  [{cfg}]", file=out, flush=True)
