"""ncu comparison of the shared kernel (gemm_a16w4) and scripts/w4_probe.py's standalone kernel with the same
K loop, 8192x8192 INT4 g128 symmetric, M = 16, split-K 1 and 4. Run:
ncu -k regex:"gemm_kernel|w4_probe" --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio python3 scripts/w4_ncu_compare.py
"""
import sys

import torch

sys.path.insert(0, "scripts")
import gemmkit
from gemmkit import quant
import w4_probe as wp
torch.manual_seed(0)
N, K = 8192, 8192
w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
x = torch.randn(16, K, device="cuda", dtype=torch.bfloat16)
q, s, z = quant.quantize_int4(w, 128, True)
for sk in (1, 4):
    cfg = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=sk, num_warps=4, num_stages=3)
    yb = torch.zeros(16, N, device="cuda", dtype=torch.float32 if sk > 1 else torch.bfloat16)
    for _ in range(2):
        gemmkit.gemm_a16w4(x, q, s, z, group_size=128, config=cfg)
        wp.w4_probe_kernel[(N // 128, 1, sk)](x, q, s, None, yb, 16, N, K, K, K // 2, K // 128, N, BM=16, BN=128, BK=128, GROUP=128, SPLIT_K=sk, SWAP=False, DEQ=3, SPLIT="eo", HAS_ZERO=False, XLOAD="pairs", num_warps=4, num_stages=3)
torch.cuda.synchronize()
