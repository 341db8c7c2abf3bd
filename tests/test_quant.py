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


@pytest.mark.parametrize("static", [False, True])
def test_int8_rounds_half_to_even(static):
    """Values at and next to halves (0.5 - 2^-25 used to round up: 0.49999997 + 0.5 is 1.0 in
    fp32). The row's absmax is 127, so the scale is exactly 1 and q must equal torch.round(t)."""
    near = [0.5 - 2**-25, 0.5 + 2**-24, 1.5 - 2**-23, 2.5 + 2**-22]
    vals = [127.0, 0.5, 1.5, 2.5, 3.5, 126.5, -0.5, -1.5, -2.5, -126.5] + near + [-v for v in near]
    t = torch.tensor(vals, dtype=torch.float32, device=DEVICE)[None, :]
    if static:
        q, _ = quant.quantize_int8(t, "tensor", scale=torch.ones((), device=DEVICE))
    else:
        q, s = quant.quantize_int8(t)
        assert s.item() == 1.0
    torch.testing.assert_close(q.double(), torch.round(t.double()), rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the interpreter's max of an all-NaN chunk
@pytest.mark.parametrize("target", [E4M3, E5M2, INT8])
def test_tiny_rows_and_nan(target):
    """A nonzero absmax below qmax * 2^-126 gets the least normal scale (1 / scale stays finite:
    no NaN, no saturation of every value); NaNs are left out of the absmax, stay NaN in FP8 and
    become 0 in INT8."""
    tiny = torch.tensor([1e-37, 5e-38, 0.0, -2.5e-38, 3e-38, 0.0, 0.0, 0.0], device=DEVICE)
    nan_row = torch.tensor([1.0, float("nan"), -2.0, 0.5, 0.25, 1.5, -1.0, 0.0], device=DEVICE)
    normal = randn(8, dtype=torch.float32)
    t = torch.stack([tiny, nan_row, normal])
    q, s = quantize(t, target)
    least_normal = torch.finfo(torch.float32).tiny
    assert s[0].item() == least_normal
    assert s[1].item() == pytest.approx(2.0 / QMAX[target], rel=1e-6)
    check_rounding(t[0:1], q[0:1], s[0:1], target)
    check_rounding(t[2:], q[2:], s[2:], target)
    ok = [0, 2, 3, 4, 5, 6, 7]
    check_rounding(t[1:2, ok], q[1:2, ok], s[1:2], target)
    q1 = q[1, 1].double()
    assert (q1 == 0) if target == INT8 else torch.isnan(q1)
    long = randn(2, 20000, dtype=torch.float32)  # rows longer than one pass holds: a looped absmax
    long[0, 7] = float("nan")
    long[0, 4096:8192] = float("nan")  # a whole 4096-wide chunk: its max is NaN, then max(amax, NaN)
    amax = long.nan_to_num(0.0).abs().amax(dim=1, keepdim=True)
    torch.testing.assert_close(quantize(long, target)[1], amax / QMAX[target], rtol=1e-6, atol=0)
    torch.testing.assert_close(quantize(long, target, "tensor")[1], amax.max() / QMAX[target], rtol=1e-6, atol=0)
    q_static, _ = quantize(t[1:], target, "tensor", scale=torch.tensor(2.0 / QMAX[target], device=DEVICE))
    q_static_1 = q_static[0, 1].double()
    assert (q_static_1 == 0) if target == INT8 else torch.isnan(q_static_1)


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
