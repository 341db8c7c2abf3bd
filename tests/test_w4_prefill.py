"""The Hopper 4-bit prefill kernel (sm_90; kernels/gemm_w4_prefill.py, core/hopper_w4.W4PrefillPlan):
which gemm_a16w4 / gemm_a16wfp4 calls take it and, on a Hopper GPU, its results against float64
references of the dequantized weights. The CPU tests check the size rule and x's permutation into
the kernels' K order (permute_k_kernel, under the interpreter)."""

import pytest
import torch

import gemmkit
from gemmkit.core import config as config_mod
from gemmkit.core import hopper_w4, hopper_ws
from conftest import DEVICE, ON_GPU, assert_close, poisoned, randn, reference, spy_plans
import w4_checks
from w4_checks import int4_weight

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
HOPPER = ON_GPU and torch.cuda.get_device_capability() == (9, 0) and hopper_ws.gluon_kernel() is not None
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel runs on sm_90 GPUs only")


@pytest.fixture
def built(monkeypatch):
    """The W4PrefillPlans built while the test runs (plan caches cleared first). The size rule is
    widened to every M from PREFILL_MIN_M, so that the kernel's results are checked beyond the rows it
    is routed (test_size_rule checks the rule itself)."""
    monkeypatch.setattr(hopper_w4, "PREFILL_MAX_M", 1 << 30)
    yield from spy_plans(monkeypatch, hopper_w4.W4PrefillPlan, config_mod.clear_caches)


# CPU: the rule and x's permutation ------------------------------------------------------------------

@pytest.mark.parametrize("M,N,K,group,mxfp4,ok", [
    (65, 64, 128, 128, False, True), (64, 64, 128, 128, False, False), (511, 8192, 8192, 32, False, True),
    (512, 8192, 8192, 128, False, False), (512, 28672, 4096, 128, False, True), (1023, 28672, 4096, 128, True, True),
    (1024, 28672, 4096, 128, False, False), (768, 14336, 4096, 128, False, False),
    (300, 100, 4096, 64, False, True), (300, 100, 4096, 256, False, True), (300, 100, 4096, 4096, False, True),
    (300, 100, 4096, 96, False, False), (300, 100, 4000, 32, True, False), (300, 100, 64, 32, True, False),
    (300, 100, 4096, 32, True, True), (300, 0, 4096, 128, False, False)])
def test_size_rule(M, N, K, group, mxfp4, ok):
    """65 to 511 rows, to 1023 where the 128 x 256 tiles make three waves of the H100's SMs."""
    from gemmkit.core.device import known_device

    assert hopper_w4.prefill_sizes_ok(M, N, K, group, mxfp4, known_device("NVIDIA_H100_80GB_HBM3")) == ok


@pytest.mark.parametrize("M,N,bm", [(65, 4096, 128), (256, 8192, 128), (300, 8192, 128), (600, 8192, 256), (4096, 2000, 256), (4096, 1000, 128), (128, 28672, 128),
                                    (4096, 128, 128), (2000, 64, 128)])
def test_x_tile_rows(M, N, bm):
    """The wider x tile where its tiles still make a wave of the H100's 132 SMs."""
    from gemmkit.core.device import known_device

    assert hopper_w4.prefill_rows(M, N, known_device("NVIDIA_H100_80GB_HBM3")) == bm


@pytest.mark.parametrize("M,N,tile", [(128, 28672, (128, 64, 2)), (256, 28672, (256, 128, 1)), (256, 8192, (128, 64, 2)),
                                      (500, 6144, (128, 64, 2)), (500, 14336, (256, 128, 1)), (65, 100, (128, 64, 2))])
def test_tile_rule(M, N, tile):
    """128-row weight tiles by 256 rows of x where those make a wave of the H100's SMs, else 64-row weight
    tiles (two programs per SM) by 128 rows."""
    from gemmkit.core.device import known_device

    assert hopper_w4.prefill_tile(M, N, known_device("NVIDIA_H100_80GB_HBM3")) == tile


@pytest.mark.parametrize("M,N,K,splits", [(128, 4096, 4096, 4), (256, 4096, 14336, 1), (128, 4096, 1024, 1), (128, 2560, 8192, 4),
                                           (256, 28672, 4096, 1), (200, 3072, 8192, 1), (128, 8192, 1152, 1)])
def test_split_rule(M, N, K, splits):
    """K slices where the tiles fill under PREFILL_SPLIT_BELOW of the programs: the largest divisor of the
    steps keeping the units within the programs and the slices at least PREFILL_MIN_SLICE_STEPS deep."""
    from gemmkit.core.device import known_device

    dev = known_device("NVIDIA_H100_80GB_HBM3")
    bm, bn, per_sm = hopper_w4.prefill_tile(M, N, dev)
    assert hopper_w4.prefill_splits(M, N, K, bm, bn, per_sm, dev) == splits


def test_configs_show_route():
    """`gemmkit configs show` on an sm_90 profile names the prefill kernel's tiles and K slices where it takes a
    call, the weight-tile kernel from 512 rows, the dequantizing route (no line) beyond."""
    from gemmkit.core.device import known_device
    from gemmkit.tools.configs import w4_route

    h100 = known_device("NVIDIA_H100_80GB_HBM3")
    assert w4_route("a16w4", 128, 4096, 4096, h100) == (
        "the prefill kernel (kernels/gemm_w4_prefill.py): x permuted into its K order, then 64 weight rows x 128 rows "
        "of x per tile, 2 program(s) per SM, K in 4 slices (sums by atomics, finished by a second launch)")
    assert "128 weight rows x 256 rows of x per tile, 1 program(s) per SM" in w4_route("a16wfp4", 512, 28672, 4096, h100)
    assert "4-bit weight as A" in w4_route("a16w4", 512, 8192, 8192, h100)  # (tests/test_w4_tile.py's kernel)
    assert w4_route("a16w4", 2048, 8192, 8192, h100) is None


@pytest.mark.skipif(hopper_ws.gluon_kernel() is None, reason="this Triton has no Gluon")
@pytest.mark.parametrize("M,K", [(1, 128), (37, 384), (70, 256)])
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_permute_k_kernel(M, K, dtype):
    """permute_k_kernel puts column host_true_k(kp) of each 128-wide block at position kp (the order
    of the decoded weight's registers), for strided x too, rows past BLOCK_M included."""
    from gemmkit.core.interpreter import apply_interpreter_fixes
    from gemmkit.kernels import gemm_w4_decode, packed

    apply_interpreter_fixes()
    big = randn(M, 2 * K, dtype=dtype)
    x = big[:, 1::2]  # a stride along K, rows strided
    out = torch.full((M, K), float("nan"), dtype=dtype, device=DEVICE)
    packed.permute_k_kernel[(-(-M // 32), K // 128)](x, out, M, K, x.stride(0), x.stride(1), BLOCK_M=32, INDEX_64=False)
    order = torch.tensor([kb * 128 + gemm_w4_decode.host_true_k(kp) for kb in range(K // 128) for kp in range(128)],
                         device=DEVICE)
    assert torch.equal(out, x[:, order])


def test_not_taken_off_hopper(built):
    """On the CPU (the interpreter) or another GPU, prefill sizes go the dequantizing route."""
    if HOPPER:
        pytest.skip("on sm_90 the prefill kernel takes these calls")
    w4_checks.check_not_taken_off_hopper(built, 80, hopper_w4.w4_prefill_ok)


# results on the H100 (GPU) -------------------------------------------------------------------------

@needs_hopper
@pytest.mark.parametrize("M", [65, 128, 200, 256, 1000])
@pytest.mark.parametrize("N,K", [(64, 128), (200, 384), (1000, 1152), (4096, 4096), (1536, 1280), (8192, 512)])
def test_shapes(built, M, N, K):
    """Ragged M and N, K of 1 to 32 steps, more tiles than SMs."""
    w4_checks.check_shape(built, M, N, K)


@needs_hopper
@w4_checks.groups_and_dtypes
def test_groups_and_dtypes(built, group_size, symmetric, dtype):
    w4_checks.check_group_and_dtype(built, 300, group_size, symmetric, dtype)


@needs_hopper
@w4_checks.activations_and_out_dtypes
def test_bias_activation_out_dtype_3d(built, activation, out_dtype):
    # (the weight is dequantized to x's dtype before the product: bf16-level error in an fp32 output too)
    w4_checks.check_bias_activation_out_dtype_3d(built, 67, activation, out_dtype, tol=1e-2)


@needs_hopper
@pytest.mark.parametrize("layout", ["row stride", "column major"])
def test_strided_x_y_and_scales(built, layout):
    """x rows strided or x column-major, y a column slice of a wider buffer, scales and zero points
    transposed views."""
    M, K = 130, 1536
    x = randn(M, 2 * K, dtype=BF16)[:, K:] if layout == "row stride" else randn(K, M, dtype=BF16).t()
    w4_checks.check_strided(built, x, 520)


@needs_hopper
@pytest.mark.parametrize("M,N,K", [(65, 4096, 4096), (300, 333, 1152), (1000, 1000, 256), (256, 64, 128),
                                   (2048, 2048, 2048)])
def test_mxfp4(built, M, N, K):
    w4_checks.check_mxfp4(built, M, N, K)


@needs_hopper
def test_mxfp4_extreme_scales(built):
    w4_checks.check_mxfp4_extreme_scales(built, 100)


@needs_hopper
@pytest.mark.parametrize("bn", [64, 128])
@pytest.mark.parametrize("fmt", ["int4 g128", "int4 g32 fp16", "mxfp4"])
def test_weight_tiles(built, monkeypatch, bn, fmt):
    """Both weight tile heights (one warp group and two programs per SM, or two warp groups), both x
    tile widths, each scale form; ragged M and N, several tiles per program."""
    monkeypatch.setattr(hopper_w4, "PREFILL_BN", bn)
    for M in (300, 1500):
        assert_close(*w4_checks.format_call(fmt, M, 1000, 1024))
    assert len(built) == 2 and {p.values["BN"] for p in built} == {bn}


@needs_hopper
@pytest.mark.parametrize("bn", [64, 128])
@pytest.mark.parametrize("fmt", ["int4 g128 bias silu", "mxfp4", "int4 g64 fp16 fp32 out"])
def test_k_slices(built, monkeypatch, bn, fmt):
    """K slices summed by atomics and finished by finish_sums (bias, activation, out dtype, a strided y),
    repeated (the sums left zero), against the float64 reference."""
    monkeypatch.setattr(hopper_w4, "PREFILL_BN", bn)
    monkeypatch.setattr(hopper_w4, "PREFILL_SPLIT_BELOW", 1e9)
    monkeypatch.setattr(hopper_w4, "PREFILL_MIN_SLICE_STEPS", 2)
    M, N, K = 130, 700, 2048
    out_dtype = FP32 if "fp32" in fmt else None
    for _ in range(2):
        buf = poisoned((M, N + 8), out_dtype or (FP16 if "fp16" in fmt else BF16))
        y = buf[:, :N]
        out, ref = w4_checks.format_call(fmt, M, N, K, y=y, bias="bias" in fmt,
                                         activation="silu" if "silu" in fmt else None, out_dtype=out_dtype)
        assert out is y
        assert_close(out, ref, tol=1e-2)
        assert torch.isnan(buf[:, N:]).all()
    assert built and all(p.splits > 1 and p.values["BN"] == bn for p in built)


@needs_hopper
def test_not_taken(built):
    """K not a multiple of 128, an explicit config, 64 rows or fewer: other kernels."""
    x = randn(100, 96 * 2, dtype=BF16)
    q, s, z, wd = int4_weight(64, 192, 64)
    assert_close(gemmkit.gemm_a16w4(x, q, s, z, group_size=64), reference(x, wd))
    x2 = randn(100, 256, dtype=BF16)
    q2, s2, z2, wd2 = int4_weight(64, 256, 128)
    assert_close(gemmkit.gemm_a16w4(x2, q2, s2, z2, group_size=128, config=dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128)),
                 reference(x2, wd2))
    assert_close(gemmkit.gemm_a16w4(x2[:64], q2, s2, z2, group_size=128), reference(x2[:64], wd2))
    assert not built


@needs_hopper
def test_cuda_graph_replays_new_inputs(built):
    w4_checks.check_cuda_graph(built, 300)


@needs_hopper
def test_disabled_by_env(built, monkeypatch):
    w4_checks.check_disabled_by_env(built, monkeypatch, 100)
