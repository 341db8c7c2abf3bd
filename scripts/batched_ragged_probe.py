"""Probe (device tool, H100): batched_gemm_a16w16 with M per entry not a multiple of the tiles' rows,
on its routes: the Gluon kernel with TMA stores of the rows inside an entry (RAGGED_BATCHED, the
default), the Gluon kernel with pointer stores only (RAGGED_C_TMA off), its 64-row tiles, and the tl
kernel (RAGGED_BATCHED off); torch.bmm the baseline. One interleaved CUDA-graph timing per problem;
each route's result is checked against bmm first.

    python3 scripts/batched_ragged_probe.py [OUT] [--bmnk B M N K ...]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core import config as config_mod  # noqa: E402
from gemmkit.core import hopper_ws  # noqa: E402
from gemmkit.ops import batched  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402
from probe_util import print_geomeans, timed_row  # noqa: E402

PROBLEMS = [8, 1000, 1536, 2048, 8, 300, 4096, 4096, 8, 777, 2048, 2048, 8, 1000, 4096, 1024,
            8, 512, 4096, 4096, 8, 2048, 1024, 1024, 8, 256, 4096, 8192]
ROUTES = {"gluon": {}, "gluon_ptr": {"RAGGED_C_TMA": False},
          "gluon64": {"ws_tiles": lambda *a: (64, (128, 64))}, "tl": {"RAGGED_BATCHED": False}}
SETS = 3


def plan_with(x, w, patch):
    saved = {k: getattr(hopper_ws, k) for k in patch}
    for k, v in patch.items():
        setattr(hopper_ws, k, v)
    try:
        config_mod.clear_caches()
        gemmkit.batched_gemm_a16w16(x, w)
        return next(reversed(batched._plans.values()))
    finally:
        for k, v in saved.items():
            setattr(hopper_ws, k, v)
        config_mod.clear_caches()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--bmnk", type=int, nargs="+", default=PROBLEMS)
    args = ap.parse_args()
    out = open(args.out, "w") if args.out else sys.stdout
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16; CUDA-graph us per call; "
          "ratio = torch.bmm / route", file=out, flush=True)
    ratios = {}
    b = args.bmnk
    for B, M, N, K in zip(b[::4], b[1::4], b[2::4], b[3::4]):
        sets = [(torch.randn(B, M, K, device="cuda", dtype=torch.bfloat16),
                 (torch.randn(B, N, K, device="cuda") / K**0.5).bfloat16()) for _ in range(SETS)]
        ref = torch.bmm(sets[0][0], sets[0][1].transpose(1, 2)).float()
        calls = {"bmm": [lambda s=s: torch.bmm(s[0], s[1].transpose(1, 2)) for s in sets]}
        kinds = {}
        for name, patch in ROUTES.items():
            plan = plan_with(*sets[0], patch)
            kinds[name] = f"rows {plan.rows}" if hasattr(plan, "rows") else type(plan).__name__
            err = rel_error(plan.run(*sets[0], None, None, None, None, None, None, None), ref)
            if err > 2e-2:
                print(f"  {name}: wrong result (rel err {err:.2e})", file=out, flush=True)
                continue
            calls[name] = [lambda s=s, p=plan: p.run(*s, None, None, None, None, None, None, None) for s in sets]
        _, line = timed_row(calls, ratios)
        print(f"B={B} M={M:5d} N={N:5d} K={K:5d}  " + line + "  | " + ", ".join(f"{k}: {v}" for k, v in kinds.items()),
              file=out, flush=True)
        sets = calls = None
        torch.cuda.empty_cache()
    print_geomeans(ratios, "torch.bmm", out)


if __name__ == "__main__":
    main()
