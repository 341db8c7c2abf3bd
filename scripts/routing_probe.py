"""Probe (device tool): gemmkit.moe.sort_by_expert on kernels/routing.py against the torch-ops sort it replaced
(stable argsort, index, searchsorted: ops/routing.sort_by_expert_torch), and the kernels' block sizes.

For each routing (T tokens, top-k among E experts, random ids) the results are checked equal to the torch sort's,
then timed under CUDA-graph replay (one interleaved run: torch, the kernels as shipped, each variant of the block sizes /
SINGLE_MAX) and eagerly (back-to-back calls, host cost included).

    python3 scripts/routing_probe.py [OUT]
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gemmkit import moe  # noqa: E402
from gemmkit.ops import routing  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402

out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
PROBLEMS = [(1, 8, 128), (16, 8, 128), (64, 8, 128), (256, 8, 128), (512, 8, 128), (2048, 8, 128), (4096, 8, 128),
            (16384, 8, 128), (64, 8, 256), (4096, 8, 256), (4096, 2, 8), (16384, 2, 8), (2048, 8, 384)]
VARIANTS = {f"block{b}": dict(BLOCK_MIN=b, BLOCK_MAX=b) for b in (512, 1024, 2048, 4096)}
VARIANTS.update(single2048=dict(SINGLE_MAX=2048), single4096=dict(SINGLE_MAX=4096))


def with_settings(settings, ids, E):
    """A call of the kernels' sort with routing's module constants set (its plan built now, then held)."""
    saved = {k: getattr(routing, k) for k in settings}
    for k, v in settings.items():
        setattr(routing, k, v)
    try:
        flat = ids.reshape(-1).contiguous()
        plan = routing.RoutingPlan(flat, E, ids.shape[1])
    finally:
        for k, v in saved.items():
            setattr(routing, k, v)
    return lambda: plan(flat)


def eager_us(fn, calls=300):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; graph us (eager us)", file=out)
for T, k, E in PROBLEMS:
    ids = torch.randint(0, E, (T, k), device="cuda")
    flat = ids.reshape(-1)
    base = lambda: routing.sort_by_expert_torch(flat, E, k)  # noqa: E731
    ref = base()
    calls = {"kernels": lambda: moe.sort_by_expert(ids, E)}
    calls.update({name: with_settings(s, ids, E) for name, s in VARIANTS.items()})
    bad = [name for name, fn in calls.items() if not all(torch.equal(a, b) for a, b in zip(fn(), ref))]
    times = time_graphs_us([base], *[[fn] for fn in calls.values()], rep_ms=5, retries=5)
    row = "  ".join(f"{name} {t:6.1f}" for name, t in zip(calls, times[1:]))
    print(f"T={T:6d} k={k} E={E:4d} n={T * k:7d}: torch {times[0]:6.1f} ({eager_us(base):5.1f})  {row}  "
          f"(eager kernels {eager_us(calls['kernels']):5.1f}){'  WRONG: ' + ','.join(bad) if bad else ''}",
          file=out, flush=True)
