"""Gradients of the 16-bit ops (gemmkit.autograd) against float64 torch references: x, w, bias (and mul/add's
a, b) on ragged and strided inputs, every activation, fp32 outputs, empty problems, the batched forms, the
feed-forward layouts, second derivatives, torch.compile, and the calls the differentiable path refuses."""

import pytest
import torch
import torch.nn.functional as F

import gemmkit
import gemmkit.library  # noqa: F401  (registers torch.ops.gemmkit.*)
from conftest import DEVICE, ON_GPU, randn, sizes
from gemmkit.core.epilogue import torch_activation as activate

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
# relative Frobenius error of outputs and gradients (as conftest.assert_close; a maximum would count the
# elements whose ReLU mask the rounding flips)
TOL = {BF16: 1e-2, FP16: 2e-3}


def _leaf(t, grad=True):
    return t.detach().clone().requires_grad_(grad)


def _double(t):
    return None if t is None else t.detach().double().requires_grad_(t.requires_grad)


def _check(got, ref, dtype, what):
    assert got is not None and ref is not None, what
    assert got.shape == ref.shape and got.dtype == dtype, (what, got.shape, ref.shape, got.dtype, dtype)
    assert not torch.isnan(got).any(), what
    err = ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < TOL.get(dtype, TOL[BF16]), f"{what}: relative error {err:.2e}"


def _compare(fn, ref_fn, inputs, dtype, out_dtype=None):
    """fn(*inputs) and its gradients (a fresh random dy) against ref_fn on float64 copies."""
    out = fn(*inputs)
    assert out.dtype == (out_dtype or dtype)
    dy = torch.randn(out.shape, device=DEVICE).to(out.dtype)
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    grads = torch.autograd.grad(out, leaves, dy)
    ref_inputs = [_double(t) if isinstance(t, torch.Tensor) else t for t in inputs]
    ref = ref_fn(*ref_inputs)
    ref_leaves = [t for t in ref_inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    ref_grads = torch.autograd.grad(ref, ref_leaves, dy.double())
    _check(out, ref, out.dtype, "output")
    for i, (g, r, t) in enumerate(zip(grads, ref_grads, leaves)):
        _check(g, r, t.dtype, f"gradient {i}")


SHAPES = sizes([(1, 40, 24), (37, 19, 70), (5, 3, 9), (64, 48, 80)],
               [(1, 4096, 512), (300, 1000, 777), (5, 3, 9), (2048, 1024, 4096)])


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("activation", [None, "relu", "gelu_tanh", "silu"])
def test_gemm_a16w16_grads(M, N, K, activation):
    x, w, b = _leaf(randn(M, K, dtype=BF16)), _leaf(randn(N, K, dtype=BF16, scale=K ** -0.5)), _leaf(randn(N, dtype=FP32))
    _compare(lambda x, w, b: gemmkit.gemm_a16w16(x, w, b, activation=activation),
             lambda x, w, b: activate(F.linear(x, w, b), activation), (x, w, b), BF16)


@pytest.mark.parametrize("dtype,bias_dtype,out_dtype", [(FP16, FP16, None), (BF16, None, FP32), (FP16, FP32, FP32),
                                                        (BF16, BF16, FP16)])
def test_gemm_a16w16_dtypes(dtype, bias_dtype, out_dtype):
    M, N, K = sizes((33, 40, 56), (333, 520, 1040))
    x, w = _leaf(randn(M, K, dtype=dtype)), _leaf(randn(N, K, dtype=dtype, scale=K ** -0.5))
    b = None if bias_dtype is None else _leaf(randn(N, dtype=bias_dtype))
    _compare(lambda x, w, b: gemmkit.gemm_a16w16(x, w, b, out_dtype=out_dtype), lambda x, w, b: F.linear(x, w, b),
             (x, w, b), dtype, out_dtype)


def test_gemm_a16w16_layouts_and_leading_dims():
    """Transposed and strided operands, 3-D and 1-D x, one of x / w requiring grad (a frozen weight)."""
    K, N = sizes((48, 24), (1024, 384))
    w_t = _leaf(randn(K, N, dtype=BF16, scale=K ** -0.5))  # (the weight is its transpose: N-major)
    x3 = _leaf(randn(2, 5, 2 * K, dtype=BF16))  # (x3[..., :K]: rows of stride 2K)
    ref = lambda x, w: F.linear(x[..., :K], w.t())  # noqa: E731
    _compare(lambda x, w: gemmkit.gemm_a16w16(x[..., :K], w.t()), ref, (x3, w_t), BF16)
    frozen = randn(N, K, dtype=BF16)
    x1 = _leaf(randn(K, dtype=BF16))
    _compare(lambda x, w: gemmkit.gemm_a16w16(x, w), lambda x, w: F.linear(x, w), (x1, frozen), BF16)
    xt = _leaf(randn(K, 7, dtype=BF16))  # x.t(): M-major
    _compare(lambda x, w: gemmkit.gemm_a16w16(x.t(), w, activation="silu"), lambda x, w: F.silu(F.linear(x.t(), w)),
             (xt, _leaf(frozen)), BF16)


def test_expanded_and_empty_gradients():
    K, N = sizes((40, 24), (512, 256))
    x, w, b = _leaf(randn(6, K, dtype=BF16)), _leaf(randn(N, K, dtype=BF16)), _leaf(randn(N, dtype=BF16))
    gemmkit.gemm_a16w16(x, w, b).sum().backward()  # (dy: one value expanded, stride 0)
    torch.testing.assert_close(x.grad.double(), w.double().sum(0).expand(6, K), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(w.grad.double(), x.double().sum(0).expand(N, K), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(b.grad, torch.full((N,), 6.0, dtype=BF16, device=DEVICE))
    x0, w = _leaf(randn(0, K, dtype=BF16)), _leaf(randn(N, K, dtype=BF16))
    y = gemmkit.gemm_a16w16(x0, w)
    assert y.shape == (0, N)
    gx, gw = torch.autograd.grad(y.sum(), (x0, w))
    assert gx.shape == (0, K) and torch.equal(gw, torch.zeros_like(gw))
    xk, wk, bk = _leaf(randn(4, 0, dtype=BF16)), _leaf(randn(N, 0, dtype=BF16)), _leaf(randn(N, dtype=FP32))
    gx, gw, gb = torch.autograd.grad(gemmkit.gemm_a16w16(xk, wk, bk, activation="relu").sum(), (xk, wk, bk))
    assert gx.shape == (4, 0) and gw.shape == (N, 0)
    torch.testing.assert_close(gb, (bk.detach() > 0).float() * 4)


def test_second_derivative():
    """create_graph=True: the backward's GEMMs go through the differentiable op again."""
    K, N = sizes((24, 16), (256, 128))
    x, w = _leaf(randn(5, K, dtype=BF16)), _leaf(randn(N, K, dtype=BF16, scale=K ** -0.5))
    v = randn(5, N, dtype=BF16)
    (gx,) = torch.autograd.grad(gemmkit.gemm_a16w16(x, w), x, v, create_graph=True)
    (gw,) = torch.autograd.grad((gx.float() ** 2).sum(), w)
    xd, wd = _double(x), _double(w)
    (rx,) = torch.autograd.grad(F.linear(xd, wd), xd, v.double(), create_graph=True)
    (rw,) = torch.autograd.grad((rx ** 2).sum(), wd)
    _check(gw, rw, BF16, "d/dw |dL/dx|^2")


def test_training_step_matches_torch():
    """A few SGD steps of a two-layer MLP on gemmkit ops track the same steps on F.linear (float64)."""
    H, I = sizes((32, 48), (512, 1024))
    w1, w2 = _leaf(randn(I, H, dtype=BF16, scale=H ** -0.5)), _leaf(randn(H, I, dtype=BF16, scale=I ** -0.5))
    r1, r2 = _double(w1), _double(w2)
    for _ in range(3):
        x, target = randn(16, H, dtype=BF16), randn(16, H, dtype=BF16)
        loss = ((gemmkit.gemm_a16w16(gemmkit.gemm_a16w16(x, w1, activation="gelu_tanh"), w2).float() - target.float())
                ** 2).mean()
        loss.backward()
        ref = ((F.linear(F.gelu(F.linear(x.double(), r1), approximate="tanh"), r2) - target.double()) ** 2).mean()
        ref.backward()
        assert abs(loss.item() - ref.item()) < 3e-2 * ref.item()
        with torch.no_grad():
            for p, q in ((w1, r1), (w2, r2)):
                _check(p.grad, q.grad, BF16, "weight gradient")
                p -= 0.1 * p.grad
                q -= 0.1 * q.grad
                p.grad = q.grad = None


@pytest.mark.parametrize("weight", ["per_entry", "shared_2d", "expanded"])
@pytest.mark.parametrize("bias", [None, "shared", "per_entry"])
def test_batched_grads(weight, bias):
    B, M, N, K = sizes((3, 7, 20, 36), (4, 300, 512, 1024))
    x = _leaf(randn(B, M, K, dtype=BF16))
    base = _leaf(randn(B if weight == "per_entry" else 1, N, K, dtype=BF16, scale=K ** -0.5)[0 if weight != "per_entry"
                                                                                              else slice(None)])
    b = None if bias is None else _leaf(randn(*((N,) if bias == "shared" else (B, N)), dtype=FP32))
    view = (lambda w: w.expand(B, N, K)) if weight == "expanded" else (lambda w: w)

    def ref(x, w, b):
        w = w.expand(B, N, K) if w.ndim == 2 else w
        out = x @ w.transpose(1, 2)
        return F.silu(out if b is None else out + (b if b.ndim == 1 else b[:, None, :]))

    _compare(lambda x, w, b: gemmkit.batched_gemm_a16w16(x, view(w), b, activation="silu"), ref, (x, base, b), BF16)


@pytest.mark.parametrize("a_kind", ["float", "row", "column"])
def test_mul_add_grads(a_kind):
    M, N, K = sizes((9, 24, 40), (257, 640, 1536))
    x, w = _leaf(randn(M, K, dtype=BF16)), _leaf(randn(N, K, dtype=BF16, scale=K ** -0.5))
    a = 0.5 if a_kind == "float" else _leaf(randn(*((M, 1) if a_kind == "row" else (N,)), dtype=FP32))
    residual = _leaf(randn(M, N, dtype=BF16))
    _compare(lambda x, w, a, b: gemmkit.fused_gemm_a16w16_mul_add(x, w, a, b),
             lambda x, w, a, b: F.linear(x, w) * a + b, (x, w, a, residual), BF16)


@pytest.mark.parametrize("layout", ["concat", "interleaved", "separate"])
def test_ff_gated_grads(layout):
    M, H, I = sizes((6, 32, 40), (200, 512, 1536))
    x = _leaf(randn(2, M, H, dtype=BF16))
    wgu = _leaf(randn(2 * I, H, dtype=BF16, scale=H ** -0.5))
    wd = _leaf(randn(H, I, dtype=BF16, scale=I ** -0.5))
    if layout == "separate":
        wu = _leaf(randn(I, H, dtype=BF16, scale=H ** -0.5))
        fn = lambda x, g, u, d: gemmkit.ff_a16w16_gated(x, g[:I], d, w_up=u)  # noqa: E731
        ref = lambda x, g, u, d: F.linear(F.silu(F.linear(x, g[:I])) * F.linear(x, u), d)  # noqa: E731
        _compare(fn, ref, (x, wgu, wu, wd), BF16)
        return

    def ref(x, g, d):
        gate, up = (g[:I], g[I:]) if layout == "concat" else (g[0::2], g[1::2])
        return F.linear(F.gelu(F.linear(x, gate), approximate="tanh") * F.linear(x, up), d)

    _compare(lambda x, g, d: gemmkit.ff_a16w16_gated(x, g, d, "gelu_tanh", layout=layout, out_dtype=FP32), ref,
             (x, wgu, wd), BF16, FP32)


def test_ff_ungated_grads():
    M, H, I = sizes((5, 24, 40), (100, 512, 1024))
    x, wu, wd = (_leaf(randn(M, H, dtype=FP16)), _leaf(randn(I, H, dtype=FP16, scale=H ** -0.5)),
                 _leaf(randn(H, I, dtype=FP16, scale=I ** -0.5)))
    _compare(lambda x, u, d: gemmkit.ff_a16w16(x, u, d, "relu"), lambda x, u, d: F.linear(F.relu(F.linear(x, u)), d),
             (x, wu, wd), FP16)


def test_without_grad_mode_or_grad_inputs_unchanged():
    """Parameters under no_grad / inference_mode take the inference plans (same values, no graph)."""
    K, N = sizes((40, 24), (512, 256))
    x, w = randn(7, K, dtype=BF16), torch.nn.Parameter(randn(N, K, dtype=BF16))
    with torch.no_grad():
        a = gemmkit.gemm_a16w16(x, w, activation="relu")
    with torch.inference_mode():
        b = gemmkit.gemm_a16w16(x, w, activation="relu")
    c = gemmkit.gemm_a16w16(x, w.detach(), activation="relu")
    assert not a.requires_grad and torch.equal(a, b) and torch.equal(a, c)
    d = gemmkit.gemm_a16w16(x, w, activation="relu")
    assert d.requires_grad and d.grad_fn is not None
    torch.testing.assert_close(d.detach(), a, rtol=1e-2, atol=1e-2)  # (the pre-activation rounded first)


def test_refused_with_grad():
    K, N = sizes((40, 24), (512, 256))
    x, w = _leaf(randn(4, K, dtype=BF16)), randn(N, K, dtype=BF16)
    with pytest.raises(ValueError, match="y= .*autograd"):
        gemmkit.gemm_a16w16(x, w, y=torch.empty(4, N, dtype=BF16, device=DEVICE))
    with pytest.raises(ValueError, match="config= .*autograd"):
        gemmkit.gemm_a16w16(x, w, config=dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32))
    with pytest.raises(TypeError, match="w has dtype"):  # (the inference call's checks first)
        gemmkit.gemm_a16w16(x, w.half())
    with pytest.raises(ValueError, match="K"):
        gemmkit.gemm_a16w16(x, randn(N, K + 1, dtype=BF16))
    with pytest.raises(ValueError, match="y= .*autograd"):
        gemmkit.ff_a16w16_gated(x, randn(2 * N, K, dtype=BF16), randn(K, N, dtype=BF16),
                                y=torch.empty(4, K, dtype=BF16, device=DEVICE))
    wq, ws = gemmkit.quant.quantize_fp8(w, "row")
    xq, xs = gemmkit.quant.quantize_fp8(x.detach(), "row")
    with pytest.raises(ValueError, match="x requires grad"):  # (an FP8 x: no backward; test_autograd_frozen: dynamic)
        gemmkit.gemm_a8w8(xq.requires_grad_(), wq, xs, ws)
    with pytest.raises(ValueError, match="x requires grad"):
        gemmkit.grouped_gemm_a16w16(x, w.reshape(1, N, K), torch.tensor([0, 4], dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("backend", ["aot_eager"] + (["inductor"] if ON_GPU else []))
def test_compiled_training_step(backend):
    """fullgraph torch.compile of a forward and backward: the same gradients as eager."""
    K, N = sizes((40, 24), (512, 256))
    x, w, b = _leaf(randn(6, K, dtype=BF16)), _leaf(randn(N, K, dtype=BF16, scale=K ** -0.5)), _leaf(randn(N, dtype=FP32))
    a = _leaf(randn(6, 1, dtype=FP32))

    def step(x, w, b, a):
        h = gemmkit.gemm_a16w16(x, w, b, activation="silu")
        y = gemmkit.fused_gemm_a16w16_mul_add(h, w[:, :N], a, h)
        z = gemmkit.batched_gemm_a16w16(y.reshape(2, 3, N), w[:, :N])
        return z.float().square().sum()

    eager = torch.autograd.grad(step(x, w, b, a), (x, w, b, a))
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    got = torch.autograd.grad(compiled(x, w, b, a), (x, w, b, a))
    for g, e in zip(got, eager):  # (inductor fuses and rounds the torch parts differently)
        assert g.dtype == e.dtype and ((g.double() - e.double()).norm() / e.double().norm()).item() < 1e-2


def test_backward_runs_the_explicit_gemms():
    """The backward is gemm_a16w16(dy, w.T) and gemm_a16w16(dy.T, x.T) (what `gemmkit bench a16w16_train` times):
    the same bits."""
    M, N, K = sizes((37, 24, 40), (1000, 1536, 4096))
    x, w = _leaf(randn(M, K, dtype=BF16)), _leaf(randn(N, K, dtype=BF16, scale=K ** -0.5))
    dy = randn(M, N, dtype=BF16)
    gx, gw = torch.autograd.grad(gemmkit.gemm_a16w16(x, w), (x, w), dy)
    with torch.no_grad():
        assert torch.equal(gx, gemmkit.gemm_a16w16(dy, w.t()))
        assert torch.equal(gw, gemmkit.gemm_a16w16(dy.t(), x.t()))


def test_opcheck_with_grad():
    K, N = sizes((40, 24), (512, 256))
    x, w, b = _leaf(randn(5, K, dtype=BF16)), _leaf(randn(N, K, dtype=BF16)), _leaf(randn(N, dtype=FP32))
    tests = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    for args in ((x, w, b, None, None), (x, w, None, "gelu_tanh", FP32)):
        assert set(torch.library.opcheck(torch.ops.gemmkit.gemm_a16w16.default, args,
                                         test_utils=tests).values()) == {"SUCCESS"}
    xb, wb = _leaf(randn(2, 3, K, dtype=BF16)), _leaf(randn(2, N, K, dtype=BF16))
    assert set(torch.library.opcheck(torch.ops.gemmkit.batched_gemm_a16w16.default, (xb, wb, None, "relu", None),
                                     test_utils=tests).values()) == {"SUCCESS"}


@pytest.mark.parametrize("B,M,N,K", [(2, 0, 8, 16), (0, 3, 8, 16), (2, 3, 8, 0), (2, 3, 0, 16)])
@pytest.mark.parametrize("weight_dims", [3, 2])
def test_batched_empty_gradients(B, M, N, K, weight_dims):
    x = _leaf(randn(B, M, K, dtype=BF16))
    w = _leaf(randn(*((B, N, K) if weight_dims == 3 else (N, K)), dtype=BF16))
    b = _leaf(randn(N, dtype=FP32))
    y = gemmkit.batched_gemm_a16w16(x, w, b, activation="relu")
    gx, gw, gb = torch.autograd.grad(y.float().sum(), (x, w, b))
    assert gx.shape == x.shape and gw.shape == w.shape and gb.shape == b.shape
    assert not gx.any() and not gw.any()  # (no products: zero gradients, never unwritten memory)
    torch.testing.assert_close(gb, (b.detach() > 0).float() * B * M)


@pytest.mark.parametrize("op", ["gemm", "batched"])
def test_op_with_activation_second_derivative(op):
    """torch.ops.gemmkit.* called with an activation (which the public ops never pass with autograd) recompute the
    pre-activation in the backward, differentiably when the backward is differentiated."""
    K, N = sizes((16, 12), (256, 128))
    x, w, b = _leaf(randn(7, K, dtype=BF16)), _leaf(randn(N, K, dtype=BF16, scale=K ** -0.5)), _leaf(randn(N, dtype=FP32))
    dy = randn(7, N, dtype=BF16)
    if op == "gemm":
        fn = lambda x, w, b: torch.ops.gemmkit.gemm_a16w16(x, w, b, "silu", None)  # noqa: E731
    else:
        fn = lambda x, w, b: torch.ops.gemmkit.batched_gemm_a16w16(x[None], w, b, "silu", None)[0]  # noqa: E731
    (gx,) = torch.autograd.grad(fn(x, w, b), x, dy, create_graph=True)
    hw, hb = torch.autograd.grad((gx.float() ** 2).sum(), (w, b))
    xd, wd, bd = _double(x), _double(w), _double(b)
    (rx,) = torch.autograd.grad(F.silu(F.linear(xd, wd, bd)), xd, dy.double(), create_graph=True)
    rw, rb = torch.autograd.grad((rx ** 2).sum(), (wd, bd))
    _check(hw, rw, BF16, "second derivative, w")
    _check(hb, rb, FP32, "second derivative, bias")


def test_mul_add_scalar_tensor_gradient_in_float32():
    """A one-element bf16 `a` gets its gradient summed in float32 (not rounded per element first)."""
    M, N, K = sizes((32, 32, 32), (512, 512, 512))
    x, w = randn(M, K, dtype=BF16), randn(N, K, dtype=BF16, scale=K ** -0.5)
    for shape in ((), (1, 1), (1,)):
        a = _leaf((torch.randn(shape, device=DEVICE) + 1.5).to(BF16))
        dy = torch.randn(M, N, device=DEVICE)
        (ga,) = torch.autograd.grad(gemmkit.fused_gemm_a16w16_mul_add(x, w, a, 0.0, out_dtype=FP32), a, dy)
        ad = _double(a)
        (ra,) = torch.autograd.grad(F.linear(x.double(), w.double()) * ad, ad, dy.double())
        assert ga.shape == a.shape and abs(ga.double() - ra).max() <= 4e-3 * abs(ra).max()


def test_refused_before_any_launch_with_grad(monkeypatch):
    from conftest import check_refused

    K, N = sizes((16, 12), (256, 128))
    x, w = _leaf(randn(4, K, dtype=BF16)), _leaf(randn(N, K, dtype=BF16))
    check_refused(monkeypatch, lambda *a: gemmkit.gemm_a16w16(*a, activation="gelu"), (x, w), ValueError, "activation")
    check_refused(monkeypatch, gemmkit.ff_a16w16, (x, w, w.t(), "gelu"), ValueError, "activation")
    check_refused(monkeypatch, lambda *a: gemmkit.batched_gemm_a16w16(*a, activation="tanh"), (x[None], w),
                  ValueError, "activation")
    check_refused(monkeypatch, gemmkit.ff_a16w16_gated, (x, torch.cat([w, w]), w.t(), "gelu"), ValueError,
                  "activation")


def test_torch_func_and_forward_ad_refused():
    """No silent drop of a forward-mode tangent (also after a plan for the same facts was cached), and a clear error
    under torch.func transforms."""
    import torch.autograd.forward_ad as fwAD

    K, N = sizes((16, 12), (256, 128))
    x, w = randn(5, K, dtype=BF16), randn(N, K, dtype=BF16)
    gemmkit.gemm_a16w16(x, w)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones_like(x))
        with pytest.raises(ValueError, match="forward-mode"):
            gemmkit.gemm_a16w16(dual, w)
        with pytest.raises(ValueError, match="forward-mode"):
            gemmkit.fused_gemm_a16w16_mul_add(x, w, fwAD.make_dual(torch.ones(N, device=DEVICE),
                                                                   torch.ones(N, device=DEVICE)), 0.0)
        assert fwAD.unpack_dual(gemmkit.gemm_a16w16(x, w)).tangent is None  # (no tangent in: fine)
    with pytest.raises(TypeError, match="torch.func"):
        torch.func.vmap(lambda t: gemmkit.gemm_a16w16(t, w))(randn(3, 5, K, dtype=BF16))
    with pytest.raises(TypeError, match="torch.func"):
        torch.func.grad(lambda t: gemmkit.gemm_a16w16(t, w).float().sum())(x)


def test_compiled_calls_check_like_eager():
    """Under torch.compile: inputs requiring grad refused by the ops without a backward, mul/add's operands and the
    feed-forward's down weight checked in the differentiable paths, a bool mul/add scalar refused."""
    K, N = sizes((16, 12), (256, 128))
    x, w = _leaf(randn(4, K, dtype=BF16)), _leaf(randn(N, K, dtype=BF16))
    wq, ws = gemmkit.quant.quantize_fp8(w.detach(), "row")
    xq, xs = gemmkit.quant.quantize_fp8(x.detach(), "row")
    xq.requires_grad_()
    cases = [
        (lambda x, w: gemmkit.gemm_a8w8(xq, wq, xs, ws), "requires grad"),  # (an FP8 x; a 16-bit one: differentiable)
        (lambda x, w: gemmkit.quant.quantize_fp8(x), "requires grad"),
        (lambda x, w: gemmkit.fused_gemm_a16w16_mul_add(x, w, torch.ones(3, device=DEVICE), 0.0), "broadcastable"),
        (lambda x, w: gemmkit.fused_gemm_a16w16_mul_add(x.detach(), w.detach(), True, 0.0), "float or a tensor"),
        (lambda x, w: gemmkit.ff_a16w16_gated(x, torch.cat([w, w]), w.t().half()), "w_down"),
    ]
    for fn, word in cases:
        torch._dynamo.reset()
        with pytest.raises(Exception, match=word):
            torch.compile(fn, fullgraph=True, backend="eager")(x, w)


@pytest.mark.parametrize("out_dtype", [None, FP32])
def test_split_cat_grads(out_dtype):
    M, K, H, d1, d2, d3 = sizes((5, 24, 2, 16, 8, 8), (300, 512, 16, 128, 64, 64))
    x, w = _leaf(randn(M, K, dtype=BF16)), _leaf(randn(H * (d1 + d2), K, dtype=BF16, scale=K ** -0.5))
    y = _leaf(randn(M, H, d3, dtype=BF16))

    def ref(x, w, y):
        p = F.linear(x, w).view(M, H, d1 + d2)
        return torch.cat([p[..., :d1], y], -1), p[..., d1:]

    out1, out2 = gemmkit.fused_gemm_a16w16_split_cat(x, w, y, H, d1, d2, out_dtype=out_dtype)
    dt = out_dtype or BF16
    assert out1.dtype == out2.dtype == dt and out1.is_contiguous() and out2.is_contiguous()
    g1, g2 = torch.randn(out1.shape, device=DEVICE).to(dt), torch.randn(out2.shape, device=DEVICE).to(dt)
    grads = torch.autograd.grad((out1, out2), (x, w, y), (g1, g2))
    xd, wd, yd = _double(x), _double(w), _double(y)
    r1, r2 = ref(xd, wd, yd)
    _check(out1, r1, dt, "out1")
    _check(out2, r2, dt, "out2")
    for g, r, t in zip(grads, torch.autograd.grad((r1, r2), (xd, wd, yd), (g1.double(), g2.double())), (x, w, y)):
        _check(g, r, t.dtype, "gradient")
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w, y: gemmkit.fused_gemm_a16w16_split_cat(x, w, y, H, d1, d2,
                                                                                 out_dtype=out_dtype),
                             fullgraph=True, backend="aot_eager")
    c1, c2 = compiled(x, w, y)
    for g, e in zip(torch.autograd.grad((c1, c2), (x, w, y), (g1, g2)), grads):
        assert ((g.double() - e.double()).norm() / e.double().norm()).item() < 1e-2
    wq, ws = gemmkit.quant.quantize_fp8(w.detach(), "row")
    xq, xs = gemmkit.quant.quantize_fp8(x.detach(), "row")
    with pytest.raises(ValueError, match="y requires grad"):
        gemmkit.fused_gemm_a8w8_split_cat(xq, wq, xs, ws, y, H, d1, d2)
