"""`gemmkit demo`: the kernels on the CPU through the Triton interpreter (no GPU needed).

Runs small GEMMs on every kernel path (pointer and TMA loads, persistent schedule, split-K,
epilogue subtiling) in bf16 and fp16 and checks them against a float64 torch reference.
Correctness only: interpreter timings mean nothing.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="gemmkit demo", description=__doc__.split("\n\n")[0]).parse_args(argv)
    if "gemmkit.kernels.gemm" not in __import__("sys").modules:
        os.environ["TRITON_INTERPRET"] = "1"  # must be set before the kernels are defined
    import torch

    from ..core.device import interpreter_active
    from ..ops.a16w16 import gemm_a16w16

    if not interpreter_active():
        raise SystemExit("the demo runs under the Triton interpreter; unset TRITON_INTERPRET=0")
    small = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
    paths = {
        "pointer loads": dict(small),
        "pointer, split-K 3": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, SPLIT_K=3),
        "TMA descriptors": dict(small, TMA=True),
        "TMA, persistent": dict(small, TMA=True, PERSISTENT=True),
        "TMA, persistent, subtiled epilogue": dict(small, TMA=True, PERSISTENT=True, EPILOGUE_SUBTILE=True),
        "derived config": None,
    }
    torch.manual_seed(0)
    warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)  # exp(-x) in sigmoid: harmless
    print(f"{'path':38s} {'dtype':9s} {'M':>4s} {'N':>4s} {'K':>4s} {'activation':10s} rel.err   check")
    failures = 0
    t0 = time.time()
    for i, (name, cfg) in enumerate(paths.items()):
        for dtype in (torch.bfloat16, torch.float16):
            M, N, K = (1, 48, 80) if i % 2 else (37, 70, 100)
            act = ("silu", "gelu_tanh", "relu", None)[i % 4]
            x = torch.randn(M, K).to(dtype)
            w = torch.randn(N, K).to(dtype)
            bias = torch.randn(N)
            out = gemm_a16w16(x, w, bias, activation=act, config=cfg)
            ref = x.double() @ w.double().T + bias.double()
            ref = {"silu": torch.nn.functional.silu, "relu": torch.relu, None: lambda t: t,
                   "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[act](ref)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            ok = err < (1e-2 if dtype == torch.bfloat16 else 2e-3)
            failures += not ok
            print(f"{name:38s} {str(dtype)[6:]:9s} {M:4d} {N:4d} {K:4d} {str(act):10s} {err:.1e}   "
                  f"{'ok' if ok else 'FAIL'}")
    print(f"\n{len(paths) * 2 - failures}/{len(paths) * 2} correct ({time.time() - t0:.1f} s). "
          "On a machine with an NVIDIA GPU, `gemmkit bench` times these kernels against cuBLAS.")
    return 1 if failures else 0
