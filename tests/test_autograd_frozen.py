"""Gradients through frozen 4-bit weights (gemm_a16w4, gemm_a16wfp4; gemmkit.autograd): dx and dbias against float64
torch references on the dequantized weight (as the forward uses it: x's dtype), every group size and activation,
3-D x, empty problems, the nn layers with a trainable adapter, torch.compile, opcheck, second derivatives, and the
calls refused (a scale that requires grad, y=, config=, the FP4 x of gemm_afp4wfp4)."""

import pytest
import torch
import torch.nn.functional as F

import gemmkit
import gemmkit.library  # noqa: F401  (registers torch.ops.gemmkit.*)
from conftest import DEVICE, ON_GPU, randn, sizes
from gemmkit import quant
from gemmkit.core.epilogue import torch_activation as activate
from test_autograd import BF16, FP16, FP32, _compare, _leaf

M_N_K = sizes([(1, 24, 128), (19, 40, 128), (64, 48, 256)], [(1, 4096, 1024), (300, 1000, 2048), (1024, 768, 4096)])


def _int4(N, K, group, symmetric, dtype):
    w = randn(N, K, dtype=FP32, scale=K ** -0.5)
    wq, ws, wz = quant.quantize_int4(w, group, symmetric=symmetric)
    ws = ws.to(dtype)
    wz = None if symmetric else wz
    deq = quant.dequantize_int4(wq, ws, wz, group, dtype)  # (the weight as the forward multiplies: x's dtype)
    return wq, ws, wz, deq


@pytest.mark.parametrize("M,N,K", M_N_K)
@pytest.mark.parametrize("group,symmetric", [(32, False), (128, True), (None, False)])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_a16w4_grads(M, N, K, group, symmetric, activation):
    wq, ws, wz, deq = _int4(N, K, group, symmetric, BF16)
    x, b = _leaf(randn(M, K, dtype=BF16)), _leaf(randn(N, dtype=FP32))
    _compare(lambda x, b: gemmkit.gemm_a16w4(x, wq, ws, wz, group_size=group, bias=b, activation=activation),
             lambda x, b: activate(F.linear(x, deq.double(), b), activation), (x, b), BF16)


@pytest.mark.parametrize("dtype,out_dtype,bias", [(FP16, None, None), (BF16, FP32, BF16), (FP16, FP32, FP16)])
def test_a16w4_dtypes_and_leading_dims(dtype, out_dtype, bias):
    N, K = sizes((40, 128), (1536, 2048))
    wq, ws, wz, deq = _int4(N, K, 64, False, dtype)
    x = _leaf(randn(2, 3, K, dtype=dtype))
    b = None if bias is None else _leaf(randn(N, dtype=bias))
    inputs = (x,) if b is None else (x, b)
    _compare(lambda x, *b: gemmkit.gemm_a16w4(x, wq, ws, wz, group_size=64, bias=b[0] if b else None,
                                              out_dtype=out_dtype),
             lambda x, *b: F.linear(x, deq.double(), b[0] if b else None), inputs, dtype, out_dtype)


@pytest.mark.parametrize("M,N,K", M_N_K)
@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
def test_a16wfp4_grads(M, N, K, activation):
    wq, ws = quant.quantize_mxfp4(randn(N, K, dtype=FP32, scale=K ** -0.5))
    deq = quant.dequantize_mxfp4(wq, ws, BF16)
    x, b = _leaf(randn(M, K, dtype=BF16)), _leaf(randn(N, dtype=BF16))
    _compare(lambda x, b: gemmkit.gemm_a16wfp4(x, wq, ws, bias=b, activation=activation),
             lambda x, b: activate(F.linear(x, deq.double(), b), activation), (x, b), BF16)


def test_bias_only_and_empty():
    """Only the bias requires grad (dx not made); no rows; the gradient of x alone."""
    N, K = sizes((24, 64), (512, 1024))
    wq, ws, wz, deq = _int4(N, K, 32, False, BF16)
    x, b = randn(5, K, dtype=BF16), _leaf(randn(N, dtype=FP32))
    (gb,) = torch.autograd.grad(gemmkit.gemm_a16w4(x, wq, ws, wz, group_size=32, bias=b).float().sum(), (b,))
    torch.testing.assert_close(gb, torch.full((N,), 5.0, device=DEVICE))
    x0 = _leaf(randn(0, K, dtype=BF16))
    y = gemmkit.gemm_a16w4(x0, wq, ws, wz, group_size=32)
    assert y.shape == (0, N)
    (gx,) = torch.autograd.grad(y.sum(), (x0,))
    assert gx.shape == (0, K)


def test_second_derivative():
    N, K = sizes((24, 64), (256, 512))
    wq, ws = quant.quantize_mxfp4(randn(N, K, dtype=FP32, scale=K ** -0.5))
    deq = quant.dequantize_mxfp4(wq, ws, BF16).double()
    x = _leaf(randn(3, K, dtype=BF16))
    y = gemmkit.gemm_a16wfp4(x, wq, ws, activation="silu")
    (gx,) = torch.autograd.grad(y.float().square().sum(), (x,), create_graph=True)
    (ggx,) = torch.autograd.grad(gx.float().sum(), (x,))
    xd = x.detach().double().requires_grad_()
    (rx,) = torch.autograd.grad(F.silu(F.linear(xd, deq)).square().sum(), (xd,), create_graph=True)
    (rgx,) = torch.autograd.grad(rx.sum(), (xd,))
    assert ((ggx.double() - rgx).norm() / rgx.norm()).item() < 3e-2


def test_layers_with_a_trainable_adapter():
    """Int4Linear / MXFP4Linear frozen, a LoRA-style adapter and the input trained through them."""
    K, N, r = sizes((64, 40, 4), (1024, 768, 16))
    base = torch.nn.Linear(K, N, dtype=BF16, device=DEVICE)
    for layer in (gemmkit.nn.Int4Linear.from_linear(base, group_size=32), gemmkit.nn.MXFP4Linear.from_linear(base)):
        a = _leaf(randn(r, K, dtype=BF16, scale=0.1))
        bb = _leaf(randn(N, r, dtype=BF16, scale=0.1))
        x = _leaf(randn(7, K, dtype=BF16))
        y = layer(x) + gemmkit.gemm_a16w16(gemmkit.gemm_a16w16(x, a), bb)
        dy = randn(*y.shape, dtype=BF16)
        gx, ga, gbb = torch.autograd.grad(y, (x, a, bb), dy)
        with torch.no_grad():
            if isinstance(layer, gemmkit.nn.Int4Linear):
                w = quant.dequantize_int4(layer.weight, layer.weight_scale.to(BF16), layer.weight_zero,
                                          layer.group_size, BF16)
            else:
                w = quant.dequantize_mxfp4(layer.weight, layer.weight_scale, BF16)
        w_all = w.double() + bb.detach().double() @ a.detach().double()
        ref = dy.double() @ w_all
        assert ((gx.double() - ref).norm() / ref.norm()).item() < 1e-2
        assert ga.shape == a.shape and gbb.shape == bb.shape and layer.weight.grad is None


@pytest.mark.parametrize("backend", ["aot_eager"] + (["inductor"] if ON_GPU else []))
def test_compiled(backend):
    N, K = sizes((40, 128), (768, 1024))
    wq, ws, wz, _ = _int4(N, K, 64, False, BF16)
    fq, fs = quant.quantize_mxfp4(randn(N, K, dtype=FP32, scale=K ** -0.5))
    x, b = _leaf(randn(6, K, dtype=BF16)), _leaf(randn(N, dtype=FP32))

    def step(x, b):
        h = gemmkit.gemm_a16w4(x, wq, ws, wz, group_size=64, bias=b, activation="relu")
        return (h.float() + gemmkit.gemm_a16wfp4(x, fq, fs).float()).square().sum()

    eager = torch.autograd.grad(step(x, b), (x, b))
    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(step, fullgraph=True, backend=backend)(x, b), (x, b))
    for g, e in zip(got, eager):
        assert g.dtype == e.dtype and ((g.double() - e.double()).norm() / e.double().norm()).item() < 1e-2
    torch._dynamo.reset()


def test_compiled_dynamic_group_size():
    """A group size that torch.compile makes a symbol (dynamic=True): the registered backward takes it."""
    N, K = sizes((24, 128), (512, 1024))
    x = _leaf(randn(3, K, dtype=BF16))

    def f(x, q, s, z, gs):
        return gemmkit.gemm_a16w4(x, q, s, z, group_size=gs).float().sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    for g in (64, 32):
        wq, ws, wz, deq = _int4(N, K, g, False, BF16)
        (gx,) = torch.autograd.grad(compiled(x, wq, ws, wz, g), (x,))
        ref = deq.double().sum(0).expand(3, K)
        assert ((gx.double() - ref).norm() / ref.norm()).item() < 1e-2
    torch._dynamo.reset()


def test_opcheck_with_grad():
    N, K = sizes((24, 64), (512, 1024))
    wq, ws, wz, _ = _int4(N, K, 32, False, BF16)
    fq, fs = quant.quantize_mxfp4(randn(N, K, dtype=FP32))
    x, b = _leaf(randn(5, K, dtype=BF16)), _leaf(randn(N, dtype=FP32))
    tests = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    for op, args in ((torch.ops.gemmkit.gemm_a16w4.default, (x, wq, ws, wz, 32, b, "silu", None)),
                     (torch.ops.gemmkit.gemm_a16wfp4.default, (x, fq, fs, b, None, FP32))):
        assert set(torch.library.opcheck(op, args, test_utils=tests).values()) == {"SUCCESS"}


def test_refused():
    N, K = sizes((24, 64), (512, 1024))
    wq, ws, wz, _ = _int4(N, K, 32, False, BF16)
    x = _leaf(randn(4, K, dtype=BF16))
    with pytest.raises(ValueError, match="w_scale requires grad.*frozen"):
        gemmkit.gemm_a16w4(x.detach(), wq, _leaf(ws), wz, group_size=32)
    with pytest.raises(ValueError, match="y= .*autograd"):
        gemmkit.gemm_a16w4(x, wq, ws, wz, group_size=32, y=torch.empty(4, N, dtype=BF16, device=DEVICE))
    with pytest.raises(ValueError, match="config= .*autograd"):
        gemmkit.gemm_a16wfp4(x, *quant.quantize_mxfp4(randn(N, K, dtype=FP32)), config=dict(BLOCK_M=16))
    with pytest.raises(ValueError, match="group_size"):  # (the inference call's checks first)
        gemmkit.gemm_a16w4(x, wq, ws, wz, group_size=48)
    with pytest.raises(TypeError, match="x"):
        gemmkit.gemm_a16w4(_leaf(randn(4, K, dtype=FP32)), wq, ws, wz, group_size=32)
    fx, fxs = quant.quantize_mxfp4(randn(4, K, dtype=FP32))
    fq, fs = quant.quantize_mxfp4(randn(N, K, dtype=FP32))
    with pytest.raises(ValueError, match="requires grad"):  # (gemm_afp4wfp4: no backward)
        gemmkit.gemm_afp4wfp4(fx, fq, fxs, fs, bias=_leaf(randn(N, dtype=FP32)))
    f = torch.compile(lambda x: gemmkit.gemm_a16w4(x, wq, _leaf(ws), wz, group_size=32), fullgraph=True,
                      backend="eager")
    with pytest.raises(Exception, match="frozen"):
        f(x)
    torch._dynamo.reset()


# 8-bit weights with a 16-bit x quantized in the op (dynamic): dx goes straight through x's quantization

def _dx_check(gx, dy, w_deq, tol=1e-2):
    ref = dy.double() @ w_deq.double()
    assert gx.dtype == dy.dtype and gx.shape == ref.shape
    assert ((gx.double() - ref).norm() / ref.norm()).item() < tol


@pytest.mark.parametrize("wdtype", [torch.float8_e4m3fn, torch.int8])
@pytest.mark.parametrize("scale", ["channel", "tensor"])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_a8w8_dynamic_grads(wdtype, scale, activation):
    M, N, K = sizes((9, 40, 64), (300, 1000, 2048))
    w = randn(N, K, dtype=FP32, scale=K ** -0.5)
    wq, ws = (quant.quantize_fp8 if wdtype != torch.int8 else quant.quantize_int8)(
        w, "row" if scale == "channel" else "tensor")
    x, b = _leaf(randn(M, K, dtype=BF16)), _leaf(randn(N, dtype=FP32))
    y = gemmkit.gemm_a8w8(x, wq, None, ws, b, activation=activation)
    with torch.no_grad():  # (the forward is the inference op's; with an activation fused it may take another config)
        ref = gemmkit.gemm_a8w8(x, wq, None, ws, b, activation=activation)
    assert ((y.double() - ref.double()).norm() / ref.double().norm()).item() < 2e-3
    dy = randn(M, N, dtype=BF16)
    gx, gb = torch.autograd.grad(y, (x, b), dy)
    if activation == "relu":
        dy = dy * (y > 0)
    _dx_check(gx, dy, wq.double() * ws.double().reshape(-1, 1 if ws.numel() > 1 else 1))
    torch.testing.assert_close(gb, dy.float().sum(0), rtol=1e-5, atol=1e-4)


def test_a8w8_blockscale_dynamic_grads():
    M, N, K = sizes((5, 130, 200), (300, 1000, 2100))  # (ragged last 128-blocks along N and K)
    w = randn(N, K, dtype=FP32, scale=K ** -0.5)
    wq, ws = quant.quantize_fp8_blockwise(w, (128, 128))
    x = _leaf(randn(2, M, K, dtype=FP16))
    y = gemmkit.gemm_a8w8_blockscale(x, wq, None, ws, out_dtype=FP32)
    dy = randn(*y.shape, dtype=FP32)
    (gx,) = torch.autograd.grad(y, (x,), dy)
    s = ws.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :K]
    _dx_check(gx.reshape(-1, K), dy.to(FP16).reshape(-1, N), wq.double() * s.double())


def test_8bit_layers_and_compile():
    K, N = sizes((64, 48), (1024, 768))
    base = torch.nn.Linear(K, N, dtype=BF16, device=DEVICE)
    x = _leaf(randn(7, K, dtype=BF16))
    for layer in (gemmkit.nn.FP8Linear.from_linear(base), gemmkit.nn.Int8Linear.from_linear(base)):
        y = layer(x)
        dy = randn(*y.shape, dtype=BF16)
        (gx,) = torch.autograd.grad(y, (x,), dy)
        _dx_check(gx, dy, layer.weight.double() * layer.weight_scale.double()[:, None])
    wq, ws = quant.quantize_fp8(randn(N, K, dtype=FP32, scale=K ** -0.5), "row")

    def step(x):
        return gemmkit.gemm_a8w8(x, wq, None, ws, activation="silu").float().square().sum()

    eager = torch.autograd.grad(step(x), (x,))[0]
    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(step, fullgraph=True, backend="aot_eager")(x), (x,))[0]
    assert ((got.double() - eager.double()).norm() / eager.double().norm()).item() < 1e-2
    torch._dynamo.reset()
    tests = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")  # (test_schema: no fp8 mul)
    assert set(torch.library.opcheck(torch.ops.gemmkit.gemm_a8w8.default, (x, wq, None, ws, None, None, BF16, True),
                                     test_utils=tests).values()) == {"SUCCESS"}


def test_8bit_refused():
    K, N = sizes((64, 40), (1024, 768))
    wq, ws = quant.quantize_fp8(randn(N, K, dtype=FP32), "row")
    x = _leaf(randn(3, K, dtype=BF16))
    with pytest.raises(ValueError, match="w_scale requires grad.*frozen"):
        gemmkit.gemm_a8w8(x, wq, None, _leaf(ws))
    with pytest.raises(ValueError, match="y= .*autograd"):
        gemmkit.gemm_a8w8(x, wq, None, ws, y=torch.empty(3, N, dtype=BF16, device=DEVICE))
    xq, xs = quant.quantize_fp8(x.detach(), "row")
    with pytest.raises(ValueError, match="requires grad"):  # (an already quantized x: no gradient)
        gemmkit.gemm_a8w8(xq.requires_grad_(), wq, xs, ws)
    with pytest.raises(ValueError, match="already quantized x has no gradient"):
        torch.ops.gemmkit.gemm_a8w8(xq, wq, xs, ws, None, None, BF16, True)
