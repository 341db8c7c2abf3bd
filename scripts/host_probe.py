"""Development probe (device tool): where the host time of one small-M eager call goes.

Times (host µs per call, wall clock while the launch queue does not fill) each step of
gemm_a8w8's dynamic path and gemm_a16w16 at M = 1 against F.linear, then profiles 2000 calls.
Not part of the package; `gemmkit bench` produces the reported figures."""

import os
import sys
import time

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gemmkit  # noqa: E402
from gemmkit import quant  # noqa: E402
from gemmkit.core import dense, plan as plan_mod  # noqa: E402
from gemmkit.ops import a8w8  # noqa: E402


def host_us(fn, n=200, reps=7):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best.append((t1 - t0) / n * 1e6)
    best.sort()
    return best[len(best) // 2]


@triton.jit
def empty_kernel(x, n):
    pass


N, K = 6144, 4096
w16 = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
wq, ws = quant.quantize_fp8(w16.float(), "row")
ws = ws.reshape(1, N)
x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
xq, xs = quant.quantize_fp8(x, "row")
gemmkit.gemm_a8w8(x, wq, None, ws)
key = plan_mod.plan_key((x, wq, None, ws, None, None), (None, torch.bfloat16, None, True))
plan = a8w8._plans[key]
fused = plan.fused
empty_kernel[(1,)](x, 7)
ck = empty_kernel[(1,)](x, 7)
out = torch.empty(1, N, device="cuda", dtype=torch.bfloat16)
# the per-call arguments by name (gemm_kernel's signature starts with dense.PER_CALL), then the plan's tail
per_call = dict(a=x.data_ptr(), b=wq.data_ptr(), c=out.data_ptr(), b_scale=ws.data_ptr())
args_fused = (*[per_call.get(name) for name in dense.PER_CALL], *fused.tail)
launch_direct = gemmkit.core.launcher.launch_direct
direct = fused.launch.direct
print("fast path bound:", fused.run != fused._call)

rows = {
    "python loop overhead (lambda: None)": lambda: None,
    "torch.empty((1, N))": lambda: torch.empty((1, N), dtype=torch.bfloat16, device="cuda"),
    "torch.empty((1, N)) device obj": lambda: torch.empty((1, N), dtype=torch.bfloat16, device=x.device),
    "x.new_empty((1, N))": lambda: x.new_empty((1, N)),
    "torch.empty_strided": lambda: torch.empty_strided((1, N), (N, 1), dtype=torch.bfloat16, device=x.device),
    "torch._C._cuda_getCurrentRawStream": lambda: torch._C._cuda_getCurrentRawStream(0),
    "torch._C._cuda_getDevice": lambda: torch._C._cuda_getDevice(),
    "plan.capturing()": plan_mod.capturing,
    "plan_key": lambda: plan_mod.plan_key((x, wq, None, ws, None, None), (None, torch.bfloat16, None, True)),
    "x.data_ptr() x3": lambda: (x.data_ptr(), wq.data_ptr(), out.data_ptr()),
    "empty_kernel[(1,)](x, 7)": lambda: empty_kernel[(1,)](x, 7),
    "empty kernel, C launcher": lambda: ck.run.launch(1, 1, 1, torch._C._cuda_getCurrentRawStream(0), ck.function,
                                                      False, False, None, None, ck.packed_metadata, None, None, None,
                                                      x.data_ptr(), 7),
    "fused gemm, C launcher only": lambda: launch_direct(direct, fused.launch.grid, args_fused, 0),
    "fused plan (DensePlan.run)": lambda: fused.run(x, wq, None, None, None, ws),
    "torch._C._cuda_isCurrentStreamCapturing": lambda: torch._C._cuda_isCurrentStreamCapturing(),
    "gemm_a8w8 dynamic (whole call)": lambda: gemmkit.gemm_a8w8(x, wq, None, ws),
    "gemm_a8w8 static fp8": lambda: gemmkit.gemm_a8w8(xq, wq, xs, ws),
    "gemm_a16w16": lambda: gemmkit.gemm_a16w16(x, w16),
    "F.linear bf16": lambda: F.linear(x, w16),
    "torch._scaled_mm": lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16),
    "x.abs() (one aten kernel)": lambda: x.abs(),
}
print(f"host µs per call, M=1, N={N}, K={K}, median of 7 x 200 calls")
for name, fn in rows.items():
    print(f"{name:40s} {host_us(fn):7.2f}", flush=True)

import cProfile  # noqa: E402
import pstats  # noqa: E402

for name in ("gemm_a8w8 dynamic (whole call)", "F.linear bf16"):
    fn = rows[name]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    print(f"--- {name}: 2000 calls")
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)
