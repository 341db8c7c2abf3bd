#!/bin/bash
# Development helper for one device call: host-cost probe, then `gemmkit bench` runs, appended
# to $OUT/bench.md. Usage on the GPU machine:
#   bash scripts/device_check.sh <commit> "a8w8_dynamic --model llama3-8b --m-sweep 1 16" ...
# The GPU test suite is compile-bound (over 10 minutes in one process): run it with xdist,
# `python3 -m pytest -q -n 8`, carrying the pytest-xdist and execnet packages where the machine lacks them.
set -u
export PYTHONPATH=$PWD GEMMKIT_COMMIT=${1:-unknown}
shift || true
OUT=${OUT:-/tmp/gemmkit_out}
mkdir -p "$OUT"
python3 scripts/host_probe.py > "$OUT/host_probe.txt" 2>&1
head -25 "$OUT/host_probe.txt"
for op in "$@"; do
  # shellcheck disable=SC2086  # each argument is an op followed by its options
  python3 -m gemmkit bench $op --markdown "$OUT/bench.md" --rep-ms 15 2>&1 | tail -4
done
