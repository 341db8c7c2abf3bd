"""Development probe (device tool): several configs of one op and shape, timed like `gemmkit
bench` (graph replay, rotating inputs) with their replays interleaved with the torch baseline's,
so that configs the tuner ranked in short bursts are compared under the benchmark's sustained
load. Not part of the package; `gemmkit bench` produces the reported figures.

    python scripts/config_probe.py a8w8_default_accum 1024 10240 8192 '{"BLOCK_M": 128, ...}' ...
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gemmkit.core.config import GemmConfig  # noqa: E402
from gemmkit.core.device import device_info  # noqa: E402
from gemmkit.tools.registry import get_op  # noqa: E402
from gemmkit.tools.timing import time_graphs_us  # noqa: E402
from gemmkit.tools.tune import input_sets, rel_error  # noqa: E402


def main(argv):
    op = get_op(argv[0])
    M, N, K = map(int, argv[1:4])
    configs = [None] + [GemmConfig.from_dict(json.loads(a)) for a in argv[4:]]
    dev = device_info()
    sets = input_sets(op, M, N, K, op.dtypes[0], dev)
    ref = op.reference(sets[0])
    lists = [[lambda s=s: op.baseline(s) for s in sets]]
    for cfg in configs:
        err = rel_error(op.run(sets[0], cfg), ref)
        assert err < op.tolerance, (cfg, err)
        lists.append([lambda s=s, c=cfg: op.run(s, c) for s in sets])
    times = time_graphs_us(*lists, rep_ms=15)
    print(f"{argv[0]} M={M} N={N} K={K}: baseline {times[0]:.1f} µs")
    for cfg, t in zip(configs, times[1:]):
        print(f"  {t:8.1f} µs  ratio {times[0] / t:.3f}  {'table config' if cfg is None else cfg.to_dict()}")


if __name__ == "__main__":
    main(sys.argv[1:])
