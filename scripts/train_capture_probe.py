"""Whether a training step through gemmkit.autograd captures into a CUDA graph (and replays to the eager
gradients), against F.linear's step; each variant in its own process (a failed capture can poison the context).

    python3 scripts/train_capture_probe.py [variant mode]

Variants: torch (F.linear forward + autograd.grad), gemmkit (gemm_a16w16 forward + autograd.grad), explicit
(the three gemmkit GEMMs the backward runs, no autograd engine); capture modes: global, thread_local, relaxed.
"""

from __future__ import annotations

import subprocess
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("torch", "gemmkit", "explicit")
MODES = ("global", "thread_local", "relaxed")


def one(variant: str, mode: str) -> str:
    import gemmkit

    M, N, K = 512, 1024, 768
    x = torch.randn(M, K, device="cuda").bfloat16().requires_grad_()
    w = (torch.randn(N, K, device="cuda") / K ** 0.5).bfloat16().requires_grad_()
    dy = torch.randn(M, N, device="cuda").bfloat16()

    def step():
        if variant == "explicit":
            return (gemmkit.gemm_a16w16(dy, w.detach().t()), gemmkit.gemm_a16w16(dy.t(), x.detach().t()))
        y = (F.linear if variant == "torch" else gemmkit.gemm_a16w16)(x, w)
        return torch.autograd.grad(y, (x, w), dy)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            eager = step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, capture_error_mode=mode):
            out = step()
        graph.replay()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        return f"FAILED {type(e).__name__}: {str(e).splitlines()[0]}\n{traceback.format_exc(limit=6)}"
    same = all(torch.equal(a, b) for a, b in zip(out, eager))
    return "ok, replay equals eager" if same else "ok, replay DIFFERS from eager"


def main() -> None:
    if len(sys.argv) == 3:
        print(one(sys.argv[1], sys.argv[2]), flush=True)
        return
    for variant in VARIANTS:
        for mode in MODES:
            r = subprocess.run([sys.executable, __file__, variant, mode], capture_output=True, text=True, timeout=300)
            lines = (r.stdout.strip() or r.stderr.strip()[-2000:]).splitlines()
            print(f"{variant:9s} {mode:13s} " + "\n    ".join(lines[:12]), flush=True)


if __name__ == "__main__":
    main()
