"""Probe (device tool, H100): batched_gemm_a16w16 with M per entry not a multiple of the tiles' rows,
on its routes: the Gluon kernel with TMA stores of the rows inside an entry (RAGGED_BATCHED, the
default), the Gluon kernel with pointer stores only (RAGGED_C_TMA off), its 64-row tiles, and the tl
kernel (RAGGED_BATCHED off); torch.bmm the baseline. One interleaved CUDA-graph timing per problem;
each route's result is checked against bmm first. --swap: the 128-row tiles (operands as given) against
the swapped operands (x's rows as the tiles' columns, kernels/gemm_ws.py C_T) at ws_batched_swap's
width for any gain ("swap") and at every width of WIDTHS, with the wave costs the rule compares.

--shared: one weight (N, K) for every entry (batch stride 0): the one GEMM over the B * M rows (ops/batched.py
SHARED_WEIGHT_AS_ONE, the default) against the batched kernel, F.linear on the 3-D x the baseline.

    python3 scripts/batched_ragged_probe.py [OUT] [--bmnk B M N K ...] [--swap | --shared]
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
ROUTES = {"gluon": {"SWAP_BATCHED": False}, "gluon_ptr": {"RAGGED_C_TMA": False, "SWAP_BATCHED": False},
          "gluon64": {"ws_tiles": lambda *a: (64, (128, 64)), "SWAP_BATCHED": False},
          "tl": {"RAGGED_BATCHED": False}}
SWAP_ROUTES = {"gluon": {"SWAP_BATCHED": False}, "swap": {"SWAP_GAIN": 1e9},
               **{f"s{n0}+{n1}": {"ws_batched_swap": lambda *a, p=(n0, n1): p} for n0, n1 in hopper_ws.WIDTHS}}


def wave_costs(B, M, N):
    """(the 128-row tiles' wave cost, the swapped tiles' at the rule's width, that width): ws_batched_swap's terms."""
    rows, parts = hopper_ws.ws_tiles(B * -(-M // hopper_ws.BLOCK) * hopper_ws.BLOCK, N, 132, False)
    best = min(hopper_ws.WIDTHS, key=lambda p: (hopper_ws._wave_cost(N, M, p, 132, batch=B), -(p[0] + p[1])))
    return hopper_ws._wave_cost(M, N, parts, 132, rows, B), hopper_ws._wave_cost(N, M, best, 132, batch=B), best
SETS = 3


SHARED_ROUTES = {"one GEMM": {}, "batched": {"batched.SHARED_WEIGHT_AS_ONE": False}}


def _target(name):
    """(module, attribute) of a patch key: hopper_ws's, or the batched op's ("batched." prefix)."""
    return (batched, name[len("batched."):]) if name.startswith("batched.") else (hopper_ws, name)


def plan_with(x, w, patch):
    saved = {k: getattr(*_target(k)) for k in patch}
    for k, v in patch.items():
        setattr(*_target(k), v)
    try:
        config_mod.clear_caches()
        gemmkit.batched_gemm_a16w16(x, w)
        return next(reversed(batched._plans.values()))
    finally:
        for k, v in saved.items():
            setattr(*_target(k), v)
        config_mod.clear_caches()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--bmnk", type=int, nargs="+", default=PROBLEMS)
    ap.add_argument("--swap", action="store_true")
    ap.add_argument("--shared", action="store_true")
    args = ap.parse_args()
    routes = SWAP_ROUTES if args.swap else SHARED_ROUTES if args.shared else ROUTES
    out = open(args.out, "w") if args.out else sys.stdout
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16; CUDA-graph us per call; "
          f"ratio = {'F.linear' if args.shared else 'torch.bmm'} / route", file=out, flush=True)
    ratios = {}
    b = args.bmnk
    for B, M, N, K in zip(b[::4], b[1::4], b[2::4], b[3::4]):
        sets = [(torch.randn(B, M, K, device="cuda", dtype=torch.bfloat16),
                 (torch.randn(1 if args.shared else B, N, K, device="cuda") / K**0.5).bfloat16().expand(B, N, K))
                for _ in range(SETS)]
        ref = torch.bmm(sets[0][0], sets[0][1].transpose(1, 2)).float()
        if args.shared:
            calls = {"F.linear": [lambda s=s: torch.nn.functional.linear(s[0], s[1][0]) for s in sets]}
        else:
            calls = {"bmm": [lambda s=s: torch.bmm(s[0], s[1].transpose(1, 2)) for s in sets]}
        kinds = {}
        for name, patch in routes.items():
            plan = plan_with(*sets[0], patch)
            kinds[name] = f"rows {plan.rows}" if hasattr(plan, "rows") else type(plan).__name__
            if getattr(getattr(plan, "plan", None), "swap", False):
                kinds[name] += f" swap {plan.parts}"
            err = rel_error(plan.run(*sets[0], None, None, None, None, None, None, None), ref)
            if err > 2e-2:
                print(f"  {name}: wrong result (rel err {err:.2e})", file=out, flush=True)
                continue
            calls[name] = [lambda s=s, p=plan: p.run(*s, None, None, None, None, None, None, None) for s in sets]
        _, line = timed_row(calls, ratios)
        costs = "  | wave cost 128-row {} swapped {} at {}".format(*wave_costs(B, M, N)) if args.swap else ""
        print(f"B={B} M={M:5d} N={N:5d} K={K:5d}  " + line + "  | " + ", ".join(f"{k}: {v}" for k, v in kinds.items())
              + costs, file=out, flush=True)
        sets = calls = None
        torch.cuda.empty_cache()
    print_geomeans(ratios, "F.linear" if args.shared else "torch.bmm", out)


if __name__ == "__main__":
    main()
