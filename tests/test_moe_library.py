"""MoE / batched family under torch.library and torch.compile: torch.ops.gemmkit.grouped_gemm_*,
batched_gemm_*, opcheck, fakes, fullgraph compile of sort_by_expert / moe_mlp with no graph
break; on the GPU: no host synchronization, CUDA-graph replay of moe_mlp with new routings."""

import pytest
import torch
from conftest import DEVICE, ON_GPU, assert_close, randn, sizes

import gemmkit
from gemmkit import library, moe  # noqa: F401  (registers torch.ops.gemmkit)
from gemmkit.core.outputs import batched_output, grouped_output

OPS = torch.ops.gemmkit
T, K, N, E, k = sizes((7, 32, 16, 3, 2), (300, 1024, 512, 8, 2))
B, M = 2, sizes(5, 200)
CFG = None if ON_GPU else dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)


def _routing(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(DEVICE)
    return ids, moe.sort_by_expert(ids, E)


def _cases():
    x, w = randn(T, K, dtype=torch.bfloat16), randn(E, N, K, dtype=torch.bfloat16)
    ids, (g, s, o) = _routing()
    tw = torch.rand(T, k, device=DEVICE)
    xi = torch.randint(-50, 50, (T, K), dtype=torch.int8, device=DEVICE)
    wi = torch.randint(-50, 50, (E, N, K), dtype=torch.int8, device=DEVICE)
    xs, ws = torch.rand(T, device=DEVICE) + 0.5, torch.rand(E, N, device=DEVICE) + 0.5
    xb, wb = randn(B, M, K, dtype=torch.bfloat16), randn(B, N, K, dtype=torch.bfloat16)
    xbi, wbi = (torch.randint(-50, 50, (B, r, K), dtype=torch.int8, device=DEVICE) for r in (M, N))
    bias = randn(E, N, dtype=torch.float32)
    sorted_o = torch.tensor([0] + [3] * (E - 1) + [T], dtype=torch.int32, device=DEVICE)  # x's rows sorted
    return {
        "grouped_a16w16_gather": (OPS.grouped_gemm_a16w16.default, (x, w, o, g, None, None, bias, "silu", None)),
        "grouped_a16w16_scatter": (OPS.grouped_gemm_a16w16.default, (x, w, o, g, s, tw, None, None, torch.float32)),
        "grouped_a16w16_sorted": (OPS.grouped_gemm_a16w16.default, (x, w, sorted_o, None, None, None, None,
                                                                    None, None)),
        "grouped_a8w8_int8": (OPS.grouped_gemm_a8w8.default, (xi, wi, xs, ws, o, g, None, None, None, "relu", None)),
        "grouped_a8w8_blockscale": (OPS.grouped_gemm_a8w8_blockscale.default,
                                    (x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn),
                                     torch.rand(T, -(-K // 128), device=DEVICE) + 0.5,
                                     torch.rand(E, -(-N // 128), -(-K // 128), device=DEVICE) + 0.5, o, g, s, tw, None,
                                     "relu", torch.float32)),
        "grouped_gated_a16w16": (OPS.grouped_gated_a16w16.default,
                                 (x, randn(E, 2 * N, K, dtype=torch.bfloat16), o, g, "silu")),
        "batched_a16w16": (OPS.batched_gemm_a16w16.default, (xb, wb, None, "relu", torch.float32)),
        "batched_a8w8_int8": (OPS.batched_gemm_a8w8.default, (xbi, wbi, torch.rand((), device=DEVICE),
                                                              torch.rand(B, device=DEVICE), None, None, None)),
    }


CASES = ["grouped_a16w16_gather", "grouped_a16w16_scatter", "grouped_a16w16_sorted", "grouped_a8w8_int8",
         "grouped_a8w8_blockscale", "grouped_gated_a16w16", "batched_a16w16", "batched_a8w8_int8"]


@pytest.mark.parametrize("case", CASES)
def test_opcheck_and_fake(case):
    op, args = _cases()[case]
    tests = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if any(isinstance(a, torch.Tensor) and a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) for a in args):
        tests = tests[1:]  # torch.allclose is not implemented for float8 (see test_library.test_opcheck)
    assert set(torch.library.opcheck(op, args, test_utils=tests).values()) == {"SUCCESS"}
    from torch._subclasses.fake_tensor import FakeTensorMode

    y = op(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    assert tuple(fake.shape) == tuple(y.shape) and fake.dtype == y.dtype and fake.stride() == y.stride()


def test_sort_by_expert_op_and_fake():
    ids, ref = _routing(3)
    args = (ids, E)
    tests = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    assert set(torch.library.opcheck(OPS.sort_by_expert.default, args, test_utils=tests).values()) == {"SUCCESS"}
    assert all(torch.equal(a, b) for a, b in zip(OPS.sort_by_expert(*args), ref))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = OPS.sort_by_expert(mode.from_tensor(ids), E)
    assert [(tuple(f.shape), f.dtype) for f in fake] == [(tuple(r.shape), r.dtype) for r in ref]


def test_output_shapes_do_not_depend_on_routing():
    assert grouped_output((5, 8), (3, 4, 8), None, None, torch.bfloat16) == ((5, 4), torch.bfloat16)
    assert grouped_output((5, 8), (3, 4, 8), (10,), torch.float32, torch.bfloat16) == ((10, 4), torch.float32)
    assert batched_output((2, 5, 8), (4, 8), None, torch.float16) == ((2, 5, 4), torch.float16)
    with pytest.raises(ValueError, match="K"):
        grouped_output((5, 8), (3, 4, 9), None, None, torch.bfloat16)
    with pytest.raises(ValueError, match="w has shape"):
        batched_output((2, 5, 8), (3, 4, 8), None, torch.float16)


def _program(x, ids, tw, wgu, wd, w, m_sizes):
    g, s, o = moe.sort_by_expert(ids, wgu.shape[0])
    y = moe.moe_mlp(x, ids, tw, wgu, wd)
    h = gemmkit.grouped_gemm_a16w16(x, w, o, gather_idx=g, scatter_idx=s, routing_weights=tw, out_dtype=torch.float32)
    z = gemmkit.grouped_gemm_a16w16(x, w, m_sizes=m_sizes, activation="relu")
    b = gemmkit.batched_gemm_a16w16(x.view(1, T, K).expand(2, T, K), w[:2])
    return y, h, z, b


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_no_graph_break(backend):
    x = randn(T, K, dtype=torch.bfloat16)
    ids, _ = _routing(1)
    tw = torch.softmax(torch.randn(T, k, device=DEVICE), -1)
    wgu, wd = randn(E, 2 * N, K, dtype=torch.bfloat16, scale=0.2), randn(E, K, N, dtype=torch.bfloat16, scale=0.2)
    w = randn(E, N, K, dtype=torch.bfloat16)
    m_sizes = torch.tensor([T - 3] + [1] * 3 + [0] * (E - 4), dtype=torch.int32, device=DEVICE)[:E]
    m_sizes[0] = T - int(m_sizes[1:].sum())
    args = (x, ids, tw, wgu, wd, w, m_sizes)
    ref = _program(*args)
    torch._dynamo.reset()
    assert torch._dynamo.explain(_program)(*args).graph_break_count == 0
    torch._dynamo.reset()
    out = torch.compile(_program, fullgraph=True, backend=backend)(*args)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch._dynamo.reset()


def test_compile_refuses_config():
    x, w = randn(T, K, dtype=torch.bfloat16), randn(E, N, K, dtype=torch.bfloat16)
    o = torch.tensor([0] + [T] * E, dtype=torch.int32, device=DEVICE)
    f = torch.compile(lambda x, w, o: gemmkit.grouped_gemm_a16w16(x, w, o, config=dict(BLOCK_M=16, BLOCK_N=16,
                                                                                       BLOCK_K=16)),
                      fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="config= is not supported under torch.compile"):
        f(x, w, o)
    torch._dynamo.reset()


def _moe_ref(x, ids, tw, wgu, wd):
    I = wd.shape[2]
    ref = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64, device=x.device)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            h = x[t].double() @ wgu[e].double().T
            a = (torch.nn.functional.silu(h[:I]) * h[I:]).to(x.dtype).double()
            ref[t] += tw[t, j].double() * (a @ wd[e].double().T)
    return ref


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs and sync debug mode need a GPU")
def test_cuda_graph_replay_new_routings_and_no_sync():
    x = randn(T, K, dtype=torch.bfloat16)
    wgu, wd = randn(E, 2 * N, K, dtype=torch.bfloat16, scale=0.05), randn(E, K, N, dtype=torch.bfloat16, scale=0.05)
    ids, _ = _routing(2)
    tw = torch.softmax(torch.randn(T, k, device=DEVICE), -1)
    w = randn(E, N, K, dtype=torch.bfloat16)
    moe.moe_mlp(x, ids, tw, wgu, wd)  # compile and plan outside the capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        g, s, o = moe.sort_by_expert(ids, E)
        gemmkit.grouped_gemm_a16w16(x, w, o, gather_idx=g, scatter_idx=s, routing_weights=tw)
        gemmkit.grouped_gemm_a16w16(x, w, m_sizes=torch.full((E,), T // E, dtype=torch.int32, device=DEVICE))
        moe.moe_mlp(x, ids, tw, wgu, wd)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = moe.moe_mlp(x, ids, tw, wgu, wd)
    for seed, skew in ((3, False), (4, True), (5, False)):
        new_ids, _ = _routing(seed)
        if skew:  # most tokens on expert 0, several experts empty
            new_ids[: T // 2, 0] = 0
            new_ids[: T // 2, 1] = 1
        ids.copy_(new_ids)
        tw.copy_(torch.softmax(torch.randn(T, k, device=DEVICE), -1))
        graph.replay()
        assert_close(y, _moe_ref(x, ids, tw, wgu, wd), tol=2e-2)


@pytest.mark.parametrize("scheme", ["channel", "block"])
def test_moe_mlp_fp8_compiles_fullgraph(scheme):
    """moe_mlp with FP8 weights traces without a graph break (quantizers and grouped GEMMs as
    torch.ops.gemmkit ops) and matches its eager result exactly."""
    from gemmkit import quant

    I = N
    x = randn(T, K, dtype=torch.bfloat16)
    ids, _ = _routing(2)
    tw = torch.softmax(torch.randn(T, k, device=DEVICE), -1)
    w1 = randn(E, 2 * I, K, dtype=torch.float32, scale=K ** -0.5)
    w2 = randn(E, K, I, dtype=torch.float32, scale=I ** -0.5)
    if scheme == "block":
        q1 = [quant.quantize_fp8_blockwise(w1[e], (128, 128)) for e in range(E)]
        q2 = [quant.quantize_fp8_blockwise(w2[e], (128, 128)) for e in range(E)]
    else:
        q1 = [quant.quantize_fp8(w1[e], "row") for e in range(E)]
        q2 = [quant.quantize_fp8(w2[e], "row") for e in range(E)]
    wq1, ws1 = torch.stack([q for q, _ in q1]), torch.stack([s for _, s in q1])
    wq2, ws2 = torch.stack([q for q, _ in q2]), torch.stack([s for _, s in q2])
    if scheme == "channel":
        ws1, ws2 = ws1.reshape(E, 2 * I), ws2.reshape(E, K)

    def program(x, ids, tw):
        return moe.moe_mlp(x, ids, tw, wq1, wq2, w_gate_up_scale=ws1, w_down_scale=ws2)

    ref = program(x, ids, tw)
    torch._dynamo.reset()
    assert torch._dynamo.explain(program)(x, ids, tw).graph_break_count == 0
    torch._dynamo.reset()
    out = torch.compile(program, fullgraph=True, backend="aot_eager")(x, ids, tw)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch._dynamo.reset()
