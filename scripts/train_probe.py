"""The three GEMMs of a linear layer's training step, gemmkit against torch, one CUDA-graph timing each (same run).

    python3 scripts/train_probe.py OUT [--m 4096 16384] [--shapes N K ...] [--k-major] [--config JSON ...]

Per problem (M tokens, an (N, K) weight): forward y = x w^T (gemm_a16w16(x, w) / F.linear), dx = dy w
(gemm_a16w16(dy, w.T): the weight read N-major / dy @ w), dw = dy^T x (gemm_a16w16(dy.T, x.T): both operands
M-major / dy.T @ x), and the whole step through autograd (gemm_a16w16 / F.linear forward + backward), with the
relative error of each gemmkit result against a float32 reference. Writes OUT/train_probe.txt. (The step is timed
eagerly, back-to-back calls: scripts/train_capture_probe.py checks the graph capture of autograd.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemmkit  # noqa: E402
from gemmkit.tools.timing import time_eager_pair_us, time_graphs_us  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402

# (N, K) of Llama-3-8B / 70B layers (qkv, o, gate_up, down)
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192), (57344, 8192),
          (8192, 28672)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--m", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--shapes", type=int, nargs="+", default=None, help="N K pairs")
    p.add_argument("--rep-ms", type=float, default=20)
    p.add_argument("--k-major", action="store_true",
                   help="also dx and dw on K-contiguous copies of their operands (the copies made before timing, "
                        "and timed alone as 'copy'): what the GEMMs would run at if the kernels took them K-major")
    p.add_argument("--config", action="append", default=[],
                   help="a config (JSON dict, e.g. '{\"BLOCK_M\": 128, \"BLOCK_N\": 256, ...}') for dx and dw also "
                        "timed with (the tl kernel: explicit configs bypass the warp-specialized one); repeatable")
    args = p.parse_args()
    configs = [json.loads(c) for c in args.config]
    shapes = SHAPES if args.shapes is None else list(zip(args.shapes[0::2], args.shapes[1::2]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"{torch.cuda.get_device_name()} torch {torch.__version__}"]
    lines += [f"c{i}: {c}" for i, c in enumerate(configs)]
    gemm = gemmkit.gemm_a16w16
    for M in args.m:
        for N, K in shapes:
            x = torch.randn(M, K, device="cuda").bfloat16()
            w = (torch.randn(N, K, device="cuda") / K ** 0.5).bfloat16()
            dy = torch.randn(M, N, device="cuda").bfloat16()
            xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
            pairs = {
                "fwd": (lambda: gemm(x, w), lambda: F.linear(x, w), lambda: x.float() @ w.float().T),
                "dx": (lambda: gemm(dy, w.t()), lambda: dy @ w, lambda: dy.float() @ w.float()),
                "dw": (lambda: gemm(dy.t(), x.t()), lambda: dy.t() @ x, lambda: dy.float().T @ x.float()),
                "step": (lambda: torch.autograd.grad(gemm(xg, wg), (xg, wg), dy),
                         lambda: torch.autograd.grad(F.linear(xg, wg), (xg, wg), dy),
                         lambda: (dy.float() @ w.float(), dy.float().T @ x.float())),
            }
            if args.k_major:
                wt, dyt, xt = w.t().contiguous(), dy.t().contiguous(), x.t().contiguous()
                pairs["dx_kmajor"] = (lambda: gemm(dy, wt), lambda: dy @ w, lambda: dy.float() @ w.float())
                pairs["dw_kmajor"] = (lambda: gemm(dyt, xt), lambda: dy.t() @ x, lambda: dy.float().T @ x.float())
                pairs["copy"] = (lambda: (w.t().contiguous(), dy.t().contiguous(), x.t().contiguous()),
                                 lambda: dy @ w, lambda: (w.float().t(), dy.float().t(), x.float().t()))
            for i, c in enumerate(configs):
                pairs[f"dx[c{i}]"] = (lambda c=c: gemm(dy, w.t(), config=c), lambda: dy @ w,
                                      lambda: dy.float() @ w.float())
                pairs[f"dw[c{i}]"] = (lambda c=c: gemm(dy.t(), x.t(), config=c), lambda: dy.t() @ x,
                                      lambda: dy.float().T @ x.float())
            row = [f"M={M:6d} N={N:6d} K={K:6d}"]
            for name, (ours, base, ref) in pairs.items():
                err = rel_error(ours(), ref())
                if name == "step":
                    t_ours, t_base = time_eager_pair_us([ours], [base])
                else:
                    t_ours, t_base = time_graphs_us([ours], [base], rep_ms=args.rep_ms)
                flops = 2.0 * M * N * K * (3 if name == "step" else 0 if name == "copy" else 1)
                row.append(f"{name} {t_ours:8.1f} us vs {t_base:8.1f} ({t_base / t_ours:4.2f}x, "
                           f"{flops / t_ours / 1e6:5.0f} TFLOP/s, err {err:.1e})")
            pairs = None
            lines.append("  ".join(row))
            print(lines[-1], flush=True)
            torch.cuda.empty_cache()
    (out / "train_probe.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
