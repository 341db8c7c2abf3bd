"""Correctness of gemm_a8w8_blockscale (FP8 with 1x128 activation / 128x128 weight block scales,
static and dynamic) and of gemm_a8w8's exact accumulation (fast_accum=False)."""

import pytest
import torch

import gemmkit
from gemmkit import quant
from gemmkit.quant import dequantize_fp8_blockwise, quantize_fp8_blockwise
from conftest import DEVICE, ON_GPU, assert_close, check_refused, kernel_paths, poisoned, randn, reference, sizes

E4M3, E5M2, INT8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.int8
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

# BLOCK_K must divide the 128-wide scale groups: 64 (and 128 for the small-M paths) on the GPU
PATHS = {k: v for k, v in kernel_paths(gpu_block_k=64).items() if k != "tma_warp_specialized"}
RAGGED = sizes([(1, 40, 80), (40, 136, 200), (20, 17, 300)],
               [(1, 2112, 7168), (200, 333, 1000), (1024, 1024, 1024), (300, 500, 40), (77, 4096, 7168)])


def operands(M, N, K, x_dtype=E4M3, w_dtype=E4M3, scale_format="float32", lead=None):
    """Block-quantized x (M, K) (or (*lead, K)) and w (N, K) with their scales, and the float64
    dequantized values (the reference's operands)."""
    x = randn(*(lead or (M,)), K, dtype=FP32, scale=3.0)
    w = randn(N, K, dtype=FP32) / K**0.5
    xq, xs = quantize_fp8_blockwise(x, (1, 128), x_dtype, scale_format)
    wq, ws = quantize_fp8_blockwise(w, (128, 128), w_dtype, scale_format)
    xd = dequantize_fp8_blockwise(xq, xs, dtype=torch.float64).reshape(-1, K)
    wd = dequantize_fp8_blockwise(wq, ws, (128, 128), dtype=torch.float64)
    return xq, xs, wq, ws, xd, wd


def col_major(s):
    return s.t().contiguous().t()


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("M,N,K", RAGGED)
def test_paths_ragged(path, M, N, K):
    xq, xs, wq, ws, xd, wd = operands(M, N, K)
    bias = randn(N, dtype=BF16)
    y = poisoned((M, N), FP32)
    out = gemmkit.gemm_a8w8_blockscale(xq, wq, col_major(xs), ws, bias, out_dtype=FP32, y=y, config=PATHS[path])
    assert out is y
    assert_close(out, reference(xd, wd, bias), tol=2e-3 if ON_GPU else None)


@pytest.mark.parametrize("block_k", [32, 64, 128])
@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("scale_format", ["float32", "ue8m0"])
def test_block_k_scale_layouts_and_formats(block_k, layout, scale_format):
    M, N, K = sizes((12, 136, 260), (260, 1100, 2000))
    xq, xs, wq, ws, xd, wd = operands(M, N, K, scale_format=scale_format)
    if layout == "col":
        xs, ws = col_major(xs), col_major(ws)
    cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=block_k) if not ON_GPU else dict(BLOCK_M=128, BLOCK_N=128,
                                                                                 BLOCK_K=block_k, num_warps=8)
    out = gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, out_dtype=FP32, config=cfg)
    assert_close(out, reference(xd, wd), tol=2e-3 if ON_GPU else None)


@pytest.mark.parametrize("x_dtype,w_dtype", [(E4M3, E5M2), (E5M2, E4M3), (E5M2, E5M2)])
def test_fp8_type_pairs(x_dtype, w_dtype):
    M, N, K = sizes((9, 48, 160), (300, 1000, 1024))
    xq, xs, wq, ws, xd, wd = operands(M, N, K, x_dtype, w_dtype)
    assert_close(gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws), reference(xd, wd))


@pytest.mark.parametrize("out_dtype,bias_dtype", [(BF16, BF16), (FP16, FP16), (FP32, FP32), (BF16, None),
                                                  (FP16, FP32), (FP32, BF16)])
@pytest.mark.parametrize("activation", [None, "relu", "gelu_tanh", "silu"])
def test_out_dtype_bias_activation(out_dtype, activation, bias_dtype):
    M, N, K = sizes((17, 48, 192), (257, 520, 1024))
    xq, xs, wq, ws, xd, wd = operands(M, N, K)
    bias = None if bias_dtype is None else randn(N, dtype=bias_dtype)
    out = gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, bias, activation=activation, out_dtype=out_dtype)
    assert out.dtype == out_dtype and out.shape == (M, N)
    assert_close(out, reference(xd, wd, bias, activation), tol=2e-3 if ON_GPU and out_dtype == FP32 else None)


@pytest.mark.parametrize("layout", ["row", "col"])
def test_leading_dims_and_reuse(layout):
    """x (*, K) with x_scale (*, G) (as the quantizer returns it, or column-major over the
    flattened rows); the cached plan on fresh data."""
    K, N = sizes((200, 40), (1000, 700))
    for _ in range(3):
        xq, xs, wq, ws, xd, wd = operands(6, N, K, lead=(2, 3))
        if layout == "col":
            xs = quant.quantize_fp8_blockwise(dequantize_fp8_blockwise(xq, xs), (1, 128), scale_layout="col")[1]
            assert not xs.is_contiguous()
        out = gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws)
        assert out.shape == (2, 3, N)
        ref = reference(dequantize_fp8_blockwise(xq, xs, dtype=torch.float64).reshape(6, K), wd)
        assert_close(out.reshape(6, N), ref)


def test_scale_that_cannot_be_flattened_refused(monkeypatch):
    xq, xs, wq, ws, _, _ = operands(6, 16, 256, lead=(2, 3))
    bad = torch.ones(3, 2, 2, device=DEVICE).transpose(0, 1)  # (2, 3, 2), rows not uniformly strided
    check_refused(monkeypatch, gemmkit.gemm_a8w8_blockscale, (xq, wq, bad, ws), ValueError, "x_scale")


@pytest.mark.parametrize("M", sizes([1, 16, 70], [1, 16, 64, 65, 256, 1000]))
@pytest.mark.parametrize("capturing", [False, True], ids=["eager", "graph"])
def test_dynamic_matches_quantize_then_static(M, capturing, monkeypatch):
    """x in bf16 with x_scale=None: quantized per 1x128 group (in the GEMM, or by the quantizer
    first): the same as quantize_fp8_blockwise then the static op, and close to the unquantized
    product."""
    from gemmkit.ops import a8w8_blockscale as bs

    monkeypatch.setattr(bs, "capturing", lambda: capturing)
    N, K = sizes((40, 300), (1000, 2048))
    x = randn(M, K, dtype=BF16, scale=2.0)
    _, _, wq, ws, _, wd = operands(1, N, K)
    bias = randn(N, dtype=FP32)
    out = gemmkit.gemm_a8w8_blockscale(x, wq, None, ws, bias, activation="silu")
    xq, xs = quantize_fp8_blockwise(x, (1, 128))
    static = gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, bias, activation="silu")
    torch.testing.assert_close(out.float(), static.float(), rtol=1e-2, atol=1e-2)
    assert_close(out, reference(dequantize_fp8_blockwise(xq, xs, dtype=torch.float64), wd, bias, "silu"))
    full = reference(x, wd, bias, "silu")
    assert ((out.double() - full).norm() / full.norm()) < 0.1


@pytest.mark.parametrize("path", ["ptr", "ptr_small_m", "ptr_splitk", "tma", "ptr_streamk", "tma_persistent"])
def test_dynamic_paths(path):
    """The in-kernel quantization on every path (BLOCK_K forced to 128, its group)."""
    from gemmkit.ops.a8w8_blockscale import _dynamic_path

    M, N, K = sizes((37, 40, 300), (300, 1000, 2048))
    x = randn(M, K, dtype=FP16)
    _, _, wq, ws, _, wd = operands(1, N, K)
    cfg = dict(PATHS[path], BLOCK_K=128)
    xq, xs = quantize_fp8_blockwise(x, (1, 128))
    ref = reference(dequantize_fp8_blockwise(xq, xs, dtype=torch.float64), wd)
    for which in ("fused", "quantize"):
        assert_close(_dynamic_path(x, wq, ws, which, out_dtype=FP32, config=cfg), ref,
                     tol=2e-3 if ON_GPU else None)


def test_dynamic_dispatch(monkeypatch):
    """One fused GEMM eagerly with small M; the quantizer then the GEMM for large M or under
    graph capture."""
    from gemmkit.core import launcher
    from gemmkit.ops import a8w8_blockscale as bs

    launched = []
    for name in ("launch_jit", "launch_compiled", "launch_direct"):
        real = getattr(launcher, name)
        label = {"launch_jit": lambda f: f.__name__, "launch_compiled": lambda k: k.name,
                 "launch_direct": lambda d: d[0].name}[name]
        monkeypatch.setattr(launcher, name, lambda f, *a, real=real, label=label: (launched.append(label(f)),
                                                                                     real(f, *a))[1])
    capture = [False]
    monkeypatch.setattr(bs, "capturing", lambda: capture[0])
    N, K = 40, 256
    _, _, wq, ws, _, _ = operands(1, N, K)

    def kernels(M, capturing=False):
        bs._plans.clear()
        capture[0] = capturing
        launched.clear()
        gemmkit.gemm_a8w8_blockscale(randn(M, K, dtype=BF16), wq, None, ws)
        return [n for n in launched if n != "quantize_fp8_blockwise"]

    gemm_only = kernels(8)
    assert len(gemm_only) == 1 and gemm_only[0] == "gemm_kernel"
    assert len(kernels(8, capturing=True)) == 2
    assert kernels(bs.FUSED_QUANT_MAX_M) == gemm_only
    two = kernels(bs.FUSED_QUANT_MAX_M + 1)
    assert len(two) == 2 and two[-1] == "gemm_kernel"


def test_block_k_must_divide_128():
    xq, xs, wq, ws, _, _ = operands(4, 32, 256)
    for bk in (256, 96):
        with pytest.raises(ValueError, match="BLOCK_K"):
            gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, config=dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=bk))
    with pytest.raises(ValueError, match="BLOCK_K"):  # 16-bit x: quantized per 128-wide K tile
        gemmkit.gemm_a8w8_blockscale(randn(4, 256, dtype=BF16), wq, None, ws,
                                     config=dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64))


def test_y_overlapping_an_input_refused():
    M, N, K = 8, 64, 128
    xq, xs, wq, ws, _, _ = operands(M, N, K)
    bias = torch.zeros(M * N, dtype=FP32, device=DEVICE)
    y = bias.view(M, N)
    with pytest.raises(ValueError, match="overlap"):
        gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, bias[:N], out_dtype=FP32, y=y)
    scale_buf = torch.ones(M * N, dtype=FP32, device=DEVICE)
    with pytest.raises(ValueError, match="overlap"):
        gemmkit.gemm_a8w8_blockscale(xq, wq, scale_buf[:M].view(M, 1), ws, out_dtype=FP32, y=scale_buf.view(M, N))


def test_empty_shapes():
    w = torch.empty(8, 0, dtype=E4M3, device=DEVICE)
    bias = randn(8, dtype=FP32)
    x = torch.empty(3, 0, dtype=E4M3, device=DEVICE)
    out = gemmkit.gemm_a8w8_blockscale(x, w, _ones(3, 0), _ones(1, 0), bias, activation="relu", out_dtype=FP32)
    torch.testing.assert_close(out, torch.relu(bias).expand(3, 8))
    xq, xs, wq, ws, _, _ = operands(1, 16, 128)
    assert gemmkit.gemm_a8w8_blockscale(xq[:0], wq, xs[:0], ws).shape == (0, 16)


def _e4(M, K):
    return randn(M, K, dtype=FP32).to(E4M3)


def _ones(*shape, dtype=FP32):
    return torch.ones(*shape, dtype=dtype, device=DEVICE)


M0, N0, K0 = 4, 160, 200  # G = 2 K groups, 2 N blocks
BAD = {
    "x bf16 with x_scale": (lambda: (randn(M0, K0, dtype=BF16), _e4(N0, K0), _ones(M0, 2), _ones(2, 2)),
                            ValueError, "x_scale"),
    "x fp8 without x_scale": (lambda: (_e4(M0, K0), _e4(N0, K0), None, _ones(2, 2)), ValueError, "x_scale"),
    "x int8": (lambda: (torch.ones(M0, K0, dtype=INT8, device=DEVICE), _e4(N0, K0), _ones(M0, 2), _ones(2, 2)),
               TypeError, "x"),
    "x fp32": (lambda: (randn(M0, K0, dtype=FP32), _e4(N0, K0), None, _ones(2, 2)), TypeError, "x"),
    "w bf16": (lambda: (_e4(M0, K0), randn(N0, K0, dtype=BF16), _ones(M0, 2), _ones(2, 2)), TypeError, "w"),
    "w int8": (lambda: (_e4(M0, K0), torch.ones(N0, K0, dtype=INT8, device=DEVICE), _ones(M0, 2), _ones(2, 2)),
               TypeError, "w"),
    "x_scale per token": (lambda: (_e4(M0, K0), _e4(N0, K0), _ones(M0, 1), _ones(2, 2)), ValueError, "x_scale"),
    "x_scale transposed": (lambda: (_e4(M0, K0), _e4(N0, K0), _ones(2, M0), _ones(2, 2)), ValueError, "x_scale"),
    "x_scale 1-D": (lambda: (_e4(M0, K0), _e4(N0, K0), _ones(M0 * 2), _ones(2, 2)), ValueError, "x_scale"),
    "x_scale fp16": (lambda: (_e4(M0, K0), _e4(N0, K0), _ones(M0, 2, dtype=FP16), _ones(2, 2)), TypeError, "x_scale"),
    "x_scale bf16": (lambda: (_e4(M0, K0), _e4(N0, K0), _ones(M0, 2, dtype=BF16), _ones(2, 2)), TypeError,
                     "x_scale"),
    "w_scale per channel": (lambda: (_e4(M0, K0), _e4(N0, K0), _ones(M0, 2), _ones(N0, 2)), ValueError, "w_scale"),
    "w_scale transposed": (lambda: (_e4(M0, K0), _e4(N0, K0), _ones(M0, 2), _ones(2, 1)), ValueError, "w_scale"),
    "w_scale fp16": (lambda: (_e4(M0, K0), _e4(N0, K0), _ones(M0, 2), _ones(2, 2, dtype=FP16)), TypeError,
                     "w_scale"),
    "w_scale missing": (lambda: (_e4(M0, K0), _e4(N0, K0), _ones(M0, 2), None), TypeError, "w_scale"),
    "x not K-contiguous": (lambda: (_e4(K0, M0).t(), _e4(N0, K0), _ones(M0, 2), _ones(2, 2)), ValueError,
                           "K-contiguous"),
    "w not K-contiguous": (lambda: (_e4(M0, K0), _e4(K0, N0).t(), _ones(M0, 2), _ones(2, 2)), ValueError,
                           "K-contiguous"),
    "K mismatch": (lambda: (_e4(M0, K0), _e4(N0, 128), _ones(M0, 2), _ones(2, 1)), ValueError, "K"),
    "x_scale on another device": (lambda: (_e4(M0, K0), _e4(N0, K0), torch.ones(M0, 2, device="meta"),
                                           _ones(2, 2)), ValueError, "x_scale is on"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(case, monkeypatch):
    make, exc, word = BAD[case]
    check_refused(monkeypatch, gemmkit.gemm_a8w8_blockscale, make(), exc, word)


def test_bad_bias_out_dtype_activation():
    xq, xs, wq, ws, _, _ = operands(4, 32, 128)
    with pytest.raises((TypeError, ValueError), match="bias"):
        gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, randn(31, dtype=BF16))
    with pytest.raises((TypeError, ValueError), match="bias"):
        gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, torch.ones(32, dtype=INT8, device=DEVICE))
    with pytest.raises((TypeError, ValueError), match="out_dtype"):
        gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, out_dtype=E4M3)
    with pytest.raises((TypeError, ValueError), match="activation"):
        gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, activation="tanh")


# gemm_a8w8's exact accumulation -----------------------------------------------------------------

# (K tiles of at most 128: fast_accum=False refuses deeper ones)
A8W8_PATHS = {k: dict(v, BLOCK_K=min(v["BLOCK_K"], 128)) for k, v in kernel_paths(gpu_block_k=128).items()
              if k != "tma_warp_specialized"}


# fast_accum=False promotes each K tile's partial sum to fp32; inside a tile (at most 128 of K) the
# Hopper FP8 tensor cores still accumulate with their reduced precision (as DeepGEMM's 128-wide
# promotion and cuBLASLt's do): above the fp32 tolerance on the H100 at K = 4096, where fast
# accumulation over all of K is allowed 2e-3 (tests/test_a8w8.py); the interpreter is exact.
EXACT_TOL = 5e-4


@pytest.mark.parametrize("path", list(A8W8_PATHS))
def test_a8w8_exact_accumulation_paths(path):
    M, N, K = sizes((33, 40, 200), (300, 500, 4096))
    x = randn(M, K, dtype=FP32, scale=2.0).to(E4M3)
    w = randn(N, K, dtype=FP32).to(E4M3)
    xs, ws = torch.rand(M, 1, device=DEVICE) + 0.5, torch.rand(1, N, device=DEVICE) + 0.5
    bias = randn(N, dtype=BF16)
    y = poisoned((M, N), FP32)
    out = gemmkit.gemm_a8w8(x, w, xs, ws, bias, out_dtype=FP32, y=y, config=A8W8_PATHS[path], fast_accum=False)
    assert out is y
    assert_close(out, reference(x, w, bias, x_scale=xs, w_scale=ws), tol=EXACT_TOL)


def test_a8w8_exact_accumulation_dynamic_and_bad_flag():
    M, N, K = sizes((5, 40, 96), (64, 1000, 2048))
    x = randn(M, K, dtype=BF16)
    w = randn(N, K, dtype=FP32).to(E4M3)
    ws = torch.rand(1, N, device=DEVICE) + 0.5
    xq, xs = quant.quantize_fp8(x, "row")
    out = gemmkit.gemm_a8w8(x, w, None, ws, out_dtype=FP32, fast_accum=False)
    assert_close(out, reference(xq, w, x_scale=xs, w_scale=ws), tol=EXACT_TOL)
    with pytest.raises(TypeError, match="fast_accum"):
        gemmkit.gemm_a8w8(xq, w, xs, ws, fast_accum="no")


@pytest.mark.skipif(not ON_GPU, reason="Hopper's reduced-precision FP8 accumulation exists on the GPU only")
@pytest.mark.parametrize("M,N", [(256, 1024), (512, 4096)])  # the tl kernel; on sm_90 the Gluon one (test_hopper_ws)
def test_a8w8_exact_accumulation_matches_scaled_mm_at_long_k(M, N):
    """K = 16384: gemmkit's fast_accum=False error against float64 within 2x of
    torch._scaled_mm(use_fast_accum=False)'s on the same FP8 inputs."""
    K = 16384
    x = randn(M, K, dtype=FP32) + 0.5  # a nonzero mean: the sums grow along K, as accumulation errors show
    w = randn(N, K, dtype=FP32) + 0.5
    # tensor-wise scales: _scaled_mm writes fp32 with those (row-wise takes a bf16 output only)
    xq, xs = quant.quantize_fp8(x, "tensor")
    wq, ws = quant.quantize_fp8(w, "tensor")
    ref = reference(xq, wq, x_scale=xs, w_scale=ws)
    ours = gemmkit.gemm_a8w8(xq, wq, xs, ws, out_dtype=FP32, fast_accum=False)
    torch_out = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=FP32, use_fast_accum=False)

    def err(out):
        return ((out.double() - ref).norm() / ref.norm()).item()

    assert err(ours) <= 2 * err(torch_out), (err(ours), err(torch_out))


def test_a8w8_exact_accumulation_promotes_at_least_every_128_of_k(monkeypatch):
    """fast_accum=False: no K tile deeper than EXACT_MAX_BLOCK_K, whatever the table holds (a deeper
    table entry is cut to it, static and dynamic x); a caller's deeper config is refused."""
    from gemmkit.core import config as cfgmod
    from gemmkit.core.config import GemmConfig
    from gemmkit.ops import a8w8

    deep = GemmConfig(16, 32, 256, num_warps=4, num_stages=2)
    monkeypatch.setattr(a8w8, "resolve_config", lambda *a, **k: deep)
    monkeypatch.setattr(a8w8, "select_config", lambda *a, **k: deep)
    x = randn(5, 512, dtype=BF16)
    w = randn(40, 512, dtype=FP32).to(E4M3)
    ws = torch.rand(1, 40, device=DEVICE) + 0.5
    xq, xs = quant.quantize_fp8(x, "row")
    for args in ((xq, w, xs, ws), (x, w, None, ws)):
        plan = a8w8._make_plan(*args, None, None, None, BF16, None, False)
        plans = [plan.gemm, plan.fused] if hasattr(plan, "gemm") else [plan]
        assert all(p.cfg.BLOCK_K == cfgmod.EXACT_MAX_BLOCK_K for p in plans if p is not None)
    assert a8w8._make_plan(xq, w, xs, ws, None, None, None, BF16, None, True).cfg.BLOCK_K == 256  # fast: as given
    monkeypatch.undo()
    with pytest.raises(ValueError, match="BLOCK_K must be <= 128"):
        gemmkit.gemm_a8w8(xq, w, xs, ws, config=dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=256), fast_accum=False)
    out = gemmkit.gemm_a8w8(xq, w, xs, ws, out_dtype=FP32, fast_accum=False)
    assert_close(out, reference(xq, w, x_scale=xs, w_scale=ws), tol=EXACT_TOL)
