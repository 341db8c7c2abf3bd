"""Summarize w4_tile_probe.py outputs (tuning/w4_tile/w4_tile_route_*): per problem the ratio of the shipped
routing with the weight-tile route off to the weight-tile route everywhere (same run), grouped by what
hopper_w4.tile_sizes_ok says (the shipped rule, on an H100 profile) and by rows.

Usage: python3 scripts/w4_tile_route_stats.py FILE..."""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gemmkit.core import hopper_w4  # noqa: E402
from gemmkit.core.device import known_device  # noqa: E402

H100 = known_device("NVIDIA_H100_80GB_HBM3")


def problems(path):
    """(M, N, K, tile time / route-off time, route-off plan) per problem of one probe output."""
    cur, vals = None, {}
    for line in open(path):
        if line.startswith("M="):
            cur, vals = [int(f.split("=")[1].rstrip(":")) for f in line.split()], {}
        elif " us " in line:
            t = float(line.split()[0])
            if "shipped, this route off" in line:
                vals["off"], vals["plan"] = t, line.rsplit(";", 1)[-1].strip(" )\n")
            elif "this route (rel" in line:
                vals["tile"] = t
            if len(vals) == 3:
                yield (*cur, vals["off"] / vals["tile"], vals["plan"])
                vals = {}


def summary(name, ratios):
    if ratios:
        g = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"{name}: {len(ratios)} problems, {min(ratios):.2f}x to {max(ratios):.2f}x, geomean {g:.3f}")


rows = [p for f in sys.argv[1:] for p in problems(f)]
rule = [r for r in rows if hopper_w4.tile_sizes_ok(r[0], r[1], H100) and "Prefill" not in r[4]]
summary("taken by the rule (the prefill kernel's calls aside)", [r[3] for r in rule])
summary("512 to 1024 rows, not taken", [r[3] for r in rows if hopper_w4.TILE_MIN_M <= r[0] <= hopper_w4.TILE_MAX_M
                                         and r not in rule and "Prefill" not in r[4]])
summary("more rows", [r[3] for r in rows if r[0] > hopper_w4.TILE_MAX_M])
