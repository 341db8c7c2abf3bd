"""Probe (device tool): the Hopper 4-bit decode kernel (kernels/gemm_w4_decode.py) against another
version of it (a copy of its source, e.g. `git show REV:gemmkit/kernels/gemm_w4_decode.py`), both on
the shipped work splits, in one process: INT4 g128 asymmetric (--fp4: MXFP4; --group G), CUDA-graph
replay over 3 weight copies, F.linear bf16 on the dequantized weight in the same run; results checked
against a float32 reference.

--const NAME=V1,V2: also this kernel with core/hopper_w4.py's NAME set to each value.

Usage: python3 scripts/w4_kernel_ab.py OLD_SOURCE [OUT_FILE] [--fp4 | --group G] [--small] [--const NAME=V1,V2]
       [--m 1 16 64] (--m last)
"""

import importlib
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gemmkit.core import hopper_w4  # noqa: E402
from gemmkit.ops import a16w4  # noqa: E402
from gemmkit.tools import tune  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402

import probe_util  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--") and not a.isdigit() and "=" not in a]
OLD = args[0]
out = open(args[1], "w") if len(args) > 1 else sys.stdout
M_LIST = [int(a) for a in sys.argv[sys.argv.index("--m") + 1:]] if "--m" in sys.argv else [1, 16, 64]
SHAPES = [(28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672), (6144, 4096)]
if "--small" in sys.argv:
    SHAPES = [(4096, 4096), (3072, 3072), (2560, 8192), (8192, 2048), (4608, 4096), (5120, 4096), (9216, 3072)]
FP4 = "--fp4" in sys.argv
GROUP = int(sys.argv[sys.argv.index("--group") + 1]) if "--group" in sys.argv else 128
KDIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gemmkit", "kernels")
shutil.copy(OLD, os.path.join(KDIR, "_probe_old.py"))
# (name, kernel, hopper_w4 constants): this kernel, the old one, and this kernel with each --const value
VARIANTS = [("this kernel", hopper_w4.decode_kernel(), {}),
            ("old kernel", importlib.import_module("gemmkit.kernels._probe_old").w4_decode_kernel, {})]
os.remove(os.path.join(KDIR, "_probe_old.py"))
if "--const" in sys.argv:  # --const NAME=V1,V2: this kernel with hopper_w4.NAME set to each value
    cname, values = sys.argv[sys.argv.index("--const") + 1].split("=")
    VARIANTS += [(f"this kernel, {cname}={v}", VARIANTS[0][1], {cname: int(v)}) for v in values.split(",")]
DEFAULTS = {name: getattr(hopper_w4, name) for _, _, c in VARIANTS for name in c}
hopper_w4.DECODE_MAX_M = hopper_w4.MX_DECODE_MAX_M = 64  # every M <= 64 on the decode kernel
hopper_w4.INT4_WIDE_MIN_WEIGHT = 0


def calls_for(inps, kernel, consts):
    hopper_w4.decode_kernel = lambda: kernel
    for name, value in DEFAULTS.items():
        setattr(hopper_w4, name, consts.get(name, value))
    plans, calls = probe_util.w4_plan_calls(inps, FP4, GROUP)
    for plan in plans:
        assert plan.kernel is kernel, type(plan)
        for name in [n for n in plan.values if n not in kernel.arg_names]:  # (an older kernel's parameters)
            del plan.values[name]
    return calls


print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {'MXFP4' if FP4 else f'INT4 g{GROUP} asymmetric'}, "
      f"3 weight copies; against {OLD}", file=out, flush=True)
ratios = {}  # (M, variant) -> old kernel's time / the variant's
for N, K in SHAPES:
    for M in M_LIST:
        torch.manual_seed(0)
        inps, ref, named = probe_util.w4_problem(M, N, K, FP4, GROUP)
        for name, kernel, consts in VARIANTS:
            calls = calls_for(inps, kernel, consts)
            named[f"{name} (rel err {tune.rel_error(calls[0](), ref):.1e})"] = calls
        names = list(named)
        times = time_graphs_us(*[named[n] for n in names], rep_ms=10, retries=3)
        split = hopper_w4.decode_split(M, N, K, a16w4.device_info(inps[0]["x"].device), GROUP, FP4)
        print(f"M={M} N={N} K={K} ({split.slices} slices, KS {split.ks}, {split.programs} programs, bn {split.bn}): "
              f"this / old {times[2] / times[1]:.3f}x", file=out)
        for i, (name, _, _) in enumerate(VARIANTS):
            ratios.setdefault((M, name), []).append(times[2] / times[1 + i])
        for n, t in zip(names, times):
            print(f"  {t:9.1f} us  {times[0] / t:5.2f}x F.linear  {n}", file=out, flush=True)
        del inps, ref, named
        torch.cuda.empty_cache()
for (M, name), r in ratios.items():
    g = 1.0
    for v in r:
        g *= v
    print(f"M={M}: {name} against the old kernel: geomean {g ** (1 / len(r)):.3f} (min {min(r):.3f}, "
          f"max {max(r):.3f})", file=out, flush=True)
