"""Probe (device tool): gemm_a16w16 at medium M on held-out layers whose tile counts leave a ragged
last wave (models.json heldout-*), with explicit configs (data-parallel, stream-K, split-K,
narrower tiles) against F.linear (cuBLAS) and gemm_a16w16's own pick, under CUDA-graph replay.

--tuned: instead, the device's (H100 or H200) table entries that pick STREAM_K (A16W16 and
row-wise FP8), each op's own pick against F.linear / torch._scaled_mm with fast accumulation (run
it in two trees to compare two stream-K schedules on the same entries).

--large: instead, held-out problems at M = 2048 and 8192, A16W16 and row-wise FP8, the derived
config against the 128x256 / 128x128 / 256x128 families the tuned tables pick at large M.

Usage: python3 scripts/medium_m_probe.py [OUT_FILE] [--tuned | --large]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.tools import tune  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from probe_util import a16w16_config_calls, checked_calls  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
out = open(args[0], "w") if args else sys.stdout
TUNED = "--tuned" in sys.argv
LARGE = "--large" in sys.argv
LARGE_SHAPES = [(8192, 28672, 3584), (8192, 3584, 4096), (8192, 9216, 3072), (2048, 5120, 4096), (8192, 8192, 2048),
                (2048, 4608, 4096), (8192, 16384, 3072), (2048, 28672, 3584)]


def large_configs(bk):
    base = dict(BLOCK_K=bk, num_warps=8, TMA=True, PERSISTENT=True)
    return {
        "128x256 s3": dict(base, BLOCK_M=128, BLOCK_N=256, num_stages=3),
        "128x256 s3 stream-K": dict(base, BLOCK_M=128, BLOCK_N=256, num_stages=3, STREAM_K=True),
        "128x256 s3 subtile stream-K": dict(base, BLOCK_M=128, BLOCK_N=256, num_stages=3, EPILOGUE_SUBTILE=True,
                                            STREAM_K=True),
        "128x256 s4 subtile stream-K": dict(base, BLOCK_M=128, BLOCK_N=256, num_stages=4, EPILOGUE_SUBTILE=True,
                                            STREAM_K=True),
        "128x128 s4 stream-K": dict(base, BLOCK_M=128, BLOCK_N=128, num_stages=4, STREAM_K=True),
        "256x128 s3 stream-K": dict(base, BLOCK_M=256, BLOCK_N=128, num_stages=3, EPILOGUE_SUBTILE=True,
                                    STREAM_K=True),
    }
if "H200" in torch.cuda.get_device_name():  # the NVIDIA_H200 tables' STREAM_K entries
    TUNED_BF16 = [(4096, 24576, 4096), (4096, 28672, 4096), (256, 51200, 5120), (256, 59136, 8192)]
    TUNED_FP8 = [(4096, 2112, 7168), (256, 51200, 5120), (1024, 51200, 5120), (4096, 51200, 5120),
                 (4096, 57344, 8192)]
else:
    TUNED_BF16 = [(4096, 28672, 4096), (256, 36864, 7168), (256, 51200, 5120), (4096, 51200, 5120)]
    TUNED_FP8 = [(1024, 51200, 5120), (4096, 51200, 5120), (8192, 57344, 8192)]
SHAPES = [(512, 5120, 14336), (512, 4608, 4096), (512, 4608, 36864), (128, 5120, 14336), (128, 4608, 4096),
          (2048, 1280, 8192), (512, 5120, 5120), (128, 3072, 8192), (512, 2560, 8192), (2048, 5120, 4096),
          (512, 3072, 3072), (2048, 4608, 4096)]
TMA = dict(TMA=True)
CONFIGS = {
    "128x128x64 w8 s4 persistent": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4,
                                        PERSISTENT=True, EPILOGUE_SUBTILE=True, **TMA),
    "128x128x64 w8 s4 stream-K": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4,
                                      PERSISTENT=True, STREAM_K=True, EPILOGUE_SUBTILE=True, **TMA),
    "128x256x64 w8 s3 persistent": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3,
                                        PERSISTENT=True, EPILOGUE_SUBTILE=True, **TMA),
    "128x256x64 w8 s3 stream-K": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3,
                                      PERSISTENT=True, STREAM_K=True, EPILOGUE_SUBTILE=True, **TMA),
    "128x128x64 w4 s4 stream-K": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4,
                                      PERSISTENT=True, STREAM_K=True, EPILOGUE_SUBTILE=True, **TMA),
    "64x128x64 w4 s6 persistent": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=6,
                                       PERSISTENT=True, **TMA),
    "64x256x64 w8 s4 persistent": dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=4,
                                       PERSISTENT=True, **TMA),
    "128x128x64 w8 s4 split-K 2": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4,
                                       SPLIT_K=2, **TMA),
    "128x64x64 w4 s6 persistent": dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=6,
                                       PERSISTENT=True, **TMA),
    "64x128x64 w4 s6 stream-K": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=6,
                                     PERSISTENT=True, STREAM_K=True, **TMA),
}

def report(M, N, K, names, times):
    base = times[0]
    print(f"M={M} N={N} K={K}:", file=out)
    for n, t in sorted(zip(names, times), key=lambda p: p[1]):
        print(f"  {t:9.1f} us  {base / t:5.2f}x {names[0]}  {2 * M * N * K / t / 1e6:6.0f} TFLOP/s  {n}", file=out,
              flush=True)


def tuned():
    from gemmkit.quant import quantize_fp8

    for M, N, K in TUNED_BF16:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
        assert tune.rel_error(gemmkit.gemm_a16w16(x, w), x.float() @ w.float().T) < 1e-2
        names = ["F.linear", "gemm_a16w16 (table)"]
        report(M, N, K, names, time_graphs_us([lambda: F.linear(x, w)], [lambda: gemmkit.gemm_a16w16(x, w)],
                                              rep_ms=10, retries=3))
        del x, w
    for M, N, K in TUNED_FP8:
        (xq, xs), (wq, ws) = quantize_fp8(torch.randn(M, K, device="cuda"), "row"), quantize_fp8(
            torch.randn(N, K, device="cuda"), "row")
        ws = ws.reshape(1, N)
        ref = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16, use_fast_accum=True)
        assert tune.rel_error(gemmkit.gemm_a8w8(xq, wq, xs, ws), ref.float()) < 1e-2
        names = ["_scaled_mm fast", "gemm_a8w8 (table)"]
        report(M, N, K, names, time_graphs_us(
            [lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16,
                                      use_fast_accum=True)],
            [lambda: gemmkit.gemm_a8w8(xq, wq, xs, ws)], rep_ms=10, retries=3))
        del xq, wq
    torch.cuda.empty_cache()


def held_out():
    for M, N, K in SHAPES:
        calls = a16w16_config_calls(M, N, K, CONFIGS, out)
        names = list(calls)
        report(M, N, K, names, time_graphs_us(*[[calls[n]] for n in names], rep_ms=10, retries=3))
        del calls
        torch.cuda.empty_cache()


def large():
    from gemmkit.quant import quantize_fp8

    for M, N, K in LARGE_SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
        (xq, xs), (wq, ws) = quantize_fp8(x, "row"), quantize_fp8(w, "row")
        ws = ws.reshape(1, N)
        for fp8 in (False, True):
            if fp8:
                ref = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16,
                                       use_fast_accum=True).float()
                run = lambda cfg=None: gemmkit.gemm_a8w8(xq, wq, xs, ws, config=cfg)  # noqa: E731
                calls = {"_scaled_mm fast": lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws,
                                                                     out_dtype=torch.bfloat16, use_fast_accum=True)}
            else:
                ref = x.float() @ w.float().T
                run = lambda cfg=None: gemmkit.gemm_a16w16(x, w, config=cfg)  # noqa: E731
                calls = {"F.linear": lambda: F.linear(x, w)}
            calls["own pick"] = run
            checked_calls(calls, large_configs(128 if fp8 else 64), run, ref, out, 1e-2)
            names = list(calls)
            print("FP8" if fp8 else "BF16", end=" ", file=out)
            report(M, N, K, names, time_graphs_us(*[[calls[n]] for n in names], rep_ms=10, retries=3))
        del x, w, xq, wq
        torch.cuda.empty_cache()


print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, gemmkit from {os.path.dirname(gemmkit.__file__)}",
      file=out)
tuned() if TUNED else large() if LARGE else held_out()
