"""gemm_a8w8_blockscale and gemm_a8w8(fast_accum=False) as torch.ops.gemmkit custom ops (opcheck,
fakes, torch.compile), gemmkit.nn.BlockFP8Linear and convert(model, "fp8_block")."""

import copy
import io
import warnings

import pytest
import torch
from torch import nn

import gemmkit
import gemmkit.nn as gnn
from gemmkit import library, quant
from gemmkit.ops import a8w8, a8w8_blockscale
from gemmkit.quant import dequantize_fp8_blockwise, quantize_fp8_blockwise
from conftest import DEVICE, assert_close, check_compiles, randn, reference, sizes

M, N, K = sizes((3, 32, 160), (300, 512, 1024))
OPS = torch.ops.gemmkit
DT = torch.bfloat16


def _cases():
    x = randn(2, M, K, dtype=DT)
    w = randn(N, K, dtype=DT)
    bias = randn(N, dtype=torch.float32)
    xq, xs = quantize_fp8_blockwise(x, (1, 128))
    wq, ws = quantize_fp8_blockwise(w, (128, 128))
    xr, xrs = quant.quantize_fp8(x, "row")
    wr, wrs = quant.quantize_fp8(w, "row")
    xi, xis = quant.quantize_int8(x, "row")
    wi, wis = quant.quantize_int8(w, "row")
    y = torch.empty(2, M, N, dtype=torch.float32, device=DEVICE)
    return {
        "blockscale": (OPS.gemm_a8w8_blockscale.default, (xq, wq, xs, ws, bias, "silu", None)),
        "blockscale_dynamic": (OPS.gemm_a8w8_blockscale.default, (x, wq, None, ws, None, None, torch.float16)),
        "blockscale_out": (OPS.gemm_a8w8_blockscale_out.default, (xq, wq, xs, ws, None, "relu", torch.float32, y)),
        "a8w8_exact": (OPS.gemm_a8w8.default, (xr, wr, xrs, wrs, bias, None, None, False)),
        "a8w8_int8_exact": (OPS.gemm_a8w8.default, (xi, wi, xis, wis, None, None, torch.float32, False)),
        "a8w8_exact_out": (OPS.gemm_a8w8_out.default, (xr, wr, xrs, wrs, None, None, torch.float32, y, False)),
    }


CASES = ["blockscale", "blockscale_dynamic", "blockscale_out", "a8w8_exact", "a8w8_int8_exact", "a8w8_exact_out"]


@pytest.mark.parametrize("case", CASES)
def test_opcheck(case):
    op, args = _cases()[case]
    tests = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if any(isinstance(a, torch.Tensor) and a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) for a in args):
        tests = tests[1:]  # torch.allclose is not implemented for float8 (see test_library.test_opcheck)
    assert set(torch.library.opcheck(op, args, test_utils=tests).values()) == {"SUCCESS"}


@pytest.mark.parametrize("case", CASES)
def test_custom_op_matches_eager_and_fake(case):
    from torch._subclasses.fake_tensor import FakeTensorMode

    op, args = _cases()[case]
    if case.endswith("_out"):
        assert op(*args) is None and not torch.isnan(args[-2 if case.startswith("a8w8") else -1]).any()
        return
    real = op(*args)
    if case.startswith("blockscale"):
        eager = gemmkit.gemm_a8w8_blockscale(*args[:5], activation=args[5], out_dtype=args[6])
    else:
        eager = gemmkit.gemm_a8w8(*args[:5], activation=args[5], out_dtype=args[6], fast_accum=args[7])
    torch.testing.assert_close(real, eager, rtol=0, atol=0)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    assert (real.shape, real.dtype, real.stride()) == (fake.shape, fake.dtype, fake.stride())


def test_eager_calls_stay_plain_python(monkeypatch):
    def boom():
        raise AssertionError("eager call routed to gemmkit.library")

    monkeypatch.setattr(a8w8_blockscale, "_library", boom)
    monkeypatch.setattr(a8w8, "_library", boom)
    _, (xq, wq, xs, ws, *_) = _cases()["blockscale"]
    y = gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws)
    calls = []
    monkeypatch.setattr(a8w8_blockscale, "_library", lambda: library)
    monkeypatch.setattr(a8w8_blockscale, "_is_compiling", lambda: True)
    monkeypatch.setattr(library, "traced_gemm_a8w8_blockscale", lambda *a: calls.append(a) or y)
    assert gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws) is y and len(calls) == 1
    calls.clear()
    monkeypatch.setattr(a8w8, "_library", lambda: library)
    monkeypatch.setattr(a8w8, "_is_compiling", lambda: True)
    monkeypatch.setattr(library, "traced_gemm_a8w8", lambda *a: calls.append(a) or y)
    xr, xrs = quant.quantize_fp8(xq.float(), "row")
    wr, wrs = quant.quantize_fp8(wq.float(), "row")
    gemmkit.gemm_a8w8(xr, wr, xrs, wrs, fast_accum=False)
    assert calls[0][-1] is False  # fast_accum reaches the custom op


def _program(x, xq, xs, wq, ws, wr, wrs, bias, y):
    """(quantize_fp8_blockwise has no custom op: the block-quantized operands come in)"""
    a = gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, bias, activation="relu")
    b = gemmkit.gemm_a8w8_blockscale(x, wq, None, ws, out_dtype=torch.float32)
    gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, out_dtype=torch.float32, y=y)
    c = gemmkit.gemm_a8w8(x, wr, None, wrs, fast_accum=False)
    return a.float() + b + c.float() + y


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph(backend):
    x, w = randn(3, K, dtype=DT), randn(N, K, dtype=DT)
    args = (x, *quantize_fp8_blockwise(x, (1, 128), scale_layout="col"), *quantize_fp8_blockwise(w, (128, 128)),
            *quant.quantize_fp8(w, "row"), randn(N, dtype=DT))
    y = check_compiles(_program, args, (3, N), backend)
    _, xq, xs, wq, ws, *_ = args
    torch.testing.assert_close(y, gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, out_dtype=torch.float32))


# gemmkit.nn --------------------------------------------------------------------------------------

KL, NL = sizes((192, 144), (1024, 768))  # not multiples of 128: ragged weight blocks
LEAD = sizes((2, 3), (4, 33))


def _linear(k=KL, n=NL, bias=True, dtype=DT):
    return nn.Linear(k, n, bias=bias, device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("scale_format", ["float32", "ue8m0"])
@pytest.mark.parametrize("bias", [True, False])
def test_block_fp8_linear(scale_format, bias):
    lin = _linear(bias=bias)
    layer = gnn.BlockFP8Linear.from_linear(lin, scale_format=scale_format)
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale.shape == (-(-NL // 128), -(-KL // 128))
    if scale_format == "ue8m0":
        assert torch.equal(layer.weight_scale.log2(), layer.weight_scale.log2().round())
    x = randn(*LEAD, KL, dtype=DT)
    with torch.no_grad():
        out = layer(x)
        ref = reference(x.reshape(-1, KL), lin.weight, lin.bias).reshape(*LEAD, NL)
    assert out.shape == (*LEAD, NL) and out.dtype == DT
    assert_close(out, ref, tol=5e-2)  # the quantization error
    xq, xs = quantize_fp8_blockwise(x.reshape(-1, KL), (1, 128))
    exact = reference(dequantize_fp8_blockwise(xq, xs, dtype=torch.float64),
                      dequantize_fp8_blockwise(layer.weight, layer.weight_scale, (128, 128), dtype=torch.float64),
                      layer.bias)
    assert_close(out.reshape(-1, NL), exact)  # the kernel's own error
    assert list(layer.parameters()) == []
    assert {n for n, _ in layer.named_buffers()} == {"weight", "weight_scale"} | ({"bias"} if bias else set())


def test_block_fp8_linear_state_dict_repr_and_errors():
    layer = gnn.BlockFP8Linear.from_linear(_linear(), scale_format="ue8m0")
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    buf.seek(0)
    fresh = gnn.BlockFP8Linear(KL, NL, dtype=DT, device=DEVICE)
    fresh.load_state_dict(torch.load(buf))
    for name, t in layer.state_dict().items():
        assert torch.equal(fresh.state_dict()[name].view(torch.uint8), t.view(torch.uint8)), name
    x = randn(3, KL, dtype=DT)
    torch.testing.assert_close(fresh(x), layer(x), rtol=0, atol=0)
    text = repr(layer)
    for part in (f"in_features={KL}", f"out_features={NL}", "bias=True", "dtype=bfloat16", "block", "ue8m0"):
        assert part in text
    with pytest.raises(ValueError, match="scale_format"):
        gnn.BlockFP8Linear(KL, NL, scale_format="e8m0")
    with pytest.raises(ValueError, match="multiples of 16"):
        gnn.BlockFP8Linear.from_linear(_linear(k=40))
    with pytest.raises(TypeError, match="dtype float16"):
        layer(randn(2, KL, dtype=torch.float16))


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = _linear(KL, 2 * KL)
        self.down = _linear(2 * KL, NL)
        self.head = _linear(NL, 40)  # 40: not a multiple of 16

    def forward(self, x):
        return self.head(self.down(torch.relu(self.up(x))))


def test_convert_fp8_block_and_compile():
    model = _Model()
    orig = copy.deepcopy(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = gnn.convert(model, "fp8_block", scale_format="ue8m0")
    assert report.converted == ["up", "down"] and list(report.unsupported) == ["head"] and len(caught) == 1
    assert isinstance(model.up, gnn.BlockFP8Linear) and model.up.scale_format == "ue8m0"
    assert gnn.SCHEMES["fp8_block"] is gnn.BlockFP8Linear
    x = randn(*LEAD, KL, dtype=DT)
    with torch.no_grad():
        out = model(x)
        assert_close(out, orig(x).double(), tol=0.1)
        for backend in ("eager", "aot_eager"):
            torch._dynamo.reset()
            compiled = torch.compile(model, fullgraph=True, backend=backend)(x)
            torch.testing.assert_close(compiled, out, rtol=1e-2, atol=1e-2)
