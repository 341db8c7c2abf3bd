"""Block-wise FP8, INT4 weight-only (with GPTQ / AWQ import) and MXFP4: scales, exact values
against torch references, layouts, ragged shapes, NaN / inf policy, errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from gemmkit import quant
from conftest import DEVICE, randn, sizes

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
QMAX = {E4M3: 448.0, E5M2: 57344.0}
LEAST_NORMAL = torch.finfo(torch.float32).tiny


# ---------------------------------------------------------------------------------------------
# block-wise FP8

def block_absmax(t, rows, cols=128):
    """float32 absmax over (rows x cols) blocks of the last two dims (rows=1: per row), zero-padded."""
    x = t.float().abs()
    x = x.reshape(-1, x.shape[-1]) if rows == 1 else x
    R, K = x.shape
    x = F.pad(x, (0, -K % cols, 0, -R % rows))
    a = x.reshape(x.shape[0] // rows, rows, x.shape[1] // cols, cols).amax(dim=(1, 3))
    return a.reshape(*t.shape[:-1], -1) if rows == 1 else a


def expand(s, t, rows, cols=128):
    """Each element's block scale, shaped like t."""
    s = s.repeat_interleave(cols, dim=-1)[..., : t.shape[-1]]
    return s.repeat_interleave(rows, dim=0)[: t.shape[0]] if rows > 1 else s


def floored(amax, target):
    return amax.clamp_min(QMAX[target] * LEAST_NORMAL)


def reference_scales(amax, target, scale_format):
    # float32, correctly rounded, as the kernel divides; a tiny nonzero absmax counts as qmax * 2^-126
    s = torch.where(amax > 0, floored(amax, target) / QMAX[target], 0.0)
    if scale_format == "ue8m0":  # the least power of two >= s (zero blocks: 2^-126)
        m, e = torch.frexp(s)
        s = torch.where(m == 0.5, s, torch.ldexp(torch.ones_like(s), e))
        s = torch.where(amax > 0, s, LEAST_NORMAL)
    return s


def check_blockwise(t, q, s, target, scale_format, rows):
    amax = block_absmax(t, rows)
    s_ref = reference_scales(amax, target, scale_format)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
    if scale_format == "ue8m0":
        m, _ = torch.frexp(s)
        assert (m == 0.5).all(), "ue8m0 scales are powers of two"
        nz = amax > 0
        assert (s[nz].double() >= amax[nz].double() / QMAX[target]).all(), "no value saturates"
        least = floored(amax, target)[nz].double() / QMAX[target]
        assert (s[nz].double() < 2 * least).all(), "the least such power of two"
        inv = 1.0 / s
    else:
        # a tensor divided, not `float / tensor` (torch computes that as a reciprocal times the float)
        inv = torch.where(amax > 0, torch.full_like(amax, QMAX[target]) / floored(amax, target), 0.0)
    q_ref = (t.float() * expand(inv, t, rows)).clamp(-QMAX[target], QMAX[target]).to(target)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), "q differs from the torch reference"
    # round trip: within half a step of the format at each value (computed from the format)
    fi = torch.finfo(target)
    d = quant.dequantize_fp8_blockwise(q, s, (rows, 128)).double()
    se = expand(s, t, rows).double()
    bound = t.double().abs() * fi.eps / 2 + se * fi.tiny * fi.eps / 2
    assert ((d - t.double()).abs() <= bound * (1 + 1e-6)).all()


@pytest.mark.parametrize("target", [E4M3, E5M2])
@pytest.mark.parametrize("scale_format", ["float32", "ue8m0"])
@pytest.mark.parametrize("scale_layout", ["row", "col"])
@pytest.mark.parametrize("shape", sizes([(37, 300), (3, 5, 200), (1, 128)],
                                        [(4096, 7168), (3, 50, 2000), (1, 7168), (333, 1100)]))
def test_blockwise_activations(target, scale_format, scale_layout, shape):
    t = randn(*shape, dtype=torch.bfloat16, scale=3.0)
    t2 = t.view(-1, shape[-1])
    if t2.shape[0] > 1:
        t2[0] = 0  # a zero row
        t2[1, : min(128, shape[-1])] *= 1e-3  # one group far smaller than its row
    q, s = quant.quantize_fp8_blockwise(t, (1, 128), target, scale_format, scale_layout)
    G = -(-shape[-1] // 128)
    assert q.dtype == target and q.shape == t.shape and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == (*shape[:-1], G)
    R = t2.shape[0]
    if scale_layout == "row":
        assert s.is_contiguous()
    else:  # the flattened (R, G) matrix column-major
        assert s.reshape(R, G).stride() == (1, R) or R == 1
        if len(shape) == 2:
            assert s.t().is_contiguous()
    check_blockwise(t, q, s, target, scale_format, 1)
    if t2.shape[0] > 1:
        assert (q.view(-1, shape[-1])[0].float() == 0).all()


@pytest.mark.parametrize("target", [E4M3, E5M2])
@pytest.mark.parametrize("scale_format", ["float32", "ue8m0"])
@pytest.mark.parametrize("scale_layout", ["row", "col"])
@pytest.mark.parametrize("shape", sizes([(200, 300), (128, 256), (1, 130)], [(7168, 2048), (4160, 7232), (1, 130)]))
def test_blockwise_weights(target, scale_format, scale_layout, shape):
    w = randn(*shape, dtype=torch.float32, scale=0.05)
    if shape[0] >= 128 and shape[1] >= 256:
        w[:128, 128:256] = 0  # a zero block
    q, s = quant.quantize_fp8_blockwise(w, (128, 128), target, scale_format, scale_layout)
    assert s.shape == (-(-shape[0] // 128), -(-shape[1] // 128)) and s.dtype == torch.float32
    assert s.is_contiguous() if scale_layout == "row" else s.t().is_contiguous()
    check_blockwise(w, q, s, target, scale_format, 128)
    if shape[0] >= 128 and shape[1] >= 256:
        expect = 0.0 if scale_format == "float32" else LEAST_NORMAL
        assert s[0, 1].item() == expect
        assert (quant.dequantize_fp8_blockwise(q, s, (128, 128))[:128, 128:256] == 0).all()


@pytest.mark.parametrize("scale_format", ["float32", "ue8m0"])
def test_blockwise_strided_and_fp16(scale_format):
    base = randn(40, 400, dtype=torch.float16)
    for t in (base[:, 50:350], randn(300, 40, dtype=torch.float16).t()):  # row stride 400; K not unit-stride
        q, s = quant.quantize_fp8_blockwise(t, scale_format=scale_format)
        q2, s2 = quant.quantize_fp8_blockwise(t.contiguous(), scale_format=scale_format)
        assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
        check_blockwise(t, q, s, E4M3, scale_format, 1)


@pytest.mark.filterwarnings("ignore:All-NaN slice")
@pytest.mark.parametrize("scale_format", ["float32", "ue8m0"])
def test_blockwise_tiny_nan_inf(scale_format):
    """Tiny groups get 2^-126 (finite 1 / scale), zero groups 0 (float32) or 2^-126 (ue8m0);
    NaNs are left out of the absmax and stay NaN; an inf makes its group's scale inf and the
    group dequantizes to NaN; other groups are untouched."""
    t = randn(4, 256, dtype=torch.float32)
    t[0, :128] = torch.linspace(-1e-37, 1e-37, 128)
    t[0, 128:] = 0
    t[1, 5] = float("nan")
    t[2, 200] = float("inf")
    q, s = quant.quantize_fp8_blockwise(t, scale_format=scale_format)
    assert s[0, 0].item() == LEAST_NORMAL
    assert s[0, 1].item() == (0.0 if scale_format == "float32" else LEAST_NORMAL)
    finite = t[1].clone()
    finite[5] = 0
    assert s[1, 0].item() == reference_scales(finite[:128].abs().amax(), E4M3, scale_format).item()
    assert torch.isnan(q[1, 5].float()) and not torch.isnan(q[1, torch.arange(256) != 5].float()).any()
    assert s[2, 1].item() == float("inf")
    d = quant.dequantize_fp8_blockwise(q, s)
    assert torch.isnan(d[2, 128:]).all() and not torch.isnan(d[2, :128]).any()
    assert (d[0, 128:] == 0).all()
    keep = torch.ones(4, dtype=torch.bool)
    keep[1:3] = False
    check_blockwise(t[keep], q[keep], s[keep], E4M3, scale_format, 1)


def test_blockwise_empty():
    q, s = quant.quantize_fp8_blockwise(torch.empty(0, 300, dtype=torch.bfloat16, device=DEVICE))
    assert q.shape == (0, 300) and s.shape == (0, 3)
    q, s = quant.quantize_fp8_blockwise(torch.empty(3, 0, dtype=torch.bfloat16, device=DEVICE), (128, 128))
    assert q.shape == (3, 0) and s.shape == (1, 0)


@pytest.mark.parametrize("call,exc,word", [
    (lambda t: quant.quantize_fp8_blockwise(t.to(torch.int32)), TypeError, "t"),
    (lambda t: quant.quantize_fp8_blockwise(t, (2, 128)), ValueError, "block"),
    (lambda t: quant.quantize_fp8_blockwise(t, 128), ValueError, "block"),
    (lambda t: quant.quantize_fp8_blockwise(t, dtype=torch.bfloat16), TypeError, "dtype"),
    (lambda t: quant.quantize_fp8_blockwise(t, scale_format="e8m0"), ValueError, "scale_format"),
    (lambda t: quant.quantize_fp8_blockwise(t, scale_layout="colmajor"), ValueError, "scale_layout"),
    (lambda t: quant.quantize_fp8_blockwise(t[None], (128, 128)), ValueError, "2-D"),
    (lambda t: quant.quantize_fp8_blockwise(t.requires_grad_()), ValueError, "requires grad"),
    (lambda t: quant.quantize_fp8_blockwise(t[0, 0]), ValueError, "0-d"),
    (lambda t: quant.dequantize_fp8_blockwise(t.to(E4M3), torch.ones(4, 2, device=DEVICE)), ValueError, "scale"),
    (lambda t: quant.dequantize_fp8_blockwise(t, torch.ones(4, 3, device=DEVICE)), TypeError, "q"),
    (lambda t: quant.dequantize_fp8_blockwise(t.to(E4M3), torch.ones(1, 3, device=DEVICE), (64, 64)), ValueError, "block"),
])
def test_blockwise_bad_input(call, exc, word):
    with pytest.raises(exc, match=word):
        call(randn(4, 300, dtype=torch.float32))
