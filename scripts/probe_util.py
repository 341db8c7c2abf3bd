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
