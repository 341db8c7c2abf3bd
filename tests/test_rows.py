"""Operand rows off the L2's 32-byte sectors (gemmkit.core.rows): align_rows, the ops' padded copy
of x, the dynamic quantizer's padded rows, the nn layers' padded weights, the weight warning."""

import warnings

import pytest
import torch
from torch import nn

import gemmkit
import gemmkit.nn
from gemmkit import quant
from gemmkit.core import rows
from gemmkit.ops import a8w8, a8w8_blockscale, a16w16
from conftest import DEVICE, ON_GPU, assert_close, poisoned, randn, reference, sizes

E4M3, INT8 = torch.float8_e4m3fn, torch.int8
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

# (M, N, K): K's bytes not a multiple of 32 for 1-byte (K % 32 = 16) and 2-byte (K % 16 = 8) types
FP8_SIZES = sizes([(130, 24, 48), (300, 40, 80)], [(256, 512, 3696), (1000, 1000, 1040)])
BF16_SIZES = sizes([(130, 24, 40), (257, 33, 24)], [(256, 512, 4104), (1000, 1000, 1048)])


def last_plan(module):
    return next(reversed(module._plans.values()))


@pytest.fixture
def force_copy(monkeypatch):
    """The ops copy any x whose rows are off the sectors (the rule needs GPU-sized problems)."""
    monkeypatch.setattr(rows, "FORCE_X_COPY", True)


def test_copy_rule_h100():
    """x_copy_pays on the H100's profile: where both operands' rows are off the sectors and the
    GEMM repays the copy (meta tensors: shapes and strides only)."""
    from gemmkit.core.device import known_device

    dev = known_device("NVIDIA_H100_80GB_HBM3")

    def pays(M, N, K, dtype, w_aligned=False):
        x = torch.empty(M, K, dtype=dtype, device="meta")
        width = rows.padded_width(K, x.element_size()) if w_aligned else K
        w = torch.empty(N, width, dtype=dtype, device="meta")[:, :K]
        return rows.x_copy_pays(x, w, M, N, dev)

    assert all(pays(M, 8192, 3696, E4M3) for M in (128, 512, 2048, 8192))
    assert pays(512, 8192, 4104, BF16)
    assert not pays(127, 8192, 3696, E4M3)  # few rows
    assert not pays(8192, 8192, 3696, E4M3, w_aligned=True)  # one operand aligned: the copy would not pay
    assert not pays(300, 2000, 100, BF16)  # a short GEMM
    assert not pays(8192, 8192, 4096, E4M3)  # aligned rows


class _Echo:
    """A plan returning the x it is given."""

    def run(self, x, w, *rest):
        return x


@pytest.mark.parametrize("dtype", [BF16, E4M3, FP32])
@pytest.mark.parametrize("K", [1, 3, 40, 48, 100, 1001])
@pytest.mark.parametrize("layout", ["contiguous", "slice", "3d"])
def test_aligned_copy_exact(dtype, K, layout):
    M = 37
    full = randn(M, K + 5, dtype=FP32, scale=3.0).to(dtype)
    x = {"contiguous": full[:, :K].contiguous(), "slice": full[:, 2:K + 2], "3d": full[:, :K].contiguous()}[layout]
    xin = x.view(1, M, K) if layout == "3d" else x
    plan = rows.AlignedX(_Echo(), x, M, K, layout == "3d")
    xa = plan.run(xin, None)
    assert xa.shape == (M, K) and rows.rows_aligned(xa) and torch.equal(xa.float(), x.float())


@pytest.mark.parametrize("dtype", [BF16, E4M3, FP32, INT8])
@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 9), (6, 48), (2, 64)])
def test_align_rows(shape, dtype):
    t = randn(*shape, dtype=FP32, scale=3.0).to(dtype)
    a = gemmkit.align_rows(t)
    assert a.shape == t.shape and a.dtype == t.dtype and torch.equal(a.float(), t.float())
    assert a.stride(-1) == 1 and (a.stride(-2) * a.element_size()) % rows.ROW_ALIGN == 0
    assert a.data_ptr() % rows.ROW_ALIGN == 0
    if (shape[-1] * t.element_size()) % rows.ROW_ALIGN == 0:
        assert a is t  # already aligned: no copy
    else:
        assert a.data_ptr() != t.data_ptr() and not a.is_contiguous()
    if a.ndim == 2:
        assert rows.rows_aligned(a)
    # column-major input: copied into padded rows
    c = gemmkit.align_rows(t.mT.contiguous().mT) if t.ndim == 2 else a
    assert torch.equal(c.float(), t.float()) and c.stride(-1) == 1


def test_align_rows_refuses():
    with pytest.raises(TypeError, match="tensor"):
        gemmkit.align_rows([1, 2])
    with pytest.raises(ValueError, match="2 dimensions"):
        gemmkit.align_rows(torch.ones(5))
    assert gemmkit.align_rows(torch.ones(0, 7)).shape == (0, 7)


@pytest.mark.parametrize("M,N,K", BF16_SIZES)
@pytest.mark.parametrize("lead", [False, True])
def test_a16w16_copies_unaligned_x(M, N, K, lead, force_copy, monkeypatch):
    x = randn(M, K, dtype=BF16)
    w = gemmkit.align_rows(randn(N, K, dtype=BF16))
    bias = randn(N, dtype=BF16)
    assert not rows.rows_aligned(x) and M >= rows.ALIGN_X_MIN_M
    xin = x.view(1, M, K) if lead else x
    y = poisoned((*xin.shape[:-1], N), BF16)
    out = gemmkit.gemm_a16w16(xin, w, bias, activation="silu", y=y)
    assert out is y
    assert isinstance(last_plan(a16w16), rows.AlignedX)
    assert_close(out.reshape(M, N), reference(x, w, bias, "silu"))
    # the rule: w aligned, no copy
    monkeypatch.setattr(rows, "FORCE_X_COPY", None)
    plain = gemmkit.gemm_a16w16(x, w)
    assert not isinstance(last_plan(a16w16), rows.AlignedX)
    assert_close(plain, reference(x, w))


@pytest.mark.parametrize("M,N,K", FP8_SIZES)
@pytest.mark.parametrize("dtype", [E4M3, INT8])
def test_a8w8_static_copies_unaligned_x(M, N, K, dtype, force_copy):
    quantize = quant.quantize_int8 if dtype == INT8 else quant.quantize_fp8
    xq, xs = quantize(randn(M, K, dtype=FP32, scale=2.0), "row")
    wq, ws = quantize(randn(N, K, dtype=FP32, scale=2.0), "row")
    wq, ws = gemmkit.align_rows(wq), ws.reshape(1, N)
    y = poisoned((M, N), FP32)
    out = gemmkit.gemm_a8w8(xq, wq, xs, ws, out_dtype=FP32, y=y)
    assert isinstance(last_plan(a8w8), rows.AlignedX)
    assert_close(out, reference(xq.float(), wq.float(), x_scale=xs, w_scale=ws), tol=2e-3 if ON_GPU else None)


@pytest.mark.parametrize("M,N,K", FP8_SIZES)
@pytest.mark.parametrize("dtype", [E4M3, INT8])
def test_a8w8_dynamic_quantizes_into_aligned_rows(M, N, K, dtype, monkeypatch):
    """The quantizer of the dynamic path writes x's rows padded; the result equals quantizer + static GEMM."""
    quantize = quant.quantize_int8 if dtype == INT8 else quant.quantize_fp8
    x = randn(M, K, dtype=BF16)
    wq, ws = quantize(randn(N, K, dtype=FP32), "row")
    ws = ws.reshape(1, N)
    # the unfused path: quantizer + GEMM (the fused one reads x itself)
    monkeypatch.setattr(a8w8, "FUSED_QUANT_MAX_M", 0)
    a8w8._plans.clear()
    seen = []
    real = quant._quantize

    def spy(t, *args):
        q, s = real(t, *args)
        seen.append(q.stride())
        return q, s

    monkeypatch.setattr(quant, "_quantize", spy)
    out = gemmkit.gemm_a8w8(x, wq, None, ws)
    assert seen == [(rows.padded_width(K, 1), 1)]
    xq, xs = quantize(x, "row")
    assert_close(out, reference(xq.float(), wq.float(), x_scale=xs, w_scale=ws), tol=2e-3 if ON_GPU else None)


@pytest.mark.parametrize("dtype", [E4M3, INT8])
def test_quantizer_aligned_rows_same_values(dtype):
    t = randn(70, 48, dtype=BF16, scale=4.0)
    target = "int8" if dtype == INT8 else "e4m3"
    q, s = quant._quantize(t, "row", dtype, target, None, True)
    q0, s0 = (quant.quantize_int8 if dtype == INT8 else quant.quantize_fp8)(t, "row")
    assert q.stride() == (64, 1) and q.data_ptr() % rows.ROW_ALIGN == 0
    assert torch.equal(q.float(), q0.float()) and torch.equal(s, s0)
    with pytest.raises(ValueError, match="2-D"):
        quant._quantize(t.view(7, 10, 48), "row", dtype, target, None, True)


@pytest.mark.parametrize("M,N,K", FP8_SIZES)
def test_blockscale_static_copies_unaligned_x(M, N, K, force_copy):
    xq, xs = quant.quantize_fp8_blockwise(randn(M, K, dtype=FP32), (1, 128))
    wq, ws = quant.quantize_fp8_blockwise(randn(N, K, dtype=FP32) / K**0.5, (128, 128))
    out = gemmkit.gemm_a8w8_blockscale(xq, gemmkit.align_rows(wq), xs, ws, out_dtype=FP32)
    assert isinstance(last_plan(a8w8_blockscale), rows.AlignedX)
    ref = quant.dequantize_fp8_blockwise(xq, xs).double() @ quant.dequantize_fp8_blockwise(wq, ws, (128, 128)).double().T
    assert_close(out, ref, tol=1e-3 if ON_GPU else None)  # (fp32 sums of FP8 products in the tensor cores)


@pytest.mark.parametrize("layer_cls", [gemmkit.nn.Linear, gemmkit.nn.FP8Linear, gemmkit.nn.Int8Linear,
                                       gemmkit.nn.BlockFP8Linear])
def test_nn_layers_store_aligned_weights(layer_cls):
    lin = nn.Linear(48, 32, dtype=BF16, device=DEVICE)
    layer = layer_cls.from_linear(lin)
    assert rows.rows_aligned(layer.weight) and layer.weight.shape == (32, 48)
    x = randn(5, 48, dtype=BF16)
    before = layer(x)
    layer._apply(lambda t: t.contiguous())  # what Module.to does to a padded view: made dense
    assert rows.rows_aligned(layer.weight)
    assert torch.equal(layer(x), before)
    again = layer_cls(48, 32, dtype=BF16, device=DEVICE)
    again.load_state_dict(layer.state_dict())
    assert rows.rows_aligned(again.weight) and torch.equal(again(x), before)


def test_weight_warning():
    w = randn(256, 4104, dtype=BF16)  # 2 MB, rows of 8208 bytes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows.warn_unaligned_weight("op", randn(8, 40, dtype=BF16))  # small: no warning
        rows.warn_unaligned_weight("op", gemmkit.align_rows(w))  # aligned: none
        if not ON_GPU:
            rows.warn_unaligned_weight("op", w)  # CPU (the interpreter): none
    if ON_GPU:
        with pytest.warns(UserWarning, match="align_rows"):
            rows.warn_unaligned_weight("op_once", w)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rows.warn_unaligned_weight("op_once", w)  # once per shape


@pytest.mark.parametrize("scheme", ["bf16", "fp8"])
def test_gated_mlp_stores_aligned_weights(scheme):
    H, I = (40, 24) if scheme == "bf16" else (48, 80)  # (rows of 80 / 48 bytes: bf16; 48 / 80: fp8)
    mlp = gemmkit.nn.GatedMLP(H, I, scheme=scheme, dtype=BF16, device=DEVICE)
    mlp.load_gate_up(randn(2 * I, H, dtype=BF16))
    mlp.load_down(randn(H, I, dtype=BF16, scale=I**-0.5))
    assert rows.rows_aligned(mlp.gate_up_weight) and rows.rows_aligned(mlp.down_weight)
    x = randn(130, H, dtype=BF16)
    before = mlp(x)
    mlp._apply(lambda t: t.contiguous())
    assert rows.rows_aligned(mlp.gate_up_weight) and rows.rows_aligned(mlp.down_weight)
    assert torch.equal(mlp(x), before)


def test_state_dict_is_dense():
    """A checkpoint holds dense tensors (safetensors requires them); loading keeps the layer's padded rows."""
    lin = nn.Linear(40, 24, dtype=BF16, device=DEVICE)
    layer = gemmkit.nn.Linear.from_linear(lin)
    mlp = gemmkit.nn.GatedMLP(40, 24, dtype=BF16, device=DEVICE)
    for module, names in ((layer, ("weight",)), (mlp, ("gate_up_weight", "down_weight"))):
        state = module.state_dict()
        assert all(state[n].is_contiguous() for n in names)
        assert all(torch.equal(state[n], getattr(module, n)) for n in names)
        fresh = type(module)(40, 24, dtype=BF16, device=DEVICE) if module is layer else gemmkit.nn.GatedMLP(
            40, 24, dtype=BF16, device=DEVICE)
        fresh.load_state_dict(state)
        assert all(rows.rows_aligned(getattr(fresh, n)) and torch.equal(getattr(fresh, n), state[n]) for n in names)
