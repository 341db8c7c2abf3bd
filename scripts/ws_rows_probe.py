"""Probe (device tool, H100): tiles of 64 rows (one consumer warp group, kernels/gemm_ws.py GROUPS=1)
against the 128-row tiles of the warp-specialized Gluon kernel, the op's default plan and cuBLAS, for
bf16 (and with --fp8, FP8 with fast accumulation, per-token x per-channel scales) on layers whose
128-row tiles fill the SMs badly. One interleaved CUDA-graph timing per problem over: F.linear /
_scaled_mm (the baseline), the op's default call, the Gluon kernel with 128-row tiles at the width
ws_parts picks, and 64-row tiles at each width of --widths. Results are checked against the
baseline first. --ab: only the op's default call with the 64-row rule (hopper_ws.ROWS64) and
without it (its plan built with ROWS64 off; --knob NAME=VALUE: with that core/hopper_ws.py constant
instead, e.g. FITTED_GAIN=1.0), on --models' layers (default: the tuned models').

    python3 scripts/ws_rows_probe.py [OUT] [--m M ...] [--shapes N K ...] [--fp8] [--widths W ...]
                                     [--widths128 W ...] [--splits S ...] [--mnk M N K ...]
                                     [--ab [--knob NAME=VALUE] [--models NAME ...]]
"""

import argparse
import ast
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core import config as config_mod  # noqa: E402
from gemmkit.core import hopper_ws  # noqa: E402
from gemmkit.ops import a8w8, a16w16  # noqa: E402
from gemmkit.tools.registry import __file__ as registry_file  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402
from probe_util import dense_baseline, dense_sets, print_geomeans, timed_row  # noqa: E402

# Llama-3-70B / TP8 qkv, / TP4 qkv, / TP8 gate_up, / TP4 o; Gemma-2-9B down, Phi-3-mini down and o,
# Gemma-2-27B o, Qwen3-32B / TP2 qkv
SHAPES = [(1280, 8192), (2560, 8192), (7168, 8192), (8192, 2048), (3584, 14336), (3072, 8192), (3072, 3072),
          (4608, 4096), (5120, 5120)]
PARTS = {64: (64, 0), 80: (64, 16), 96: (64, 32), 128: (128, 0), 144: (128, 16), 160: (128, 32), 192: (128, 64),
         256: (128, 128)}
SETS = 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--m", type=int, nargs="+", default=[128, 256, 512, 1024, 2048])
    ap.add_argument("--shapes", type=int, nargs="+", help="N K pairs instead of the built-in list")
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 80, 96, 128, 160, 192])
    ap.add_argument("--widths128", type=int, nargs="*", default=[],
                    help="also 128-row tiles at these widths (beside ws_parts' pick)")
    ap.add_argument("--splits", type=int, nargs="*", default=[],
                    help="also each 128-row variant in this many K slices (ws_splits overridden)")
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--ab", action="store_true", help="the default call against its plan with --knob (default: the 64-row rule off)")
    ap.add_argument("--knob", default="ROWS64=False", help="--ab's other plan: this hopper_ws constant's value")
    ap.add_argument("--models", nargs="+", default=["llama3-8b", "llama3-70b", "deepseek-v3", "qwen2.5-7b"])
    ap.add_argument("--mnk", type=int, nargs="+", help="M N K triples instead of --m x the shapes")
    args = ap.parse_args()
    out = open(args.out, "w") if args.out else sys.stdout
    shapes = list(zip(args.shapes[::2], args.shapes[1::2])) if args.shapes else SHAPES
    if args.ab and not args.shapes:
        models = json.load(open(os.path.join(os.path.dirname(registry_file), "models.json")))
        shapes = sorted({tuple(nk) for m in args.models for nk in models[m]["layers"].values()})
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {'fp8 fast accumulation' if args.fp8 else 'bf16'}"
          "; CUDA-graph us per call; ratio = baseline / variant", file=out, flush=True)
    ratios = {}
    problems = ([tuple(args.mnk[i:i + 3]) for i in range(0, len(args.mnk), 3)] if args.mnk
                else [(M, N, K) for N, K in shapes for M in args.m])
    for M, N, K in problems:
        if True:
            sets = dense_sets(M, N, K, args.fp8, SETS)

            def baseline(i):
                return dense_baseline(*sets[i])

            def default(i):
                x, w, xs, ws = sets[i]
                return gemmkit.gemm_a8w8(x, w, xs, ws) if args.fp8 else gemmkit.gemm_a16w16(x, w)

            calls = {"base": [lambda i=i: baseline(i) for i in range(SETS)],
                     "default": [lambda i=i: default(i) for i in range(SETS)]}
            x, w, xs, ws = sets[0]
            ref = baseline(0).float()
            if args.ab:  # the default call's plan with the knob's value (the 64-row rule off)
                knob, value = args.knob.split("=")
                saved = getattr(hopper_ws, knob)
                setattr(hopper_ws, knob, type(saved)(ast.literal_eval(value)))
                config_mod.clear_caches()
                default(0)
                old = next(reversed((a8w8 if args.fp8 else a16w16)._plans.values()))
                setattr(hopper_ws, knob, saved)
                config_mod.clear_caches()
                default(0)
                rows = getattr(next(reversed((a8w8 if args.fp8 else a16w16)._plans.values())), "rows", "tl")
                calls["old"] = [lambda i=i: old.run(sets[i][0], sets[i][1], None, None, sets[i][2], sets[i][3])
                                for i in range(SETS)]
                names = list(calls)
                times = dict(zip(names, time_graphs_us(*[calls[k] for k in names], rep_ms=6, retries=5)))
                ratios.setdefault("default", []).append(times["base"] / times["default"])
                ratios.setdefault("old", []).append(times["base"] / times["old"])
                print(f"M={M:5d} N={N:5d} K={K:5d}  " + "  ".join(f"{k} {times[k]:7.1f}" for k in names)
                      + f"  | ratio default {times['base'] / times['default']:4.2f} old "
                      f"{times['base'] / times['old']:4.2f}  gain {times['old'] / times['default']:4.2f}"
                      f"  (rows {rows}, old {getattr(old, 'rows', 'tl')})", file=out, flush=True)
                sets = calls = None
                continue
            variants = {"ws128": (128, hopper_ws.ws_parts(M, N, sms, args.fp8), None)}
            for width in args.widths128:
                variants[f"ws128x{width}"] = (128, PARTS[width], None)
            for name, (_, parts, _) in list(variants.items()):
                for s in args.splits:
                    variants[f"{name}/k{s}"] = (128, parts, s)
            for width in args.widths:
                variants[f"ws64x{width}"] = (64, PARTS[width], None)
            ws_splits = hopper_ws.ws_splits
            for name, (rows, parts, splits) in variants.items():
                if splits:
                    hopper_ws.ws_splits = lambda *a, s=splits: s
                plan = hopper_ws.WSPlan(x, w, None, M, N, K, "rowcol" if args.fp8 else "none", xs, ws, None,
                                        torch.bfloat16, (M, N), False, sms, promote=False, tiles=(rows, parts))
                hopper_ws.ws_splits = ws_splits
                err = rel_error(plan.run(x, w, None, None, xs, ws), ref)
                if err > 2e-2:
                    print(f"  {name}: wrong result (rel err {err:.2e})", file=out, flush=True)
                    continue
                calls[name] = [lambda i=i, p=plan: p.run(sets[i][0], sets[i][1], None, None, sets[i][2], sets[i][3])
                               for i in range(SETS)]
            times, line = timed_row(calls, ratios, rep_ms=6)
            best = min(list(calls)[2:], key=times.get)
            print(f"M={M:5d} N={N:5d} K={K:5d}  " + line
                  + f"  | best {best} (ws128 = {variants['ws128'][1]}, default rows "
                  f"{getattr(next(reversed((a8w8 if args.fp8 else a16w16)._plans.values())), 'rows', 'tl')})",
                  file=out, flush=True)
            sets = calls = None
            torch.cuda.empty_cache()
    print_geomeans(ratios, "the baseline", out)


if __name__ == "__main__":
    main()
