"""Probe (device tool): what the INT4 decode kernel's K-slice sums cost. The shipped kernel against
copies of it (built from its source text) whose atomics are masked off (no sums traffic; wrong
results, timing only), replaced by plain stores of each slice's partial to y (no read-modify-write
at L2; wrong results), whose x is not staged (zeros: no x traffic), or whose weights are never
loaded (no TMA, no waits: the decode and tensor-core work alone, on stale shared memory); and other
splits at 16 rows. --fast: only the shipped kernel, the one without weight loads, the one whose (M, N)
sums' atomics are masked off (by a mask the compiler cannot prove false: the rows of 1 to 11 and
from 17) and both. INT4 g128 asymmetric, CUDA-graph replay over 3 weight copies, F.linear bf16
in the same run.

Usage: python3 scripts/w4_atomics_probe.py [OUT_FILE] [--m 1 2 16]
"""

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gemmkit.core import hopper_w4  # noqa: E402
from gemmkit.ops import a16w4  # noqa: E402
from gemmkit.tools import tune  # noqa: E402

import probe_util  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
out = open(args[0], "w") if args and not args[0].isdigit() else sys.stdout
FAST = "--fast" in sys.argv
M_LIST = [int(a) for a in sys.argv[sys.argv.index("--m") + 1:]] if "--m" in sys.argv else [1, 2, 16]
SHAPES = [(28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672), (6144, 4096)]
KDIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gemmkit", "kernels")
SRC = open(os.path.join(KDIR, "gemm_w4_decode.py")).read()


def variant_kernel(name, src):
    path = os.path.join(KDIR, f"_probe_{name}.py")
    with open(path, "w") as f:
        f.write(src)
    try:
        return importlib.import_module(f"gemmkit.kernels._probe_{name}").w4_decode_kernel
    finally:
        os.remove(path)


MASKED = SRC.replace("mask=(rn < N)[:, None],\n                                      sem=\"relaxed\")",
                     "mask=(rn < 0)[:, None],\n                                      sem=\"relaxed\")").replace(
    "mask=(rm < M)[None, :] & (rn < N)[:, None], sem=\"relaxed\")",
    "mask=(rm < 0)[None, :] & (rn < N)[:, None], sem=\"relaxed\")")
assert MASKED.count("rn < 0") == 1 and MASKED.count("rm < 0") == 1
STORES = SRC.replace("                if SLICED:\n                    rn = t * BN",
                     "                if SLICED and False:\n                    rn = t * BN")
assert STORES != SRC
NO_X = SRC.replace("mask=(rmx < M)[:, None], other=0.0)", "mask=(rmx < 0)[:, None], other=0.0)")
assert NO_X != SRC
NO_X_MASKED = MASKED.replace("mask=(rmx < M)[:, None], other=0.0)", "mask=(rmx < 0)[:, None], other=0.0)")
NO_W = SRC.replace("        if i < boxes:\n            _issue(", "        if i < 0:\n            _issue(").replace(
    "        if b + STAGES - 1 < boxes:\n", "        if b + STAGES - 1 < 0:\n").replace(
    "        mbarrier.wait(bars.index(slot), (b // STAGES) & 1)\n", "")
assert NO_W.count("< 0:") == 2 and "mbarrier.wait" not in NO_W
# (M, N) sums masked by rn < 0, which the compiler cannot prove false (at one row rm < 0 it can)
MASKED_RN = SRC.replace("mask=(rm < M)[None, :] & (rn < N)[:, None], sem=\"relaxed\")",
                        "mask=(rm < M)[None, :] & (rn < 0)[:, None], sem=\"relaxed\")")
assert MASKED_RN != SRC
SHIPPED = hopper_w4.decode_kernel()
LONG = hopper_w4.LONG
# (name, kernel, split at 5 to 16 rows); at one row the (rm < 0) mask lets the compiler drop the whole
# product (checked in the SASS), so "atomics masked off" is the bare weight stream there
KERNELS = [("shipped", SHIPPED, LONG), ("atomics masked off", variant_kernel("masked", MASKED), LONG),
           ("plain stores to y", variant_kernel("stores", STORES), LONG),
           ("x not staged (zeros)", variant_kernel("nox", NO_X), LONG),
           ("x not staged, atomics masked off", variant_kernel("noxmasked", NO_X_MASKED), LONG),
           ("weights not loaded (decode and tensor cores on stale shared memory)", variant_kernel("now", NO_W), LONG),
           ("(M, N) atomics masked off (rn < 0)", variant_kernel("maskedrn", MASKED_RN), LONG),
           ("weights not loaded, (M, N) atomics masked off", variant_kernel(
               "nowmaskedrn", MASKED_RN.replace("        if i < boxes:\n            _issue(", "        if i < 0:\n            _issue(")
               .replace("        if b + STAGES - 1 < boxes:\n", "        if b + STAGES - 1 < 0:\n")
               .replace("        mbarrier.wait(bars.index(slot), (b // STAGES) & 1)\n", "")), LONG),
           ("shipped, SHORT_INT4 split", SHIPPED, hopper_w4.SHORT_INT4),
           ("shipped, LONG KS 2 (more slices)", SHIPPED, hopper_w4.Split(2, 4, 4)),
           ("shipped, LONG 5/SM", SHIPPED, hopper_w4.Split(4, 4, 5))]


hopper_w4.DECODE_MAX_M = 64  # every M <= 64 on the decode kernel
hopper_w4.INT4_WIDE_MIN_WEIGHT = 0


def calls_for(inps, kernel):
    plans, calls = probe_util.w4_plan_calls(inps, False)
    assert all(plan.kernel is kernel for plan in plans)
    return calls


print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, INT4 g128 asymmetric, 3 weight copies", file=out,
      flush=True)
for N, K in SHAPES:
    for M in M_LIST:
        torch.manual_seed(0)
        inps = [probe_util.int4_inputs(M, N, K) for _ in range(3)]
        ref = inps[0]["x"].float() @ inps[0]["w16"].float().T
        wbytes = N * K / 2 + N * (K // 128) * 3
        hopper_w4.LONG = LONG
        split = hopper_w4.decode_split(M, N, K, a16w4.device_info(inps[0]["x"].device), 128, False)
        named = {"F.linear bf16": [lambda inp=inp: F.linear(inp["x"], inp["w16"]) for inp in inps]}
        for name, kernel, long in KERNELS:
            if M == 1 and long is not LONG or FAST and not (name == "shipped" or name.startswith(("weights", "(M, N)"))):
                continue
            hopper_w4.decode_kernel = (lambda k=kernel: k)
            hopper_w4.LONG = long
            calls = calls_for(inps, kernel)
            err = tune.rel_error(calls[0](), ref)
            named[f"{name} (rel err {err:.1e})"] = calls
        probe_util.time_and_print(named, f"M={M} N={N} K={K} ({split.slices} slices, KS {split.ks}, "
                                  f"{split.programs} programs):", wbytes, out)
        del inps, ref, named
        torch.cuda.empty_cache()
