"""Probe (device tool): the 4-bit prefill kernel with U K steps per loop iteration (its loop body repeated by a
static_range, so that consecutive steps' decoded registers differ and the product can stay in flight while the
next step is decoded), built from the shipped kernel's source text, against the shipped kernel: relative error
and CUDA-graph time, INT4 g128, with 128-row weight tiles (two warp groups, a barrier between them per step) and
64-row ones (one warp group per program), and with an extra barrier after each step's data wait. (Two steps per
iteration raced in the twelfth session: BENCHMARKS.md.)

Usage: python3 scripts/w4_prefill_unroll_probe.py [OUT_FILE]
"""
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gemmkit.core import hopper_w4  # noqa: E402
from gemmkit.tools import tune  # noqa: E402

import probe_util  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(HERE, "gemmkit", "kernels", "gemm_w4_prefill.py")
LOOP = "    for j in range(total):\n"


def variant(name: str, unroll: int, extra_barrier: bool):
    """The kernel with its loop body repeated `unroll` times per iteration (and, extra_barrier, a CTA
    barrier after each step's data wait), as module gemmkit.kernels.<name>."""
    text = open(SRC).read()
    head, body = text.split(LOOP)
    body_lines = body.rstrip("\n").split("\n")
    if extra_barrier:
        i = next(n for n, ln in enumerate(body_lines) if "mbarrier.wait(bars.index(slot)" in ln)
        body_lines.insert(i + 1, "        _cta_barrier()")
    new = (f"    for j0 in range(0, total, {unroll}):\n        for uu in gl.static_range({unroll}):\n"
           "            j = j0 + uu\n" + "\n".join(("    " + ln) if ln.strip() else ln for ln in body_lines) + "\n")
    path = os.path.join(HERE, "gemmkit", "kernels", f"{name}.py")
    with open(path, "w") as f:
        f.write(head + new)
    return importlib.import_module(f"gemmkit.kernels.{name}").w4_prefill_kernel


out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
shipped = hopper_w4.prefill_kernel()
VARIANTS = [("shipped", shipped, None), ("2 steps per iteration", variant("_v_u2", 2, False), None),
            ("2 steps, 64-row weight tiles", variant("_v_u2b", 2, False), 64),
            ("2 steps, a barrier after each data wait", variant("_v_u2c", 2, True), None),
            ("shipped, 64-row weight tiles", shipped, 64)]
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, INT4 g128 asymmetric", file=out, flush=True)
hopper_w4.PREFILL_MAX_M = 1 << 30
for M, N, K in ((256, 28672, 4096), (1024, 8192, 8192), (512, 4096, 4096)):
    torch.manual_seed(0)
    inps = [probe_util.int4_inputs(M, N, K) for _ in range(3)]
    ref = inps[0]["x"].float() @ inps[0]["w16"].float().T
    named = {"F.linear bf16": [lambda inp=inp: F.linear(inp["x"], inp["w16"]) for inp in inps]}
    for name, kernel, bn in VARIANTS:
        hopper_w4.PREFILL_BN = bn
        hopper_w4.prefill_kernel = lambda kernel=kernel: kernel
        plans, calls = probe_util.w4_plan_calls(inps, False)
        try:
            err = tune.rel_error(calls[0](), ref)
        except Exception as e:  # noqa: BLE001 - a probe reports and goes on
            print(f"  {name}: {type(e).__name__}: {str(e)[:160]}", file=out, flush=True)
            continue
        named[f"{name} (rel err {err:.1e}; BN {plans[0].values['BN']})"] = calls
    probe_util.time_and_print(named, f"M={M} N={N} K={K}:", N * K / 2, out)
for name in ("_v_u2", "_v_u2b", "_v_u2c"):
    os.remove(os.path.join(HERE, "gemmkit", "kernels", f"{name}.py"))
