"""The 4-bit weight as the warp-specialized GEMM's A operand (sm_90; kernels/gemm_ws.py W_FORMAT INT4 / MXFP4,
core/hopper_w4.W4TilePlan): which gemm_a16w4 / gemm_a16wfp4 calls take it, the launch's arguments, and, on a
Hopper GPU, its results against float64 references of the dequantized weights. The CPU tests check the rule,
the tile shapes and the kernel arguments the plan passes (the kernel itself compiles offline in
tests/test_codegen.py, where the CUDA 12 ptxas must not serialize its products)."""

import pytest
import torch

import gemmkit
from gemmkit.core import config as config_mod
from gemmkit.core import hopper_w4, hopper_ws
from gemmkit.core.device import known_device
from conftest import ON_GPU, assert_close, poisoned, randn, reference, spy_plans
import w4_checks
from w4_checks import int4_weight

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
HOPPER = ON_GPU and torch.cuda.get_device_capability() == (9, 0) and hopper_ws.gluon_kernel() is not None
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel runs on sm_90 GPUs only")
H100 = known_device("NVIDIA_H100_80GB_HBM3")


@pytest.fixture
def built(monkeypatch):
    """The W4TilePlans built while the test runs (plan caches cleared first); every row count is routed to
    them (the prefill kernel off), so that the kernel's results are checked beyond the rows it is routed."""
    monkeypatch.setattr(hopper_w4, "TILE_MIN_M", 1)
    monkeypatch.setattr(hopper_w4, "TILE_MAX_M", 1 << 30)
    monkeypatch.setattr(hopper_w4, "TILE_MIN_WAVE_USE", 0)
    monkeypatch.setattr(hopper_w4, "PREFILL_MIN_M", 1 << 30)
    yield from spy_plans(monkeypatch, hopper_w4.W4TilePlan, config_mod.clear_caches)


# CPU: the rule, the tiles, the arguments ------------------------------------------------------------

@pytest.mark.parametrize("M,tile", [(1, (128, (64, 0))), (64, (128, (64, 0))), (65, (128, (128, 0))),
                                    (128, (128, (128, 0))), (129, (128, (128, 128))), (4096, (128, (128, 128)))])
def test_tile_shape(M, tile):
    """128 weight rows by 256 of x's rows, fewer where x has no more."""
    assert hopper_w4.tile_shape(M) == tile


@pytest.mark.parametrize("M,N,ok", [(512, 8192, True), (1024, 4096, True), (1024, 8192, True), (511, 8192, False),
                                    (1025, 4096, False), (512, 4096, False), (1024, 6144, False), (1024, 10240, False),
                                    (512, 28672, False), (600, 8192, False), (768, 5632, True), (1024, 28672, True),
                                    (2048, 8192, False)])
def test_size_rule(M, N, ok):
    """512 to 1024 rows where the 128 x 256 tiles fill 0.9 of their waves of the H100's 132 SMs."""
    assert hopper_w4.tile_sizes_ok(M, N, H100) == ok


@pytest.mark.parametrize("group,K,shift", [(32, 4096, 0), (64, 4096, 0), (128, 4096, 1), (256, 4096, 2),
                                           (4096, 4096, 30), (96, 4096, None), (192, 4096, None), (512, 4096, 3)])
def test_group_shift(group, K, shift):
    assert hopper_w4.tile_group_shift(group, K) == shift


def test_not_taken_off_hopper(built):
    """On the CPU (the interpreter) or another GPU, these sizes go another route."""
    if HOPPER:
        pytest.skip("on sm_90 the kernel takes these calls")
    w4_checks.check_not_taken_off_hopper(built, 600, lambda *a: hopper_w4.w4_tile_ok(*a, "none"))


@pytest.mark.parametrize("M,N,K,group,mxfp4,sliced", [(1024, 8192, 8192, 128, False, False),
                                                      (512, 2048, 4096, 32, False, True),
                                                      (100, 1000, 512, 512, False, True), (768, 5120, 5120, 32, True, False)])
def test_kernel_arguments(M, N, K, group, mxfp4, sliced):
    """The plan's tail by the kernel's parameter names: the weight's rows are the kernel's M, x's its N;
    the output's strides swapped (or the K slices' workspace in y's orientation); the scales' strides and
    format; pointer stores; the stages fit the shared memory with the decoder's ring."""
    from gemmkit.tools import codegen

    x, w_q, ws, wz, b, y = codegen._w4_example(M, N, K, BF16, group, True, True, mxfp4)
    plan = hopper_w4.W4TilePlan(H100, x, w_q, ws, wz, None, M, N, K, group, b, BF16, (M, N), False, mxfp4)
    names = hopper_ws.gluon_kernel().gemm_ws_kernel.arg_names[len(hopper_ws.PER_CALL):]
    tail = dict(zip(names, plan.tail))
    rows, parts = hopper_w4.tile_shape(M)
    splits = hopper_ws.ws_splits(N, M, K, H100.num_sms, sum(parts), 64, rows)
    assert (tail["M"], tail["N"], tail["K"], tail["splits"]) == (N, M, K, splits) and (splits > 1) == sliced
    assert tail["W_FORMAT"] == (2 if mxfp4 else 1) and tail["SW"] == (8 if mxfp4 or group == 32 else 1)
    assert tail["HAS_ZERO"] == (not mxfp4) and not tail["C_TMA"] and not tail["PROMOTE"]
    assert (tail["stride_bsn"], tail["stride_bsk"]) == ws.stride()
    if splits == 1:
        assert (tail["stride_cm"], tail["stride_cn"]) == (1, N) and tail["HAS_BIAS"]
    else:
        assert plan.ws_shape == (splits * tail["split_rows"], -(-N // 4) * 4) and not tail["HAS_BIAS"]
        assert tail["split_rows"] >= M and tail["split_rows"] % 16 == 0
        assert (tail["stride_cm"], tail["stride_cn"]) == (1, plan.n_pad)
    assert 2 <= tail["STAGES"] <= hopper_ws.MAX_STAGES
    args = plan.arguments(x, w_q, y, b, ws, wz)
    per_call = dict(zip(hopper_ws.PER_CALL, args))
    assert len(args) == len(hopper_ws.PER_CALL) and per_call["b_scale"] is ws and per_call["b_zero"] is wz


# results on the H100 (GPU) -------------------------------------------------------------------------

@needs_hopper
@pytest.mark.parametrize("M", [1, 65, 200, 600, 1024])
@pytest.mark.parametrize("N,K", [(64, 128), (200, 384), (1000, 1152), (4096, 4096), (1536, 1280), (8192, 512)])
def test_shapes(built, M, N, K):
    """Ragged M and N, K of 1 to 64 blocks, more tiles than SMs, K slices where the tiles are few."""
    w4_checks.check_shape(built, M, N, K)


@needs_hopper
@w4_checks.groups_and_dtypes
def test_groups_and_dtypes(built, group_size, symmetric, dtype):
    w4_checks.check_group_and_dtype(built, 300, group_size, symmetric, dtype)


@needs_hopper
@pytest.mark.parametrize("out_dtype", [BF16, FP32])
@pytest.mark.parametrize("M", [67, 700])
def test_bias_out_dtype_3d(built, out_dtype, M):
    """x (2, M, 1024), fp32 bias and scales (the bias per row of the kernel's transposed tile)."""
    x = randn(2, M, 1024, dtype=BF16)
    q, s, z, wd = int4_weight(640, 1024, 128)
    bias = randn(640, dtype=FP32)
    out = gemmkit.gemm_a16w4(x, q, s.float(), z, group_size=128, bias=bias, out_dtype=out_dtype)
    assert len(built) == 1 and out.shape == (2, M, 640) and out.dtype == out_dtype
    assert_close(out, reference(x.reshape(2 * M, 1024), wd, bias).reshape(2, M, 640), tol=1e-2)


@needs_hopper
def test_strided_x_y_and_scales(built):
    """x rows strided, y a column slice of a wider buffer, scales and zero points transposed views."""
    M, K = 130, 1536
    w4_checks.check_strided(built, randn(M, 2 * K, dtype=BF16)[:, K:], 520)


@needs_hopper
@pytest.mark.parametrize("M,N,K", [(65, 4096, 4096), (300, 333, 1152), (1000, 1000, 256), (256, 64, 128),
                                   (2048, 2048, 2048)])
def test_mxfp4(built, M, N, K):
    w4_checks.check_mxfp4(built, M, N, K)


@needs_hopper
def test_mxfp4_extreme_scales(built):
    w4_checks.check_mxfp4_extreme_scales(built, 100)


@needs_hopper
@pytest.mark.parametrize("tiles", [(128, (128, 128)), (128, (128, 0)), (128, (64, 0)), (64, (128, 128)),
                                   (64, (128, 0)), (64, (64, 0))])
@pytest.mark.parametrize("fmt", ["int4 g128", "int4 g32 fp16", "mxfp4"])
def test_tile_shapes(built, monkeypatch, tiles, fmt):
    """Every tile shape, each scale form; ragged M and N, several tiles per program."""
    monkeypatch.setattr(hopper_w4, "TILE_FORCE", tiles)
    for M in (300, 1500):
        assert_close(*w4_checks.format_call(fmt, M, 1000, 1024))
    assert len(built) == 2 and {(p.rows, p.parts) for p in built} == {tiles}


@needs_hopper
@pytest.mark.parametrize("fmt", ["int4 g128 bias", "mxfp4", "int4 g64 fp16 fp32 out"])
def test_k_slices(built, fmt):
    """K slices (few tiles) into the workspace, summed by sum_k_slices with the bias, the out dtype and a
    strided y; repeated; nothing outside y written."""
    M, N, K = 130, 700, 2048
    out_dtype = FP32 if "fp32" in fmt else None
    for _ in range(2):
        buf = poisoned((M, N + 8), out_dtype or (FP16 if "fp16" in fmt else BF16))
        y = buf[:, :N]
        out, ref = w4_checks.format_call(fmt, M, N, K, y=y, bias="bias" in fmt, out_dtype=out_dtype)
        assert out is y
        assert_close(out, ref, tol=1e-2)
        assert torch.isnan(buf[:, N:]).all()
    assert built and all(p.splits > 1 for p in built)


@needs_hopper
def test_not_taken(built):
    """An activation, K not a multiple of 64, an explicit config, x without unit stride along K: other
    kernels."""
    x = randn(600, 256, dtype=BF16)
    q, s, z, wd = int4_weight(64, 256, 128)
    assert_close(gemmkit.gemm_a16w4(x, q, s, z, group_size=128, activation="silu"),
                 torch.nn.functional.silu(reference(x, wd)))
    assert_close(gemmkit.gemm_a16w4(x, q, s, z, group_size=128, config=dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128)),
                 reference(x, wd))
    xt = randn(256, 600, dtype=BF16).t()
    assert_close(gemmkit.gemm_a16w4(xt, q, s, z, group_size=128), reference(xt, wd))
    x3 = randn(600, 96, dtype=BF16)
    q3, s3, z3, wd3 = int4_weight(64, 96, 32)
    assert_close(gemmkit.gemm_a16w4(x3, q3, s3, z3, group_size=32), reference(x3, wd3))
    assert not built


@needs_hopper
def test_cuda_graph_replays_new_inputs(built):
    w4_checks.check_cuda_graph(built, 600)


@needs_hopper
def test_disabled_by_env(built, monkeypatch):
    w4_checks.check_disabled_by_env(built, monkeypatch, 600)


@needs_hopper
def test_shipped_rule():
    """With the shipped rule: 512 to 1024 rows where the tiles fill their waves and the prefill kernel does not
    take them."""
    config_mod.clear_caches()
    x = randn(512, 1024, dtype=BF16)
    q, s, z, wd = int4_weight(8192, 1024, 128)
    plan = gemmkit.ops.a16w4._make_plan(x, q, s, z, 128, None, None, None, None, None)
    assert isinstance(plan, hopper_w4.W4TilePlan)
    assert_close(gemmkit.gemm_a16w4(x, q, s, z, group_size=128), reference(x, wd))
