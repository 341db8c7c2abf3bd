"""torch.library custom ops (gemmkit.library): opcheck, fake shapes, routing under torch.compile."""

import pytest
import torch

import gemmkit
from gemmkit import library, quant
from gemmkit.core.outputs import gemm_output, quantize_output
from gemmkit.ops import a8w8, a16w16
from conftest import DEVICE, ON_GPU, check_compiles, randn, sizes

M, N, K = sizes((5, 48, 64), (300, 512, 1024))
OPS = torch.ops.gemmkit


def _cases():
    x = randn(2, M, K, dtype=torch.bfloat16)
    w = randn(N, K, dtype=torch.bfloat16)
    bias = randn(N, dtype=torch.float32)
    wq, ws = quant.quantize_fp8(w, "row")
    wi, wis = quant.quantize_int8(w, "row")
    xq, xs = quant.quantize_fp8(x, "row")
    xi, xis = quant.quantize_int8(x, "row")
    y = torch.empty(2, M, N, dtype=torch.float32, device=DEVICE)
    return {
        "a16w16": (OPS.gemm_a16w16.default, (x, w, bias, "silu", None)),
        "a16w16_out": (OPS.gemm_a16w16_out.default, (x, w, None, None, torch.float32, y)),
        "a8w8_int8": (OPS.gemm_a8w8.default, (xi, wi, xis, wis, bias, "relu", torch.float16)),
        "a8w8_int8_out": (OPS.gemm_a8w8_out.default, (xi, wi, xis, wis, None, None, torch.float32, y)),
        "a8w8_fp8": (OPS.gemm_a8w8.default, (xq, wq, xs, ws, None, None, None)),
        "a8w8_fp8_dynamic": (OPS.gemm_a8w8.default, (x, wq, None, ws, bias, None, torch.bfloat16)),
        "a8w8_fp8_out": (OPS.gemm_a8w8_out.default, (xq, wq, xs, ws, None, None, torch.float32, y)),
        "quantize_fp8_row": (OPS.quantize_fp8.default, (x, "row", torch.float8_e5m2, None)),
        "quantize_fp8_static": (OPS.quantize_fp8.default, (x, "tensor", torch.float8_e4m3fn,
                                                           torch.tensor([0.01], device=DEVICE))),
        "quantize_int8_tensor": (OPS.quantize_int8.default, (x, "tensor", None)),
        "quantize_fp8_blockwise_col": (OPS.quantize_fp8_blockwise.default, (x, 1, torch.float8_e4m3fn, "float32",
                                                                           "col")),
        "quantize_fp8_blockwise_w": (OPS.quantize_fp8_blockwise.default, (w, 128, torch.float8_e4m3fn, "ue8m0",
                                                                         "row")),
    }


CASES = [
    "a16w16", "a16w16_out", "a8w8_int8", "a8w8_int8_out", "a8w8_fp8", "a8w8_fp8_dynamic", "a8w8_fp8_out",
    "quantize_fp8_row", "quantize_fp8_static", "quantize_int8_tensor", "quantize_fp8_blockwise_col",
    "quantize_fp8_blockwise_w"]


@pytest.mark.parametrize("case", CASES)
def test_opcheck(case):
    op, args = _cases()[case]
    tests = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if any(isinstance(a, torch.Tensor) and a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) for a in args):
        # test_schema compares the inputs before and after the call with torch.allclose, which torch
        # does not implement for float8 tensors (CPU and CUDA): the int8 cases run it on the same ops
        tests = tests[1:]
    assert set(torch.library.opcheck(op, args, test_utils=tests).values()) == {"SUCCESS"}


@pytest.mark.parametrize("case", CASES)
def test_custom_op_matches_eager_and_fake(case):
    """The op's result is the public function's, and its fake has the same shapes, dtypes and
    strides (contiguous, except the column-major scales asked for)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    op, args = _cases()[case]
    if case.endswith("_out"):
        out = op(*args)
        assert out is None and not torch.isnan(args[-1]).any()
        return
    real = op(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    real, fake = (real,) if isinstance(real, torch.Tensor) else real, (fake,) if isinstance(fake, torch.Tensor) else fake
    for r, f in zip(real, fake):
        assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride())
        assert r.is_contiguous() or case.endswith("_col")  # (column-major scales by request)
    if case.startswith("quantize_fp8_static"):
        assert real[1].data_ptr() != args[-1].data_ptr()  # a copy, not the input scale


def test_out_fakes_take_y_dtype_for_none():
    """An _out op with out_dtype None writes y's dtype (as the public functions do): its fake agrees."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, w = randn(M, K, dtype=torch.bfloat16), randn(N, K, dtype=torch.bfloat16)
    wq, ws = quant.quantize_fp8(w, "row")
    for op, args in ((OPS.gemm_a16w16_out.default, (x, w, None, None, None)),
                     (OPS.gemm_a8w8_out.default, (x, wq, None, ws, None, None, None))):
        y = torch.empty(M, N, dtype=torch.float32, device=DEVICE)
        op(*args, y)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args], mode.from_tensor(y))


def test_fakes_refuse_what_the_ops_refuse():
    """Traced programs fail where eager calls would: the fakes check the activation name, the bias shape and (bf16 /
    fp16) the weight's dtype."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, w = randn(M, K, dtype=torch.bfloat16), randn(N, K, dtype=torch.bfloat16)
    wq, ws = quant.quantize_fp8(w, "row")
    bad = {"activation": (OPS.gemm_a16w16.default, (x, w, None, "swish", None), ValueError),
           "bias": (OPS.gemm_a16w16.default, (x, w, torch.zeros(N + 1, device=DEVICE), None, None), ValueError),
           "mixed": (OPS.gemm_a16w16.default, (x, w.half(), None, None, None), TypeError),
           "a8w8 bias": (OPS.gemm_a8w8.default, (x, wq, None, ws, torch.zeros(2, N, device=DEVICE), None, None),
                         ValueError)}
    xq3 = randn(2, 3, K, dtype=torch.bfloat16)
    bad.update({
        "static row": (OPS.quantize_fp8.default, (x, "row", torch.float8_e4m3fn, torch.ones(1, device=DEVICE)),
                       ValueError),
        "block layout": (OPS.quantize_fp8_blockwise.default, (x, 1, torch.float8_e4m3fn, "float32", "column"),
                         ValueError),
        "block rows": (OPS.quantize_fp8_blockwise.default, (x, 64, torch.float8_e4m3fn, "float32", "row"), ValueError),
        "block 3-D weight": (OPS.quantize_fp8_blockwise.default, (xq3, 128, torch.float8_e4m3fn, "float32", "row"),
                             ValueError),
        "mul_add broadcast": (OPS.fused_gemm_a16w16_mul_add.default,
                              (xq3, w, torch.ones(6, 1, device=DEVICE), torch.zeros(1, device=DEVICE), None),
                              ValueError)})
    for name, (op, args, err) in bad.items():
        with pytest.raises(err):
            op(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, pytest.raises(err):
            op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])


def test_output_functions():
    assert gemm_output((2, 3, 64), (48, 64), None, torch.bfloat16) == ((2, 3, 48), torch.bfloat16)
    assert gemm_output((64,), (48, 64), torch.float32, torch.bfloat16) == ((48,), torch.float32)
    with pytest.raises(ValueError, match="differs"):
        gemm_output((4, 32), (48, 64), None, torch.bfloat16)
    with pytest.raises(ValueError, match="2-D"):
        gemm_output((4, 64), (64,), None, torch.bfloat16)
    assert quantize_output((2, 3, 8), "row", torch.int8) == (((2, 3, 8), torch.int8), ((2, 3, 1), torch.float32))
    assert quantize_output((4, 8), "tensor", torch.int8)[1] == ((), torch.float32)
    with pytest.raises(ValueError, match="granularity"):
        quantize_output((4, 8), "col", torch.int8)


def test_eager_calls_stay_plain_python(monkeypatch):
    """Eagerly the public functions never reach the custom ops; while compiling they do."""
    def boom():
        raise AssertionError("eager call routed to gemmkit.library")

    for mod in (a16w16, a8w8, quant):
        monkeypatch.setattr(mod, "_library", boom)
    x, w = randn(4, K, dtype=torch.bfloat16), randn(N, K, dtype=torch.bfloat16)
    y = gemmkit.gemm_a16w16(x, w)
    wq, ws = quant.quantize_fp8(w)
    gemmkit.gemm_a8w8(x, wq, None, ws)
    quant.quantize_int8(x, "tensor")
    calls = []
    monkeypatch.setattr(a16w16, "_library", lambda: library)
    monkeypatch.setattr(a16w16, "_is_compiling", lambda: True)
    monkeypatch.setattr(library, "traced_gemm_a16w16", lambda *a: calls.append(a) or y)
    assert gemmkit.gemm_a16w16(x, w) is y and len(calls) == 1


def _program(x, w, bias, act_scale, y):
    """Every public op, with a preallocated output and a static scale."""
    a = gemmkit.gemm_a16w16(x, w, bias, activation="relu")
    gemmkit.gemm_a16w16(x, w, out_dtype=torch.float32, y=y)
    wq, ws = quant.quantize_fp8(w, "row")
    b = gemmkit.gemm_a8w8(x, wq, None, ws)
    xq, xs = quant.quantize_fp8(x, "tensor", scale=act_scale)
    c = gemmkit.gemm_a8w8(xq, wq, xs, ws, bias, out_dtype=torch.float32)
    wi, wis = quant.quantize_int8(w, "row")
    xi, xis = quant.quantize_int8(x, "row")
    d = gemmkit.gemm_a8w8(xi, wi, xis, wis)
    return a.float() + b.float() + c + d.float() + y


BACKENDS = sizes(["eager", "aot_eager"], ["eager", "aot_eager", "inductor"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_fullgraph(backend):
    x, w = randn(3, K, dtype=torch.bfloat16), randn(N, K, dtype=torch.bfloat16)
    args = (x, w, randn(N, dtype=torch.bfloat16), torch.tensor([0.02], device=DEVICE))
    y = check_compiles(_program, args, (3, N), backend)
    torch.testing.assert_close(y, gemmkit.gemm_a16w16(x, w, out_dtype=torch.float32))


def test_compile_refuses_config():
    x, w = randn(3, K, dtype=torch.bfloat16), randn(N, K, dtype=torch.bfloat16)
    torch._dynamo.reset()
    f = torch.compile(lambda x, w: gemmkit.gemm_a16w16(x, w, config=dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)),
                      fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="config= is not supported under torch.compile"):
        f(x, w)


def test_compiled_calls_check_like_eager():
    """What the eager ops refuse, their traced forms refuse too (before the custom ops' schemas coerce a value or the
    result is copied into a preallocated y), with the eager message."""
    H, I = 32, 48
    x, wgu, wd = randn(5, H, dtype=torch.bfloat16), randn(2 * I, H, dtype=torch.bfloat16), randn(H, I,
                                                                                                dtype=torch.bfloat16)
    wq, ws = quant.quantize_fp8(wgu, "row")
    E = 3
    xe, we = randn(12, H, dtype=torch.bfloat16), randn(E, I, H, dtype=torch.bfloat16)
    w4, s4, z4 = quant.quantize_int4(randn(I, H, dtype=torch.bfloat16), group_size=32)
    cases = [
        (lambda: gemmkit.ff_a16w16_gated(x, wgu, wd, y=torch.empty(2, 5, H, dtype=torch.bfloat16, device=DEVICE)),
         "y must have shape"),
        (lambda: gemmkit.ff_a16w16(x, wgu[:I], wd, y=torch.empty(5, H, dtype=torch.float32, device=DEVICE),
                                   out_dtype=torch.bfloat16), "y has dtype"),
        (lambda: gemmkit.fused_gemm_a16w16_mul_add(x, wgu, 1.0, 0.0, y=torch.empty(5, 2 * I, device=DEVICE).expand(
            5, 2 * I)[:, :1].expand(5, 2 * I)), "share memory|y has dtype"),
        (lambda: gemmkit.grouped_gemm_a16w16(xe, we, None, m_sizes=torch.tensor([4.5, 4.0, 3.5], device=DEVICE)),
         "m_sizes has dtype"),
        (lambda: gemmkit.gemm_a16w16(x, wgu, out_dtype=torch.float32, y=torch.empty(5, 2 * I, dtype=torch.bfloat16,
                                                                                   device=DEVICE)), "y has dtype"),
        (lambda: gemmkit.gemm_a16w16(x, wgu, y=torch.empty(5, I, dtype=torch.bfloat16, device=DEVICE)),
         "y must have shape"),
        (lambda: gemmkit.gemm_a8w8(x, wq, None, ws, fast_accum=1), "fast_accum must be a bool"),
        (lambda: gemmkit.gemm_a8w8(x, wq, None, 0.5), "w_scale must be a torch.Tensor"),
        (lambda: gemmkit.gemm_a16w4(x, w4, s4, z4, group_size=True), "group_size"),
        (lambda: gemmkit.fused_gemm_a16w16_split_cat(x, wgu[:32], randn(5, 2, 8, dtype=torch.bfloat16), 2, True, 8),
         "d1 must be a positive int"),
    ]
    for fn, word in cases:
        torch._dynamo.reset()
        with pytest.raises(Exception, match=word):
            fn()  # (eager)
        torch._dynamo.reset()
        with pytest.raises(Exception, match=word):
            torch.compile(fn, fullgraph=True, backend="eager")()


def test_compiled_grouped_gated_activation_none_and_mul_add_floats():
    """activation=None (as eager takes it) traces; mul/add's python floats enter the graph as inputs: new values
    neither recompile past the limit nor fail under fullgraph."""
    E, H, I = 2, 32, 16
    x, w = randn(8, H, dtype=torch.bfloat16), randn(E, 2 * I, H, dtype=torch.bfloat16)
    offs = torch.tensor([0, 5, 8], dtype=torch.int32, device=DEVICE)
    torch._dynamo.reset()
    f = torch.compile(lambda x: gemmkit.grouped_gated_a16w16(x, w, offs, activation=None), fullgraph=True,
                      backend="eager")
    torch.testing.assert_close(f(x), gemmkit.grouped_gated_a16w16(x, w, offs, activation=None))
    xm, wm = randn(4, H, dtype=torch.bfloat16), randn(24, H, dtype=torch.bfloat16)
    torch._dynamo.reset()
    g = torch.compile(lambda x, a: gemmkit.fused_gemm_a16w16_mul_add(x, wm, a, 0.25), fullgraph=True,
                      backend="aot_eager")
    for i in range(12):
        a = 0.5 + i / 8
        torch.testing.assert_close(g(xm, a), gemmkit.fused_gemm_a16w16_mul_add(xm, wm, a, 0.25))


def test_plan_cache_does_not_accept_value_equal_arguments():
    """A valid call's cached plan does not serve an invalid argument equal in value (1 == True, 8 == 8.0)."""
    x, w = randn(4, 32, dtype=torch.bfloat16), randn(24, 32, dtype=torch.bfloat16)
    wq, ws = quant.quantize_fp8(w, "row")
    gemmkit.gemm_a8w8(x, wq, None, ws, fast_accum=True)
    with pytest.raises(TypeError, match="fast_accum"):
        gemmkit.gemm_a8w8(x, wq, None, ws, fast_accum=1)
    y = randn(4, 3, 8, dtype=torch.bfloat16)
    gemmkit.fused_gemm_a16w16_split_cat(x, w, y, 3, 4, 4)
    with pytest.raises(ValueError, match="d1"):
        gemmkit.fused_gemm_a16w16_split_cat(x, w, y, 3, 4.0, 4)
    w4, s4, z4 = quant.quantize_int4(randn(24, 64, dtype=torch.bfloat16), group_size=32)
    x4 = randn(4, 64, dtype=torch.bfloat16)
    gemmkit.gemm_a16w4(x4, w4, s4, z4, group_size=32)
    with pytest.raises(ValueError, match="group_size"):
        gemmkit.gemm_a16w4(x4, w4, s4, z4, group_size=32.0)
