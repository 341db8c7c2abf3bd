"""Grouped GEMM (mixture-of-experts): gemmkit.grouped_gemm_a16w16 / grouped_gemm_a8w8, gemmkit.moe."""

import pytest
import torch
from conftest import DEVICE, ON_GPU, assert_close, randn, reference, sizes

import gemmkit
from gemmkit import moe

CFG = sizes(dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16), dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4))
CFG_P = dict(CFG, PERSISTENT=True)
CFG_T = dict(CFG, TMA=True, PERSISTENT=True)  # descriptors over every expert's rows (A unless gathered, B)
T, K, N = sizes((19, 40, 24), (1000, 1024, 768))


def _route(kind, T, k, E):
    if kind == "random":
        return torch.randint(0, E, (T, k), device=DEVICE)
    if kind == "one":  # every token on expert E - 1 (others empty)
        return torch.full((T, k), E - 1, device=DEVICE)
    if kind == "skewed":  # expert 0 takes most, some experts empty
        ids = torch.randint(0, max(1, E // 2), (T, k), device=DEVICE)
        ids[torch.rand(T, k, device=DEVICE) < 0.7] = 0
        return ids
    raise AssertionError(kind)


def _ref(x, w, offsets, gather, bias=None, activation="none", x_scale=None, w_scale=None):
    """float64 (R, N) per sorted row."""
    o = offsets.tolist()
    R = gather.numel() if gather is not None else x.shape[0]
    out = torch.zeros(R, w.shape[1], dtype=torch.float64, device=x.device)
    for e in range(w.shape[0]):
        if o[e + 1] <= o[e]:
            continue
        rows = gather[o[e]:o[e + 1]].long() if gather is not None else torch.arange(o[e], o[e + 1], device=x.device)
        xs = None if x_scale is None else (x_scale.reshape(-1)[rows] if x_scale.numel() > 1 else x_scale)
        ws = None if w_scale is None else (w_scale[e].reshape(-1) if w_scale.numel() > 1 else w_scale)
        b = None if bias is None else (bias[e] if bias.ndim == 2 else bias)
        out[o[e]:o[e + 1]] = reference(x[rows], w[e], b, activation, xs, ws)
    return out


@pytest.mark.parametrize("k", [1, 8])
@pytest.mark.parametrize("routing", ["random", "one", "skewed"])
@pytest.mark.parametrize("cfg", [CFG, CFG_P, CFG_T], ids=["grid", "persistent", "tma"])
def test_gather_routing(k, routing, cfg):
    E = 6
    x, w = randn(T, K, dtype=torch.bfloat16), randn(E, N, K, dtype=torch.bfloat16)
    g, s, o = moe.sort_by_expert(_route(routing, T, k, E), E)
    y = gemmkit.grouped_gemm_a16w16(x, w, o, gather_idx=g, config=cfg)
    assert y.shape == (T * k, N)
    assert_close(y, _ref(x, w, o, g))


@pytest.mark.parametrize("cfg", [CFG, CFG_T], ids=["pointers", "tma"])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_sorted_rows_bias_sizes(activation, cfg):
    E = 4
    sizes_ = torch.tensor([0, 7, 0, T - 7], dtype=torch.int32, device=DEVICE)  # empty experts, ragged
    x, w = randn(T, K, dtype=torch.float16), randn(E, N, K, dtype=torch.float16)
    bias = randn(E, N, dtype=torch.float32)
    y = gemmkit.grouped_gemm_a16w16(x, w, m_sizes=sizes_, bias=bias, activation=activation, config=cfg)
    o = torch.tensor([0, 0, 7, 7, T], dtype=torch.int32, device=DEVICE)
    assert_close(y, _ref(x, w, o, None, bias, activation))
    y1 = gemmkit.grouped_gemm_a16w16(x, w[:1], torch.tensor([0, T], dtype=torch.int32, device=DEVICE),
                                     bias=bias[0], config=dict(cfg, PERSISTENT=True))  # one expert, shared (N,) bias
    assert_close(y1, reference(x, w[0], bias[0]))


@pytest.mark.parametrize("k", [1, 3])
def test_scatter_weighted_combine(k):
    E = 5
    x, w = randn(T, K, dtype=torch.bfloat16), randn(E, N, K, dtype=torch.bfloat16)
    ids = _route("random", T, k, E)
    weights = torch.rand(T, k, device=DEVICE)
    g, s, o = moe.sort_by_expert(ids, E)
    y = gemmkit.grouped_gemm_a16w16(x, w, o, gather_idx=g, scatter_idx=s, routing_weights=weights,
                                    out_dtype=torch.float32, config=CFG)
    ref = torch.zeros(T * k, N, dtype=torch.float64, device=DEVICE)
    ref[s.long()] = _ref(x, w, o, g) * weights.reshape(-1)[s.long()].double()[:, None]
    assert_close(y, ref, tol=1e-4)
    ref_tok = torch.stack([sum(weights[t, j].double() * reference(x[t:t + 1], w[ids[t, j]])[0] for j in range(k))
                           for t in range(T)])
    assert_close(y.view(T, k, N).sum(1), ref_tok, tol=1e-4)


def test_sort_by_expert():
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]], device=DEVICE)
    g, s, o = moe.sort_by_expert(ids, 4)
    assert o.tolist() == [0, 2, 3, 6, 6] and o.dtype == g.dtype == s.dtype == torch.int32
    assert s.tolist() == [1, 4, 3, 0, 2, 5] and g.tolist() == [0, 2, 1, 0, 1, 2]
    with pytest.raises(TypeError):
        moe.sort_by_expert(ids.float(), 4)


def _check_sorted(ids, E, g, s, o):
    """The sort's contract, from the ids alone: offsets count ids < e, each expert's rows hold its slots in flat
    order, gather = scatter // k."""
    flat, k = ids.reshape(-1).long().cpu(), ids.shape[1]
    g, s, o = g.cpu().long(), s.cpu().long(), o.cpu().long()
    assert o.tolist() == [int((flat < e).sum()) for e in range(E + 1)]
    for e in range(E):
        assert s[o[e]:o[e + 1]].tolist() == torch.nonzero(flat == e).flatten().tolist()
    lo, hi = int(o[0]), int(o[E])  # ids outside [0, E): rows before expert 0's / after the last expert's
    assert sorted(s[:lo].tolist()) == torch.nonzero(flat < 0).flatten().tolist()
    assert sorted(s[hi:].tolist()) == torch.nonzero(flat >= E).flatten().tolist()
    assert torch.equal(g, torch.div(s, max(k, 1), rounding_mode="floor"))


@pytest.mark.parametrize("T, k, E", [(1, 1, 1), (0, 4, 3), (5, 0, 3), (9, 2, 4), (37, 8, 128), (300, 2, 8),
                                     (256, 8, 256), (130, 3, 300)])
@pytest.mark.parametrize("blocks", ["single", "multi"])
def test_sort_by_expert_kernels(T, k, E, blocks, monkeypatch):
    """kernels/routing.py: one program, or (patched small blocks) the three launches over many blocks."""
    from gemmkit.ops import routing

    if blocks == "multi":
        monkeypatch.setattr(routing, "SINGLE_MAX", 16)
        monkeypatch.setattr(routing, "BLOCK_MIN", 64)
    routing._plans.clear()
    ids = _route("skewed" if T % 2 else "random", T, k, E)
    g, s, o = moe.sort_by_expert(ids, E)
    assert g.dtype == s.dtype == o.dtype == torch.int32 and g.shape == s.shape == (T * k,) and o.shape == (E + 1,)
    _check_sorted(ids, E, g, s, o)
    ref = routing.sort_by_expert_torch(ids.reshape(-1), E, k)
    assert all(torch.equal(a, b) for a, b in zip((g, s, o), ref))
    routing._plans.clear()


@pytest.mark.parametrize("blocks", ["single", "multi"])
def test_sort_by_expert_ids_outside(blocks, monkeypatch):
    """Ids < 0 sort before expert 0's rows and ids >= E after the last expert's (no GEMM reads those rows)."""
    from gemmkit.ops import routing

    if blocks == "multi":
        monkeypatch.setattr(routing, "SINGLE_MAX", 16)
        monkeypatch.setattr(routing, "BLOCK_MIN", 32)
        monkeypatch.setattr(routing, "BLOCK_MAX", 32)
    routing._plans.clear()
    ids = torch.randint(-3, 9, (70, 2), device=DEVICE)
    ids[0, 0], ids[1, 1] = -2**40, 2**40
    _check_sorted(ids, 6, *moe.sort_by_expert(ids, 6))
    routing._plans.clear()


def test_sort_by_expert_edge_inputs():
    """Unsigned 64-bit ids from 2**63 sort after every expert (not wrapped negative); the torch route orders ids
    outside [0, E) as the kernels do; complex ids and a bool num_experts are refused."""
    from gemmkit.ops import routing

    if hasattr(torch, "uint64"):
        ids = torch.tensor([[2**63 + 5, 1]], dtype=torch.uint64)
        g, s, o = moe.sort_by_expert(ids.to(DEVICE), 4)
        assert s.tolist() == [1, 0] and o.tolist() == [0, 0, 1, 1, 1]
    ids = torch.tensor([[-1, -5], [3, -2], [9, 8], [10, 0]], device=DEVICE)
    got = moe.sort_by_expert(ids, 8)
    assert all(torch.equal(a, b) for a, b in zip(got, routing.sort_by_expert_torch(ids.reshape(-1), 8, 2)))
    assert got[1].tolist() == [0, 1, 3, 7, 2, 4, 5, 6]
    with pytest.raises(TypeError, match="integer expert ids"):
        moe.sort_by_expert(ids.to(torch.complex64), 8)
    with pytest.raises(ValueError, match="num_experts"):
        moe.sort_by_expert(ids, True)


def test_sort_by_expert_torch_route():
    """More experts than the kernels' bins take the torch sort; so do CPU ids outside the interpreter."""
    from gemmkit.ops import routing

    E = routing.MAX_BINS
    ids = torch.randint(0, E, (33, 4), device=DEVICE)
    assert not routing.kernels_take(ids.reshape(-1), E) and routing.kernels_take(ids.reshape(-1), E - 2)
    _check_sorted(ids, E, *moe.sort_by_expert(ids, E))


@pytest.mark.parametrize("dtype, E", [(torch.uint8, 256), (torch.int8, 128), (torch.int16, 300)])
def test_sort_by_expert_narrow_ids(dtype, E):
    """Ids of a dtype that cannot hold num_experts: the offsets' bounds must not wrap around."""
    ids = torch.tensor([[0, E - 1], [E - 1, 1]], dtype=dtype, device=DEVICE)
    g, s, o = moe.sort_by_expert(ids, E)
    assert o[-3:].tolist() == [2, 2, 4] and o[:3].tolist() == [0, 1, 2] and s.tolist() == [0, 3, 1, 2]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8])
@pytest.mark.parametrize("w_scale_kind", ["channel", "expert", "tensor"])
def test_a8w8(dtype, w_scale_kind):
    E, k = 4, 2
    if dtype == torch.int8:
        x = torch.randint(-100, 100, (T, K), device=DEVICE, dtype=torch.int8)
        w = torch.randint(-100, 100, (E, N, K), device=DEVICE, dtype=torch.int8)
    else:
        x, w = randn(T, K, dtype=dtype), randn(E, N, K, dtype=dtype)
    xs = torch.rand(T, 1, device=DEVICE) + 0.5
    ws = {"channel": torch.rand(E, N, device=DEVICE), "expert": torch.rand(E, device=DEVICE),
          "tensor": torch.rand((), device=DEVICE)}[w_scale_kind] + 0.5
    g, s, o = moe.sort_by_expert(_route("skewed", T, k, E), E)
    cfg = dict(CFG, BLOCK_K=max(32, CFG["BLOCK_K"]))
    y = gemmkit.grouped_gemm_a8w8(x, w, xs, ws, o, gather_idx=g, out_dtype=torch.float32, config=cfg)
    assert_close(y, _ref(x.float(), w.float(), o, g, None, "none", xs, ws), tol=2e-3)
    xs_sorted = xs[g.long()]  # without gather: x in sorted order, per-row scales in sorted order
    y2 = gemmkit.grouped_gemm_a8w8(x[g.long()], w, xs_sorted, ws, o, out_dtype=torch.float32, config=cfg)
    assert_close(y2, y.double(), tol=1e-6)


@pytest.mark.parametrize("fused,cfg", [(False, None), (True, None), (True, "tma")])
def test_moe_mlp(fused, cfg):
    """The whole expert MLP, the gated activation in torch or (fused_activation) in the gate/up
    grouped GEMM's epilogue, against a float64 reference (intermediate rounded to bf16)."""
    Tm, H, I, E, k = sizes((9, 32, 16, 4, 2), (300, 1024, 512, 8, 2))
    x = randn(Tm, H, dtype=torch.bfloat16)
    wgu, wd = randn(E, 2 * I, H, dtype=torch.bfloat16, scale=0.2), randn(E, H, I, dtype=torch.bfloat16, scale=0.2)
    ids = torch.stack([torch.randperm(E, device=DEVICE)[:k] for _ in range(Tm)])
    tw = torch.softmax(torch.randn(Tm, k, device=DEVICE), -1)
    config = {None: None if ON_GPU else CFG, "tma": CFG_T}[cfg]
    y = moe.moe_mlp(x, ids, tw, wgu, wd, config=config, fused_activation=fused)
    ref = torch.zeros(Tm, H, dtype=torch.float64, device=DEVICE)
    for t in range(Tm):
        for j in range(k):
            e = ids[t, j]
            h = x[t].double() @ wgu[e].double().T
            a = (torch.nn.functional.silu(h[:I]) * h[I:]).to(torch.bfloat16).double()
            ref[t] += tw[t, j].double() * (a @ wd[e].double().T)
    assert_close(y, ref, tol=2e-2)


def test_scales_requiring_grad_refused():
    """gemmkit ops have no backward: scales that require grad are refused, as x and w are (the dense ops did)."""
    E = 3
    x, w = randn(T, K, dtype=torch.float8_e4m3fn), randn(E, N, K, dtype=torch.float8_e4m3fn)
    o = torch.tensor([0, 5, 9, T], dtype=torch.int32, device=DEVICE)
    xs, ws = torch.rand(T, 1, device=DEVICE), torch.rand(E, N, device=DEVICE)
    for bad in ((xs.clone().requires_grad_(), ws), (xs, ws.clone().requires_grad_())):
        with pytest.raises(ValueError, match="requires grad"):
            gemmkit.grouped_gemm_a8w8(x, w, *bad, o)
    xb, wb = randn(2, 4, K, dtype=torch.float8_e4m3fn), randn(2, N, K, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="requires grad"):
        gemmkit.batched_gemm_a8w8(xb, wb, torch.rand(2, 4, 1, device=DEVICE), torch.rand(2, N, device=DEVICE,
                                                                                          requires_grad=True))


def test_moe_mlp_bad_routing(monkeypatch):
    """Expert ids outside [0, E) cannot be checked without a host sync: GEMMKIT_DEBUG=1 raises for them; topk_weights
    of another dtype are refused by name."""
    E, I, H, Tm = 4, 16, 32, 3
    x, wgu, wd = randn(Tm, H, dtype=torch.bfloat16), randn(E, 2 * I, H, dtype=torch.bfloat16), \
        randn(E, H, I, dtype=torch.bfloat16)
    ids = torch.tensor([[0, 1], [E, 2], [-1, 3]], device=DEVICE)
    tw = torch.rand(Tm, 2, device=DEVICE)
    monkeypatch.setenv("GEMMKIT_DEBUG", "1")
    with pytest.raises(ValueError, match="topk_ids values"):
        moe.moe_mlp(x, ids, tw, wgu, wd)
    with pytest.raises(TypeError, match="topk_weights"):
        moe.moe_mlp(x, ids.clamp(0, E - 1), tw.double(), wgu, wd)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("cfg", [CFG, CFG_T], ids=["pointers", "tma"])
def test_grouped_gated(activation, cfg):
    """act(x @ gate^T) * (x @ up^T) per expert in one launch (gathered rows, skewed routing with
    empty experts); the gate / up halves of (E, 2I, K) weights through pointers or descriptors."""
    from gemmkit.ops import grouped

    E, I = 5, 24
    x = randn(T, K, dtype=torch.bfloat16)
    wgu = randn(E, 2 * I, K, dtype=torch.bfloat16, scale=K ** -0.5)
    g, _, o = moe.sort_by_expert(_route("skewed", T, 2, E), E)
    y = grouped.grouped_gated_a16w16(x, wgu, o, gather_idx=g, activation=activation, config=cfg)
    h = _ref(x, wgu, o, g)
    act = torch.nn.functional.silu if activation == "silu" else (
        lambda t: torch.nn.functional.gelu(t, approximate="tanh"))
    assert y.shape == (T * 2, I) and y.dtype == torch.bfloat16
    assert_close(y, act(h[:, :I]) * h[:, I:])
    if cfg is CFG_T:
        plan = [p for p in grouped._plans.values() if getattr(p, "epilogue", None) and p.epilogue.gated][-1]
        assert plan.b_desc is not None  # the gate / up views: one descriptor each over every expert's rows


def test_zero_rows_and_deterministic():
    E = 3
    x, w = randn(0, K, dtype=torch.bfloat16), randn(E, N, K, dtype=torch.bfloat16)
    o = torch.zeros(E + 1, dtype=torch.int32, device=DEVICE)
    assert gemmkit.grouped_gemm_a16w16(x, w, o).shape == (0, N)
    x = randn(T, K, dtype=torch.bfloat16)
    g, s, o = moe.sort_by_expert(_route("random", T, 2, E), E)
    wts = torch.rand(T, 2, device=DEVICE)
    a = gemmkit.grouped_gemm_a16w16(x, w, o, gather_idx=g, scatter_idx=s, routing_weights=wts, config=CFG)
    b = gemmkit.grouped_gemm_a16w16(x, w, o, gather_idx=g, scatter_idx=s, routing_weights=wts, config=CFG)
    assert torch.equal(a, b)


def test_bad_inputs(monkeypatch):
    E = 3
    x, w = randn(T, K, dtype=torch.bfloat16), randn(E, N, K, dtype=torch.bfloat16)
    o = torch.tensor([0, 5, 9, T], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="expert_offsets"):
        gemmkit.grouped_gemm_a16w16(x, w, o[:3])
    with pytest.raises(TypeError, match="expert_offsets"):
        gemmkit.grouped_gemm_a16w16(x, w, o.long())
    with pytest.raises(ValueError, match="exactly one"):
        gemmkit.grouped_gemm_a16w16(x, w)
    with pytest.raises(ValueError, match="w"):
        gemmkit.grouped_gemm_a16w16(x, w[0], o)
    with pytest.raises(ValueError, match="gather_idx"):
        gemmkit.grouped_gemm_a16w16(x, w, o, gather_idx=torch.zeros(3, 2, dtype=torch.int32, device=DEVICE))
    with pytest.raises(TypeError, match="scatter_idx"):
        gemmkit.grouped_gemm_a16w16(x, w, o, scatter_idx=torch.zeros(T, device=DEVICE))
    with pytest.raises(ValueError, match="routing_weights"):
        gemmkit.grouped_gemm_a16w16(x, w, o, routing_weights=torch.ones(T + 1, device=DEVICE))
    with pytest.raises(ValueError, match="bias"):
        gemmkit.grouped_gemm_a16w16(x, w, o, bias=torch.zeros(E + 1, N, device=DEVICE))
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match="expert_offsets"):
            gemmkit.grouped_gemm_a16w16(x, w, o.to("meta"))
    bad = torch.tensor([0, 9, 5, T], dtype=torch.int32, device=DEVICE)
    monkeypatch.setenv("GEMMKIT_DEBUG", "1")
    with pytest.raises(ValueError, match="non-decreasing"):
        gemmkit.grouped_gemm_a16w16(x, w, bad, config=CFG)
    with pytest.raises(ValueError, match="gather_idx values"):
        gemmkit.grouped_gemm_a16w16(x, w, o, gather_idx=torch.full((T,), T, dtype=torch.int32, device=DEVICE),
                                    config=CFG)
    monkeypatch.setenv("GEMMKIT_DEBUG", "0")
    gemmkit.grouped_gemm_a16w16(x, w, bad, config=CFG)  # unchecked: no sync, no error


@pytest.mark.parametrize("cfg,first", [(CFG, 0), (CFG_T, 0), (None, 0), (CFG, -5), (CFG_T, -5)],
                         ids=["pointers", "tma", "default", "pointers-negative", "tma-negative"])
def test_offsets_outside_the_rows(cfg, first):
    """Unchecked offsets outside [0, R] (no host sync reads them): the rows inside are computed as with the offsets
    clamped to [0, R], and none outside them is read or stored (kernels: an expert's row end at most R; the tl
    kernel, which explicit configs select, also clamps a negative start)."""
    E, R = 3, T
    x, w = randn(R, K, dtype=torch.bfloat16), randn(E, N, K, dtype=torch.bfloat16)
    o = torch.tensor([first, R // 3, R // 2, 3 * R], dtype=torch.int32, device=DEVICE)
    out = gemmkit.grouped_gemm_a16w16(x, w, o, config=cfg)
    assert_close(out, _ref(x, w, torch.tensor([0, R // 3, R // 2, R]), None))
    if first < 0:  # (m_sizes with a negative size: offsets from their running sum)
        sizes = torch.tensor([-2, R // 2 + 2, R - R // 2], dtype=torch.int32, device=DEVICE)
        out = gemmkit.grouped_gemm_a16w16(x, w, m_sizes=sizes, config=cfg)
        assert_close(out[:R // 2], _ref(x[:R // 2], w[:2], torch.tensor([0, 0, R // 2]), None))
        assert_close(out[R // 2:], _ref(x, w, torch.tensor([0, 0, R // 2, R]), None)[R // 2:])


# DeepSeek-V3 block scales ------------------------------------------------------------------------

def _block_quantized(E, N, K, T_):
    """FP8 x (T_, K) with 1x128 scales and w (E, N, K) with 128x128 scales (gemmkit.quant), and the
    float64 values they stand for."""
    from gemmkit import quant

    x16 = randn(T_, K, dtype=torch.float32)
    w16 = randn(E, N, K, dtype=torch.float32, scale=K ** -0.5)
    xq, xs = quant.quantize_fp8_blockwise(x16, (1, 128))
    wq = torch.empty(E, N, K, dtype=torch.float8_e4m3fn, device=DEVICE)
    ws = torch.empty(E, -(-N // 128), -(-K // 128), device=DEVICE)
    for e in range(E):
        wq[e], ws[e] = quant.quantize_fp8_blockwise(w16[e], (128, 128))
    xd = quant.dequantize_fp8_blockwise(xq, xs).double()
    wd = torch.stack([quant.dequantize_fp8_blockwise(wq[e], ws[e], (128, 128)) for e in range(E)]).double()
    return xq, xs, wq, ws, xd, wd


@pytest.mark.parametrize("shape", [(T, K, N), (T, 200, 150), (T, 96, 40)], ids=["sizes", "ragged", "k-lt-128"])
@pytest.mark.parametrize("cfg", [CFG, CFG_T], ids=["pointers", "tma"])
@pytest.mark.parametrize("x_scale_layout,routing", [("row", "random"), ("col", "skewed")])
def test_a8w8_blockscale(shape, cfg, x_scale_layout, routing):
    """1x128 activation and 128x128 per-expert weight scales applied per K block in the K loop:
    gathered rows (x scales read through them), weighted scattered rows, every expert in use or
    skewed routing with empty experts, ragged N and K, K < 128, row- and column-major x_scale,
    pointers and TMA (8 experts: the B descriptor's rows of the last ones lie past 128, where a
    scale looked up by descriptor row instead of column once read the next expert's)."""
    T_, K_, N_ = shape
    E, k = 8, 2
    xq, xs, wq, ws, xd, wd = _block_quantized(E, N_, K_, T_)
    if x_scale_layout == "col":
        xs = xs.t().contiguous().t()
    g, s, o = moe.sort_by_expert(_route(routing, T_, k, E), E)
    cfg = dict(cfg, BLOCK_K=max(32, min(128, cfg["BLOCK_K"])))
    bias = randn(E, N_, dtype=torch.float32)
    tw = torch.rand(T_, k, device=DEVICE)
    y = gemmkit.grouped_gemm_a8w8_blockscale(xq, wq, xs, ws, o, gather_idx=g, scatter_idx=s, routing_weights=tw,
                                             bias=bias, activation="silu", out_dtype=torch.float32, config=cfg)
    ref = torch.zeros(T_ * k, N_, dtype=torch.float64, device=DEVICE)
    h = _ref(xd, wd, o, g, bias.double(), "silu")
    ref[s.long()] = h * tw.reshape(-1)[s.long()].double()[:, None]
    assert_close(y, ref, tol=1e-4)
    y2 = gemmkit.grouped_gemm_a8w8_blockscale(xq[g.long()], wq, xs[g.long()], ws, o, config=cfg)  # sorted x
    assert y2.dtype == torch.bfloat16
    assert_close(y2, _ref(xd[g.long()], wd, o, None))


def test_a8w8_blockscale_derived_config_and_bad_inputs():
    E = 3
    xq, xs, wq, ws, xd, wd = _block_quantized(E, N, K, T)
    g, s, o = moe.sort_by_expert(_route("random", T, 2, E), E)
    if not ON_GPU:  # the derived config (from the interpreter's profile), as a GPU call would take it
        assert_close(gemmkit.grouped_gemm_a8w8_blockscale(xq, wq, xs, ws, o, gather_idx=g), _ref(xd, wd, o, g))
    G = -(-K // 128)
    with pytest.raises(ValueError, match="x_scale"):
        gemmkit.grouped_gemm_a8w8_blockscale(xq, wq, xs[:, :1].contiguous() if G > 1 else xs.repeat(1, 2), ws, o)
    with pytest.raises(ValueError, match="w_scale"):
        gemmkit.grouped_gemm_a8w8_blockscale(xq, wq, xs, ws[0], o)
    with pytest.raises(TypeError, match="w_scale"):
        gemmkit.grouped_gemm_a8w8_blockscale(xq, wq, xs, ws.double(), o)
    with pytest.raises(TypeError, match="x"):
        gemmkit.grouped_gemm_a8w8_blockscale(xd.to(torch.bfloat16), wq, xs, ws, o)
    with pytest.raises(ValueError, match="BLOCK_K"):
        gemmkit.grouped_gemm_a8w8_blockscale(xq, wq, xs, ws, o, config=dict(CFG, BLOCK_K=256))
    with pytest.raises(ValueError, match="K-contiguous"):
        wt = wq.transpose(1, 2).contiguous().transpose(1, 2)
        gemmkit.grouped_gemm_a8w8_blockscale(xq, wt, xs, ws, o)


@pytest.mark.parametrize("scheme", ["channel", "block"])
def test_moe_mlp_fp8(scheme):
    """moe_mlp with FP8 expert weights: per-channel scales (x and the intermediate quantized per
    token) or DeepSeek-V3 block scales (per 1x128 group), against a float64 reference of the
    dequantized weights and the same quantization of x and the intermediate."""
    from gemmkit import quant

    Tm, H, I, E, k = sizes((9, 160, 72, 4, 2), (300, 1024, 512, 8, 2))
    x = randn(Tm, H, dtype=torch.bfloat16)
    w1, w2 = randn(E, 2 * I, H, dtype=torch.float32, scale=H ** -0.5), randn(E, H, I, dtype=torch.float32,
                                                                            scale=I ** -0.5)
    if scheme == "block":
        q1 = [quant.quantize_fp8_blockwise(w1[e], (128, 128)) for e in range(E)]
        q2 = [quant.quantize_fp8_blockwise(w2[e], (128, 128)) for e in range(E)]
        deq = lambda q, s: quant.dequantize_fp8_blockwise(q, s, (128, 128))  # noqa: E731
        act_q = lambda t: quant.dequantize_fp8_blockwise(*quant.quantize_fp8_blockwise(t, (1, 128)))  # noqa: E731
    else:
        q1 = [quant.quantize_fp8(w1[e], "row") for e in range(E)]
        q2 = [quant.quantize_fp8(w2[e], "row") for e in range(E)]
        deq = lambda q, s: q.float() * s  # noqa: E731
        act_q = lambda t: quant.dequantize(*quant.quantize_fp8(t, "row"))  # noqa: E731
    wq1, ws1 = torch.stack([q for q, _ in q1]), torch.stack([s for _, s in q1])
    wq2, ws2 = torch.stack([q for q, _ in q2]), torch.stack([s for _, s in q2])
    if scheme == "channel":
        ws1, ws2 = ws1.reshape(E, 2 * I), ws2.reshape(E, H)
    ids = torch.stack([torch.randperm(E, device=DEVICE)[:k] for _ in range(Tm)])
    tw = torch.softmax(torch.randn(Tm, k, device=DEVICE), -1)
    y = moe.moe_mlp(x, ids, tw, wq1, wq2, w_gate_up_scale=ws1, w_down_scale=ws2,
                    config=None if ON_GPU else dict(CFG, BLOCK_K=32))
    assert y.shape == (Tm, H) and y.dtype == torch.bfloat16
    xd = act_q(x).double()
    ref = torch.zeros(Tm, H, dtype=torch.float64, device=DEVICE)
    for t in range(Tm):
        for j in range(k):
            e = ids[t, j]
            h = (xd[t] @ deq(wq1[e], ws1[e] if scheme == "block" else ws1[e][:, None]).double().T).to(torch.bfloat16)
            a = (torch.nn.functional.silu(h[:I].float()) * h[I:].float()).to(torch.bfloat16)
            ref[t] += tw[t, j].double() * (act_q(a[None])[0].double()
                                           @ deq(wq2[e], ws2[e] if scheme == "block" else ws2[e][:, None]).double().T)
    assert_close(y, ref, tol=3e-2)
    with pytest.raises(ValueError, match="w_down_scale"):
        moe.moe_mlp(x, ids, tw, wq1, wq2, w_gate_up_scale=ws1)
    with pytest.raises(ValueError, match="scale"):
        moe.moe_mlp(x, ids, tw, wq1, wq2)


def test_grouped_gated_derived_config_from_64_rows_per_expert():
    """With 64 or more rows per expert the gated grouped GEMM derives 128x128x64 tiles, 8 warps,
    3 stages, one program per tile (tuning/gated_grouped_probe_h100.txt), and stays correct."""
    from gemmkit.ops import grouped

    E, I, K_ = 2, 24, 48
    Tm = sizes(130, 1024)
    x = randn(Tm, K_, dtype=torch.bfloat16)
    wgu = randn(E, 2 * I, K_, dtype=torch.bfloat16, scale=K_ ** -0.5)
    g, _, o = moe.sort_by_expert(_route("random", Tm, 1, E), E)
    y = grouped.grouped_gated_a16w16(x, wgu, o, gather_idx=g)
    plan = [p for p in grouped._plans.values() if getattr(p, "epilogue", None) and p.epilogue.gated][-1]
    c = plan.cfg
    assert (c.BLOCK_M, c.BLOCK_N, c.BLOCK_K, c.num_warps, c.PERSISTENT) == (128, 128, 64, 8, False)
    h = _ref(x, wgu, o, g)
    assert_close(y, torch.nn.functional.silu(h[:, :I]) * h[:, I:])


@pytest.mark.parametrize("device_name", ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"])
def test_grouped_configs_are_valid_on_hopper(device_name):
    """The configs the grouped ops pick on Hopper (host side only) for the MoE models' experts at 1 to 4096 rows
    per expert: the fixed one-program-per-tile tiles replace a derived persistent config whole (Mixtral-8x7B's
    gated GEMM at 512 tokens, 128 rows per expert, derived a K-sliced last wave that made the replaced config
    invalid: ValueError before any launch)."""
    import dataclasses

    from gemmkit.core.device import known_device
    from gemmkit.core.formats import Scale, dense
    from gemmkit.ops.grouped import grouped_config

    dev = known_device(device_name)
    bf16, e4m3 = dense(torch.bfloat16), dense(torch.float8_e4m3fn, Scale.ROW)
    block_a = dense(torch.float8_e4m3fn, Scale.KBLOCK, 128)
    block_b = dense(torch.float8_e4m3fn, Scale.KBLOCK, 128, 128)
    shapes = [(14336, 4096), (4096, 14336), (2048, 7168), (7168, 2048), (768, 2048), (2048, 768)]
    for rows in (1, 8, 16, 63, 64, 128, 256, 512, 1024, 4096):
        for N, K in shapes:
            for kind, gated, a, b in [("a16w16", True, bf16, bf16), ("a16w16", False, bf16, bf16),
                                      ("a8w8", True, e4m3, e4m3), ("a8w8", False, e4m3, e4m3),
                                      ("a8w8_blockscale", False, block_a, block_b)]:
                cfg = grouped_config(kind, gated, None, rows, N, K, dev, a, b, 2)
                assert cfg == dataclasses.replace(cfg)  # (a valid config: __post_init__ checks it)
                if gated and rows >= 64 or kind == "a8w8_blockscale" and rows >= 8:
                    assert not cfg.PERSISTENT and not cfg.STREAM_K and cfg.SPLIT_K == 1


@pytest.mark.parametrize("device_name", ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"])
def test_batched_configs_are_valid_on_hopper(device_name):
    """The tl kernel's batched configs (the table's, else batched_derived) for bf16 and FP8 batches of 1 to 64 entries
    of 1 to 4096 rows on both Hopper tables (host side): valid configs, no exception."""
    from gemmkit.core.device import known_device
    from gemmkit.core.formats import Scale, dense
    from gemmkit.core.grouped import family_config_for

    dev = known_device(device_name)
    for a, b, table in [(dense(torch.bfloat16), dense(torch.bfloat16), "batched_a16w16"),
                        (dense(torch.float8_e4m3fn, Scale.ROW), dense(torch.float8_e4m3fn, Scale.ROW), None)]:
        for B in (1, 3, 8, 64):
            for M in (1, 17, 64, 128, 300, 777, 1024, 4096):
                for N, K in ((4096, 4096), (1000, 1040), (2048, 128), (128, 8192)):
                    cfg = family_config_for(None, M, N, K, dev, a, b, 2, table, batch=B)
                    assert cfg.BLOCK_M >= 16 and cfg.num_stages >= 1
