"""Shared by the device probes: candidate configs checked against a reference before they are timed."""

from gemmkit.tools import tune


def checked_calls(calls: dict, configs: dict, run, ref, out, tol: float) -> dict:
    """Add to `calls` (name -> zero-argument call) `run(cfg)` for each named config whose result is
    within `tol` (relative) of `ref`; the others are reported on `out` and left out."""
    for name, cfg in configs.items():
        try:
            err = tune.rel_error(run(cfg), ref)
        except Exception as e:  # noqa: BLE001 - a probe reports and goes on
            print(f"  {name}: {type(e).__name__}: {str(e)[:120]}", file=out)
            continue
        if err > tol:
            print(f"  {name}: wrong result (rel err {err:.2e})", file=out)
            continue
        calls[name] = lambda cfg=cfg: run(cfg)
    return calls


def a16w16_config_calls(M: int, N: int, K: int, configs: dict, out) -> dict:
    """name -> call for one bf16 problem on fresh random operands: F.linear (first), gemm_a16w16's
    own pick, then each of `configs` whose result checks out (checked_calls)."""
    import torch
    import torch.nn.functional as F

    import gemmkit

    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    ref = x.float() @ w.float().T
    return checked_calls({"F.linear": lambda: F.linear(x, w), "own pick": lambda: gemmkit.gemm_a16w16(x, w)},
                         configs, lambda cfg: gemmkit.gemm_a16w16(x, w, config=cfg), ref, out, 1e-2)


def int4_inputs(M: int, N: int, K: int, group: int = 128) -> dict:
    """x (M, K) bf16, an INT4 weight (N, K) in groups of `group` (asymmetric, as `gemmkit bench a16w4`
    builds it) and its bf16 dequantization: keys x, wq, ws, wz, w16."""
    import torch

    from gemmkit.quant import dequantize_int4, quantize_int4

    x, w = torch.randn(M, K, device="cuda").bfloat16(), (torch.randn(N, K, device="cuda") / K**0.5).bfloat16()
    wq, ws, wz = quantize_int4(w, group)
    return {"x": x, "wq": wq, "ws": ws, "wz": wz, "w16": dequantize_int4(wq, ws, wz, group, torch.bfloat16)}


def w4_plan_calls(inps: list, fp4: bool, group: int = 128) -> tuple:
    """(plans, calls): gemm_a16wfp4's (fp4) or gemm_a16w4's plan for each input set, built now with the
    module constants as they are and held, and a zero-argument call running each."""
    from gemmkit.ops import a16w4
    from gemmkit.ops import fp4 as fp4_op

    plans, calls = [], []
    for inp in inps:
        if fp4:
            plan = fp4_op._make_plan(inp["x"], None, inp["wq"], inp["ws"], None, None, None, None, None)
            calls.append(lambda inp=inp, plan=plan: plan.run(inp["x"], inp["wq"], None, None, None, inp["ws"]))
        else:
            plan = a16w4._make_plan(inp["x"], inp["wq"], inp["ws"], inp["wz"], group, None, None, None, None, None)
            calls.append(lambda inp=inp, plan=plan: plan.run(inp["x"], inp["wq"], None, None, None, inp["ws"], None,
                                                              None, None, None, None, inp["wz"]))
        plans.append(plan)
    return plans, calls


def time_and_print(named: dict, header: str, wbytes: float, out, digits: int = 1) -> list:
    """Time `named` (name -> list of calls, the first the baseline) in one interleaved CUDA-graph run and
    print each against the first: us, ratio, GB/s of `wbytes`. Returns the times."""
    from gemmkit.tools.timing import time_graphs_us

    names = list(named)
    times = time_graphs_us(*[named[n] for n in names], rep_ms=10, retries=3)
    print(header, file=out)
    for n, t in zip(names, times):
        print(f"  {t:9.{digits}f} us  {times[0] / t:5.2f}x F.linear  {wbytes / t / 1e3:6.0f} GB/s  {n}", file=out,
              flush=True)
    return times


def dense_sets(M: int, N: int, K: int, fp8: bool, count: int) -> list:
    """`count` input sets (x, w, x_scale, w_scale) of one problem on the GPU: bf16 x (M, K) and w (N, K)
    (w / sqrt(K)), scales None; or (fp8) both quantized to e4m3 per row, scales (M, 1) and (1, N)."""
    import torch

    from gemmkit import quant

    sets = []
    for _ in range(count):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(N, K, device="cuda") / K**0.5).bfloat16()
        if fp8:
            (xq, xs), (wq, ws) = quant.quantize_fp8(x, "row"), quant.quantize_fp8(w, "row")
            sets.append((xq, wq, xs.reshape(M, 1), ws.reshape(1, N)))
        else:
            sets.append((x, w, None, None))
    return sets


def gated_sets(M: int, I: int, H: int, count: int, out: bool = False) -> list:
    """`count` input sets (x, w, gate, up[, y]) of a gated product on the GPU: bf16 x (M, H), w (2I, H) / sqrt(H)
    with gate = w[:I] and up = w[I:] (views), and (out) an empty bf16 output y (M, I)."""
    import torch

    sets = []
    for _ in range(count):
        x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(2 * I, H, device="cuda", dtype=torch.bfloat16) / H**0.5
        y = (torch.empty(M, I, device="cuda", dtype=torch.bfloat16),) if out else ()
        sets.append((x, w, w[:I], w[I:], *y))
    return sets


def dense_baseline(x, w, xs, ws):
    """torch's result for one of dense_sets' sets: fast-accumulation _scaled_mm (scales given) or F.linear."""
    import torch
    import torch.nn.functional as F

    if xs is not None:
        return torch._scaled_mm(x, w.t(), xs, ws, out_dtype=torch.bfloat16, use_fast_accum=True)
    return F.linear(x, w)


def timed_row(calls: dict, ratios: dict, rep_ms: float = 8) -> tuple[dict, str]:
    """Time `calls` (name -> list of calls, the first the baseline) in one interleaved CUDA-graph run; append each
    other name's ratio (baseline time / its time) to `ratios`; return the times and a printable
    "name us ... | ratio name r ..." line."""
    from gemmkit.tools.timing import time_graphs_us

    names = list(calls)
    times = dict(zip(names, time_graphs_us(*[calls[k] for k in names], rep_ms=rep_ms, retries=5)))
    base = times[names[0]]
    for k in names[1:]:
        ratios.setdefault(k, []).append(base / times[k])
    return times, ("  ".join(f"{k} {times[k]:7.1f}" for k in names) + "  | ratio "
                   + " ".join(f"{k} {base / times[k]:4.2f}" for k in names[1:]))


def print_geomeans(ratios: dict, baseline: str, out) -> None:
    """The geometric mean of each name's ratios (timed_row) to `baseline`."""
    import math

    for k, v in ratios.items():
        print(f"geomean ratio to {baseline}, {k}: {math.exp(sum(map(math.log, v)) / len(v)):.3f} over {len(v)}",
              file=out)


def w4_problem(M: int, N: int, K: int, fp4: bool, group: int = 128, copies: int = 3):
    """(inputs, reference, named) of one 4-bit problem on the GPU: `copies` input sets (MXFP4 as `gemmkit bench
    a16wfp4` builds them, else INT4 in groups of `group`: int4_inputs), the first's fp32 reference x @ w16^T, and
    {"F.linear bf16": its calls on each set} to add the 4-bit routes' calls to."""
    import torch.nn.functional as F

    from gemmkit.tools import registry

    inps = ([registry._a16wfp4_inputs(M, N, K, "bf16", "cuda") for _ in range(copies)] if fp4
            else [int4_inputs(M, N, K, group) for _ in range(copies)])
    ref = inps[0]["x"].float() @ inps[0]["w16"].float().T
    return inps, ref, {"F.linear bf16": [lambda inp=inp: F.linear(inp["x"], inp["w16"]) for inp in inps]}


def profile_text(fn, calls: int, sort: str = "cumulative", limit: int = 40) -> str:
    """cProfile of `calls` calls of fn() (the GPU synchronized after), its `limit` top entries by `sort`."""
    import cProfile
    import io
    import pstats

    import torch

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats(sort).print_stats(limit)
    return buf.getvalue()
