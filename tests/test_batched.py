"""Batched GEMM: gemmkit.batched_gemm_a16w16 / batched_gemm_a8w8."""

import pytest
import torch
from conftest import DEVICE, assert_close, randn, sizes

import gemmkit

CFG = sizes(dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16), dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8))
B, M, N, K = sizes((3, 21, 24, 40), (8, 1000, 1024, 512))


def _bmm(x, w, bias=None):
    out = torch.matmul(x.double(), w.double().transpose(-1, -2))
    return out if bias is None else out + (bias.double() if bias.ndim == 1 else bias.double()[:, None, :])


@pytest.mark.parametrize("persistent,tma", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("bias_kind", [None, "shared", "per_batch"])
def test_a16w16(persistent, tma, bias_kind):
    """Every batch's rows through pointers or (tma) through one descriptor over all of them."""
    x, w = randn(B, M, K, dtype=torch.bfloat16), randn(B, N, K, dtype=torch.bfloat16)
    bias = {None: None, "shared": randn(N, dtype=torch.float32), "per_batch": randn(B, N, dtype=torch.float32)}[bias_kind]
    y = gemmkit.batched_gemm_a16w16(x, w, bias, config=dict(CFG, PERSISTENT=persistent, TMA=tma))
    assert y.shape == (B, M, N)
    assert_close(y, _bmm(x, w, bias))


@pytest.mark.parametrize("tma", [False, True])
def test_stride0_weight_and_layouts(tma):
    """A weight shared by the batch (stride 0), a batch slice whose rows are not evenly spaced
    (pointer loads even with TMA asked for) and column-major x[b]."""
    cfg = dict(CFG, TMA=tma)
    x, w = randn(B, M, K, dtype=torch.float16), randn(N, K, dtype=torch.float16)
    assert_close(gemmkit.batched_gemm_a16w16(x, w, config=cfg), _bmm(x, w))
    assert_close(gemmkit.batched_gemm_a16w16(x, w.expand(B, N, K), config=cfg), _bmm(x, w))
    xs = randn(B, M + 3, K, dtype=torch.float16)[:, 1:M + 1]  # batch stride (M + 3) K, not M K
    assert_close(gemmkit.batched_gemm_a16w16(xs, w, config=cfg), _bmm(xs, w))
    xt = randn(B, K, M, dtype=torch.float16).transpose(1, 2)  # column-major x[b]
    assert_close(gemmkit.batched_gemm_a16w16(xt, w, activation="relu"), torch.relu(_bmm(xt, w)))


@pytest.mark.parametrize("bias_kind", [None, "shared", "per_batch"])
def test_shared_weight_as_one_gemm(monkeypatch, bias_kind):
    """One weight for every entry (2-D, or expanded with batch stride 0) and x's entries evenly stacked (padded rows
    too): one gemm_a16w16 over the B * M rows (the library's config); a bias per entry, a caller's config or
    unevenly stacked entries keep the batched kernel. Results against float64, into fresh outputs."""
    from gemmkit.ops import batched

    x, w = randn(B, M, K, dtype=torch.bfloat16), randn(N, K, dtype=torch.bfloat16)
    bias = {None: None, "shared": randn(N, dtype=torch.float32), "per_batch": randn(B, N, dtype=torch.float32)}[bias_kind]
    batched._plans.clear()
    for wb in (w, w.expand(B, N, K)):
        y = gemmkit.batched_gemm_a16w16(x, wb, bias, activation="silu")
        assert y.shape == (B, M, N) and y.is_contiguous()
        assert_close(y, torch.nn.functional.silu(_bmm(x, w, bias)))
    one = [p for p in batched._plans.values() if isinstance(p, batched._SharedWeightPlan)]
    assert len(one) == (0 if bias_kind == "per_batch" else 2)
    xp = randn(B, M, K + 8, dtype=torch.bfloat16)[:, :, :K]  # padded rows: still evenly stacked
    assert_close(gemmkit.batched_gemm_a16w16(xp, w, bias), _bmm(xp, w, bias))
    xs = randn(B, M + 3, K, dtype=torch.bfloat16)[:, 1:M + 1]  # entries not M rows apart: the batched kernel
    assert_close(gemmkit.batched_gemm_a16w16(xs, w, bias), _bmm(xs, w, bias))
    monkeypatch.setattr(batched, "SHARED_WEIGHT_AS_ONE", False)
    batched._plans.clear()
    assert_close(gemmkit.batched_gemm_a16w16(x, w, bias), _bmm(x, w, bias))
    assert not any(isinstance(p, batched._SharedWeightPlan) for p in batched._plans.values())


@pytest.mark.parametrize("scales", ["row", "tensor", "per_batch_w"])
def test_a8w8_shared_weight(scales):
    """batched_gemm_a8w8 with one FP8 weight for every entry: one gemm_a8w8 over the stacked rows where x's scales
    are per tensor or per token and w's shared (per tensor or per channel); one scale per entry for the shared
    weight keeps the batched kernel. Results against float64."""
    from gemmkit.ops import batched

    x, w = randn(B, M, K, dtype=torch.float8_e4m3fn), randn(N, K, dtype=torch.float8_e4m3fn)
    if scales == "row":
        xs, ws = torch.rand(B, M, 1, device=DEVICE), torch.rand(1, N, device=DEVICE)
        ref = _bmm(x.float(), w.float()) * xs.double() * ws.double()
    elif scales == "tensor":
        xs, ws = torch.rand((), device=DEVICE), torch.rand(1, device=DEVICE)
        ref = _bmm(x.float(), w.float()) * xs.double() * ws.double()
    else:
        xs, ws = torch.rand(B, M, 1, device=DEVICE), torch.rand(B, device=DEVICE)
        ref = _bmm(x.float(), w.float()) * xs.double() * ws.double().reshape(B, 1, 1)
    batched._plans.clear()
    bias = randn(N, dtype=torch.float32)
    y = gemmkit.batched_gemm_a8w8(x, w, xs, ws, bias, out_dtype=torch.float32)
    assert_close(y, ref + bias.double(), tol=2e-3)
    one = any(isinstance(p, batched._SharedWeightPlan) for p in batched._plans.values())
    assert one == (scales != "per_batch_w")


@pytest.mark.parametrize("scales", ["row", "tensor", "per_batch"])
def test_a8w8(scales):
    x, w = randn(B, M, K, dtype=torch.float8_e4m3fn), randn(B, N, K, dtype=torch.float8_e4m3fn)
    if scales == "row":
        xs, ws = torch.rand(B, M, 1, device=DEVICE), torch.rand(B, 1, N, device=DEVICE)
    elif scales == "tensor":
        xs, ws = torch.rand((), device=DEVICE), torch.rand(1, device=DEVICE)
    else:
        xs, ws = torch.rand((), device=DEVICE), torch.rand(B, device=DEVICE)
    y = gemmkit.batched_gemm_a8w8(x, w, xs, ws, out_dtype=torch.float32, config=dict(CFG, BLOCK_K=32, TMA=True))
    ws_b = ws.reshape(B, 1, N) if scales == "row" else (ws.reshape(B, 1, 1) if scales == "per_batch" else ws)
    ref = _bmm(x.float(), w.float()) * xs.double() * ws_b.double()
    assert_close(y, ref, tol=2e-3)


def test_a8w8_ambiguous_scale_shape():
    """With B == N a (N,) weight scale is also the (B,) shape of one scale per entry: refused, naming the shapes
    that say which; (1, N) and (B, 1) are taken as documented."""
    n = 4
    x, w = randn(n, M, K, dtype=torch.float8_e4m3fn), randn(n, K, dtype=torch.float8_e4m3fn)
    s = torch.arange(1.0, n + 1, device=DEVICE)
    with pytest.raises(ValueError, match="ambiguous"):
        gemmkit.batched_gemm_a8w8(x, w, torch.tensor(1.0, device=DEVICE), s)
    base = _bmm(x.float(), w.float())
    y = gemmkit.batched_gemm_a8w8(x, w, torch.tensor(1.0, device=DEVICE), s.reshape(1, n), out_dtype=torch.float32)
    assert_close(y, base * s.double().reshape(1, 1, n), tol=2e-3)
    y = gemmkit.batched_gemm_a8w8(x, w, torch.tensor(1.0, device=DEVICE), s.reshape(n, 1), out_dtype=torch.float32)
    assert_close(y, base * s.double().reshape(n, 1, 1), tol=2e-3)


def test_empty_and_bad():
    x, w = randn(B, 0, K, dtype=torch.bfloat16), randn(B, N, K, dtype=torch.bfloat16)
    assert gemmkit.batched_gemm_a16w16(x, w).shape == (B, 0, N)
    x = randn(B, M, K, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="w must be"):
        gemmkit.batched_gemm_a16w16(x, randn(B + 1, N, K, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="x must be 3-D"):
        gemmkit.batched_gemm_a16w16(x[0], w)
    with pytest.raises(TypeError, match="w has dtype"):
        gemmkit.batched_gemm_a16w16(x, w.half())
    with pytest.raises(ValueError, match="bias"):
        gemmkit.batched_gemm_a16w16(x, w, randn(B, N + 1, dtype=torch.float32))


def test_batched_derived_configs():
    """Derived configs of a batch whose tiles fill the SMs: shallower pipelines, 128x256 tiles from
    256 x 4096 per problem; a batch with fewer tiles than SMs keeps the derived config."""
    from gemmkit.core.config import derive_config
    from gemmkit.core.device import known_device
    from gemmkit.core.formats import dense
    from gemmkit.core.grouped import family_config_for

    h100, f = known_device("NVIDIA_H100_80GB_HBM3"), dense(torch.bfloat16)
    big = family_config_for(None, 512, 4096, 4096, h100, f, f, 2, None, batch=8)
    assert (big.BLOCK_M, big.BLOCK_N, big.num_warps, big.num_stages) == (128, 256, 8, 4) and big.PERSISTENT
    mid = family_config_for(None, 2048, 1024, 1024, h100, f, f, 2, None, batch=8)
    assert (mid.BLOCK_N, mid.num_stages) == (128, 3)
    few = family_config_for(None, 128, 128, 4096, h100, f, f, 2, None, batch=32)
    assert few == derive_config(128, 128, 4096, h100, f, f, 2)
    grouped = family_config_for(None, 16, 4096, 4096, h100, f, f, 2, None)  # grouped: TMA, at most 3 stages
    derived = derive_config(16, 4096, 4096, h100, f, f, 2)
    assert grouped.TMA and not derived.TMA and grouped.num_stages <= 3
    assert (grouped.BLOCK_M, grouped.BLOCK_N, grouped.BLOCK_K) == (32, 64, 128)  # tens of rows per expert
    tiny = family_config_for(None, 4, 4096, 4096, h100, f, f, 2, None)
    assert tiny.BLOCK_M == derive_config(4, 4096, 4096, h100, f, f, 2).BLOCK_M and tiny.TMA
    wide = family_config_for(None, 512, 4096, 4096, h100, f, f, 2, None)
    assert wide.TMA and wide.num_stages <= 3 and wide.BLOCK_M == derive_config(512, 4096, 4096, h100, f, f, 2).BLOCK_M
