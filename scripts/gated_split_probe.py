"""Probe (device tool, H100): the gated product act(x @ gate^T) * (x @ up^T) in two launches over column ranges,
the first of whole waves of 128-wide gated tiles, the rest at the width the library picks for it, against the
library's one launch (core/hopper_ws.ws_gated_width) and torch's sequence (F.linear to 2I, chunk, silu(g) * u), in
one CUDA-graph timing per problem (inputs rotated over 3 sets). A split whose first launch fills `waves` waves of
the SMs exactly leaves the narrower tiles only the remainder's columns. Prints times, ratios to torch and errors.

    python3 scripts/gated_split_probe.py [--m M ...] [--shapes I H ...]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gemmkit.core import hopper_ws  # noqa: E402
from gemmkit.ops import fused  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402
from probe_util import gated_sets  # noqa: E402

# (I, H): Qwen2.5-7B, Llama-3-8B, Llama-3-70B; held out: Qwen2.5-14B, Gemma-2-9B, Qwen2.5-32B, Llama-3.2-3B, 70B / 4
SHAPES = [(18944, 3584), (14336, 4096), (28672, 8192), (13824, 5120), (14336, 3584), (27648, 5120), (8192, 3072),
          (7168, 8192)]
SETS = 3


def splits(M: int, I: int, sms: int):
    """First-launch column counts: whole waves of 128 x (128 + 128) tiles, fewer columns than I."""
    tiles_m = -(-M // hopper_ws.BLOCK)
    out = []
    for waves in range(1, 8):
        cols = waves * sms // tiles_m * 128
        if cols >= I:
            break
        if waves * sms % tiles_m == 0:
            out.append((waves, cols))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--shapes", type=int, nargs="+", help="I H pairs instead of the built-in list")
    args = ap.parse_args()
    shapes = list(zip(args.shapes[::2], args.shapes[1::2])) if args.shapes else SHAPES
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for I, H in shapes:
        for M in args.m:
            sets = gated_sets(M, I, H, SETS, out=True)
            x, w, g, u, _ = sets[0]
            ref = F.silu(x.float() @ g.float().T) * (x.float() @ u.float().T)

            def one(i):
                s = sets[i]
                return fused.gated_gemm(s[0], s[2], s[3], y=s[4])

            def two(i, c):
                s = sets[i]
                fused.gated_gemm(s[0], s[2][:c], s[3][:c], y=s[4][:, :c])
                fused.gated_gemm(s[0], s[2][c:], s[3][c:], y=s[4][:, c:])
                return s[4]

            def torch_seq(i):
                gu = F.linear(sets[i][0], sets[i][1])
                a, b = gu.chunk(2, dim=-1)
                return F.silu(a) * b

            variants = {"one": [lambda i=i: one(i) for i in range(SETS)]}
            errs = {"one": rel_error(one(0).float(), ref)}
            for waves, c in splits(M, I, sms):
                name = f"split{waves}w@{c}"
                for s in sets:
                    s[4].fill_(float("nan"))
                errs[name] = rel_error(two(0, c).float(), ref)
                variants[name] = [lambda i=i, c=c: two(i, c) for i in range(SETS)]
            variants["torch"] = [lambda i=i: torch_seq(i) for i in range(SETS)]
            times = time_graphs_us(*variants.values(), rep_ms=8)
            t = dict(zip(variants, times))
            width = hopper_ws.ws_gated_width(M, I, sms)
            cells = "  ".join(f"{k} {v:7.1f}" for k, v in t.items())
            ratios = "  ".join(f"{k} {t['torch'] / v:.3f}" for k, v in t.items() if k != "torch")
            worst = max(errs.values())
            print(f"M={M:5d} I={I:5d} H={H:5d} (one: width {width})  {cells}  | ratio {ratios}  max err {worst:.1e}",
                  flush=True)
            sets = ref = None
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
