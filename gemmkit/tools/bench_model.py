"""`gemmkit bench-model`: a Llama-style decoder with random weights, its nn.Linear layers
converted by gemmkit.nn.convert per scheme, against the original (torch) model.

Per scheme: logit differences against the original (prefill, and one decode step), prefill
latency (batch 1) and decode-step latency (one token per sequence with a KV cache) eager,
torch.compile'd (fullgraph=True; graph breaks counted by torch._dynamo.explain) and captured in
a CUDA graph (decode). Without CUDA: a tiny model on the CPU under the Triton interpreter,
logit differences only.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .bench import _triton_version, append_markdown, commit_id, geomean

# logit error (norm of the difference over the reference's) a correct conversion stays under
TOLERANCE = {"bf16": 2e-2, "fp8": 0.15, "fp8_block": 0.15, "int8": 0.1, "int4": 0.4, "mxfp4": 0.4}  # (every scheme)
# ... at least this with MoE blocks: a token whose router scores of two experts differ by less than the two models'
# rounding takes another expert (a discrete jump). The converted experts are not the less exact ones: on the smoke
# model's experts one call measured 0.29% from a float64 reference against the torch form's 0.42%.
MOE_TOLERANCE = 0.06


def tolerance(scheme: str, cfg: ModelConfig) -> float:
    return max(TOLERANCE[scheme], MOE_TOLERANCE) if cfg.experts else TOLERANCE[scheme]


@dataclasses.dataclass
class ModelConfig:
    hidden: int = 4096
    intermediate: int = 14336
    heads: int = 32
    kv_heads: int = 8
    layers: int = 4
    vocab: int = 32000
    max_positions: int = 8192
    rope_theta: float = 500000.0
    eps: float = 1e-5
    experts: int = 0  # > 0: each block's MLP a sparse MoE block (router, top_k of `experts` gated MLPs)
    top_k: int = 2
    moe_intermediate: int = 0  # an expert's intermediate size (0: intermediate)


SMOKE = ModelConfig(hidden=64, intermediate=128, heads=4, kv_heads=2, layers=2, vocab=256, max_positions=64)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps, **factory):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim, **factory)), eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def _rotate(x, cos, sin):
    """RoPE (rotate-half form): x (B, H, S, D), cos/sin (S, D) or (B, 1, 1, D)."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, **factory):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.hidden // cfg.heads
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * self.head_dim, bias=False, **factory)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * self.head_dim, bias=False, **factory)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * self.head_dim, bias=False, **factory)
        self.o_proj = nn.Linear(cfg.heads * self.head_dim, cfg.hidden, bias=False, **factory)

    def forward(self, x, cos, sin, cache=None, pos=None):
        """x (B, S, hidden). Without cache: causal attention over x. With cache (k, v), each
        (B, kv_heads, L, head_dim): S = 1, the token at position pos ((1,) int64 tensor) is
        written to the cache and attends to positions <= pos (fixed shapes: capturable)."""
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if cache is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k_cache, v_cache = cache
            k_cache.index_copy_(2, pos, k)
            v_cache.index_copy_(2, pos, v)
            mask = (torch.arange(k_cache.shape[2], device=x.device) <= pos).view(1, -1)
            out = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, **factory):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False, **factory)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False, **factory)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False, **factory)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Experts(nn.Module):
    """The routed experts in transformers 5's form (MixtralExperts, Qwen3MoeExperts: 3-D gate_up_proj (E, 2I, H) =
    [gate; up], down_proj (E, H, I), act_fn), run as its "grouped_mm" implementation does (moe_ops.experts_torch:
    sort, index, torch._grouped_mm twice, weighted sum; no host synchronization, so CUDA graphs capture it)."""

    def __init__(self, cfg: ModelConfig, **factory):
        super().__init__()
        inter = cfg.moe_intermediate or cfg.intermediate
        self.gate_up_proj = nn.Parameter(torch.randn(cfg.experts, 2 * inter, cfg.hidden, **factory) * cfg.hidden ** -0.5)
        self.down_proj = nn.Parameter(torch.randn(cfg.experts, cfg.hidden, inter, **factory) * inter ** -0.5)
        self.act_fn = nn.SiLU()

    def forward(self, x, top_k_index, top_k_weights):
        from .moe_ops import experts_torch

        return experts_torch(x, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj)


class SparseMoE(nn.Module):
    """A Mixtral / Qwen3-MoE block: router logits, softmax, top-k renormalized, the experts (convert swaps the
    experts module for gemmkit.nn.MoEExperts; the router, a bare weight as transformers' TopKRouter, stays)."""

    def __init__(self, cfg: ModelConfig, **factory):
        super().__init__()
        self.top_k = cfg.top_k
        self.router = nn.Parameter(torch.randn(cfg.experts, cfg.hidden, **factory) * cfg.hidden ** -0.5)
        self.experts = Experts(cfg, **factory)

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(F.linear(flat, self.router).float(), dim=-1)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        return self.experts(flat, idx, top / top.sum(-1, keepdim=True)).view_as(x)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, **factory):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden, cfg.eps, **factory)
        self.attn = Attention(cfg, **factory)
        self.post_norm = RMSNorm(cfg.hidden, cfg.eps, **factory)
        self.mlp = SparseMoE(cfg, **factory) if cfg.experts else MLP(cfg, **factory)

    def forward(self, x, cos, sin, cache=None, pos=None):
        x = x + self.attn(self.input_norm(x), cos, sin, cache, pos)
        return x + self.mlp(self.post_norm(x))


class Decoder(nn.Module):
    """Llama-style decoder: embedding, blocks (RMSNorm, RoPE + GQA attention, SiLU-gated MLP or, cfg.experts > 0,
    a sparse MoE block of such experts), final norm, lm_head; every other projection an nn.Linear."""

    def __init__(self, cfg: ModelConfig, dtype=torch.bfloat16, device=None):
        super().__init__()
        factory = dict(dtype=dtype, device=device)
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden, **factory)
        self.blocks = nn.ModuleList(Block(cfg, **factory) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps, **factory)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False, **factory)
        head_dim = cfg.hidden // cfg.heads
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(cfg.max_positions, device=device, dtype=torch.float32), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().to(dtype), persistent=False)
        self.register_buffer("sin", angles.sin().to(dtype), persistent=False)
        self.requires_grad_(False)

    def prefill(self, tokens):
        """tokens (B, S) int64 -> logits (B, S, vocab), causal, no cache."""
        S = tokens.shape[1]
        cos, sin = self.cos[:S], self.sin[:S]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.norm(x))

    def decode(self, tokens, pos, caches):
        """tokens (B, 1), pos (1,) int64, caches: per block (k, v) (B, kv_heads, L, head_dim),
        updated at pos -> logits (B, 1, vocab)."""
        cos, sin = self.cos[pos], self.sin[pos]
        x = self.embed(tokens)
        for block, cache in zip(self.blocks, caches):
            x = block(x, cos, sin, cache, pos)
        return self.lm_head(self.norm(x))

    def new_caches(self, batch: int, length: int):
        """Random-filled KV caches (as if `length` tokens had been processed)."""
        c, p = self.cfg, self.cos
        shape = (batch, c.kv_heads, length, c.hidden // c.heads)
        return [(torch.randn(shape, dtype=p.dtype, device=p.device), torch.randn(shape, dtype=p.dtype, device=p.device))
                for _ in self.blocks]


def logit_diff(out, ref) -> dict:
    """max |out - ref| and the relative error ||out - ref|| / ||ref||."""
    d = out.float() - ref.float()
    return {"max_abs": d.abs().max().item(), "rel": (d.norm() / ref.float().norm().clamp_min(1e-30)).item()}


def accuracy(model, ref_model, prompt, decode_args) -> dict:
    """Logit differences of `model` against `ref_model` on a prefill and one decode step (each
    model gets its own copy of the caches)."""
    tokens, pos, caches = decode_args
    with torch.no_grad():
        row = {f"prefill_{k}": val for k, val in logit_diff(model.prefill(prompt), ref_model.prefill(prompt)).items()}
        out = model.decode(tokens, pos, [(k.clone(), v.clone()) for k, v in caches])
        ref = ref_model.decode(tokens, pos, [(k.clone(), v.clone()) for k, v in caches])
    row.update({f"decode_{k}": val for k, val in logit_diff(out, ref).items()})
    return row


def graph_breaks(fn, *args) -> int:
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args).graph_break_count


def build(scheme: str | None, base: nn.Module):
    """(model, row): the original model (scheme None) or a converted deep copy of it, and the
    start of its table row."""
    if scheme is None:
        return base, {"name": "torch (original)"}
    from .. import nn as gnn

    model = copy.deepcopy(base)
    report = gnn.convert(model, scheme)
    print(str(report).splitlines()[0] + (f", {len(report.experts)} MoE experts modules" if report.experts else ""),
          flush=True)
    return model, {"name": f"gemmkit {scheme}", "converted": len(report.converted) + len(report.experts)}


def measure(model, cfg, args, prompt) -> dict:
    """Latencies (µs) of prefill and decode steps: eager, compiled, CUDA graph."""
    from .timing import time_eager_us, time_graph_us

    row = {}
    prefill = lambda: model.prefill(prompt)  # noqa: E731
    decode_fns = {}
    for b in args.decode_batch:
        tokens = torch.randint(cfg.vocab, (b, 1), device="cuda")
        pos = torch.tensor([args.context], device="cuda")
        caches = model.new_caches(b, args.context + 1)
        decode_fns[b] = (tokens, pos, caches)
    with torch.no_grad():
        row["prefill_eager"] = time_eager_us([prefill], min_calls=3, min_ms=args.rep_ms, repeats=3)
        for b, (tokens, pos, caches) in decode_fns.items():
            step = lambda t=tokens, p=pos, c=caches: model.decode(t, p, c)  # noqa: E731
            row[f"decode{b}_eager"] = time_eager_us([step], min_ms=args.rep_ms, repeats=3)
            if not args.no_graph:
                row[f"decode{b}_graph"] = time_graph_us([step], rep_ms=args.rep_ms, retries=3)
        if not args.no_compile:
            row["graph_breaks"] = graph_breaks(model.decode, *decode_fns[args.decode_batch[0]]) + graph_breaks(
                model.prefill, prompt)
            torch._dynamo.reset()
            compiled = (torch.compile(f, fullgraph=True, dynamic=False) for f in (model.prefill, model.decode))
            cprefill, cdecode = compiled
            row["prefill_compiled"] = time_eager_us([lambda: cprefill(prompt)], min_calls=3, min_ms=args.rep_ms,
                                                    repeats=3)
            for b, (tokens, pos, caches) in decode_fns.items():
                row[f"decode{b}_compiled"] = time_eager_us([lambda: cdecode(tokens, pos, caches)], min_ms=args.rep_ms,
                                                           repeats=3)
    del decode_fns
    torch.cuda.empty_cache()
    return row


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def accuracy_lines(rows) -> list[str]:
    lines = ["| model | converted | prefill max abs | prefill rel | decode max abs | decode rel | graph breaks | check |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r.get('converted', '-')} | {_fmt(r.get('prefill_max_abs'), '.3g')} | "
                     f"{_fmt(r.get('prefill_rel'), '.2e')} | {_fmt(r.get('decode_max_abs'), '.3g')} | "
                     f"{_fmt(r.get('decode_rel'), '.2e')} | {r.get('graph_breaks', '-')} | "
                     f"{'ok' if r.get('ok', True) else 'FAIL'} |")
    return lines


def timing_lines(rows, args) -> list[str]:
    """One line per (model, phase): eager / compiled / graph µs and the speed-up over the
    original model in each mode."""
    base = rows[0]
    phases = [("prefill", f"prefill 1x{args.prefill}")] + [(f"decode{b}", f"decode b={b}, ctx {args.context}")
                                                            for b in args.decode_batch]
    modes = ("eager", "compiled", "graph")
    lines = ["| model | phase | " + " | ".join(f"{m} µs | {m} speed-up" for m in modes) + " |",
             "|---|---|" + "---|" * (2 * len(modes))]
    for r in rows:
        for key, label in phases:
            cells = []
            for m in modes:
                t, t0 = r.get(f"{key}_{m}"), base.get(f"{key}_{m}")
                cells += [_fmt(t, ".1f"), _fmt(t0 / t if t and t0 else None, ".2f")]
            lines.append(f"| {r['name']} | {label} | " + " | ".join(cells) + " |")
    speedups = [base[k] / r[k] for r in rows[1:] for k in r if k.endswith(("_eager", "_compiled", "_graph"))
                and k in base and r[k]]
    if speedups:
        lines += ["", f"geomean speed-up of the converted models over the original, all phases and modes: "
                      f"{geomean(speedups):.3f}"]
    return lines


def plot(rows, args, path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return
    phases = ["prefill"] + [f"decode{b}" for b in args.decode_batch]
    modes = [m for m in ("eager", "compiled", "graph") if any(f"{p}_{m}" in r for r in rows for p in phases)]
    fig, axes = plt.subplots(1, len(phases), figsize=(4.2 * len(phases), 3.4), squeeze=False)
    width = 0.8 / max(1, len(rows))
    for ax, phase in zip(axes[0], phases):
        for i, r in enumerate(rows):
            vals = [r.get(f"{phase}_{m}", 0) or 0 for m in modes]
            ax.bar([j + i * width for j in range(len(modes))], vals, width, label=r["name"])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(modes))], modes)
        ax.set_title(phase, fontsize=9)
        ax.set_ylabel("µs")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def smoke(args) -> int:
    """The CPU version: the tiny model under the Triton interpreter, logit differences only."""
    cfg, torch_dtype = SMOKE, torch.bfloat16
    if args.experts:  # (a few small experts)
        cfg = dataclasses.replace(SMOKE, experts=min(args.experts, 4), top_k=min(args.top_k, 4), moe_intermediate=32)
    torch.manual_seed(0)
    base = Decoder(cfg, torch_dtype)
    prompt = torch.randint(cfg.vocab, (1, 8))
    decode_args = (torch.randint(cfg.vocab, (2, 1)), torch.tensor([6]), base.new_caches(2, 8))
    rows = [{"name": "torch (original)", "ok": True}]
    for scheme in args.schemes:
        model, row = build(scheme, base)
        row.update(accuracy(model, base, prompt, decode_args))
        row["ok"] = max(row["prefill_rel"], row["decode_rel"]) < tolerance(scheme, cfg)
        rows.append(row)
    print("\n" + "\n".join(accuracy_lines(rows)))
    return 0 if all(r["ok"] for r in rows) else 1


def _hf_model(cfg: ModelConfig, dtype):
    """transformers' LlamaForCausalLM with the same sizes and random weights (prefill only)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        raise SystemExit("--hf needs transformers (pip install transformers)") from None
    hf = LlamaForCausalLM(LlamaConfig(hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
                                      num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                                      num_hidden_layers=cfg.layers, vocab_size=cfg.vocab,
                                      max_position_embeddings=cfg.max_positions, rope_theta=cfg.rope_theta,
                                      rms_norm_eps=cfg.eps)).to(dtype=dtype, device="cuda").eval()
    return _HFPrefill(hf)


class _HFPrefill(nn.Module):
    """A transformers causal LM with the Decoder's prefill(tokens) -> logits (deep-copyable)."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def prefill(self, tokens):
        return self.hf(tokens, use_cache=False).logits


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gemmkit bench-model", description=__doc__.split("\n\n")[0])
    d = ModelConfig()
    for flag, default in (("hidden", d.hidden), ("intermediate", d.intermediate), ("heads", d.heads),
                          ("kv-heads", d.kv_heads), ("layers", d.layers), ("vocab", d.vocab)):
        p.add_argument(f"--{flag}", type=int, default=default)
    p.add_argument("--experts", type=int, default=0,
                   help="> 0: each block's MLP a sparse MoE block of this many experts (Mixtral / Qwen3-MoE form)")
    p.add_argument("--top-k", type=int, default=2, help="experts per token (--experts)")
    p.add_argument("--moe-intermediate", type=int, default=0, help="an expert's intermediate size (0: --intermediate)")
    p.add_argument("--prefill", type=int, default=2048, help="prompt length of the batch-1 prefill")
    p.add_argument("--decode-batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--context", type=int, default=512, help="KV-cache length before the decode step")
    p.add_argument("--schemes", nargs="+", default=["bf16", "fp8", "int8"])
    p.add_argument("--rep-ms", type=float, default=50, help="minimum time of each timing loop")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--no-graph", action="store_true")
    p.add_argument("--hf", action="store_true", help="transformers' LlamaForCausalLM (prefill only) instead")
    p.add_argument("--plot", type=Path)
    p.add_argument("--markdown", type=Path, help="append the result as a section to this Markdown file")
    args = p.parse_args(argv)
    if min(args.prefill, args.context, *args.decode_batch) < 1:
        raise SystemExit("--prefill, --context and --decode-batch must be >= 1")
    if min(args.hidden, args.intermediate, args.heads, args.kv_heads, args.layers, args.vocab) < 1:
        raise SystemExit("--hidden, --intermediate, --heads, --kv-heads, --layers and --vocab must be >= 1")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        raise SystemExit("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    if args.experts < 0 or args.moe_intermediate < 0 or (args.experts and not 1 <= args.top_k <= args.experts):
        raise SystemExit("--experts and --moe-intermediate must be >= 0, --top-k in [1, --experts]")
    if args.experts and args.hf:
        raise SystemExit("--hf builds transformers' LlamaForCausalLM: no --experts")

    on_gpu = torch.cuda.is_available()
    if not on_gpu and "gemmkit.kernels.gemm" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined (gemmkit.nn defines them)
    from ..nn import SCHEMES

    unknown = [s for s in args.schemes if s not in SCHEMES]
    if unknown:
        raise SystemExit(f"--schemes: unknown {unknown}; known: {sorted(SCHEMES)}")
    if not on_gpu:
        print("No CUDA GPU found: gemmkit bench-model times a model on an NVIDIA GPU. Running a tiny model "
              f"({SMOKE.layers} layers, hidden {SMOKE.hidden}{', MoE' if args.experts else ''}) on the CPU under the Triton interpreter instead "
              "(logit differences only, no timing).\n", flush=True)
        return smoke(args)

    cfg = ModelConfig(args.hidden, args.intermediate, args.heads, args.kv_heads, args.layers, args.vocab,
                      max_positions=max(args.prefill, args.context + 1), experts=args.experts, top_k=args.top_k,
                      moe_intermediate=args.moe_intermediate)
    torch.manual_seed(0)
    base = _hf_model(cfg, torch.bfloat16) if args.hf else Decoder(cfg, torch.bfloat16, "cuda")
    if args.hf:  # the HF cache is not a fixed-shape tensor: prefill only
        args.decode_batch, args.no_graph = [], True
    prompt = torch.randint(cfg.vocab, (1, args.prefill), device="cuda")
    decode_args = None if args.hf else (torch.randint(cfg.vocab, (args.decode_batch[0], 1), device="cuda"),
                                        torch.tensor([args.context], device="cuda"),
                                        base.new_caches(args.decode_batch[0], args.context + 1))
    dev = torch.cuda.get_device_name()
    moe = (f", MoE: {cfg.experts} experts of intermediate {cfg.moe_intermediate or cfg.intermediate}, top-{cfg.top_k} "
           "(original: the grouped_mm experts form)" if cfg.experts else "")
    title = (f"gemmkit bench-model on {dev}: {cfg.layers} layers, hidden {cfg.hidden}, intermediate "
             f"{cfg.intermediate}, {cfg.heads}/{cfg.kv_heads} heads, vocab {cfg.vocab}{moe}, bf16; "
             f"torch {torch.__version__}, triton {_triton_version()}, commit {commit_id()}")
    print(title, flush=True)
    rows = []
    for scheme in [None, *args.schemes]:
        model, row = build(scheme, base)
        if scheme is not None:
            if decode_args is None:
                with torch.no_grad():
                    row.update({f"prefill_{k}": val for k, val in
                                logit_diff(model.prefill(prompt), base.prefill(prompt)).items()})
            else:
                row.update(accuracy(model, base, prompt, decode_args))
            row["ok"] = max(row.get("prefill_rel", 0), row.get("decode_rel", 0)) < tolerance(scheme, cfg)
        row.update(measure(model, cfg, args, prompt) if not args.hf else _measure_prefill(model, args, prompt))
        rows.append(row)
        print(f"{row['name']}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items() if isinstance(v, float)),
              flush=True)
        del model
        torch.cuda.empty_cache()
    lines = accuracy_lines(rows) + [""] + timing_lines(rows, args)
    print("\n" + "\n".join(lines))
    if args.plot:
        plot(rows, args, args.plot, title)
    if args.markdown:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        argv_used = argv if argv is not None else sys.argv[2:]
        section = [f"## bench-model on {dev}, {date}, commit {commit_id()}", "",
                   f"Command: `gemmkit bench-model {' '.join(argv_used)}`  ", title + ".", "",
                   "Logit differences against the original bf16 model; times in µs per call: eager (back-to-back "
                   "calls), compiled (torch.compile fullgraph, inductor), graph (CUDA-graph replay of the eager "
                   "decode step); speed-up = original model's time / this model's.", "", *lines, "", ""]
        append_markdown(args.markdown, "\n".join(section))
        print(f"appended to {args.markdown}")
    return 0 if all(r.get("ok", True) for r in rows) else 1


def _measure_prefill(model, args, prompt) -> dict:
    from .timing import time_eager_us

    with torch.no_grad():
        return {"prefill_eager": time_eager_us([lambda: model.prefill(prompt)], min_calls=3, min_ms=args.rep_ms,
                                               repeats=3)}
