"""The warp-specialized Gluon kernel (sm_90; kernels/gemm_ws.py, core/hopper_ws.py): which calls take
it, and (on a Hopper GPU) its results against float64 references and against the tl kernel, for
gemm_a8w8_blockscale, gemm_a8w8 (fast_accum=False: promoted; True: fitted tile widths) and
gemm_a16w16 (fitted tile widths). Elsewhere the ops run the tl kernel, which the other test files
cover; the CPU tests here check the dispatch rules and the plan's binding of the kernel's arguments."""

import pytest
import torch

import gemmkit
from gemmkit import quant
from gemmkit.core import config as config_mod
from gemmkit.core import hopper_ws
from gemmkit.core.device import device_info, known_device
from gemmkit import moe
from gemmkit.ops import batched as batched_op
from gemmkit.ops import grouped as grouped_op
from gemmkit.quant import dequantize_fp8_blockwise, quantize_fp8_blockwise
from conftest import DEVICE, ON_GPU, assert_close, poisoned, randn, reference, replay_with_new_inputs, spy_plans
from test_a8w8_blockscale import col_major, operands

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
HOPPER = ON_GPU and torch.cuda.get_device_capability() == (9, 0) and hopper_ws.gluon_kernel() is not None
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel runs on sm_90 GPUs only")


@pytest.fixture
def built(monkeypatch):
    """The WSPlans built while the test runs (plans are cached: caches cleared first)."""
    yield from spy_plans(monkeypatch, hopper_ws.WSPlan, config_mod.clear_caches)


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
    (256, 4096, 7168, True, True), (256, 3072, 4096, True, True), (256, 2112, 7168, True, True),  # 64 / 48 / 34
    (256, 2112, 7168, False, False),  # 34 tiles without block scales: the tl kernel's split-K
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


# (M, N, K, fp8, taken, parts): fitted widths where a power of two leaves a ragged wave (held-out
# layers of tuning/fitted/); none where a power of two fills the waves; bf16 tiles 128 wide or more
@pytest.mark.parametrize("M,N,K,fp8,ok,parts", [
    (512, 5120, 4096, False, True, (128, 32)), (512, 4608, 4096, False, True, (128, 16)),
    (512, 6144, 5120, False, True, (128, 64)), (2048, 1280, 8192, False, True, (128, 32)),
    (256, 9216, 3072, True, True, (128, 16)), (512, 2560, 8192, True, True, (64, 16)),
    (512, 2560, 8192, False, True, (64, 16)), (128, 2560, 8192, False, False, (128, 0)),  # bf16 narrow from 256 rows
    (512, 8192, 4096, False, True, (128, 128)), (512, 8192, 4096, True, True, (128, 128)),  # one full wave of 256:
    (1024, 4096, 4096, False, True, (128, 128)), (8192, 7168, 8192, True, True, (128, 128)),  # bf16 from 384 rows
    # where its tiles fill 0.9 of their waves or one or two waves 0.8 (else the tl kernel's tiles: 3.4 waves 0.85
    # full, one 0.74 full below), from 1024 everywhere; FP8 this kernel at every M >= 256
    (512, 28672, 4096, False, False, (128, 128)), (256, 7168, 8192, False, False, (128, 0)),
    (896, 3584, 14336, False, False, (128, 128)), (512, 3584, 18944, False, True, (128, 0)),
    (384, 5120, 8192, False, True, (128, 0)), (768, 7168, 16384, False, True, (128, 64)),  # from 384 rows
    (256, 8192, 4096, True, True, (128, 0)), (256, 8192, 4096, False, False, (128, 0)),
    (128, 5120, 4096, False, False, (128, 0)), (512, 5120, 512, True, False, (128, 32)),  # M, K too small
    (128, 9216, 3072, False, True, (128, 0)), (128, 25600, 5120, False, True, (128, 128)),  # bf16 at M = 128:
    (128, 8192, 4096, False, False, (128, 0)), (128, 9216, 3072, True, True, (64, 16)),  # past a wave of 64x128
    (128, 8192, 3696, True, True, (64, 0))])  # (FP8 in 64 x 128 tiles: ws_tiles)
def test_fitted_width_rule(M, N, K, fp8, ok, parts):
    assert hopper_ws.ws_direct_ok(M, N, K, 132, fp8) is ok
    assert hopper_ws.ws_parts(M, N, 132, fp8) == parts


# (M, N, K, fp8, rows, parts): 64-row tiles where their waves take under 0.9x the 128-row pick's
# (bf16 from 1024 rows: 0.97x) and fill the SMs at least as well (tuning/fitted/ws_rows64_*_h100.txt);
# bf16 from 256 rows and where the 128-row tiles use 55% of the SMs or more, FP8 from 128 rows
@pytest.mark.parametrize("M,N,K,fp8,rows,parts", [
    (512, 1280, 8192, False, 64, (64, 16)), (512, 2560, 8192, False, 64, (128, 32)),
    (1024, 1280, 8192, False, 64, (128, 32)), (128, 1280, 8192, False, 128, (128, 0)),
    (2048, 7168, 8192, False, 64, (128, 32)),  # bf16 from 1024 rows: under 0.97x
    (512, 28672, 4096, False, 128, (128, 128)), (4096, 4096, 4096, False, 128, (128, 128)),
    (256, 2112, 7168, False, 128, (64, 0)),  # 66 tiles of 128 rows: half the SMs (split-K's)
    (512, 2112, 7168, True, 128, (64, 0)),  # 132 tiles of 128 x 64 fill a wave; 112 of 64 x 160 would not
    (256, 2112, 7168, True, 64, (64, 0)), (128, 3072, 3072, True, 64, (64, 0)), (2048, 7168, 8192, True, 64, (128, 128)),
    (512, 8192, 2048, True, 128, (128, 128)), (1024, 4608, 4096, True, 128, (128, 16))])
def test_rows64_rule(M, N, K, fp8, rows, parts, monkeypatch):
    assert hopper_ws.ws_tiles(M, N, 132, fp8) == (rows, parts)
    if rows == 64:
        assert hopper_ws.ws_direct_ok(M, N, K, 132, fp8)
    monkeypatch.setattr(hopper_ws, "ROWS64", False)
    assert hopper_ws.ws_tiles(M, N, 132, fp8) == (128, hopper_ws.ws_parts(M, N, 132, fp8))


@pytest.mark.parametrize("M,N,K,block_n,block_k,splits", [
    (256, 2112, 7168, 128, 128, 3),  # 34 tiles: three slices of 19 K blocks
    (256, 2048, 8192, 128, 64, 4), (128, 1024, 1024, 128, 128, 2),  # 8 K blocks: two slices of 4
    (256, 4608, 4096, 128, 64, 1),  # 72 tiles: more than half the SMs
    (256, 1024, 512, 128, 128, 1),  # 4 K blocks: one slice
    (100, 256, 4096, 128, 128, 8)])  # 2 tiles: 32 K blocks in slices of 4
def test_k_slice_rule(M, N, K, block_n, block_k, splits):
    assert hopper_ws.ws_splits(M, N, K, 132, block_n, block_k) == splits


@pytest.mark.skipif(hopper_ws.gluon_kernel() is None, reason="this Triton has no Gluon")
@pytest.mark.parametrize("scales,dtype", [("kblock", E4M3), ("none", BF16)])
def test_plan_with_k_slices(scales, dtype):
    """A plan in K slices (built on the CPU, no launch): fp32 partials into a workspace of
    splits x (M rounded up to the tiles' rows) rows, stored by TMA whatever the output dtype, no bias in the
    GEMM; sum_k_slices's arguments bound to its signature with the bias."""
    from gemmkit.kernels.reduce import sum_k_slices

    M, N, K = (256, 2112, 7168) if scales == "kblock" else (200, 1000, 8192)
    x, w = torch.empty(M, K, dtype=dtype), torch.empty(N, K, dtype=dtype)
    xs = torch.empty(K // 128, M).t() if scales == "kblock" else None
    ws = torch.empty(-(-N // 128), K // 128) if scales == "kblock" else None
    plan = hopper_ws.WSPlan(x, w, None, M, N, K, scales, xs, ws, torch.empty(N), FP16, (M, N), False, 132,
                            scales == "kblock")
    assert plan.splits == hopper_ws.ws_splits(M, N, K, 132, plan.block_n, 128 // dtype.itemsize, plan.rows) > 1
    assert plan.ws_shape == (plan.splits * -(-M // plan.rows) * plan.rows, -(-N // 4) * 4) and plan.c_tma
    tail = dict(zip(hopper_ws.gluon_kernel().gemm_ws_kernel.arg_names[len(hopper_ws.PER_CALL):], plan.tail))
    assert tail["HAS_BIAS"] is False and tail["C_TMA"] == 1 and tail["splits"] == plan.splits
    reduce_args = dict(zip(sum_k_slices.arg_names[3:], plan.reduce_tail))
    assert len(reduce_args) == len(plan.reduce_tail) == len(sum_k_slices.arg_names) - 3 and reduce_args["HAS_BIAS"] is True
    assert reduce_args["split_rows"] == plan.split_rows and reduce_args["stride_wm"] == plan.ws_shape[1]


@pytest.mark.parametrize("splits,bias,out_dtype", [(1, False, FP32), (3, True, BF16), (4, True, FP16)])
def test_sum_k_slices(splits, bias, out_dtype):
    """kernels/reduce.py sum_k_slices (the tl kernel that adds the K slices' partials; runs under
    the interpreter): slices in rows split_rows apart of a padded workspace, a strided output."""
    from gemmkit.core.launcher import launch_jit
    from gemmkit.kernels.reduce import sum_k_slices

    M, N, rows, n_pad = 37, 70, 64, 72
    ws = randn(splits * rows, n_pad, dtype=FP32)
    b = randn(N, dtype=BF16) if bias else None
    y = poisoned((M, 2 * N), out_dtype)[:, ::2]
    launch_jit(sum_k_slices, (2, 1), (ws, y, b, M, N, splits, rows, n_pad, *y.stride(), bias, 32, 128), 4, 1)
    want = sum(ws[s * rows:s * rows + M, :N].double() for s in range(splits))
    if bias:
        want = want + b.double()
    assert_close(y, want.to(out_dtype))


@pytest.mark.parametrize("width,out_bytes,stages", [(128, 2, 5), (256, 2, 3), (256, 0, 4), (160, 2, 5), (192, 4, 3), (80, 2, 7)])
def test_stages_fit_shared_memory(width, out_bytes, stages):
    assert hopper_ws.ws_stages(width, out_bytes) == stages


@pytest.mark.skipif(hopper_ws.gluon_kernel() is None, reason="this Triton has no Gluon")
@pytest.mark.parametrize("scales,dtype,layout,out_dtype,parts,xs_tma,c_tma", [
    ("kblock", E4M3, "col", BF16, (128, 0), True, True), ("kblock", E4M3, "row", FP32, (128, 0), False, False),
    ("rowcol", E4M3, None, FP16, (128, 128), False, True), ("rowcol", E4M3, None, FP32, (128, 0), False, False),
    ("rowcol-fast", E4M3, None, BF16, (128, 32), False, True), ("none", BF16, None, BF16, (128, 32), False, True),
    ("none", FP16, None, FP32, (128, 32), False, False)])
def test_plan_binds_the_kernel_signature(scales, dtype, layout, out_dtype, parts, xs_tma, c_tma):
    """WSPlan's arguments by name against gemm_ws_kernel's signature (core/plan.kernel_tail raises
    on a mismatch), and what it derives from the tensors, built on the CPU (no launch)."""
    promote = scales != "rowcol-fast" and scales != "none"
    scales = scales.split("-")[0]
    M, N, K = {(128, 128): (4096, 4096, 1024), (128, 0): (512, 3000, 1024)}.get(parts, (512, 5120, 4096))
    x, w = torch.empty(M, K, dtype=dtype), torch.empty(N, K, dtype=dtype)
    if scales == "kblock":
        xs = torch.empty(K // 128, M).t() if layout == "col" else torch.empty(M, K // 128)
        ws = torch.empty(-(-N // 128), K // 128)
    elif scales == "rowcol":
        xs, ws = torch.empty(M, 1), torch.empty(1, N)
    else:
        xs = ws = None
    plan = hopper_ws.WSPlan(x, w, None, M, N, K, scales, xs, ws, None, out_dtype, (M, N), False, 132, promote)
    assert (plan.parts, plan.xs_tma, plan.c_tma, plan.promote) == (parts, xs_tma, c_tma, promote)
    assert len(hopper_ws.PER_CALL) + len(plan.tail) == len(hopper_ws.gluon_kernel().gemm_ws_kernel.arg_names)
    # 256-wide tiles stored by TMA share one output buffer per warp group: 4 stages of 128 x 256 fit, not 3
    assert plan.share_c == (parts == (128, 128) and c_tma)
    if plan.share_c:
        assert plan.stages == 4
    assert plan.b0_desc.args[2] == [parts[0], 128 // dtype.itemsize]
    if scales != "kblock" and not promote:  # tiles of 64 rows: one consumer warp group, half the A tile per stage
        rows64 = hopper_ws.WSPlan(x, w, None, M, N, K, scales, xs, ws, None, out_dtype, (M, N), False, 132, promote,
                                  tiles=(64, parts))
        names = hopper_ws.gluon_kernel().gemm_ws_kernel.arg_names[len(hopper_ws.PER_CALL):]
        assert dict(zip(names, rows64.tail))["GROUPS"] == 1 and dict(zip(names, plan.tail))["GROUPS"] == 2
        assert rows64.stages == hopper_ws.ws_stages(sum(parts), 0 if out_dtype == FP32 else 2, sum(parts), 64)
        assert rows64.stages >= plan.stages


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
@pytest.mark.parametrize("M,N,K", [(256, 2112, 7168), (100, 700, 2000), (16, 4096, 7168), (300, 1500, 1040)])
def test_blockscale_k_slices(built, monkeypatch, M, N, K):
    """Few tiles: K slices summed by the second kernel (forced at every size), bias added once."""
    monkeypatch.setattr(hopper_ws, "ws_shape_ok", lambda *args: True)
    xq, xs, wq, ws, xd, wd = block_operands(M, N, K)
    bias = randn(N, dtype=BF16)
    y = poisoned((M, N), BF16)
    out = gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws, bias, y=y)
    assert out is y and len(built) == 1 and built[0].splits > 1
    assert_close(out, reference(xd, wd, bias))
    x = randn(M, K, dtype=FP32)
    (xq, xs), (wq, ws) = quant.quantize_fp8(x, "row"), quant.quantize_fp8(randn(N, K, dtype=FP32) / K**0.5, "row")
    out = gemmkit.gemm_a8w8(xq, wq, xs, ws.reshape(1, N), bias, out_dtype=FP32, fast_accum=False)
    assert len(built) == 2 and built[1].splits > 1
    assert_close(out, reference(xq, wq, bias, x_scale=xs, w_scale=ws.reshape(1, N)), tol=2e-3)


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
@pytest.mark.parametrize("x_dtype,w_dtype", [(BF16, E4M3), (FP16, E4M3), (BF16, E5M2)])
@pytest.mark.parametrize("M,N,K", [(256, 16896, 2048), (1000, 16896, 2048), (256, 2112, 7168), (300, 1500, 1040),
                                   (777, 6000, 1104)])
def test_blockscale_dynamic(built, M, N, K, x_dtype, w_dtype):
    """bf16 / fp16 x at M >= 256: quantize_fp8_blockwise, then the static GEMM (here the Gluon
    kernel); ragged M, N, K (a last K block of 16 columns), K slices (34 tiles), bias, a poisoned
    preallocated output. (Quantizing x inside the kernel instead measured 0.30x to 0.50x the
    static GEMM's speed: tuning/ws_quant/.)"""
    x = randn(M, K, dtype=x_dtype)
    w = randn(N, K, dtype=FP32) / K**0.5
    wq, ws = quantize_fp8_blockwise(w, (128, 128), w_dtype)
    xq, xs = quantize_fp8_blockwise(x, (1, 128), w_dtype)
    bias = randn(N, dtype=BF16)
    ref = reference(dequantize_fp8_blockwise(xq, xs, dtype=torch.float64),
                    dequantize_fp8_blockwise(wq, ws, (128, 128), dtype=torch.float64), bias)
    y = poisoned((M, N), BF16)
    out = gemmkit.gemm_a8w8_blockscale(x, wq, None, ws, bias, y=y)
    assert out is y and len(built) == 1
    assert_close(out, ref)


@needs_hopper
def test_cuda_graph_replays_new_inputs(built):
    M, N, K = 512, 6144, 2048
    xq, xs, wq, ws, xd, wd = block_operands(M, N, K)
    gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws)  # plan built and compiled outside the capture
    x2, xs2, _, _, xd2, _ = block_operands(M, N, K)
    out = replay_with_new_inputs(lambda: gemmkit.gemm_a8w8_blockscale(xq, wq, xs, ws),
                                 lambda: (xq.copy_(x2), xs.copy_(xs2)))
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
def test_fast_accumulation_takes_this_kernel_from_256_rows(built, monkeypatch):
    """FP8 fast accumulation at M >= 256 (here 1024 x 4096 x 4096, where a power of two fills the
    waves): this kernel, 128 x 256 tiles; at M = 128, 128 tiles of 64 x 64 (ws_tiles: 64 of
    128 x 64 would fill half the SMs); with those off (ROWS64), the tl kernel."""
    x, w = randn(1024, 4096, dtype=FP32), randn(4096, 4096, dtype=FP32)
    (xq, xs), (wq, ws) = quant.quantize_fp8(x, "row"), quant.quantize_fp8(w, "row")
    out = gemmkit.gemm_a8w8(xq, wq, xs, ws.reshape(1, -1))
    assert len(built) == 1 and built[0].parts == (128, 128) and built[0].rows == 128 and not built[0].promote
    assert_close(out, reference(xq, wq, None, x_scale=xs, w_scale=ws.reshape(1, -1)))
    small = gemmkit.gemm_a8w8(xq[:128], wq, xs[:128], ws.reshape(1, -1))
    assert len(built) == 2 and (built[1].rows, built[1].parts) == (64, (64, 0))
    assert_close(small, reference(xq[:128], wq, None, x_scale=xs[:128], w_scale=ws.reshape(1, -1)))
    monkeypatch.setattr(hopper_ws, "ROWS64", False)
    config_mod.clear_caches()
    gemmkit.gemm_a8w8(xq[:128], wq, xs[:128], ws.reshape(1, -1))
    assert len(built) == 2


# fitted tile widths, the tensor cores accumulating: bf16 / fp16 and FP8 fast accumulation (GPU) --

# ragged M, N (not a multiple of the tile width or of its parts) and K (not a multiple of 64 / 128),
# several tiles per program; the default rule's picks and every part combination forced
FITTED_SHAPES = [(512, 5120, 4096), (777, 4600, 1104), (2048, 1280, 2000), (300, 9216, 1040),
                 (200, 1000, 3040)]  # (16 tiles: K slices)
FORCED_PARTS = [None, (128, 16), (128, 64), (128, 128), (64, 32), (64, 0)]


def force_fitted(monkeypatch, parts):
    """The kernel without promotion at every size in 128-row tiles; `parts` (None: ws_parts's pick)
    at every shape."""
    monkeypatch.setattr(hopper_ws, "ws_direct_ok", lambda *args: True)
    monkeypatch.setattr(hopper_ws, "ROWS64", False)
    monkeypatch.setattr(hopper_ws, "RAGGED_RULE", False)  # (its 64-row and swapped tiles: test_ragged_rule)
    if parts is not None:
        monkeypatch.setattr(hopper_ws, "ws_parts", lambda *args: parts)


@needs_hopper
@pytest.mark.parametrize("parts", FORCED_PARTS)
@pytest.mark.parametrize("M,N,K", FITTED_SHAPES)
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_a16w16_fitted(built, monkeypatch, dtype, M, N, K, parts):
    force_fitted(monkeypatch, parts)
    check_a16w16_into_poisoned(built, dtype, M, N, K)
    assert built[0].parts == (parts or hopper_ws.ws_parts(M, N, torch.cuda.get_device_properties(0).multi_processor_count,
                                                          False))


def check_a16w16_into_poisoned(built, dtype, M, N, K):
    """gemm_a16w16 with a bias into a poisoned preallocated output: one plan built, the result
    against the float64 reference; returns (x, w, bias)."""
    x, w = randn(M, K, dtype=dtype), randn(N, K, dtype=dtype, scale=K**-0.5)
    bias = randn(N, dtype=dtype)
    y = poisoned((M, N), dtype)
    out = gemmkit.gemm_a16w16(x, w, bias, y=y)
    assert out is y and len(built) == 1
    assert_close(out, reference(x, w, bias))
    return x, w, bias


@needs_hopper
@pytest.mark.parametrize("out_dtype", [FP32, FP16])
def test_a16w16_fitted_outputs_and_layouts(built, monkeypatch, out_dtype):
    """fp32 output (pointer stores), x with leading dims, a row-strided x (a slice of a wider
    buffer); a column-major x is not TMA-addressable: the tl kernel."""
    force_fitted(monkeypatch, (128, 32))
    M, N, K = 600, 5000, 2048
    x, w = randn(2, M // 2, K, dtype=BF16), randn(N, K, dtype=BF16, scale=K**-0.5)
    out = gemmkit.gemm_a16w16(x, w, out_dtype=out_dtype)
    assert out.shape == (2, M // 2, N) and out.dtype == out_dtype and len(built) == 1
    assert built[0].c_tma == (out_dtype != FP32)
    assert_close(out.reshape(M, N), reference(x.reshape(M, K), w).to(out_dtype), tol=2e-3 if out_dtype == FP16 else None)
    wide = randn(M, K + 64, dtype=BF16)
    assert_close(gemmkit.gemm_a16w16(wide[:, :K], w), reference(wide[:, :K], w))
    assert len(built) == 2
    xt = randn(K, M, dtype=BF16).t()
    assert_close(gemmkit.gemm_a16w16(xt, w), reference(xt, w))
    assert len(built) == 2


ROWS64_SHAPES = [(512, 1280, 8192), (333, 2560, 1000), (100, 1000, 3040), (2048, 1280, 2000)]  # (100: K slices)


def force_rows64(monkeypatch, parts):
    """The kernel without promotion at every size, in tiles of 64 rows (one consumer warp group)."""
    monkeypatch.setattr(hopper_ws, "ws_direct_ok", lambda *args: True)
    monkeypatch.setattr(hopper_ws, "ws_tiles", lambda *args: (64, parts))


@needs_hopper
@pytest.mark.parametrize("parts", [(64, 16), (128, 32), (128, 0), (64, 0)])
@pytest.mark.parametrize("M,N,K", ROWS64_SHAPES)
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_a16w16_rows64(built, monkeypatch, dtype, M, N, K, parts):
    force_rows64(monkeypatch, parts)
    x, w, bias = check_a16w16_into_poisoned(built, dtype, M, N, K)
    assert built[0].rows == 64 and built[0].parts == parts
    fp32 = gemmkit.gemm_a16w16(x, w, bias, out_dtype=FP32)  # pointer stores
    assert_close(fp32, reference(x, w, bias))


@needs_hopper
@pytest.mark.parametrize("parts", [(64, 16), (128, 32), (128, 128)])
@pytest.mark.parametrize("M,N,K", [(512, 1280, 8192), (333, 2560, 1040), (100, 1000, 3072), (2048, 1280, 2048)])
def test_a8w8_fast_rows64(built, monkeypatch, M, N, K, parts):
    force_rows64(monkeypatch, parts)
    x, w = randn(M, K, dtype=FP32), randn(N, K, dtype=FP32) / K**0.5
    (xq, xs), (wq, ws) = quant.quantize_fp8(x, "row"), quant.quantize_fp8(w, "row")
    ws = ws.reshape(1, N)
    y = poisoned((M, N), BF16)
    out = gemmkit.gemm_a8w8(xq, wq, xs, ws, y=y)
    assert out is y and len(built) == 1 and built[0].rows == 64
    assert_close(out, reference(xq, wq, None, x_scale=xs, w_scale=ws))


@needs_hopper
def test_a16w16_fitted_by_default(built, monkeypatch):
    """512 x 5120 x 4096: 128 tiles of 160 columns, taken without forcing; equal to the tl kernel's
    result within bf16 rounding."""
    x, w = randn(512, 4096, dtype=BF16), randn(5120, 4096, dtype=BF16, scale=4096**-0.5)
    out = gemmkit.gemm_a16w16(x, w)
    assert len(built) == 1 and built[0].parts == (128, 32)
    assert_close(out, reference(x, w))
    assert_close(out, tl_result(monkeypatch, lambda: gemmkit.gemm_a16w16(x, w)).double())


@needs_hopper
@pytest.mark.parametrize("parts", [None, (128, 32), (64, 16), (128, 128)])
@pytest.mark.parametrize("M,N,K", FITTED_SHAPES)
def test_a8w8_fast_fitted(built, monkeypatch, M, N, K, parts):
    force_fitted(monkeypatch, parts)
    x, w = randn(M, K, dtype=FP32), randn(N, K, dtype=FP32) / K**0.5
    (xq, xs), (wq, ws) = quant.quantize_fp8(x, "row"), quant.quantize_fp8(w, "row")
    ws = ws.reshape(1, N)
    bias = randn(N, dtype=BF16)
    y = poisoned((M, N), BF16)
    out = gemmkit.gemm_a8w8(xq, wq, xs, ws, bias, y=y)
    assert out is y and len(built) == 1 and not built[0].promote
    assert_close(out, reference(xq, wq, bias, x_scale=xs, w_scale=ws))


@needs_hopper
def test_a8w8_dynamic_fitted(built):
    """bf16 x, quantized per token in the call, then the fitted FP8 GEMM (512 x 4608 x 4096: 128
    tiles of 144)."""
    x, w = randn(512, 4096, dtype=BF16), randn(4608, 4096, dtype=FP32) / 64
    wq, ws = quant.quantize_fp8(w, "row")
    out = gemmkit.gemm_a8w8(x, wq, None, ws.reshape(1, -1))
    assert len(built) == 1 and built[0].parts == (128, 16)
    xq, xs = quant.quantize_fp8(x, "row")
    assert_close(out, reference(xq, wq, None, x_scale=xs, w_scale=ws.reshape(1, -1)))


# gated tiles (fused feed-forward) --------------------------------------------------------------

@pytest.mark.parametrize("M,N,width", [(256, 14336, 128), (256, 18944, 64), (1024, 18944, 128), (1024, 7168, 64),
                                       (128, 28672, 64), (512, 1000, 64)])
def test_gated_width_rule(M, N, width):
    """The gated tile width: 64 for one row of tiles; else the least wave time, 128 where its waves
    fill as well (256 x 14336: 2 waves of 128 against 4 of 64), 64 where 128 leaves a ragged last
    wave (256 x 18944: 3 waves of 128 against 5 of 64; 1024 x 7168: 4 of 128 against 7 of 64)."""
    assert hopper_ws.ws_gated_width(M, N, 132) == width


@pytest.mark.skipif(hopper_ws.gluon_kernel() is None, reason="this Triton has no Gluon")
@pytest.mark.parametrize("dtype,out_dtype,scale_shape", [(BF16, BF16, None), (FP16, FP32, None), (E4M3, BF16, (2, 1)),
                                                         (E4M3, BF16, (1, 0))])
def test_gated_plan_binds_the_kernel_signature(dtype, out_dtype, scale_shape):
    """A gated WSPlan's arguments against the kernel's signature, built on the CPU: the up weight's
    descriptor over its own tensor, one K slice, the up weight's scales at their offset."""
    M, N, K = 256, 3000, 2048
    x, gate, up = torch.empty(M, K, dtype=dtype), torch.empty(N, K, dtype=dtype), torch.empty(N, K, dtype=dtype)
    fp8 = dtype == E4M3
    xs = torch.empty(M, 1) if fp8 else None
    ws = torch.empty(2 * N if scale_shape[1] else 1) if fp8 else None
    up_scale = (N * scale_shape[1], scale_shape[1]) if fp8 else None
    plan = hopper_ws.WSPlan(x, gate, None, M, N, K, "rowcol" if fp8 else "none", xs, ws, None, out_dtype, (M, N),
                            False, 132, promote=False, gated=("silu", up_scale))
    width = hopper_ws.ws_gated_width(M, N, 132)
    assert plan.parts == (width, width) and plan.block_n == width and plan.splits == 1
    names = hopper_ws.gluon_kernel().gemm_ws_kernel.arg_names[len(hopper_ws.PER_CALL):]
    tail = dict(zip(names, plan.tail))
    assert tail["GATED"] and tail["ACTIVATION"] == "silu" and not tail["HAS_BIAS"]
    if fp8:
        assert (tail["up_scale_offset"], tail["stride_bsn"]) == (up_scale if scale_shape[1] else (0, 0))
    args = plan.arguments(x, gate, torch.empty(M, N, dtype=out_dtype), None, xs, ws, up)
    assert args[1].base is gate and args[2].base is up


def ff_operands(M, I, H, dtype=BF16, layout="concat"):
    x = randn(M, H, dtype=dtype)
    gate, up = randn(I, H, dtype=dtype, scale=H**-0.5), randn(I, H, dtype=dtype, scale=H**-0.5)
    if layout == "interleaved":
        w = torch.stack([gate, up], 1).reshape(2 * I, H)
        return x, w, None, w[0::2], w[1::2]
    if layout == "separate":
        return x, gate, up, gate, up
    w = torch.cat([gate, up])
    return x, w, None, w[:I], w[I:]


def gated_reference(x, gate, up, activation="silu", xs=None, gs=None, us=None):
    from conftest import ACT_REF

    g, u = x.double() @ gate.double().T, x.double() @ up.double().T
    if xs is not None:
        g, u = g * xs.double().reshape(-1, 1), u * xs.double().reshape(-1, 1)
        g, u = g * gs.double().reshape(1, -1), u * us.double().reshape(1, -1)
    return ACT_REF[activation](g) * u


# ragged rows and intermediate sizes (not multiples of the tile), one and several tiles per program
GATED_SHAPES = [(256, 14336, 4096), (300, 1000, 1040), (1000, 3000, 2048), (129, 5000, 1536)]


@needs_hopper
@pytest.mark.parametrize("width", [None, 64, 128])
@pytest.mark.parametrize("M,I,H", GATED_SHAPES)
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_gated(built, monkeypatch, dtype, M, I, H, width):
    from gemmkit.ops import fused

    if width is not None:
        monkeypatch.setattr(hopper_ws, "ws_gated_width", lambda *args: width)
    x, w, w_up, gate, up = ff_operands(M, I, H, dtype)
    y = poisoned((M, I), dtype)
    out = fused.gated_gemm(x, gate, up, y=y)
    assert out is y and len(built) == 1 and built[0].gated
    assert_close(out, gated_reference(x, gate, up))


@needs_hopper
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "relu", None])
@pytest.mark.parametrize("layout", ["concat", "interleaved", "separate"])
def test_gated_layouts_activations(built, layout, activation):
    from gemmkit.ops import fused

    M, I, H = 384, 2000, 1024
    x, w, w_up, gate, up = ff_operands(M, I, H, BF16, layout)
    g, u = fused.gate_up_views(w, w_up, "interleaved" if layout == "interleaved" else "concat")
    out = fused.gated_gemm(x.reshape(2, M // 2, H), g, u, activation=activation, out_dtype=FP32)
    assert out.shape == (2, M // 2, I) and out.dtype == FP32 and len(built) == 1
    assert_close(out.reshape(M, I), gated_reference(x, gate, up, activation or "none"))


@needs_hopper
@pytest.mark.parametrize("M", [128, 1024, 2048])
def test_ff_gated_takes_the_gated_tiles(built, monkeypatch, M):
    """ff_a16w16_gated from 128 rows on: the gated tiles (no separate up GEMM at M >= 1024), then
    the down GEMM; equal to the tl kernels' result within bf16 rounding."""
    I, H = 3072, 1024
    x, w, _, gate, up = ff_operands(M, I, H)
    w_down = randn(H, I, dtype=BF16, scale=I**-0.5)
    out = gemmkit.ff_a16w16_gated(x, w, w_down)
    assert any(p.gated for p in built)
    h = gated_reference(x, gate, up).to(BF16)
    assert_close(out, h.double() @ w_down.double().T, tol=2e-2)
    assert_close(out, tl_result(monkeypatch, lambda: gemmkit.ff_a16w16_gated(x, w, w_down)).double(), tol=2e-2)


@needs_hopper
@pytest.mark.parametrize("layout", ["concat", "interleaved", "separate"])
@pytest.mark.parametrize("granularity", ["row", "tensor"])
def test_ff_a8w8_gated_tiles(built, layout, granularity):
    """FP8 weights with per-channel (in the rows' order of each layout) or per-tensor scales, x
    quantized per token first; the gated tiles with the scales applied in the epilogue."""
    from gemmkit.ops import fused

    M, I, H = 512, 3000, 2048
    x, w16, w_up16, _, _ = ff_operands(M, I, H, BF16, layout)
    rows = torch.cat([w16, w_up16]) if w_up16 is not None else w16
    wq, ws = quant.quantize_fp8(rows, granularity)
    ws = ws.reshape(-1)
    w_gate_up, w_up = (wq[:I], wq[I:]) if w_up16 is not None else (wq, None)
    lay = "interleaved" if layout == "interleaved" else "concat"
    gq, uq = fused.gate_up_views(w_gate_up, w_up, lay)
    if granularity == "tensor":
        gs = us = ws.expand(I)
    else:
        gs, us = (ws[0::2], ws[1::2]) if layout == "interleaved" else (ws[:I], ws[I:])
    w_down, w_down_s = quant.quantize_fp8(randn(H, I, dtype=BF16, scale=I**-0.5), "row")
    out = gemmkit.ff_a8w8_gated(x, w_gate_up, ws, w_down, w_down_s, w_up=w_up, layout=lay)
    assert any(p.gated for p in built)
    xq, xs = quant.quantize_fp8(x, "row")
    h = gated_reference(xq, gq, uq, "silu", xs, gs, us).to(BF16)
    hq, hs = quant.quantize_fp8(h, "row")
    ref = (hq.double() @ w_down.double().T) * hs.double() * w_down_s.double().reshape(1, -1)
    assert_close(out, ref, tol=2e-2)


@needs_hopper
@pytest.mark.parametrize("out_kind", ["bf16", "fp32", "y_view"])
@pytest.mark.parametrize("M,N,K,parts", [(300, 1280, 8192, (128, 32)), (777, 4096, 1040, (128, 64)),
                                         (1, 1024, 2048, (64, 0)), (1000, 2000, 1024, (128, 128)),
                                         (130, 768, 4096, (64, 16))])
def test_dense_swapped(built, monkeypatch, M, N, K, parts, out_kind):
    """gemm_a16w16 with swapped operands forced (kernels/gemm_ws.py C_T): K slices summed in y's orientation where
    the tiles are few (the bias added by the reduction), ragged M, N and K, an fp32 output, a preallocated
    poisoned output that is a column slice of a wider buffer (its rows' stride not N)."""
    monkeypatch.setattr(hopper_ws, "ws_direct_ok", lambda *args: True)
    monkeypatch.setattr(hopper_ws, "ws_dense_swap", lambda *args: parts)
    x, w = randn(M, K, dtype=BF16), randn(N, K, dtype=BF16, scale=K**-0.5)
    bias = randn(N, dtype=FP32)
    ref = reference(x, w) + bias.double()
    if out_kind == "y_view":
        y = poisoned((M, N + 24), BF16)[:, 8:N + 8]
        out = gemmkit.gemm_a16w16(x, w, bias, y=y)
        assert out.data_ptr() == y.data_ptr()
    else:
        out = gemmkit.gemm_a16w16(x, w, bias, out_dtype=BF16 if out_kind == "bf16" else FP32)
    assert len(built) == 1 and built[0].swap and built[0].parts == parts
    assert_close(out, ref.to(out.dtype))


def test_ragged_rule():
    """bf16 / fp16 with M not a multiple of 128 from RAGGED_MIN_M rows to 1023: the Gluon kernel always, in the tiles of
    least wave cost (64-row ones penalized): swapped where x's rows fit 160-wide tiles (300 of 8192 x 8192),
    64 rows where 128-row tiles leave SMs idle (200 of 4096 x 4096), 128 rows where they fill a wave (450 x 4096);
    aligned M, FP8, short K and fewer rows keep the rules before it."""
    sms = 132
    assert hopper_ws.ws_ragged_tiles(300, 8192, sms) == (128, (128, 32), True)
    assert hopper_ws.ws_dense_swap(300, 8192, 8192, sms) == (128, 32)
    assert hopper_ws.ws_tiles(300, 8192, sms, False) == hopper_ws.ws_ragged_tiles(300, 8192, sms, swap_ok=False)[:2]
    assert hopper_ws.ws_ragged_tiles(300, 8200, sms)[2] is False  # (y's rows not 16-element multiples)
    assert hopper_ws.ws_ragged_tiles(200, 4096, sms)[0] == 64 and hopper_ws.ws_dense_swap(200, 4096, 4096, sms) is None
    assert hopper_ws.ws_ragged_tiles(450, 4096, sms)[:2] == (128, (128, 0))
    for M, N, K in [(450, 4096, 4096), (777, 5120, 14336), (200, 1280, 8192)]:
        assert hopper_ws.ws_direct_ok(M, N, K, sms, False)
    assert not hopper_ws._ragged(512, 4096, False) and not hopper_ws._ragged(300, 4096, True)
    assert not hopper_ws._ragged(300, 512, False) and not hopper_ws._ragged(90, 4096, False)
    assert not hopper_ws._ragged(1500, 4096, False)


@needs_hopper
@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.parametrize("M,N,K,kind", [(300, 8192, 2048, "swap"), (200, 4096, 1040, "rows64"),
                                        (450, 4096, 1024, "rows128"), (777, 6144, 1104, "swap")])
def test_ragged_rule_results(built, dtype, M, N, K, kind):
    """gemm_a16w16 at M not a multiple of 128 as the rule routes it (each of its three tilings), with a bias into a
    poisoned output, against the float64 reference."""
    check_a16w16_into_poisoned(built, dtype, M, N, K)
    plan = built[0]
    assert (plan.swap, plan.rows) == {"swap": (True, 128), "rows64": (False, 64), "rows128": (False, 128)}[kind]


# batched bf16 / fp16 (gemmkit.batched_gemm_a16w16 on this kernel) ---------------------------------

@pytest.mark.skipif(hopper_ws.gluon_kernel() is None, reason="this Triton has no Gluon")
@pytest.mark.parametrize("B,M,N,K,b_rows,c_tma", [(8, 512, 4096, 2048, 4096, 1), (3, 300, 1000, 1040, 0, 2)])
@pytest.mark.parametrize("ragged_tma", [True, False])
def test_batched_plan_binds_the_kernel_signature(B, M, N, K, b_rows, c_tma, ragged_tma, monkeypatch):
    """A batched WSPlan over the entries' row stacks (built on the CPU): the descriptors span every
    entry, each entry's rows at M per entry, one K slice; TMA stores where M is a multiple of the
    tiles' rows, else (C_TMA_INSIDE, 2) for the rows inside an entry (a tile past M would write the
    next entry's), or (RAGGED_C_TMA off) pointer stores only."""
    monkeypatch.setattr(hopper_ws, "RAGGED_C_TMA", ragged_tma)
    c_tma = c_tma if ragged_tma or c_tma == 1 else 0
    x, w = torch.empty(B * M, K, dtype=BF16), torch.empty(B * b_rows or N, K, dtype=BF16)
    bias = torch.empty(B, N, dtype=BF16)
    plan = hopper_ws.WSPlan(x, w, None, M, N, K, "none", None, None, bias, BF16, (B, M, N), False, 132,
                            promote=False, batch=(B, b_rows))
    names = hopper_ws.gluon_kernel().gemm_ws_kernel.arg_names[len(hopper_ws.PER_CALL):]
    tail = dict(zip(names, plan.tail))
    assert (tail["batch"], tail["a_batch_rows"], tail["b_batch_rows"], tail["c_batch_rows"]) == (B, M, b_rows, M)
    assert tail["bias_batch_stride"] == N and plan.splits == 1 and tail["C_TMA"] == c_tma
    assert plan.c_tma == (c_tma > 0) and plan.ragged == (c_tma == 2)
    assert plan.a_desc.args[0] == [B * M, K] and plan.b0_desc.args[0] == [B * b_rows or N, K]
    assert plan.launch.grid[0] == min(132, B * -(-M // plan.rows) * -(-N // plan.block_n))


@needs_hopper
@pytest.mark.parametrize("tiles", [None, (64, (128, 32))])
@pytest.mark.parametrize("out_dtype", [BF16, FP32])
@pytest.mark.parametrize("bias_kind", [None, "shared", "per_batch"])
@pytest.mark.parametrize("weights", ["per_entry", "shared"])
@pytest.mark.parametrize("B,M,N,K", [(8, 512, 4096, 2048), (3, 256, 1000, 1040), (4, 1024, 1500, 2048),
                                     (2, 128, 3000, 1024), (3, 300, 1000, 1040), (5, 200, 2048, 1024), (4, 1, 512, 256)])
def test_batched_a16w16(built, monkeypatch, B, M, N, K, weights, bias_kind, out_dtype, tiles):
    """Ragged N and K (a tile past N reads the next entry's weight rows), ragged M (a tile past M reads
    the next entry's rows; its warp groups' rows past M stored by pointers), a weight shared by the
    batch (stride 0), bias per entry, fp32 output (pointer stores, each entry's rows offset), 64-row
    tiles. The output is poisoned first: every entry's rows must be written, none twice wrongly."""
    monkeypatch.setattr(hopper_ws, "ws_direct_ok", lambda *args: True)
    monkeypatch.setattr(hopper_ws, "SWAP_BATCHED", False)  # (the swapped operands: test_batched_swapped)
    monkeypatch.setattr(batched_op, "SHARED_WEIGHT_AS_ONE", False)  # (a shared weight: the batched kernel here)
    if tiles is not None:
        monkeypatch.setattr(hopper_ws, "ws_tiles", lambda *args: tiles)
    x = randn(B, M, K, dtype=BF16)
    w = randn(B, N, K, dtype=BF16, scale=K**-0.5) if weights == "per_entry" else randn(N, K, dtype=BF16, scale=K**-0.5)
    bias = {None: None, "shared": randn(N, dtype=FP32), "per_batch": randn(B, N, dtype=FP32)}[bias_kind]
    poison = poisoned((B, M, N), out_dtype)
    del poison  # (freed NaNs: the output's allocation likely reuses them; a row left unwritten shows)
    out = gemmkit.batched_gemm_a16w16(x, w, bias, out_dtype=out_dtype)
    assert out.shape == (B, M, N) and out.dtype == out_dtype and len(built) == 1 and built[0].batch == B
    assert built[0].c_tma == (out_dtype == BF16 and N % 8 == 0)  # (16-byte output rows)
    assert built[0].ragged == (built[0].c_tma and M % built[0].rows != 0)
    ref = torch.matmul(x.double(), (w if w.ndim == 3 else w.expand(B, N, K)).double().transpose(1, 2))
    if bias is not None:
        ref = ref + (bias.double() if bias.ndim == 1 else bias.double()[:, None, :])
    assert_close(out, ref.to(out_dtype))


@pytest.mark.skipif(hopper_ws.gluon_kernel() is None, reason="this Triton has no Gluon")
@pytest.mark.parametrize("b_rows", [4096, 0])
def test_batched_swapped_plan_binds_the_kernel_signature(b_rows):
    """Swapped operands (built on the CPU): the weight's rows as the kernel's rows (A), x's as its columns (B),
    c's strides swapped, each entry's output M rows of y apart, pointer stores of the transposed tiles."""
    B, M, N, K = 8, 300, 4096, 4096
    x, w = torch.empty(B * M, K, dtype=BF16), torch.empty(B * b_rows or N, K, dtype=BF16)
    bias = torch.empty(B, N, dtype=BF16)
    plan = hopper_ws.WSPlan(x, w, None, M, N, K, "none", None, None, bias, BF16, (B, M, N), False, 132,
                            promote=False, tiles=(128, (128, 32)), batch=(B, b_rows), swap=True)
    names = hopper_ws.gluon_kernel().gemm_ws_kernel.arg_names[len(hopper_ws.PER_CALL):]
    tail = dict(zip(names, plan.tail))
    assert (tail["M"], tail["N"], tail["stride_cm"], tail["stride_cn"]) == (N, M, 1, N)
    assert (tail["a_batch_rows"], tail["b_batch_rows"], tail["c_batch_rows"], tail["C_T"]) == (b_rows, M, M, True)
    assert tail["C_TMA"] == 0 and not plan.c_tma and plan.splits == 1 and tail["bias_batch_stride"] == N
    assert plan.a_desc.args[0] == [B * b_rows or N, K] and plan.a_desc.args[2] == [64, 64]
    assert plan.b0_desc.args[0] == [B * M, K] and plan.b0_desc.args[2] == [128, 64] and plan.b1_desc.args[2] == [32, 64]
    assert plan.launch.grid[0] == min(132, B * (N // 128) * -(-M // 160))


def test_batched_swap_rule():
    """Swapped only where M per entry is ragged for the picked tiles, N a multiple of 16 and the swapped waves
    cost less: 300 rows padded to 384 by 128-row tiles against 2 x 160 swapped."""
    tiles = (128, (128, 128))
    assert hopper_ws.ws_batched_swap(8, 300, 4096, tiles, 132) is not None
    assert hopper_ws.ws_batched_swap(8, 256, 4096, tiles, 132) is None  # (no padding)
    assert hopper_ws.ws_batched_swap(8, 300, 4104, tiles, 132) is None  # (y's rows: 8-byte vectors only)


@needs_hopper
@pytest.mark.parametrize("out_dtype", [BF16, FP32])
@pytest.mark.parametrize("bias_kind", [None, "per_batch"])
@pytest.mark.parametrize("weights", ["per_entry", "shared"])
@pytest.mark.parametrize("B,M,N,K,parts", [(8, 300, 4096, 1024, (128, 32)), (3, 777, 2048, 1040, (128, 64)),
                                           (4, 1, 512, 256, (64, 16)), (2, 200, 1000, 2048, (128, 128)),
                                           (5, 129, 1536, 1024, (64, 0)), (3, 1000, 1024, 4096, (128, 0))])
def test_batched_swapped(built, monkeypatch, B, M, N, K, parts, weights, bias_kind, out_dtype):
    """Swapped operands (y^T = w x^T per entry, kernels/gemm_ws.py C_T) at each tile width: x's rows past an
    entry's end read the next entry's (not stored), ragged N and K, one M = 1, N = 1000 (y's rows not a
    multiple of 16 elements: unvectorized stores), a weight shared by the batch, bias per entry, fp32 output.
    The output is poisoned first."""
    monkeypatch.setattr(hopper_ws, "ws_direct_ok", lambda *args: True)
    monkeypatch.setattr(hopper_ws, "ws_batched_swap", lambda *args: parts)
    monkeypatch.setattr(batched_op, "SHARED_WEIGHT_AS_ONE", False)
    x = randn(B, M, K, dtype=BF16)
    w = randn(B, N, K, dtype=BF16, scale=K**-0.5) if weights == "per_entry" else randn(N, K, dtype=BF16, scale=K**-0.5)
    bias = None if bias_kind is None else randn(B, N, dtype=FP32)
    poison = poisoned((B, M, N), out_dtype)
    del poison
    out = gemmkit.batched_gemm_a16w16(x, w, bias, out_dtype=out_dtype)
    assert len(built) == 1 and built[0].swap and built[0].parts == parts and not built[0].c_tma
    ref = torch.matmul(x.double(), (w if w.ndim == 3 else w.expand(B, N, K)).double().transpose(1, 2))
    if bias is not None:
        ref = ref + bias.double()[:, None, :]
    assert_close(out, ref.to(out_dtype))


@needs_hopper
def test_batched_fp16_and_fallbacks(built, monkeypatch):
    """fp16 at a size the rule takes; an activation, a caller's config, an x whose entries are not
    evenly stacked take the tl kernel; entries of a ragged number of rows this kernel (RAGGED_BATCHED),
    or the tl kernel with it off."""
    B, M, N, K = 4, 1024, 2048, 2048
    x, w = randn(B, M, K, dtype=FP16), randn(B, N, K, dtype=FP16, scale=K**-0.5)
    ref = torch.matmul(x.double(), w.double().transpose(1, 2))
    assert_close(gemmkit.batched_gemm_a16w16(x, w), ref.to(FP16))
    assert len(built) == 1
    assert_close(gemmkit.batched_gemm_a16w16(x, w, activation="relu"), torch.relu(ref).to(FP16))
    xs = randn(B, M + 8, K, dtype=FP16)[:, :M]
    assert_close(gemmkit.batched_gemm_a16w16(xs, w), torch.matmul(xs.double(), w.double().transpose(1, 2)).to(FP16))
    assert_close(gemmkit.batched_gemm_a16w16(x, w, config=dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)), ref.to(FP16))
    xr = randn(B, 1000, K, dtype=FP16)  # 1000 rows per entry: not a multiple of the tiles'
    ref_r = torch.matmul(xr.double(), w.double().transpose(1, 2)).to(FP16)
    assert_close(gemmkit.batched_gemm_a16w16(xr, w), ref_r)
    assert len(built) == 2 and built[1].ragged
    monkeypatch.setattr(hopper_ws, "RAGGED_BATCHED", False)
    assert_close(gemmkit.batched_gemm_a16w16(xr[:, :999], w), ref_r[:, :999])
    assert len(built) == 2


# grouped GEMMs (mixture-of-experts): the expert map --------------------------------------------

@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("gated", [False, True])
def test_grouped_plan_binds_the_kernel_signature(gated, gather):
    """A grouped WSPlan (built on the CPU): x's sorted rows and every expert's weight rows in one descriptor each
    (the gate / up halves of an (E, 2I, K) weight: each expert 2I rows apart), the expert map over the next power
    of two of E, one K slice, TMA stores inside each expert's rows (C_TMA_INSIDE), a persistent grid no larger
    than the tiles could be however the rows fall."""
    E, R, N, K = 6, 1000, 768, 1024
    x = torch.empty(R, K, dtype=BF16)
    w3 = torch.empty(E, 2 * N if gated else N, K, dtype=BF16)
    w_rows = ((E - 1) * w3.shape[1] + N, K)
    bias = None if gated else torch.empty(E, N, dtype=BF16)
    plan = hopper_ws.WSPlan(x, torch.as_strided(w3, w_rows, (K, 1)), None, R, N, K, "none", None, None, bias, BF16,
                            (R, N), False, 132, promote=False, gated=("silu", (0, 1)) if gated else None,
                            tiles=None if gated else (128, (128, 0)), experts=(E, w3.shape[1], 0), gather=gather)
    names = hopper_ws.gluon_kernel().gemm_ws_kernel.arg_names[len(hopper_ws.PER_CALL):]
    tail = dict(zip(names, plan.tail))
    assert (tail["num_experts"], tail["EXPERTS"], tail["a_batch_rows"], tail["b_batch_rows"]) == (E, 8, 0, w3.shape[1])
    assert tail["c_batch_rows"] == 0 and tail["batch"] == 1 and plan.splits == 1 and tail["C_TMA"] == 2
    assert tail["bias_batch_stride"] == (0 if gated else N) and tail["GATED"] == gated
    assert tail["A_GATHER"] == gather and tail["stride_am"] == K and plan.b0_desc.args[0] == list(w_rows)
    rows = torch.zeros(R, dtype=torch.int32)
    up = torch.as_strided(w3[:, N:], w_rows, (K, 1)) if gated else None
    args = plan.arguments(x, torch.as_strided(w3, w_rows, (K, 1)), torch.empty(R, N, dtype=BF16), bias, None, None,
                          up, torch.zeros(E + 1, dtype=torch.int32), rows if gather else None)
    per_call = dict(zip(hopper_ws.PER_CALL, args))
    assert per_call["a_src"] is (x if gather else None) and per_call["a_rows"] is (rows if gather else None)
    assert gather or plan.a_desc.args[0] == [R, K]
    assert plan.launch.grid[0] == min(132, (-(-R // 128) + E) * -(-N // plan.block_n))


def test_grouped_rule(monkeypatch):
    """The expert map serves bf16 / fp16 grouped GEMMs of GROUPED_MIN_ROWS rows per expert on average on Hopper,
    rows stored in order, unweighted, no activation but a gated one, the library's config; else None (the tl
    kernel). Checked against a Hopper device on the CPU (ws_enabled patched)."""
    monkeypatch.setattr(hopper_ws, "ws_enabled", lambda dev, device: True)
    dev = known_device("NVIDIA_H100_80GB_HBM3")
    E, N, K = 8, 1536, 2048
    x, w = torch.empty(E * 256, K, dtype=BF16), torch.empty(E, N, K, dtype=BF16)
    kw = dict(gather=False, scatter=False, weighted=False, activation="none", out_dtype=BF16, config=None)
    assert isinstance(hopper_ws.ws_grouped_plan(dev, x, w, E * 256, None, **kw), hopper_ws.GroupedWSPlan)
    assert hopper_ws.ws_grouped_plan(dev, x, w, E * 256, None, **dict(kw, gather=True)) is not None
    scattered = hopper_ws.ws_grouped_plan(dev, x, w, E * 256, None, **dict(kw, scatter=True, weighted=True))
    assert scattered.plan.scatter == (True, True) and not scattered.plan.c_tma  # (pointer stores)
    for bad in (dict(activation="silu"), dict(out_dtype=FP32), dict(config=dict(BLOCK_M=64))):
        assert hopper_ws.ws_grouped_plan(dev, x, w, E * 256, None, **dict(kw, **bad)) is None, bad
    assert hopper_ws.ws_grouped_plan(dev, x, w, E * 15, None, **kw) is None  # (few rows per expert)
    assert hopper_ws.ws_grouped_plan(dev, x[:511], w, 511, None, **kw) is None  # (few rows)
    E2 = 2  # (many rows per expert: gathered rows copied in order first, then TMA loads)
    many = torch.empty(E2 * hopper_ws.GROUPED_PERMUTE_ROWS, K, dtype=BF16)
    permuted = hopper_ws.ws_grouped_plan(dev, many, w[:E2], many.shape[0], None, **dict(kw, gather=True))
    assert permuted.permute and not permuted.plan.gather
    assert not hopper_ws.ws_grouped_plan(dev, x, w, E * 256, None, **dict(kw, gather=True)).permute
    x_odd = torch.empty(E * 256, K + 4, dtype=BF16)[:, :K]  # (rows 4104 bytes apart: not a TMA stride)
    assert hopper_ws.ws_grouped_plan(dev, x_odd, w, E * 256, None, **kw) is None
    assert hopper_ws.ws_grouped_plan(dev, x.half(), w, E * 256, None, **kw) is None  # (mixed dtypes)
    x_k, w_k = torch.empty(E * 256, 1032, dtype=BF16)[:, :1030], torch.empty(E, N, 1032, dtype=BF16)[:, :, :1030]
    assert hopper_ws.ws_grouped_plan(dev, x_k, w_k, E * 256, None, **kw) is not None  # (TMA: any K)
    assert hopper_ws.ws_grouped_plan(dev, x_k, w_k, E * 256, None, **dict(kw, gather=True)) is None  # (16-byte copies)
    x8, w8 = x.to(E4M3), w.to(E4M3)
    xs8, ws8 = torch.empty(E * 256), torch.empty(E, N)
    fp8 = hopper_ws.ws_grouped_plan(dev, x8, w8, E * 256, None, **kw, x_scale=xs8, w_scale=ws8)
    assert fp8.plan.experts == (E, N, N)  # (per-channel scales, N apart per expert)
    assert hopper_ws.ws_grouped_plan(dev, x8, w8, E * 256, None, **kw, x_scale=xs8, w_scale=ws8[:, 0].contiguous()
                                     ).plan.experts == (E, N, 1)  # (one scale per expert)
    assert hopper_ws.ws_grouped_plan(dev, x8, w8, E * 256, None, **kw) is None  # (FP8 without scales)
    gate = torch.empty(E, 2 * N, K, dtype=BF16)[:, :N]
    gated = dict(kw, activation="silu")
    assert hopper_ws.ws_grouped_plan(dev, x, gate, E * 256, None, **gated, gated=True) is not None
    assert hopper_ws.ws_grouped_plan(dev, x, gate, E * 256, None, **dict(gated, scatter=True), gated=True) is None


def _sizes_routing(kind, E, R):
    """(E,) row counts summing to R: ragged (some 0, some under a tile, one over several tiles) or even."""
    if kind == "even":
        s = torch.full((E,), R // E)
        s[-1] += R - int(s.sum())
        return s.to(torch.int32)
    g = torch.Generator().manual_seed(E * 7 + R)
    w = torch.rand(E, generator=g) ** 3
    w[0] = 0  # (an empty expert first)
    w[E // 2] = 0
    s = (w / w.sum() * R).floor().to(torch.int32)
    s[1] += R - int(s.sum())
    return s


@needs_hopper
@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("bias_kind", [None, "shared", "per_expert"])
@pytest.mark.parametrize("E,R,N,K,routing", [(8, 2048, 1536, 2048, "even"), (6, 1000, 1000, 1040, "ragged"),
                                             (64, 4096, 3488, 776, "ragged"),  # (rows 16 bytes aligned, not 32)
                                             (16, 3000, 768, 512, "ragged"), (3, 777, 2048, 4096, "ragged"),
                                             (128, 20000, 256, 1024, "ragged")])
def test_grouped_expert_map(built, monkeypatch, dtype, gather, bias_kind, E, R, N, K, routing):
    """gemmkit.grouped_gemm_a16w16 on the expert map (GROUPED_MIN_ROWS 0: every size here): empty experts, experts
    of fewer rows than a tile and of many tiles, ragged N and K (tiles past N read the next expert's weight rows),
    gathered rows, bias per expert or shared, fp16. Every row is some expert's: the poisoned output must be all
    written."""
    from test_grouped import _ref

    monkeypatch.setattr(hopper_ws, "GROUPED_MIN_ROWS", 0)
    sizes = _sizes_routing(routing, E, R).to(DEVICE)
    o = grouped_op.offsets_from_sizes(sizes)
    T = R if not gather else R // 2 + 1
    x = randn(T, K, dtype=dtype)
    g = torch.randint(0, T, (R,), device=DEVICE, dtype=torch.int32) if gather else None
    w = randn(E, N, K, dtype=dtype, scale=K**-0.5)
    bias = None if bias_kind is None else randn(*((E, N) if bias_kind == "per_expert" else (N,)), dtype=dtype)
    y = gemmkit.grouped_gemm_a16w16(x, w, o, gather_idx=g, bias=bias)
    assert len(built) == 1 and built[0].experts is not None and built[0].gather == gather
    assert_close(y, _ref(x, w, o, g, bias).to(dtype))


@needs_hopper
@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("w_gran", ["channel", "expert", "tensor"])
@pytest.mark.parametrize("E,T,k,N,K", [(8, 1024, 2, 1536, 2048), (16, 600, 4, 1000, 1040), (64, 1500, 8, 512, 784)])
def test_grouped_a8w8_expert_map(built, monkeypatch, gather, w_gran, E, T, k, N, K):
    """grouped_gemm_a8w8 (FP8 e4m3, fast accumulation) on the expert map: per-token x scales (read through the
    gathered rows), per-channel, per-expert or one weight scale, bias per expert, bf16 output; ragged N and K."""
    from test_grouped import _ref

    monkeypatch.setattr(hopper_ws, "GROUPED_MIN_ROWS", 0)
    x = randn(T, K, dtype=BF16)
    xq, xs = quant.quantize_fp8(x, "row")
    w = randn(E, N, K, dtype=BF16, scale=K**-0.5)
    wq = torch.empty(E, N, K, dtype=E4M3, device=DEVICE)
    ws = torch.empty(E, N, dtype=FP32, device=DEVICE)
    for e in range(E):
        q, s = quant.quantize_fp8(w[e], "row")
        wq[e], ws[e] = q, s.reshape(N)
    if w_gran == "expert":
        ws = ws.amax(1).contiguous()  # (one value per expert: requantized against it below)
        wq = (w.float() / ws[:, None, None]).clamp(-448, 448).to(E4M3)
    elif w_gran == "tensor":
        ws = ws.amax().reshape(1)
        wq = (w.float() / ws).clamp(-448, 448).to(E4M3)
    g, _, o = moe.sort_by_expert(torch.randint(0, E, (T, k), device=DEVICE), E)
    xs = xs.reshape(T).contiguous()
    xg, xsg = (xq, xs) if gather else (xq[g.long()].contiguous(), xs[g.long()].contiguous())
    bias = randn(E, N, dtype=BF16)
    y = gemmkit.grouped_gemm_a8w8(xg, wq, xsg, ws, o, gather_idx=g if gather else None, bias=bias)
    assert len(built) == 1 and built[0].experts is not None and built[0].gather == gather
    w_deq = wq.float() * (ws[:, :, None] if w_gran == "channel" else ws.reshape(-1, 1, 1) if w_gran == "expert"
                          else ws)
    x_deq = xq.float() * xs[:, None]
    assert_close(y, _ref(x_deq, w_deq, o, g, bias).to(BF16))


@needs_hopper
def test_grouped_permuted_rows(built, monkeypatch):
    """Many rows per expert (GROUPED_PERMUTE_ROWS): gathered rows copied in order, then the expert map's TMA loads."""
    from test_grouped import _ref

    monkeypatch.setattr(hopper_ws, "GROUPED_PERMUTE_ROWS", 64)
    E, T, N, K = 4, 700, 1000, 1040
    x, w = randn(T, K, dtype=BF16), randn(E, N, K, dtype=BF16, scale=K**-0.5)
    g, _, o = moe.sort_by_expert(torch.randint(0, E, (T, 2), device=DEVICE), E)
    y = gemmkit.grouped_gemm_a16w16(x, w, o, gather_idx=g)
    assert len(built) == 1 and not built[0].gather
    assert_close(y, _ref(x, w, o, g).to(BF16))


@needs_hopper
@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.parametrize("bias_kind", [None, "per_expert"])
@pytest.mark.parametrize("k,E,T,N,K,rows64", [(2, 8, 1024, 1536, 2048, False), (8, 16, 300, 1000, 1040, False),
                                              (4, 6, 500, 768, 512, True)])
def test_grouped_scatter_weighted(built, monkeypatch, dtype, bias_kind, k, E, T, N, K, rows64):
    """moe_mlp's down projection on the expert map: gathered token rows, each product row stored at its (token,
    slot) row and multiplied by its routing weight after the bias (pointer stores); 64-row tiles too."""
    from test_grouped import _ref

    monkeypatch.setattr(hopper_ws, "GROUPED_MIN_ROWS", 0)
    if rows64:
        monkeypatch.setattr(hopper_ws, "ws_tiles", lambda *args: (64, (128, 0)))
    x, w = randn(T, K, dtype=dtype), randn(E, N, K, dtype=dtype, scale=K**-0.5)
    ids = torch.randint(0, E, (T, k), device=DEVICE)
    ids[: T // 2, 0] = 1  # (a crowded expert)
    weights = torch.rand(T, k, device=DEVICE)
    bias = None if bias_kind is None else randn(E, N, dtype=dtype)
    g, sidx, o = moe.sort_by_expert(ids, E)
    y = gemmkit.grouped_gemm_a16w16(x, w, o, gather_idx=g, scatter_idx=sidx, routing_weights=weights, bias=bias)
    assert len(built) == 1 and built[0].scatter == (True, True) and built[0].rows == (64 if rows64 else 128)
    ref = torch.empty(T * k, N, dtype=torch.float64, device=DEVICE)
    ref[sidx.long()] = _ref(x, w, o, g, bias) * weights.reshape(-1)[sidx.long()].double()[:, None]
    assert_close(y, ref.to(dtype))


@needs_hopper
@pytest.mark.parametrize("kind", ["plain", "gated", "scattered", "fp8"])
def test_grouped_tile_rows_past_half(built, monkeypatch, kind):
    """Experts whose last tile-row ends just before, at and just after the second consumer warp group's rows (64 of
    a 128-row tile), empty ones among them: every expert's rows right, nothing of a tile stored past its expert's
    rows (those are the next expert's)."""
    from test_grouped import _ref

    monkeypatch.setattr(hopper_ws, "GROUPED_MIN_ROWS", 0)
    monkeypatch.setattr(hopper_ws, "GROUPED_GATED_MIN_ROWS", 0)
    monkeypatch.setattr(hopper_ws, "GROUPED_FP8_MIN_ROWS", 0)
    monkeypatch.setattr(hopper_ws, "ws_tiles", lambda M, N, sms, fp8: (128, hopper_ws.ws_parts(M, N, sms, fp8)))
    sizes = torch.tensor([0, 1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 64, 0, 700], dtype=torch.int32)
    E, R, N, K = sizes.numel(), int(sizes.sum()), 1000, 1040
    o = grouped_op.offsets_from_sizes(sizes.to(DEVICE))
    x = randn(R, K, dtype=BF16)
    if kind == "gated":
        wgu = randn(E, 2 * N, K, dtype=BF16, scale=K**-0.5)
        y = grouped_op.grouped_gated_a16w16(x, wgu, o)
        h = _ref(x, wgu, o, None)
        ref = torch.nn.functional.silu(h[:, :N]) * h[:, N:]
    elif kind == "fp8":
        xq, xs = quant.quantize_fp8(x, "row")
        w = randn(E, N, K, dtype=BF16, scale=K**-0.5)
        ws = w.float().abs().amax(2).clamp_min(1e-12) / 448
        wq = (w.float() / ws[:, :, None]).to(E4M3)
        y = gemmkit.grouped_gemm_a8w8(xq, wq, xs.reshape(R), ws, o)
        ref = _ref(xq.float() * xs.reshape(R, 1), wq.float() * ws[:, :, None], o, None)
    else:
        w = randn(E, N, K, dtype=BF16, scale=K**-0.5)
        if kind == "plain":
            y = gemmkit.grouped_gemm_a16w16(x, w, o)
            ref = _ref(x, w, o, None)
        else:  # (each row to a row of its own, weighted: pointer stores)
            dest = torch.randperm(R, device=DEVICE).to(torch.int32)
            rw = torch.rand(R, device=DEVICE)
            y = gemmkit.grouped_gemm_a16w16(x, w, o, scatter_idx=dest, routing_weights=rw)
            ref = torch.empty(R, N, dtype=torch.float64, device=DEVICE)
            ref[dest.long()] = _ref(x, w, o, None) * rw[dest.long()].double()[:, None]
    assert len(built) == 1 and built[0].experts is not None and built[0].rows == 128
    assert_close(y, ref.to(BF16))


@needs_hopper
@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_grouped_gated_expert_map(built, monkeypatch, gather, activation):
    """gemmkit.ops.grouped.grouped_gated_a16w16 on the expert map: the gate and up halves of one (E, 2I, K)
    weight, ragged experts; and moe_mlp with it (the down projection's scattered, weighted rows on the expert
    map too)."""
    from test_grouped import _ref

    monkeypatch.setattr(hopper_ws, "GROUPED_MIN_ROWS", 0)
    monkeypatch.setattr(hopper_ws, "GROUPED_GATED_MIN_ROWS", 0)
    E, I, H, R = 6, 1000, 2048, 1500
    o = grouped_op.offsets_from_sizes(_sizes_routing("ragged", E, R).to(DEVICE))
    T = R if not gather else 700
    x = randn(T, H, dtype=BF16)
    g = torch.randint(0, T, (R,), device=DEVICE, dtype=torch.int32) if gather else None
    wgu = randn(E, 2 * I, H, dtype=BF16, scale=H**-0.5)
    y = grouped_op.grouped_gated_a16w16(x, wgu, o, gather_idx=g, activation=activation)
    assert len(built) == 1 and built[0].experts is not None and built[0].gated
    h = _ref(x, wgu, o, g)
    act = torch.nn.functional.silu if activation == "silu" else (
        lambda t: torch.nn.functional.gelu(t, approximate="tanh"))
    assert_close(y, (act(h[:, :I]) * h[:, I:]).to(BF16))
    topk = torch.randint(0, E, (512, 2), device=DEVICE)
    wts = torch.rand(512, 2, device=DEVICE)
    wd = randn(E, H, I, dtype=BF16, scale=I**-0.5)
    xm = randn(512, H, dtype=BF16)
    out = moe.moe_mlp(xm, topk, wts, wgu, wd)
    ref = torch.zeros(512, H, dtype=torch.float64, device=DEVICE)
    for t in range(0, 512, 37):
        for j in range(2):
            e = int(topk[t, j])
            hh = xm[t].double() @ wgu[e].double().T
            a = (torch.nn.functional.silu(hh[:I]) * hh[I:]).to(BF16).double()
            ref[t] += wts[t, j].double() * (a @ wd[e].double().T)
    assert_close(out[::37], ref[::37].to(BF16))


def test_mn_major_operands_rule(monkeypatch):
    """bf16 / fp16 problems of the kernel's sizes with an operand that is not K-contiguous (the backward's dy @ w and
    dy.T @ x) get the tl kernel's 128 x 256 config; K-major operands (the kernel's), other sizes, FP8 or other devices
    keep the table's. Checked against a Hopper device on the CPU (ws_enabled patched)."""
    dev = known_device("NVIDIA_H100_80GB_HBM3")
    M, N, K = 4096, 3584, 3584
    dy, w, x = torch.empty(M, N, dtype=BF16), torch.empty(N, K, dtype=BF16), torch.empty(M, K, dtype=BF16)
    assert hopper_ws.ws_mn_major_config(dev, dy, w.t(), M, K, N) is None  # (not a device that runs the kernel)
    monkeypatch.setattr(hopper_ws, "ws_enabled", lambda dev, device: True)
    for a, b, shape in ((dy, w.t(), (M, K, N)), (dy.t(), x.t(), (N, K, M))):
        cfg = hopper_ws.ws_mn_major_config(dev, a, b, *shape)
        assert cfg is not None and (cfg.BLOCK_M, cfg.BLOCK_N, cfg.TMA, cfg.PERSISTENT) == (128, 256, True, True)
    assert hopper_ws.ws_mn_major_config(dev, x, w, M, N, K) is None  # (K-major: the warp-specialized kernel's)
    assert hopper_ws.ws_mn_major_config(dev, dy[:16], w.t(), 16, K, N) is None  # (small M: the tables')
    assert hopper_ws.ws_mn_major_config(dev, dy.to(E4M3), w.t().to(E4M3), M, K, N) is None
