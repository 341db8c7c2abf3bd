"""ncu target (device tool): gemm_a16w4 (INT4 g128 asymmetric) through the prefill kernel
(kernels/gemm_w4_prefill.py) at M = 4096 on Llama-3-70B o (8192 x 8192), two calls (the second warm),
for the warps' stall reasons per SASS instruction (tuning/w4_gluon/w4_prefill_ncu_*):
ncu -k regex:w4_prefill_kernel --launch-skip 1 --launch-count 1 --section SourceCounters --section WarpStateStats
  --section SchedulerStats --section ComputeWorkloadAnalysis -o p python3 scripts/w4_prefill_ncu.py [M]
ncu -i p.ncu-rep --page source --csv --print-source sass > p_sass.csv
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gemmkit.ops import a16w4  # noqa: E402
from gemmkit.quant import quantize_int4  # noqa: E402

M = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
N = K = 8192
x = torch.randn(M, K, device="cuda").bfloat16()
wq, ws, wz = quantize_int4((torch.randn(N, K, device="cuda") / K**0.5).bfloat16(), 128)
for _ in range(2):
    a16w4.gemm_a16w4(x, wq, ws, wz, group_size=128)
torch.cuda.synchronize()
