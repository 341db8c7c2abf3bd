"""Probe (device tool): why stream-K runs slower than data-parallel tiles (scripts/medium_m_probe.py).
Times gemm_a16w16 with persistent data-parallel and stream-K configs at two held-out problems and
prints every compiled gemm_kernel binary's registers and spills (Triton's own figures).

Usage: python3 scripts/streamk_probe.py [--ncu]   (--ncu: one call of each config, for an ncu run:
ncu -k regex:gemm_kernel --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,
lts__t_bytes.sum,smsp__inst_executed.sum,launch__registers_per_thread,launch__grid_size,
l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum,
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active python3 scripts/streamk_probe.py --ncu)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core.dense import _jit_kernel  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402

NCU = "--ncu" in sys.argv
SHAPES = [(512, 5120, 14336), (2048, 5120, 4096)]
BASE = dict(BLOCK_K=64, num_warps=8, TMA=True, PERSISTENT=True, EPILOGUE_SUBTILE=True)
CONFIGS = {
    "128x128 s4 dp": dict(BASE, BLOCK_M=128, BLOCK_N=128, num_stages=4),
    "128x128 s4 stream-K": dict(BASE, BLOCK_M=128, BLOCK_N=128, num_stages=4, STREAM_K=True),
    "128x256 s3 dp": dict(BASE, BLOCK_M=128, BLOCK_N=256, num_stages=3),
    "128x256 s3 stream-K": dict(BASE, BLOCK_M=128, BLOCK_N=256, num_stages=3, STREAM_K=True),
}

for M, N, K in SHAPES:
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    if NCU:
        for cfg in CONFIGS.values():
            gemmkit.gemm_a16w16(x, w, config=cfg)
        torch.cuda.synchronize()
        continue
    calls = {"F.linear": lambda: F.linear(x, w)}
    calls.update({n: (lambda c=c: gemmkit.gemm_a16w16(x, w, config=c)) for n, c in CONFIGS.items()})
    names = list(calls)
    times = time_graphs_us(*[[calls[n]] for n in names], rep_ms=10, retries=3)
    print(f"M={M} N={N} K={K}: " + ", ".join(f"{n} {t:.1f} us" for n, t in zip(names, times)), flush=True)

if not NCU:
    # binaries in compile order: the configs' order above (the second shape reuses them)
    for cache in _jit_kernel().device_caches.values():
        for binary in cache[0].values():
            binary._init_handles()
            print(f"binary regs={binary.n_regs} spills={binary.n_spills} shared={binary.metadata.shared} "
                  f"warps={binary.metadata.num_warps} stages={binary.metadata.num_stages}")
