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
