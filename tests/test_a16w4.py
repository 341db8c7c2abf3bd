"""Correctness of gemm_a16w4 (INT4 weights in groups, bf16/fp16 activations), Int4Linear and the
4-bit configs, against float64 references of the dequantized weights."""

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import gemmkit
import gemmkit.nn as gnn
from gemmkit import quant
from gemmkit.core.config import GemmConfig, derive_config
from gemmkit.core.config import clear_caches as config_clear_caches
from gemmkit.core.device import known_device
from gemmkit.core.formats import Scale, check_block_k, dense, packed4
from conftest import DEVICE, ON_GPU, assert_close, kernel_paths, poisoned, randn, reference, sizes

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
H100 = known_device("NVIDIA_H100_80GB_HBM3")
PATHS = {k: v for k, v in kernel_paths(gpu_block_k=64).items() if k != "tma_warp_specialized"}
RAGGED = sizes([(1, 40, 128), (20, 40, 192)], [(1, 4096, 4096), (200, 333, 1024), (1024, 1024, 1024)])


def int4_weight(N, K, group_size=64, symmetric=False, dtype=BF16):
    w = randn(N, K, dtype=FP32, scale=K**-0.5).to(dtype)
    q, s, z = quant.quantize_int4(w, group_size, symmetric)
    return q, s, z, quant.dequantize_int4(q, s, z, group_size, torch.float64)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("M,N,K", RAGGED)
def test_paths_ragged(path, M, N, K):
    """Every kernel path (pointer, TMA x, persistent, split-K, stream-K), ragged M and N."""
    x = randn(M, K, dtype=BF16)
    q, s, z, wd = int4_weight(N, K)
    bias = randn(N, dtype=BF16)
    y = poisoned((M, N), BF16)
    out = gemmkit.gemm_a16w4(x, q, s, z, group_size=64, bias=bias, y=y, config=PATHS[path])
    assert out is y
    assert_close(out, reference(x, wd, bias))


@pytest.mark.parametrize("group_size", [32, 64, 128, None, -1])
@pytest.mark.parametrize("symmetric", [False, True])
def test_groups_symmetric(group_size, symmetric):
    """Every group size, symmetric (zero point 8) and asymmetric; K tiles holding one group and
    several (BLOCK_K 64 over groups of 32), M = 1."""
    M, N, K = 1, 24, 256
    x = randn(M, K, dtype=BF16)
    q, s, z, wd = int4_weight(N, K, group_size, symmetric)
    assert (z is None) == symmetric
    for cfg in (None, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=64)):
        out = gemmkit.gemm_a16w4(x, q, s, z, group_size=group_size, config=cfg)
        assert_close(out, reference(x, wd))


def test_per_channel_k_not_a_multiple_of_block_k():
    """One group per channel with K = 96: the last K tile is ragged (masked packed loads)."""
    M, N, K = 5, 20, 96
    x = randn(M, K, dtype=BF16)
    q, s, z, wd = int4_weight(N, K, None)
    out = gemmkit.gemm_a16w4(x, q, s, z, group_size=None, config=dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=64))
    assert_close(out, reference(x, wd))


def test_fp16_activation_3d_fp32_out_and_scales():
    """fp16 x (*, K), fp32 output, silu; scales in float32 and transposed (any layout)."""
    N, K = 33, 128
    x = randn(2, 3, K, dtype=FP16)
    q, s, z, wd = int4_weight(N, K, 32, dtype=FP16)
    s32 = s.float().t().contiguous().t()
    out = gemmkit.gemm_a16w4(x, q, s32, z, group_size=32, activation="silu", out_dtype=FP32)
    assert out.shape == (2, 3, N) and out.dtype == FP32
    # (the dequantized weight is rounded to fp16, x's type, for the dot: fp16's error, not fp32's)
    assert_close(out.reshape(6, N), reference(x.reshape(6, K), wd, activation="silu"), tol=2e-3)


def _gptq_tensors(K, N, G, act_order):
    """Random GPTQ v1 tensors and the float64 weight they mean, computed from the format's
    definition (independently of gemmkit.quant)."""
    qweight = torch.randint(-2**31, 2**31 - 1, (K // 8, N), dtype=torch.int32, device=DEVICE)
    qzeros = torch.randint(-2**31, 2**31 - 1, (G, N // 8), dtype=torch.int32, device=DEVICE)
    qzeros[0, 0] = -1  # every nibble 15: zero point 16
    scales = (torch.rand(G, N, device=DEVICE) * 0.02 + 0.005).to(FP16)
    gs = K // G
    g_idx = torch.arange(K, device=DEVICE) // gs
    if act_order:
        g_idx = g_idx[torch.randperm(K, device=DEVICE)]
    k = torch.arange(K, device=DEVICE)
    q = (qweight.to(torch.int64)[k // 8] >> (4 * (k % 8))[:, None]) & 15  # (K, N)
    n = torch.arange(N, device=DEVICE)
    z = ((qzeros.to(torch.int64)[:, n // 8] >> (4 * (n % 8))[None, :]) & 15) + 1  # (G, N)
    w = (q - z[g_idx]).double() * scales.double()[g_idx]  # (K, N)
    return qweight, qzeros, scales, g_idx, w.T


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_import_through_op_and_layer(act_order):
    M, N, K, G = 3, 32, 256, 2
    qweight, qzeros, scales, g_idx, w = _gptq_tensors(K, N, G, act_order)
    x = randn(M, K, dtype=FP16)
    w_q, w_scale, w_zero, gs, perm = quant.from_gptq(qweight, qzeros, scales, g_idx)
    assert (perm is not None) == act_order and int(w_zero.max()) == 16
    xp = x if perm is None else x[:, perm]
    assert_close(gemmkit.gemm_a16w4(xp, w_q, w_scale, w_zero, group_size=gs), reference(x, w))
    layer = gnn.Int4Linear.from_gptq(qweight, qzeros, scales, g_idx)
    assert layer.dtype == FP16 and (layer.perm is not None) == act_order
    with torch.no_grad():
        assert_close(layer(x), reference(x, w))
        bf = gnn.Int4Linear.from_gptq(qweight, qzeros, scales, g_idx, dtype=BF16)
        assert_close(bf(x.to(BF16)), reference(x.to(BF16), w))


def test_gptq_group_the_op_cannot_run_refused_at_load():
    """A GPTQ checkpoint in groups of 16 imports (quant.from_gptq is format-general), but Int4Linear refuses it when
    built, not at its first forward: gemm_a16w4 takes power-of-two groups from 32."""
    qweight, qzeros, scales, g_idx, _w = _gptq_tensors(64, 16, 4, False)
    assert quant.from_gptq(qweight, qzeros, scales, g_idx)[3] == 16
    with pytest.raises(ValueError, match="group_size=16"):
        gnn.Int4Linear.from_gptq(qweight, qzeros, scales, g_idx)
    assert "group_size=16" in gnn.Int4Linear.unsupported(torch.nn.Linear(64, 16), group_size=16)


def test_awq_import_through_op():
    M, N, K, G = 2, 16, 128, 4
    qweight = torch.randint(-2**31, 2**31 - 1, (K, N // 8), dtype=torch.int32, device=DEVICE)
    qzeros = torch.randint(-2**31, 2**31 - 1, (G, N // 8), dtype=torch.int32, device=DEVICE)
    scales = (torch.rand(G, N, device=DEVICE) * 0.02 + 0.005).to(FP16)
    order = (0, 4, 1, 5, 2, 6, 3, 7)  # column 8c + j sits at nibble order[j]
    n = torch.arange(N, device=DEVICE)
    shift = 4 * torch.tensor(order, device=DEVICE)[n % 8]
    q = (qweight.to(torch.int64)[:, n // 8] >> shift) & 15  # (K, N)
    z = (qzeros.to(torch.int64)[:, n // 8] >> shift) & 15  # (G, N)
    gk = torch.arange(K, device=DEVICE) // (K // G)
    w = ((q - z[gk]).double() * scales.double()[gk]).T
    x = randn(M, K, dtype=FP16)
    w_q, w_scale, w_zero, gs, _ = quant.from_awq(qweight, qzeros, scales)
    assert_close(gemmkit.gemm_a16w4(x, w_q, w_scale, w_zero, group_size=gs), reference(x, w))
    layer = gnn.Int4Linear.from_awq(qweight, qzeros, scales)
    with torch.no_grad():
        assert_close(layer(x), reference(x, w))


def _bad_cases():
    M, N, K = 2, 16, 128
    x = randn(M, K, dtype=BF16)
    q, s, z, _ = int4_weight(N, K, 64)
    return [
        (TypeError, "w_q has dtype", (x, q.to(torch.int8), s, z), {}),
        (ValueError, "two 4-bit values per byte", (x, torch.zeros(N, K, dtype=torch.uint8, device=DEVICE), s, z), {}),
        (ValueError, "contiguous along K", (x, torch.zeros(K // 2, N, dtype=torch.uint8, device=DEVICE).t(), s, z), {}),
        (ValueError, "w_scale has shape", (x, q, s[:, :1], z), {}),
        (ValueError, "w_scale has shape", (x, q, s, z), dict(group_size=32)),
        (TypeError, "w_zero has dtype", (x, q, s, z.to(torch.int32)), {}),
        (ValueError, "w_zero has shape", (x, q, s, z.t()), {}),
        (TypeError, "w_scale has dtype", (x, q, s.to(torch.int32), z), {}),
        (TypeError, "x has dtype", (x.float(), q, s, z), {}),
        (ValueError, "power of two", (x, q, s, z), dict(group_size=48)),
        (ValueError, "power of two", (x, q, s, z), dict(group_size=0)),
        (ValueError, "not a multiple of group_size=64", (randn(M, 96, dtype=BF16), q[:, :48], s, z), {}),
    ]


@pytest.mark.parametrize("case", range(12))
def test_bad_inputs(case):
    error, match, args, kw = _bad_cases()[case]
    with pytest.raises(error, match=match):
        gemmkit.gemm_a16w4(*args, group_size=kw.get("group_size", 64))


def test_empty_m():
    q, s, z, _ = int4_weight(16, 64, 32)
    assert gemmkit.gemm_a16w4(randn(0, 64, dtype=BF16), q, s, z, group_size=32).shape == (0, 16)


def test_formats_and_derived_configs():
    """The 4-bit weight counts half a byte in the shared-memory estimate; derived configs for decode
    use 16-row tiles and pointer loads, with no BLOCK_K limit from the groups."""
    a, b4 = dense(BF16), packed4(BF16, Scale.GROUP, 128)
    assert b4.bytes == 0.5 and b4.dot_bits == 16 and check_block_k(256, a, b4) is None
    cfg = GemmConfig(16, 64, 256)
    assert cfg.smem_bytes(a, b4, 2) < cfg.smem_bytes(a, dense(BF16), 2)
    small = derive_config(1, 4096, 4096, H100, a, b4, 2)
    assert small.BLOCK_M == 16 and not small.TMA and small.BLOCK_K >= 128
    assert small.fits(H100, a, b4, 2)
    large = derive_config(4096, 4096, 4096, H100, a, b4, 2)
    assert large.BLOCK_M >= 64 and large.fits(H100, a, b4, 2)
    decode_split = derive_config(1, 1024, 8192, H100, a, packed4(BF16, Scale.MX, 32), 2)
    assert decode_split.SPLIT_K > 1  # few tiles, long K


# nn layers -------------------------------------------------------------------------------------

@pytest.mark.parametrize("group_size,symmetric", [(128, False), (32, True), (None, False)])
def test_int4_linear_from_linear_state_dict(group_size, symmetric):
    K, N = 256, 48
    lin = nn.Linear(K, N).to(device=DEVICE, dtype=BF16)
    layer = gnn.Int4Linear.from_linear(lin, group_size=group_size, symmetric=symmetric)
    x = randn(2, 3, K, dtype=BF16)
    with torch.no_grad():
        out = layer(x)
        wd = quant.dequantize_int4(layer.weight, layer.weight_scale, layer.weight_zero, group_size, torch.float64)
        assert_close(out.reshape(6, N), reference(x.reshape(6, K), wd, lin.bias))
        assert_close(out, lin(x).double(), tol=0.15)  # within the 4-bit quantization error
        other = gnn.Int4Linear(K, N, group_size=group_size, symmetric=symmetric, device=DEVICE)
        other.load_state_dict(layer.state_dict())
        assert torch.equal(other(x), out)
    assert "int4" in repr(layer)
    with pytest.raises(ValueError, match="group size"):
        gnn.Int4Linear.from_linear(nn.Linear(96, 8).to(device=DEVICE, dtype=BF16), group_size=64)


def test_convert_int4():
    model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 40), nn.Linear(40, 8)).to(DEVICE, BF16)
    x = randn(3, 128, dtype=BF16)
    with torch.no_grad():
        ref = model(x).double()
        with pytest.warns(UserWarning, match="left 1 layer"):
            report = gnn.convert(model, "int4", group_size=32)
        assert report.converted == ["0", "2"] and list(report.unsupported) == ["3"]
        assert isinstance(model[0], gnn.Int4Linear) and model[0].group_size == 32
        assert_close(model(x), ref, tol=0.2)


@pytest.mark.parametrize("group_size,dtype", [(128, BF16), (32, FP16), (None, BF16)])
def test_prefill_route(monkeypatch, group_size, dtype):
    """From DEQUANT_MIN_M rows (config None; the Hopper prefill kernel off) the weight is dequantized in
    one pass and the A16W16 GEMM runs on it (ops/packed_prefill.py); an explicit config still runs the
    fused kernel. Both agree with the float64 reference, with bias, activation and a preallocated output."""
    from gemmkit.core import hopper_w4
    from gemmkit.ops import a16w4, packed_prefill

    monkeypatch.setattr(hopper_w4, "PREFILL_MIN_M", 1 << 30)
    config_clear_caches()

    M, N, K = packed_prefill.DEQUANT_MIN_M + 3, 40, 96 if group_size is None else 256
    x = randn(M, K, dtype=dtype)
    w = randn(N, K, dtype=FP32, scale=K**-0.5).to(dtype)
    q, s, z = quant.quantize_int4(w, group_size, False)
    wd = quant.dequantize_int4(q, s, z, group_size, torch.float64)
    bias = randn(N, dtype=dtype)
    ref = reference(x, wd, bias, "silu")
    y = poisoned((M, N), dtype)
    out = gemmkit.gemm_a16w4(x, q, s, z, group_size=group_size, bias=bias, activation="silu", y=y)
    assert out is y
    assert_close(out, ref)
    plans = [p for p in a16w4._plans.values() if isinstance(p, packed_prefill.DequantThenGemm)]
    assert plans, "the prefill route was not taken"
    wq_d = packed_prefill.dequantize_packed(q, s, z, group_size or 128, True, dtype)
    assert torch.equal(wq_d, wd.to(dtype))
    fused = gemmkit.gemm_a16w4(x, q, s, z, group_size=group_size, bias=bias, activation="silu",
                               config=dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=64))
    assert_close(fused, ref)


@pytest.mark.parametrize("layout", ["contiguous", "column_major", "odd_offset", "odd_row_stride"])
def test_x_layouts(layout):
    """x's even / odd columns meet the packed weight's low / high nibbles: read as 32-bit words
    where x is K-contiguous with 4-byte aligned rows, else as two strided loads (column-major x,
    a 2-byte offset, an odd row stride); every layout gives the same result."""
    M, N, K = 5, 40, 128
    q, s, z, wd = int4_weight(N, K, 64)
    base = randn(M, K + 1, dtype=BF16)
    x = {"contiguous": base[:, :K].contiguous(),
         "column_major": base[:, :K].t().contiguous().t(),
         "odd_offset": base.reshape(-1)[1:1 + M * K].view(M, K),
         "odd_row_stride": base[:, 1:]}[layout]
    assert_close(gemmkit.gemm_a16w4(x, q, s, z, group_size=64), reference(x, wd))
    qm, sm = quant.quantize_mxfp4(wd.float())
    assert_close(gemmkit.gemm_a16wfp4(x, qm, sm), reference(x, quant.dequantize_mxfp4(qm, sm, torch.float64)))


@pytest.mark.skipif(ON_GPU, reason="the CPU interpreter's fixes")
def test_prefill_dequantization_first_in_a_fresh_process():
    """The prefill route's dequantization pass, launched directly (not through the launcher), as the
    first kernel of a process: the interpreter's fixes must be in place for it too."""
    code = ("import torch; from gemmkit import quant; from gemmkit.ops import packed_prefill\n"
            "w = torch.randn(40, 256) / 16\n"
            "q, s, z = quant.quantize_int4(w.bfloat16(), 128, False)\n"
            "ref = quant.dequantize_int4(q, s, z, 128, torch.float64)\n"
            "out = packed_prefill.dequantize_packed(q, s, z, 128, True, torch.bfloat16)\n"
            "assert (out.double() - ref).abs().max() < 1e-2, (out.double() - ref).abs().max()\n")
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
