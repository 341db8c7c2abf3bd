"""The ratio a table of `gemmkit bench --markdown` leaves room for where the op streams its
operands: for each row, bytes = GB/s x graph us (the least the op must move, as the bench counts
it), the time those bytes take at the device copy bandwidth measured in the same run, and
base us / that time: no kernel moving those bytes can beat the baseline by more.

    python3 scripts/bandwidth_ceiling.py TABLE.md [TABLE.md ...]
"""

import re
import sys


def main(paths):
    for path in paths:
        text = open(path).read()
        copy = float(re.search(r"measured in the same run \((\d+(?:\.\d+)?) GB/s\)", text).group(1))
        print(f"{path} (copy {copy:.0f} GB/s)")
        for line in text.splitlines():
            if not line.startswith("| ") or line.startswith("| shape"):
                continue
            c = [x.strip() for x in line.split("|")[1:-1]]
            us, base, gbs = float(c[4]), float(c[5]), float(c[8])
            floor_us = gbs * us / copy
            print(f"  {c[0]} M={c[1]}: floor {floor_us:.1f} us; baseline {base} us = {100 * floor_us / base:.0f}% "
                  f"of copy bandwidth; gemmkit {us} us = {100 * floor_us / us:.0f}%; ratio ceiling {base / floor_us:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
