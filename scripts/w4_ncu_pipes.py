"""ncu target (device tool): gemm_a16w4 (INT4 g128 asymmetric) through the decode kernel at M = 1, 16
and 64 on Llama-3-70B o (8192 x 8192) and at M = 16 on Llama-3-8B down (4096 x 14336), two calls each
(the second warm), for the pipes' utilization and the warps' stall reasons:
ncu -k regex:w4_decode_kernel --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats
--section InstructionStats python3 scripts/w4_ncu_pipes.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gemmkit.ops import a16w4  # noqa: E402
from gemmkit.quant import quantize_int4  # noqa: E402

for M, N, K in ((1, 8192, 8192), (16, 8192, 8192), (64, 8192, 8192), (16, 4096, 14336)):
    x = torch.randn(M, K, device="cuda").bfloat16()
    wq, ws, wz = quantize_int4((torch.randn(N, K, device="cuda") / K**0.5).bfloat16(), 128)
    for _ in range(2):
        a16w4.gemm_a16w4(x, wq, ws, wz, group_size=128)
    torch.cuda.synchronize()
