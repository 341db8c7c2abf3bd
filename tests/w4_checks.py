"""Checks shared by the Hopper 4-bit kernels' GPU tests (tests/test_w4_decode.py, tests/test_w4_prefill.py):
each runs gemm_a16w4 / gemm_a16wfp4 on fresh random data at the rows given (the caller's rule routes them
to its kernel) and compares with float64 references of the dequantized weights; `built` is the caller's
fixture's list of the plans built."""

import pytest
import torch

import gemmkit
from gemmkit import quant
from gemmkit.core import hopper_ws
from conftest import DEVICE, assert_close, poisoned, randn, reference, replay_with_new_inputs

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
ACTIVATIONS = {"relu": torch.relu, "silu": torch.nn.functional.silu,
               "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}


def int4_weight(N, K, group_size, symmetric=False, dtype=BF16):
    """(packed q, scales, zero points, float64 dequantization): quantize_int4's groups (32, 64, 128,
    per channel), other groups from random codes, scales and zero points."""
    if group_size in (32, 64, 128, None):
        w = randn(N, K, dtype=FP32, scale=K**-0.5).to(dtype)
        q, s, z = quant.quantize_int4(w, group_size, symmetric)
        return q, s, z, quant.dequantize_int4(q, s, z, group_size, torch.float64)
    codes = torch.randint(0, 16, (N, K), dtype=torch.uint8, device=DEVICE)
    q = codes[:, 0::2] | (codes[:, 1::2] << 4)
    s = (torch.rand(N, K // group_size, device=DEVICE) * 0.02 + 0.005).to(dtype)
    z = torch.randint(0, 16, (N, K // group_size), dtype=torch.uint8, device=DEVICE)
    zz = torch.full_like(z, 8) if symmetric else z
    wd = (codes.double() - zz.double().repeat_interleave(group_size, 1)) * s.double().repeat_interleave(group_size, 1)
    return q, s, z, wd


def groups_and_dtypes(test):
    """Parametrize a test over INT4 groups (32, 64, 128, 256, per channel), symmetric or not, bf16 / fp16."""
    for name, values in (("group_size", [32, 64, 128, 256, None]), ("symmetric", [False, True]),
                         ("dtype", [BF16, FP16])):
        test = pytest.mark.parametrize(name, values)(test)
    return test


def activations_and_out_dtypes(test):
    """Parametrize a test over the activations and bf16 / fp32 outputs."""
    test = pytest.mark.parametrize("activation", list(ACTIVATIONS))(test)
    return pytest.mark.parametrize("out_dtype", [BF16, FP32])(test)


def check_shape(built, M, N, K):
    """INT4 g128 into a poisoned preallocated y."""
    x = randn(M, K, dtype=BF16)
    q, s, z, wd = int4_weight(N, K, 128)
    y = poisoned((M, N), BF16)
    out = gemmkit.gemm_a16w4(x, q, s, z, group_size=128, y=y)
    assert out is y and len(built) == 1
    assert_close(out, reference(x, wd))


def check_group_and_dtype(built, M, group_size, symmetric, dtype):
    N, K = 333, 2048
    x = randn(M, K, dtype=dtype)
    q, s, z, wd = int4_weight(N, K, group_size, symmetric, dtype)
    out = gemmkit.gemm_a16w4(x, q, s, None if symmetric else z, group_size=group_size)
    assert len(built) == 1 and out.dtype == dtype
    assert_close(out, reference(x, wd))


def check_bias_activation_out_dtype_3d(built, rows, activation, out_dtype, tol=None):
    """x (2, rows, 1024), fp32 bias and scales."""
    x = randn(2, rows, 1024, dtype=BF16)
    q, s, z, wd = int4_weight(640, 1024, 128)
    bias = randn(640, dtype=FP32)
    out = gemmkit.gemm_a16w4(x, q, s.float(), z, group_size=128, bias=bias, activation=activation,
                             out_dtype=out_dtype)
    assert len(built) == 1 and out.shape == (2, rows, 640) and out.dtype == out_dtype
    ref = ACTIVATIONS[activation](reference(x.reshape(2 * rows, 1024), wd, bias)).reshape(2, rows, 640)
    assert_close(out, ref, tol=tol)


def check_strided(built, x, N):
    """x as given (strided rows, column-major), y a column slice of a wider buffer, scales and zero points
    transposed views; nothing outside y written."""
    M, K = x.shape
    q, s, z, wd = int4_weight(N, K, 128)
    s_t, z_t = s.t().contiguous().t(), z.t().contiguous().t()
    buf = poisoned((M, N + 24), BF16)
    y = buf[:, 8:8 + N]
    out = gemmkit.gemm_a16w4(x, q, s_t, z_t, group_size=128, y=y)
    assert out is y and len(built) == 1
    assert_close(out, reference(x, wd))
    assert torch.isnan(buf[:, :8]).all() and torch.isnan(buf[:, 8 + N:]).all()


def check_mxfp4(built, M, N, K):
    """gemm_a16wfp4 into a poisoned preallocated y; returns the plan."""
    x = randn(M, K, dtype=BF16)
    wq, ws = quant.quantize_mxfp4(randn(N, K, dtype=FP32, scale=K**-0.5))
    y = poisoned((M, N), BF16)
    out = gemmkit.gemm_a16wfp4(x, wq, ws, y=y)
    assert out is y and len(built) == 1
    assert_close(out, reference(x, quant.dequantize_mxfp4(wq, ws, torch.float64)))
    return built[0]


def check_mxfp4_extreme_scales(built, M):
    """Scales at the ends of the e8m0 range (2^-127 .. 2^100 here) stay exact. Returns x and the weight."""
    N, K = 256, 512
    x = randn(M, K, dtype=BF16)
    wq, ws = quant.quantize_mxfp4(randn(N, K, dtype=FP32, scale=K**-0.5))
    ws = ws.clone()
    ws[:, 0] = 0
    ws[:, 1] = 227
    assert_close(gemmkit.gemm_a16wfp4(x, wq, ws), reference(x, quant.dequantize_mxfp4(wq, ws, torch.float64)))
    assert len(built) == 1
    return x, wq, ws


def check_cuda_graph(built, M):
    """Captured once, replayed with new x."""
    x = randn(M, 2048, dtype=BF16)
    q, s, z, wd = int4_weight(1536, 2048, 128)
    gemmkit.gemm_a16w4(x, q, s, z, group_size=128)  # plan built and compiled outside the capture
    x2 = randn(M, 2048, dtype=BF16)
    out = replay_with_new_inputs(lambda: gemmkit.gemm_a16w4(x, q, s, z, group_size=128), lambda: x.copy_(x2),
                                 replays=2)
    assert len(built) == 1
    assert_close(out, reference(x2, wd))


def check_not_taken_off_hopper(built, M, ok):
    """On the CPU (the interpreter) or another GPU another kernel serves the call; ok(dev, x, q, M, N, K,
    group, config) is the kernel's rule, which must say no."""
    from gemmkit.core.device import device_info

    x = randn(M, 256, dtype=BF16)
    q, s, z, wd = int4_weight(64, 256, 128)
    assert_close(gemmkit.gemm_a16w4(x, q, s, z, group_size=128), reference(x, wd))
    assert not built
    assert not ok(device_info(x.device), x, q, M, 64, 256, 128, None)


def check_disabled_by_env(built, monkeypatch, M):
    monkeypatch.setenv(hopper_ws.GLUON_ENV, "0")
    x = randn(M, 1024, dtype=BF16)
    q, s, z, wd = int4_weight(512, 1024, 128)
    assert_close(gemmkit.gemm_a16w4(x, q, s, z, group_size=128), reference(x, wd))
    assert not built


def format_call(fmt, M, N, K, y=None, bias=False, activation=None, out_dtype=None):
    """gemm_a16w4 / gemm_a16wfp4 on fresh data of one of the formats the kernels' tests sweep ("mxfp4", or
    "int4" with "g32" / "g64" (else groups of 128) and "fp16" (else bf16 x)): (out, float64 reference)."""
    if fmt.startswith("mxfp4"):
        x = randn(M, K, dtype=BF16)
        wq, ws = quant.quantize_mxfp4(randn(N, K, dtype=FP32, scale=K**-0.5))
        out = gemmkit.gemm_a16wfp4(x, wq, ws, y=y)
        return out, reference(x, quant.dequantize_mxfp4(wq, ws, torch.float64))
    group = 32 if "g32" in fmt else 64 if "g64" in fmt else 128
    dtype = FP16 if "fp16" in fmt else BF16
    x = randn(M, K, dtype=dtype)
    q, s, z, wd = int4_weight(N, K, group, dtype=dtype)
    b = randn(N, dtype=dtype) if bias else None
    out = gemmkit.gemm_a16w4(x, q, s, z, group_size=group, bias=b, activation=activation, out_dtype=out_dtype, y=y)
    ref = reference(x, wd, b)
    return out, (ACTIVATIONS[activation](ref) if activation else ref)
