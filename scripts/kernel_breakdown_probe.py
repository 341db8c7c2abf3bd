"""Probe (device tool): where the time of a tool op's call goes, kernel by kernel, for gemmkit and its torch
baseline (same inputs, the op's `gemmkit bench` definitions): each side is captured in a CUDA graph, replayed
under torch.profiler, and every kernel's mean time is listed with its share (the kernels' names say which
library and tiling ran: cuBLAS's nvjet_* carry tile, K step, stages and cluster shape). The whole call's
graph time of both sides (interleaved replays) heads each block.

    python3 scripts/kernel_breakdown_probe.py [OUT] --op OP --mnk M N K [M N K ...] [--reps R]

OP as `gemmkit bench` names it, e.g. moe_mlp@qwen3-30b-a3b-moe-mlp:balanced, batched_a16w16@b8.
"""

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from gemmkit.tools.registry import get_op  # noqa: E402
from gemmkit.tools.timing import CapturedCalls, time_graphs_us  # noqa: E402


def kernels(fn, reps: int):
    """[(name, mean us per call, launches per call)] of fn's kernels captured in a CUDA graph (tools/timing's
    capture) and replayed `reps` times under torch.profiler, longest first."""
    cap = CapturedCalls([fn], 0, torch.cuda.Stream())
    calls = reps * cap.per_replay
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            cap.graph.replay()
        torch.cuda.synchronize()
    total, count = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            total[e.name] += e.device_time
            count[e.name] += 1
    return sorted(((n, t / calls, count[n] / calls) for n, t in total.items()), key=lambda r: -r[1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--op", required=True)
    p.add_argument("--mnk", type=int, nargs="+", required=True)
    p.add_argument("--dtype", default=None)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    out = open(a.out, "a") if a.out else sys.stdout
    op = get_op(a.op)
    dtype = a.dtype or op.dtypes[0]
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} op {op.name} ({dtype}) baseline: "
          f"{op.baseline_name}", file=out, flush=True)
    for M, N, K in zip(a.mnk[0::3], a.mnk[1::3], a.mnk[2::3]):
        inp = op.make_inputs(M, N, K, dtype, "cuda")
        own, base = (lambda: op.run(inp)), (lambda: op.baseline(inp))
        tb, to = time_graphs_us([base], [own], rep_ms=10, retries=3)
        print(f"\n== M={M} N={N} K={K}: gemmkit {to:.1f} us, baseline {tb:.1f} us, ratio {tb / to:.3f}", file=out)
        for side, fn in (("gemmkit", own), ("baseline", base)):
            rows = kernels(fn, a.reps)
            busy = sum(r[1] for r in rows)
            print(f"-- {side}: {busy:.1f} us of kernels per call", file=out)
            for name, us, n in rows:
                print(f"  {us:9.1f} us {100 * us / busy:5.1f}%  x{n:g}  {name[:150]}", file=out)
        out.flush()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
