"""Probe (device tool): tile configs of moe_mlp's gated grouped GEMM (gate and up halves of
(E, 2I, H), two accumulators, act(gate) * up in the epilogue) against its derived config and
torch's _grouped_mm to 2I + silu * mul, under CUDA-graph replay.
Usage: python3 scripts/gated_grouped_probe.py [OUT_FILE]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gemmkit import moe  # noqa: E402
from gemmkit.ops.grouped import grouped_gated_a16w16  # noqa: E402
from gemmkit.tools import registry, tune  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402

out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
PROBLEMS = [("mixtral-8x7b-moe-mlp:balanced", 4096), ("deepseek-v3-moe-mlp:zipf", 2048),
            ("qwen3-30b-a3b-moe-mlp:balanced", 4096)]
TILES = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (64, 128, 64, 4, 3), (128, 64, 64, 4, 4), (64, 64, 128, 4, 3),
         (64, 128, 128, 4, 2), (32, 64, 128, 4, 3)]

for spec, T in PROBLEMS:
    op = registry.get_op(f"moe_mlp@{spec}")
    (_, I, H), = [(0, n, k) for _, n, k in registry.model_shapes([spec.split(":")[0]])]
    inp = op.make_inputs(T, I, H, "bf16", "cuda")
    x, wgu = inp["x"], inp["w_gate_up"]
    g, s, o = moe.sort_by_expert(inp["ids"], op.experts)
    xs, ends = x[g.long()], o[1:].contiguous()

    def torch_seq():
        gate, up = torch._grouped_mm(xs, wgu.transpose(-2, -1), offs=ends, out_dtype=x.dtype).chunk(2, dim=-1)
        return F.silu(gate) * up

    ref = torch_seq().float()
    calls = {"torch _grouped_mm + silu * mul": torch_seq,
             "derived": lambda: grouped_gated_a16w16(x, wgu, o, gather_idx=g)}
    for bm, bn, bk, w, st in TILES:
        for p in (False, True):
            c = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st, TMA=True, PERSISTENT=p)
            try:
                err = tune.rel_error(grouped_gated_a16w16(x, wgu, o, gather_idx=g, config=c), ref)
            except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                print(f"  {c}: {type(e).__name__}: {str(e)[:100]}", file=out)
                continue
            if err < 2e-2:
                calls[f"{bm}x{bn}x{bk} w{w} s{st}{' persistent' if p else ''}"] = (
                    lambda c=c: grouped_gated_a16w16(x, wgu, o, gather_idx=g, config=c))
    names = list(calls)
    times = time_graphs_us(*[[calls[n]] for n in names], rep_ms=20, retries=5)
    print(f"{spec} T={T} I={I} H={H}:", file=out)
    for n, t in sorted(zip(names, times), key=lambda p: p[1]):
        print(f"  {t:9.1f} us  {n}", file=out, flush=True)
    del inp, x, wgu, xs
    torch.cuda.empty_cache()
