"""Probe (device tool): what zeroing the split-K / stream-K counters and the decode kernel's sums costs
under CUDA-graph replay. core/plan.zeroed_buffer zeroes one buffer per capture (the driver names the
capture) instead of one per call; this times, in one process, each call captured with the per-capture
buffer ("once per graph") and with a fresh zeroed buffer per call ("per call": a memset node before each
launch), for gemm_a16w16 on its shipped configs and gemm_a16w4 (INT4 g128) at decode sizes, on the
Llama-3 layers; only calls whose plan zeroes a buffer are listed. F.linear bf16 in the same replay.

Usage: python3 scripts/capture_zeroing_probe.py [OUT_FILE]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core import plan as plan_mod  # noqa: E402
from gemmkit.quant import dequantize_int4, quantize_int4  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402

out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192), (57344, 8192),
          (8192, 28672)]
ROTATE = 3
real_zeroed = plan_mod.zeroed_buffer
zeroings = []


def counting(*args):
    zeroings.append(args)
    return real_zeroed(*args)


def per_call(device, device_index, n, dtype):
    if plan_mod.capturing():
        return torch.zeros(n, dtype=dtype, device=device)
    return real_zeroed(device, device_index, n, dtype)


def use(fn):
    """Route every zeroed-buffer request through fn (the shared kernel's split-K counters call
    plan.zeroed_buffer; the decode plan imported it by name)."""
    import gemmkit.core.hopper_w4 as hw

    plan_mod.zeroed_buffer = hw.zeroed_buffer = fn


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; CUDA-graph replay, {ROTATE} weight copies",
          file=out, flush=True)
    for op in ("a16w16", "a16w4"):
        for N, K in SHAPES:
            for M in ((1, 8, 32) if op == "a16w16" else (1, 4, 8)):
                torch.manual_seed(0)
                xs = [torch.randn(M, K, device="cuda").bfloat16() for _ in range(ROTATE)]
                w16 = [(torch.randn(N, K, device="cuda") / K**0.5).bfloat16() for _ in range(ROTATE)]
                if op == "a16w4":
                    packed = [quantize_int4(w, 128) for w in w16]
                    w16 = [dequantize_int4(*p, 128, torch.bfloat16) for p in packed]

                    def call(i):
                        return gemmkit.gemm_a16w4(xs[i], *packed[i], group_size=128)
                else:
                    def call(i):
                        return gemmkit.gemm_a16w16(xs[i], w16[i])
                zeroings.clear()
                use(counting)
                call(0)
                torch.cuda.synchronize()
                used = bool(zeroings)
                times = {}
                if used:
                    modes = {"once per graph": real_zeroed, "per call": per_call}
                    runs = []
                    for mode, fn in modes.items():
                        def wrapped(i, fn=fn):
                            use(fn)
                            return call(i)
                        runs.append([lambda i=i, w=wrapped: w(i) for i in range(ROTATE)])
                    base = [lambda i=i: F.linear(xs[i], w16[i]) for i in range(ROTATE)]
                    t = time_graphs_us(base, *runs, rep_ms=10, retries=3)
                    times = dict(zip(["F.linear bf16", *modes], t))
                use(real_zeroed)
                if not used:
                    print(f"{op} M={M} N={N} K={K}: no zeroed buffer", file=out, flush=True)
                    continue
                print(f"{op} M={M} N={N} K={K}: " + "  ".join(
                    f"{k} {v:.2f} us ({times['F.linear bf16'] / v:.2f}x)" for k, v in times.items())
                      + f"  once/per-call {times['per call'] / times['once per graph']:.3f}", file=out, flush=True)


if __name__ == "__main__":
    main()
