"""The config sweep the GPU probe scripts share (batched_probe, gated_probe, w4_sweep): each config
run once through the op and checked against a float reference, then timed under CUDA-graph replay
(triton.testing.do_bench_cudagraph); the fastest printed with their ratio to a baseline time."""

import triton.testing


def sweep(run, ref, configs, base_ms: float, out, top: int = 4, base_name: str = "") -> None:
    """run(config) -> output; ref: float32 reference; base_ms: the baseline's time (ms). A config
    that fails (compile, launch or validation) counts as infinitely slow, its error kept."""
    results = []
    for cfg in configs:
        try:
            err = ((run(cfg).float() - ref).norm() / ref.norm()).item()
            t = triton.testing.do_bench_cudagraph(lambda: run(cfg))
        except Exception as e:  # noqa: BLE001
            results.append((float("inf"), cfg, str(e)[:60]))
            continue
        results.append((t, cfg, f"{err:.1e}"))
    for t, cfg, err in sorted(results, key=lambda r: r[0])[:top]:
        print(f"   {t * 1e3:7.1f} us {base_ms / t:.2f}x{' ' + base_name if base_name else ''} {cfg} err {err}", file=out,
              flush=True)
