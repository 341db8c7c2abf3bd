"""Summary of scripts/ws_rows_probe.py --ab outputs: per M, the geomean ratio to the baseline of the default plan
and of --knob's plan over all problems and over those whose plan differs (the rule's moves), and the moves' range
of default / knob-plan speed.

    python3 scripts/wave_rule_summary.py FILE ...
"""

import math
import re
import sys
from collections import defaultdict

LINE = re.compile(r"M=\s*(\d+) N=\s*(\d+) K=\s*(\d+)\s+base\s+([\d.]+)\s+default\s+([\d.]+)\s+old\s+([\d.]+)"
                  r".*\(rows (\S+), old (\S+)\)")


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main():
    for path in sys.argv[1:]:
        every, moved = defaultdict(list), defaultdict(list)
        for line in open(path):
            m = LINE.match(line)
            if not m:
                continue
            M = int(m.group(1))
            base, new, old = map(float, m.groups()[3:6])
            every[M].append((base / new, base / old))
            if m.group(7) != m.group(8):
                moved[M].append((base / new, base / old, old / new))
        print(path)
        for M in sorted(every):
            a, b = zip(*every[M])
            line = f"  M = {M}: {len(a)} problems, default {geomean(a):.3f}, knob's plan {geomean(b):.3f}"
            if moved[M]:
                n, o, g = zip(*moved[M])
                line += (f"; {len(g)} moved: {geomean(o):.3f} -> {geomean(n):.3f} (speed-up {geomean(g):.3f}, "
                         f"{min(g):.2f} to {max(g):.2f})")
            print(line)


if __name__ == "__main__":
    main()
