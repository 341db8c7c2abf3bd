"""Probe (device tool, H100): the gated product act(x @ gate^T) * (x @ up^T) of the fused
feed-forward, the Gluon kernel's gated tiles (core/hopper_ws.ws_gated_plan; widths 64 and 128
forced, and its own pick) against the tl kernel's gated GEMM (GEMMKIT_GLUON=0), the two-GEMM form
(ops/fused._gated_two_gemms: up GEMM, then the gate GEMM with act * up in its epilogue) and
torch's sequence (F.linear to 2I, chunk, silu(g) * u), in one CUDA-graph timing per problem;
inputs rotated over 3 sets. Prints times, ratios to torch and each result's error.

    python3 scripts/gated_ws_probe.py [--m M ...] [--shapes I H ...] [--fp8]
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gemmkit.core import config as config_mod  # noqa: E402
from gemmkit.core import hopper_ws  # noqa: E402
from gemmkit.ops import fused  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402
from probe_util import gated_sets  # noqa: E402

# (I, H): Llama-3-8B, Llama-3-70B, Qwen2.5-7B; held out: Qwen2.5-14B, Qwen2.5-32B, Gemma-2-9B,
# Llama-3.2-3B, Llama-3-70B / 4 and / 8 (tensor parallel), Mixtral-8x22B expert size
SHAPES = [(14336, 4096), (28672, 8192), (18944, 3584), (13824, 5120), (27648, 5120), (14336, 3584), (8192, 3072),
          (7168, 8192), (3584, 8192), (16384, 6144)]
SETS = 3


def built_plan(call, gluon: bool, width=None):
    """The gated plan a call builds (gluon off: GEMMKIT_GLUON=0; width: the gated tiles' forced)."""
    real = hopper_ws.ws_gated_width
    if not gluon:
        os.environ[hopper_ws.GLUON_ENV] = "0"
    if width is not None:
        hopper_ws.ws_gated_width = lambda *a: width
    config_mod.clear_caches()
    try:
        call()
        return next(reversed(fused._plans.values()))
    finally:
        os.environ.pop(hopper_ws.GLUON_ENV, None)
        hopper_ws.ws_gated_width = real
        config_mod.clear_caches()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    ap.add_argument("--shapes", type=int, nargs="+", help="I H pairs instead of the built-in list")
    args = ap.parse_args()
    shapes = list(zip(args.shapes[::2], args.shapes[1::2])) if args.shapes else SHAPES
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    ratios = {}
    for I, H in shapes:
        for M in args.m:
            sets = gated_sets(M, I, H, SETS)
            x, w, g, u = sets[0]
            gf, uf = x.float() @ g.float().T, x.float() @ u.float().T
            ref = F.silu(gf) * uf
            del gf, uf

            def gated(i, plan):
                return plan.run(sets[i][0], sets[i][2], sets[i][3], None, None)

            plans = {"tl": built_plan(lambda: fused.gated_gemm(x, g, u), False)}
            own = built_plan(lambda: fused.gated_gemm(x, g, u), True)
            if own.is_ws:
                plans["ws"] = own
                for width in hopper_ws.GATED_WIDTHS:
                    plans[f"ws{width}"] = built_plan(lambda: fused.gated_gemm(x, g, u), True, width)
            calls = {name: [lambda i=i, p=p: gated(i, p) for i in range(SETS)] for name, p in plans.items()}
            calls["two"] = [lambda i=i: fused._gated_two_gemms(sets[i][0], sets[i][2], sets[i][3], "silu")
                            for i in range(SETS)]

            def torch_seq(i):
                gu = F.linear(sets[i][0], sets[i][1])
                a, b = gu.chunk(2, dim=-1)
                return F.silu(a) * b

            calls["torch"] = [lambda i=i: torch_seq(i) for i in range(SETS)]
            errs = {k: rel_error(c[0](), ref) for k, c in calls.items()}
            names = list(calls)
            times = dict(zip(names, time_graphs_us(*[calls[k] for k in names], rep_ms=6, retries=5)))
            base = times["torch"]
            for k in names:
                ratios.setdefault(k, []).append(base / times[k])
            widths = f" (ws picks {own.plan.ws.parts[0]})" if own.is_ws else ""
            print(f"M={M:5d} I={I:5d} H={H:5d}  " + "  ".join(f"{k} {times[k]:7.1f}" for k in names)
                  + "  | ratio " + " ".join(f"{k} {base / times[k]:4.2f}" for k in names if k != "torch")
                  + f"  max err {max(errs.values()):.1e}{widths}", flush=True)
            sets = ref = plans = calls = None
            torch.cuda.empty_cache()
    for k, v in ratios.items():
        print(f"geomean ratio to torch, {k}: {math.exp(sum(map(math.log, v)) / len(v)):.3f} over {len(v)}")


if __name__ == "__main__":
    main()
