"""Tool ops of the MoE / batched family (grouped_a16w16, grouped_a8w8, moe_mlp, batched_a16w16).

Problem sizes stay (M, N, K) so bench and tune need nothing new:
- grouped_*: M = tokens T, (N, K) = one expert's weight; E experts and top-k from the op name's
  variant `<op>@<models.json entry>[:balanced|:zipf]` (the entry's "experts" / "top_k"; default
  E 8, top-2, balanced). Rows routed: T * k. FLOPs 2 T k N K; bytes: the expert weights touched
  by the routing, the gathered activations, the output. Tables are keyed by the average rows per
  expert ceil(T k / E) (ToolOp.table_m), what the op looks its config up with.
- moe_mlp: M = T, (N, K) = (intermediate I, hidden H) per expert (models.json "<model>-moe-mlp").
- batched_*: B problems of (M, N, K); B from the variant `@b<B>` (default 8).
- moe_sort: sort_by_expert of T = M tokens' routing (N, K unused: `--shape T 1`), against the torch sort with the
  same contract (ops/routing.sort_by_expert_torch).
Routing: "balanced" (round-robin: token t's slot j on expert (t k + j) mod E) or "zipf" (seeded:
expert e drawn with probability ~ 1 / (e + 1)^1.2, top-k distinct experts per token).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..core.formats import Scale, dense
from .registry import DTYPES, ToolOp

_F = torch.nn.functional
ZIPF_S = 1.2
SEED = 1234


def route(T: int, k: int, E: int, routing: str) -> torch.Tensor:
    """(T, k) int64 expert ids on the CPU, deterministic (seeded)."""
    if routing == "balanced":
        return (torch.arange(T * k) % E).view(T, k)
    if routing == "zipf":
        g = torch.Generator().manual_seed(SEED)
        p = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** ZIPF_S
        return torch.multinomial(p.expand(T, E), min(k, E), replacement=False, generator=g)
    raise SystemExit(f"routing must be 'balanced' or 'zipf', got {routing!r}")


def _randn(shape, dt, device, scale=1.0):
    return torch.randn(*shape, device=device, dtype=dt if dt.is_floating_point and dt.itemsize >= 2 else torch.bfloat16
                       ).mul_(scale)


@dataclass(frozen=True)
class MoEToolOp(ToolOp):
    """A grouped GEMM (or MoE block) over T tokens routed top-k among E experts."""

    experts: int = 8
    top_k: int = 2
    routing: str = "balanced"
    block: bool = False  # moe_mlp: (N, K) = (I, H), two grouped GEMMs
    inputs_for: object = None  # op -> make_inputs (bound again for each variant)

    def __post_init__(self):
        object.__setattr__(self, "make_inputs", self.inputs_for(self))

    def variant(self, spec: str) -> "MoEToolOp":
        from .registry import load_models

        model, _, routing = spec.partition(":")
        entry = load_models().get(model)
        if entry is None or "experts" not in entry:
            moe = [n for n, m in load_models().items() if "experts" in m]
            raise SystemExit(f"{self.name}@{spec}: unknown MoE model {model!r}; known: {', '.join(moe)}")
        route(1, 1, 1, routing or "balanced")  # checks the routing name
        return replace(self, name=f"{self.name}@{spec}", experts=entry["experts"], top_k=entry["top_k"],
                       routing=routing or "balanced")

    def ids(self, T):
        return route(T, self.top_k, self.experts, self.routing)

    def touched(self, T) -> int:
        """Experts with at least one routed row."""
        return int(torch.unique(self.ids(T)).numel())

    def table_m(self, M: int) -> int:
        return max(1, -(-M * self.top_k // self.experts))

    def problem_m(self, table_m: int) -> int:
        return max(1, table_m * self.experts // self.top_k)

    def flops(self, M, N, K) -> float:
        return 2.0 * M * self.top_k * N * K * (3 if self.block else 1)

    def rotation_bytes(self, M, N, K) -> float:
        """The touched experts' weights, not every expert's (the routing is the same in every input set)."""
        return self.nbytes(M, N, K)

    def nbytes(self, M, N, K) -> float:
        a, b = self.formats
        R, e = M * self.top_k, self.touched(M)
        if self.block:  # gate/up (2I, H) and down (H, I) per touched expert; x, the (R, 2I) and (R, I) intermediates
            return 3 * e * N * K * b.bytes + M * K * a.bytes + R * (3 * N + N) * 2 + R * K * 4 + M * K * self.out_bytes
        return e * N * K * b.bytes + R * K * a.bytes + R * N * self.out_bytes + 4 * R


def _sorted(ids, E, device):
    from ..moe import sort_by_expert

    g, s, o = sort_by_expert(ids.to(device), E)
    return {"ids": ids.to(device), "g": g, "s": s, "o": o, "offs": o[1:].contiguous()}


def _grouped_inputs(op):
    def make(M, N, K, dtype, device):
        E = op.experts
        dt = DTYPES[dtype]
        inp = _sorted(op.ids(M), E, device)
        x = _randn((M, K), dt, device)  # (bf16 for the FP8 op, quantized below)
        w = _randn((E, N, K), dt, device, K ** -0.5)
        if dt == torch.float8_e4m3fn:
            from ..quant import quantize_fp8

            xq, xs = quantize_fp8(x, "row")
            wq = torch.empty((E, N, K), dtype=torch.float8_e4m3fn, device=device)
            ws = torch.empty((E, N), dtype=torch.float32, device=device)
            for e in range(E):  # one expert at a time: no float32 copy of every weight (DeepSeek-V3: 7.5 G values)
                q, s = quantize_fp8(w[e], "row")
                wq[e], ws[e] = q, s.reshape(N)
            del w
            inp.update(x=xq, xs=xs.reshape(M).contiguous(), w=wq, ws=ws)
            inp["x_sorted"] = xq[inp["g"].long()]
            inp["xs_sorted"] = inp["xs"][inp["g"].long()]
        else:
            inp.update(x=x, w=w)
            inp["x_sorted"] = inp["x"][inp["g"].long()]
        return inp
    return make


def _grouped_run(inp, config=None):
    from ..ops.grouped import grouped_gemm_a16w16

    return grouped_gemm_a16w16(inp["x"], inp["w"], inp["o"], gather_idx=inp["g"], config=config)


def _grouped_torch(inp):
    return torch._grouped_mm(inp["x_sorted"], inp["w"].transpose(-2, -1), offs=inp["offs"], out_dtype=torch.bfloat16)


def _grouped_reference(inp):
    """float32, one expert's weight at a time (no float32 copy of all experts)."""
    x, w, o = inp["x"].float(), inp["w"], inp["o"].tolist()
    if "xs" in inp:
        x = x * inp["xs"][:, None]
    xs = x[inp["g"].long()]
    out = torch.empty(xs.shape[0], w.shape[1], device=x.device)
    for e in range(w.shape[0]):
        if o[e + 1] > o[e]:
            we = w[e].float() if "ws" not in inp else w[e].float() * inp["ws"][e][:, None]
            out[o[e]:o[e + 1]] = xs[o[e]:o[e + 1]] @ we.T
    return out


def _grouped_fp8_run(inp, config=None):
    from ..ops.grouped import grouped_gemm_a8w8

    return grouped_gemm_a8w8(inp["x"], inp["w"], inp["xs"], inp["ws"], inp["o"], gather_idx=inp["g"], config=config)


def _grouped_fp8_torch(inp):
    return torch._scaled_grouped_mm(inp["x_sorted"], inp["w"].transpose(-2, -1), inp["xs_sorted"], inp["ws"],
                                    offs=inp["offs"], out_dtype=torch.bfloat16, use_fast_accum=True)


# moe_sort: sort_by_expert of T = M tokens ---------------------------------------------------------

@dataclass(frozen=True)
class RoutingToolOp(MoEToolOp):
    """gemmkit.moe.sort_by_expert of M tokens' top-k ids among E experts (an elementwise op: no FLOPs; bytes: the
    int64 ids read, the two int32 index vectors and the offsets written). run / baseline / reference are bound to
    the variant's E, as make_inputs is."""

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "run", lambda inp, config=None: _sort(inp["ids"], self.experts))
        object.__setattr__(self, "baseline", lambda inp: _sort_torch(inp["ids"], self.experts))
        object.__setattr__(self, "reference", lambda inp: tuple(t.float() for t in _sort_torch(inp["ids"],
                                                                                               self.experts)))

    def flops(self, M, N, K) -> float:
        return 0.0

    def nbytes(self, M, N, K) -> float:
        return M * self.top_k * (8 + 4 + 4) + 4 * (self.experts + 1)


def _sort(ids, E):
    from ..moe import sort_by_expert

    return sort_by_expert(ids, E)


def _sort_torch(ids, E):
    """The torch sort with the same contract (ops/routing.sort_by_expert_torch: clamp, stable argsort, index,
    searchsorted, casts), what gemmkit ran before its kernels."""
    from ..ops.routing import sort_by_expert_torch

    return sort_by_expert_torch(ids.reshape(-1), E, ids.shape[1])


# moe_mlp: (M, N, K) = (T, I, H) -----------------------------------------------------------------

def _mlp_inputs(op):
    def make(M, N, K, dtype, device):
        E, dt = op.experts, DTYPES[dtype]
        ids = op.ids(M).to(device)
        g = torch.Generator().manual_seed(SEED)
        tw = torch.softmax(torch.randn(M, ids.shape[1], generator=g), -1).to(device)
        return {"x": _randn((M, K), dt, device), "ids": ids, "tw": tw,
                "w_gate_up": _randn((E, 2 * N, K), dt, device, K ** -0.5),
                "w_down": _randn((E, K, N), dt, device, N ** -0.5)}
    return make


def _mlp_run(inp, config=None, fused_activation=True):
    from ..moe import moe_mlp

    return moe_mlp(inp["x"], inp["ids"], inp["tw"], inp["w_gate_up"], inp["w_down"], config=config,
                   fused_activation=fused_activation)


def _mlp_torch(inp, reference=False):
    """The same block in torch (experts_torch; reference=True: float32 matmuls per expert instead)."""
    return experts_torch(inp["x"], inp["ids"], inp["tw"], inp["w_gate_up"], inp["w_down"], reference)


def experts_torch(x, ids, tw, wgu, wd, reference=False):
    """moe_mlp's block in torch ops, as transformers' "grouped_mm" experts implementation runs it: sort by expert,
    index, _grouped_mm, silu * mul, _grouped_mm, weighted sum over the k slots (no host synchronization unless
    reference=True: float32 matmuls per expert, in float32). x (T, H), ids / tw (T, k), wgu (E, 2I, H), wd (E, H, I)."""
    T, k = ids.shape
    E, H = wgu.shape[0], x.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    ends = torch.searchsorted(flat[order], torch.arange(1, E + 1, device=x.device, dtype=flat.dtype), right=False,
                              out_int32=True)
    xs = x[order // k]
    if reference:
        o = [0] + ends.tolist()  # float32, one expert at a time
        xs = xs.float()
        h = torch.cat([xs[o[e]:o[e + 1]] @ wgu[e].float().T for e in range(E)])
        gate, up = h.chunk(2, dim=-1)
        a = _F.silu(gate) * up
        y = torch.cat([a[o[e]:o[e + 1]] @ wd[e].float().T for e in range(E)])
    else:
        h = torch._grouped_mm(xs, wgu.transpose(-2, -1), offs=ends, out_dtype=x.dtype)
        gate, up = h.chunk(2, dim=-1)
        y = torch._grouped_mm(_F.silu(gate) * up, wd.transpose(-2, -1), offs=ends, out_dtype=x.dtype)
    out = torch.zeros(T * k, H, dtype=torch.float32, device=x.device)
    out[order] = y.float() * tw.reshape(-1)[order, None].float()
    out = out.view(T, k, H).sum(1)
    return out if reference else out.to(x.dtype)


# FP8 expert weights: moe_mlp with per-channel or block scales, grouped a8w8 with block scales ------

def _fp8_experts(E, N, K, device, block: bool):
    """(row-wise (E, N, K) fp8, its (E, N) scales, and where `block`, the 128x128-block quantized
    copy with (E, ceil(N/128), ceil(K/128)) scales) of random weights, one expert at a time (no
    float copy of every expert: DeepSeek-V3 holds 7.5 G values)."""
    from ..quant import quantize_fp8, quantize_fp8_blockwise

    wr = torch.empty((E, N, K), dtype=torch.float8_e4m3fn, device=device)
    sr = torch.empty((E, N), dtype=torch.float32, device=device)
    wb = torch.empty_like(wr) if block else None
    sb = torch.empty((E, -(-N // 128), -(-K // 128)), dtype=torch.float32, device=device) if block else None
    for e in range(E):
        w = _randn((N, K), torch.bfloat16, device, K ** -0.5)
        q, sc = quantize_fp8(w, "row")
        wr[e], sr[e] = q, sc.reshape(N)
        if block:
            wb[e], sb[e] = quantize_fp8_blockwise(w, (128, 128))
    return wr, sr, wb, sb


def _grouped_block_inputs(op):
    def make(M, N, K, dtype, device):
        from ..quant import quantize_fp8, quantize_fp8_blockwise

        inp = _sorted(op.ids(M), op.experts, device)
        x = _randn((M, K), torch.bfloat16, device)
        xq, xs = quantize_fp8_blockwise(x, (1, 128))
        xr, xrs = quantize_fp8(x, "row")
        wr, sr, wb, sb = _fp8_experts(op.experts, N, K, device, True)
        g = inp["g"].long()
        inp.update(x=xq, xs=xs, w=wb, ws=sb, x_sorted=xr[g], xs_sorted=xrs.reshape(M)[g].contiguous(), wr=wr, wrs=sr)
        return inp
    return make


def _grouped_block_run(inp, config=None):
    from ..ops.grouped import grouped_gemm_a8w8_blockscale

    return grouped_gemm_a8w8_blockscale(inp["x"], inp["w"], inp["xs"], inp["ws"], inp["o"], gather_idx=inp["g"],
                                        config=config)


def _grouped_block_torch(inp):
    """torch._scaled_grouped_mm row-wise on the same values quantized per token and channel."""
    return torch._scaled_grouped_mm(inp["x_sorted"], inp["wr"].transpose(-2, -1), inp["xs_sorted"], inp["wrs"],
                                    offs=inp["offs"], out_dtype=torch.bfloat16, use_fast_accum=True)


def _grouped_block_reference(inp):
    """float32 of the block-dequantized values, one expert at a time."""
    from ..quant import dequantize_fp8_blockwise

    xs = dequantize_fp8_blockwise(inp["x"], inp["xs"])[inp["g"].long()]
    o, w = inp["o"].tolist(), inp["w"]
    out = torch.empty(xs.shape[0], w.shape[1], device=xs.device)
    for e in range(w.shape[0]):
        if o[e + 1] > o[e]:
            out[o[e]:o[e + 1]] = xs[o[e]:o[e + 1]] @ dequantize_fp8_blockwise(w[e], inp["ws"][e], (128, 128)).T
    return out


def _mlp_fp8_inputs(op, block: bool):
    def make(M, N, K, dtype, device):
        E = op.experts
        ids = op.ids(M).to(device)
        g = torch.Generator().manual_seed(SEED)
        tw = torch.softmax(torch.randn(M, ids.shape[1], generator=g), -1).to(device)
        w1r, s1r, w1b, s1b = _fp8_experts(E, 2 * N, K, device, block)
        w2r, s2r, w2b, s2b = _fp8_experts(E, K, N, device, block)
        inp = {"x": _randn((M, K), torch.bfloat16, device), "ids": ids, "tw": tw, "w1r": w1r, "s1r": s1r,
               "w2r": w2r, "s2r": s2r}
        if block:
            inp.update(w1=w1b, s1=s1b, w2=w2b, s2=s2b)
        else:
            inp.update(w1=w1r, s1=s1r, w2=w2r, s2=s2r)
        return inp
    return make


def _mlp_fp8_run(inp, config=None):
    from ..moe import moe_mlp

    return moe_mlp(inp["x"], inp["ids"], inp["tw"], inp["w1"], inp["w2"], w_gate_up_scale=inp["s1"],
                   w_down_scale=inp["s2"], config=config)


def _mlp_fp8_torch(inp):
    """The FP8 row-wise block in torch: sort by expert, per-token quantize, index,
    _scaled_grouped_mm, silu * mul, quantize, _scaled_grouped_mm, weighted sum over k."""
    from .registry import _torch_quantize_rows

    x, ids, tw = inp["x"], inp["ids"], inp["tw"]
    T, k = ids.shape
    E, H = inp["w1r"].shape[0], x.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    ends = torch.searchsorted(flat[order], torch.arange(1, E + 1, device=x.device, dtype=flat.dtype),
                              out_int32=True)
    xq, xs = _torch_quantize_rows(x)
    rows = order // k
    h = torch._scaled_grouped_mm(xq[rows], inp["w1r"].transpose(-2, -1), xs.reshape(T)[rows], inp["s1r"], offs=ends,
                                 out_dtype=torch.bfloat16, use_fast_accum=True)
    gate, up = h.chunk(2, dim=-1)
    aq, as_ = _torch_quantize_rows(_F.silu(gate) * up)
    y = torch._scaled_grouped_mm(aq, inp["w2r"].transpose(-2, -1), as_.reshape(-1), inp["s2r"], offs=ends,
                                 out_dtype=torch.bfloat16, use_fast_accum=True)
    out = torch.zeros(T * k, H, dtype=torch.float32, device=x.device)
    out[order] = y.float() * tw.reshape(-1)[order, None].float()
    return out.view(T, k, H).sum(1).to(x.dtype)


def _mlp_fp8_reference(inp):
    """float32 of the weights gemmkit runs, dequantized (row-wise or block scales), activations
    unquantized."""
    from ..quant import dequantize_fp8_blockwise

    def weight(w, sc, e):
        if sc.ndim == 3:
            return dequantize_fp8_blockwise(w[e], sc[e], (128, 128))
        return w[e].float() * sc[e][:, None]

    x, ids, tw = inp["x"].float(), inp["ids"], inp["tw"]
    T, k = ids.shape
    out = torch.zeros(T, x.shape[1], device=x.device)
    for e in range(inp["w1"].shape[0]):
        t, j = (ids == e).nonzero(as_tuple=True)
        if t.numel():
            gate, up = (x[t] @ weight(inp["w1"], inp["s1"], e).T).chunk(2, dim=-1)
            y = (_F.silu(gate) * up) @ weight(inp["w2"], inp["s2"], e).T
            out.index_add_(0, t, y * tw[t, j, None].float())
    return out


# batched: B problems of (M, N, K) -----------------------------------------------------------------

@dataclass(frozen=True)
class BatchedToolOp(ToolOp):
    batch: int = 8
    inputs_for: object = None

    def __post_init__(self):
        object.__setattr__(self, "make_inputs", self.inputs_for(self))

    def variant(self, spec: str) -> "BatchedToolOp":
        if not (spec.startswith("b") and spec[1:].isdigit() and int(spec[1:]) > 0):
            raise SystemExit(f"{self.name}@{spec}: the variant is b<batch count>, e.g. {self.name}@b32")
        return replace(self, name=f"{self.name}@{spec}", batch=int(spec[1:]))

    def flops(self, M, N, K) -> float:
        return 2.0 * self.batch * M * N * K

    def nbytes(self, M, N, K) -> float:
        return self.batch * ToolOp.nbytes(self, M, N, K)


def _batched_inputs(op):
    def make(M, N, K, dtype, device):
        B, dt = op.batch, DTYPES[dtype]
        return {"x": _randn((B, M, K), dt, device), "w": _randn((B, N, K), dt, device, K ** -0.5)}
    return make


def _batched_run(inp, config=None):
    from ..ops.batched import batched_gemm_a16w16

    return batched_gemm_a16w16(inp["x"], inp["w"], config=config)


_BF16 = dense(torch.bfloat16)
_FP8_ROW = (dense(torch.float8_e4m3fn, Scale.ROW), dense(torch.float8_e4m3fn, Scale.ROW))

OPS = {
    "grouped_a16w16": MoEToolOp(
        "grouped_a16w16", ("bf16", "fp16"), None, _grouped_run, _grouped_torch,
        "torch._grouped_mm on x already sorted by expert (gemmkit gathers the rows itself)", _grouped_reference,
        1e-2, 2, 2, 16, "grouped_a16w16", formats=(_BF16, _BF16), reads=(("x", "w", "g", "o"), ("x_sorted", "w", "offs")),
        inputs_for=_grouped_inputs),
    "grouped_a8w8": MoEToolOp(
        "grouped_a8w8", ("e4m3",), None, _grouped_fp8_run, _grouped_fp8_torch,
        "torch._scaled_grouped_mm row-wise (use_fast_accum=True) on x already sorted by expert", _grouped_reference,
        1e-2, 1, 2, 8, "grouped_a8w8", formats=_FP8_ROW,
        reads=(("x", "xs", "w", "ws", "g", "o"), ("x_sorted", "xs_sorted", "w", "ws", "offs")),
        inputs_for=_grouped_inputs),
    "moe_mlp": MoEToolOp(
        "moe_mlp", ("bf16",), None, _mlp_run, _mlp_torch,
        "torch: argsort by expert, index, _grouped_mm, silu * mul, _grouped_mm, weighted sum over k",
        lambda i: _mlp_torch(i, reference=True), 2e-2, 2, 2, 16, None, formats=(_BF16, _BF16), block=True,
        inputs_for=_mlp_inputs),
    "moe_mlp_unfused": MoEToolOp(  # moe_mlp(fused_activation=False): the activation in torch
        "moe_mlp_unfused", ("bf16",), None, lambda inp, config=None: _mlp_run(inp, config, False), _mlp_torch,
        "torch: argsort by expert, index, _grouped_mm, silu * mul, _grouped_mm, weighted sum over k",
        lambda i: _mlp_torch(i, reference=True), 2e-2, 2, 2, 16, None, formats=(_BF16, _BF16), block=True,
        inputs_for=_mlp_inputs),
    "grouped_a8w8_blockscale": MoEToolOp(
        "grouped_a8w8_blockscale", ("e4m3",), None, _grouped_block_run, _grouped_block_torch,
        "torch._scaled_grouped_mm row-wise (use_fast_accum=True) on x already sorted, the same values quantized "
        "row-wise", _grouped_block_reference, 2e-2, 1, 2, 8, None,
        formats=(dense(torch.float8_e4m3fn, Scale.KBLOCK, 128), dense(torch.float8_e4m3fn, Scale.KBLOCK, 128, 128)),
        reads=(("x", "xs", "w", "ws", "g", "o"), ("x_sorted", "xs_sorted", "wr", "wrs", "offs")),
        inputs_for=_grouped_block_inputs),
    "moe_mlp_fp8": MoEToolOp(
        "moe_mlp_fp8", ("e4m3",), None, _mlp_fp8_run, _mlp_fp8_torch,
        "torch: argsort, per-token quantize, index, _scaled_grouped_mm, silu * mul, quantize, _scaled_grouped_mm, "
        "weighted sum over k", _mlp_fp8_reference, 8e-2, 2, 2, 8, None, formats=_FP8_ROW, block=True,
        inputs_for=lambda op: _mlp_fp8_inputs(op, False)),
    "moe_mlp_fp8_block": MoEToolOp(
        "moe_mlp_fp8_block", ("e4m3",), None, _mlp_fp8_run, _mlp_fp8_torch,
        "torch row-wise FP8 pipeline (argsort, quantize, _scaled_grouped_mm, silu * mul, quantize, "
        "_scaled_grouped_mm, weighted sum) on the same values", _mlp_fp8_reference, 8e-2, 2, 2, 8, None,
        formats=(dense(torch.float8_e4m3fn, Scale.KBLOCK, 128), dense(torch.float8_e4m3fn, Scale.KBLOCK, 128, 128)),
        block=True, inputs_for=lambda op: _mlp_fp8_inputs(op, True)),
    "moe_sort": RoutingToolOp(
        "moe_sort", ("int64",), None, None, None,
        "torch: clamp, stable argsort, index, searchsorted, casts", None, 1e-9, 8, 4, 16, None, gemm=False,
        inputs_for=lambda op: lambda M, N, K, dtype, device: {"ids": op.ids(M).to(device)}),
    "batched_a16w16": BatchedToolOp(
        "batched_a16w16", ("bf16", "fp16"), None, _batched_run, lambda i: torch.bmm(i["x"], i["w"].transpose(1, 2)),
        "torch.bmm (cuBLAS batched)", lambda i: i["x"].float() @ i["w"].float().transpose(1, 2), 1e-2, 2, 2, 16,
        "batched_a16w16", formats=(_BF16, _BF16), inputs_for=_batched_inputs),
}
