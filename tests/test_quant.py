"""The FP8 / INT8 quantizers: scales, rounding bounds, saturation, layouts, errors."""

import pytest
import torch

from gemmkit import quant
from conftest import DEVICE, randn, sizes

E4M3, E5M2, INT8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.int8
QMAX = {E4M3: 448.0, E5M2: 57344.0, INT8: 127.0}


def quantize(t, target, granularity="row", scale=None):
    if target == INT8:
        return quant.quantize_int8(t, granularity, scale=scale)
    return quant.quantize_fp8(t, granularity, dtype=target, scale=scale)


def check_rounding(t, q, scale, target):
    """Each q is within one step of the target grid of t / scale (RNE on GPUs; the Triton
    interpreter truncates, also within one step), on the right side of zero, and saturated."""
    v = t.double() / scale.double()
    v = v.clamp(-QMAX[target], QMAX[target])
    v = torch.where(scale.double().expand_as(v) > 0, v, torch.zeros_like(v))
    qd = q.double()
    if target == INT8:
        bound = torch.full_like(v, 0.5 + 1e-3)  # round to nearest; v is computed in fp32 by the kernel
    else:
        rel, tiny = {E4M3: (2.0**-3, 2.0**-9), E5M2: (2.0**-2, 2.0**-16)}[target]
        bound = torch.maximum(v.abs() * rel, torch.full_like(v, tiny))
    assert ((qd - v).abs() <= bound).all(), (qd - v).abs().max()
    assert (qd * v >= 0).all(), "sign flipped"


@pytest.mark.parametrize("target", [E4M3, E5M2, INT8])
@pytest.mark.parametrize("shape", sizes([(1, 7), (37, 100), (5, 3, 64), (9, 20000)], [(1, 4096), (4096, 8192), (3, 5, 4096), (7, 40000)]))
def test_per_row(target, shape):
    t = randn(*shape, dtype=torch.bfloat16, scale=3.0)
    rows2d = t.view(-1, shape[-1])
    if rows2d.shape[0] > 1:
        rows2d[0] = 0  # an all-zero row: scale 0, quantizes to zeros
    q, s = quantize(t, target)
    assert q.dtype == target and q.shape == t.shape and s.shape == (*shape[:-1], 1) and s.dtype == torch.float32
    amax = t.float().abs().amax(dim=-1, keepdim=True)
    torch.testing.assert_close(s, amax / QMAX[target], rtol=1e-6, atol=0)
    check_rounding(t, q, s, target)
    rows = q.double().abs().reshape(-1, shape[-1]).amax(dim=1)
    zero = t.reshape(-1, shape[-1]).abs().amax(dim=1) == 0
    assert (rows[zero] == 0).all() and (rows[~zero] == QMAX[target]).all(), "each row's absmax maps onto qmax"
    err = (quant.dequantize(q, s) - t.float()).norm() / t.float().norm()
    assert err < {E4M3: 0.1, E5M2: 0.2, INT8: 0.02}[target]


@pytest.mark.parametrize("target", [E4M3, E5M2, INT8])
def test_per_tensor_dynamic_and_static(target):
    t = randn(*sizes((45, 300), (2048, 4096)), dtype=torch.float16)
    q, s = quantize(t, target, "tensor")
    assert s.shape == () and s.dtype == torch.float32
    torch.testing.assert_close(s, t.float().abs().max() / QMAX[target], rtol=1e-6, atol=0)
    check_rounding(t, q, s, target)
    small = torch.tensor([t.float().abs().max().item() / QMAX[target] / 4], device=DEVICE)  # forces saturation
    q2, s2 = quantize(t, target, "tensor", scale=small)
    assert s2.shape == () and s2.item() == small.item()
    check_rounding(t, q2, s2, target)
    assert q2.double().abs().max() == QMAX[target] and not torch.isnan(q2.double()).any()


def test_strided_input_and_fp32():
    t = randn(40, 130, dtype=torch.float32)[:, 3:103]  # rows spaced 130 apart
    for target in (E4M3, INT8):
        q, s = quantize(t, target)
        check_rounding(t, q, s, target)
        assert q.is_contiguous()


def test_empty():
    q, s = quant.quantize_fp8(torch.empty(0, 64, dtype=torch.bfloat16, device=DEVICE))
    assert q.shape == (0, 64) and s.shape == (0, 1)


@pytest.mark.parametrize("call,exc,word", [
    (lambda t: quant.quantize_fp8(t.to(torch.int32)), TypeError, "t"),
    (lambda t: quant.quantize_fp8(t, "block"), ValueError, "granularity"),
    (lambda t: quant.quantize_fp8(t, dtype=torch.bfloat16), TypeError, "dtype"),
    (lambda t: quant.quantize_int8(t, "row", scale=torch.ones(1, device=DEVICE)), ValueError, "scale"),
    (lambda t: quant.quantize_int8(t, "tensor", scale=torch.ones(2, device=DEVICE)), ValueError, "scale"),
    (lambda t: quant.quantize_int8(t, "tensor", scale=torch.ones(1, dtype=torch.float16, device=DEVICE)), TypeError, "scale"),
    (lambda t: quant.quantize_fp8(t.requires_grad_()), ValueError, "requires grad"),
    (lambda t: quant.quantize_fp8(torch.tensor(1.0, device=DEVICE)), ValueError, "0-d"),
])
def test_bad_input(call, exc, word):
    with pytest.raises(exc, match=word):
        call(randn(4, 16, dtype=torch.float32))
