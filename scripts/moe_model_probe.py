"""Probe (device tool): where bench-model's MoE decoder spends a prefill (issue 13's moe_mlp in a model): the original
(experts in transformers' grouped_mm form) and its converted copies, prefill timed eagerly (host cost included) and as
a CUDA-graph replay (kernel time), and the host time of one eager prefill call (CPU clock, the GPU left to drain
first).

    python3 scripts/moe_model_probe.py OUT.txt [--tokens 512 2048] [--schemes bf16 fp8]
"""

import argparse
import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import gemmkit.nn as gnn  # noqa: E402
from gemmkit.tools import bench_model as bm  # noqa: E402
from gemmkit.tools.timing import time_eager_us, time_graph_us  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--tokens", type=int, nargs="+", default=[512, 2048])
p.add_argument("--schemes", nargs="+", default=["bf16", "fp8"])
p.add_argument("--layers", type=int, default=4)
args = p.parse_args()
cfg = bm.ModelConfig(hidden=2048, intermediate=6144, heads=16, kv_heads=4, layers=args.layers, vocab=32000,
                     max_positions=max(args.tokens), experts=128, top_k=8, moe_intermediate=768)
torch.manual_seed(0)
base = bm.Decoder(cfg, torch.bfloat16, "cuda")
models = {"torch (original)": base}
for scheme in args.schemes:
    m = copy.deepcopy(base)
    gnn.convert(m, scheme)
    models[f"gemmkit {scheme}"] = m
out = open(args.out, "w")


def say(line):
    print(line, flush=True)
    out.write(line + "\n")


say(f"{torch.cuda.get_device_name()} torch {torch.__version__}: bench-model's MoE decoder ({cfg.layers} layers, "
    f"hidden {cfg.hidden}, {cfg.experts} experts of {cfg.moe_intermediate}, top-{cfg.top_k}), prefill of T tokens")
with torch.no_grad():
    for T in args.tokens:
        prompt = torch.randint(cfg.vocab, (1, T), device="cuda")
        for name, m in models.items():
            call = lambda m=m: m.prefill(prompt)  # noqa: E731
            eager = time_eager_us([call], min_calls=3, min_ms=20, repeats=3)
            graph = time_graph_us([call], rep_ms=20, retries=3)
            torch.cuda.synchronize()
            host = []
            for _ in range(5):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                call()
                host.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
            say(f"T={T} {name:18s} eager {eager:9.1f} us  graph {graph:9.1f} us  host per call {sorted(host)[2]:9.1f} us")
