"""Probe: the grouped (MoE) GEMM's derived config against the same config with TMA loads of the
expert weights (and of A where it is not gathered), and torch._grouped_mm, on the GPU."""

import dataclasses
import sys

import triton.testing

from gemmkit.ops import grouped
from gemmkit.tools.registry import get_op, model_shapes

out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
for spec, model in (("qwen3-30b-a3b-moe:balanced", "qwen3-30b-a3b-moe"), ("deepseek-v3-moe:zipf", "deepseek-v3-moe")):
    op = get_op(f"grouped_a16w16@{spec}")
    for name, N, K in model_shapes([model]):
        for T in (64, 512, 4096):
            inp = None
            inp = op.make_inputs(T, N, K, "bf16", "cuda")
            base = triton.testing.do_bench_cudagraph(lambda: op.baseline(inp))
            auto = triton.testing.do_bench_cudagraph(lambda: op.run(inp))
            cfg = list(grouped._plans.values())[-1].cfg
            line = f"{spec} {name} T={T}: _grouped_mm {base * 1e3:.1f} us, derived {auto * 1e3:.1f} ({base / auto:.2f}x)"
            for label, c in (("tma", dataclasses.replace(cfg, TMA=True)),
                             ("tma-s3", dataclasses.replace(cfg, TMA=True, num_stages=min(cfg.num_stages, 3)))):
                t = triton.testing.do_bench_cudagraph(lambda: op.run(inp, config=c))
                line += f", {label} {t * 1e3:.1f} ({base / t:.2f}x)"
            print(line + f"  [{cfg}]", file=out, flush=True)
