"""Probe (device tool): GEMMKIT_AUTOTUNE=1 on shapes no table holds (issue 15's must-show).

For each problem, in one process on the GPU, with an empty user config directory:
  1. gemm_a16w16 with the shipped tables (the shape has no entry: a generic bucket or a derived
     config), timed under CUDA-graph replay against F.linear in the same replays;
  2. GEMMKIT_AUTOTUNE=1: the first call tunes the problem (its wall time is printed, and the
     tuner's own stderr line), the second call uses the stored entry, timed the same way;
  3. "tuned figure": the fastest time the tuner recorded for the problem (what `gemmkit tune
     --shape M N K` would put in a table), next to the second call's time.
Usage: python3 scripts/autotune_probe.py [OUT_FILE]
"""

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["GEMMKIT_CONFIG_DIR"] = tempfile.mkdtemp(prefix="gemmkit_autotune_")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gemmkit  # noqa: E402
from gemmkit.core.config import clear_caches, config_source, user_config_dir  # noqa: E402
from gemmkit.core.device import device_info  # noqa: E402
from gemmkit.tools import autotune  # noqa: E402
from gemmkit.tools.timing import rotation_count, time_graphs_us  # noqa: E402
from gemmkit.tools.tune import default_cache, load_cache  # noqa: E402

# (M, N, K) of no model in gemmkit/tools/models.json: tensor-parallel slices and odd sizes
PROBLEMS = [(384, 5120, 3200), (96, 7168, 2560), (1536, 3072, 9728)]

out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
dev = device_info()
torch.manual_seed(0)


def inputs(M, N, K):
    sets = rotation_count((M * K + N * K) * 2, dev.l2_bytes)
    return [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
             torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5) for _ in range(sets)]


def timed(sets):
    ours, base = time_graphs_us([lambda x=x, w=w: gemmkit.gemm_a16w16(x, w) for x, w in sets],
                                [lambda x=x, w=w: F.linear(x, w) for x, w in sets], rep_ms=10)
    return ours, base


print(f"{dev.name}, torch {torch.__version__}; user config dir {user_config_dir()}", file=out, flush=True)
for M, N, K in PROBLEMS:
    sets = inputs(M, N, K)
    os.environ.pop(autotune.ENV, None)
    src = config_source("a16w16", M, N, K, dev)[1]
    before, base0 = timed(sets)
    clear_caches()  # a new process with the switch on: no plan for the problem yet
    os.environ[autotune.ENV] = "1"
    x, w = sets[0]
    t0 = time.time()
    gemmkit.gemm_a16w16(x, w)  # tunes
    torch.cuda.synchronize()
    first_s = time.time() - t0
    src_after = config_source("a16w16", M, N, K, dev)[1]
    after, base1 = timed(sets)
    recs = [r for r in load_cache(default_cache(dev.name, "a16w16")).values()
            if (r["M"], r["N"], r["K"]) == (M, N, K) and "us" in r]
    best = min((r.get("us_sustained") or r["us"]) for r in recs) if recs else float("nan")
    print(f"M={M} N={N} K={K}: before {before:.1f} us ({src}; F.linear {base0:.1f}, ratio {base0 / before:.2f}); "
          f"first call with {autotune.ENV}=1 {first_s:.1f} s; after {after:.1f} us ({src_after}; F.linear "
          f"{base1:.1f}, ratio {base1 / after:.2f}); tuner's best {best:.1f} us over {len(recs)} candidates; "
          f"after / tuned figure {after / best:.3f}", file=out, flush=True)
    clear_caches()
table = user_config_dir() / dev.name / "a16w16.json"
print(f"user table written: {table} with shapes {sorted(json.loads(table.read_text())['shapes'])}", file=out)
