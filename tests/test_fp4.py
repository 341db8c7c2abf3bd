"""Correctness of the MXFP4 GEMMs (gemm_a16wfp4, gemm_afp4wfp4), MXFP4Linear, the 4-bit custom
ops and tool ops, against float64 references of the dequantized operands."""

import pytest
import torch
from torch import nn

import gemmkit
import gemmkit.nn as gnn
from gemmkit import quant
from gemmkit.tools import registry as tools
from conftest import DEVICE, assert_close, kernel_paths, poisoned, randn, reference, sizes

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
PATHS = {k: v for k, v in kernel_paths(gpu_block_k=64).items() if k != "tma_warp_specialized"}
SHAPE = sizes((20, 40, 128), (200, 333, 1024))
A16_PATHS = sizes(["ptr", "ptr_small_m", "ptr_splitk", "ptr_streamk", "tma", "tma_persistent_subtile",
                   "tma_streamk_small_m"], list(PATHS))


def mx(rows, K, scale=1.0):
    t = randn(rows, K, dtype=FP32, scale=scale)
    q, s = quant.quantize_mxfp4(t)
    return q, s, quant.dequantize_mxfp4(q, s, torch.float64)


@pytest.mark.parametrize("path", A16_PATHS)
def test_a16wfp4_paths(path):
    M, N, K = SHAPE
    x = randn(M, K, dtype=BF16)
    w, ws, wd = mx(N, K, K**-0.5)
    bias = randn(N, dtype=FP32)
    y = poisoned((M, N), BF16)
    out = gemmkit.gemm_a16wfp4(x, w, ws, bias=bias, y=y, config=PATHS[path])
    assert out is y
    assert_close(out, reference(x, wd, bias))


@pytest.mark.parametrize("path", ["ptr_small_m", "ptr_splitk", "ptr_streamk"])
def test_afp4wfp4_paths(path):
    M, N, K = SHAPE
    x, xs, xd = mx(M, K)
    w, ws, wd = mx(N, K, K**-0.5)
    out = gemmkit.gemm_afp4wfp4(x, w, xs, ws, config=PATHS[path])
    assert out.dtype == BF16
    assert_close(out, reference(xd, wd))


def test_m1_fp16_3d_and_activation():
    K, N = 64, 24
    x = randn(1, K, dtype=FP16)
    w, ws, wd = mx(N, K)
    assert_close(gemmkit.gemm_a16wfp4(x, w, ws, activation="relu"), reference(x, wd, activation="relu"))
    xq, xs, xd = mx(6, K)
    out = gemmkit.gemm_afp4wfp4(xq.reshape(2, 3, K // 2), w, xs.reshape(2, 3, K // 32), ws, out_dtype=FP32)
    assert out.shape == (2, 3, N)
    assert_close(out.reshape(6, N), reference(xd, wd), tol=1e-3)  # (bf16 dots of exact bf16 values)
    empty = gemmkit.gemm_afp4wfp4(xq[:0].reshape(0, 3, K // 2), w, xs[:0].reshape(0, 3, K // 32), ws)
    assert empty.shape == (0, 3, N)  # (no rows in a 3-D x: its scales' (0, K // 32) view)


@pytest.mark.parametrize("config", [None, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=3)])
def test_every_code_and_extreme_scales(config):
    """All 16 e2m1 codes in every column position, scales 2^-127 (e8m0 0, subnormal), 2^-100,
    2^0 and 2^100, and a NaN scale (255) that must reach only its own output row; also with a K
    tile wider than K (the scales past K are not read: they would be the next row's, the NaN)."""
    K, N = 64, 4
    codes = torch.arange(16, dtype=torch.uint8, device=DEVICE).repeat(K // 16)
    w = (codes[0::2] | (codes[1::2] << 4)).repeat(N, 1)
    ws = torch.tensor([[0, 27], [127, 127], [227, 100], [126, 128]], dtype=torch.uint8, device=DEVICE)
    x = randn(3, K, dtype=FP32).to(BF16)
    wd = quant.dequantize_mxfp4(w, ws, torch.float64)
    out = gemmkit.gemm_a16wfp4(x, w, ws, out_dtype=FP32, config=config)
    assert_close(out, reference(x, wd), tol=1e-3)
    ws[1, 0] = 255
    out = gemmkit.gemm_a16wfp4(x, w, ws, out_dtype=FP32, config=config)
    assert out[:, 1].isnan().all() and not out[:, [0, 2, 3]].isnan().any()


def _bad_cases():
    M, N, K = 2, 16, 64
    x = randn(M, K, dtype=BF16)
    w, ws, _ = mx(N, K)
    xq, xs, _ = mx(M, K)
    a16 = gemmkit.gemm_a16wfp4
    fp4 = gemmkit.gemm_afp4wfp4
    return [
        (TypeError, "w has dtype", a16, (x, w.to(torch.int8), ws)),
        (ValueError, "w has shape", a16, (x, w[:, :16], ws)),
        (ValueError, "w_scale has shape", a16, (x, w, ws[:, :1])),
        (TypeError, "w_scale has dtype", a16, (x, w, ws.float())),
        (ValueError, "multiple of 32", a16, (x[:, :48], w[:, :24], ws)),
        (TypeError, "x has dtype", fp4, (x, w, xs, ws)),
        (ValueError, "x_scale has shape", fp4, (xq, w, xs[:1], ws)),
        (ValueError, "contiguous along K", fp4, (xq.t().contiguous().t(), w, xs, ws)),
    ]


@pytest.mark.parametrize("case", range(8))
def test_bad_inputs(case):
    error, match, op, args = _bad_cases()[case]
    with pytest.raises(error, match=match):
        op(*args)


def test_mxfp4_linear_and_convert():
    K, N = 128, 48
    lin = nn.Linear(K, N).to(device=DEVICE, dtype=BF16)
    layer = gnn.MXFP4Linear.from_linear(lin)
    x = randn(3, K, dtype=BF16)
    with torch.no_grad():
        out = layer(x)
        assert_close(out, reference(x, quant.dequantize_mxfp4(layer.weight, layer.weight_scale, torch.float64),
                                    lin.bias))
        assert_close(out, lin(x).double(), tol=0.2)
        other = gnn.MXFP4Linear(K, N, device=DEVICE)
        other.load_state_dict(layer.state_dict())
        assert torch.equal(other(x), out)
        model = nn.Sequential(nn.Linear(K, 48), nn.Linear(48, 40)).to(DEVICE, BF16)
        with pytest.warns(UserWarning, match="left 1 layer"):
            report = gnn.convert(model, "mxfp4")
        assert report.converted == ["0"] and isinstance(model[0], gnn.MXFP4Linear)


# custom ops, torch.compile, tool ops -------------------------------------------------------------

def _op_cases():
    x = randn(2, 5, 64, dtype=BF16)
    w = randn(24, 64, dtype=BF16)
    q, s, z = quant.quantize_int4(w, 32)
    wq, ws = quant.quantize_mxfp4(w)
    xq, xs = quant.quantize_mxfp4(x)
    y = torch.empty(2, 5, 24, dtype=FP32, device=DEVICE)
    ops = torch.ops.gemmkit
    return {
        "a16w4": (ops.gemm_a16w4.default, (x, q, s, z, 32, None, "silu", None)),
        "a16w4_out": (ops.gemm_a16w4_out.default, (x, q, s, None, 32, None, None, FP32, y)),
        "a16wfp4": (ops.gemm_a16wfp4.default, (x, wq, ws, None, None, FP16)),
        "afp4wfp4_out": (ops.gemm_afp4wfp4_out.default, (xq, wq, xs, ws, None, None, FP32, y)),
    }


@pytest.mark.parametrize("case", sizes(["a16w4", "afp4wfp4_out"], ["a16w4", "a16w4_out", "a16wfp4", "afp4wfp4_out"]))
def test_opcheck(case):
    op, args = _op_cases()[case]
    tests = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    assert set(torch.library.opcheck(op, args, test_utils=tests).values()) == {"SUCCESS"}


def test_compile_routes_to_custom_ops():
    x = randn(3, 64, dtype=BF16)
    q, s, z = quant.quantize_int4(randn(16, 64, dtype=BF16), 64)
    wq, ws = quant.quantize_mxfp4(randn(16, 64, dtype=BF16))

    def f(x):
        return gemmkit.gemm_a16w4(x, q, s, z, group_size=64) + gemmkit.gemm_a16wfp4(x, wq, ws)

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), f(x))


@pytest.mark.parametrize("name", ["a16w4", "a16w4_tinygemm", "a16w4_dequant", "a16wfp4"])
def test_tool_ops(name):
    op = tools.get_op(name)
    M, N, K = 3, 32, 256
    inp = op.make_inputs(M, N, K, "bf16", DEVICE)
    ref = op.reference(inp)
    assert_close(op.run(inp), ref.double(), tol=op.tolerance)
    if name != "a16w4_tinygemm" or inp["w_tiny"] is not None:
        assert_close(op.baseline(inp), ref.double(), tol=op.tolerance)
    packed = N * K // 2
    assert op.nbytes(M, N, K) > M * K * 2 + packed + M * N * 2  # packed weight + its scales
    assert op.nbytes(M, N, K) < M * K * 2 + N * K * 2  # less than a bf16 weight
    gem, base = op.reads
    assert set(gem) <= set(inp) and set(base) <= set(inp)


def test_a16wfp4_prefill_route():
    """From DEQUANT_MIN_M rows (config None) the MXFP4 weight is dequantized in one pass for the
    A16W16 GEMM (ops/packed_prefill.py); it matches the float64 reference and the fused kernel."""
    from gemmkit.ops import packed_prefill

    M, N, K = packed_prefill.DEQUANT_MIN_M + 1, 24, 128
    x = randn(M, K, dtype=BF16)
    q, s, wd = mx(N, K, scale=K**-0.5)
    assert torch.equal(packed_prefill.dequantize_packed(q, s, None, 32, False, BF16), wd.to(BF16))
    ref = reference(x, wd)
    assert_close(gemmkit.gemm_a16wfp4(x, q, s), ref)
    assert_close(gemmkit.gemm_a16wfp4(x, q, s, config=dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=64)), ref)
