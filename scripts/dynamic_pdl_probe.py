"""Probe (device tool): where the dynamic block-scaled FP8 GEMM's time goes beside the static one, and
what launching the GEMM as the quantizer's programmatic dependent (PDL: core/hopper_ws.py QUANT_PDL)
saves. For each DeepSeek-V3 layer and M, one interleaved CUDA-graph timing of: the static GEMM on x
quantized beforehand (column-major scales), the quantizer alone, the dynamic call with PDL and without
(GEMMKIT_PDL=0 while its plan is built). Results are checked against each other first (bit for bit).

Usage: python3 scripts/dynamic_pdl_probe.py [OUT_FILE] [--m 256 1024 4096]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core import hopper_ws  # noqa: E402
from gemmkit.ops import a8w8_blockscale as bs  # noqa: E402
from gemmkit.quant import quantize_fp8_blockwise  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402

LAYERS = {"q_a_kv_a": (2112, 7168), "q_b": (24576, 1536), "kv_b": (32768, 512), "o": (7168, 16384),
          "dense_gate_up": (36864, 7168), "dense_down": (7168, 18432), "expert_gate_up": (4096, 7168),
          "expert_down": (7168, 2048)}
ROTATE = 3


def dynamic_plan(x, wq, ws, pdl: bool):
    """The dynamic call's plan, built with PDL on or off."""
    os.environ[hopper_ws.PDL_ENV] = "1" if pdl else "0"
    bs._plans.clear()
    gemmkit.gemm_a8w8_blockscale(x, wq, None, ws)
    plan = next(reversed(bs._plans.values()))
    os.environ.pop(hopper_ws.PDL_ENV)
    bs._plans.clear()
    return plan


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--m", type=int, nargs="+", default=[256, 1024, 4096])
    args = p.parse_args()
    out = open(args.out, "w") if args.out else sys.stdout
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; CUDA-graph replay (us per call), "
          f"{ROTATE} operand sets; ratio = static / dynamic", file=out, flush=True)
    for name, (N, K) in LAYERS.items():
        for M in args.m:
            torch.manual_seed(0)
            xs = [torch.randn(M, K, device="cuda").bfloat16() for _ in range(ROTATE)]
            ws_ = [quantize_fp8_blockwise(torch.randn(N, K, device="cuda") / K**0.5, (128, 128)) for _ in range(ROTATE)]
            qx = [quantize_fp8_blockwise(x, (1, 128), scale_layout="col") for x in xs]
            with_pdl, without = dynamic_plan(xs[0], *ws_[0], True), dynamic_plan(xs[0], *ws_[0], False)
            static = [gemmkit.gemm_a8w8_blockscale(q, w, s, sw) for (q, s), (w, sw) in zip(qx, ws_)]
            for plan in (with_pdl, without):
                for i in range(ROTATE):
                    got = plan.run(xs[i], ws_[i][0], None, None, None, ws_[i][1])
                    assert torch.equal(got, static[i]), (name, M, "differs from the static GEMM")
            calls = {
                "static": [lambda i=i: gemmkit.gemm_a8w8_blockscale(qx[i][0], ws_[i][0], qx[i][1], ws_[i][1])
                           for i in range(ROTATE)],
                "quantizer": [lambda i=i: quantize_fp8_blockwise(xs[i], (1, 128), scale_layout="col")
                              for i in range(ROTATE)],
                "dynamic+pdl": [lambda i=i: with_pdl.run(xs[i], ws_[i][0], None, None, None, ws_[i][1])
                                for i in range(ROTATE)],
                "dynamic": [lambda i=i: without.run(xs[i], ws_[i][0], None, None, None, ws_[i][1])
                            for i in range(ROTATE)],
            }
            t = dict(zip(calls, time_graphs_us(*calls.values(), rep_ms=10)))
            print(f"{name} M={M} N={N} K={K}: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items())
                  + f"; ratio pdl {t['static'] / t['dynamic+pdl']:.3f}, without {t['static'] / t['dynamic']:.3f}"
                  f" (pdl gemm: {getattr(with_pdl.gemm, 'pdl', None)})", file=out, flush=True)


if __name__ == "__main__":
    main()
