"""Correctness of gemm_a8w8 (FP8 / INT8, tensor / token / channel scales, dynamic quantization)."""

import pytest
import torch

import gemmkit
from gemmkit import quant
from conftest import (ACT_REF, DEVICE, ON_GPU, assert_close, check_refused, kernel_paths, poisoned, randn, reference,
                      sizes)

E4M3, E5M2, INT8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.int8
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

PATHS = {k: v for k, v in kernel_paths(gpu_block_k=128).items() if k != "tma_warp_specialized"}
RAGGED = sizes([(1, 40, 80), (45, 70, 112), (33, 17, 8), (64, 64, 128)],
               [(1, 4096, 4096), (200, 333, 1024), (1024, 1024, 1024), (300, 500, 40)])


def check(out, ref, x_dtype):
    """fp8 dots accumulate with Hopper's fast (reduced-precision) accumulation, Triton's sm_90
    default: an fp32 output shows it."""
    fast_accum = ON_GPU and x_dtype in (E4M3, E5M2) and out.dtype == FP32
    assert_close(out, ref, tol=2e-3 if fast_accum else None)


def operand(rows, K, dtype):
    if dtype == INT8:
        return torch.randint(-127, 128, (rows, K), device=DEVICE, dtype=torch.int8)
    return randn(rows, K, dtype=FP32, scale=2.0).to(dtype)


def scales(M, N, x_gran, w_gran):
    xs = {"tensor": lambda: torch.rand((), device=DEVICE) + 0.5,
          "tensor1": lambda: torch.rand(1, device=DEVICE) + 0.5,
          "tensor111": lambda: torch.rand(1, 1, 1, device=DEVICE) + 0.5,
          "row": lambda: torch.rand(M, 1, device=DEVICE) + 0.5,
          "row1d": lambda: torch.rand(M, device=DEVICE) + 0.5}[x_gran]()
    ws = {"tensor": lambda: torch.rand((), device=DEVICE) + 0.5,
          "tensor111": lambda: torch.rand(1, 1, 1, device=DEVICE) + 0.5,
          "col": lambda: torch.rand(1, N, device=DEVICE) + 0.5,
          "col1d": lambda: torch.rand(N, device=DEVICE) + 0.5,
          "colT": lambda: torch.rand(N, 1, device=DEVICE) + 0.5}[w_gran]()
    return xs, ws


@pytest.mark.parametrize("x_dtype,w_dtype", [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3), (E5M2, E5M2), (INT8, INT8)])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("M,N,K", RAGGED)
def test_paths_dtypes_ragged(x_dtype, w_dtype, path, M, N, K):
    x, w = operand(M, K, x_dtype), operand(N, K, w_dtype)
    xs, ws = scales(M, N, "row", "col")
    bias = randn(N, dtype=BF16)
    y = poisoned((M, N), BF16)
    out = gemmkit.gemm_a8w8(x, w, xs, ws, bias, y=y, config=PATHS[path])
    assert out is y
    assert_close(out, reference(x, w, bias, x_scale=xs, w_scale=ws))


@pytest.mark.parametrize("x_gran", ["tensor", "tensor1", "tensor111", "row", "row1d"])
@pytest.mark.parametrize("w_gran", ["tensor", "tensor111", "col", "col1d", "colT"])
@pytest.mark.parametrize("dtype", [E4M3, INT8])
def test_scale_granularities(x_gran, w_gran, dtype):
    M, N, K = sizes((19, 40, 96), (300, 1000, 512))
    x, w = operand(M, K, dtype), operand(N, K, dtype)
    xs, ws = scales(M, N, x_gran, w_gran)
    out = gemmkit.gemm_a8w8(x, w, xs, ws, out_dtype=FP32)
    check(out, reference(x, w, x_scale=xs, w_scale=ws), dtype)


@pytest.mark.parametrize("out_dtype", [BF16, FP16, FP32])
@pytest.mark.parametrize("activation", [None, "relu", "gelu_tanh", "silu"])
def test_out_dtype_bias_activation(out_dtype, activation):
    M, N, K = sizes((17, 48, 64), (257, 520, 1024))
    x, w = operand(M, K, E4M3), operand(N, K, E4M3)
    xs, ws = scales(M, N, "row", "col")
    bias = randn(N, dtype=FP32)
    out = gemmkit.gemm_a8w8(x, w, xs, ws, bias, activation=activation, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    check(out, reference(x, w, bias, activation, x_scale=xs, w_scale=ws), E4M3)


@pytest.mark.parametrize("w_dtype", [E4M3, E5M2, INT8])
@pytest.mark.parametrize("M", sizes([1, 5, 16, 17, 70], [1, 16, 17, 64, 256]))
@pytest.mark.parametrize("path", [None, "ptr_small_m", "ptr_splitk", "tma"])
@pytest.mark.parametrize("capturing", [False, True], ids=["eager", "graph"])
def test_dynamic_per_token(w_dtype, M, path, capturing, monkeypatch):
    """x in bf16 with x_scale=None: quantized per token inside the GEMM (small M, eager) or by the
    quantizer first (large M, or under graph capture). Same result as quantizing explicitly (same
    rounding code), and close to the unquantized product."""
    from gemmkit.ops import a8w8

    monkeypatch.setattr(a8w8, "capturing", lambda: capturing)
    N, K = sizes((40, 96), (1000, 2048))
    x = randn(M, K, dtype=BF16)
    w = operand(N, K, w_dtype)
    ws = torch.rand(1, N, device=DEVICE) + 0.5
    bias = randn(N, dtype=FP32)
    cfg = None if path is None else PATHS[path]
    out = gemmkit.gemm_a8w8(x, w, None, ws, bias, activation="silu", config=cfg)
    fused_split = path == "ptr_splitk" and not capturing and M <= a8w8.FUSED_QUANT_MAX_M
    assert_close(out, dynamic_reference(x, w, ws, bias, "silu", cfg if fused_split else None))
    full = reference(x, w, bias, "silu", w_scale=ws)
    assert ((out.double() - full).norm() / full.norm()) < {E4M3: 0.1, E5M2: 0.2, INT8: 0.03}[w_dtype]


def dynamic_reference(x, w, ws, bias=None, activation=None, split_cfg=None):
    """float64 reference of the dynamic path: x quantized per token with gemmkit's quantizer, or,
    where the GEMM quantizes x itself with split-K (`split_cfg`), per token within each K slice
    (each slice scans and scales only its own range)."""
    quantize = quant.quantize_int8 if w.dtype == INT8 else (lambda t: quant.quantize_fp8(t, "row", w.dtype))
    K = x.shape[1]
    bounds = [0, K]
    if split_cfg is not None:
        bk = split_cfg["BLOCK_K"]
        per = -(-(-(-K // bk)) // split_cfg["SPLIT_K"]) * bk
        bounds = list(range(0, K, per)) + [K]
    acc = 0
    for lo, hi in zip(bounds, bounds[1:]):
        xq, xs = quantize(x[:, lo:hi].contiguous())
        acc = acc + reference(xq, w[:, lo:hi], x_scale=xs)
    acc = acc * ws.double().reshape(1, -1)
    if bias is not None:
        acc = acc + bias.double()
    return ACT_REF[activation or "none"](acc)


def test_leading_dims_and_reuse():
    K, N = 64, 24
    w = operand(N, K, E4M3)
    ws = torch.rand(N, device=DEVICE) + 0.5
    for _ in range(3):  # the cached plan on fresh data
        x = operand(6, K, E4M3)
        xs = torch.rand(6, 1, device=DEVICE) + 0.5
        for x_scale in (xs, xs.view(6), xs.view(2, 3, 1), xs.view(2, 3)):  # (*, 1) as quantize_fp8 returns it
            out = gemmkit.gemm_a8w8(x.view(2, 3, K), w, x_scale, ws)
            assert out.shape == (2, 3, N)
            assert_close(out.reshape(6, N), reference(x, w, x_scale=xs, w_scale=ws))


@pytest.mark.parametrize("dynamic", [False, True])
def test_empty_k_with_leading_dims(dynamic):
    """K == 0 with x (*, 0): activation(bias) (the row count comes from x's leading shape)."""
    w = torch.empty(8, 0, dtype=E4M3, device=DEVICE)
    bias = randn(8, dtype=FP32)
    for lead in ((2, 3), ()):
        x = torch.empty(*lead, 0, dtype=BF16 if dynamic else E4M3, device=DEVICE)
        xs = None if dynamic else _ones(())
        out = gemmkit.gemm_a8w8(x, w, xs, _ones(8), bias, activation="relu", out_dtype=FP32)
        torch.testing.assert_close(out, torch.relu(bias).expand(*lead, 8))


def test_block_k_below_32_refused_for_8_bit():
    """Triton refuses 8-bit dots with K < 32 on the GPU (the interpreter would run them)."""
    x, w = _e4(4, 32), _e4(8, 32)
    with pytest.raises(ValueError, match="BLOCK_K"):
        gemmkit.gemm_a8w8(x, w, _ones(()), _ones(8), config=dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16))
    x8 = operand(3, 8, INT8)  # K = 8: the derived config still uses BLOCK_K = 32, masked
    w8 = operand(16, 8, INT8)
    out = gemmkit.gemm_a8w8(x8, w8, _ones(()), _ones(16), out_dtype=FP32)
    assert_close(out, reference(x8, w8, x_scale=_ones(()), w_scale=_ones(16)))


def test_autograd_scales_and_y_refused():
    x, w = _e4(4, 32), _e4(8, 32)
    for name, args, kwargs in (
        ("x_scale", (_ones(()).requires_grad_(), _ones(8)), {}),
        ("w_scale", (_ones(()), _ones(8).requires_grad_()), {}),
        ("y", (_ones(()), _ones(8)), {"y": torch.zeros(4, 8, dtype=BF16, device=DEVICE, requires_grad=True)}),
    ):
        with pytest.raises(ValueError, match=f"{name} requires grad"):
            gemmkit.gemm_a8w8(x, w, *args, **kwargs)
    with pytest.raises(ValueError, match="scale requires grad"):
        quant.quantize_fp8(randn(4, 8, dtype=FP32), "tensor", scale=_ones(()).requires_grad_())


def _e4(M, K):
    return operand(M, K, E4M3)


def _ones(*shape, dtype=FP32):
    return torch.ones(*shape, dtype=dtype, device=DEVICE)


BAD = {
    "w bf16": (lambda: (_e4(4, 32), randn(8, 32, dtype=BF16), _ones(()), _ones(())), TypeError, "w"),
    "int8 with fp8": (lambda: (operand(4, 32, INT8), _e4(8, 32), _ones(()), _ones(())), TypeError, "int8"),
    "x fp32": (lambda: (randn(4, 32, dtype=FP32), _e4(8, 32), None, _ones(())), TypeError, "x"),
    "x_scale missing": (lambda: (_e4(4, 32), _e4(8, 32), None, _ones(())), ValueError, "x_scale"),
    "x_scale for bf16 x": (lambda: (randn(4, 32, dtype=BF16), _e4(8, 32), _ones(()), _ones(())), ValueError, "x_scale"),
    "x_scale shape": (lambda: (_e4(4, 32), _e4(8, 32), _ones(5, 1), _ones(())), ValueError, "x_scale"),
    "x_scale 2 cols": (lambda: (_e4(4, 32), _e4(8, 32), _ones(4, 2), _ones(())), ValueError, "x_scale"),
    "x_scale as a row": (lambda: (_e4(4, 32), _e4(8, 32), _ones(1, 4), _ones(())), ValueError, "x_scale"),
    "x_scale strided": (lambda: (_e4(4, 32), _e4(8, 32), _ones(4, 2)[:, :1], _ones(())), ValueError, "contiguous"),
    "x_scale 3-D for 2-D x": (lambda: (_e4(6, 32), _e4(8, 32), _ones(2, 3, 1), _ones(())), ValueError, "x_scale"),
    "x_scale fp16": (lambda: (_e4(4, 32), _e4(8, 32), _ones(4, 1, dtype=FP16), _ones(())), TypeError, "x_scale"),
    "w_scale shape": (lambda: (_e4(4, 32), _e4(8, 32), _ones(()), _ones(2, 8)), ValueError, "w_scale"),
    "w_scale strided": (lambda: (_e4(4, 32), _e4(8, 32), _ones(()), _ones(16)[::2]), ValueError, "w_scale"),
    "w_scale missing": (lambda: (_e4(4, 32), _e4(8, 32), _ones(()), None), TypeError, "w_scale"),
    "x not K-contiguous": (lambda: (_e4(32, 4).t(), _e4(8, 32), _ones(()), _ones(())), ValueError, "K-contiguous"),
    "w not K-contiguous": (lambda: (_e4(4, 32), _e4(32, 8).t(), _ones(()), _ones(())), ValueError, "K-contiguous"),
    "K mismatch": (lambda: (_e4(4, 32), _e4(8, 16), _ones(()), _ones(())), ValueError, "K"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(case, monkeypatch):
    make, exc, word = BAD[case]
    check_refused(monkeypatch, gemmkit.gemm_a8w8, make(), exc, word)


def test_dynamic_dispatch(monkeypatch):
    """Which kernels a dynamic call launches: one fused GEMM when eager with small M and weight;
    the quantizer then the GEMM under graph capture, for large M or for a large weight."""
    from gemmkit.core import launcher
    from gemmkit.ops import a8w8

    launched = []
    real_jit, real_compiled = launcher.launch_jit, launcher.launch_compiled
    monkeypatch.setattr(launcher, "launch_jit", lambda fn, *a: (launched.append(fn.__name__), real_jit(fn, *a))[1])
    monkeypatch.setattr(launcher, "launch_compiled", lambda k, *a: (launched.append(k.name), real_compiled(k, *a))[1])
    real_direct = launcher.launch_direct
    monkeypatch.setattr(launcher, "launch_direct", lambda d, *a: (launched.append(d[0].name), real_direct(d, *a))[1])
    N, K = 40, 64
    w = operand(N, K, E4M3)
    ws = torch.rand(1, N, device=DEVICE) + 0.5
    capture = [False]
    monkeypatch.setattr(a8w8, "capturing", lambda: capture[0])

    def kernels(M, capturing=False, max_weight=a8w8.FUSED_QUANT_MAX_WEIGHT):
        a8w8._plans.clear()
        monkeypatch.setattr(a8w8, "FUSED_QUANT_MAX_WEIGHT", max_weight)
        capture[0] = capturing
        launched.clear()
        x = randn(M, K, dtype=BF16)
        out = gemmkit.gemm_a8w8(x, w, None, ws)
        names = list(launched)
        xq, xs = quant.quantize_fp8(x, "row")
        assert_close(out, reference(xq, w, x_scale=xs, w_scale=ws))
        return names

    assert kernels(8) == ["gemm_kernel"]
    assert kernels(8, capturing=True) == ["quantize_rows_kernel", "gemm_kernel"]
    assert kernels(8, max_weight=N * K - 1) == ["gemm_kernel"]  # M <= 16: fused whatever the weight
    assert kernels(20) == ["gemm_kernel"]
    assert kernels(20, max_weight=N * K - 1) == ["quantize_rows_kernel", "gemm_kernel"]
    assert kernels(a8w8.FUSED_QUANT_MAX_M + 1) == ["quantize_rows_kernel", "gemm_kernel"]


@pytest.mark.parametrize("M", [1, 16, 33])
def test_fused_dynamic_gemm_with_split_k(M):
    """The always-fused entry point (what the tuner measures): per-token quantization inside the
    GEMM, also with split-K and stream-K, where each piece quantizes and scales its own K range
    (its absmax pass reads only that range) before the pieces are summed."""
    from gemmkit.ops.a8w8 import fused_dynamic_gemm

    N, K = sizes((40, 200), (1000, 4096))
    x = randn(M, K, dtype=BF16)
    w = operand(N, K, E4M3)
    ws = torch.rand(1, N, device=DEVICE) + 0.5
    assert_close(fused_dynamic_gemm(x, w, ws, config=PATHS["ptr_small_m"]), dynamic_reference(x, w, ws))
    assert_close(fused_dynamic_gemm(x, w, ws, config=PATHS["ptr_splitk"]),
                 dynamic_reference(x, w, ws, split_cfg=PATHS["ptr_splitk"]))
    # stream-K pieces are quantized on their own too: within FP8's error of the unquantized product
    full = reference(x, w, w_scale=ws)
    out = fused_dynamic_gemm(x, w, ws, config=PATHS["ptr_streamk"])
    assert ((out.double() - full).norm() / full.norm()) < 0.1
