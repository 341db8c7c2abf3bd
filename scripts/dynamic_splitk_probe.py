"""Development probe (device tool): GPU time of the one-launch dynamic FP8 GEMM (x quantized per
token inside the GEMM) with the configs the shipped a8w8_fp8_dynamic table gives, on the shapes
where that config splits K. It reads the table file itself and calls
gemmkit.ops.a8w8.fused_dynamic_gemm, which every version since that table has, so two checkouts
can be timed in one device call: `PYTHONPATH=<checkout> python3 scripts/dynamic_splitk_probe.py`."""

import json
import os
import sys

import torch

import gemmkit
from gemmkit.ops.a8w8 import fused_dynamic_gemm
from gemmkit.tools.timing import time_graphs_us

with open(os.path.join(os.path.dirname(gemmkit.__file__), "configs", "NVIDIA_H100_80GB_HBM3",
                       "a8w8_fp8_dynamic.json")) as f:
    table = json.load(f)
print(f"gemmkit from {os.path.dirname(gemmkit.__file__)}, commit {os.environ.get('GEMMKIT_COMMIT', '?')}")
rows = []
for nk, buckets in sorted(table["shapes"].items()):
    N, K = map(int, nk.split(","))
    for bucket, cfg in sorted(buckets.items()):
        if cfg.get("SPLIT_K", 1) == 1 or bucket == "any":
            continue
        M = int(bucket.rsplit("_", 1)[1])
        sets = []
        for _ in range(8):  # rotation: 8 weights exceed the 50 MB L2 on every shape here
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            w = (torch.randn(N, K, device="cuda") / K**0.5).to(torch.float8_e4m3fn)
            ws = torch.rand(1, N, device="cuda") + 0.5
            sets.append((x, w, ws))
        calls = [lambda s=s: fused_dynamic_gemm(s[0], s[1], s[2], config=cfg) for s in sets]
        us = time_graphs_us(calls, rep_ms=15)[0]
        rows.append((N, K, M, cfg["SPLIT_K"], us))
        print(f"N={N} K={K} M={M} SPLIT_K={cfg['SPLIT_K']} BLOCK_N={cfg['BLOCK_N']} BLOCK_K={cfg['BLOCK_K']}: "
              f"{us:.2f} us", flush=True)
sys.exit(0 if rows else 1)
