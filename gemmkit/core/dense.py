"""Host side of the shared dense GEMM: operand layouts, TMA descriptors, grid, and `DensePlan`.

A `DensePlan` fixes everything about one dense (M, N) problem that depends only on tensor facts
(gemmkit.core.plan) and launches `gemm_kernel` with the kernel switches its operand formats and
epilogue spec select.
"""

from __future__ import annotations

import math

import torch

from ..kernels import modes
from .config import GemmConfig
from .device import DeviceInfo, interpreter_active
from .epilogue import EpilogueSpec
from .formats import OperandFormat, Scale, packed_producer
from .launcher import CachedLaunch, hook_set, launch_hooks
from .plan import (PlanBase, TensorFacts, _get_device, contiguous_strides, kernel_tail, overlapping_input,
                   split_k_counters)

_INT32_MAX = 2**31 - 1
_kernels: dict = {}

# gemm_kernel's per-call parameters, first in its signature, in this order
PER_CALL = ("a", "b", "c", "ws", "counters", "bias", "a_scale", "b_scale", "mul", "add", "b_zero", "c2", "a_rows",
            "c_rows", "row_weights", "group_offsets", "b2", "cat_src")


# the MoE / batched family's fixed kernel parameters, for plans of one (M, N) problem
NO_GROUPS = dict(num_groups=1, stride_ag=0, stride_bg=0, stride_cg=0, stride_asg=0, stride_bsg=0, stride_biasg=0,
                 NUM_GROUPS_P2=1)


def packed_args(x2=None, a_k_major: bool = False, stride_am: int = 0, b_packed: bool = False,
                cuda: bool = False) -> dict:
    """The 4-bit switches of gemm_kernel (kernels/packed.py): A_WORDS where A's column pairs can be
    read as 32-bit words (16-bit A, unit stride along K, 4-byte aligned rows), FAST_UNPACK (inline
    PTX) on CUDA outside the interpreter. Plans without a packed B pass packed_args()."""
    if not b_packed:
        return dict(A_WORDS=False, FAST_UNPACK=False)
    words = x2.element_size() == 2 and a_k_major and x2.data_ptr() % 4 == 0 and stride_am % 2 == 0
    return dict(A_WORDS=bool(words), FAST_UNPACK=cuda and not interpreter_active())


def stream_k_tail(num_tiles: int, k_tiles: int, num_sms: int) -> tuple[int, int]:
    """(tail tiles, K slices per tail tile) of a STREAM_K launch on num_sms programs: the tiles of
    the ragged last wave (num_tiles % num_sms, or all of them below one wave), each cut into as
    many K slices as keep the slices within the programs, at most sqrt(k_tiles) (and 16), at least
    4 K tiles per slice; (0, 1) where that is one slice (a whole tile: plain data-parallel waves).

    sqrt(k_tiles): the tail costs about t / S + S * f for S slices, t a whole tile's K loop and f
    one partial tile's read by the program that sums them (one SM's share of L2 bandwidth), so it
    is least at S = sqrt(t / f); with K tiles of one 128-byte line per operand row that is close
    to sqrt(k_tiles) for 16-bit and 8-bit operands alike (a 4-tile last wave in 16 slices ran 8%
    behind 2 pieces per tile on an H200, tuning/streamk_tuned_*_h200.txt)."""
    ragged = num_tiles % num_sms
    split = min(num_sms // ragged, k_tiles // 4, math.isqrt(k_tiles), 16) if ragged else 1
    return (ragged, split) if split > 1 else (0, 1)


def _jit_kernel():
    """The Triton kernel, imported on first use: TRITON_INTERPRET is read when it is defined."""
    if not _kernels:
        from ..kernels.gemm import gemm_kernel

        _kernels["gemm"] = gemm_kernel
    return _kernels["gemm"]


# ---------------------------------------------------------------------------------------------
# layouts and descriptors


def operand_layout(t: torch.Tensor):
    """(k_major, stride_rows, stride_k) of a 2-D operand (rows, K) with a unit-stride dimension.

    A size-1 dimension may have any stride; it is given the stride of a contiguous layout.
    Returns None when neither dimension has unit stride.
    """
    R, Kd = t.shape
    sr, sk = t.stride()
    if sk == 1 or Kd == 1:
        return True, (sr if R > 1 else max(Kd, 1)), 1
    if sr == 1 or R == 1:
        return False, 1, (sk if Kd > 1 else max(R, 1))
    return None


def _tma_ok(t: torch.Tensor, outer_stride: int, block) -> bool:
    """A TMA descriptor can address t: 16-byte aligned base and row stride (a stride-0,
    broadcast operand takes the pointer path), boxes of at most 256 per dimension."""
    return (t.data_ptr() % 16 == 0 and outer_stride > 0 and (outer_stride * t.element_size()) % 16 == 0
            and max(block) <= 256)


class _Descriptor:
    """Builds the host TensorDescriptor of one operand per call. Its layout was validated when the
    plan was built and the plan key pins it, so later calls skip TensorDescriptor's checks."""

    def __init__(self, shape, strides, block, transposed: bool):
        self.shape, self.strides, self.block, self.transposed = list(shape), list(strides), list(block), transposed

    def __call__(self, t: torch.Tensor, checked: bool):
        from triton.tools.tensor_descriptor import TensorDescriptor

        if not checked:
            return TensorDescriptor(t, self.shape, self.strides, self.block)
        d = object.__new__(TensorDescriptor)
        d.base, d.shape, d.strides, d.block_shape, d.padding = t, self.shape, self.strides, self.block, "zero"
        return d


def _operand_descriptor(t, layout, block_r, block_k):
    R, Kd = t.shape
    k_major, s_r, s_k = layout
    if k_major and _tma_ok(t, s_r, (block_r, block_k)):
        return _Descriptor((R, Kd), (s_r, 1), (block_r, block_k), False)
    if not k_major and _tma_ok(t, s_k, (block_r, block_k)):
        return _Descriptor((Kd, R), (s_k, 1), (block_k, block_r), True)
    return None


def _max_offset(t: torch.Tensor) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))


def fused_args(up_scale=(0, 0), gated: bool = False, split_cat=None) -> dict:
    """gemm_kernel's fused-epilogue arguments (second B operand's scales, GATED, output map):
    plans without them pass fused_args()."""
    return dict(up_scale_offset=up_scale[0], stride_bs=up_scale[1], GATED=gated, **_split_cat_args(split_cat))


def _strides_2d(t) -> tuple:
    return (0, 0) if t is None else tuple(t.stride())


def _split_cat_args(sc) -> dict:
    """gemm_kernel's output-map arguments: the plain (M, N) store, or the fused split/cat's."""
    if sc is None:
        return dict(cat_d1=0, cat_dh=1, cat_d3=0, stride_c1m=0, stride_c1h=0, stride_c2m=0, stride_c2h=0,
                    stride_sm=0, stride_sh=0, OUT_MAP=0, BLOCK_D3=0)
    o1, o2, src, d3 = sc["out1"], sc["out2"], sc["src"], sc["d3"]
    return dict(cat_d1=sc["d1"], cat_dh=sc["dh"], cat_d3=d3, stride_c1m=o1.stride(0), stride_c1h=o1.stride(1),
                stride_c2m=o2.stride(0), stride_c2h=o2.stride(1),
                stride_sm=0 if src is None else src.stride(0), stride_sh=0 if src is None else src.stride(1),
                OUT_MAP=1, BLOCK_D3=0 if d3 == 0 else 1 << (d3 - 1).bit_length())


class DensePlan(PlanBase):
    """y (M, N) = epilogue(x (M, K) @ w (N, K)^T) for fixed tensor facts and operand formats.

    Built from validated example arguments (M, N, K >= 1): `x2` (M, K) (the stored A, 16-bit when
    `a_fmt.quantize`), `w`, `y2` (M, N), and `inputs`: example tensors (or None) for "bias",
    "a_scale", "b_scale", "mul", "add" (mul/add as (M, N) views, stride 0 where broadcast). Call
    it as `run(x, w, bias, y, a_scale, b_scale, mul, add)` with tensors of the same facts (the
    plan key guarantees it). `out_shape`: the shape returned to the user ((M, N) or (*, N)); x is
    reshaped to (M, K) when `flatten_x`. `exact_accumulation`: float dots promote each K tile's
    partial sum to fp32 (PROMOTE_TILE) instead of accumulating in the tensor cores (FP8's fast
    accumulation); K-block scales always promote. 4-bit operands (formats with bits=4, see
    formats.packed4): w (and x) are the packed uint8 (rows, K/2) tensors, read through pointers;
    "b_zero" in `inputs` (INT4 zero points), passed per call as run(..., b_zero=); `logical_k`:
    K when x is packed.
    """

    def __init__(self, x2, w, y2, a_fmt: OperandFormat, b_fmt: OperandFormat, epilogue: EpilogueSpec,
                 cfg: GemmConfig, dev: DeviceInfo, *, out_dtype, out_shape, flatten_x: bool, inputs=None,
                 auto_config: bool = False, exact_accumulation: bool = False, up_scale=(0, 0), split_cat=None,
                 logical_k: int | None = None):
        inputs = inputs or {}
        self.up_scale = up_scale  # GATED: (offset, stride) of the up projection's per-channel scales
        # fused split/cat (OUT_MAP 1): dict(d1, dh, d3, out1, out2, src) with example tensors
        self.split_cat = split_cat
        self.x, self.w, self.y = TensorFacts(x2), TensorFacts(w), TensorFacts(y2)
        self.inputs = {k: (None if t is None else TensorFacts(t)) for k, t in inputs.items()}
        self.M, self.K = x2.shape
        if logical_k is not None:  # a packed (4-bit) x stores K / 2 bytes per row
            self.K = logical_k
        self.N = w.shape[0]
        self.formats, self.epilogue, self.dev, self.auto_config = (a_fmt, b_fmt), epilogue, dev, auto_config
        self.out_dtype, self.out_shape, self.flatten_x = out_dtype, tuple(out_shape), flatten_x
        self.exact_accumulation = exact_accumulation
        self.device = x2.device
        self.device_index = x2.device.index or 0
        self.cuda = x2.device.type == "cuda"
        self._configure(cfg)

    def _configure(self, cfg: GemmConfig) -> None:
        x2, w, y2, dev = self.x, self.w, self.y, self.dev
        a_fmt, b_fmt = self.formats
        M, N, K = self.M, self.N, self.K
        self.cfg = cfg
        bm, bn, bk = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
        split_k = cfg.SPLIT_K
        quant_a = a_fmt.quantize  # A through registers: pointer loads, no split epilogue

        x_layout, w_layout = operand_layout(x2), operand_layout(w)
        want_tma = cfg.TMA and dev.has_tma
        a_packed, b_packed = packed_producer(a_fmt, "a"), packed_producer(b_fmt, "b")  # 4-bit: pointer loads
        self.a_desc = (_operand_descriptor(x2, x_layout, bm, bk)
                       if want_tma and not quant_a and a_packed is None and b_packed is None else None)
        self.b_desc = _operand_descriptor(w, w_layout, bn, bk) if want_tma and b_packed is None else None
        # GATED: the up weight (inputs["b2"]) has w's facts, so the same descriptor layout
        self.b2_desc = self.b_desc if self.epilogue.gated else None
        self.c_desc = None
        s_cm, s_cn = y2.stride()
        subtile = cfg.EPILOGUE_SUBTILE and split_k == 1 and not quant_a
        if split_k == 1 and want_tma and (s_cn == 1 or N == 1) and self.split_cat is None:
            bn_store = bn // 2 if subtile else bn
            s_cm_eff = s_cm if M > 1 else N
            if _tma_ok(y2, s_cm_eff, (bm, bn_store)):
                self.c_desc = _Descriptor((M, N), (s_cm_eff, 1), (bm, bn_store), False)
        index_64 = max(_max_offset(x2), _max_offset(w), _max_offset(y2)) > _INT32_MAX

        num_tiles = -(-M // bm) * -(-N // bn)
        num_work = num_tiles * split_k
        grid = min(num_work, dev.num_sms) if cfg.PERSISTENT else num_work
        sk_tiles, sk_split = 0, 1
        if cfg.STREAM_K and split_k == 1:
            sk_tiles, sk_split = stream_k_tail(num_tiles, -(-K // bk), dev.num_sms)
            if sk_tiles:
                grid = min(dev.num_sms, max(num_tiles - sk_tiles, sk_tiles * sk_split))
        self.stream_k = sk_tiles > 0
        flatten = cfg.PERSISTENT and split_k == 1 and not quant_a
        warp_specialize = cfg.WARP_SPECIALIZE and flatten and self.a_desc is not None and self.b_desc is not None
        a_km, s_am, s_ak = x_layout
        b_km, s_bn, s_bk = w_layout
        kblock = Scale.KBLOCK in (a_fmt.scale, b_fmt.scale) or quant_a == "group"
        ep, inputs = self.epilogue, self.inputs
        s_asm, s_ask = _strides_2d(inputs.get("a_scale")) if a_fmt.scale == Scale.KBLOCK else (0, 0)
        s_bsn, s_bsk = _strides_2d(inputs.get("b_scale")) if b_fmt.scale == Scale.KBLOCK else (0, 0)
        s_mul, s_add = _strides_2d(inputs.get("mul")), _strides_2d(inputs.get("add"))
        s_bzn, s_bzk = _strides_2d(inputs.get("b_zero"))
        if a_packed is not None:
            s_asm, s_ask = _strides_2d(inputs.get("a_scale"))
        if b_packed is not None:  # group scales / zero points with one column: one group per channel
            s_bsn, s_bsk = _strides_2d(inputs.get("b_scale"))
            s_bsk = 0 if inputs["b_scale"].shape[1] == 1 else s_bsk
            s_bzk = 0 if inputs.get("b_zero") is not None and inputs["b_zero"].shape[1] == 1 else s_bzk
        # accumulate in int32 only where no scale joins inside the K loop
        acc_int = a_fmt.integer and b_fmt.integer and not kblock
        self.tail = kernel_tail(_jit_kernel(), PER_CALL, dict(
            M=M, N=N, K=K, stride_am=s_am, stride_ak=s_ak, stride_bn=s_bn, stride_bk=s_bk, stride_cm=s_cm,
            stride_cn=s_cn, stride_asm=s_asm, stride_ask=s_ask, stride_bsn=s_bsn, stride_bsk=s_bsk,
            stride_mul_m=s_mul[0], stride_mul_n=s_mul[1], stride_add_m=s_add[0], stride_add_n=s_add[1],
            stride_bzn=s_bzn, stride_bzk=s_bzk,
            sk_tiles=sk_tiles, sk_split=sk_split, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.GROUP_M,
            SPLIT_K=split_k,
            STREAM_K=self.stream_k, TILE_MAP=modes.MAP_DENSE.value,
            A_TMA=self.a_desc is not None, A_K_MAJOR=a_km, B_TMA=self.b_desc is not None, B_K_MAJOR=b_km,
            C_TMA=self.c_desc is not None, EVEN_K=K % bk == 0, INDEX_64=index_64,
            A_PRODUCER=(a_packed if a_packed is not None else
                        {"": modes.A_DENSE, "row": modes.A_QUANT_ROW, "group": modes.A_QUANT_GROUP}[quant_a].value),
            B_PRODUCER=modes.B_DENSE.value if b_packed is None else b_packed, QUANT=a_fmt.quant_target, ACC_INT=acc_int,
            PROMOTE=(modes.PROMOTE_KBLOCK if kblock else modes.PROMOTE_TILE if self.exact_accumulation and not acc_int
                     else modes.PROMOTE_NONE).value,
            A_SCALE=int(a_fmt.scale), B_SCALE=int(b_fmt.scale),
            GROUP_K=max(a_fmt.group_k, b_fmt.group_k, 1), GROUP_N=max(b_fmt.group_rows, 1),
            ACTIVATION=ep.activation, FLATTEN=flatten, WARP_SPECIALIZE=warp_specialize, EPILOGUE_SUBTILE=subtile,
            **NO_GROUPS,
            **fused_args(self.up_scale, ep.gated, self.split_cat),
            **packed_args(x2, a_km, s_am, b_packed is not None, self.cuda),
        ))
        # partial tiles (kernels/reduce.py): one block per (tile, K slice) of the sliced tiles;
        # int32 where the pieces' sums are (unscaled int8 products), else fp32
        self.pieces = split_k > 1 or self.stream_k
        self.ws_shape = (sk_tiles * sk_split if self.stream_k else num_tiles * split_k, bm, bn)
        self.ws_dtype = torch.int32 if acc_int and not quant_a else torch.float32
        self.num_tiles = num_tiles
        self.launch = CachedLaunch(_jit_kernel(), (grid,), cfg.num_warps, cfg.num_stages, self.device_index)
        self._bind()

    def head(self, x, w, c, ws, counters, bias, a_scale, b_scale, mul, add, checked: bool = True, c2=None,
             b2=None, cat_src=None, b_zero=None) -> tuple:
        """gemm_kernel's per-call arguments (PER_CALL order) for the regular (Triton) launch."""
        a_desc, b_desc, c_desc, b2_desc = self.a_desc, self.b_desc, self.c_desc, self.b2_desc
        return (x if a_desc is None else a_desc(x, checked), w if b_desc is None else b_desc(w, checked),
                c if c_desc is None else c_desc(c, checked), ws, counters, bias, a_scale, b_scale, mul, add,
                b_zero, c2, None, None, None, None, b2 if b2_desc is None or b2 is None else b2_desc(b2, checked),
                cat_src)

    def _per_call(self, direct=None):
        """The work of one call as a flat function of (x, w, bias, y, a_scale, b_scale, mul, add),
        each decision the plan fixes taken here once. direct=None: launch through CachedLaunch
        (Triton's regular path the first time: compiles and validates the layouts). direct (from
        CachedLaunch.direct_parts, after the first launch): call Triton's C launcher with raw
        pointers, what every later call on the plan's device does; eagerly, a decode-sized GEMM
        costs the host more than the GPU (README, "Host cost")."""
        M, N, idx, device = self.M, self.N, self.device_index, self.device
        out_shape, out_dtype, tail = self.out_shape, self.out_dtype, self.tail
        flatten_x, view_out = self.flatten_x, len(self.out_shape) != 2
        a_desc, b_desc, c_desc, b2_desc = self.a_desc, self.b_desc, self.c_desc, self.b2_desc
        pieces, ws_shape, ws_dtype, num_tiles = self.pieces, self.ws_shape, self.ws_dtype, self.num_tiles
        out_strides, ws_strides = contiguous_strides(out_shape), contiguous_strides(ws_shape)
        empty, launch_regular, head, flat = torch.empty_strided, self.launch, self.head, direct is not None
        y_extent = self.y.extent
        extents = {k: (0 if f is None else f.extent) for k, f in self.inputs.items()}
        x_ext, w_ext, bias_ext = self.x.extent, self.w.extent, extents.get("bias", 0)
        as_ext, bs_ext, mul_ext, add_ext = (extents.get(k, 0) for k in ("a_scale", "b_scale", "mul", "add"))
        if flat:
            launch, gx, gy, gz, function, lead = direct
            stream, hook, slow = torch._C._cuda_getCurrentRawStream, launch_hooks(), self._call

        def per_call(x, w, bias, y, a_scale, b_scale, mul=None, add=None, c2=None, b2=None, cat_src=None, b_zero=None):
            if flat and (_get_device() != idx or hook_set(hook)):  # another device current, or a profiler
                return slow(x, w, bias, y, a_scale, b_scale, mul, add, c2, b2, cat_src, b_zero)
            if y is not None:
                clash = overlapping_input(y, y_extent, (("x", x, x_ext), ("w", w, w_ext), ("bias", bias, bias_ext),
                                                        ("x_scale", a_scale, as_ext), ("w_scale", b_scale, bs_ext),
                                                        ("mul", mul, mul_ext), ("add", add, add_ext),
                                                        ("w_up", b2, w_ext)))
                if clash:
                    raise ValueError(f"y shares memory with {clash}: the output must not overlap an input "
                                     "(other programs would still read what one has written)")
            if flatten_x:
                x = x.reshape(M, x.shape[-1])
            out = empty(out_shape, out_strides, dtype=out_dtype, device=device) if y is None else y
            c = out.view(M, N) if view_out else out
            if pieces:  # (both held until the launch is queued: a freed block may be handed out again)
                ws = empty(ws_shape, ws_strides, dtype=ws_dtype, device=device)
                counters = split_k_counters(device, idx, num_tiles)
            else:
                ws = counters = None
            if flat:
                launch(gx, gy, gz, stream(idx), function, *lead,
                       x.data_ptr() if a_desc is None else a_desc(x, True),
                       w.data_ptr() if b_desc is None else b_desc(w, True),
                       c.data_ptr() if c_desc is None else c_desc(c, True),
                       None if ws is None else ws.data_ptr(),
                       None if counters is None else counters.data_ptr(),
                       None if bias is None else bias.data_ptr(),
                       None if a_scale is None else a_scale.data_ptr(),
                       None if b_scale is None else b_scale.data_ptr(),
                       None if mul is None else mul.data_ptr(),
                       None if add is None else add.data_ptr(),
                       None if b_zero is None else b_zero.data_ptr(), None if c2 is None else c2.data_ptr(),
                       None, None, None, None,
                       None if b2 is None else (b2.data_ptr() if b2_desc is None else b2_desc(b2, True)),
                       None if cat_src is None else cat_src.data_ptr(),
                       *tail)
            else:
                # layouts were validated when the first call built the descriptors
                launch_regular(head(x, w, c, ws, counters, bias, a_scale, b_scale, mul, add,
                                    launch_regular.kernel is not None, c2, b2, cat_src, b_zero), tail)
            return out

        return per_call
