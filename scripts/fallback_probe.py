"""Probe (device tool): which config rule serves shapes no table holds (issue 15).

For each held-out layer (models.json heldout-* entries) at each M, times gemm_a16w16 under
CUDA-graph replay, in the same interleaved replays as F.linear, with the config of each rule:
  table    what select_config picks today (the shipped table's generic bucket for M);
  nearest  M's bucket of the tuned shape nearest in (log N, log K) (core.config.nearest_shape_entry);
  derived  derive_config (the device's limits and the shape);
  waves    the nearest shape's entry with its SPLIT_K refitted (core.config.fit_waves; the first
           measurement, tuning/fitted/fallback_waves_h100.txt, was of a broader refit since replaced);
  rows     (--rows) the nearest shape's entry with BLOCK_M cut to M's rows (a power of two from 16);
  k256     (--rows) at M <= 32: BLOCK_M = M's rows, 64 x 256 tiles, 4 stages, no TMA, one K slice
           (the tuner's pick on three held-out layers at M = 32, tuning/fallback_m32/).
Identical configs are timed once. Prints one line per problem and the geomean ratio (F.linear time
/ gemmkit time) of each rule, and of the best rule per problem.
Usage: python3 scripts/fallback_probe.py OUT_FILE [--rows] [model ...] [--m M ...]
"""

import dataclasses
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core.config import (GemmConfig, derive_config, fit_to_smem, fit_waves, nearest_shape_entry,  # noqa: E402
                                 select_config)
from gemmkit.core.device import device_info  # noqa: E402
from gemmkit.core.formats import dense  # noqa: E402
from gemmkit.tools.registry import load_models, model_shapes  # noqa: E402
from gemmkit.tools.timing import rotation_count, time_graphs_us  # noqa: E402

args = sys.argv[1:]
out = open(args.pop(0), "w") if args else sys.stdout
ROWS = "--rows" in args
args = [a for a in args if a != "--rows"]
ms = [1, 8, 32, 128, 512, 2048, 8192]
if "--m" in args:
    i = args.index("--m")
    ms = [int(v) for v in args[i + 1:]]
    args = args[:i]
models = args or [n for n, m in load_models().items() if m.get("heldout")]
dev = device_info()
BF16 = dense(torch.bfloat16)
RULES = ("table", "nearest", "derived", "waves") + (("rows", "k256") if ROWS else ())
torch.manual_seed(0)
ratios = {r: [] for r in RULES + ("best",)}
print(f"{dev.name}, torch {torch.__version__}; models {' '.join(models)}; M {ms}", file=out, flush=True)
for label, N, K in model_shapes(models):
    for M in ms:
        sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                 torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5)
                for _ in range(rotation_count((M * K + N * K + M * N) * 2, dev.l2_bytes))]
        near, near_nk = nearest_shape_entry(dev.name, "a16w16", M, N, K)  # (None, (None, None)): none
        cfgs = {"table": select_config("a16w16", M, N, K, dev, BF16, BF16, 2),
                "nearest": fit_to_smem(GemmConfig.from_dict(near), dev, BF16, BF16, 2) if near else None,
                "derived": derive_config(M, N, K, dev, BF16, BF16, 2)}
        cfgs["waves"] = fit_waves(cfgs["nearest"], M, N, K, dev) if near else None
        if ROWS:
            rows = max(16, 1 << (M - 1).bit_length())
            cfgs["rows"] = (dataclasses.replace(cfgs["waves"], BLOCK_M=min(cfgs["waves"].BLOCK_M, rows))
                            if near else None)
            cfgs["k256"] = (GemmConfig(BLOCK_M=rows, BLOCK_N=64, BLOCK_K=256, num_stages=4, num_warps=4)
                            if M <= 32 else None)
        distinct = list(dict.fromkeys(c for c in cfgs.values() if c is not None))
        ref = F.linear(*sets[0]).float()
        ok = []
        for c in distinct:
            try:
                err = (gemmkit.gemm_a16w16(*sets[0], config=c).float() - ref).norm() / ref.norm()
                ok.append(c) if err < 1e-2 else print(f"  {c}: wrong result {err:.2e}", file=out)
            except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                print(f"  {c}: {type(e).__name__}: {str(e)[:120]}", file=out)
        times = time_graphs_us([lambda x=x, w=w: F.linear(x, w) for x, w in sets],
                               *[[lambda x=x, w=w, c=c: gemmkit.gemm_a16w16(x, w, config=c) for x, w in sets]
                                 for c in ok], rep_ms=8, retries=7)
        base, by_cfg = times[0], dict(zip(ok, times[1:]))
        line = []
        for r in RULES:
            t = by_cfg.get(cfgs[r])
            if t is None:
                t = by_cfg.get(cfgs["table"])  # no nearest shape, or it failed: the rule falls back
            ratios[r].append(base / t)
            line.append(f"{r} {base / t:.2f}")
        ratios["best"].append(base / min(by_cfg.values()))
        print(f"{label} M={M} N={N} K={K}: F.linear {base:.1f} us; " + ", ".join(line)
              + f"; nearest {near_nk}"
              + (f"; waves SPLIT_K {cfgs['nearest'].SPLIT_K} -> {cfgs['waves'].SPLIT_K}" if near else ""),
              file=out, flush=True)
        del sets
        torch.cuda.empty_cache()
for r, v in ratios.items():
    g = math.exp(sum(map(math.log, v)) / len(v))
    print(f"{r}: geomean {g:.3f}, min {min(v):.3f} over {len(v)} problems", file=out, flush=True)
