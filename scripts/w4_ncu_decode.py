"""ncu target (device tool): gemm_a16w4 at decode sizes with the ops' own pick (INT4 g128 asymmetric,
as `gemmkit bench a16w4` builds it), two calls per problem (ncu profiles both; the second is warm).
Run:
ncu -k regex:gemm_kernel --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,
dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,
launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,
smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,
smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,
smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,
smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,
smsp__inst_executed.sum python3 scripts/w4_ncu_decode.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gemmkit.ops import a16w4  # noqa: E402
from gemmkit.tools import registry  # noqa: E402

for M, N, K in ((1, 8192, 8192), (1, 57344, 8192), (16, 4096, 14336)):
    inp = registry._a16w4_inputs(M, N, K, "bf16", "cuda")
    for _ in range(2):
        a16w4.gemm_a16w4(inp["x"], inp["wq"], inp["ws"], inp["wz"], group_size=128)
    torch.cuda.synchronize()
    del inp
