"""Host cost of a training step through gemmkit.autograd: per-call eager time of the step and of each of its GEMM
calls at a size where the host dominates, against torch's, and a cProfile of the gemmkit step.

    python3 scripts/train_host_probe.py OUT [--m 64] [--n 4096] [--k 4096] [--int4]

--int4: a frozen INT4 weight (group 128) instead, x's gradient only (gemm_a16w4 through gemmkit.autograd: the
forward, the dequantizing pass, dx's GEMM), against F.linear on the bf16 weight. Writes OUT/train_host_probe.txt
(OUT/train_host_probe_int4.txt).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemmkit  # noqa: E402
from gemmkit.tools.timing import time_eager_us  # noqa: E402
from probe_util import profile_text  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--int4", action="store_true")
    args = p.parse_args()
    M, N, K = args.m, args.n, args.k
    x = torch.randn(M, K, device="cuda").bfloat16()
    w = (torch.randn(N, K, device="cuda") / K ** 0.5).bfloat16()
    dy = torch.randn(M, N, device="cuda").bfloat16()
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    gemm = gemmkit.gemm_a16w16
    if args.int4:
        from gemmkit.ops.packed_prefill import dequantize_packed

        wq, ws, wz = gemmkit.quant.quantize_int4(w, 128)
        w16 = gemmkit.quant.dequantize_int4(wq, ws, wz, 128, torch.bfloat16)
        deq = dequantize_packed(wq, ws, wz, 128, True, torch.bfloat16)

        def a16w4(x):
            return gemmkit.gemm_a16w4(x, wq, ws, wz, group_size=128)

        calls = {
            "step gemmkit": lambda: torch.autograd.grad(a16w4(xg), (xg,), dy),
            "step torch": lambda: torch.autograd.grad(F.linear(xg, w16), (xg,), dy),
            "forward gemmkit (grad)": lambda: a16w4(xg),
            "fwd gemmkit": lambda: a16w4(x),
            "dequantize": lambda: dequantize_packed(wq, ws, wz, 128, True, torch.bfloat16),
            "dx gemmkit": lambda: gemm(dy, deq.t()),
            "fwd torch": lambda: F.linear(x, w16),
            "dx torch": lambda: dy @ w16,
        }
    else:
        calls = {
            "step gemmkit": lambda: torch.autograd.grad(gemm(xg, wg), (xg, wg), dy),
            "step torch": lambda: torch.autograd.grad(F.linear(xg, wg), (xg, wg), dy),
            "forward gemmkit (grad)": lambda: gemm(xg, wg),
            "forward torch (grad)": lambda: F.linear(xg, wg),
            "fwd gemmkit": lambda: gemm(x, w),
            "dx gemmkit": lambda: gemm(dy, w.t()),
            "dw gemmkit": lambda: gemm(dy.t(), x.t()),
            "fwd torch": lambda: F.linear(x, w),
            "dx torch": lambda: dy @ w,
            "dw torch": lambda: dy.t() @ x,
        }
    lines = [f"{torch.cuda.get_device_name()} torch {torch.__version__}, M={M} N={N} K={K}: eager us per call"]
    for name, call in calls.items():
        lines.append(f"{name:24s} {time_eager_us([call]):8.1f}")
        print(lines[-1], flush=True)
    lines.append(profile_text(calls["step gemmkit"], 200))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"train_host_probe{'_int4' if args.int4 else ''}.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
