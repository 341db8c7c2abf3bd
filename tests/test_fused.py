"""Fused feed-forward (gated epilogue) and fused-epilogue GEMMs (gemmkit.ops.fused), GatedMLP, convert."""

import copy

import pytest
import torch
from torch import nn

import gemmkit
import gemmkit.nn
from gemmkit import quant
from gemmkit.core.outputs import ff_output
from gemmkit.ops import fused
from conftest import ACT_REF, DEVICE, ON_GPU, assert_close, check_refused, kernel_paths, poisoned, randn, sizes

BF16, FP16, FP32, E4M3 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn
# the gated GEMM computes whole tiles: no split-K / stream-K paths
GATED_PATHS = {k: v for k, v in kernel_paths(gpu_block_k=64).items()
               if "splitk" not in k and "streamk" not in k and (ON_GPU or "warp" not in k)}
# (M, I, H): ragged M, I and H
RAGGED = sizes([(1, 40, 48), (37, 50, 72), (20, 16, 24)], [(1, 1408, 1024), (300, 1000, 520), (1024, 2048, 1024)])
MLP = sizes((13, 48, 64), (256, 1536, 1024))  # (M, I, H), 16-aligned (FP8)


def gated_ref(x, gate, up, activation="silu", x_scale=None, g_scale=None, u_scale=None):
    """float64 act(x @ gate^T * scales) * (x @ up^T * scales)."""
    g, u = x.double() @ gate.double().T, x.double() @ up.double().T
    if x_scale is not None:
        g, u = g * x_scale.double().reshape(-1, 1), u * x_scale.double().reshape(-1, 1)
    if g_scale is not None:
        g, u = g * g_scale.double().reshape(1, -1), u * u_scale.double().reshape(1, -1)
    return ACT_REF[activation](g) * u


def layouts(I, H, dtype, scale=0.5):
    """{layout: (w_gate_up, w_up, layout, gate, up)} for one random gate/up pair."""
    gate, up = randn(I, H, dtype=dtype, scale=scale), randn(I, H, dtype=dtype, scale=scale)
    inter = torch.stack([gate, up], 1).reshape(2 * I, H)
    return {"concat": (torch.cat([gate, up]), None, "concat", gate, up),
            "interleaved": (inter, None, "interleaved", gate, up),
            "separate": (gate, up, "concat", gate, up)}


# ---------------------------------------------------------------------------------------------
# the gated GEMM


@pytest.mark.parametrize("path,layout", [(p, "concat") for p in sorted(GATED_PATHS)]
                         + [("tma_persistent", "interleaved"), ("ptr_small_m", "separate")])
def test_gated_gemm_paths_layouts(path, layout):
    M, I, H = RAGGED[1]
    w_gate_up, w_up, lay, gate, up = layouts(I, H, BF16)[layout]
    x = randn(M, H, dtype=BF16)
    y = poisoned((M, I), BF16)
    g, u = fused.gate_up_views(w_gate_up, w_up, lay)
    out = fused.gated_gemm(x, g, u, y=y, config=GATED_PATHS[path])
    assert out is y
    assert_close(out, gated_ref(x, gate, up))


@pytest.mark.parametrize("M,I,H", RAGGED)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "relu"])
def test_gated_gemm_ragged(M, I, H, activation):
    w_gate_up, _, _, gate, up = layouts(I, H, FP16)["concat"]
    x = randn(M, H, dtype=FP16)
    g, u = fused.gate_up_views(w_gate_up)
    assert_close(fused.gated_gemm(x, g, u, activation=activation, out_dtype=FP32),
                 gated_ref(x, gate, up, activation))


def test_gated_gemm_refuses_split_k():
    w = randn(64, 32, dtype=BF16)
    g, u = fused.gate_up_views(w)
    with pytest.raises(ValueError, match="whole tiles"):
        fused.gated_gemm(randn(4, 32, dtype=BF16), g, u, config=dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, SPLIT_K=2))


# ---------------------------------------------------------------------------------------------
# feed-forward ops


@pytest.mark.parametrize("two_gemms", [False, True], ids=["gated_gemm", "two_gemms"])
@pytest.mark.parametrize("layout", ["concat", "interleaved", "separate"])
@pytest.mark.parametrize("M", sizes([1, 13], [1, 16, 300]))
def test_ff_a16w16_gated(layout, M, two_gemms, monkeypatch):
    """Both ways of the gated product: the one-launch gated GEMM and, from TWO_GEMMS_MIN_M rows,
    up = x @ w_up^T then act(x @ w_gate^T) * up in the second GEMM's epilogue."""
    from gemmkit.ops import fused

    monkeypatch.setattr(fused, "TWO_GEMMS_MIN_M", 1 if two_gemms else 1 << 40)
    _, I, H = MLP
    w_gate_up, w_up, lay, gate, up = layouts(I, H, BF16, scale=0.2)[layout]
    w_down = randn(H + 8, I, dtype=BF16, scale=0.2)
    x = randn(2, M, H, dtype=BF16)
    y = poisoned((2, M, H + 8), FP32)
    out = gemmkit.ff_a16w16_gated(x, w_gate_up, w_down, w_up=w_up, layout=lay, out_dtype=FP32, y=y)
    assert out is y
    h = gated_ref(x.reshape(-1, H), gate, up).to(BF16)  # the intermediate in x's dtype, as torch's
    assert_close(out, (h.double() @ w_down.double().T).reshape(2, M, H + 8), tol=2e-2)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "relu", None])
def test_ff_a16w16_ungated(activation):
    M, I, H = MLP
    x, w_up, w_down = randn(M, H, dtype=BF16), randn(I, H, dtype=BF16, scale=0.2), randn(H, I, dtype=BF16, scale=0.2)
    out = gemmkit.ff_a16w16(x, w_up, w_down, activation)
    h = ACT_REF[activation or "none"](x.double() @ w_up.double().T).to(BF16)
    assert_close(out, h.double() @ w_down.double().T, tol=2e-2)


@pytest.mark.parametrize("layout", ["concat", "interleaved", "separate"])
@pytest.mark.parametrize("M", sizes([3, 40], [4, 300]))  # in-kernel quantization (M <= 16), quantizer first
def test_ff_a8w8_gated(layout, M):
    _, I, H = MLP
    w16, w_up16, lay, gate, up = layouts(I, H, BF16)[layout]
    rows = torch.cat([w16, w_up16]) if w_up16 is not None else w16
    wq, ws = quant.quantize_fp8(rows, "row")
    ws = ws.reshape(-1)
    w_gate_up, w_up = (wq[:I], wq[I:]) if w_up16 is not None else (wq, None)
    gq, uq = fused.gate_up_views(w_gate_up, w_up, lay)
    gs, us = (ws[0::2], ws[1::2]) if layout == "interleaved" else (ws[:I], ws[I:])
    w_down, w_down_s = quant.quantize_fp8(randn(H, I, dtype=BF16, scale=0.2), "row")
    x = randn(M, H, dtype=BF16)
    out = gemmkit.ff_a8w8_gated(x, w_gate_up, ws, w_down, w_down_s, w_up=w_up, layout=lay)
    xq, xs = quant.quantize_fp8(x, "row")
    h = gated_ref(xq, gq, uq, "silu", xs, gs, us).to(BF16)
    hq, hs = quant.quantize_fp8(h, "row")
    ref = (hq.double() @ w_down.double().T) * hs.double() * w_down_s.double().reshape(1, -1)
    assert out.dtype == BF16
    assert_close(out, ref, tol=2e-2)


def test_ff_a8w8_gated_tensor_scale():
    M, I, H = MLP
    wq, ws = quant.quantize_fp8(randn(2 * I, H, dtype=BF16), "tensor")
    w_down, w_down_s = quant.quantize_fp8(randn(H, I, dtype=BF16, scale=0.2), "tensor")
    x = randn(M, H, dtype=BF16)
    out = gemmkit.ff_a8w8_gated(x, wq, ws, w_down, w_down_s, out_dtype=FP32)
    xq, xs = quant.quantize_fp8(x, "row")
    h = gated_ref(xq, wq[:I], wq[I:], "silu", xs, ws.expand(I), ws.expand(I)).to(BF16)
    ref = h.double() @ (w_down.double() * w_down_s.double()).T
    assert_close(out, ref, tol=5e-2)


def test_ff_bad_inputs():
    x, w, wd = randn(4, 32, dtype=BF16), randn(64, 32, dtype=BF16), randn(32, 32, dtype=BF16)
    with pytest.raises(ValueError, match="even"):
        gemmkit.ff_a16w16_gated(x, w[:63], wd)
    with pytest.raises(ValueError, match="layout"):
        gemmkit.ff_a16w16_gated(x, w, wd, layout="blocked")
    for lay in ("blocked", "interleaved"):  # (separate gate and up weights: no layout to describe, checked anyway)
        with pytest.raises(ValueError, match="layout"):
            gemmkit.ff_a16w16_gated(x, w[:32], wd, w_up=w[32:], layout=lay)
    with pytest.raises(ValueError, match="w_up"):
        gemmkit.ff_a16w16_gated(x, w[:32], wd, w_up=w[:16])
    with pytest.raises(ValueError, match="w_up"):
        gemmkit.ff_a16w16_gated(x, w[:32], wd, w_up=w[:32].t().contiguous().t())
    with pytest.raises(ValueError, match="K"):
        gemmkit.ff_a16w16_gated(x, w, randn(32, 48, dtype=BF16))
    with pytest.raises(TypeError, match="dtype"):
        gemmkit.ff_a16w16_gated(x, w.half(), wd)
    with pytest.raises(ValueError, match="activation"):
        gemmkit.ff_a16w16_gated(x, w, wd, activation="tanh")
    wq, ws = quant.quantize_fp8(w, "row")
    with pytest.raises(ValueError, match="w_scale"):
        gemmkit.ff_a8w8_gated(x, wq, ws[:32], wq[:32], ws[:32])
    with pytest.raises(TypeError, match="w_gate_up"):
        gemmkit.ff_a8w8_gated(x, w, ws, wq[:32], ws[:32])


def test_ff_bad_down_weight_refused_before_the_first_gemm(monkeypatch):
    x, w = randn(4, 32, dtype=BF16), randn(64, 32, dtype=BF16)
    wq, ws = quant.quantize_fp8(w, "row")
    for op, args, exc, word in (
            (gemmkit.ff_a16w16_gated, (x, w, randn(32, 31, dtype=BF16)), ValueError, "w_down"),
            (gemmkit.ff_a16w16_gated, (x, w, randn(32, 32, dtype=FP16)), TypeError, "w_down"),
            (gemmkit.ff_a16w16_gated, (x, w, randn(32, dtype=BF16)), ValueError, "w_down"),
            (gemmkit.ff_a16w16, (x, w, randn(32, 32, dtype=BF16)), ValueError, "w_down"),
            (gemmkit.ff_a16w16, (x, w[:32], 3.0), TypeError, "w_down"),
            (gemmkit.ff_a8w8_gated, (x, wq, ws, w[:, :32], ws[:32]), TypeError, "w_down"),
            (gemmkit.ff_a8w8_gated, (x, wq, ws, wq[:, :16], ws[:32]), ValueError, "w_down")):
        check_refused(monkeypatch, op, args, exc, word)


# ---------------------------------------------------------------------------------------------
# (x @ w^T) * a + b


def _mul_add_operands(M, N):
    return {
        "scalar": (1.5, -0.25),
        "tensor0d": (torch.tensor(0.5, device=DEVICE), torch.tensor(2.0, device=DEVICE)),
        "tensor1": (torch.tensor([0.5], device=DEVICE), torch.tensor([[1.0]], device=DEVICE, dtype=BF16)),
        "row": (torch.rand(M, 1, device=DEVICE) + 0.5, randn(M, 1, dtype=FP32)),
        "column": (torch.rand(N, device=DEVICE) + 0.5, randn(1, N, dtype=BF16)),
        "full": (randn(M, N, dtype=FP32), randn(M, N, dtype=FP16)),
        "residual": (1.0, randn(M, N, dtype=BF16)),
        "mixed": (torch.rand(M, 1, device=DEVICE) + 0.5, randn(N, dtype=FP32)),
    }


@pytest.mark.parametrize("case,path", [(c, "ptr") for c in ("scalar", "tensor0d", "tensor1", "row", "column", "full",
                                                              "residual", "mixed")]
                         + [("full", "tma_persistent_subtile"), ("mixed", "ptr_splitk"), ("row", "tma_streamk")])
def test_mul_add(case, path):
    M, N, K = sizes((37, 50, 72), (300, 500, 1024))
    x, w = randn(M, K, dtype=BF16), randn(N, K, dtype=BF16)
    a, b = _mul_add_operands(M, N)[case]
    y = poisoned((M, N), FP32)
    out = gemmkit.fused_gemm_a16w16_mul_add(x, w, a, b, y=y, config=kernel_paths(64)[path])
    assert out is y
    t = lambda v: torch.tensor(v, dtype=torch.float64) if isinstance(v, float) else v.double()  # noqa: E731
    assert_close(out, (x.double() @ w.double().T) * t(a) + t(b))


def test_mul_add_batched_residual():
    B, S, N, K = 2, 7, 40, 48
    x, w, res = randn(B, S, K, dtype=BF16), randn(N, K, dtype=BF16), randn(B, S, N, dtype=BF16)
    out = gemmkit.fused_gemm_a16w16_mul_add(x, w, 0.5, res)
    assert out.shape == (B, S, N) and out.dtype == BF16
    assert_close(out, (x.double() @ w.double().T) * 0.5 + res.double())


def test_mul_add_empty_k():
    x, w, res = randn(3, 0, dtype=BF16), randn(4, 0, dtype=BF16), randn(3, 4, dtype=BF16)
    assert torch.equal(gemmkit.fused_gemm_a16w16_mul_add(x, w, 2.0, res), res)
    assert gemmkit.fused_gemm_a16w16_mul_add(randn(0, 8, dtype=BF16), randn(4, 8, dtype=BF16), 2.0, 1.0).shape == (0, 4)


def test_mul_add_empty_k_checks_y():
    """K == 0 computes b broadcast without a kernel; y is still checked as with K > 0."""
    x, w, res = randn(4, 0, dtype=BF16), randn(6, 0, dtype=BF16), randn(4, 6, dtype=BF16)
    y = poisoned((4, 6), BF16)
    assert gemmkit.fused_gemm_a16w16_mul_add(x, w, 1.0, res, y=y) is y and torch.equal(y, res)
    with pytest.raises(ValueError, match="y must have shape"):
        gemmkit.fused_gemm_a16w16_mul_add(x, w, 1.0, res, y=torch.zeros(2, 4, 6, dtype=BF16, device=DEVICE))
    with pytest.raises(TypeError, match="y has dtype"):
        gemmkit.fused_gemm_a16w16_mul_add(x, w, 1.0, res, y=torch.zeros(4, 6, dtype=FP32, device=DEVICE),
                                          out_dtype=BF16)


def test_mul_add_bad_inputs():
    x, w = randn(8, 32, dtype=BF16), randn(16, 32, dtype=BF16)
    with pytest.raises(ValueError, match="broadcastable"):
        gemmkit.fused_gemm_a16w16_mul_add(x, w, torch.ones(9, 1, device=DEVICE), 0.0)
    with pytest.raises(TypeError, match="b must be"):
        gemmkit.fused_gemm_a16w16_mul_add(x, w, 1.0, "zero")
    with pytest.raises(TypeError, match="a has dtype"):
        gemmkit.fused_gemm_a16w16_mul_add(x, w, torch.ones(16, dtype=torch.int32, device=DEVICE), 0.0)
    with pytest.raises(ValueError, match="w"):
        gemmkit.fused_gemm_a16w16_mul_add(x, randn(16, 31, dtype=BF16), 1.0, 0.0)


def test_output_function():
    assert ff_output((3, 5, 64), (96, 64), (64, 48), None, BF16, True) == ((3, 5, 64), BF16)
    assert ff_output((5, 64), (48, 64), (70, 48), FP32, BF16, False) == ((5, 70), FP32)
    with pytest.raises(ValueError, match="intermediate"):
        ff_output((5, 64), (96, 64), (64, 96), None, BF16, True)


# ---------------------------------------------------------------------------------------------
# nn


class LlamaMLP(nn.Module):
    def __init__(self, hidden, inter, dtype, act=None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False, dtype=dtype, device=DEVICE)
        self.up_proj = nn.Linear(hidden, inter, bias=False, dtype=dtype, device=DEVICE)
        self.down_proj = nn.Linear(inter, hidden, bias=False, dtype=dtype, device=DEVICE)
        self.act_fn = act or nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Phi3MLP(nn.Module):
    def __init__(self, hidden, inter, dtype):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False, dtype=dtype, device=DEVICE)
        self.down_proj = nn.Linear(inter, hidden, bias=False, dtype=dtype, device=DEVICE)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


def _with_double(mlp, x):
    with torch.no_grad():
        return mlp.double()(x.double())


def test_gated_mlp_passes_input_gradients():
    """A bf16 GatedMLP in a training step: frozen buffers, the input's gradient as the torch module's (float64);
    the FP8 one refuses an input that requires grad."""
    M, I, H = MLP
    mlp = LlamaMLP(H, I, BF16)
    x = randn(M, H, dtype=BF16).requires_grad_()
    (gx,) = torch.autograd.grad(gemmkit.nn.GatedMLP.from_module(mlp)(x).float().square().sum(), x)
    xd = x.detach().double().requires_grad_()
    (rx,) = torch.autograd.grad(copy.deepcopy(mlp).double()(xd).square().sum(), xd)
    assert_close(gx, rx, tol=2e-2)
    with pytest.raises(ValueError, match="requires grad"):
        gemmkit.nn.GatedMLP.from_module(mlp, scheme="fp8")(x)


@pytest.mark.parametrize("kind", ["llama", "phi3", "gelu"])
@pytest.mark.parametrize("scheme", ["bf16", "fp8"])
def test_gated_mlp_from_module(kind, scheme):
    M, I, H = MLP
    mlp = {"llama": lambda: LlamaMLP(H, I, BF16), "phi3": lambda: Phi3MLP(H, I, BF16),
           "gelu": lambda: LlamaMLP(H, I, BF16, nn.GELU(approximate="tanh"))}[kind]()
    layer = gemmkit.nn.GatedMLP.from_module(mlp, scheme=scheme)
    x = randn(3, M, H, dtype=BF16)
    out = layer(x)
    assert out.shape == (3, M, H) and out.dtype == BF16
    assert_close(out, _with_double(mlp, x), tol=2e-2 if scheme == "bf16" else 8e-2)
    state = layer.state_dict()
    assert set(state) >= {"gate_up_weight", "down_weight"}
    again = gemmkit.nn.GatedMLP(H, I, scheme=scheme, activation=layer.activation, device=DEVICE)
    again.load_state_dict(state)
    assert torch.equal(again(x).float(), out.float())


def test_gated_mlp_bad():
    H, I = 32, 48
    with pytest.raises(ValueError, match="act_fn"):
        gemmkit.nn.GatedMLP.from_module(LlamaMLP(H, I, BF16, nn.GELU()))
    with pytest.raises(ValueError, match="scheme"):
        gemmkit.nn.GatedMLP(H, I, scheme="int4")
    with pytest.raises(ValueError, match="input"):
        gemmkit.nn.GatedMLP(H, I, device=DEVICE)(randn(2, H + 1, dtype=BF16))
    with pytest.raises(ValueError, match="activation='tanh'"):  # (at construction, not at the first forward)
        gemmkit.nn.GatedMLP(H, I, activation="tanh")
    with pytest.raises(ValueError, match="gate= and up="):
        gemmkit.nn.GatedMLP(H, I, device=DEVICE).load_gate_up()


class Block(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.proj = nn.Linear(H, H, dtype=BF16, device=DEVICE)
        self.mlp = LlamaMLP(H, I, BF16)
        self.other = Phi3MLP(H, I, BF16)

    def forward(self, x):
        x = self.proj(x)
        return self.other(x + self.mlp(x))


@pytest.mark.parametrize("scheme", ["bf16", "fp8"])
def test_convert_fuse_mlp(scheme):
    M, I, H = MLP
    model = Block(H, I)
    x = randn(M, H, dtype=BF16)
    with torch.no_grad():
        expect = model(x).double()
    report = gemmkit.nn.convert(model, scheme, fuse_mlp=True, skip=["other.*"])
    assert report.fused == ["mlp"]
    assert isinstance(model.mlp, gemmkit.nn.GatedMLP) and isinstance(model.other, Phi3MLP)
    assert report.converted == ["proj"] and report.skipped == ["other.gate_up_proj", "other.down_proj"]
    assert_close(model(x), expect, tol=3e-2 if scheme == "bf16" else 1.5e-1)
    with pytest.raises(ValueError, match="fuse_mlp"):
        gemmkit.nn.convert(Block(H, I), "int8", fuse_mlp=True)
    shared = Block(H, I)  # (one MLP object held by two blocks: one GatedMLP at both paths)
    blocks = nn.ModuleList([shared, nn.Module()])
    blocks[1].mlp = shared.mlp
    report = gemmkit.nn.convert(blocks, scheme, fuse_mlp=True, skip=["*.other.*"])
    assert report.fused == ["0.mlp", "1.mlp"] and blocks[0].mlp is blocks[1].mlp


# ---------------------------------------------------------------------------------------------
# split / cat (MLA kv_b_proj)

SPLIT_PATHS = kernel_paths(gpu_block_k=64)


def split_cat_ref(p, y, heads, d1):
    p = p.reshape(p.shape[0], heads, -1)
    return torch.cat([p[..., :d1], y.double()], -1), p[..., d1:]


@pytest.mark.parametrize("path", ["ptr", "ptr_small_m", "tma_persistent"])
@pytest.mark.parametrize("dims", sizes([(3, 16, 24, 8), (4, 20, 12, 5), (2, 8, 8, 0)],
                                       [(16, 128, 128, 64), (128, 128, 128, 64), (8, 100, 60, 30)]))
def test_split_cat_a16w16(path, dims):
    heads, d1, d2, d3 = dims
    M, K = sizes((37, 72), (300, 512))
    x, w = randn(M, K, dtype=BF16), randn(heads * (d1 + d2), K, dtype=BF16)
    y = randn(M, heads, d3, dtype=FP32)
    out1, out2 = gemmkit.fused_gemm_a16w16_split_cat(x, w, y, heads, d1, d2, config=SPLIT_PATHS[path])
    r1, r2 = split_cat_ref(x.double() @ w.double().T, y, heads, d1)
    assert out1.is_contiguous() and out2.is_contiguous() and out1.dtype == BF16
    assert_close(out1, r1)
    assert_close(out2, r2)
    if d3:
        assert torch.equal(out1[..., d1:], y.to(BF16))  # copied, not computed


@pytest.mark.parametrize("x_gran", ["tensor", "row"])
def test_split_cat_a8w8(x_gran):
    heads, d1, d2, d3 = 4, 16, 32, 16
    M, K = 19, 64
    (xq, xs), (wq, ws) = quant.quantize_fp8(randn(M, K, dtype=BF16), x_gran), \
        quant.quantize_fp8(randn(heads * (d1 + d2), K, dtype=BF16), "row")
    y = randn(M, heads, d3, dtype=BF16)
    out1, out2 = gemmkit.fused_gemm_a8w8_split_cat(xq, wq, xs, ws, y, heads, d1, d2, out_dtype=FP32)
    p = (xq.double() @ wq.double().T) * xs.double().reshape(-1, 1) * ws.double().reshape(1, -1)
    r1, r2 = split_cat_ref(p, y, heads, d1)
    assert_close(out1, r1, tol=1e-4)
    assert_close(out2, r2, tol=1e-4)


@pytest.mark.parametrize("M, K", [(0, 32), (3, 0)])
def test_split_cat_degenerate(M, K):
    """No rows: empty outputs; K == 0: a zero product beside y's copy (as the fake says)."""
    heads, d1, d2, d3 = 2, 4, 6, 3
    y = randn(M, heads, d3, dtype=BF16)
    out1, out2 = gemmkit.fused_gemm_a16w16_split_cat(randn(M, K, dtype=BF16), randn(heads * (d1 + d2), K, dtype=BF16),
                                                     y, heads, d1, d2)
    assert out1.shape == (M, heads, d1 + d3) and out2.shape == (M, heads, d2)
    assert torch.equal(out1[..., d1:], y) and not out1[..., :d1].any() and not out2.any()


def test_split_cat_bad_inputs():
    x, w, y = randn(5, 32, dtype=BF16), randn(3 * 24, 32, dtype=BF16), randn(5, 3, 4, dtype=BF16)
    with pytest.raises(ValueError, match="heads"):
        gemmkit.fused_gemm_a16w16_split_cat(x, w, y, 4, 16, 8)
    with pytest.raises(ValueError, match="y has shape"):
        gemmkit.fused_gemm_a16w16_split_cat(x, w, y[:4], 3, 16, 8)
    with pytest.raises(ValueError, match="unit stride"):
        gemmkit.fused_gemm_a16w16_split_cat(x, w, randn(5, 3, 8, dtype=BF16)[..., ::2], 3, 16, 8)
    with pytest.raises(ValueError, match="d1"):
        gemmkit.fused_gemm_a16w16_split_cat(x, w, y, 3, 0, 24)
    with pytest.raises(ValueError, match="whole tiles"):
        gemmkit.fused_gemm_a16w16_split_cat(x, w, y, 3, 16, 8, config=dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32,
                                                                               SPLIT_K=2))
    with pytest.raises(ValueError, match="x_scale"):
        wq, ws = quant.quantize_fp8(w, "row")
        gemmkit.fused_gemm_a8w8_split_cat(wq[:5], wq, None, ws, y, 3, 16, 8)


# ---------------------------------------------------------------------------------------------
# custom ops


def _op_cases():
    M, I, H = 5, 32, 48
    x = randn(M, H, dtype=BF16)
    wgu, wd = randn(2 * I, H, dtype=BF16), randn(H, I, dtype=BF16)
    wq, ws = quant.quantize_fp8(wgu, "row")
    dq, ds = quant.quantize_fp8(wd, "row")
    ops = torch.ops.gemmkit
    return {
        "ff_gated": (ops.ff_a16w16_gated.default, (x, wgu, wd, "silu", None, "concat", None)),
        "ff_gated_separate": (ops.ff_a16w16_gated.default, (x, wgu[:I], wd, "relu", wgu[I:], "concat", FP32)),
        "ff": (ops.ff_a16w16.default, (x, wgu[:I], wd, "gelu_tanh", None)),
        "ff_fp8": (ops.ff_a8w8_gated.default, (x, wq, ws.reshape(-1), dq, ds.reshape(-1), "silu", None,
                                               "interleaved", None, True)),
        "mul_add": (ops.fused_gemm_a16w16_mul_add.default, (x, wgu, torch.rand(M, 1, device=DEVICE),
                                                            randn(M, 2 * I, dtype=BF16), None)),
        "split_cat": (ops.fused_gemm_split_cat.default, (x, wgu[:48], None, None, randn(M, 2, 8, dtype=BF16), 2, 16,
                                                         8, None)),
    }


@pytest.mark.parametrize("case", ["ff_gated", "ff_gated_separate", "ff", "ff_fp8", "mul_add", "split_cat"])
def test_custom_ops(case):
    op, args = _op_cases()[case]
    tests = ("test_schema", "test_autograd_registration", "test_faketensor")
    if case == "ff_fp8":
        tests = tests[1:]  # (torch.allclose does not take float8 tensors)
    # (test_faketensor compares the fake's shapes, dtypes and strides with the real outputs')
    assert set(torch.library.opcheck(op, args, test_utils=tests).values()) == {"SUCCESS"}


def test_compile_routes_to_custom_ops():
    M, I, H = 4, 32, 48
    x, wgu, wd = randn(M, H, dtype=BF16), randn(2 * I, H, dtype=BF16), randn(H, I, dtype=BF16)
    res = randn(M, H, dtype=BF16)

    def f(x, wgu, wd, res):
        h = gemmkit.ff_a16w16_gated(x, wgu, wd)
        return gemmkit.fused_gemm_a16w16_mul_add(h, torch.eye(H, dtype=BF16, device=DEVICE),
                                                 0.5, res)

    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(x, wgu, wd, res).graph_break_count == 0
    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True, backend="eager")(x, wgu, wd, res)
    torch.testing.assert_close(out, f(x, wgu, wd, res))


def test_mul_add_configs_leave_room_for_epilogue_inputs():
    """A persistent table config becomes one program per tile with a subtiled epilogue when the
    epilogue reads (M, N) inputs (their tiles need shared memory the persistent stages fill)."""
    from gemmkit.core.config import GemmConfig, with_epilogue_inputs

    persistent = GemmConfig(128, 256, 64, num_warps=8, TMA=True, PERSISTENT=True, STREAM_K=True)
    cfg = with_epilogue_inputs(persistent)
    assert (cfg.PERSISTENT, cfg.STREAM_K, cfg.EPILOGUE_SUBTILE) == (False, False, True)
    assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, cfg.TMA) == (128, 256, 64, True)
    plain = GemmConfig(64, 64, 64)
    assert with_epilogue_inputs(plain) is plain
