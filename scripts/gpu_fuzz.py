"""GPU fuzz (device tool): every public GEMM op on random problems that no issue names, against a
float32 reference of the same (dequantized) operands.

Sizes are drawn around the edges the kernels route on (M of 1 to 5000, near tile multiples and off
them; N and K ragged where the op allows, else multiples of what it requires), with random bias,
activation, output dtype, strided / transposed inputs and a NaN-poisoned preallocated output where
the op takes one. Every op also goes through the paths that launch differently: eager and
CUDA-graph replay for a few problems. An op that rejects a problem with ValueError / TypeError is
counted (and its message printed once): a rejection is right only where the docstring says so.
A result fails where max |out - ref| > TOL * max |ref| or it holds a NaN the reference does not.

Usage: python3 scripts/gpu_fuzz.py [OUT_FILE] [--trials N] [--seed S] [--cpu] [--op NAME ...] (--op last)
"""

import os
import random
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit import quant  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
out = open(args[0], "w") if args and "=" not in args[0] and not args[0].isdigit() and "/" in args[0] else sys.stdout
TRIALS = int(sys.argv[sys.argv.index("--trials") + 1]) if "--trials" in sys.argv else 40
SEED = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
ONLY = sys.argv[sys.argv.index("--op") + 1:] if "--op" in sys.argv else None
DEV = "cpu" if "--cpu" in sys.argv else "cuda"  # --cpu: a smoke run of the script under the interpreter
TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-2}
rng = random.Random(SEED)

M_EDGES = [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 129, 192, 255, 256,
           257, 300, 384, 511, 512, 513, 777, 1000, 1024, 1025, 1500, 2048, 2049, 3000, 4096, 5000]


def pick_m():
    if DEV == "cpu":
        return rng.choice([1, 3, 17, 33])
    return rng.choice(M_EDGES) if rng.random() < 0.8 else rng.randint(1, 3000)


def pick_dim(mult=1, lo=8, hi=8192, ragged_ok=True):
    """A size: mostly a multiple of `mult`, near powers of two or random; sometimes ragged."""
    r = rng.random()
    if r < 0.35:
        v = rng.choice([64, 128, 256, 512, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192])
    elif r < 0.8:
        v = rng.randint(lo, hi)
    else:
        v = rng.choice([16, 32, 48, 80, 96, 112, 136, 200, 264, 520, 1000, 1032, 3000, 4104])
    if DEV == "cpu":
        v = min(v, 256)
    if not ragged_ok or rng.random() < 0.7:
        v = max(mult, (v // mult) * mult)
    return max(lo if not ragged_ok else 1, v)


def act_ref(t, act):
    if act in (None, "none"):
        return t
    return {"relu": F.relu, "silu": F.silu, "gelu_tanh": lambda u: F.gelu(u, approximate="tanh")}[act](t)


def maybe_strided(t):
    """t, or the same values in a row-padded (stride > row length) view."""
    if t.dim() == 2 and rng.random() < 0.25:
        pad = rng.choice([8, 16, 64])
        big = torch.empty(t.shape[0], t.shape[1] + pad, dtype=t.dtype, device=t.device)
        big[:, :t.shape[1]] = t
        return big[:, :t.shape[1]]
    return t


def epilogue(N, dt):
    bias = torch.randn(N, device=DEV).to(rng.choice([dt, torch.float32])) if rng.random() < 0.4 else None
    act = rng.choice([None, None, "relu", "silu", "gelu_tanh"])
    return bias, act


def finish(ref, bias, act):
    if bias is not None:
        ref = ref + bias.float()
    return act_ref(ref, act)


def maybe_y(M, N, dt):
    if rng.random() < 0.3:
        return torch.full((M, N), float("nan"), dtype=dt, device=DEV)
    return None


# each case: () -> (call, reference fp32, output dtype, description)
def case_a16w16():
    M, N, K = pick_m(), pick_dim(8), pick_dim(8)
    dt = rng.choice([torch.bfloat16, torch.float16])
    x = maybe_strided(torch.randn(M, K, device=DEV).to(dt))
    w = torch.randn(N, K, device=DEV).to(dt) / K**0.5
    if rng.random() < 0.15:  # a transposed (column-major) weight view
        w = w.t().contiguous().t()
    bias, act = epilogue(N, dt)
    odt = rng.choice([None, None, torch.float32, torch.bfloat16])
    y = maybe_y(M, N, odt or dt)
    ref = finish(x.float() @ w.float().T, bias, act)
    return (lambda: gemmkit.gemm_a16w16(x, w, bias, activation=act, out_dtype=odt, y=y), ref, odt or dt,
            f"M={M} N={N} K={K} {dt} bias={bias is not None} act={act} out={odt} y={y is not None} "
            f"x_stride={x.stride()} w_stride={w.stride()}")


def case_a8w8():
    M, N, K = pick_m(), pick_dim(16), pick_dim(16)
    kind = rng.choice(["e4m3", "e4m3", "e5m2", "int8", "dynamic"])
    bias, act = epilogue(N, torch.bfloat16)
    odt = rng.choice([torch.bfloat16, torch.float16, torch.float32])
    x16 = torch.randn(M, K, device=DEV)
    w16 = torch.randn(N, K, device=DEV) / K**0.5
    fast = rng.random() < 0.7
    if kind == "int8":
        xq, xs = quant.quantize_int8(x16)
        wq, ws = quant.quantize_int8(w16)
    elif kind == "dynamic":
        xq, xs = x16.bfloat16(), None
        wq, ws = quant.quantize_fp8(w16)
    else:
        qd = torch.float8_e4m3fn if kind == "e4m3" else torch.float8_e5m2
        gran = rng.choice(["row", "tensor"])
        xq, xs = quant.quantize_fp8(x16, gran, dtype=qd)
        wq, ws = quant.quantize_fp8(w16, rng.choice(["row", "tensor"]), dtype=qd)
    if kind == "dynamic":
        xr = quant.quantize_fp8(x16.bfloat16().float())
        xref = quant.dequantize(*xr)
    else:
        xref = quant.dequantize(xq, xs)
    ws_arg = ws.reshape(1, -1) if ws.numel() > 1 and rng.random() < 0.5 else ws
    ref = finish(xref @ quant.dequantize(wq, ws).T, bias, act)
    y = maybe_y(M, N, odt)
    # dynamic: an eager call whose config splits K quantizes each K piece of a row with its own scale (documented:
    # tuning/README.md, fuzz/dynamic_paths), the reference the whole row with one: two valid roundings of x, measured
    # up to 3e-2 of max |ref| apart (2.6e-2 in the seed-43 run), hence 4e-2 there whatever the output dtype
    return (lambda: gemmkit.gemm_a8w8(xq, wq, xs, ws_arg, bias, activation=act, out_dtype=odt, y=y,
                                      fast_accum=fast), ref, odt,
            f"M={M} N={N} K={K} {kind} ws={tuple(ws_arg.shape)} fast={fast} bias={bias is not None} act={act} "
            f"out={odt} y={y is not None}", max(4e-2, TOL[odt]) if kind == "dynamic" else TOL[odt])


def case_blockscale():
    M, N, K = pick_m(), pick_dim(16), pick_dim(16)
    dynamic = rng.random() < 0.3
    bias, act = epilogue(N, torch.bfloat16)
    odt = rng.choice([torch.bfloat16, torch.float16, torch.float32])
    x16 = torch.randn(M, K, device=DEV).bfloat16()
    w16 = torch.randn(N, K, device=DEV) / K**0.5
    wq, ws = quant.quantize_fp8_blockwise(w16, block=(128, 128))
    xq, xs = quant.quantize_fp8_blockwise(x16, block=(1, 128))
    xref = quant.dequantize_fp8_blockwise(xq, xs, block=(1, 128))
    ref = finish(xref @ quant.dequantize_fp8_blockwise(wq, ws, block=(128, 128)).T, bias, act)
    if dynamic:
        xa, xsa = x16, None
    else:
        xa, xsa = xq, (xs.t().contiguous().t() if rng.random() < 0.5 else xs)
    y = maybe_y(M, N, odt)
    return (lambda: gemmkit.gemm_a8w8_blockscale(xa, wq, xsa, ws, bias, activation=act, out_dtype=odt, y=y),
            ref, odt, f"M={M} N={N} K={K} dynamic={dynamic} x_scale_stride={None if xsa is None else xsa.stride()} "
                      f"bias={bias is not None} act={act} out={odt} y={y is not None}")


def case_a16w4():
    group = rng.choice([32, 64, 128, 128, 128, -1])
    M = pick_m()
    N = pick_dim(1, hi=8192)
    K = pick_dim(128 if group == -1 else group, lo=128, hi=8192, ragged_ok=False)
    if group == -1:
        K = max(32, (K // 32) * 32)
    dt = rng.choice([torch.bfloat16, torch.bfloat16, torch.float16])
    sym = rng.random() < 0.3
    w = torch.randn(N, K, device=DEV) / K**0.5
    wq, wsc, wz = quant.quantize_int4(w, None if group == -1 else group, symmetric=sym)
    g = K if group == -1 else group
    wref = quant.dequantize_int4(wq, wsc, wz, g)
    x = maybe_strided(torch.randn(M, K, device=DEV).to(dt))
    bias, act = epilogue(N, dt)
    odt = rng.choice([None, None, torch.float32])
    y = maybe_y(M, N, odt or dt)
    ref = finish(x.float() @ wref.T, bias, act)
    return (lambda: gemmkit.gemm_a16w4(x, wq, wsc, wz, group_size=None if group == -1 else group, bias=bias, activation=act,
                                       out_dtype=odt, y=y), ref, odt or dt,
            f"M={M} N={N} K={K} group={group} sym={sym} {dt} bias={bias is not None} act={act} out={odt} "
            f"y={y is not None} x_stride={x.stride()}")


def case_a16wfp4():
    M, N = pick_m(), pick_dim(1, hi=8192)
    K = pick_dim(32, lo=32, hi=8192, ragged_ok=False)
    w = torch.randn(N, K, device=DEV) / K**0.5
    wq, wsc = quant.quantize_mxfp4(w)
    x = maybe_strided(torch.randn(M, K, device=DEV).bfloat16())
    bias, act = epilogue(N, torch.bfloat16)
    y = maybe_y(M, N, torch.bfloat16)
    ref = finish(x.float() @ quant.dequantize_mxfp4(wq, wsc).T, bias, act)
    return (lambda: gemmkit.gemm_a16wfp4(x, wq, wsc, bias=bias, activation=act, y=y), ref, torch.bfloat16,
            f"M={M} N={N} K={K} bias={bias is not None} act={act} y={y is not None}")


def case_afp4wfp4():
    M, N = pick_m(), pick_dim(1, hi=8192)
    K = pick_dim(32, lo=32, hi=8192, ragged_ok=False)
    wq, wsc = quant.quantize_mxfp4(torch.randn(N, K, device=DEV) / K**0.5)
    xq, xsc = quant.quantize_mxfp4(torch.randn(M, K, device=DEV))
    bias, act = epilogue(N, torch.bfloat16)
    ref = finish(quant.dequantize_mxfp4(xq, xsc) @ quant.dequantize_mxfp4(wq, wsc).T, bias, act)
    return (lambda: gemmkit.gemm_afp4wfp4(xq, wq, xsc, wsc, bias=bias, activation=act), ref, torch.bfloat16,
            f"M={M} N={N} K={K} bias={bias is not None} act={act}")


def case_batched():
    B = rng.choice([1, 2, 3, 4, 8, 16])
    M, N, K = min(pick_m(), 2048), pick_dim(8, hi=4096), pick_dim(8, hi=4096)
    dt = rng.choice([torch.bfloat16, torch.float16])
    x = torch.randn(B, M, K, device=DEV).to(dt)
    shared = rng.random() < 0.25
    w = (torch.randn(N, K, device=DEV).to(dt) / K**0.5).expand(B, N, K) if shared else \
        torch.randn(B, N, K, device=DEV).to(dt) / K**0.5
    bias = torch.randn(B, N, device=DEV).to(dt) if rng.random() < 0.3 else None
    act = rng.choice([None, "silu"])
    ref = torch.bmm(x.float(), w.float().transpose(1, 2))
    if bias is not None:
        ref = ref + bias.float()[:, None, :]
    ref = act_ref(ref, act)
    return (lambda: gemmkit.batched_gemm_a16w16(x, w, bias, activation=act), ref, dt,
            f"B={B} M={M} N={N} K={K} {dt} shared_w={shared} bias={bias is not None} act={act}")


def case_grouped():
    E = rng.choice([1, 2, 4, 8, 16, 64])
    T = rng.choice([1, 3, 16, 64, 200, 512, 1000, 2048, 4096, 9000] if DEV == "cuda" else [1, 3, 16, 40])
    N, K = pick_dim(8, hi=4096), pick_dim(8, hi=4096)
    dt = torch.bfloat16
    x = torch.randn(T, K, device=DEV).to(dt)
    w = torch.randn(E, N, K, device=DEV).to(dt) / K**0.5
    skew = rng.random() < 0.3
    probs = torch.rand(E, device=DEV) ** (8 if skew else 1)
    expert = torch.multinomial(probs / probs.sum(), T, replacement=True).to(torch.int32)
    sizes = torch.bincount(expert, minlength=E).to(torch.int32)
    order = torch.argsort(expert, stable=True)
    gather = order.to(torch.int32) if rng.random() < 0.5 else None
    xs = x if gather is not None else x[order].contiguous()
    act = rng.choice([None, None, "silu"])
    bias = rng.choice([None, (E, N), (N,)])
    bias = None if bias is None else torch.randn(*bias, device=DEV).to(dt)
    rows, ends = x[order].float(), torch.cumsum(sizes, 0).tolist()
    b = [0 if bias is None else (bias[e] if bias.ndim == 2 else bias).float() for e in range(E)]
    ref = torch.cat([rows[e0:e1] @ w[e].float().T + b[e] for e, (e0, e1) in enumerate(zip([0] + ends[:-1], ends))])
    ref = act_ref(ref, act)
    scatter = weights = None
    if rng.random() < 0.3:  # (each sorted row to a destination row, times that row's weight: moe_mlp's down)
        scatter = torch.randperm(T, device=DEV).to(torch.int32)
        weights = torch.rand(T, device=DEV)
        out = torch.empty_like(ref)
        out[scatter.long()] = ref * weights[scatter.long()][:, None]
        ref = out
    return (lambda: gemmkit.grouped_gemm_a16w16(xs, w, m_sizes=sizes, gather_idx=gather, scatter_idx=scatter,
                                                routing_weights=weights, bias=bias, activation=act), ref, dt,
            f"E={E} T={T} N={N} K={K} skew={skew} gather={gather is not None} act={act} "
            f"bias={None if bias is None else tuple(bias.shape)} scatter={scatter is not None} sizes={sizes.tolist()[:8]}")


def case_moe_mlp():
    """The whole expert MLP at random expert counts, top-k, token counts (per expert: 1 to thousands of rows,
    balanced or skewed) and sizes, including the models' (the grouped configs switch at 8 and 64 rows per expert)."""
    E = rng.choice([1, 2, 8, 16, 64, 128] if DEV == "cuda" else [1, 2, 4])
    k = rng.choice([1, 2, 4, 8])
    k = min(k, E)
    T = rng.choice([1, 5, 64, 200, 512, 1000, 2048] if DEV == "cuda" else [1, 5, 24])
    if rng.random() < 0.3 and DEV == "cuda":
        H, inter = rng.choice([(4096, 14336), (2048, 768), (7168, 2048)])
        E = min(E, 8) if H == 4096 else E
    else:
        H, inter = pick_dim(64, lo=64, hi=2048), pick_dim(64, lo=64, hi=2048)
    dt = torch.bfloat16
    x = torch.randn(T, H, device=DEV).to(dt)
    wgu = (torch.randn(E, 2 * inter, H, device=DEV) / H**0.5).to(dt)
    wd = (torch.randn(E, H, inter, device=DEV) / inter**0.5).to(dt)
    skew = rng.random() < 0.3
    probs = torch.rand(E, device=DEV) ** (8 if skew else 1)
    ids = torch.stack([torch.multinomial(probs, k) for _ in range(T)]).to(torch.int32)
    weights = torch.softmax(torch.randn(T, k, device=DEV), dim=1)
    ref = torch.zeros(T, H, device=DEV)
    for e in range(E):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel():
            gate, up = (x[tok].float() @ wgu[e].float().T).split(inter, dim=1)
            h = (F.silu(gate) * up).to(dt).float()
            ref.index_add_(0, tok, (h @ wd[e].float().T) * weights[tok, slot][:, None])
    return (lambda: gemmkit.moe.moe_mlp(x, ids, weights, wgu, wd), ref, dt,
            f"E={E} k={k} T={T} H={H} I={inter} skew={skew}")


def case_ff_gated():
    M, H, inter = pick_m(), pick_dim(64, lo=64, hi=4096), pick_dim(64, lo=64, hi=8192)
    dt = torch.bfloat16
    x = torch.randn(M, H, device=DEV).to(dt)
    wgu = torch.randn(2 * inter, H, device=DEV).to(dt) / H**0.5
    wd = torch.randn(H, inter, device=DEV).to(dt) / inter**0.5
    gate, up = (x.float() @ wgu.float().T).split(inter, dim=1)
    h = (F.silu(gate) * up).to(dt).float()
    ref = h @ wd.float().T
    return (lambda: gemmkit.ff_a16w16_gated(x, wgu, wd), ref, dt, f"M={M} H={H} I={inter}")


CASES = {"gemm_a16w16": case_a16w16, "gemm_a8w8": case_a8w8, "gemm_a8w8_blockscale": case_blockscale,
         "gemm_a16w4": case_a16w4, "gemm_a16wfp4": case_a16wfp4, "gemm_afp4wfp4": case_afp4wfp4,
         "batched_gemm_a16w16": case_batched, "grouped_gemm_a16w16": case_grouped, "ff_a16w16_gated": case_ff_gated,
         "moe_mlp": case_moe_mlp}


def check(res, ref, odt, tol=None):
    res = res.float()
    tol = TOL[odt] if tol is None else tol
    if res.shape != ref.shape:
        return f"shape {tuple(res.shape)} != {tuple(ref.shape)}"
    bad_nan = torch.isnan(res) & ~torch.isnan(ref)
    if bad_nan.any():
        return f"{int(bad_nan.sum())} NaN values (first at {tuple(bad_nan.nonzero()[0].tolist())})"
    scale = ref.abs().max().item() or 1.0
    err = (res - ref).abs()
    worst = err.max().item() / scale
    if worst > tol:
        at = tuple((err == err.max()).nonzero()[0].tolist())
        return f"max err {worst:.3e} of max |ref| at {at} (ref {ref[at].item():.4g}, got {res[at].item():.4g})"
    return None


def graph_run(call):
    """The call captured in a CUDA graph (after a warm-up) and replayed."""
    call()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res = call()
    g.replay()
    torch.cuda.synchronize()
    return res


print(f"{torch.cuda.get_device_name() if DEV == 'cuda' else 'CPU'}, torch {torch.__version__}, seed {SEED}, {TRIALS} problems per op",
      file=out, flush=True)
failures = 0
for name, case in CASES.items():
    if ONLY and name not in ONLY:
        continue
    passed = rejected = 0
    seen = set()
    for i in range(TRIALS):
        torch.manual_seed(SEED * 1000 + i)
        try:
            call, ref, odt, desc, *tol = case()  # (a case may name its own tolerance)
        except Exception as e:  # building the inputs (quantizers) failed
            print(f"  {name} #{i}: input construction failed: {type(e).__name__}: {e}", file=out, flush=True)
            failures += 1
            continue
        try:
            res = graph_run(call) if i % 5 == 4 and DEV == "cuda" else call()
            if DEV == "cuda":
                torch.cuda.synchronize()
        except (ValueError, TypeError) as e:
            rejected += 1
            msg = str(e)[:160]
            if msg not in seen:
                seen.add(msg)
                print(f"  {name} #{i} rejected: {desc}: {type(e).__name__}: {msg}", file=out, flush=True)
            continue
        except Exception as e:
            failures += 1
            print(f"  {name} #{i} CRASH: {desc}: {type(e).__name__}: {str(e)[:300]}", file=out, flush=True)
            traceback.print_exc(file=out)
            continue
        bad = check(res, ref, odt, *tol)
        if bad:
            failures += 1
            print(f"  {name} #{i} WRONG ({'graph' if i % 5 == 4 else 'eager'}): {desc}: {bad}", file=out, flush=True)
        else:
            passed += 1
    print(f"{name}: {passed} passed, {rejected} rejected, {TRIALS - passed - rejected} failed", file=out, flush=True)
print(f"total failures: {failures}", file=out, flush=True)
