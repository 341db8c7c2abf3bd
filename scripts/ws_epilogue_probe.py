"""Probe (device tool, H100): what the warp-specialized Gluon kernel's epilogue costs per tile on
large problems (FP8 with fast accumulation, or bf16 with --bf16): the default plan against the same
tiles with SHARE_C off (an output buffer per part, a stage less), with pointer stores (no output
buffer: a stage more) and, for reference, K doubled (the per-tile fixed cost: t(2K) - 2 (t(2K) - t(K))).
One interleaved CUDA-graph timing per problem with the baseline (fast-accum _scaled_mm / F.linear).

    python3 scripts/ws_epilogue_probe.py [OUT] [--bf16] [--mnk M N K ...]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gemmkit.core import hopper_ws  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402
from probe_util import dense_baseline, dense_sets  # noqa: E402

SETS = 2


def plan_for(x, w, xs, ws, M, N, K, fp8, sms, **patch):
    saved = {k: getattr(hopper_ws, k) for k in patch}
    for k, v in patch.items():
        setattr(hopper_ws, k, v)
    try:
        return hopper_ws.WSPlan(x, w, None, M, N, K, "rowcol" if fp8 else "none", xs, ws, None, torch.bfloat16,
                                (M, N), False, sms, promote=False)
    finally:
        for k, v in saved.items():
            setattr(hopper_ws, k, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--mnk", type=int, nargs="+", default=[8192, 8192, 2048, 2048, 8192, 2048, 4096, 4096, 4096])
    args = ap.parse_args()
    fp8 = not args.bf16
    out = open(args.out, "w") if args.out else sys.stdout
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {'fp8 fast accumulation' if fp8 else 'bf16'}; "
          "CUDA-graph us per call; ratio = baseline / variant", file=out, flush=True)
    variants = {"default": {}, "no_share_c": {"SHARE_C": False}, "ptr_store": {"_tma_output": lambda *a: False}}
    for M, N, K in zip(args.mnk[::3], args.mnk[1::3], args.mnk[2::3]):
        row = {}
        for k_mult in (1, 2):
            Kk = K * k_mult
            sets = dense_sets(M, N, Kk, fp8, SETS)
            base = dense_baseline

            ref = base(*sets[0]).float()
            calls = {"base": [lambda s=s: base(*s) for s in sets]}
            names = ["default"] if k_mult == 2 else list(variants)
            for name in names:
                plan = plan_for(*sets[0], M, N, Kk, fp8, sms, **variants[name])
                err = rel_error(plan.run(sets[0][0], sets[0][1], None, None, sets[0][2], sets[0][3]), ref)
                if err > 2e-2:
                    print(f"  {name}: wrong result (rel err {err:.2e})", file=out, flush=True)
                    continue
                calls[name] = [lambda s=s, p=plan: p.run(s[0], s[1], None, None, s[2], s[3]) for s in sets]
                if k_mult == 1:
                    row[f"{name} stages"] = plan.stages
            times = dict(zip(calls, time_graphs_us(*calls.values(), rep_ms=8, retries=5)))
            for k, t in times.items():
                row[f"{k}@{k_mult}K"] = t
            sets = calls = None
            torch.cuda.empty_cache()
        fixed = 2 * row["default@1K"] - row["default@2K"]
        tiles = hopper_ws._tiles(M, N, *(lambda p: (p[0], sum(p[1])))(hopper_ws.ws_tiles(M, N, sms, fp8)))
        print(f"M={M:5d} N={N:5d} K={K:5d}  " + "  ".join(
            f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
              + "  | ratio " + " ".join(f"{k.split('@')[0]} {row['base@1K'] / row[k]:.2f}" for k in row
                                        if k.endswith("@1K") and not k.startswith("base"))
              + f"  | fixed part {fixed:.1f} us over {tiles} tiles ({fixed / -(-tiles // sms):.2f} us per wave)",
              file=out, flush=True)


if __name__ == "__main__":
    main()
