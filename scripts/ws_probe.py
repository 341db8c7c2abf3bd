"""Probe (device tool, H100): the warp-specialized Gluon kernel (core/hopper_ws.py) against the
shared tl kernel it replaces and against torch's baseline, in one CUDA-graph timing per problem.

For each op ("a8w8_blockscale": block scales vs torch block-wise _scaled_mm; "a8w8_default_accum":
gemm_a8w8(fast_accum=False) vs _scaled_mm's default accumulation; "a8w8": the default fast
accumulation vs _scaled_mm's use_fast_accum=True; "a16w16": bf16 vs F.linear), shape and M: the op's default
call (the warp-specialized kernel where core/hopper_ws.ws_plan takes the problem), the plan the
same call builds with GEMMKIT_GLUON=0 (the tl kernel and its tables; built once, its run() timed),
and the baseline; inputs rotated over 3 sets.
Prints times, the ratios to the baseline and each result's error against the float reference.

    python3 scripts/ws_probe.py [--m M ...] [--op OP ...] [--heldout] [--block-n 128|256] [--parts N0 N1]
                                [--no-c-tma] [--any-size] [--shapes N K ...] [--max-stages S] [--no-share-c]
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gemmkit.core import config as config_mod  # noqa: E402
from gemmkit.core import hopper_ws  # noqa: E402
from gemmkit.tools.registry import __file__ as registry_file, get_op  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402

DSV3 = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (36864, 7168), (7168, 18432)]
LLAMA = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
SETS = 3


def tl_runner(name, op, inp):
    """A call of the plan the op builds with GEMMKIT_GLUON=0 (the tl kernel and its tables), built
    here once: the timed call is the plan's own run(), as the op's would be."""
    from gemmkit.ops import a8w8, a8w8_blockscale, a16w16

    module = {"a8w8_blockscale": a8w8_blockscale, "a16w16": a16w16}.get(name, a8w8)
    os.environ[hopper_ws.GLUON_ENV] = "0"
    config_mod.clear_caches()
    try:
        op.run(inp)
        plan = next(reversed(module._plans.values()))
    finally:
        del os.environ[hopper_ws.GLUON_ENV]
        config_mod.clear_caches()
    return lambda: plan.run(inp["x"], inp["w"], None, None, inp.get("xs"), inp.get("ws"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[128, 256, 1024, 4096])
    ap.add_argument("--op", nargs="+", default=["a8w8_blockscale", "a8w8_default_accum"])
    ap.add_argument("--heldout", action="store_true", help="the held-out models' layers instead")
    ap.add_argument("--block-n", type=int, choices=(128, 256), help="force the kernel's tile columns")
    ap.add_argument("--parts", type=int, nargs=2, help="force the column parts of tiles without promotion")
    ap.add_argument("--no-c-tma", action="store_true", help="pointer stores of the output (hopper_ws.C_TMA off)")
    ap.add_argument("--any-size", action="store_true", help="the kernel at every size (hopper_ws.ws_shape_ok off)")
    ap.add_argument("--shapes", type=int, nargs="+", help="N K pairs instead of the model layers")
    ap.add_argument("--max-stages", type=int, help="the pipeline's stage cap (hopper_ws.MAX_STAGES)")
    ap.add_argument("--no-share-c", action="store_true", help="an output buffer per column part (hopper_ws.SHARE_C off)")
    args = ap.parse_args()
    if args.no_share_c:
        hopper_ws.SHARE_C = False
    if args.max_stages:
        hopper_ws.MAX_STAGES = args.max_stages
    if args.any_size:
        hopper_ws.ws_shape_ok = lambda M, N, K, num_sms, kblock: True
        hopper_ws.ws_direct_ok = lambda *args: True
    if args.no_c_tma:
        hopper_ws.C_TMA = False
    if args.block_n:
        hopper_ws.ws_block_n = lambda M, N, num_sms, kblock: args.block_n
    if args.parts:
        hopper_ws.ws_parts = lambda *a: tuple(args.parts)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for name in args.op:
        op = get_op(name)
        shapes = DSV3 + (LLAMA if name != "a8w8_blockscale" else [])
        if args.shapes:
            shapes = list(zip(args.shapes[::2], args.shapes[1::2]))
        elif args.heldout:
            models = json.load(open(os.path.join(os.path.dirname(registry_file), "models.json")))
            shapes = sorted({tuple(nk) for m, d in models.items() if m.startswith("heldout")
                             for nk in d["layers"].values()})
        ratios = {"ws": [], "tl": []}
        print(f"== {name}: baseline {op.baseline_name}", flush=True)
        for N, K in shapes:
            for M in args.m:
                sets = [op.make_inputs(M, N, K, op.dtypes[0], "cuda") for _ in range(SETS)]
                ref = op.reference(sets[0])
                took = _took_ws(op, sets[0])
                tl_calls = [tl_runner(name, op, i) for i in sets]
                errs = (rel_error(op.run(sets[0]), ref), rel_error(tl_calls[0](), ref))
                lists = [[lambda i=i: op.run(i) for i in sets], tl_calls, [lambda i=i: op.baseline(i) for i in sets]]
                t_ws, t_tl, t_base = time_graphs_us(*lists, rep_ms=6, retries=5)
                ratios["ws"].append(t_base / t_ws)
                ratios["tl"].append(t_base / t_tl)
                print(f"M={M:5d} N={N:5d} K={K:5d}  default {t_ws:8.1f} us ({took or 'tl'})  "
                      f"tl {t_tl:8.1f} us  base {t_base:8.1f} us  ratio default {t_base / t_ws:5.2f} "
                      f"tl {t_base / t_tl:5.2f}  gain {t_tl / t_ws:5.2f}  err {errs[0]:.1e} / {errs[1]:.1e}", flush=True)
                del sets, ref
                torch.cuda.empty_cache()
        geo = {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in ratios.items()}
        print(f"geomean ratio to the baseline: default {geo['ws']:.3f}, tl {geo['tl']:.3f}", flush=True)


def _took_ws(op, inp):
    """Whether the op's default call builds a warp-specialized plan for these inputs."""
    built = []
    real = hopper_ws.WSPlan.__init__

    def spy(self, *a, **k):
        real(self, *a, **k)
        built.append(f"ws {self.parts[0]}+{self.parts[1]}" if self.parts[1] else f"ws {self.parts[0]}")

    hopper_ws.WSPlan.__init__ = spy
    config_mod.clear_caches()
    try:
        op.run(inp)
    finally:
        hopper_ws.WSPlan.__init__ = real
    return built[0] if built else None


if __name__ == "__main__":
    main()
