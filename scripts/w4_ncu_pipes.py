"""ncu target (device tool): gemm_a16w4 (INT4 g128 asymmetric) through the decode kernel at M = 1, 16
and 64 on Llama-3-70B o (8192 x 8192) and at M = 16 on Llama-3-8B down (4096 x 14336), two calls each
(the second warm), for the pipes' utilization and the warps' stall reasons (tuning/w4_gluon/w4_ncu_*):
ncu -k regex:w4_decode_kernel --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats
  --section InstructionStats --metrics sm__inst_executed.sum,sm__inst_executed_pipe_alu.sum,
  sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_fmaheavy.sum,sm__inst_executed_pipe_lsu.sum,
  sm__inst_executed_pipe_uniform.sum,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,
  sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,
  gpu__time_duration.sum python3 scripts/w4_ncu_pipes.py
ncu -k regex:w4_decode_kernel --launch-skip 2 --launch-count 6 --metrics
  "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum,smsp__warps_active.avg.per_cycle_active"
  python3 scripts/w4_ncu_pipes.py
ncu -k regex:w4_decode_kernel --launch-skip 3 --launch-count 1 --section SourceCounters --section WarpStateStats
  -o m16 python3 scripts/w4_ncu_pipes.py; ncu -i m16.ncu-rep --page source --csv --print-source sass > m16_sass.csv
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
