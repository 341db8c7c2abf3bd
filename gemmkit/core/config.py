"""GEMM configs: the type, the tuned JSON tables, and configs derived from a device's limits.

Tables live in ``gemmkit/configs/<DEVICE>/<op>.json`` (DEVICE as in ``DeviceInfo.name``), and
yours, merged over them, in ``user_config_dir()/<DEVICE>/<op>.json``::

    {"buckets": {"M_LEQ_16": {...}, ..., "any": {...}},
     "shapes":  {"4096,14336": {"M_LEQ_16": {...}, ...}}}

A lookup for (M, N, K) takes the exact "N,K" entry if it has a bucket for M (the smallest bucket
with M <= bound, else "any"), else your generic bucket, else up to M = NEAREST_SHAPE_MAX_M the
nearest tuned shape's entry (refitted: its K slices where its tiles would leave most SMs idle,
fit_waves; for a16w16 its rows cut to M's, fit_rows), else a config derived from the device
(lookup_entry; the shipped generic buckets serve only tables without shape entries). A Hopper part
without a shipped table of its own for an op reads the H100's (shipped_device). With no table or no
fitting entry the config is derived from the device (shared memory, SM count) and the shape. Results
are cached per (op, M bucket, N, K, dtypes, device), so the per-call cost is one dict lookup.
On sm_90 the problems core/hopper_ws.py takes (bf16 / fp16 from 128 rows, FP8) run its warp-specialized
kernel, whose tiles are fitted to the shape there, not read from these tables: 128 or 64 rows, a width that
fills the SMs' waves, K slices where tiles are few; at M not a multiple of 128, the 128-row, 64-row or
swapped tiles (x's rows as the columns) whose waves cost least (ws_ragged_tiles).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..registry import TABLES  # the ops' config tables (file names under configs/<DEVICE>/)
from .device import DeviceInfo
from .formats import OperandFormat, Scale, check_block_k

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

# Upper bounds of the M buckets; larger M falls in "any".
M_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

# Shared memory per block left free by the configs' estimate (GemmConfig.smem_bytes): barriers and
# the few hundred bytes the compiler adds (measured: at most 1 KB on the tuner's search space).
SMEM_SLACK = 2 * 1024

# Small-M GEMMs are dominated by host launch cost in eager mode: keep them on pointer loads, which
# need no per-call tensor-descriptor encoding (see README, "Host cost").
TMA_MIN_M = 128


def m_bucket(M: int) -> str:
    for bound in M_BUCKETS:
        if M <= bound:
            return f"M_LEQ_{bound}"
    return "any"


def bucket_bound(bucket: str) -> int | None:
    return None if bucket == "any" else int(bucket.rsplit("_", 1)[1])


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def next_pow2(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


@dataclass(frozen=True)
class GemmConfig:
    """Launch parameters of the shared GEMM kernel.

    BLOCK_M/N/K: tile sizes. GROUP_M: tile-rows per group of the grouped (L2-friendly) order.
    SPLIT_K: K slices computed by separate programs; the last slice of a tile to finish sums them.
    TMA: operand loads and output stores through tensor descriptors where the layout allows
    (Hopper and newer); otherwise masked pointer accesses. PERSISTENT: one program per SM looping
    over tiles, with the tile and K loops flattened into one software-pipelined loop.
    WARP_SPECIALIZE: producer/consumer warp groups (needs TMA and PERSISTENT). EPILOGUE_SUBTILE:
    store the tile in two halves (halves the epilogue's shared memory, freeing it for stages).
    STREAM_K: on the persistent grid, the tiles of the ragged last wave are computed in K slices
    (as many as keep every slice on its own SM, at most sqrt(K tiles), at least 4 K tiles each:
    core/dense.py stream_k_tail), so that the last wave
    costs a fraction of a tile rather than a whole one while the full waves run as data-parallel
    tiles (needs PERSISTENT and SPLIT_K == 1; the slices of a tile meet like split-K slices).
    """

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 8
    SPLIT_K: int = 1
    num_warps: int = 4
    num_stages: int = 3
    TMA: bool = False
    PERSISTENT: bool = False
    WARP_SPECIALIZE: bool = False
    EPILOGUE_SUBTILE: bool = False
    STREAM_K: bool = False

    def __post_init__(self):
        errors = []
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            v = getattr(self, name)
            if not _is_int(v) or not _pow2(v) or not 16 <= v <= 512:
                errors.append(f"{name}={v!r} must be a power of two in [16, 512]")
        if not _is_int(self.GROUP_M) or self.GROUP_M < 1:
            errors.append(f"GROUP_M={self.GROUP_M!r} must be an int >= 1")
        if not _is_int(self.SPLIT_K) or not 1 <= self.SPLIT_K <= 64:
            errors.append(f"SPLIT_K={self.SPLIT_K!r} must be an int in [1, 64]")
        if not _is_int(self.num_warps) or self.num_warps not in (1, 2, 4, 8, 16):
            errors.append(f"num_warps={self.num_warps!r} must be 1, 2, 4, 8 or 16")
        if not _is_int(self.num_stages) or not 1 <= self.num_stages <= 8:
            errors.append(f"num_stages={self.num_stages!r} must be an int in [1, 8]")
        for name in ("TMA", "PERSISTENT", "WARP_SPECIALIZE", "EPILOGUE_SUBTILE", "STREAM_K"):
            if not isinstance(getattr(self, name), bool):
                errors.append(f"{name} must be a bool")
        if self.WARP_SPECIALIZE and not (self.TMA and self.PERSISTENT):
            errors.append("WARP_SPECIALIZE needs TMA and PERSISTENT")
        if self.STREAM_K and not (self.PERSISTENT and self.SPLIT_K == 1):
            errors.append("STREAM_K needs PERSISTENT and SPLIT_K=1")
        if errors:
            raise ValueError("config: " + "; ".join(errors))

    @classmethod
    def from_dict(cls, d: dict) -> "GemmConfig":
        if isinstance(d, GemmConfig):
            return d
        if not isinstance(d, dict):
            raise TypeError(f"config must be a dict or GemmConfig, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"config: unknown keys {sorted(unknown)}; known keys: {sorted(known)}")
        missing = {"BLOCK_M", "BLOCK_N", "BLOCK_K"} - set(d)
        if missing:
            raise ValueError(f"config: missing keys {sorted(missing)}")
        return cls(**d)

    def to_dict(self) -> dict:
        """The fields as a dict; STREAM_K (added after the first tables and tuning records) only
        when set, so that a config's dict, and the tuner's key of it, did not change."""
        d = dataclasses.asdict(self)
        if not self.STREAM_K:
            del d["STREAM_K"]
        return d

    def smem_bytes(self, a: OperandFormat, b: OperandFormat, out_bytes: int) -> int:
        """Shared memory the pipelined loop and a TMA-store epilogue need, as Triton 3.6 lays it out
        for sm_90 (within SMEM_SLACK on the tuner's search space, except a few stream-K and 64-row
        subtiled configs far below the limit; checked with gemmkit.tools.codegen)."""
        a_tile = self.BLOCK_M * self.BLOCK_K * a.bytes
        b_tile = self.BLOCK_N * self.BLOCK_K * b.bytes
        # Pointer loads feeding mma.sync (BLOCK_M < 64) keep num_stages - 1 tiles in flight;
        # warpgroup MMA reads operands from shared memory, all num_stages buffers of them.
        mma_sync = self.BLOCK_M < 64
        lagged = max(1, self.num_stages - 1)
        a_quant = bool(a.quantize)
        if a_quant:  # A through registers (quantized there), then one converted tile in shared memory
            loop = (a_tile + b_tile) * lagged if mma_sync else a_tile * lagged + b_tile * self.num_stages
            loop += a_tile if mma_sync else self.BLOCK_M * self.BLOCK_K
        elif mma_sync and not self.TMA:
            loop = (a_tile + b_tile) * lagged
        else:
            loop = (a_tile + b_tile) * self.num_stages
        for f, rows in ((a, self.BLOCK_M), (b, self.BLOCK_N)):  # 4-bit: the 16-bit tile dequantized for the dot
            if f.bits < f.dot_bits:
                loop += rows * self.BLOCK_K * f.dot_bits // 8
        epilogue = self.BLOCK_M * self.BLOCK_N * out_bytes
        if self.EPILOGUE_SUBTILE:
            epilogue //= 2
        # split-K stores through pointers (the last K slice of a tile runs the epilogue)
        return int(loop + (epilogue if self.TMA and self.SPLIT_K == 1 and not a_quant else 0))

    def fits(self, dev: DeviceInfo, a: OperandFormat, b: OperandFormat, out_bytes: int) -> bool:
        """The estimate leaves SMEM_SLACK of the device's shared memory per block free."""
        return self.smem_bytes(a, b, out_bytes) <= dev.smem_per_block - SMEM_SLACK


def shrink_config(cfg: GemmConfig, a: OperandFormat, b: OperandFormat) -> GemmConfig | None:
    """The next config of the one shrinking policy (fitting a table entry to other operand or output
    widths, and a config that failed to launch): a split epilogue first (it costs no pipelining),
    then fewer stages, then a shorter K step, then narrower tiles. None when nothing is left."""
    least_k = max(a.min_block_k(), b.min_block_k())
    if cfg.TMA and not cfg.EPILOGUE_SUBTILE and cfg.BLOCK_N >= 32:
        return dataclasses.replace(cfg, EPILOGUE_SUBTILE=True)
    if cfg.num_stages > 2:
        return dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
    if cfg.BLOCK_K > least_k:
        return dataclasses.replace(cfg, BLOCK_K=cfg.BLOCK_K // 2)
    if cfg.BLOCK_N > 16:
        return dataclasses.replace(cfg, BLOCK_N=cfg.BLOCK_N // 2, EPILOGUE_SUBTILE=False)
    return None


def fit_to_smem(cfg: GemmConfig, dev: DeviceInfo, a: OperandFormat, b: OperandFormat, out_bytes: int) -> GemmConfig:
    """`cfg` shrunk (shrink_config) until the estimate fits the device with these operands and
    output (a table entry tuned for a bf16 output may be asked for an fp32 one), and its BLOCK_K
    within what the operands take."""
    most = [m for m in (a.max_block_k(), b.max_block_k()) if m]
    if most and cfg.BLOCK_K > min(most):
        cfg = dataclasses.replace(cfg, BLOCK_K=min(most))
    while not cfg.fits(dev, a, b, out_bytes):
        smaller = shrink_config(cfg, a, b)
        if smaller is None:
            break
        cfg = smaller
    return cfg


def user_config_dir() -> Path:
    """Where `gemmkit tune` writes and lookups read your own tables: $GEMMKIT_CONFIG_DIR, else
    $XDG_CACHE_HOME/gemmkit/configs, else ~/.cache/gemmkit/configs (same <DEVICE>/<op>.json layout
    as the package's configs/)."""
    root = os.environ.get("GEMMKIT_CONFIG_DIR")
    if root:
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "gemmkit" / "configs"


# Layers of a table, in order of precedence: "user" (user_config_dir()) over "shipped" (CONFIG_DIR).
TABLE_LAYERS = ("user", "shipped")


# Hopper parts share the SM (132 or fewer SMs, 227 KB of shared memory per block): where one has no
# shipped table of its own for an op, it reads the H100's (entries are re-fitted to the device).
HOPPER_FALLBACK = "NVIDIA_H100_80GB_HBM3"
_HOPPER_NAME = re.compile(r"NVIDIA_G?H(100|200|800|20)(_|$)")


def shipped_device(device_name: str, op: str) -> str:
    """The device whose shipped table of `op` serves `device_name`: its own where the package has
    one, else, for a Hopper part, HOPPER_FALLBACK's (e.g. an H200 without an H200 table)."""
    if (CONFIG_DIR / device_name / f"{op}.json").is_file() or not _HOPPER_NAME.match(device_name):
        return device_name
    return HOPPER_FALLBACK


def table_path(device_name: str, op: str, layer: str, read: bool = False) -> Path:
    """The file of one layer of `op`'s table for `device_name` (what the tuner writes); read=True:
    the file a lookup reads (the shipped layer: shipped_device's)."""
    if layer not in TABLE_LAYERS:
        raise ValueError(f"table_path: layer must be one of {TABLE_LAYERS}, got {layer!r}")
    if layer == "user":
        return user_config_dir() / device_name / f"{op}.json"
    return CONFIG_DIR / (shipped_device(device_name, op) if read else device_name) / f"{op}.json"


@functools.lru_cache(maxsize=None)
def load_table(device_name: str, op: str, layer: str | None = None) -> dict | None:
    """The tuned table of `op` for this device: the user table (user_config_dir(), what
    `gemmkit tune` writes) merged over the package's, or one `layer` of the two alone. None
    where there is none. Merge: a user "shapes" entry overrides or extends the shipped one per
    (N, K) and per M bucket; user "buckets" override per bucket."""
    if layer is not None:
        path = table_path(device_name, op, layer, read=True)
        if not path.is_file():
            return None
        return read_table(path)
    user, shipped = (load_table(device_name, op, name) for name in TABLE_LAYERS)
    if user is None or shipped is None:
        return user or shipped
    shapes = {nk: dict(entries) for nk, entries in shipped.get("shapes", {}).items()}
    for nk, entries in user.get("shapes", {}).items():
        shapes.setdefault(nk, {}).update(entries)
    return {"buckets": {**shipped.get("buckets", {}), **user.get("buckets", {})}, "shapes": shapes}


BUCKET_KEYS = tuple(f"M_LEQ_{b}" for b in M_BUCKETS) + ("any",)


def read_table(path: Path) -> dict:
    """A config table file, checked: a JSON object whose "buckets" map bucket keys (BUCKET_KEYS) to configs and
    whose "shapes" map "N,K" to such maps (keys starting with "_": metadata); every config a valid GemmConfig.
    ValueError naming the file and the entry otherwise (a hand-edited or truncated user table)."""
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"config table {path}: cannot be read as JSON ({e})") from None

    def bad(where, why):
        return ValueError(f"config table {path}: {where}: {why}")

    def check_entries(where, entries):
        if not isinstance(entries, dict):
            raise bad(where, f"expected an object of bucket keys, got {type(entries).__name__}")
        for key, entry in entries.items():
            if key not in BUCKET_KEYS:
                raise bad(where, f"bucket key {key!r} is not one of {', '.join(BUCKET_KEYS)}")
            try:
                GemmConfig.from_dict(entry)
            except (TypeError, ValueError) as e:
                raise bad(f"{where} {key}", e) from None

    if not isinstance(table, dict):
        raise bad("top level", f"expected an object, got {type(table).__name__}")
    unknown = [k for k in table if k not in ("buckets", "shapes") and not k.startswith("_")]
    if unknown:
        raise bad("top level", f"unknown keys {unknown} (tables hold \"buckets\" and \"shapes\")")
    check_entries("buckets", table.get("buckets", {}))
    shapes = table.get("shapes", {})
    if not isinstance(shapes, dict):
        raise bad("shapes", f"expected an object of \"N,K\" keys, got {type(shapes).__name__}")
    for nk, entries in shapes.items():
        parts = nk.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise bad("shapes", f"key {nk!r} is not \"N,K\"")
        check_entries(f"shapes {nk}", entries)
    return table


def _bucket_key(entries: dict | None, M: int) -> str | None:
    """The smallest M_LEQ_x key of `entries` with M <= x, else "any" if present."""
    if not entries:
        return None
    best = None
    for key in entries:
        bound = bucket_bound(key)
        if bound is not None and M <= bound and (best is None or bound < best[0]):
            best = (bound, key)
    if best is not None:
        return best[1]
    return "any" if "any" in entries else None


DERIVED = "derived from the device"


# Shapes without a table entry, up to this M: the nearest tuned shape's entry for M's bucket;
# above it, the config derived from the device. Measured on the held-out layers (models.json
# heldout-*; scripts/fallback_probe.py, H100, a16w16 vs F.linear, geomeans over 5 models): at M =
# 1, 8, 32, 128 the nearest shape's entry 1.020 / 1.013 / 0.972 / 0.869 against the generic buckets'
# 0.992 / 0.977 / 0.906 / 0.799 and derived 1.012 / 1.010 / 0.949 / 0.728; at M = 512, 2048, 8192
# derived 0.837 / 0.917 / 0.979 against nearest 0.783 / 0.889 / 0.978 and buckets 0.777 / 0.863 / 0.948.
# Since the derived rule takes 64-row tiles up to M = 128, it beats the nearest entry there too (all
# eight held-out models, one run: A16W16 0.880 against 0.849, FP8 1.006 against 1.001), hence 64.
NEAREST_SHAPE_MAX_M = 64
NEAREST = "nearest shape"  # (in lookup_entry's sources: an entry borrowed from another shape)
ONE_WAVE_TABLES = ("a16w16",)  # derive_config's one_wave rule: measured on these


def lookup_entry(device_name: str, op: str, M: int, N: int, K: int) -> tuple[dict | None, str]:
    """(table entry, where it came from) for this problem, in this order: the merged tables' exact
    "N,K" entry if it has a bucket for M; your generic buckets; for M <= NEAREST_SHAPE_MAX_M the
    nearest tuned shape's entry (nearest_shape_entry); the shipped generic buckets only for a table
    without shape entries; else (None, DERIVED): derive_config. The source names the layer and
    section ("user table shape entry", "shipped table nearest shape 4096,4096", ...)."""
    merged = load_table(device_name, op)
    if merged is None:
        return None, DERIVED
    user = load_table(device_name, op, "user") or {}
    fallback = shipped_device(device_name, op)
    shipped = "shipped table" + ("" if fallback == device_name else f" ({fallback}'s, the Hopper fallback)")

    def layer(user_entries, key):
        return "user table" if key in (user_entries or {}) else shipped

    nk = f"{N},{K}"
    entries, user_entries = merged.get("shapes", {}).get(nk), user.get("shapes", {}).get(nk)
    key = _bucket_key(entries, M)
    if key is not None:
        return entries[key], f"{layer(user_entries, key)} shape entry"
    bucket = _bucket_key(merged.get("buckets"), M)  # user buckets override the shipped ones per bucket
    if bucket is not None and bucket in user.get("buckets", {}):
        return merged["buckets"][bucket], "user table generic bucket"
    if M <= NEAREST_SHAPE_MAX_M:
        entry, (n2, k2) = nearest_shape_entry(device_name, op, M, N, K)
        if entry is not None:
            near = f"{n2},{k2}"
            key = _bucket_key(merged["shapes"][near], M)
            return entry, f"{layer(user.get('shapes', {}).get(near), key)} {NEAREST} {near}"
    if bucket is not None and not merged.get("shapes"):
        return merged["buckets"][bucket], f"{shipped} generic bucket"
    return None, DERIVED


def fit_waves(cfg: GemmConfig, M: int, N: int, K: int, dev: DeviceInfo) -> GemmConfig:
    """A borrowed (nearest-shape) entry's SPLIT_K raised where this shape's programs would fill
    less than half of the SMs: up to num_sms // tiles slices of at least 4 K tiles, as
    derive_config splits. At M = 32 and 64 on Llama-3-70B / TP8's qkv (N = 1280), 64 x 32 tiles
    tuned for N = 2112 make 40 programs: 0.70x and 0.79x cuBLAS, split in 3: 0.99x and 1.05x.
    Refitting every shape whose tiles fill their waves of program slots less than the nearest
    shape's did (splits up to 8) lost elsewhere: geomean 0.918 against 0.985 over 112 held-out
    problems at M <= 64 (scripts/fallback_probe.py, tuning/fitted/fallback_waves_h100.txt).
    Non-persistent configs only."""
    tiles = -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
    if cfg.PERSISTENT or cfg.STREAM_K or 2 * tiles * cfg.SPLIT_K >= dev.num_sms:
        return cfg
    split = max(cfg.SPLIT_K, min(dev.num_sms // tiles, -(-K // cfg.BLOCK_K) // 4, 16))
    return cfg if split == cfg.SPLIT_K else dataclasses.replace(cfg, SPLIT_K=split)


def nearest_shape_entry(device_name: str, op: str, M: int, N: int, K: int) -> tuple[dict | None, tuple | None]:
    """(entry, (N', K')): M's bucket of the tuned shape nearest to (N, K) (|log2 N/N'| + |log2 K/K'|,
    ties to the larger shape) among the merged tables' shape entries that have a bucket for M;
    (None, (None, None)) where there are none."""
    merged = load_table(device_name, op) or {}
    best = None
    N, K = max(N, 1), max(K, 1)  # (an empty problem borrows the smallest shape's entry: no log of 0)
    for nk, entries in merged.get("shapes", {}).items():
        key = _bucket_key(entries, M)
        if key is None:
            continue
        n2, k2 = (int(v) for v in nk.split(","))
        dist = abs(math.log2(N / n2)) + abs(math.log2(K / k2))
        if best is None or (dist, -n2 * k2) < best[0]:
            best = ((dist, -n2 * k2), entries[key], (n2, k2))
    return (None, (None, None)) if best is None else best[1:]


def _lookup_m(bucket: str, below_tma: bool) -> int:
    """The M a selection for a bucket looks up and derives with (selections are cached per
    bucket): its bound (twice the largest for "any"), below TMA_MIN_M where M is."""
    M = bucket_bound(bucket) or 2 * M_BUCKETS[-1]
    return min(M, TMA_MIN_M - 1) if below_tma else M


def config_source(op: str, M: int, N: int, K: int, dev: DeviceInfo) -> tuple[dict | None, str]:
    """lookup_entry as select_config does it for this M: which entry it starts from, and where
    that came from (DERIVED: no entry; the config is derived from the device)."""
    return lookup_entry(dev.name, op, _lookup_m(m_bucket(M), M < TMA_MIN_M), N, K)


def derive_config(M: int, N: int, K: int, dev: DeviceInfo, a: OperandFormat, b: OperandFormat,
                  out_bytes: int, promote: bool = False, one_wave: bool = False) -> GemmConfig:
    """A config from the device's limits, for shapes and devices without a tuned entry.

    BLOCK_K spans one 128-byte line of the operand (64 bf16, 128 fp8), doubled when M is small and
    the loop only streams weights; BLOCK_M follows M (64 rows up to M = 128); BLOCK_N shrinks until
    the tiles cover the SMs; num_stages fills the shared memory; SPLIT_K makes up for tiles that
    still leave SMs idle when K is long (the way OpenAI's triton_kernels picks its opt_flags); more
    tiles than SMs run on the persistent grid with STREAM_K, which cuts the ragged last wave's
    tiles into K slices (scripts/medium_m_probe.py on held-out layers, H100).

    A K loop that promotes per K block (block-scaled operands; `promote`: FP8 with fp32 promotion
    of every K tile, gemm_a8w8(fast_accum=False)) waits for each tile's tensor-core
    product before scaling it: there, from M = TMA_MIN_M, 4-warp 64x128 (M >= 1024) or 128x64
    tiles, not persistent, with the stages of half the shared memory, so that two programs share
    an SM and one's tensor-core work covers the other's promotion (scripts/accum_probe.py: at
    4096x7168x7168 on the H100 these ran 1.4x the one-program-per-SM 128x256 tiles).

    `one_wave` (ONE_WAVE_TABLES: 16-bit operands without scales) at 64 < M <= 256 with TMA:
    64-row tiles 64 or 128 wide where they make between half a wave and one (the most tiles
    that do), each over the whole K in 128-deep steps, no split-K, as cuBLAS runs such shapes
    (tuning/fitted/cublas_kernels_bf16_h100.txt): at M = 128 on held-out layers 64 x 64 tiles
    0.95x to 1.18x cuBLAS where the pick before (split-K) ran 0.65x to 0.98x, 64 x 128 tiles 0.72x
    to 1.05x against 0.72x to 0.99x (scripts/small_m_probe.py, tuning/fitted/small_m_h100.txt).
    """
    if b.bits < b.dot_bits:
        return _derive_packed(M, N, K, dev, a, b, out_bytes)
    if one_wave and 64 < M <= 256 and dev.has_tma and M >= TMA_MIN_M and a.bits == b.bits == 16:
        cfg = _one_wave_config(M, N, K, dev, a, b, out_bytes)
        if cfg is not None:
            return cfg
    small_m = M <= 64
    promoting = promote or promotes(a, b)
    block_m = min(128 if M > 128 else 64, max(16, next_pow2(M)))
    block_n = 64 if small_m else (256 if M >= 1024 and N >= 4096 else 128)
    if promoting and not small_m:
        block_m, block_n = (64, 128) if M >= 1024 else (128, 64)
    block_n = min(block_n, max(16, next_pow2(N)))
    tiles = lambda bn: -(-M // block_m) * -(-N // bn)  # noqa: E731
    while small_m and block_n > 32 and tiles(block_n) < dev.num_sms:
        block_n //= 2
    dot_bytes = max(a.dot_bits, b.dot_bits) / 8
    block_k = max(16, int(128 // dot_bytes))
    if small_m and K >= 8 * block_k and not promoting:  # (promoting loops: one scale block or 128 of K)
        block_k *= 2
    block_k = min(block_k, max(max(a.min_block_k(), b.min_block_k()), next_pow2(K)))
    num_warps = 8 if block_m * block_n >= 128 * 256 else 4
    use_tma = dev.has_tma and M >= TMA_MIN_M
    # two programs per SM: each gets half the SM's shared memory (the per-block limit + 1 KB) less
    # the 1 KB reserved per block; a slightly low estimate then costs the second program, not a launch
    shared = (dev.smem_per_block + 1024) // 2 - 1024 + SMEM_SLACK if promoting and use_tma else dev.smem_per_block
    work = tiles(block_n)
    split_k = 1
    k_tiles = -(-K // block_k)
    if work < dev.num_sms and k_tiles >= 8:
        split_k = max(1, min(dev.num_sms // work, k_tiles // 4, 16))
    persistent = use_tma and split_k == 1 and work > dev.num_sms and not promoting
    subtile = use_tma and block_n >= 128 and block_m >= 128
    # persistent: the ragged last wave in K slices (STREAM_K; plain waves where it divides evenly)
    cfg = fit_to_smem(GemmConfig(block_m, block_n, block_k, 8, split_k, num_warps, 2, use_tma, persistent,
                                 False, subtile, persistent), dev, a, b, out_bytes)
    stages = cfg.num_stages
    while stages < 6 and dataclasses.replace(cfg, num_stages=stages + 1).smem_bytes(a, b, out_bytes) <= shared - SMEM_SLACK:
        stages += 1
    return dataclasses.replace(cfg, num_stages=stages)


def _one_wave_config(M: int, N: int, K: int, dev: DeviceInfo, a: OperandFormat, b: OperandFormat,
                     out_bytes: int) -> GemmConfig | None:
    """derive_config's `one_wave` tiles, or None where neither width makes half a wave to one."""
    for block_n in (64, 128):
        if dev.num_sms // 2 <= -(-M // 64) * -(-N // block_n) <= dev.num_sms:
            block_k = min(128, max(16, next_pow2(K)))
            cfg = fit_to_smem(GemmConfig(64, block_n, block_k, 8, 1, 4, 2, True, False, False, False, False),
                              dev, a, b, out_bytes)
            stages = cfg.num_stages
            while stages < 6 and dataclasses.replace(cfg, num_stages=stages + 1).smem_bytes(
                    a, b, out_bytes) <= dev.smem_per_block - SMEM_SLACK:
                stages += 1
            return dataclasses.replace(cfg, num_stages=stages)
    return None


# packed INT4 B (groups >= 128) at decode sizes: up to this M, 64-row x 256-deep B tiles, ~3 programs per SM
PACKED_DECODE_MAX_M = 16


def _derive_packed(M: int, N: int, K: int, dev: DeviceInfo, a: OperandFormat, b: OperandFormat,
                   out_bytes: int) -> GemmConfig:
    """derive_config for a packed 4-bit B (decoded in registers, pointer loads).

    Up to M = PACKED_DECODE_MAX_M (decode), INT4 in groups of 128 or more: 64-row x 256-deep B
    tiles (128 contiguous bytes per row and K tile), 4 warps, and split-K to the power of two that
    puts about 3 programs per SM in flight (scripts/w4_decode_probe.py on the H100, INT4 g128 at
    M = 1 and 16 on six Llama-3 layers: up to 1.5x the 128-row tiles below, within 6% of the best
    config measured on 10 of 12 points, the other two at split-K 7 before the power-of-two
    rounding, whose 8 measured within 2%; MXFP4, whose 32-wide scale groups cut a 256-deep tile
    into 8 decode steps, measured faster with the 128-row tiles). Otherwise up to M = 64: 128-row B tiles,
    128-wide K tiles, 4 warps, split-K until the tiles cover the SMs twice (scripts/w4_sweep.py;
    256-deep tiles held twice the registers at M = 64). Larger M: 128x128x128 tiles with 8 warps,
    which share out the decoding.
    """
    decode = M <= PACKED_DECODE_MAX_M and b.group_k >= 128
    if decode:
        block_m, block_n, block_k, warps, per_sm = 16, 64, 256, 4, 3
    elif M <= 64:
        block_m, block_n, block_k, warps, per_sm = max(16, next_pow2(M)), 128, 128, 4, 2
    else:
        block_m, block_n, block_k, warps, per_sm = 128, 128, 128, 8, 2
    block_n = min(block_n, max(16, next_pow2(N)))
    block_k = max(32, min(block_k, next_pow2(K)))
    tiles = -(-M // block_m) * -(-N // block_n)
    k_tiles = -(-K // block_k)
    split_k = 1
    if decode:
        split_k = max(1, min(next_pow2(-(-per_sm * dev.num_sms // tiles)), k_tiles // 4, 16))
    elif tiles < dev.num_sms:
        split_k = max(1, min(per_sm * dev.num_sms // tiles, k_tiles // 4, 16))
    cfg = fit_to_smem(GemmConfig(block_m, block_n, block_k, 8, split_k, warps, 2, False, False, False, False),
                      dev, a, b, out_bytes)
    stages = cfg.num_stages
    while stages < 3 and (dataclasses.replace(cfg, num_stages=stages + 1).smem_bytes(a, b, out_bytes)
                          <= dev.smem_per_block - SMEM_SLACK):
        stages += 1
    return dataclasses.replace(cfg, num_stages=stages)


# tables of K loops that promote every K tile to fp32 (derived configs as for block scales), and
# the deepest K tile whose FP8 partial sum accumulates in the tensor cores before its promotion
# there (4 wgmma K steps, as DeepGEMM and cuBLASLt promote)
PROMOTING_TABLES = ("a8w8_fp8_exact",)
EXACT_MAX_BLOCK_K = 128


def promotes(a: OperandFormat, b: OperandFormat, table: str | None = None) -> bool:
    """Whether the K loop promotes each K tile's product to fp32 before the next one: K-block
    scales, an A quantized per group in the kernel, or an op of a PROMOTING_TABLES table."""
    return Scale.KBLOCK in (a.scale, b.scale) or a.quantize == "group" or table in PROMOTING_TABLES


# Tables whose borrowed (nearest-shape) entries get fit_rows: measured on a16w16's.
ROWS_CAP_TABLES = ("a16w16",)


def fit_rows(cfg: GemmConfig, M: int) -> GemmConfig:
    """A borrowed entry's BLOCK_M cut to M's rows (a power of two from 16): a tile taller than the
    problem computes rows that do not exist. On the held-out layers at M = 32 (scripts/fallback_probe.py
    --rows, tuning/fallback_m32/fallback_rows_h100.txt) it lifted the two under 0.85x cuBLAS (Qwen3-32B
    TP2 down, 64 x 32 tiles borrowed from N, K = 4096, 12288: 0.84x -> 1.04x; Gemma-2-27B qkv 0.83x
    -> 0.87x), cost up to 0.06 on 11 others, geomean 0.981 either way; at M = 8 and 64 no borrowed
    entry was taller."""
    rows = max(16, 1 << (M - 1).bit_length())
    return cfg if cfg.BLOCK_M <= rows else dataclasses.replace(cfg, BLOCK_M=rows)


@functools.lru_cache(maxsize=8192)
def _select(op: str, bucket: str, below_tma: bool, N: int, K: int, dev: DeviceInfo, a: OperandFormat,
            b: OperandFormat, out_bytes: int) -> GemmConfig:
    M = _lookup_m(bucket, below_tma)  # a bucket straddling TMA_MIN_M derives for an M below it
    cfg, source = lookup_entry(dev.name, op, M, N, K)
    if cfg is not None:
        cfg = fit_to_smem(GemmConfig.from_dict(cfg), dev, a, b, out_bytes)
        why = check_block_k(cfg.BLOCK_K, a, b)
        if why:  # (an entry of another op's operands: a hand-edited user table)
            raise ValueError(f"config table {op} ({source}) for N={N} K={K}, {bucket}: {why}")
        # (not where x is quantized in the kernel: each K slice would quantize its own range)
        if NEAREST in source and not a.quantize:
            cfg = fit_waves(cfg, M, N, K, dev)
            return fit_rows(cfg, M) if op in ROWS_CAP_TABLES else cfg
        return cfg
    return derive_config(M, N, K, dev, a, b, out_bytes, promote=op in PROMOTING_TABLES,
                         one_wave=op in ONE_WAVE_TABLES)


def select_config(op: str, M: int, N: int, K: int, dev: DeviceInfo, a: OperandFormat, b: OperandFormat,
                  out_bytes: int) -> GemmConfig:
    """The config for this op and shape on this device, with these operand formats: tuned entry,
    else derived."""
    if op not in TABLES:
        raise ValueError(f"select_config: unknown table {op!r}; one of {TABLES}")
    if M < 0 or N < 0 or K < 0:
        raise ValueError(f"select_config: M, N, K must be >= 0, got {(M, N, K)}")
    from ..tools.autotune import maybe_autotune  # returns at once unless GEMMKIT_AUTOTUNE is set

    # (clears the caches when it wrote an entry; x quantized in the kernel: its tool op is named by the target dtype)
    maybe_autotune(op, M, N, K, dev, a.dtype if a.quantize else (a.stored or a.dtype))
    return _select(op, m_bucket(M), M < TMA_MIN_M, N, K, dev, a, b, out_bytes)


def with_epilogue_inputs(cfg: GemmConfig) -> GemmConfig:
    """A table config adapted to an epilogue that reads (M, N) inputs (fused mul/add): their tiles
    pass through shared memory, which the persistent loop's stages already fill (a persistent
    128x256 tile needed 245 KB of the H100's 227), so persistent configs become one program per
    tile with a subtiled epilogue (scripts/epilogue_inputs_probe.py on the H100 at M = 4096:
    1.11-1.60x the torch sequence, where the shrunk persistent configs gave 0.78-1.10x)."""
    if not cfg.PERSISTENT:
        return cfg
    return dataclasses.replace(cfg, PERSISTENT=False, STREAM_K=False, WARP_SPECIALIZE=False, EPILOGUE_SUBTILE=True)


def gated_tiles(cfg: GemmConfig) -> GemmConfig:
    """A derived or table config fitted to a gated epilogue (two accumulators, gate and up, one K
    loop): at most 128 x 128 per accumulator, 8 warps from there (two 128 x 128 accumulators hold
    what one 128 x 256 tile does). Wider tiles spill: moe_mlp's gated grouped GEMM on 128 x 256
    tiles ran 6x slower than on 128 x 128 (Mixtral-8x7B, 4096 tokens, H100)."""
    while cfg.BLOCK_M * cfg.BLOCK_N > 128 * 128 and cfg.BLOCK_N > 16:
        cfg = dataclasses.replace(cfg, BLOCK_N=cfg.BLOCK_N // 2)
    return dataclasses.replace(cfg, num_warps=8 if cfg.BLOCK_M * cfg.BLOCK_N >= 128 * 128 else 4)


def resolve_config(table: str, config, M: int, N: int, K: int, dev: DeviceInfo, a: OperandFormat,
                   b: OperandFormat, out_bytes: int) -> GemmConfig:
    """The caller's config (checked against the operands), else the table's or a derived one."""
    if config is None:
        return select_config(table, M, N, K, dev, a, b, out_bytes)
    if not isinstance(config, (dict, GemmConfig)):
        raise TypeError(f"config must be None, a dict or a GemmConfig, got {type(config).__name__}")
    cfg = GemmConfig.from_dict(config)
    why = check_block_k(cfg.BLOCK_K, a, b)
    if why:
        raise ValueError(f"config: {why}")
    return cfg


_plan_caches: list = []


def register_plan_cache(cache) -> None:
    """An op's plan cache (plans hold configs): emptied by clear_caches."""
    _plan_caches.append(cache)


def clear_caches() -> None:
    """Forget loaded tables, selections and the ops' plans (after the tuner rewrote a table, or
    the user config directory changed)."""
    load_table.cache_clear()
    _select.cache_clear()
    for cache in _plan_caches:
        cache.clear()
