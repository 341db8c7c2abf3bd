"""`gemmkit configs show`: which config a call would use, and where it came from.

For each op's config table and each problem (M, N, K): the config select_config picks on this
device (or on a known GPU's profile, --device-name), and its source: your user table's or the
shipped table's shape entry or generic bucket, or derived from the device; on sm_90, where the
warp-specialized Gluon kernel takes the problem instead, its tiles. Needs no GPU.
"""

from __future__ import annotations

import argparse
import dataclasses

from ..core.config import GemmConfig, config_source, select_config, table_path, user_config_dir
from ..core.device import KNOWN_DEVICES, DeviceInfo, device_info, known_device
from .registry import DTYPES, OPS, get_op, op_dtype, table_op

# Illustrative problems: decode, prefill and square, on Llama-3 8B weights and one untuned shape.
DEFAULT_SHAPES = [(16, 4096, 4096), (256, 6144, 4096), (4096, 28672, 4096), (8192, 8192, 8192), (64, 3000, 1000)]
OUT_DTYPES = ("bf16", "fp16", "fp32")
_FLAGS = ("TMA", "PERSISTENT", "WARP_SPECIALIZE", "EPILOGUE_SUBTILE", "STREAM_K")


def describe(cfg: GemmConfig) -> str:
    """'128x256x64 GROUP_M=8 SPLIT_K=1 warps=8 stages=3 TMA PERSISTENT'"""
    flags = [f for f in _FLAGS if getattr(cfg, f)]
    return " ".join([f"{cfg.BLOCK_M}x{cfg.BLOCK_N}x{cfg.BLOCK_K} GROUP_M={cfg.GROUP_M} SPLIT_K={cfg.SPLIT_K} "
                     f"warps={cfg.num_warps} stages={cfg.num_stages}", *flags])


def device_line(dev: DeviceInfo, named: bool) -> str:
    specs = f"{dev.num_sms} SMs, {dev.smem_per_block} B shared memory per block, {dev.l2_bytes >> 20} MB L2"
    if named:
        return f"device: {dev.name} (its known profile: {specs}; not necessarily this machine's)"
    if dev.interpreter:
        known = next(iter(KNOWN_DEVICES))
        return (f"device: {dev.name}, the Triton interpreter's profile ({specs}): no CUDA GPU in use; "
                f"--device-name {known} shows what that GPU would pick")
    return f"device: {dev.name} ({specs})"


def gluon_route(table: str, M: int, N: int, K: int, dev: DeviceInfo) -> str | None:
    """What the warp-specialized Gluon kernel (sm_90, core/hopper_ws.py) takes of this problem for
    the op of `table` (called with the library's own config, no activation, TMA-addressable
    operands), or None where it does not (another device, sizes its rules leave to the tl kernel)."""
    from ..core import hopper_ws as hw

    if dev.interpreter or tuple(dev.capability) != (9, 0):
        return None
    sms = dev.num_sms
    if table in ("a16w16", "a8w8_fp8"):
        fp8 = table == "a8w8_fp8"
        if not hw.ws_direct_ok(M, N, K, sms, fp8):
            return None
        (rows, parts), block_k = hw.ws_tiles(M, N, sms, fp8), 128 if fp8 else 64
        swap = None if fp8 else hw.ws_dense_swap(M, N, K, sms)
        if swap is not None:  # (x's rows as the tiles' columns)
            width = swap[0] + swap[1]
            splits = hw.ws_splits(N, M, K, sms, width, block_k)
            return (f"swapped operands: 128 weight rows x {width} rows of x per tile"
                    + (f" ({swap[0]} + {swap[1]})" if swap[1] else "") + (f", {splits} K slices" if splits > 1 else ""))
    elif table in ("a8w8_fp8_exact", "a8w8_blockscale"):
        kblock = table == "a8w8_blockscale"
        if not hw.ws_shape_ok(M, N, K, sms, kblock):
            return None
        wide = hw.ws_block_n(M, N, sms, kblock) == 2 * hw.BLOCK
        rows, parts, block_k = hw.BLOCK, ((hw.BLOCK, hw.BLOCK) if wide else (hw.BLOCK, 0)), 128
    elif table == "ff_gated_a16w16":
        if not hw.ws_gated_ok(M, N, K, sms):
            return None
        w = hw.ws_gated_width(M, N, sms)
        return f"gated tiles of 128 rows x ({w} gate + {w} up) columns"
    else:
        return None
    width = parts[0] + parts[1]
    splits = hw.ws_splits(M, N, K, sms, width, block_k, rows)
    shape = f"{rows} x {width} tiles" + (f" ({parts[0]} + {parts[1]})" if parts[1] else "")
    return shape + (f", {splits} K slices" if splits > 1 else "")


def w4_route(table: str, M: int, N: int, K: int, dev: DeviceInfo) -> str | None:
    """What the Gluon 4-bit decode, prefill or weight-tile kernel (sm_90, core/hopper_w4.py) takes of this problem for
    the op of `table` (a16w4: INT4 in groups of 128 with bf16 x, as `gemmkit bench` builds it;
    a16wfp4: MXFP4), or None where neither does."""
    from ..core import hopper_w4 as h4

    if table not in ("a16w4", "a16wfp4") or dev.interpreter or tuple(dev.capability) != (9, 0):
        return None
    mxfp4 = table == "a16wfp4"
    group = 32 if mxfp4 else 128
    if h4.prefill_sizes_ok(M, N, K, group, mxfp4, dev):
        bm, bn, per_sm = h4.prefill_tile(M, N, dev)
        splits = h4.prefill_splits(M, N, K, bm, bn, per_sm, dev)
        return (f"the prefill kernel (kernels/gemm_w4_prefill.py): x permuted into its K order, then {bn} weight "
                f"rows x {bm} rows of x per tile, {per_sm} program(s) per SM"
                + (f", K in {splits} slices (sums by atomics, finished by a second launch)" if splits > 1 else ""))
    if h4.tile_sizes_ok(M, N, dev) and K % 64 == 0:
        rows, (n0, n1) = h4.tile_shape(M)
        from ..core import hopper_ws as hw

        splits = hw.ws_splits(N, M, K, dev.num_sms, n0 + n1, 64, rows)
        return (f"the warp-specialized GEMM with the 4-bit weight as A (kernels/gemm_ws.py W_FORMAT): {rows} weight "
                f"rows x {n0 + n1} rows of x per tile, a decoder warp group writing each K block's values"
                + (f", K in {splits} slices (summed by a second launch)" if splits > 1 else ""))
    if not h4.decode_sizes_ok(M, N, K, group, mxfp4):
        return None
    sp = h4.decode_split(M, N, K, dev, group, mxfp4)
    finish = ("" if sp.slices == 1 else ", the slices' sums finished by their last program"
              if h4.finish_in_kernel(sp) else ", the slices' sums finished by a second launch")
    return (f"{sp.bn}-row weight tiles, K in {sp.slices} slices of {sp.ks} x 128, up to {sp.per_sm} programs "
            f"per SM, {sp.stages} loads of {sp.box} x 128 in flight{finish}"
            + ("" if mxfp4 else " (INT4 groups of 128; groups of 32 / 64 up to 16 rows)"))


def op_config(table: str, M: int, N: int, K: int, dev: DeviceInfo, formats, out_bytes: int) -> GemmConfig:
    """The config the op of `table` resolves for this problem, through the op's own rules where it has them: the
    gated feed-forward's whole tiles (ops/fused._gated_config), the grouped GEMMs' (ops/grouped.grouped_config, M
    the rows per expert the grouped tables are keyed by); else select_config."""
    if table.startswith("ff_gated_"):
        from ..ops.fused import _gated_config

        return _gated_config(None, table, M, N, K, dev, *formats, out_bytes)
    if table.startswith("grouped_"):
        from ..core.grouped import family_config
        from ..ops.grouped import grouped_config

        # (as GroupedPlan runs it: one piece per tile)
        return family_config(grouped_config(table[len("grouped_"):], False, None, M, N, K, dev, *formats, out_bytes))
    return select_config(table, M, N, K, dev, *formats, out_bytes)


def show_lines(ops, shapes, dev: DeviceInfo, dtype: str | None, out_dtype: str) -> list[str]:
    out_bytes = DTYPES[out_dtype].itemsize
    lines = []
    for op in ops:
        dt = op_dtype(op, dtype)
        lines.append(f"\n{op.name}: table {op.table}, {dt} operands, {out_dtype} output")
        for layer in ("user", "shipped"):
            path = table_path(dev.name, op.table, layer, read=True)
            lines.append(f"  {layer} table: {path}{'' if path.is_file() else ' (none)'}")
        for M, N, K in shapes:
            cfg = op_config(op.table, M, N, K, dev, op.formats, out_bytes)
            entry, source = config_source(op.table, M, N, K, dev)
            notes = []
            if entry is not None:
                given = GemmConfig.from_dict(entry)
                if cfg.STREAM_K and not given.STREAM_K:
                    notes.append("last wave K-sliced")
                if cfg.SPLIT_K != given.SPLIT_K:
                    notes.append(f"K slices {given.SPLIT_K} -> {cfg.SPLIT_K} for the SMs")
                if cfg.BLOCK_M != given.BLOCK_M:
                    notes.append(f"BLOCK_M {given.BLOCK_M} -> {cfg.BLOCK_M}: M's rows")
                if dataclasses.replace(given, STREAM_K=cfg.STREAM_K, SPLIT_K=cfg.SPLIT_K, BLOCK_M=cfg.BLOCK_M) != cfg:
                    notes.append("fitted to the shared memory")
            rows = " rows per expert" if op.table.startswith("grouped_") else ""
            lines.append(f"  M={M}{rows} N={N} K={K}: {describe(cfg)}  [{', '.join([source] + notes)}]")
            route = gluon_route(op.table, M, N, K, dev)
            if route is not None:
                lines.append(f"    on sm_90 the warp-specialized Gluon kernel runs it instead: {route} "
                             "(core/hopper_ws.py; the config above: other GPUs, explicit configs, and calls "
                             "that kernel does not take)")
            route = w4_route(op.table, M, N, K, dev)
            if route is not None:
                lines.append(f"    on sm_90 a Gluon 4-bit kernel runs it instead: {route} "
                             "(core/hopper_w4.py; the config above: other GPUs, explicit configs, and calls "
                             "that kernel does not take)")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(prog="gemmkit configs", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("show", help="which config each op's table gives a problem, and where it came from")
    s.add_argument("--op", nargs="+", default=None,
                   help="ops (as in gemmkit bench/tune; default: one per config table)")
    s.add_argument("--shape", type=int, nargs=3, action="append", default=None, metavar=("M", "N", "K"),
                   help="a problem to look up; repeatable (default: a few illustrative ones)")
    s.add_argument("--dtype", default=None, help="operand dtype (default: each op's first)")
    s.add_argument("--out-dtype", default="bf16", choices=OUT_DTYPES)
    s.add_argument("--device-name", default=None,
                   help=f"show a known GPU's picks instead of this device's: {', '.join(KNOWN_DEVICES)}")
    args = p.parse_args(argv)
    if args.op:
        ops = [get_op(name) for name in args.op]
        missing = [op.name for op in ops if op.table is None]
        if missing:
            raise SystemExit(f"{', '.join(missing)}: no config table (not a GEMM with tuned configs)")
    else:
        ops = [table_op(t) for t in dict.fromkeys(op.table for op in OPS.values() if op.table)]
        if args.dtype:
            ops = [op for op in ops if args.dtype in op.dtypes]
            if not ops:
                raise SystemExit(f"--dtype {args.dtype}: no op takes it; dtypes: "
                                 f"{', '.join(dict.fromkeys(d for op in OPS.values() if op.table for d in op.dtypes))}")
    shapes = [tuple(s) for s in args.shape] if args.shape else DEFAULT_SHAPES
    if min(min(s) for s in shapes) < 1:
        raise SystemExit("--shape takes sizes >= 1")
    for op in ops:  # (a bad --dtype refused before anything is printed)
        op_dtype(op, args.dtype)
    if args.device_name is not None:
        try:
            dev = known_device(args.device_name)
        except ValueError as e:
            raise SystemExit(f"--device-name: {e}") from None
    else:
        dev = device_info()
    print(device_line(dev, named=bool(args.device_name)))
    print(f"user config dir: {user_config_dir()} (GEMMKIT_CONFIG_DIR, else $XDG_CACHE_HOME/gemmkit/configs)")
    print("\n".join(show_lines(ops, shapes, dev, args.dtype, args.out_dtype)))
