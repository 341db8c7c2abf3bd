"""Probe: the one-launch gated GEMM (act(x @ gate^T) * (x @ up^T), two accumulators) at medium M on
the GPU, over tile configs, against the two-GEMM path and torch's F.linear to 2I + silu * mul."""

import itertools
import sys

import torch
import triton.testing

from gemmkit.ops import fused
from probe_sweep import sweep

torch.manual_seed(0)
out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
for (I, H), M in itertools.product([(14336, 4096), (18944, 3584), (28672, 8192)], (256, 64)):
    x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
    wgu = torch.randn(2 * I, H, device="cuda", dtype=torch.bfloat16) * H ** -0.5
    gate, up = fused.gate_up_views(wgu, None, "concat")

    def torch_seq():
        g, u = torch.nn.functional.linear(x, wgu).chunk(2, dim=-1)
        return torch.nn.functional.silu(g) * u

    ref = torch_seq().float()
    t_torch = triton.testing.do_bench_cudagraph(torch_seq)
    t_two = triton.testing.do_bench_cudagraph(lambda: fused._gated_two_gemms(x, gate, up, "silu"))
    t_auto = triton.testing.do_bench_cudagraph(lambda: fused.gated_gemm(x, gate, up))
    print(f"I={I} H={H} M={M}: torch {t_torch * 1e3:.1f} us, two GEMMs {t_two * 1e3:.1f}, gated auto "
          f"{t_auto * 1e3:.1f}", file=out, flush=True)
    configs = [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages, TMA=tma)
               for bm, bn, bk, warps, stages, tma in itertools.product((64, 128), (64, 128), (64, 128), (4, 8), (3, 4),
                                                                        (True, False))
               if not (bm * bn * 2 > 128 * 256 or (warps == 8 and bm * bn < 128 * 64))]
    sweep(lambda cfg: fused.gated_gemm(x, gate, up, config=cfg), ref, configs, t_torch, out, 3, "torch")
