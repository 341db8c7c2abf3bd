#!/bin/bash
# Development helper for one device call: the current checkout against an earlier one extracted
# into .old/ (`git archive <commit> gemmkit scripts | tar -x -C .old`, carried), in the same run:
# `gemmkit bench` of each op for both (interleaved per op), the host-cost probe and the dynamic
# split-K probe for both. Usage on the GPU machine:
#   bash scripts/compare_commits.sh <new commit> <old commit> "a16w16 --m-sweep 1 16" "a8w8 ..." ...
set -u
NEW=$1 OLD=$2 ROOT=$PWD
shift 2
OUT=${OUT:-/tmp/gemmkit_out}
mkdir -p "$OUT"
for side in new old; do
  dir=$ROOT; commit=$NEW
  [ $side = old ] && dir=$ROOT/.old && commit=$OLD
  (cd "$dir" && PYTHONPATH=$dir GEMMKIT_COMMIT=$commit timeout 120 python3 scripts/host_probe.py > "$OUT/host_probe_$side.txt" 2>&1)
  grep -E "gemm_a16w16|gemm_a8w8|F.linear" "$OUT/host_probe_$side.txt" | head -5 | sed "s/^/$side: /"
  (cd "$dir" && PYTHONPATH=$dir GEMMKIT_COMMIT=$commit timeout 120 python3 "$ROOT/scripts/dynamic_splitk_probe.py" 2>&1) \
    | tee "$OUT/splitk_probe_$side.txt" | sed "s/^/$side: /"
done
for op in "$@"; do
  for side in new old; do
    dir=$ROOT; commit=$NEW
    [ $side = old ] && dir=$ROOT/.old && commit=$OLD
    # shellcheck disable=SC2086  # each argument is an op followed by its options
    (cd "$dir" && PYTHONPATH=$dir GEMMKIT_COMMIT=$commit python3 -m gemmkit bench $op --no-eager \
       --markdown "$OUT/bench_$side.md" --csv "$OUT/$(echo $op | cut -d' ' -f1)_$side.csv" 2>&1 | tail -4 | sed "s/^/$side: /")
  done
done
