"""Probe (device tool, H100): what the row stride of x and w costs when a row's bytes (K x element size)
are not a multiple of 32 (its rows then start off the L2's 32-byte sectors) or 128. For each problem,
one interleaved CUDA-graph timing of the baseline (F.linear / fast-accum _scaled_mm) and gemmkit's
default call on: contiguous operands; x's rows padded to a multiple of --pad bytes (a view of a wider
tensor, same values); w's rows padded; both. Results are checked against the baseline first.

    python3 scripts/align_probe.py [OUT] [--fp8] [--mnk M N K ...] [--pad BYTES]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402
from probe_util import dense_baseline, dense_sets  # noqa: E402

SETS = 3


def padded(t: torch.Tensor, pad: int) -> torch.Tensor:
    """t (rows, K) with its rows `pad`-byte aligned: a view of a wider tensor holding the same values."""
    K = t.shape[1]
    step = pad // t.element_size()
    wide = torch.zeros(t.shape[0], -(-K // step) * step, device=t.device, dtype=t.dtype)
    wide[:, :K] = t
    return wide[:, :K]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--pad", type=int, default=128)
    ap.add_argument("--mnk", type=int, nargs="+", default=[128, 8192, 3696, 512, 8192, 3696, 2048, 8192, 3696])
    args = ap.parse_args()
    out = open(args.out, "w") if args.out else sys.stdout
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {'fp8 fast accumulation' if args.fp8 else 'bf16'}"
          f", rows padded to {args.pad} bytes; CUDA-graph us per call; ratio = baseline / variant", file=out, flush=True)
    for M, N, K in zip(args.mnk[::3], args.mnk[1::3], args.mnk[2::3]):
        sets = dense_sets(M, N, K, args.fp8, SETS)

        def call(x, w, xs, ws, base=False):
            if base:
                return dense_baseline(x, w, xs, ws)
            return gemmkit.gemm_a8w8(x, w, xs, ws) if args.fp8 else gemmkit.gemm_a16w16(x, w)

        ref = call(*sets[0], base=True).float()
        variants = {"x": (True, False), "w": (False, True), "xw": (True, True)}
        calls = {"base": [lambda s=s: call(*s, base=True) for s in sets], "plain": [lambda s=s: call(*s) for s in sets]}
        for name, (px, pw) in variants.items():
            vs = [(padded(x, args.pad) if px else x, padded(w, args.pad) if pw else w, xs, ws) for x, w, xs, ws in sets]
            err = rel_error(call(*vs[0]), ref)
            if err > 2e-2:
                print(f"  {name}: wrong result (rel err {err:.2e})", file=out, flush=True)
                continue
            calls[f"pad_{name}"] = [lambda s=s: call(*s) for s in vs]
        names = list(calls)
        times = dict(zip(names, time_graphs_us(*[calls[k] for k in names], rep_ms=6, retries=5)))
        print(f"M={M:5d} N={N:5d} K={K:5d}  " + "  ".join(f"{k} {times[k]:7.1f}" for k in names)
              + "  | ratio " + " ".join(f"{k} {times['base'] / times[k]:4.2f}" for k in names[1:]), file=out, flush=True)
        sets = calls = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
