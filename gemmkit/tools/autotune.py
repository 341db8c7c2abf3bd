"""`GEMMKIT_AUTOTUNE=1`: tune a problem the first time it is met without a tuned entry.

The config resolution calls `maybe_autotune` before it looks a config up; when the switch is on,
the device is a CUDA GPU, no CUDA graph is being captured (nor a torch.compile trace), and the
merged tables (yours over the shipped ones) have no shape entry for the problem's (N, K) and M
bucket, the tuner measures that one problem in this process (no compile workers), writes the
result to your user table (shape entries only: the generic buckets that serve every other shape
stay as they are), forgets the cached configs and prints one line to stderr. Each problem is
tried once per process, also when tuning fails (a warning line, and the call goes on with the
config it would have had).
"""

from __future__ import annotations

import os
import sys
import time

import torch

from ..core.config import bucket_bound, load_table, m_bucket, table_path
from ..core.device import DeviceInfo

ENV = "GEMMKIT_AUTOTUNE"

_tried: set = set()
_tuning = False  # the tuner's own GEMM calls must not start another tuning


def autotune_enabled() -> bool:
    return os.environ.get(ENV, "0").strip().lower() in ("1", "true", "on", "yes")


def has_shape_entry(table: str, M: int, N: int, K: int, dev: DeviceInfo) -> bool:
    """The merged tables hold an entry for this (N, K) in M's bucket."""
    merged = load_table(dev.name, table) or {}
    return m_bucket(M) in merged.get("shapes", {}).get(f"{N},{K}", {})


def maybe_autotune(table: str, M: int, N: int, K: int, dev: DeviceInfo, dtype=None) -> bool:
    """Tune (M, N, K) for `table` now if GEMMKIT_AUTOTUNE is set and the problem has no shape
    entry (see the module's doc); True when a table was written (the caches are then cleared:
    look the config up again). dtype: the operand dtype (a torch dtype or the tools' name; default
    the table's op's first)."""
    global _tuning
    if _tuning or not autotune_enabled() or dev.interpreter or not torch.cuda.is_available() or min(M, N, K) < 1:
        return False
    # tuning launches and synchronizes: not inside a CUDA-graph capture or a torch.compile trace
    if torch.cuda.is_current_stream_capturing() or torch.compiler.is_compiling():
        return False
    key = (dev.name, table, m_bucket(M), N, K)
    if key in _tried or has_shape_entry(table, M, N, K, dev):
        return False
    _tried.add(key)

    from .registry import DTYPE_NAMES, op_dtype, table_op
    from .tune import REP_MS, default_cache, format_seconds, tune

    out = table_path(dev.name, table, "user")
    bound = bucket_bound(m_bucket(M))
    where = f"{table} M={M} (bucket {'<= ' + str(bound) if bound else 'any'}) N={N} K={K}"
    t0 = time.time()
    _tuning = True
    try:
        op = table_op(table)
        dtype = op_dtype(op, DTYPE_NAMES.get(dtype, dtype))
        tune(op.name, [(op.problem_m(M), N, K)], dtype, out, default_cache(dev.name, op.name), workers=0, rep_ms=REP_MS,
             command=f"{ENV}=1 (gemmkit.tools.autotune) on {where} {dtype}", buckets=False, verbose=False)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - tuning must not break the caller's GEMM
        print(f"gemmkit: autotuning {where} failed after {format_seconds(time.time() - t0)}: "
              f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return False
    finally:
        _tuning = False
    print(f"gemmkit: autotuned {where} ({dtype}) in {format_seconds(time.time() - t0)}; stored in {out}",
          file=sys.stderr, flush=True)
    return True
