"""The warp-specialized promoting FP8 kernel (Gluon, sm_90; core/hopper_ws.py): which calls take it,
and (on a Hopper GPU) its results against float64 references and against the tl kernel, for
gemm_a8w8_blockscale and gemm_a8w8(fast_accum=False). Elsewhere the ops run the tl kernel, which
the other test files cover; the CPU tests here check the dispatch rule."""

import pytest
import torch

import gemmkit
from gemmkit import quant
from gemmkit.core import config as config_mod
from gemmkit.core import hopper_ws
from gemmkit.core.device import device_info
from gemmkit.quant import dequantize_fp8_blockwise, quantize_fp8_blockwise
from conftest import DEVICE, ON_GPU, assert_close, poisoned, randn, reference
from test_a8w8_blockscale import col_major, operands

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
HOPPER = ON_GPU and torch.cuda.get_device_capability() == (9, 0) and hopper_ws.gluon_kernel() is not None
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel runs on sm_90 GPUs only")


@pytest.fixture
def built(monkeypatch):
    """The WSPlans built while the test runs (plans are cached: caches cleared first)."""
    plans = []
    real = hopper_ws.WSPlan.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        plans.append(self)

    monkeypatch.setattr(hopper_ws.WSPlan, "__init__", spy)
    config_mod.clear_caches()
    yield plans
    config_mod.clear_caches()


def tl_result(monkeypatch, call):
    """call() with the warp-specialized kernel disabled (GEMMKIT_GLUON=0): the tl kernel's result."""
    monkeypatch.setenv(hopper_ws.GLUON_ENV, "0")
    config_mod.clear_caches()
    try:
        return call()
    finally:
        monkeypatch.delenv(hopper_ws.GLUON_ENV)
        config_mod.clear_caches()


# the dispatch rule (CPU) -----------------------------------------------------------------------

@pytest.mark.parametrize("M,N,K,kblock,ok", [
    (4096, 7168, 7168, False, True), (255, 36864, 7168, False, False), (4096, 7168, 256, False, False),
    (4096, 32768, 512, True, True),
    (256, 36864, 7168, False, True), (256, 4608, 4096, False, True), (256, 4096, 7168, False, False),  # 576 / 72 / 64
    (256, 4096, 7168, True, True), (256, 3072, 4096, True, True), (256, 2112, 7168, True, False),  # 64 / 48 / 34
    (1024, 2112, 7168, True, False),  # 136 tiles on 132 SMs: a thin second wave
    (1024, 3072, 4096, False, True), (2048, 3000, 1024, False, True)])
def test_shape_rule(M, N, K, kblock, ok):
    assert hopper_ws.ws_shape_ok(M, N, K, 132, kblock) is ok


@pytest.mark.parametrize("M,N,kblock,block_n", [
    (4096, 4096, False, 256), (1024, 7168, False, 256), (4000, 9000, False, 256),
    (1024, 4096, False, 256),  # 128 tiles of 256: 97% of a wave
    (512, 4096, False, 128),  # 64 tiles of 256: half a wave
    (1024, 6144, False, 128),  # 192 tiles of 256 fill 73% of two waves, 384 of 128 97% of three
    (4096, 4096, True, 128)])  # block scales: always 128
def test_block_n_rule(M, N, kblock, block_n):
    assert hopper_ws.ws_block_n(M, N, 132, kblock) == block_n


def test_not_taken_off_hopper(built):
    """The interpreter, the CPU and non-sm_90 devices build no WSPlan, whatever the sizes."""
    if HOPPER:
        pytest.skip("on a Hopper GPU the kernel is taken (the GPU tests below)")
    x = torch.zeros(256, 1024, dtype=E4M3, device=DEVICE)
    w = torch.zeros(768, 1024, dtype=E4M3, device=DEVICE)
    dev = device_info(x.device)
    assert not hopper_ws.ws_enabled(dev, x.device)
    assert hopper_ws.ws_plan(dev, x, w, None, 256, 768, 1024, scales="rowcol", x_scale=None, w_scale=None, bias=None,
                             activation="none", config=None, out_dtype=BF16, out_shape=(256, 768),
                             flatten_x=False) is None


@pytest.mark.skipif(hopper_ws.gluon_kernel() is None, reason="this Triton has no Gluon")
@pytest.mark.parametrize("scales,layout,out_dtype,block_n,xs_tma,c_tma", [
    ("kblock", "col", BF16, 128, True, True), ("kblock", "row", FP32, 128, False, False),
    ("rowcol", None, FP16, 256, False, True), ("rowcol", None, FP32, 128, False, False)])
def test_plan_binds_the_kernel_signature(scales, layout, out_dtype, block_n, xs_tma, c_tma):
    """WSPlan's arguments by name against fp8_ws_kernel's signature (core/plan.kernel_tail raises on
    a mismatch), and what it derives from the tensors, built on the CPU (no launch)."""
    M, N, K = (4096, 4096, 1024) if block_n == 256 else (512, 3000, 1024)
    x, w = torch.empty(M, K, dtype=E4M3), torch.empty(N, K, dtype=E4M3)
    if scales == "kblock":
        xs = torch.empty(K // 128, M).t() if layout == "col" else torch.empty(M, K // 128)
        ws = torch.empty(-(-N // 128), K // 128)
    else:
        xs, ws = torch.empty(M, 1), torch.empty(1, N)
    plan = hopper_ws.WSPlan(x, w, None, M, N, K, scales, xs, ws, None, out_dtype, (M, N), False, 132)
    assert (plan.block_n, plan.xs_tma, plan.c_tma) == (block_n, xs_tma, c_tma)
    assert len(hopper_ws.PER_CALL) + len(plan.tail) == len(hopper_ws.gluon_kernel().fp8_ws_kernel.arg_names)


# block scales (GPU) ----------------------------------------------------------------------------

def block_operands(M, N, K, x_dtype=E4M3, w_dtype=E4M3, layout="col", scale_format="float32", lead=None):
    """test_a8w8_blockscale.operands, with x_scale column-major (TMA-loadable) unless layout="row"."""
    xq, xs, wq, ws, xd, wd = operands(M, N, K, x_dtype, w_dtype, scale_format, lead)
    if layout == "col":  # (*lead, G): the flattened rows unit-stride, as quantize_fp8_blockwise stores it
        xs = col_major(xs.reshape(-1, xs.shape[-1])).view(xs.shape)
    return xq, xs, wq, ws, xd, wd


# ragged M (M % 4 != 0: scales by register loads), N and K (not multiples of 128), several tiles
# per program (persistent), one K block past the last full one
BLOCK_SHAPES = [(1024, 4096, 7168), (777, 6000, 1104), (800, 6000, 2000), (4096, 3000, 1536), (300, 9000, 1024),
                (2048, 9000, 512)]


@needs_hopper
@pytest.mark.parametrize("layout", ["col", "row"])
@pytest.mark.parametrize("M,N,K", BLOCK_SHAPES)
def test_blockscale(built, monkeypatch, M, N, K, layout):
    xq, xs, wq, ws, xd, wd = block_operands(M, N, K, layout=layout)
    bias = randn(N, dtype=BF16)
    y = poisoned((M, N), FP32)
    out = gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, bias, out_dtype=FP32, y=y)
    assert out is y and len(built) == 1
    assert built[0].xs_tma == (layout == "col" and M % 4 == 0)
    assert_close(out, reference(xd, wd, bias), tol=2e-3)
    tl = tl_result(monkeypatch, lambda: gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, bias, out_dtype=FP32))
    assert_close(out, tl.double(), tol=1e-3)


@needs_hopper
@pytest.mark.parametrize("out_dtype,bias_dtype", [(BF16, None), (FP16, FP16), (FP32, BF16), (BF16, FP32)])
@pytest.mark.parametrize("x_dtype,w_dtype", [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)])
def test_blockscale_dtypes(built, out_dtype, bias_dtype, x_dtype, w_dtype):
    M, N, K = 512, 6144, 2048
    xq, xs, wq, ws, xd, wd = block_operands(M, N, K, x_dtype, w_dtype, scale_format="ue8m0")
    bias = None if bias_dtype is None else randn(N, dtype=bias_dtype)
    out = gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, bias, out_dtype=out_dtype)
    assert out.dtype == out_dtype and len(built) == 1
    # (fp32 output: the tensor cores' FP8 sums inside a 128-deep block, as in test_a8w8_blockscale.py)
    assert_close(out, reference(xd, wd, bias), tol=2e-3 if out_dtype == FP32 else None)


@needs_hopper
def test_blockscale_leading_dims_and_strided_x(built):
    """x (2, 300, K) with its (2, 300, G) scales; then a row-strided x (a slice of a wider buffer)."""
    xq, xs, wq, ws, xd, wd = block_operands(600, 5000, 2048, lead=(2, 300))
    out = gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws)
    assert out.shape == (2, 300, 5000) and len(built) == 1
    assert_close(out.reshape(600, 5000), reference(xd, wd))
    wide = torch.zeros(600, 2048 + 256, dtype=E4M3, device=DEVICE)
    wide[:, :2048] = xq.reshape(600, 2048)
    out = gemmkit.gemm_a8w8_blockscale(wide[:, :2048], wq, xs.reshape(600, -1), ws)
    assert len(built) == 2
    assert_close(out, reference(xd, wd))


@needs_hopper
def test_blockscale_activation_and_config_take_the_tl_kernel(built):
    xq, xs, wq, ws, xd, wd = block_operands(512, 6144, 2048)
    assert_close(gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, activation="silu"), reference(xd, wd, None, "silu"))
    cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_warps=8)
    assert_close(gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, config=cfg), reference(xd, wd))
    assert not built


@needs_hopper
@pytest.mark.parametrize("M", [256, 1000])
def test_blockscale_dynamic(built, M):
    """bf16 x at M > 64: quantize_fp8_blockwise, then the static GEMM (here the Gluon kernel)."""
    K, N = 2048, 16896
    x = randn(M, K, dtype=BF16)
    w = randn(N, K, dtype=FP32) / K**0.5
    wq, ws = quantize_fp8_blockwise(w, (128, 128))
    xq, xs = quantize_fp8_blockwise(x, (1, 128))
    ref = reference(dequantize_fp8_blockwise(xq, xs, dtype=torch.float64),
                    dequantize_fp8_blockwise(wq, ws, (128, 128), dtype=torch.float64))
    assert_close(gemmkit.gemm_a8w8_blockscale(x, wq, None, ws), ref)
    assert len(built) == 1


@needs_hopper
def test_cuda_graph_replays_new_inputs(built):
    M, N, K = 512, 6144, 2048
    xq, xs, wq, ws, xd, wd = block_operands(M, N, K)
    out = gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws)  # plan built and compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws)
    x2, xs2, _, _, xd2, _ = block_operands(M, N, K)
    xq.copy_(x2)
    xs.copy_(xs2)
    graph.replay()
    torch.cuda.synchronize()
    assert len(built) == 1
    assert_close(out, reference(xd2, wd))


@needs_hopper
def test_disabled_by_env(built, monkeypatch):
    monkeypatch.setenv(hopper_ws.GLUON_ENV, "0")
    xq, xs, wq, ws, xd, wd = block_operands(512, 6144, 2048)
    assert_close(gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws), reference(xd, wd))
    assert not built


# exact accumulation of row-wise / tensor-wise FP8 (GPU) ------------------------------------------

@needs_hopper
@pytest.mark.parametrize("x_gran,w_gran", [("row", "row"), ("tensor", "tensor"), ("row", "tensor"), ("tensor", "row")])
@pytest.mark.parametrize("M,N,K", [(777, 6000, 1104), (2048, 4096, 4096), (4000, 9000, 1040), (1500, 8192, 512)])
def test_exact_accumulation(built, monkeypatch, M, N, K, x_gran, w_gran):
    x, w = randn(M, K, dtype=FP32), randn(N, K, dtype=FP32) / K**0.5
    (xq, xs), (wq, ws) = quant.quantize_fp8(x, x_gran), quant.quantize_fp8(w, w_gran)
    ws = ws.reshape(1, N) if w_gran == "row" else ws
    bias = randn(N, dtype=FP16)
    y = poisoned((M, N), BF16)
    out = gemmkit.gemm_a8w8(xq, wq, xs, ws, bias, y=y, fast_accum=False)
    assert out is y and len(built) == 1
    assert built[0].block_n == hopper_ws.ws_block_n(M, N, torch.cuda.get_device_properties(0).multi_processor_count,
                                                    False)
    assert_close(out, reference(xq, wq, bias, x_scale=xs, w_scale=ws))
    tl = tl_result(monkeypatch, lambda: gemmkit.gemm_a8w8(xq, wq, xs, ws, bias, fast_accum=False))
    assert_close(out, tl.double(), tol=1e-2)


@needs_hopper
def test_long_k_exactness_test_takes_this_kernel(built):
    """test_a8w8_blockscale.py's K = 16384 exactness test (against _scaled_mm's default
    accumulation) runs this kernel at its 512 x 4096 size."""
    xq = torch.zeros(512, 16384, dtype=E4M3, device=DEVICE)
    wq = torch.zeros(4096, 16384, dtype=E4M3, device=DEVICE)
    one = torch.ones((), dtype=FP32, device=DEVICE)
    gemmkit.gemm_a8w8(xq, wq, one, one, out_dtype=FP32, fast_accum=False)
    assert len(built) == 1


@needs_hopper
def test_fast_accumulation_keeps_the_tl_kernel(built):
    x, w = randn(1024, 4096, dtype=FP32), randn(4096, 4096, dtype=FP32)
    (xq, xs), (wq, ws) = quant.quantize_fp8(x, "row"), quant.quantize_fp8(w, "row")
    gemmkit.gemm_a8w8(xq, wq, xs, ws.reshape(1, -1))
    assert not built
