"""Probe (device tool): a table's shape entries for one M against the config derive_config gives
the same problems (what a lookup without the entry would run), and the torch baseline, under
CUDA-graph replay: which tuned entries still earn their place. A16W16 (F.linear baseline).

--replace-worse MARGIN: then, in the shipped table (gemmkit/configs/<DEVICE>/a16w16.json), replace
the entries for M's bucket whose config took more than (1 + MARGIN) times the derived config's
time by the derived config (removing one would not derive: the lookup takes the shape's next
larger bucket).

Usage: python3 scripts/table_vs_derived_probe.py [OUT_FILE] [--m M] [--replace-worse MARGIN]
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gemmkit.core.config import GemmConfig, _bucket_key, derive_config, load_table, m_bucket, table_path  # noqa: E402
from gemmkit.core.device import device_info  # noqa: E402
from gemmkit.core.formats import dense  # noqa: E402
from gemmkit.tools.configs import describe  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import _sorted_table  # noqa: E402
from probe_util import a16w16_config_calls  # noqa: E402

args = sys.argv[1:]
out = open(args[0], "w") if args and not args[0].startswith("--") else sys.stdout
M = int(args[args.index("--m") + 1]) if "--m" in args else 256
MARGIN = float(args[args.index("--replace-worse") + 1]) if "--replace-worse" in args else None
dev = device_info(torch.device("cuda"))
fmt = dense(torch.bfloat16)
table = load_table(dev.name, "a16w16") or {}
print(torch.cuda.get_device_name(), torch.__version__, f"a16w16 M={M} bucket {m_bucket(M)}", file=out, flush=True)
replace = []
for nk, entries in sorted(table.get("shapes", {}).items()):
    key = _bucket_key(entries, M)
    if key is None:
        continue
    N, K = (int(v) for v in nk.split(","))
    entry = GemmConfig.from_dict(entries[key])
    derived = derive_config(M, N, K, dev, fmt, fmt, 2, one_wave=True)
    calls = a16w16_config_calls(M, N, K, {"entry": entry, "derived": derived}, out)
    names = list(calls)
    times = dict(zip(names, time_graphs_us(*[[calls[n]] for n in names], rep_ms=5, retries=3)))
    base = times["F.linear"]
    ratios = "  ".join(f"{n} {base / t:.3f}" for n, t in times.items() if n != "F.linear")
    worse = MARGIN is not None and times["entry"] > (1 + MARGIN) * times["derived"]
    if worse:
        replace.append((nk, key, derived))
    print(f"N={N} K={K} [{key}] {ratios} | entry {describe(entry)} | derived {describe(derived)}"
          f"{' | replaced' if worse else ''}", file=out, flush=True)
if replace:
    path = table_path(dev.name, "a16w16", "shipped")
    shipped = json.loads(path.read_text())
    for nk, key, derived in replace:
        shipped["shapes"][nk][key] = dict(sorted(derived.to_dict().items()))
    path.write_text(json.dumps(_sorted_table(shipped), indent=1) + "\n")  # the tuner's layout
    print(f"replaced {len(replace)} entries in {path} by the derived configs", file=out, flush=True)
