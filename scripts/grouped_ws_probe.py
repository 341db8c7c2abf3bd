"""Probe: grouped bf16 GEMMs on the warp-specialized kernel's expert map (core/hopper_ws.ws_grouped_plan) against
the tl kernel's grouped plan and torch._grouped_mm, in one process (CUDA-graph times, do_bench_cudagraph).

Per model layer, routing and token count: _grouped_mm on x sorted by expert; gemmkit with gathered rows (as
`gemmkit bench grouped_a16w16` calls it) on the tl kernel and on the expert map (its sorted copy made in the call);
gemmkit on x already sorted, both kernels; the gated grouped GEMM (moe_mlp's gate / up, gathered) on both. Each
expert-map result is checked against the tl kernel's first (relative error).

    python3 scripts/grouped_ws_probe.py OUT.txt [--tokens 512 1024 2048 4096] [--models qwen3 deepseek]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import triton.testing  # noqa: E402

from gemmkit.core import config as config_mod, hopper_ws  # noqa: E402
from gemmkit.ops import grouped  # noqa: E402
from gemmkit.tools.registry import get_op, load_models  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--tokens", type=int, nargs="+", default=[512, 1024, 2048, 4096])
p.add_argument("--models", nargs="+", default=["qwen3-30b-a3b-moe", "deepseek-v3-moe", "mixtral-8x7b-moe"])
p.add_argument("--routings", nargs="+", default=["balanced", "zipf"])
p.add_argument("--no-gated", action="store_true")
p.add_argument("--permute-rows", type=int, default=None,
               help="also time the gathered call with hopper_ws.GROUPED_PERMUTE_ROWS at this value (a sorted copy first)")
args = p.parse_args()
out = open(args.out, "w")


def timed(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=60) * 1e3


def with_rule(on: bool, fn):
    hopper_ws.GROUPED_MIN_ROWS = hopper_ws.GROUPED_GATED_MIN_ROWS = 0 if on else 10**9
    config_mod.clear_caches()
    return fn


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


ratios = {}
for model in args.models:
    layers = load_models()[model]["layers"]
    for routing in args.routings:
        op = get_op(f"grouped_a16w16@{model}:{routing}")
        for name, (N, K) in layers.items():
            for T in args.tokens:
                inp = x = w = xs = rw = s_idx = None  # (the last problem's operands freed first: DeepSeek-V3's are 15 GB)
                torch.cuda.empty_cache()
                inp = op.make_inputs(T, N, K, "bf16", "cuda")
                x, w, o, g, xs = inp["x"], inp["w"], inp["o"], inp["g"], inp["x_sorted"]
                base = timed(lambda: op.baseline(inp))
                with_rule(False, None)
                y_tl = grouped.grouped_gemm_a16w16(x, w, o, gather_idx=g)
                tl = timed(lambda: grouped.grouped_gemm_a16w16(x, w, o, gather_idx=g))
                tl_s = timed(lambda: grouped.grouped_gemm_a16w16(xs, w, o))
                with_rule(True, None)
                y_ws = grouped.grouped_gemm_a16w16(x, w, o, gather_idx=g)
                plan = list(grouped._plans.values())[-1]
                tiles = (plan.plan.rows, plan.plan.parts) if isinstance(plan, hopper_ws.GroupedWSPlan) else "tl"
                err = rel(y_ws, y_tl)
                ws = timed(lambda: grouped.grouped_gemm_a16w16(x, w, o, gather_idx=g))
                ws_s = timed(lambda: grouped.grouped_gemm_a16w16(xs, w, o))
                R = x.shape[0] * op.top_k
                perm = ""
                if args.permute_rows is not None:
                    saved, hopper_ws.GROUPED_PERMUTE_ROWS = hopper_ws.GROUPED_PERMUTE_ROWS, args.permute_rows
                    config_mod.clear_caches()
                    err_p = rel(grouped.grouped_gemm_a16w16(x, w, o, gather_idx=g), y_tl)
                    ws_p = timed(lambda: grouped.grouped_gemm_a16w16(x, w, o, gather_idx=g))
                    hopper_ws.GROUPED_PERMUTE_ROWS = saved
                    config_mod.clear_caches()
                    perm = f" permuted from {args.permute_rows} rows {ws_p:.1f} ({base / ws_p:.3f}x, rel err {err_p:.1e})"
                line = (f"{model}:{routing} {name} T={T} (R={R}, {R / op.experts:.0f} rows/expert): _grouped_mm "
                        f"{base:.1f} us | gathered: tl {tl:.1f} ({base / tl:.3f}x) ws {ws:.1f} ({base / ws:.3f}x) | "
                        f"sorted: tl {tl_s:.1f} ({base / tl_s:.3f}x) ws {ws_s:.1f} ({base / ws_s:.3f}x){perm} | "
                        f"tiles {tiles} rel err ws vs tl {err:.1e}")
                if name == "down":  # (moe_mlp's down projection: sorted rows scattered to (token, slot) rows, weighted)
                    rw = torch.rand(R, device="cuda")
                    s_idx = inp["s"]
                    with_rule(False, None)
                    d_tl = grouped.grouped_gemm_a16w16(xs, w, o, scatter_idx=s_idx, routing_weights=rw)
                    dt = timed(lambda: grouped.grouped_gemm_a16w16(xs, w, o, scatter_idx=s_idx, routing_weights=rw))
                    with_rule(True, None)
                    d_ws = grouped.grouped_gemm_a16w16(xs, w, o, scatter_idx=s_idx, routing_weights=rw)
                    dw = timed(lambda: grouped.grouped_gemm_a16w16(xs, w, o, scatter_idx=s_idx, routing_weights=rw))
                    line += (f" || scattered, weighted: tl {dt:.1f} ws {dw:.1f} ({dt / dw:.3f}x tl) rel err "
                             f"{rel(d_ws, d_tl):.1e}")
                    ratios.setdefault("scattered ws / tl", []).append(dt / dw)
                ratios.setdefault("gathered tl", []).append(base / tl)
                ratios.setdefault("gathered ws", []).append(base / ws)
                ratios.setdefault("sorted ws", []).append(base / ws_s)
                ratios.setdefault("best of tl / ws gathered", []).append(base / min(tl, ws))
                if not args.no_gated and name == "gate_up":
                    I = N // 2
                    wgu = w  # (E, 2I, K): gate rows then up rows
                    with_rule(False, None)
                    g_tl = grouped.grouped_gated_a16w16(x, wgu, o, gather_idx=g)
                    gt = timed(lambda: grouped.grouped_gated_a16w16(x, wgu, o, gather_idx=g))
                    with_rule(True, None)
                    g_ws = grouped.grouped_gated_a16w16(x, wgu, o, gather_idx=g)
                    gw = timed(lambda: grouped.grouped_gated_a16w16(x, wgu, o, gather_idx=g))
                    line += f" || gated: tl {gt:.1f} ws {gw:.1f} ({gt / gw:.3f}x tl) rel err {rel(g_ws, g_tl):.1e}"
                    ratios.setdefault("gated ws / tl", []).append(gt / gw)
                print(line, file=out, flush=True)
for k, v in ratios.items():
    gm = torch.tensor(v).log().mean().exp().item()
    print(f"geomean {k}: {gm:.3f} over {len(v)} (min {min(v):.3f})", file=out)
