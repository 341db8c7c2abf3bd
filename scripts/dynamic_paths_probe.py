"""Probe (device tool): gemm_a8w8's dynamic form (bf16 x, eager: quantized per row inside the GEMM, each
split-K piece over its own K range) against the static form on x quantized by quant.quantize_fp8 first (what a
captured call runs), and both against the quantized-x and the bf16-x references: max |difference| / max |ref|.

    PYTHONPATH=. python3 scripts/dynamic_paths_probe.py
"""

import torch

import gemmkit
from gemmkit import quant

torch.manual_seed(0)
for M,N,K in [(3,3000,7936),(3,3000,4096),(16,4096,7168),(64,3000,7936)]:
    x16=torch.randn(M,K,device="cuda"); w16=torch.randn(N,K,device="cuda")/K**0.5
    wq,ws=quant.quantize_fp8(w16)
    xb=x16.bfloat16()
    q,s=quant.quantize_fp8(xb)
    deq_w=quant.dequantize(wq,ws)
    ref_q=quant.dequantize(q,s) @ deq_w.T
    ref_x=xb.float() @ deq_w.T
    for fast in (True, False):
        dyn=gemmkit.gemm_a8w8(xb, wq, None, ws.reshape(1,-1), fast_accum=fast, out_dtype=torch.float32)
        st=gemmkit.gemm_a8w8(q, wq, s, ws.reshape(1,-1), fast_accum=fast, out_dtype=torch.float32)
        e=lambda a,b: float((a-b).abs().max()/b.abs().max())
        print(f"M={M} N={N} K={K} fast={fast}: dynamic vs quantized-x ref {e(dyn,ref_q):.2e}, vs bf16-x ref {e(dyn,ref_x):.2e}; static vs quantized-x ref {e(st,ref_q):.2e}, vs bf16-x ref {e(st,ref_x):.2e}; dynamic vs static {e(dyn,st):.2e}")
