"""Probe (device tool): the 128-register cap of split-K 4-bit decode launches (core/dense.py
PACKED_SPLIT_MAXNREG) on and off, same run, interleaved CUDA-graph replays, against F.linear bf16.
Shapes whose derived decode config takes split-K 8 or more (N = 4096 with 128-row tiles) and one
that takes fewer (as a control). Usage: python3 scripts/w4_cap_probe.py [OUT_FILE]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit import quant  # noqa: E402
from gemmkit.core import dense  # noqa: E402
from gemmkit.core.config import clear_caches  # noqa: E402
from gemmkit.ops import a16w4  # noqa: E402
from gemmkit.tools.timing import rotation_count, time_graphs_us  # noqa: E402

out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
torch.manual_seed(0)
for N, K in [(4096, 4096), (4096, 14336), (8192, 8192)]:
    for M in (1, 16):
        n_sets = rotation_count(N * K // 2, 50 << 20)
        sets = []
        for _ in range(n_sets):
            w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
            wq, ws, wz = quant.quantize_int4(w, 128)
            sets.append((torch.randn(M, K, device="cuda", dtype=torch.bfloat16), w, wq, ws, wz))
        results = {}
        for cap_on in (True, False):
            dense.PACKED_SPLIT_MAXNREG_MIN_SPLIT = 8 if cap_on else 10**9
            clear_caches()
            gemmkit.gemm_a16w4(*[sets[0][i] for i in (0, 2, 3, 4)])
            plan = list(a16w4._plans.values())[-1]  # this toggle's plan, called directly (the cache key is the same)
            calls = [lambda s=s, p=plan: p.run(s[0], s[2], None, None, None, s[3], None, None, None, None, None, s[4])
                     for s in sets]
            results[cap_on] = (calls, plan.cfg.SPLIT_K, plan.maxnreg)
        base = [lambda s=s: F.linear(s[0], s[1]) for s in sets]
        t_on, t_off, t_base = time_graphs_us(results[True][0], results[False][0], base, rep_ms=10, retries=9)
        print(f"N={N} K={K} M={M}: split-K {results[True][1]}, cap {results[True][2]}: {t_on:.1f} us "
              f"({t_base / t_on:.2f}x F.linear); no cap: {t_off:.1f} us ({t_base / t_off:.2f}x); "
              f"F.linear {t_base:.1f} us", file=out, flush=True)
        del sets
        torch.cuda.empty_cache()
