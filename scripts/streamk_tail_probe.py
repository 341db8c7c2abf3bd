"""Probe (device tool): where a STREAM_K launch's time goes at medium M, and which tail split pays.

The host picks (tail tiles, K slices per tail tile) with core/dense.py `stream_k_tail`; this probe
replaces that choice per variant (the override is read when the plan is built, i.e. during warm-up
and capture, never during replay) and times each variant of one config against F.linear under
CUDA-graph replay, inputs rotated over 4 sets so the weights come from DRAM. Reference variants
time one whole wave alone (N cut to num_sms tiles) and the tail alone (N cut to the tail's tiles).

    python3 scripts/streamk_tail_probe.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core import config as config_mod  # noqa: E402
from gemmkit.core import dense  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import rel_error  # noqa: E402

_rule = dense.stream_k_tail
_override = {"value": None}


def _tail(num_tiles, k_tiles, num_sms):
    return _rule(num_tiles, k_tiles, num_sms) if _override["value"] is None else _override["value"]


dense.stream_k_tail = _tail
SETS = 4


def cfg(bm, bn, warps, stages):
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=8, num_warps=warps, num_stages=stages, TMA=True,
                PERSISTENT=True, EPILOGUE_SUBTILE=True, STREAM_K=True)


def variant(M, N, K, c, tail):
    """(calls over the rotated sets, checker) of gemm_a16w16(config=c) with the tail override."""
    xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5 for _ in range(SETS)]

    def run(i):
        _override["value"] = tail
        config_mod.clear_caches()
        try:
            return gemmkit.gemm_a16w16(xs[i], ws[i], config=c)
        finally:
            _override["value"] = None
            config_mod.clear_caches()

    err = rel_error(run(0), F.linear(xs[0].float(), ws[0].float()))
    return [lambda i=i: run(i) for i in range(SETS)], [lambda i=i: F.linear(xs[i], ws[i]) for i in range(SETS)], err


CASES = [
    # (M, N, K, config, [(label, N override or None, tail override or None)])
    (512, 4608, 4096, cfg(128, 128, 4, 6), [
        ("rule", None, None), ("dp (no tail)", None, (0, 1)), ("tail 12x2", None, (12, 2)),
        ("tail 12x4", None, (12, 4)), ("tail 12x8", None, (12, 8)), ("tail 12x11", None, (12, 11)),
        ("one wave alone (N=4224)", 4224, (0, 1)), ("tail tiles alone whole (N=384)", 384, (0, 1)),
        ("tail tiles alone 12x8 (N=384)", 384, (12, 8))]),
    (512, 4608, 4096, cfg(128, 256, 8, 3), [
        ("dp (72 tiles)", None, (0, 1)), ("72x2", None, (72, 2)), ("72x5", None, (72, 5)),
        ("72x7", None, (72, 7)), ("72x11", None, (72, 11))]),
    (512, 2560, 8192, cfg(128, 128, 4, 6), [
        ("dp (80 tiles)", None, (0, 1)), ("80x3", None, (80, 3)), ("80x5", None, (80, 5)),
        ("80x8", None, (80, 8)), ("80x13", None, (80, 13))]),
    (512, 2560, 8192, cfg(128, 256, 8, 3), [
        ("dp (40 tiles)", None, (0, 1)), ("40x3", None, (40, 3)), ("40x10", None, (40, 10)),
        ("40x13", None, (40, 13))]),
]

print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
for M, N, K, c, variants in CASES:
    print(f"M={M} N={N} K={K} {c['BLOCK_M']}x{c['BLOCK_N']}x64 w{c['num_warps']} s{c['num_stages']}", flush=True)
    lists, names = [], []
    for label, n_over, tail in variants:
        n = n_over or N
        ours, base, err = variant(M, n, K, c, tail)
        if err > 2e-2:
            print(f"  {label}: wrong result (rel err {err:.2e})", flush=True)
            continue
        lists += [ours, base]
        names.append((label, n))
    times = time_graphs_us(*lists, rep_ms=8, retries=5)
    for j, (label, n) in enumerate(names):
        t, tb = times[2 * j], times[2 * j + 1]
        print(f"  {t:7.1f} us  F.linear {tb:7.1f} us  ratio {tb / t:5.2f}  {2 * M * n * K / t / 1e6:6.0f} TFLOP/s  {label}",
              flush=True)
