"""Probe (device tool): the Hopper INT4 (--fp4: MXFP4) decode kernel's work split (core/hopper_w4.py: the
SHORT / LONG splits, BOX_STEPS, PDL) against the tl kernel's pick and F.linear on the dequantized bf16 weight,
INT4 g128 asymmetric as `gemmkit bench a16w4` builds it; CUDA-graph replay over ROTATE copies of
the weights (so that no layer is timed hot in the 50 MB L2). The decode kernel's size rule is
widened for the probe (every M <= 64).

With --box: the (KS, stages, programs per SM, steps per TMA load, PDL finish) variants of BOX_VARIANTS
instead (core/hopper_w4.py BOX_STEPS, PDL); --rows128: ROWS128_VARIANTS, the same plus weight rows per
tile (Split.bn: 128, two warp groups sharing the staged x); --finish: the shipped split with the sliced
epilogue run by the last program of each tile group (FINISH_HERE forced, at any number of round trips) against
finish_sums launched after the kernel (PDL); --wide: WIDE (KS 8, 2 stages, 128-row tiles) with 2 programs
per SM and with 1 (one fits an SM's shared memory at 64 rows of x); --short: SHORT_VARIANTS; --sums: the
K slices' sums kept (N, BM) and added by vector atomics against (M, N) one value per atomic (SUMS_T).
--short-rows: SHORT_INT4 (5 per SM, in-kernel finish or not) up to 8 rows against LONG.
--deep: LONG against longer K slices (KS 8 to 32: fewer slices, fewer atomics, x staged deeper).
--occupancy: LONG (KS 4, 4 loads in flight, 4 programs per SM: what its shared memory allows) against
KS 4 with 3 or 2 loads in flight and 5 or 6 programs per SM. --long-ab: the shipped rule against
it with LONG as it was before (KS 4, 4 loads in flight, 4 programs per SM). --rows128-long: the shipped rule against KS 4 with 2 (3) loads in
flight and 3 (2) programs of 128 weight rows per SM (two warp groups sharing the staged x).
--one-row: the shipped rule against
KS 2 with 6 or 7 programs per SM or 3 loads in flight. --long-work: the shipped
rule against LONG at one to four rows on every layer (INT4 groups of 128 or more) and against the
finish launch in place of the in-kernel finish.
--small: smaller layers (held-out ones under 2^25 weights, Llama-3-8B o) instead of the Llama-3 set.

Usage: python3 scripts/w4_decode_sweep.py [OUT_FILE] [--fp4 | --group G] [--box | --rows128 | --wide | --deep | --finish | --short | --short-rows | --sums | --occupancy | --long-ab | --long-work | --one-row | --rows128-long] [--small] [--m 1 4 16] (--m last)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gemmkit.core import hopper_w4  # noqa: E402
from gemmkit.core.device import device_info  # noqa: E402
from gemmkit.ops import a16w4, fp4  # noqa: E402
from gemmkit.tools import registry, tune  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402

import probe_util  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
out = open(args[0], "w") if args and not args[0].isdigit() else sys.stdout
M_LIST = ([int(a) for a in sys.argv[sys.argv.index("--m") + 1:] if a.isdigit()] if "--m" in sys.argv
          else [1, 4, 16])
SHAPES = [(28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672), (6144, 4096)]
if "--small" in sys.argv:  # the held-out layers of fewer than 2^25 weights (and Llama-3-8B o)
    SHAPES = [(4096, 4096), (3072, 3072), (2560, 8192), (8192, 2048), (4608, 4096), (5120, 4096), (9216, 3072)]
FP4 = "--fp4" in sys.argv
GROUP = int(sys.argv[sys.argv.index("--group") + 1]) if "--group" in sys.argv else 128


def int4_inputs(M, N, K):
    """x, the INT4 weight in groups of GROUP (asymmetric) and its bf16 dequantization."""
    return probe_util.int4_inputs(M, N, K, GROUP)


VARIANTS = [(ks, st, ps, 1, False) for ks in (2, 4, 8) for st in (4, 8) for ps in (3, 4, 6)]
BOX_VARIANTS = [(2, 4, 6, 1, False), (2, 4, 6, 1, True), (2, 2, 6, 2, True), (2, 4, 6, 2, True), (2, 3, 6, 2, True),
                (4, 2, 6, 4, True), (4, 3, 4, 4, True), (4, 4, 4, 2, True), (4, 2, 4, 4, True), (8, 2, 4, 4, True),
                (8, 4, 4, 2, True)]
ROWS128_VARIANTS = [(4, 4, 4, 2, True, 64), (2, 2, 6, 2, True, 64), (4, 4, 2, 2, True, 128),
                    (4, 2, 2, 2, True, 128), (4, 3, 3, 2, True, 128), (8, 2, 2, 2, True, 128),
                    (2, 2, 3, 2, True, 128), (2, 4, 3, 2, True, 128)]
if "--box" in sys.argv:
    VARIANTS = BOX_VARIANTS
if "--rows128" in sys.argv:
    VARIANTS = ROWS128_VARIANTS
WIDE_VARIANTS = [(8, 2, 2, 2, True, 128), (8, 2, 1, 2, True, 128)]  # --wide: WIDE at 2 programs per SM and 1
if "--wide" in sys.argv:
    VARIANTS = WIDE_VARIANTS
DEEP_VARIANTS = [(4, 4, 4, 2, True, 64), (8, 2, 1, 2, True, 128), (16, 2, 1, 2, True, 128), (32, 2, 1, 2, True, 128),
                 (16, 3, 1, 2, True, 128), (16, 2, 2, 2, True, 64)]  # --deep: longer K slices (fewer atomics)
if "--deep" in sys.argv:
    VARIANTS = DEEP_VARIANTS
FINISH_VARIANTS = ["finish launch (PDL)", "finish here"]
SHORT_VARIANTS = [  # --short: where SHORT_INT4's sums are finished, at 6 and 5 programs per SM
    dict(name="shipped rule"), dict(name="finish launch (PDL)", FINISH_HERE=False),
    dict(name="finish launch (PDL), SHORT 6/SM", FINISH_HERE=False, SHORT_INT4=hopper_w4.Split(2, 2, 6)),
    dict(name="finish here, SHORT 6/SM", FINISH_HERE=True, SHORT_INT4=hopper_w4.Split(2, 2, 6)),
    dict(name="finish launch (PDL), SHORT 5/SM", FINISH_HERE=False, SHORT_INT4=hopper_w4.Split(2, 2, 5)),
    dict(name="finish here, SHORT 5/SM", FINISH_HERE=True, SHORT_INT4=hopper_w4.Split(2, 2, 5))]
if "--short" in sys.argv:
    VARIANTS = SHORT_VARIANTS
SUMS_VARIANTS = [dict(name="sums (N, BM), vector atomics", SUMS_T=True),
                 dict(name="sums (M, N), one atomic per value", SUMS_T=False)]  # --sums
if "--sums" in sys.argv:
    VARIANTS = SUMS_VARIANTS
ROWS_VARIANTS = [  # --short-rows: SHORT_INT4 (and its in-kernel finish) beyond two rows
    dict(name="shipped rule"), dict(name="SHORT_INT4 to 8 rows", SHORT_MAX_M=8),
    dict(name="SHORT_INT4 to 8 rows, finish here", SHORT_MAX_M=8, FINISH_HERE=True),
    dict(name="SHORT_INT4 to 8 rows, finish launch", SHORT_MAX_M=8, FINISH_HERE=False)]
if "--short-rows" in sys.argv:
    VARIANTS = ROWS_VARIANTS
OCCUPANCY_VARIANTS = [  # --occupancy: LONG against KS 4 slices with fewer loads in flight and more programs per SM
    (4, 4, 4, 2, True, 64), (4, 3, 5, 2, True, 64), (4, 2, 6, 2, True, 64), (4, 2, 5, 2, True, 64), (2, 2, 6, 2, True, 64)]
if "--occupancy" in sys.argv:
    VARIANTS = OCCUPANCY_VARIANTS
ROWS128_LONG_VARIANTS = [dict(name="shipped rule"), (4, 2, 3, 2, True, 128), (4, 3, 2, 2, True, 128)]
if "--rows128-long" in sys.argv:  # LONG's 6 x 64-row programs per SM against 3 (or 2) of 128 rows sharing x
    VARIANTS = ROWS128_LONG_VARIANTS
ONE_ROW_VARIANTS = [  # --one-row: SHORT_INT4 (KS 2, 2 loads, 5 per SM) against more programs or loads per SM
    dict(name="shipped rule"), (2, 2, 6, 2, True, 64), (2, 2, 7, 2, True, 64), (2, 3, 5, 2, True, 64),
    (2, 3, 6, 2, True, 64)]
if "--one-row" in sys.argv:
    VARIANTS = ONE_ROW_VARIANTS
LONG_AB_VARIANTS = [dict(name="shipped rule"),  # --long-ab: the shipped LONG against the one before it
                    dict(name="LONG before (KS 4, 4 loads, 4/SM)", LONG=hopper_w4.Split(4, 4, 4))]
if "--long-ab" in sys.argv:
    VARIANTS = LONG_AB_VARIANTS
LONG_WORK_VARIANTS = [dict(name="shipped rule"),  # --long-work: LONG at one to four rows on every layer
                      dict(name="LONG on every layer (LONG_WORK 0)", LONG_WORK=0),
                      dict(name="finish launch (no in-kernel finish)", FINISH_HERE=False)]
if "--long-work" in sys.argv:
    VARIANTS = LONG_WORK_VARIANTS
DEFAULTS = {k: getattr(hopper_w4, k) for k in ("SHORT", "SHORT_INT4", "LONG", "WIDE", "BOX_STEPS", "PDL",
                                              "FINISH_HERE", "SUMS_T", "SHORT_MAX_M", "LONG_WORK")}
if "--finish" in sys.argv:
    VARIANTS = FINISH_VARIANTS
ROTATE = 3
hopper_w4.DECODE_MAX_M, hopper_w4.MX_DECODE_MAX_M = 64, 64
real_ok = hopper_w4.w4_decode_ok


def calls_for(inps, variant):
    """One call per weight copy with the module constants of `variant` (None: the tl kernel)."""
    op = fp4 if FP4 else a16w4
    if variant is None:
        op.w4_decode_ok = lambda *a, **k: False
    elif isinstance(variant, dict):
        op.w4_decode_ok = real_ok
        for k, v in DEFAULTS.items():
            setattr(hopper_w4, k, variant.get(k, v))
    elif isinstance(variant, str):
        op.w4_decode_ok = real_ok
        hopper_w4.FINISH_HERE = variant == "finish here"
    else:
        op.w4_decode_ok = real_ok
        ks, stages, per_sm, hopper_w4.BOX_STEPS, hopper_w4.PDL, *bn = variant
        split = hopper_w4.Split(ks, stages, per_sm, *bn)
        hopper_w4.SHORT = hopper_w4.SHORT_INT4 = hopper_w4.LONG = hopper_w4.WIDE = split
    return probe_util.w4_plan_calls(inps, FP4, GROUP)[1]  # plans built now, with this variant's constants


print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {'MXFP4' if FP4 else f'INT4 g{GROUP} asymmetric'}, "
      f"{ROTATE} weight copies",
      file=out, flush=True)
for N, K in SHAPES:
    for M in M_LIST:
        torch.manual_seed(0)
        if FP4:
            inps = [registry._a16wfp4_inputs(M, N, K, "bf16", "cuda") for _ in range(ROTATE)]
        else:
            inps = [int4_inputs(M, N, K) for _ in range(ROTATE)]
        ref = inps[0]["x"].float() @ inps[0]["w16"].float().T
        wbytes = N * K / 2 + (N * K / 32 if FP4 else N * (K // GROUP) * (inps[0]["ws"].element_size() + 1))
        named = {"F.linear bf16": [lambda inp=inp: F.linear(inp["x"], inp["w16"]) for inp in inps]}
        for variant in [None] + VARIANTS:
            name = ("tl kernel (own pick)" if variant is None else variant if isinstance(variant, str)
                    else variant["name"] if isinstance(variant, dict)
                    else "decode KS~%d stages %d %d/SM box %d pdl %d" % variant[:5]
                    + (f" rows {variant[5]}" if len(variant) > 5 else ""))
            calls = calls_for(inps, variant)
            if isinstance(variant, str):
                split = hopper_w4.decode_split(M, N, K, device_info(inps[0]["x"].device), GROUP, FP4)
                name += f" ({split.slices} slices, {hopper_w4.finish_rounds(split, M, N)} round trips)"
            err = tune.rel_error(calls[0](), ref)
            if err > 1e-2:
                print(f"  {name}: wrong result (rel err {err:.2e})", file=out, flush=True)
                continue
            named[name] = calls
        names = list(named)
        times = time_graphs_us(*[named[n] for n in names], rep_ms=10, retries=3)
        print(f"M={M} N={N} K={K}:", file=out)
        for n, t in sorted(zip(names, times), key=lambda p: p[1]):
            print(f"  {t:9.1f} us  {times[0] / t:5.2f}x F.linear  {wbytes / t / 1e3:6.0f} GB/s  {n}", file=out,
                  flush=True)
        del inps, ref, named
        torch.cuda.empty_cache()
