"""Probe (device tool): a gemmkit CLI command (bench, usually) with module constants of kernels/gemm_ws.py set first,
for A/B runs of the warp-specialized kernel's compile-time switches, one process per setting (the kernel reads them
at compile time; Triton refuses a global changed after a compile).

    python3 scripts/ws_variant.py DEC_WORK=0 -- bench a16w4 --model llama3-8b --m-sweep 1024 ...

(ba336a9 measured two switches it has since dropped, SKIP_PAST_END and EXPERT_SPREAD: BENCHMARKS.md, twenty-first session.)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from triton.experimental.gluon import language as gl  # noqa: E402

from gemmkit import cli  # noqa: E402
from gemmkit.kernels import gemm_ws  # noqa: E402

if "--" not in sys.argv:
    raise SystemExit(__doc__)
cut = sys.argv.index("--")
for item in sys.argv[1:cut]:
    name, _, value = item.partition("=")
    if not isinstance(getattr(gemm_ws, name, None), gl.constexpr):
        raise SystemExit(f"kernels/gemm_ws.py has no constexpr {name}")
    gemm_ws.__dict__[name] = gl.constexpr(int(value))
    print(f"gemm_ws.{name} = {int(value)}", flush=True)
sys.exit(cli.main(sys.argv[cut + 1:]))
