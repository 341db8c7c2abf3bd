"""gemmkit.nn layers, convert() and the bench-model CPU smoke run."""

import copy
import io
import warnings

import pytest
import torch
from torch import nn

import gemmkit.nn as gnn
from gemmkit import quant
from conftest import DEVICE, ON_GPU, assert_compiles, TOL, assert_close, randn, reference, sizes

K, N = sizes((64, 48), (1024, 768))
LEAD = sizes((2, 3), (4, 33))
DT = torch.bfloat16


def _linear(k=K, n=N, bias=True, dtype=DT):
    return nn.Linear(k, n, bias=bias, device=DEVICE, dtype=dtype)


def _dequantized_reference(layer, x):
    """float64 result of what the layer computes: quantized activations and weights."""
    w = quant.dequantize(layer.weight, layer.weight_scale.view(-1, 1))
    if isinstance(layer, gnn.Int8Linear):
        xq, xs = quant.quantize_int8(x)
    elif layer.act_scale is None:
        xq, xs = quant.quantize_fp8(x)
    else:
        xq, xs = quant.quantize_fp8(x, "tensor", scale=layer.act_scale)
    return reference(quant.dequantize(xq, xs).reshape(-1, x.shape[-1]), w, layer.bias).reshape(*x.shape[:-1], -1)


LAYERS = {"bf16": (gnn.Linear, {}, TOL[DT]), "fp8": (gnn.FP8Linear, {}, 8e-2),
          "fp8_static": (gnn.FP8Linear, {"act_scale": 4.0 / 448}, 8e-2), "int8": (gnn.Int8Linear, {}, 3e-2)}


@pytest.mark.parametrize("kind", list(LAYERS))
@pytest.mark.parametrize("bias", [True, False])
def test_layer_matches_linear(kind, bias):
    cls, opts, tol = LAYERS[kind]
    lin = _linear(bias=bias)
    layer = cls.from_linear(lin, **opts)
    x = randn(*LEAD, K, dtype=DT)
    with torch.no_grad():
        out = layer(x)
        ref = reference(x.reshape(-1, K), lin.weight, lin.bias).reshape(*LEAD, N)
    assert out.shape == (*LEAD, N) and out.dtype == DT
    assert_close(out, ref, tol=tol)  # against the unquantized layer: the quantization error
    if kind != "bf16":  # against the same math on the quantized operands: the kernel's own error
        assert_close(out, _dequantized_reference(layer, x), dtype=DT)
    assert list(layer.parameters()) == []
    assert {n for n, _ in layer.named_buffers()} >= {"weight"} | ({"bias"} if bias else set())


@pytest.mark.parametrize("kind", list(LAYERS))
def test_state_dict_round_trip(kind):
    cls, opts, _ = LAYERS[kind]
    layer = cls.from_linear(_linear(), **opts)
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    buf.seek(0)
    fresh = cls(K, N, dtype=DT, device=DEVICE, **({"act_scale": 1.0} if "act_scale" in opts else {}))
    fresh.load_state_dict(torch.load(buf))
    for name, t in layer.state_dict().items():
        assert torch.equal(fresh.state_dict()[name].view(torch.uint8), t.view(torch.uint8)), name
    x = randn(3, K, dtype=DT)
    torch.testing.assert_close(fresh(x), layer(x), rtol=0, atol=0)
    if kind == "fp8":
        with pytest.raises(RuntimeError, match="act_scale"):  # a static layer's state into a dynamic one
            fresh.load_state_dict(cls.from_linear(_linear(), act_scale=0.01).state_dict())


def test_extra_repr():
    text = repr(gnn.FP8Linear.from_linear(_linear(), act_scale=0.01))
    for part in (f"in_features={K}", f"out_features={N}", "bias=True", "dtype=bfloat16", "fp8", "static"):
        assert part in text
    assert "int8" in repr(gnn.Int8Linear.from_linear(_linear())) and "a16w16" in repr(gnn.Linear.from_linear(_linear()))


def test_bad_input():
    layer = gnn.Int8Linear.from_linear(_linear())
    with pytest.raises(TypeError, match="dtype float16.*bfloat16"):
        layer(randn(2, K, dtype=torch.float16))
    with pytest.raises(ValueError, match=f"last dimension must be in_features = {K}"):
        layer(randn(2, K + 1, dtype=DT))
    with pytest.raises(ValueError, match="input is on meta"):
        layer(torch.empty(2, K, dtype=DT, device="meta"))
    with pytest.raises(TypeError, match="torch.Tensor"):
        layer([1.0] * K)
    with pytest.raises(TypeError, match="pass dtype="):
        gnn.Linear.from_linear(_linear(dtype=torch.float32))
    assert gnn.Linear.from_linear(_linear(dtype=torch.float32), dtype=DT).weight.dtype == DT
    with pytest.raises(ValueError, match="act_scale"):
        gnn.FP8Linear(K, N, act_scale=-1.0)
    with pytest.raises(ValueError, match="multiples of 16"):
        gnn.FP8Linear.from_linear(_linear(k=40))
    with pytest.raises(TypeError, match="dtype"):
        gnn.Linear(K, N, dtype=torch.float32)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = _linear(K, 2 * K)
        self.mlp = nn.ModuleDict({"gate": _linear(2 * K, 2 * K, bias=False), "down": _linear(2 * K, N)})
        self.head = _linear(N, 40)  # 40: not a multiple of 16

    def forward(self, x):
        return self.head(self.mlp["down"](torch.relu(self.mlp["gate"](self.up(x)))))


@pytest.mark.parametrize("scheme,tol", [("bf16", TOL[DT]), ("fp8", 0.1), ("int8", 4e-2)])
def test_convert(scheme, tol):
    model = _Model()
    orig = copy.deepcopy(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = gnn.convert(model, scheme, skip=["mlp.g*"])
    assert report.skipped == ["mlp.gate"] and type(model.mlp["gate"]) is nn.Linear
    if scheme == "bf16":
        assert report.converted == ["up", "mlp.down", "head"] and not report.unsupported and not caught
    else:
        assert report.converted == ["up", "mlp.down"] and list(report.unsupported) == ["head"]
        assert len(caught) == 1 and "head" in str(caught[0].message) and type(model.head) is nn.Linear
    assert isinstance(model.up, gnn.SCHEMES[scheme]) and isinstance(model.mlp["down"], gnn.SCHEMES[scheme])
    text = str(report)
    assert f"{len(report.converted)} converted, 1 skipped" in text and "mlp.gate" in text
    x = randn(*LEAD, K, dtype=DT)
    with torch.no_grad():
        assert_close(model(x), orig(x).double(), tol=tol)


def test_convert_skip_predicate_and_errors():
    model = _Model()
    report = gnn.convert(model, "bf16", skip=lambda name, m: m.bias is None or name == "head")
    assert sorted(report.skipped) == ["head", "mlp.gate"] and report.converted == ["up", "mlp.down"]
    with pytest.raises(ValueError, match="scheme='int3'"):
        gnn.convert(_Model(), "int3")
    with pytest.raises(TypeError, match="itself an nn.Linear"):
        gnn.convert(_linear(), "fp8")
    mha = nn.Sequential(nn.MultiheadAttention(K, 2, device=DEVICE, dtype=DT))
    with pytest.warns(UserWarning, match="subclass"):
        report = gnn.convert(mha, "bf16")
    assert list(report.unsupported) == ["0.out_proj"] and not report.converted


def test_convert_float32_layers_left_alone():
    """A float32 nn.Linear without dtype=: left alone and reported (not a half-converted model and an error);
    dtype= converts it; a dtype the kernels do not take is refused before any layer is replaced."""
    model = nn.Sequential(_linear(K, 32), _linear(32, 16, dtype=torch.float32))
    with pytest.warns(UserWarning, match="float32"):
        report = gnn.convert(model, "fp8")
    assert report.converted == ["0"] and list(report.unsupported) == ["1"] and type(model[1]) is nn.Linear
    model = nn.Sequential(_linear(K, 32), _linear(32, 16, dtype=torch.float32))
    with pytest.raises(TypeError, match="dtype=torch.float32"):
        gnn.convert(model, "fp8", dtype=torch.float32)
    assert all(type(m) is nn.Linear for m in model)
    assert gnn.convert(model, "int8", dtype=DT).converted == ["0", "1"]


def test_convert_shared_linear_stays_shared():
    """A linear held at two paths (tied / shared): one converted layer at both, skipped if either path is."""
    lin = _linear(K, 32)
    model = nn.ModuleDict({"a": lin, "b": lin, "c": _linear(K, 32)})
    report = gnn.convert(model, "int8")
    assert report.converted == ["a", "b", "c"] and model["a"] is model["b"] and type(model["a"]) is gnn.Int8Linear
    x = randn(3, K, dtype=DT)
    assert torch.equal(model["a"](x), model["b"](x))
    model = nn.ModuleDict({"a": lin, "b": lin})
    assert gnn.convert(model, "int8", skip=["b"]).skipped == ["a", "b"] and model["a"] is lin and model["b"] is lin


def test_convert_a_model_built_on_meta():
    """Built under torch.device("meta"), converted (the layers' form only: nothing to quantize), materialized with
    to_empty and loaded from the state_dict of the same model converted on a real device: the same results."""
    torch.manual_seed(0)
    real = nn.Sequential(_linear(K, 32), _linear(32, 16, bias=False))
    for scheme in ("fp8", "int8", "int4"):
        with torch.device("meta"):
            meta = nn.Sequential(nn.Linear(K, 32, dtype=DT), nn.Linear(32, 16, bias=False, dtype=DT))
        ref = copy.deepcopy(real)
        gnn.convert(ref, scheme, group_size=32) if scheme == "int4" else gnn.convert(ref, scheme)
        gnn.convert(meta, scheme, group_size=32) if scheme == "int4" else gnn.convert(meta, scheme)
        meta.to_empty(device=DEVICE)
        meta.load_state_dict(ref.state_dict())
        x = randn(3, K, dtype=DT)
        with torch.no_grad():
            assert torch.equal(meta(x), ref(x)), scheme
    with torch.device("meta"):
        static = gnn.FP8Linear(K, 32, act_scale=0.02)  # (its scale checked on the host)
    assert static.act_scale.is_meta


def test_state_dict_of_another_scheme_refused():
    """Keys and shapes match across schemes; the codes do not: loading an FP8 state_dict into an Int8Linear (or INT4
    into MXFP4) is an error, not a silent cast of the codes."""
    lin = _linear(K, 32)
    fp8 = gnn.FP8Linear.from_linear(lin)
    with pytest.raises(RuntimeError, match="codes"):
        gnn.Int8Linear(K, 32, device=DEVICE).load_state_dict(fp8.state_dict())
    int4 = gnn.Int4Linear.from_linear(lin, group_size=32, symmetric=True)
    with pytest.raises(RuntimeError, match="codes"):
        gnn.MXFP4Linear(K, 32, device=DEVICE).load_state_dict(int4.state_dict())
    again = gnn.FP8Linear(K, 32, device=DEVICE)  # (the bias may come in another float dtype: cast as usual)
    state = dict(fp8.state_dict(), bias=fp8.bias.float())
    again.load_state_dict(state)
    x = randn(3, K, dtype=DT)
    assert torch.equal(again(x), fp8(x))


def test_fuse_mlp_refuses_options_it_cannot_apply():
    model = nn.Sequential(_linear(K, 32))
    with pytest.raises(ValueError, match="fuse_mlp=True takes no options"):
        gnn.convert(model, "fp8", fuse_mlp=True, act_scale=0.02)
    assert type(model[0]) is nn.Linear


ALL_LAYERS = {"bf16": (gnn.Linear, {}), "fp8": (gnn.FP8Linear, {}), "fp8_static": (gnn.FP8Linear, {"act_scale": 0.02}),
              "int8": (gnn.Int8Linear, {}), "fp8_block": (gnn.BlockFP8Linear, {}),
              "int4": (gnn.Int4Linear, {"group_size": 32}), "mxfp4": (gnn.MXFP4Linear, {})}


@pytest.mark.parametrize("kind", list(ALL_LAYERS))
def test_dtype_moves_keep_the_formats(kind):
    """Module.to(dtype) / .half() / .float() would cast FP8 weights and float32 scales like any floating buffer: the
    layers keep their formats, and only the activations' dtype (and the bias, 16-bit weights) follows a bf16 /
    fp16 target; a float32 target changes nothing."""
    cls, options = ALL_LAYERS[kind]
    layer = cls.from_linear(_linear(K, 32), **options)
    x = randn(3, K, dtype=DT)
    with torch.no_grad():
        ref = layer(x)
        dtypes = {n: b.dtype for n, b in layer.named_buffers()}
        assert torch.equal(layer.to(DT)(x), ref)
        assert {n: b.dtype for n, b in layer.named_buffers()} == dtypes
        layer.half()
        assert layer.dtype == torch.float16 and layer.bias.dtype == torch.float16
        for n, b in layer.named_buffers():
            assert b.dtype == (torch.float16 if n == "bias" or (kind == "bf16" and n == "weight") else dtypes[n]), n
        assert_close(layer(x.half()), ref.double(), tol=2e-2)
        layer.float()
        assert layer.dtype == torch.float16 and {n: b.dtype for n, b in layer.named_buffers()}["bias"] == torch.float16
        half = {n: b.clone() for n, b in layer.named_buffers()}
        layer.to(torch.float8_e4m3fn)  # (a target the kernels do not take: nothing changes, no value rounded)
        assert all(torch.equal(b, half[n]) for n, b in layer.named_buffers())
        layer.bfloat16()
        assert {n: b.dtype for n, b in layer.named_buffers()} == dtypes and torch.equal(layer(x), ref)


def test_gated_mlp_dtype_moves_keep_fp8():
    mlp = gnn.GatedMLP(K, 32, scheme="fp8")
    mlp.load_gate_up(randn(64, K, dtype=torch.float32))
    mlp.half()
    assert mlp.dtype == torch.float16 and mlp.gate_up_weight.dtype == torch.float8_e4m3fn
    assert mlp.gate_up_scale.dtype == torch.float32


def _small_model():
    model = _Model()
    gnn.convert(model, "fp8", skip=["up", "mlp.gate", "head"])
    gnn.convert(model, "int8", skip=["mlp.*", "head"])  # up: int8, mlp.down: fp8, head: nn.Linear
    model.mlp["gate"] = gnn.FP8Linear.from_linear(model.mlp["gate"], act_scale=0.05)
    return model


@pytest.mark.parametrize("backend", sizes(["eager", "aot_eager"], ["eager", "aot_eager", "inductor"]))
def test_compile_model(backend):
    assert_compiles(_small_model(), randn(*LEAD, K, dtype=DT), backend)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_cuda_graph_capture():
    model = _small_model()
    x = randn(*LEAD, K, dtype=DT)
    with torch.no_grad():
        ref = model(x)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            model(x)  # warm-up: plans, compilation
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(x)
        x.copy_(randn(*LEAD, K, dtype=DT))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, model(x), rtol=0, atol=0)
        assert not torch.equal(out, ref)


@pytest.mark.skipif(not ON_GPU, reason="host synchronization is a CUDA notion")
def test_layers_never_synchronize():
    model = _small_model()
    x = randn(*LEAD, K, dtype=DT)
    with torch.no_grad():
        model(x)  # first calls build the plans
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            model(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_bench_model_smoke(capsys):
    from gemmkit import cli

    argv = ["bench-model", "--schemes", "fp8"]
    if ON_GPU:
        argv += ["--layers", "1", "--hidden", "256", "--intermediate", "512", "--heads", "4", "--kv-heads", "2",
                 "--vocab", "512", "--prefill", "64", "--decode-batch", "1", "4", "--context", "32", "--rep-ms", "2",
                 "--no-compile"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "gemmkit fp8" in out and "| ok |" in out and "FAIL" not in out
    assert ("No CUDA GPU" in out) != ON_GPU
    with pytest.raises(SystemExit):
        cli.main(["bench-model", "--schemes", "int3"])
    with pytest.raises(SystemExit, match="--heads"):
        cli.main(["bench-model", "--heads", "0"])


def test_bench_model_tolerates_every_scheme():
    """bench-model judges each scheme's logits by its own tolerance: one for every convert scheme."""
    from gemmkit.tools import bench_model

    assert set(bench_model.TOLERANCE) == set(gnn.SCHEMES)


def test_layers_in_a_training_step():
    """Buffers stay frozen; the bf16 layer passes the input's gradient on (adapters trained around it), the
    FP8 layer with a static activation scale refuses an input that requires grad (test_autograd_frozen: the
    dynamic 8-bit and the 4-bit layers pass it)."""
    lin = _linear()
    layer = gnn.Linear.from_linear(lin)
    x = randn(6, K, dtype=DT).requires_grad_()
    (gx,) = torch.autograd.grad(layer(x).float().square().sum(), x)
    xd = x.detach().double().requires_grad_()
    (rx,) = torch.autograd.grad(torch.nn.functional.linear(xd, lin.weight.double(), lin.bias.double()).square().sum(),
                                xd)
    assert_close(gx, rx, tol=2e-2)
    assert not any(b.requires_grad for b in layer.buffers()) and not list(layer.parameters())
    with pytest.raises(ValueError, match="requires grad"):  # (a static activation scale: x quantized outside)
        gnn.FP8Linear.from_linear(lin, act_scale=1.0)(x)
