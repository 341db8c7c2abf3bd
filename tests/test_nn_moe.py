"""gemmkit.nn.MoEExperts and convert() on mixture-of-experts models (transformers' experts-module form)."""

import copy
import io

import pytest
import torch
from torch import nn

import gemmkit.nn as gnn
from gemmkit import quant
from conftest import DEVICE, ON_GPU, assert_compiles, assert_close, randn, sizes

E, H, I, T, TOPK = sizes((4, 32, 16, 9, 2), (8, 1024, 512, 300, 2))
DT = torch.bfloat16


class Experts(nn.Module):
    """The experts module of transformers 5's Mixtral / Qwen3-MoE (MixtralExperts): 3-D weights, its eager loop."""

    def __init__(self, e=E, h=H, i=I, dtype=DT, act=None):
        super().__init__()
        self.num_experts = e
        self.gate_up_proj = nn.Parameter(randn(e, 2 * i, h, dtype=dtype, scale=h ** -0.5))
        self.down_proj = nn.Parameter(randn(e, h, i, dtype=dtype, scale=i ** -0.5))
        self.act_fn = nn.SiLU() if act is None else act

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
        for e in range(self.num_experts):
            pos, tok = torch.where(mask[e])
            gate, up = nn.functional.linear(hidden_states[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
            h = nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e]) * top_k_weights[tok, pos, None]
            out.index_add_(0, tok, h.to(out.dtype))
        return out


class Router(nn.Module):
    """transformers 5's MixtralTopKRouter: softmax over the experts, top-k, renormalized."""

    def __init__(self, e=E, h=H, k=TOPK, dtype=DT):
        super().__init__()
        self.top_k, self.weight = k, nn.Parameter(randn(e, h, dtype=dtype))

    def forward(self, x):
        probs = torch.softmax(nn.functional.linear(x, self.weight).float(), dim=-1)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        return None, top / top.sum(-1, keepdim=True), idx


class SparseMoeBlock(nn.Module):
    def __init__(self, dtype=DT):
        super().__init__()
        self.gate, self.experts = Router(dtype=dtype), Experts(dtype=dtype)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        _, weights, idx = self.gate(x)
        return self.experts(x, idx, weights).reshape(shape)


class Model(nn.Module):
    def __init__(self, dtype=DT):
        super().__init__()
        self.up = nn.Linear(H, H, bias=False, device=DEVICE, dtype=dtype)
        self.moe = SparseMoeBlock(dtype)
        self.head = nn.Linear(H, 2 * H, device=DEVICE, dtype=dtype)

    def forward(self, x):
        return self.head(self.moe(self.up(x)))


def _routing(kind, t=T, k=TOPK, e=E):
    if kind == "distinct":
        ids = torch.stack([torch.randperm(e, device=DEVICE)[:k] for _ in range(t)])
    elif kind == "one":  # every token on the last expert (others empty; k = 1)
        ids = torch.full((t, 1), e - 1, device=DEVICE)
    else:  # skewed, an expert twice for some tokens
        ids = torch.randint(0, max(1, e // 2), (t, k), device=DEVICE)
    return ids, torch.softmax(torch.randn(*ids.shape, device=DEVICE), -1)


def _reference(ex, x, ids, tw, scheme):
    """float64 sum over the slots of what the scheme computes: FP8 weights dequantized, x and the intermediate
    quantized as moe_mlp quantizes them, the intermediate rounded to x's dtype."""
    if scheme == "bf16":
        wgu, wd, q = ex.gate_up_proj.double(), ex.down_proj.double(), lambda t: t.double()
    elif scheme == "fp8":
        m = gnn.MoEExperts.from_module(ex, scheme="fp8")
        wgu = m.gate_up_weight.double() * m.gate_up_scale.double()[:, :, None]
        wd = m.down_weight.double() * m.down_scale.double()[:, :, None]
        q = lambda t: quant.dequantize(*quant.quantize_fp8(t, "row")).double()  # noqa: E731
    else:
        m = gnn.MoEExperts.from_module(ex, scheme="fp8_block")
        deq = lambda w, s: quant.dequantize_fp8_blockwise(w, s, (128, 128)).double()  # noqa: E731
        wgu = torch.stack([deq(m.gate_up_weight[e], m.gate_up_scale[e]) for e in range(ex.num_experts)])
        wd = torch.stack([deq(m.down_weight[e], m.down_scale[e]) for e in range(ex.num_experts)])
        q = lambda t: quant.dequantize_fp8_blockwise(*quant.quantize_fp8_blockwise(t, (1, 128))).double()  # noqa
    n = wd.shape[2]
    xq = q(x)
    ref = torch.zeros(x.shape[0], wd.shape[1], dtype=torch.float64, device=x.device)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = (xq[t] @ wgu[e].T).to(x.dtype).double()
            a = (torch.nn.functional.silu(h[:n]) * h[n:]).to(x.dtype)
            ref[t] += float(tw[t, j]) * (q(a[None])[0] @ wd[e].T)
    return ref


@pytest.mark.parametrize("scheme,tol", [("bf16", 2e-2), ("fp8", 3e-2), ("fp8_block", 3e-2)])
@pytest.mark.parametrize("routing", ["distinct", "one", "skewed"])
def test_experts_match_the_module(scheme, tol, routing):
    """MoEExperts.from_module computes what the experts module does (every scheme, routings with empty experts, all
    tokens on one expert, an expert twice for a token), against a float64 reference of the scheme's numerics."""
    ex = Experts()
    m = gnn.MoEExperts.from_module(ex, scheme=scheme)
    x = randn(T, H, dtype=DT)
    ids, tw = _routing(routing)
    with torch.no_grad():
        y = m(x, ids, tw)
        assert y.shape == (T, H) and y.dtype == DT
        assert_close(y, _reference(ex, x, ids, tw, scheme), tol=tol)
        if scheme == "bf16":  # (and the module's own eager loop)
            assert_close(y, ex(x, ids, tw).double(), tol=tol)


def test_fp16_and_dtype_option():
    """fp16 experts; dtype= converts bf16 weights for fp16 activations."""
    ex = Experts(dtype=torch.float16)
    x = randn(T, H, dtype=torch.float16)
    ids, tw = _routing("distinct")
    with torch.no_grad():
        assert_close(gnn.MoEExperts.from_module(ex)(x, ids, tw), ex(x, ids, tw).double(), tol=2e-2)
        m = gnn.MoEExperts.from_module(Experts(), dtype=torch.float16)
        assert m.gate_up_weight.dtype == torch.float16 and m(x, ids, tw).dtype == torch.float16


def test_convert_moe_model():
    """convert() replaces the experts module by MoEExperts (the router stays the model's) and the linears by the
    scheme's layers; skip= and experts=False leave the experts; schemes without grouped kernels report them."""
    model = Model()
    x = randn(2, 5, H, dtype=DT)
    with torch.no_grad():
        ref = model(x)
        for scheme, tol in (("bf16", 2e-2), ("fp8", 0.1), ("fp8_block", 0.1)):
            m = copy.deepcopy(model)
            assert sorted(gnn.convert(m, scheme).converted) == ["head", "up"]
            # (the layer before the router left as it is: the routing then is the original's, not one a rounding
            # difference flips for a token between two experts of near scores)
            m = copy.deepcopy(model)
            report = gnn.convert(m, scheme, skip=["up"])
            assert report.experts == ["moe.experts"] and isinstance(m.moe.experts, gnn.MoEExperts)
            assert m.moe.experts.scheme == scheme and type(m.moe.gate) is Router
            assert report.converted == ["head"] and "MoE experts" in str(report)
            assert_close(m(x), ref.double(), tol=tol)
        m = copy.deepcopy(model)
        assert gnn.convert(m, "bf16", skip=["*.experts"]).skipped == ["moe.experts"]
        assert type(m.moe.experts) is Experts
        m = copy.deepcopy(model)
        assert gnn.convert(m, "bf16", experts=False).experts == [] and type(m.moe.experts) is Experts
        m = copy.deepcopy(model)
        with pytest.warns(UserWarning, match="no grouped kernels"):
            report = gnn.convert(m, "int8")
        assert "moe.experts" in report.unsupported and type(m.moe.experts) is Experts


def test_forms_it_cannot_take():
    """transformers' other experts layouts (transposed, biased, interleaved, ungated), other activations, ragged
    FP8 sizes: reasons, not wrong sums."""
    assert gnn.MoEExperts.unsupported(Experts()) is None
    for flag, value in (("is_transposed", True), ("has_bias", True), ("is_concatenated", False),
                        ("has_gate", False)):
        ex = Experts()
        setattr(ex, flag, value)
        assert flag in gnn.MoEExperts.unsupported(ex)
        with pytest.raises(ValueError, match=flag):
            gnn.MoEExperts.from_module(ex)
    assert "act_fn" in gnn.MoEExperts.unsupported(Experts(act=nn.ReLU()))
    assert "act_fn" in gnn.MoEExperts.unsupported(Experts(act=nn.GELU()))  # (exact GELU: not tanh)
    assert gnn.MoEExperts.unsupported(Experts(act=nn.GELU(approximate="tanh"))) is None
    assert "multiples of 16" in gnn.MoEExperts.unsupported(Experts(h=40, i=24), "fp8")
    assert gnn.MoEExperts.unsupported(Experts(h=40, i=24), "bf16") is None
    assert "float32" in gnn.MoEExperts.unsupported(Experts(dtype=torch.float32))
    assert gnn.MoEExperts.unsupported(Experts(dtype=torch.float32), dtype=DT) is None
    odd = Experts()
    odd.down_proj = nn.Parameter(randn(E, H, I + 1, dtype=DT))
    assert "(E, 2I, H)" in gnn.MoEExperts.unsupported(odd)
    assert "3-D" in gnn.MoEExperts.unsupported(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="scheme"):
        gnn.MoEExperts.from_module(Experts(), scheme="int4")


def test_bad_calls():
    m = gnn.MoEExperts.from_module(Experts())
    x = randn(T, H, dtype=DT)
    ids, tw = _routing("distinct")
    with torch.no_grad():
        with pytest.raises(TypeError, match="dtype"):
            m(x.half(), ids, tw)
        with pytest.raises(ValueError, match=r"\(T, "):
            m(x[None], ids, tw)
        with pytest.raises(ValueError, match="topk_ids"):
            m(x, ids[:-1], tw[:-1])
        with pytest.raises(TypeError, match="topk_weights"):
            m(x, ids, tw.double())
    with pytest.raises(RuntimeError, match="inference-only"):
        m(x.clone().requires_grad_(), ids, tw)
    with pytest.raises(ValueError, match="shape"):
        m.load(torch.zeros(E, 2 * I, H + 1), torch.zeros(E, H, I))
    with pytest.raises(TypeError, match="float"):
        m.load(torch.zeros(E, 2 * I, H, dtype=torch.int32), torch.zeros(E, H, I))
    for bad in (dict(scheme="int8"), dict(dtype=torch.float32), dict(activation="relu")):
        with pytest.raises((ValueError, TypeError)):
            gnn.MoEExperts(E, H, I, **bad)
    with pytest.raises(ValueError, match="multiples"):
        gnn.MoEExperts(E, 40, I, scheme="fp8")
    with pytest.raises(ValueError, match="positive"):
        gnn.MoEExperts(0, H, I)
    with torch.no_grad():
        assert m(x[:0], ids[:0], tw[:0]).shape == (0, H)  # (no tokens: no launch)


@pytest.mark.parametrize("scheme", ["bf16", "fp8", "fp8_block"])
def test_state_dict_and_dtype_moves(scheme):
    """A state_dict loads into an empty MoEExperts of the same form; .to(float16) moves 16-bit weights, FP8 codes and
    scales keep their dtypes; repr names the form."""
    m = gnn.MoEExperts.from_module(Experts(), scheme=scheme)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    fresh = gnn.MoEExperts(E, H, I, scheme=scheme, device=DEVICE)
    fresh.load_state_dict(torch.load(buf))
    x = randn(T, H, dtype=DT)
    ids, tw = _routing("distinct")
    with torch.no_grad():
        torch.testing.assert_close(fresh(x, ids, tw), m(x, ids, tw), rtol=0, atol=0)
        h = fresh.to(torch.float16)
        assert h.dtype == torch.float16
        assert h.gate_up_weight.dtype == (torch.float16 if scheme == "bf16" else torch.float8_e4m3fn)
        if scheme != "bf16":
            assert h.gate_up_scale.dtype == torch.float32
        assert h(x.half(), ids, tw).dtype == torch.float16
    assert f"scheme={scheme}" in repr(m) and f"num_experts={E}" in repr(m)


def test_meta_module_gives_the_form():
    with torch.device("meta"):
        ex = Experts.__new__(Experts)
        nn.Module.__init__(ex)
        ex.num_experts = E
        ex.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, H, dtype=DT))
        ex.down_proj = nn.Parameter(torch.empty(E, H, I, dtype=DT))
        ex.act_fn = nn.SiLU()
    m = gnn.MoEExperts.from_module(ex, scheme="fp8")
    assert m.gate_up_weight.is_meta and m.gate_up_weight.shape == (E, 2 * I, H)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_moe_model(backend):
    """A converted MoE model under torch.compile(fullgraph=True): no graph break (the routing sort and the grouped
    GEMMs are torch.ops.gemmkit ops with fakes)."""
    model = Model()
    gnn.convert(model, "bf16")
    assert_compiles(model, randn(2, 5, H, dtype=DT), backend)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_cuda_graph_with_new_routings():
    """A converted MoE block captured once and replayed with new inputs, hence new routings of the same token count
    (no host synchronization in the call)."""
    model = Model()
    gnn.convert(model, "bf16")
    x = randn(4, 64, H, dtype=DT)
    with torch.no_grad():
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            model(x)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(x)
        for _ in range(2):
            x.copy_(randn(4, 64, H, dtype=DT))
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(out, model(x), rtol=0, atol=0)


def test_bench_model_moe(capsys):
    """bench-model with sparse MoE blocks (--experts): the converted model's experts are MoEExperts, its logits within
    the MoE tolerance (CPU: the tiny model; GPU: a small one, timed)."""
    from gemmkit import cli

    argv = ["bench-model", "--schemes", "bf16", "fp8", "--experts", "8", "--top-k", "2"]
    if ON_GPU:
        argv += ["--layers", "1", "--hidden", "256", "--intermediate", "512", "--moe-intermediate", "128", "--heads",
                 "4", "--kv-heads", "2", "--vocab", "512", "--prefill", "64", "--decode-batch", "1", "4", "--context",
                 "32", "--rep-ms", "2", "--no-compile"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "2 MoE experts modules" in out or "1 MoE experts modules" in out
    assert "| ok |" in out and "FAIL" not in out
    for bad in (["--experts", "4", "--top-k", "5"], ["--experts", "-1"], ["--experts", "4", "--hf"]):
        with pytest.raises(SystemExit):
            cli.main(["bench-model", *bad])
