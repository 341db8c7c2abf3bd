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
    # float32, correctly rounded, as the kernel divides (a tensor by a tensor: on CUDA torch divides
    # by a Python float as a multiplication by its reciprocal); a tiny nonzero absmax counts as
    # qmax * 2^-126
    s = torch.where(amax > 0, floored(amax, target) / torch.full_like(amax, QMAX[target]), 0.0)
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


# ---------------------------------------------------------------------------------------------
# INT4 weight-only

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("group_size", [32, 128, None])
@pytest.mark.parametrize("symmetric", [False, True])
def test_int4_round_trip(dtype, group_size, symmetric):
    N, K = sizes((10, 256), (4096, 4096))
    w = randn(N, K, dtype=dtype, scale=0.05)
    gs = K if group_size is None else group_size
    w[0, :gs] = 0  # a zero group
    w[1, :gs] = w[1, :gs].abs()  # a group of positive values (its range still starts at 0)
    w_q, s, z = quant.quantize_int4(w, group_size, symmetric)
    G = K // gs
    assert w_q.dtype == torch.uint8 and w_q.shape == (N, K // 2)
    assert s.dtype == dtype and s.shape == (N, G)
    assert (z is None) if symmetric else (z.dtype == torch.uint8 and z.shape == (N, G) and int(z.max()) <= 15)
    q = torch.stack((w_q & 15, w_q >> 4), dim=-1).reshape(N, K).float().reshape(N, G, gs)  # low nibble first
    wg = w.float().reshape(N, G, gs)
    if symmetric:
        s_true = wg.abs().amax(-1) / 7
        zf = torch.full((N, G, 1), 8.0, device=w.device)
    else:
        lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
        s_true = (hi - lo) / 15
    assert torch.equal(s, s_true.to(dtype))
    sf = s.float()[..., None]
    if not symmetric:
        zf = torch.where(sf > 0, -lo[..., None] / sf, 0.0).round().clamp(0, 15)
        assert torch.equal(z.float(), zf[..., 0])
    lo_q, hi_q = (-8, 7) if symmetric else (0 - zf, 15 - zf)
    q_ref = torch.where(sf > 0, wg / sf, 0.0).round().clamp(lo_q, hi_q) + zf
    assert torch.equal(q, q_ref)
    d = quant.dequantize_int4(w_q, s, z, group_size)
    assert d.shape == (N, K) and torch.equal(d, ((q - zf) * sf).reshape(N, K))
    assert (d[0, :gs] == 0).all()
    # within half a step of the stored scale, plus what rounding the scale to dtype moved the ends
    span = 7 if symmetric else 15
    bound = sf * 0.5 + span * (sf - s_true[..., None]).abs()
    assert ((d.reshape(N, G, gs) - wg).abs() <= bound * (1 + 1e-5) + 1e-12).all()


def test_int4_packing_layout():
    q = torch.tensor([[1, 2, 3, 4, 15, 0], [0, 15, 7, 8, 9, 10]], dtype=torch.uint8, device=DEVICE)
    packed = quant.pack_int4(q)
    assert packed.tolist() == [[0x21, 0x43, 0x0F], [0xF0, 0x87, 0xA9]]
    assert torch.equal(quant.unpack_int4(packed), q)
    # lo -1, hi 3: s = fl32(4 / 15) = 0.26666668, z = round(3.75) = 4; 2 / s = 7.4999998 rounds to 7
    w = torch.tensor([[-1.0, 0.0, 2.0, 3.0] * 8], device=DEVICE)
    w_q, s, z = quant.quantize_int4(w, 32)
    assert z.item() == 4 and quant.unpack_int4(w_q)[0, :4].tolist() == [0, 4, 11, 15]


@pytest.mark.parametrize("call,exc,word", [
    (lambda w: quant.quantize_int4(w.to(torch.int32)), TypeError, "w"),
    (lambda w: quant.quantize_int4(w[0]), ValueError, "2-D"),
    (lambda w: quant.quantize_int4(w[:, :96]), ValueError, "divide"),
    (lambda w: quant.quantize_int4(w, 48), ValueError, "group_size"),
    (lambda w: quant.quantize_int4(w, True), ValueError, "group_size"),
    (lambda w: quant.quantize_int4(w[:, :7], None), ValueError, "even"),
    (lambda w: quant.quantize_int4(w.index_fill(1, torch.tensor([3], device=DEVICE), float("nan"))), ValueError, "NaN"),
    (lambda w: quant.dequantize_int4(*quant.quantize_int4(w, 64)), ValueError, "w_scale"),
    (lambda w: quant.dequantize_int4(quant.quantize_int4(w)[0], quant.quantize_int4(w)[1],
                                     torch.zeros(4, 3, dtype=torch.uint8, device=DEVICE)), ValueError, "w_zero"),
    (lambda w: quant.dequantize_int4(quant.quantize_int4(w)[0].int(), quant.quantize_int4(w)[1]), TypeError, "w_q"),
])
def test_int4_bad_input(call, exc, word):
    with pytest.raises(exc, match=word):
        call(randn(4, 256, dtype=torch.float16))


# ---------------------------------------------------------------------------------------------
# GPTQ / AWQ import: packers written from the formats' documentation, independent of gemmkit

GPTQ_ORDER = list(range(8))
AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's WQLinear_GEMM.from_linear order_map


def to_int32(acc):
    """Unsigned 32-bit patterns (int64) as the int32 tensors checkpoints hold."""
    return torch.where(acc >= 2**31, acc - 2**32, acc).to(torch.int32)


def pack_rows(v):
    """int (R, C) -> int32 (R // 8, C): rows 8r..8r+7 in nibbles 0..7 (GPTQ qweight)."""
    acc = torch.zeros(v.shape[0] // 8, v.shape[1], dtype=torch.int64, device=v.device)
    for i in range(8):
        acc |= v[i::8].to(torch.int64) << (4 * i)
    return to_int32(acc)


def pack_cols(v, order):
    """int (R, C) -> int32 (R, C // 8): nibble i of column c holds column 8c + order[i]."""
    acc = torch.zeros(v.shape[0], v.shape[1] // 8, dtype=torch.int64, device=v.device)
    for i in range(8):
        acc |= v[:, order[i]::8].to(torch.int64) << (4 * i)
    return to_int32(acc)


def known_layer(K, N, gs):
    q = torch.randint(0, 16, (K, N), device=DEVICE)
    z = torch.randint(1, 16, (K // gs, N), device=DEVICE)  # GPTQ v1 cannot store a zero of 0
    s = (torch.rand(K // gs, N, device=DEVICE) * 0.02 + 0.001).half()
    return q, z, s


@pytest.mark.parametrize("gs", [32, 128])
@pytest.mark.parametrize("act_order", [False, True])
def test_from_gptq(gs, act_order):
    K, N = sizes((256, 64), (4096, 1024))
    q, z, s = known_layer(K, N, gs)
    g_idx = torch.arange(K, device=DEVICE) // gs
    if act_order:
        g_idx = g_idx[torch.randperm(K, device=DEVICE)]
    # logical dequantized weight (N, K): channel k belongs to group g_idx[k]
    ref = ((q - z[g_idx]).double() * s[g_idx].double()).t()
    qweight, qzeros = pack_rows(q), pack_cols(z - 1, GPTQ_ORDER)  # v1: zero stored minus one
    w_q, w_s, w_z, group, perm = quant.from_gptq(qweight, qzeros, s, g_idx.to(torch.int32))
    assert group == gs and w_s.dtype == torch.float16 and w_s.shape == (N, K // gs) and w_z.shape == (N, K // gs)
    d = quant.dequantize_int4(w_q, w_s, w_z, group).double()
    if act_order:
        assert perm.dtype == torch.int64 and perm.shape == (K,)
        assert (g_idx[perm].diff() >= 0).all(), "groups contiguous after the permutation"
        assert torch.equal(d, ref[:, perm])
        x = randn(3, K, dtype=torch.float64)
        torch.testing.assert_close(x[:, perm] @ d.t(), x @ ref.t())
    else:
        assert perm is None and torch.equal(d, ref)
    assert quant.from_gptq(qweight, qzeros, s)[4] is None  # no g_idx: trivial order


def test_gptq_known_bits():
    qweight = torch.full((1, 8), 0x76543210, dtype=torch.int32, device=DEVICE)  # column n: k = i holds i
    qzeros = torch.tensor([[0x7654321F]], dtype=torch.int32, device=DEVICE)  # nibbles 15, 1, ..., 7
    scales = torch.ones(1, 8, dtype=torch.float16, device=DEVICE)
    w_q, _, w_z, group, _ = quant.from_gptq(qweight, qzeros, scales)
    assert group == 8 and quant.unpack_int4(w_q).tolist() == [list(range(8))] * 8
    assert w_z[:, 0].tolist() == [16, 2, 3, 4, 5, 6, 7, 8]  # stored + 1 (a stored 15 reads as 16)


@pytest.mark.parametrize("gs", [64, 128])
def test_from_awq(gs):
    K, N = sizes((256, 64), (4096, 1024))
    q, z, s = known_layer(K, N, gs)
    z[0, :5] = 0  # AWQ stores zero points as they are: 0 is fine
    g = torch.arange(K, device=DEVICE) // gs
    ref = ((q - z[g]).double() * s[g].double()).t()
    w_q, w_s, w_z, group, perm = quant.from_awq(pack_cols(q, AWQ_PACK_ORDER), pack_cols(z, AWQ_PACK_ORDER), s)
    assert group == gs and perm is None
    assert torch.equal(quant.dequantize_int4(w_q, w_s, w_z, group).double(), ref)


def test_awq_known_bits():
    qweight = torch.full((2, 1), 0x76543210, dtype=torch.int32, device=DEVICE)  # nibble i holds i
    qzeros = torch.tensor([[0x76543210]], dtype=torch.int32, device=DEVICE)
    w_q, _, w_z, group, _ = quant.from_awq(qweight, qzeros, torch.ones(1, 8, dtype=torch.float16, device=DEVICE))
    # logical column 8c + AWQ_PACK_ORDER[i] holds nibble i, so column j holds the inverse order
    assert group == 2 and quant.unpack_int4(w_q)[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert w_z[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def _gptq_args():
    K, N, G = 64, 16, 2
    return (torch.zeros(K // 8, N, dtype=torch.int32, device=DEVICE), torch.zeros(G, N // 8, dtype=torch.int32, device=DEVICE),
            torch.ones(G, N, dtype=torch.float16, device=DEVICE))


@pytest.mark.parametrize("call,exc,word", [
    (lambda a, b, c: quant.from_gptq(a.long(), b, c), TypeError, "qweight"),
    (lambda a, b, c: quant.from_gptq(a, b[:, :1], c), ValueError, "qzeros"),
    (lambda a, b, c: quant.from_gptq(a, b, c[:, :8]), ValueError, "scales"),
    (lambda a, b, c: quant.from_gptq(a[:, :12], b, c[:, :12]), ValueError, "multiple of 8"),
    (lambda a, b, c: quant.from_gptq(a, b[:1].repeat(3, 1), c[:1].repeat(3, 1)), ValueError, "divide"),
    (lambda a, b, c: quant.from_gptq(a, b, c, bits=8), ValueError, "bits"),
    (lambda a, b, c: quant.from_gptq(a, b, c, torch.zeros(63, dtype=torch.int32, device=DEVICE)), ValueError, "g_idx"),
    (lambda a, b, c: quant.from_gptq(a, b, c, torch.full((64,), 2, dtype=torch.int32, device=DEVICE)), ValueError, "g_idx"),
    (lambda a, b, c: quant.from_gptq(a, b, c, torch.arange(64, device=DEVICE) % 2 * (torch.arange(64, device=DEVICE) < 40)),
     ValueError, "g_idx"),
    (lambda a, b, c: quant.from_awq(a.t().contiguous()[:, :1], b, c), ValueError, "scales"),
    (lambda a, b, c: quant.from_awq(a.t().contiguous()[:, :2], b[:, :1], c), ValueError, "qzeros"),
    (lambda a, b, c: quant.from_awq(a.t().contiguous(), b, c.float().int()), TypeError, "scales"),
])
def test_import_bad_input(call, exc, word):
    with pytest.raises(exc, match=word):
        call(*_gptq_args())


# ---------------------------------------------------------------------------------------------
# MXFP4

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def exact_pow2(e):
    """2^e as float64 from its exponent bits, e integer-valued in [-1022, 1023] (CUDA's pow and
    exp2 are not exact for every power of two)."""
    return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)


def mxfp4_reference(t):
    """(codes (*, K) int64, scale exponents (*, K // 32)) by the OCP rule, nearest value by search."""
    x = t.double().reshape(*t.shape[:-1], -1, 32)
    amax = x.abs().amax(-1)
    # floor(log2(amax)) exactly, from the binary exponent (CUDA's double log2 returned
    # 5.999999999999999 for 64.0 on the H100, which floor turns into 5)
    floor_log2 = (torch.frexp(amax).exponent - 1).to(amax.dtype)
    e = torch.where(amax > 0, floor_log2 - 2, torch.full_like(amax, -127)).clamp(-127, 127)
    v = x / exact_pow2(e)[..., None]
    dist = (v.abs()[..., None] - E2M1.to(v.device)).abs()
    tie = dist == dist.amin(-1, keepdim=True)
    even = torch.arange(8, device=v.device) % 2 == 0
    pick = tie & (even | ~(tie & even).any(-1, keepdim=True))  # among ties the even code
    mag = pick.to(torch.int64).argmax(-1)
    code = torch.where((v < 0) & (mag > 0), mag + 8, mag)
    return code.reshape(t.shape), e.to(torch.int64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", sizes([(5, 256), (2, 3, 64)], [(4096, 7168), (2, 3, 2880)]))
def test_mxfp4(dtype, shape):
    t = randn(*shape, dtype=torch.float32)
    block_scale = torch.exp2(torch.randint(-20, 20, (*shape[:-1], shape[-1] // 32), device=DEVICE).float())
    t = t * block_scale.repeat_interleave(32, -1)  # blocks of very different magnitudes
    rows = t.view(-1, shape[-1])
    rows[0, :32] = 0  # a zero block
    rows[0, 32:64] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0] * 4) * torch.tensor([1.0, -1.0]).repeat(16)
    t = t.to(dtype)
    q, s = quant.quantize_mxfp4(t)
    assert q.dtype == torch.uint8 and q.shape == (*shape[:-1], shape[-1] // 2)
    assert s.dtype == torch.uint8 and s.shape == (*shape[:-1], shape[-1] // 32)
    codes = torch.stack((q & 15, q >> 4), -1).reshape(t.shape).to(torch.int64)
    code_ref, e_ref = mxfp4_reference(t)
    assert torch.equal(s.to(torch.int64), e_ref + 127)
    assert torch.equal(codes, code_ref)
    # ties to even and saturation, read from the spec: amax 7 -> exponent 0
    assert codes.view(-1, shape[-1])[0, 32:48].tolist() == [0, 10, 2, 12, 4, 14, 6, 15] * 2
    assert s.view(-1, shape[-1] // 32)[0, :2].tolist() == [0, 127]
    d = quant.dequantize_mxfp4(q, s).double()
    scale = exact_pow2(e_ref).repeat_interleave(32, -1)
    v = (t.double() / scale).abs()
    half_step = torch.where(v < 2, 0.25, torch.where(v < 4, 0.5, 1.0))
    bound = torch.maximum(half_step, v - 6) * scale  # within half a step, or saturated to 6
    assert ((d - t.double()).abs() <= bound).all()
    assert (d.view(-1, shape[-1])[0, :32] == 0).all()


def test_mxfp4_nonfinite_and_tiny():
    t = randn(3, 64, dtype=torch.float32)
    t[0, 3] = float("nan")
    t[1, 40] = float("-inf")
    t[2, :32] = torch.linspace(-1e-40, 1e-40, 32)  # subnormal absmax: exponent clamped to -127
    q, s = quant.quantize_mxfp4(t)
    assert s[0, 0].item() == 255 and s[1, 1].item() == 255 and s[2, 0].item() == 0
    d = quant.dequantize_mxfp4(q, s)
    assert torch.isnan(d[0, :32]).all() and torch.isnan(d[1, 32:]).all()
    assert not torch.isnan(d[0, 32:]).any() and not torch.isnan(d[1, :32]).any()
    code_ref, _ = mxfp4_reference(t[2:])
    assert torch.equal(torch.stack((q[2:] & 15, q[2:] >> 4), -1).reshape(1, 64).to(torch.int64), code_ref)
    assert quant.e8m0_to_float(torch.tensor([0, 1, 127, 254, 255], dtype=torch.uint8)).tolist()[:4] == \
        [2.0**-127, 2.0**-126, 1.0, 2.0**127]
    assert quant.e2m1_values().tolist() == E2M1.tolist() + (-E2M1).tolist()


def test_mxfp4_packing_layout():
    t = torch.tensor([[0.5, 1.0, -6.0, 3.0] + [0.0] * 28], device=DEVICE)  # amax 6: exponent 0
    q, s = quant.quantize_mxfp4(t)
    assert s.tolist() == [[127]] and q[0, :2].tolist() == [0x21, 0x5F]


@pytest.mark.parametrize("call,exc,word", [
    (lambda t: quant.quantize_mxfp4(t.to(torch.int32)), TypeError, "t"),
    (lambda t: quant.quantize_mxfp4(t[:, :48]), ValueError, "multiple of 32"),
    (lambda t: quant.quantize_mxfp4(t[0, 0]), ValueError, "0-d"),
    (lambda t: quant.dequantize_mxfp4(quant.quantize_mxfp4(t)[0], quant.quantize_mxfp4(t)[1][:, :1]), ValueError, "scale"),
    (lambda t: quant.dequantize_mxfp4(quant.quantize_mxfp4(t)[0].int(), quant.quantize_mxfp4(t)[1]), TypeError, "q"),
])
def test_mxfp4_bad_input(call, exc, word):
    with pytest.raises(exc, match=word):
        call(randn(4, 64, dtype=torch.bfloat16))
