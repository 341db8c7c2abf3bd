"""Development probe (device tool): host cost per call at M = 1 of F.linear and gemmkit, and of
the pieces of gemmkit's per-call path. Not part of the package."""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gemmkit  # noqa: E402
from gemmkit.core import dense, launcher  # noqa: E402
from gemmkit.ops import a16w16  # noqa: E402
from gemmkit.tools.timing import time_eager_us, time_graph_us  # noqa: E402

M, N, K = 1, 4096, 4096
sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), torch.randn(N, K, device="cuda", dtype=torch.bfloat16),
         torch.empty(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(5)]
x, w, y = sets[0]
gemmkit.gemm_a16w16(x, w)
key = dense.plan_key((x, w, None, None), (None, None, None))
plan = a16w16._plans[key]
args = (x.data_ptr(), w.data_ptr(), y.data_ptr(), None, None, None, *plan.gemm_tail)
rows = {
    "F.linear": [lambda s=s: F.linear(s[0], s[1]) for s in sets],
    "gemmkit": [lambda s=s: gemmkit.gemm_a16w16(s[0], s[1]) for s in sets],
    "gemmkit, y given": [lambda s=s: gemmkit.gemm_a16w16(s[0], s[1], y=s[2]) for s in sets],
    "piece: plan_key": [lambda s=s: dense.plan_key((s[0], s[1], None, None), (None, None, None)) for s in sets],
    "piece: torch.empty": [lambda: torch.empty((M, N), dtype=torch.bfloat16, device="cuda")],
    "piece: launch_compiled": [lambda: launcher.launch_compiled(plan.gemm_kernel, plan.grid, args, 0)],
    "piece: hooks check": [launcher.profiling_hooks_active],
}
print(f"host cost per call, M={M} N={N} K={K} (eager µs; graph µs where it is a kernel)")
for name, calls in rows.items():
    eager = time_eager_us(calls)
    graph = time_graph_us(calls) if not name.startswith("piece: ") or "launch" in name else None
    print(f"  {name:26s} eager {eager:7.2f}" + (f"   graph {graph:6.2f}" if graph else ""), flush=True)
