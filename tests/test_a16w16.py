"""Correctness of gemm_a16w16 against a float64 torch reference, on every kernel path."""

import math

import pytest
import torch

import gemmkit
from conftest import DEVICE, ON_GPU, assert_close, kernel_paths, poisoned, randn, reference, sizes

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

PATHS = kernel_paths(gpu_block_k=64)

RAGGED = sizes(
    [(1, 40, 72), (45, 70, 100), (96, 64, 64), (33, 17, 8), (7, 1, 24)],
    [(1, 4096, 4096), (1, 1000, 1000), (200, 333, 1000), (1024, 1024, 1024), (300, 500, 40), (129, 1, 72)],
)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("M,N,K", RAGGED)
def test_paths_ragged(path, M, N, K):
    x, w = randn(M, K, dtype=BF16), randn(N, K, dtype=BF16)
    bias = randn(N, dtype=FP32)
    y = poisoned((M, N), BF16)
    out = gemmkit.gemm_a16w16(x, w, bias, y=y, config=PATHS[path])
    assert out is y
    assert_close(out, reference(x, w, bias))


@pytest.mark.parametrize("in_dtype", [BF16, FP16])
@pytest.mark.parametrize("out_dtype", [BF16, FP16, FP32])
@pytest.mark.parametrize("M,N,K", sizes([(1, 33, 47), (37, 70, 64), (130, 96, 80)], [(1, 4096, 4096), (77, 1000, 3000), (2048, 2048, 1024)]))
def test_dtypes_default_config(in_dtype, out_dtype, M, N, K):
    x, w = randn(M, K, dtype=in_dtype), randn(N, K, dtype=in_dtype)
    out = gemmkit.gemm_a16w16(x, w, out_dtype=out_dtype)
    assert out.dtype == out_dtype and out.shape == (M, N)
    assert_close(out, reference(x, w))


@pytest.mark.parametrize("activation", ["relu", "gelu_tanh", "silu", None])
@pytest.mark.parametrize("bias_dtype", [None, BF16, FP16, FP32])
@pytest.mark.parametrize("path", ["ptr", "tma_persistent_subtile", "ptr_splitk"])
def test_bias_and_activation(activation, bias_dtype, path):
    M, N, K = sizes((19, 48, 96), (300, 1000, 512))
    x, w = randn(M, K, dtype=FP16), randn(N, K, dtype=FP16)
    bias = None if bias_dtype is None else randn(N, dtype=bias_dtype)
    out = gemmkit.gemm_a16w16(x, w, bias, activation=activation, out_dtype=FP32, config=PATHS[path])
    assert_close(out, reference(x, w, bias, activation))


def _layout(t, kind):
    """The same values as `t` in another memory layout."""
    if kind == "row":
        return t
    if kind == "col":  # column-major: stride (1, rows)
        return t.t().contiguous().t()
    if kind == "strided":  # rows spaced wider than needed
        buf = torch.empty(t.shape[0], t.shape[1] + 24, dtype=t.dtype, device=t.device)
        buf[:, 5 : 5 + t.shape[1]] = t  # odd offset: base not 16-byte aligned, TMA must step aside
        return buf[:, 5 : 5 + t.shape[1]]
    if kind == "strided_aligned":
        buf = torch.empty(t.shape[0], t.shape[1] + 16, dtype=t.dtype, device=t.device)
        buf[:, 8 : 8 + t.shape[1]] = t
        return buf[:, 8 : 8 + t.shape[1]]
    raise ValueError(kind)


LAYOUTS = ["row", "col", "strided", "strided_aligned"]


@pytest.mark.parametrize("x_layout", LAYOUTS)
@pytest.mark.parametrize("w_layout", LAYOUTS)
@pytest.mark.parametrize("path", ["ptr", "tma_persistent"])
def test_operand_layouts(x_layout, w_layout, path):
    M, N, K = sizes((40, 36, 80), (257, 384, 512))
    x, w = randn(M, K, dtype=BF16), randn(N, K, dtype=BF16)
    xl, wl = _layout(x, x_layout), _layout(w, w_layout)
    assert torch.equal(xl, x) and torch.equal(wl, w)
    out = gemmkit.gemm_a16w16(xl, wl, config=PATHS[path])
    assert_close(out, reference(x, w))


@pytest.mark.parametrize("y_layout", ["col", "strided", "strided_aligned"])
@pytest.mark.parametrize("path", ["ptr", "tma_persistent_subtile", "ptr_splitk"])
def test_output_layouts(y_layout, path):
    M, N, K = sizes((33, 40, 64), (300, 520, 256))
    x, w = randn(M, K, dtype=FP16), randn(N, K, dtype=FP16)
    y = _layout(poisoned((M, N), FP16), y_layout)
    out = gemmkit.gemm_a16w16(x, w, y=y, config=PATHS[path])
    assert out is y
    assert_close(out, reference(x, w))


def test_leading_dims_and_vector_input():
    K, N = 48, 24
    w = randn(N, K, dtype=BF16)
    x3 = randn(2, 3, K, dtype=BF16)
    out = gemmkit.gemm_a16w16(x3, w)
    assert out.shape == (2, 3, N)
    assert_close(out, reference(x3.reshape(-1, K), w).reshape(2, 3, N))
    y = poisoned((2, 3, N), BF16)
    assert gemmkit.gemm_a16w16(x3, w, y=y) is y
    assert_close(y, reference(x3.reshape(-1, K), w).reshape(2, 3, N))
    x1 = randn(K, dtype=BF16)
    out1 = gemmkit.gemm_a16w16(x1, w)
    assert out1.shape == (N,)
    assert_close(out1, reference(x1[None], w)[0])


def test_empty_dimensions():
    w = randn(8, 16, dtype=BF16)
    out = gemmkit.gemm_a16w16(torch.empty(0, 16, dtype=BF16, device=DEVICE), w)
    assert out.shape == (0, 8)
    out = gemmkit.gemm_a16w16(randn(5, 16, dtype=BF16), torch.empty(0, 16, dtype=BF16, device=DEVICE))
    assert out.shape == (5, 0)
    bias = randn(8, dtype=FP32)
    x0, w0 = torch.empty(5, 0, dtype=BF16, device=DEVICE), torch.empty(8, 0, dtype=BF16, device=DEVICE)
    out = gemmkit.gemm_a16w16(x0, w0, bias, activation="relu", out_dtype=FP32)
    torch.testing.assert_close(out, torch.relu(bias).expand(5, 8))
    for lead in ((2, 3), (), (0, 4)):  # K == 0 with x (*, 0): the row count comes from the leading shape
        out = gemmkit.gemm_a16w16(torch.empty(*lead, 0, dtype=BF16, device=DEVICE), w0, bias, out_dtype=FP32)
        torch.testing.assert_close(out, bias.expand(*lead, 8))


def test_repeated_calls_fresh_data():
    """The cached fast launch path must compute the same function on new data and new pointers,
    including a base pointer of another alignment (a different specialization)."""
    M, N, K = sizes((20, 40, 64), (64, 4096, 4096))
    for i in range(4):
        x, w = randn(M, K, dtype=BF16), randn(N, K, dtype=BF16)
        if i == 3:  # misaligned base: must not reuse the kernel compiled for aligned pointers
            xs = torch.empty(M * K + 1, dtype=BF16, device=DEVICE)
            xs[1:] = x.reshape(-1)
            x = xs[1:].view(M, K)
        assert_close(gemmkit.gemm_a16w16(x, w), reference(x, w))


@pytest.mark.skipif(not ON_GPU, reason="int64 indexing at > 2**31 elements needs a GPU-sized tensor")
@pytest.mark.parametrize("path", ["ptr", "tma_persistent"])
def test_int64_indexing(path):
    M, N, K = 2**19 + 3, 64, 4096  # x has > 2**31 elements
    x = randn(M, K, dtype=BF16)
    w = randn(N, K, dtype=BF16)
    out = gemmkit.gemm_a16w16(x, w, config=PATHS[path])
    rows = torch.tensor([0, 1, M // 2, M - 2, M - 1], device=DEVICE)
    assert_close(out[rows], reference(x[rows], w))


def test_inference_with_parameters():
    """nn.Linear parameters require grad; under no_grad/inference_mode that is fine."""
    lin = torch.nn.Linear(48, 40, dtype=FP16, device=DEVICE)
    x = randn(5, 48, dtype=FP16)
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            out = gemmkit.gemm_a16w16(x, lin.weight, lin.bias)
        assert_close(out, reference(x, lin.weight, lin.bias))


def test_one_launch_per_call(monkeypatch):
    """One kernel launch per call, split-K included; repeated calls skip Triton's launch path on GPU."""
    from gemmkit.core import launcher

    calls = []
    for name in ("launch_jit", "launch_compiled", "launch_direct"):
        original = getattr(launcher, name)
        monkeypatch.setattr(launcher, name, lambda *a, _n=name, _f=original: (calls.append(_n), _f(*a))[1])
    real_direct = launcher._direct_launch

    def direct_launch(kernel):  # the C launcher that plans call directly once bound (DensePlan.run)
        parts = real_direct(kernel)
        if parts is None:
            return None
        k, launch, lead = parts
        return k, lambda *a: (calls.append("c_launcher"), launch(*a))[1], lead

    monkeypatch.setattr(launcher, "_direct_launch", direct_launch)
    M, N, K = sizes((24, 40, 64), (24, 4096, 4096))
    for cfg, launches in ((PATHS["ptr"], 1), (PATHS["tma_persistent"], 1), (PATHS["ptr_splitk"], 1)):
        x, w = randn(M, K, dtype=BF16), randn(N, K, dtype=BF16)
        for i in range(3):
            calls.clear()
            out = gemmkit.gemm_a16w16(x, w, config=cfg)
            assert len(calls) == launches, (cfg, calls)
            if ON_GPU and i > 0:
                assert set(calls) <= {"launch_compiled", "launch_direct", "c_launcher"}, calls
        assert_close(out, reference(x, w))


def test_config_too_large_for_device_is_shrunk(monkeypatch):
    """An automatically chosen config that does not fit the device (Triton raises OutOfResources
    at its first launch) is shrunk and retried; a config the caller chose is not."""
    from triton.runtime.errors import OutOfResources

    from gemmkit.core import launcher

    real, failures = launcher.launch_jit, []

    def launch_jit(fn, grid, args, num_warps, num_stages):
        if fn.__name__ == "gemm_kernel" and num_stages > 2:
            failures.append(num_stages)
            raise OutOfResources(300000, 232448, "shared memory")
        return real(fn, grid, args, num_warps, num_stages)

    monkeypatch.setattr(launcher, "launch_jit", launch_jit)
    x, w = randn(9, 64, dtype=BF16), randn(40, 64, dtype=BF16)
    out = gemmkit.gemm_a16w16(x, w, out_dtype=FP32)  # an output dtype no plan exists for yet
    assert failures and failures[-1] == 3
    assert_close(out, reference(x, w))
    with pytest.raises(OutOfResources):
        gemmkit.gemm_a16w16(x, w, config=dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=4))


def test_split_k_counters_left_zero():
    """Split-K's arrival counters are reused by the next launch on the stream: every launch must
    leave them zero, whatever the tile count (here several shapes through one buffer)."""
    from gemmkit.core import plan as plan_mod

    for M, N in ((5, 40), (33, 70), (1, 200)):
        x, w = randn(M, 96, dtype=FP16), randn(N, 96, dtype=FP16)
        out = gemmkit.gemm_a16w16(x, w, config=PATHS["ptr_splitk"])
        assert_close(out, reference(x, w))
        assert plan_mod._zeroed and all(int(c.abs().sum()) == 0 for _, c in plan_mod._zeroed.values())



@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs")
def test_split_k_counters_under_capture():
    """Under graph capture the split-K calls of one graph share one counter buffer, zeroed once
    where the capture first needs it (the driver names the capture); two graphs get two buffers
    and replay right in any order, with new inputs, several times."""
    from gemmkit.core import plan as plan_mod

    shapes = ((5, 40, 96), (33, 70, 96), (1, 200, 96))
    xs = [randn(M, K, dtype=FP16) for M, _, K in shapes]
    ws = [randn(N, K, dtype=FP16) for _, N, K in shapes]
    for x, w in zip(xs, ws):  # plans built and compiled outside the capture
        gemmkit.gemm_a16w16(x, w, config=PATHS["ptr_splitk"])
    torch.cuda.synchronize()
    graphs, outs, buffers = [], [], []
    stream = torch.cuda.Stream()
    for _ in range(2):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            assert plan_mod.capture_id(stream.cuda_stream) is not None
            first = plan_mod.split_k_counters(xs[0].device, xs[0].device.index or 0, 8)
            outs.append([gemmkit.gemm_a16w16(x, w, config=PATHS["ptr_splitk"]) for x, w in zip(xs, ws)])
            assert plan_mod.split_k_counters(xs[0].device, xs[0].device.index or 0, 8).data_ptr() == first.data_ptr()
            buffers.append(first.data_ptr())
        graphs.append(graph)
    assert buffers[0] != buffers[1] and plan_mod.capture_id(stream.cuda_stream) is None
    for order in ((1, 0), (0, 1, 1)):
        for x in xs:
            x.copy_(randn(*x.shape, dtype=FP16))
        for g in order:
            graphs[g].replay()
        torch.cuda.synchronize()
        for g in set(order):
            for x, w, out in zip(xs, ws, outs[g]):
                assert_close(out, reference(x, w))

@pytest.mark.parametrize("block,split_k", [((32, 32, 16), 11), ((64, 64, 16), 5), ((16, 32, 16), 16)])
def test_split_k_many_pieces(block, split_k):
    """The last K slice to arrive sums every slice's partial tile (kernels/reduce.py): 5 to 16
    pieces, ragged M, N and K (the last slice shorter than the others)."""
    bm, bn, bk = block
    M, N, K = 2 * bm - 3, 2 * bn + 5, split_k * bk * 2 - 7
    x, w = randn(M, K, dtype=BF16), randn(N, K, dtype=BF16)
    y = poisoned((M, N), FP32)
    out = gemmkit.gemm_a16w16(x, w, y=y, config=dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split_k))
    assert_close(out, reference(x, w))


# (M, N, K) whose tile counts fall below, at and between multiples of the SM count, with K tile
# counts that the slices do and do not divide, tails on and off (interpreter: 4 "SMs", 32 x 32 x 32
# tiles; H100: 132 SMs, 128 x 128 x 64)
STREAM_K_SHAPES = sizes(
    [(20, 30, 200), (96, 32, 250), (64, 96, 96), (128, 64, 64), (160, 96, 160), (64, 160, 20), (33, 250, 40),
     (20, 30, 600), (5, 20, 1100), (64, 160, 300), (32, 64, 520), (96, 96, 600)],
    [(100, 1000, 3000), (256, 4096, 4096), (1024, 1024, 1024), (2000, 2200, 512), (1536, 1408, 512), (300, 2000, 100)],
)


@pytest.mark.parametrize("path", ["ptr_streamk", "tma_streamk"])
@pytest.mark.parametrize("M,N,K", STREAM_K_SHAPES)
def test_stream_k_schedules(path, M, N, K):
    """Stream-K on every split of tiles into data-parallel waves and a tail of K-sliced tiles;
    the arrival counters are left zero for the next launch."""
    from gemmkit.core import plan as plan_mod
    from gemmkit.ops import a16w16

    x, w = randn(M, K, dtype=BF16), randn(N, K, dtype=BF16)
    bias = randn(N, dtype=BF16)
    y = poisoned((M, N), BF16)
    out = gemmkit.gemm_a16w16(x, w, bias, activation="relu", y=y, config=PATHS[path])
    assert_close(out, reference(x, w, bias, "relu"))
    plan = next(reversed(a16w16._plans.values()))
    cfg = plan.cfg
    tiles = -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
    # the ragged last wave in K slices of at least 4 K tiles, as many as fit the SMs (at most 16
    # and sqrt(K tiles))
    sms, k_tiles = plan.dev.num_sms, -(-K // cfg.BLOCK_K)
    ragged = tiles % sms
    split = min(sms // ragged, k_tiles // 4, math.isqrt(k_tiles), 16) if ragged else 1
    assert plan.stream_k == (split > 1)
    if plan.stream_k:
        assert plan.ws_shape[0] == ragged * split and plan.launch.grid[0] == min(sms, max(tiles - ragged, ragged * split))
    assert all(int(c.abs().sum()) == 0 for _, c in plan_mod._zeroed.values())


def test_nan_propagates_through_relu():
    """A NaN in x poisons its output row with every activation, as in torch (max.f32 would
    turn NaN into 0 under relu)."""
    x, w = randn(4, 32, dtype=FP16), randn(8, 32, dtype=FP16)
    x[1, 3] = float("nan")
    for act in ("relu", "silu", "gelu_tanh", None):
        out = gemmkit.gemm_a16w16(x, w, activation=act, config=dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32))
        assert torch.isnan(out[1]).all() and not torch.isnan(out[[0, 2, 3]]).any(), act


def test_broadcast_operand_takes_the_pointer_path():
    """A stride-0 (expanded) x is correct under a TMA config, through pointer loads: a TMA
    descriptor with a zero row stride is not something to hand the driver."""
    from gemmkit.ops import a16w16

    M, N, K = 33, 40, 64
    x = randn(1, K, dtype=FP16).expand(M, K)
    w = randn(N, K, dtype=FP16)
    a16w16._plans.clear()
    out = gemmkit.gemm_a16w16(x, w, config=dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, TMA=True))
    assert_close(out, reference(x, w))
    (plan,) = a16w16._plans.values()
    assert plan.a_desc is None and plan.b_desc is not None


@pytest.mark.parametrize("case", ["y=x", "y in w", "y=bias"])
def test_output_overlapping_an_input_is_refused(case):
    """A y sharing memory with an input would be written by some programs while others still read
    it: refused before any launch, on the first call and on calls that reuse a cached plan."""
    M, N, K = 8, 16, 32
    buf = randn(M, 2 * K, dtype=torch.bfloat16)
    x, w, bias = buf[:, :K], randn(N, K, dtype=torch.bfloat16), randn(N, dtype=torch.bfloat16)
    fresh = poisoned((M, N), torch.bfloat16)
    out = gemmkit.gemm_a16w16(x, w, bias, y=fresh)  # a separate y: fine (and caches the plan)
    assert_close(out, reference(x, w, bias))
    if case == "y=x":
        y, args = buf[:, :N], (x, w, bias)
    elif case == "y in w":
        wbuf = randn(N + M, K, dtype=torch.bfloat16)
        y, args = wbuf[N - 2:N - 2 + M, :N], (x, wbuf[:N], bias)  # two rows shared
    else:
        bbuf = randn(M * N, dtype=torch.bfloat16)
        y, args = bbuf.view(M, N), (x, w, bbuf[:N])
    with pytest.raises(ValueError, match="shares memory"):
        gemmkit.gemm_a16w16(*args, y=y)
