"""Probe: fused mul/add epilogue configs at M = 4096 on the GPU (table config vs one program per tile,
subtiled epilogue, 128x128 tiles) against the torch sequence; see core/config.py with_epilogue_inputs."""

import dataclasses

import torch
import triton.testing

import gemmkit
from gemmkit.core.config import select_config
from gemmkit.core.device import device_info
from gemmkit.core.formats import dense
torch.manual_seed(0)
dev = device_info(torch.device("cuda"))
M = 4096
for N, K in ((4096, 14336), (4096, 4096), (6144, 4096), (28672, 4096)):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
    a = torch.rand(M, 1, device="cuda") + 0.5
    b = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    base = triton.testing.do_bench_cudagraph(lambda: torch.nn.functional.linear(x, w) * a + b)
    lin = triton.testing.do_bench_cudagraph(lambda: torch.nn.functional.linear(x, w))
    gk = triton.testing.do_bench_cudagraph(lambda: gemmkit.gemm_a16w16(x, w))
    cfg = select_config("a16w16", M, N, K, dev, dense(torch.bfloat16), dense(torch.bfloat16), 2)
    print(f"N={N} K={K}: torch seq {base*1e3:.1f} us, F.linear {lin*1e3:.1f}, gemm_a16w16 {gk*1e3:.1f}; table {cfg}", flush=True)
    for name, c in (("table", cfg), ("nonpersistent", dataclasses.replace(cfg, PERSISTENT=False, STREAM_K=False)),
                    ("subtile", dataclasses.replace(cfg, EPILOGUE_SUBTILE=True, STREAM_K=False)),
                    ("nonpersist-subtile", dataclasses.replace(cfg, PERSISTENT=False, EPILOGUE_SUBTILE=True, STREAM_K=False)),
                    ("128x128", dataclasses.replace(cfg, BLOCK_N=128, num_stages=4, STREAM_K=False)),
                    ("128x128-np", dataclasses.replace(cfg, BLOCK_N=128, num_stages=4, PERSISTENT=False, STREAM_K=False))):
        try:
            out = gemmkit.fused_gemm_a16w16_mul_add(x, w, a, b, config=c)
            ref = (x.float() @ w.float().T) * a + b.float()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            t = triton.testing.do_bench_cudagraph(lambda: gemmkit.fused_gemm_a16w16_mul_add(x, w, a, b, config=c))
            print(f"   {name:20s} {t*1e3:7.1f} us  {base/t:.2f}x  err {err:.1e}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"   {name} failed: {str(e)[:120]}", flush=True)
