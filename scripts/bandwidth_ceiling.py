"""The ratio a table of `gemmkit bench --markdown` leaves room for where the op streams its
operands: for each row, bytes = GB/s x graph us (the least the op must move, as the bench counts
it), the time those bytes take at the device copy bandwidth measured in the same run, and
base us / that time: no kernel moving those bytes can beat the baseline by more. With --tflops T
the floor is the larger of that and the row's FLOPs (TFLOP/s x graph us) at T TFLOP/s (an optimistic
bound: both at their peaks at once), and the geomean of the rows' ceilings closes the output.

    python3 scripts/bandwidth_ceiling.py TABLE.md [TABLE.md ...] [--tflops T]
"""

import math
import re
import sys


def main(args):
    tflops = float(args[args.index("--tflops") + 1]) if "--tflops" in args else None
    paths = [a for i, a in enumerate(args) if a != "--tflops" and (i == 0 or args[i - 1] != "--tflops")]
    ceilings = []
    for path in paths:
        text = open(path).read()
        copy = float(re.search(r"measured in the same run \((\d+(?:\.\d+)?) GB/s\)", text).group(1))
        print(f"{path} (copy {copy:.0f} GB/s)")
        for line in text.splitlines():
            if not line.startswith("| ") or line.startswith("| shape"):
                continue
            c = [x.strip() for x in line.split("|")[1:-1]]
            us, base, tfs, gbs = float(c[4]), float(c[5]), float(c[7]), float(c[8])
            floor_us = gbs * us / copy
            flop_us = tfs * us / tflops if tflops else 0.0
            bound = max(floor_us, flop_us)
            ceilings.append(base / bound)
            print(f"  {c[0]} M={c[1]}: floor {floor_us:.1f} us; baseline {base} us = {100 * floor_us / base:.0f}% "
                  f"of copy bandwidth; gemmkit {us} us = {100 * floor_us / us:.0f}%; ratio ceiling {base / floor_us:.2f}"
                  + (f"; FLOPs at {tflops:.0f} TFLOP/s {flop_us:.1f} us, ceiling {base / bound:.2f}" if tflops else ""))
    if tflops and ceilings:
        gm = math.exp(sum(map(math.log, ceilings)) / len(ceilings))
        print(f"geomean ceiling over {len(ceilings)} rows: {gm:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
