"""Host side of the MoE / batched family: `GroupedPlan`, one launch of the shared kernel over many
(M, N) problems that share N and K (kernels/schedule.py group_grid).

- MAP_GROUPED (grouped GEMM, mixture-of-experts): expert e owns rows [offsets[e], offsets[e + 1])
  of A and C and multiplies them by w[e] (w (E, N, K)). The offsets live on the device and are
  never read by the host: the grid is an upper bound (at most one program per SM, persistent) and
  each program reads the tile count from the offsets. Optional gathered A rows (`a_rows`),
  scattered C rows (`c_rows`) and row weights (applied after the activation, indexed by the
  destination row).
- MAP_BATCHED: B problems (x (B, M, K), w (B, N, K) or shared with batch stride 0), C (B, M, N).

Loads through pointers, or (config TMA, K-contiguous operands whose groups are evenly spaced rows)
through one TMA descriptor over every group's rows; pointer stores; SPLIT_K = 1, no stream-K.
K-block scales (MAP_GROUPED, DeepSeek-V3's 1x128 / 128x128): A's per token row (read through the
gathered rows), B's per expert (`stride_bsg`), applied in the K loop.
"""

from __future__ import annotations

import dataclasses

import torch

from ..kernels import modes
from .config import GemmConfig
from .dense import _INT32_MAX, PER_CALL, _Descriptor, _jit_kernel, fused_args, packed_args
from .device import DeviceInfo
from .epilogue import EpilogueSpec
from .formats import OperandFormat, Scale
from .launcher import CachedLaunch, hook_set, launch_hooks
from .plan import PlanBase, _get_device, contiguous_strides, kernel_tail


def _span(t) -> int:
    """Largest element offset of t (0 for None)."""
    return 0 if t is None else sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))


def family_config(cfg: GemmConfig) -> GemmConfig:
    """The config as this family runs it: one piece per tile (SPLIT_K 1, no stream-K), no split
    epilogue, no warp specialization (pointer loads)."""
    return dataclasses.replace(cfg, SPLIT_K=1, STREAM_K=False, WARP_SPECIALIZE=False, EPILOGUE_SUBTILE=False)


class GroupedPlan(PlanBase):
    """C = epilogue(A @ B[g]^T) per group g, for fixed tensor facts.

    tile_map: modes.MAP_GROUPED or MAP_BATCHED. `x2` (rows, K) (grouped: the stored A, token rows
    when gathered; batched: x[0]'s layout with `stride_ag`), `w3` (groups, N, K) (batch stride 0
    for a shared weight), `out_shape` / `c_strides`: C's shape and its (row, column) strides;
    `rows_bound`: C rows of the upper-bound grid (grouped: rows; batched: M). `group_strides`:
    stride_ag, stride_cg, stride_asg, stride_bsg, stride_biasg. `gather`: A rows through a_rows.
    Call `run(x, w, offsets, a_rows, c_rows, row_weights, bias, a_scale, b_scale[, b2])`. A gated
    epilogue (`epilogue.gated`, 16-bit operands): w is the gate weight and b2 the up weight, laid out
    as w; C = activation(A @ w[g]^T) * (A @ b2[g]^T).
    """

    def __init__(self, tile_map, x2, w3, out_shape, c_strides, M, num_groups, a_fmt: OperandFormat,
                 b_fmt: OperandFormat, epilogue: EpilogueSpec, cfg: GemmConfig, dev: DeviceInfo, *, out_dtype,
                 group_strides: dict, gather: bool, index_extent: int, auto_config: bool = False,
                 scale_strides: dict | None = None):
        self.tile_map, self.M, self.num_groups = tile_map, M, num_groups
        self.N, self.K = w3.shape[1], w3.shape[2]
        self.x_strides, self.w_strides = tuple(x2.stride()), tuple(w3.stride())
        self.x_aligned = x2.data_ptr() % 16 == 0 and w3.data_ptr() % 16 == 0
        self.x_elsize, self.w_elsize, self.x_rows = x2.element_size(), w3.element_size(), x2.shape[0]
        self.out_shape, self.c_strides, self.out_dtype = tuple(out_shape), tuple(c_strides), out_dtype
        self.group_strides, self.gather, self.index_extent = dict(group_strides), gather, index_extent
        self.scale_strides = dict(scale_strides or {})  # K-block scales: stride_asm / _ask / _bsn / _bsk
        self.formats, self.epilogue, self.dev, self.auto_config = (a_fmt, b_fmt), epilogue, dev, auto_config
        self.device = x2.device
        self.device_index = x2.device.index or 0
        self.cuda = x2.device.type == "cuda"
        self._configure(cfg)

    def _configure(self, cfg: GemmConfig) -> None:
        a_fmt, b_fmt = self.formats
        cfg = family_config(cfg)
        self.cfg = cfg
        M, N, K, E = self.M, self.N, self.K, self.num_groups
        bm, bn, bk = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
        s_am, s_ak = self.x_strides
        s_bg, s_bn, s_bk = self.w_strides
        tiles_n = -(-N // bn)
        if self.tile_map == modes.MAP_GROUPED:  # every expert may end in a partial tile-row
            upper = (-(-M // bm) + E) * tiles_n
        else:
            upper = E * -(-M // bm) * tiles_n
        grid = max(1, min(upper, self.dev.num_sms) if cfg.PERSISTENT else upper)
        acc_int = a_fmt.integer and b_fmt.integer
        gs, ss = self.group_strides, self.scale_strides
        kblock = Scale.KBLOCK in (a_fmt.scale, b_fmt.scale)
        self.a_desc, self.b_desc = self._descriptors(cfg)
        self.tail = kernel_tail(_jit_kernel(), PER_CALL, dict(
            M=M, N=N, K=K, stride_am=s_am, stride_ak=s_ak, stride_bn=s_bn, stride_bk=s_bk,
            stride_cm=self.c_strides[0], stride_cn=self.c_strides[1], stride_asm=ss.get("stride_asm", 0),
            stride_ask=ss.get("stride_ask", 0), stride_bsn=ss.get("stride_bsn", 0),
            stride_bsk=ss.get("stride_bsk", 0), stride_mul_m=0, stride_mul_n=0, stride_add_m=0, stride_add_n=0,
            sk_tiles=0, sk_split=1,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.GROUP_M, SPLIT_K=1, STREAM_K=False,
            TILE_MAP=self.tile_map.value, A_TMA=self.a_desc is not None, A_K_MAJOR=s_ak == 1,
            B_TMA=self.b_desc is not None, B_K_MAJOR=s_bk == 1,
            C_TMA=False, EVEN_K=K % bk == 0, INDEX_64=self.index_extent > _INT32_MAX,
            A_PRODUCER=(modes.A_GATHER if self.gather else modes.A_DENSE).value, B_PRODUCER=modes.B_DENSE.value,
            QUANT="", ACC_INT=acc_int, PROMOTE=(modes.PROMOTE_KBLOCK if kblock else modes.PROMOTE_NONE).value,
            A_SCALE=int(a_fmt.scale), B_SCALE=int(b_fmt.scale), GROUP_K=max(a_fmt.group_k, b_fmt.group_k, 1),
            GROUP_N=max(b_fmt.group_rows, 1), ACTIVATION=self.epilogue.activation, FLATTEN=False,
            WARP_SPECIALIZE=False, EPILOGUE_SUBTILE=False,
            num_groups=E, stride_ag=gs.get("stride_ag", 0), stride_bg=s_bg, stride_cg=gs.get("stride_cg", 0),
            stride_asg=gs.get("stride_asg", 0), stride_bsg=gs.get("stride_bsg", 0),
            stride_biasg=gs.get("stride_biasg", 0),
            NUM_GROUPS_P2=max(2, 1 << max(0, (E - 1).bit_length())) if self.tile_map == modes.MAP_GROUPED else 1,
            stride_bzn=0, stride_bzk=0,  # (packed 4-bit B's zero points: not with these maps)
            **fused_args(gated=self.epilogue.gated),
            **packed_args(),
        ))
        self.grid = grid
        self.launch = CachedLaunch(_jit_kernel(), (grid,), cfg.num_warps, cfg.num_stages, self.device_index)
        self._bind()

    def _descriptors(self, cfg: GemmConfig):
        """(A, B) descriptor builders, each over every group's rows ((groups * rows, K); one group's
        rows where the group stride is 0), or None where that operand takes pointer loads: TMA not
        asked for or not on the device, gathered rows, not K-contiguous, groups not evenly
        spaced rows, or not 16-byte aligned."""
        if not (cfg.TMA and self.dev.has_tma and self.x_aligned):
            return None, None
        K, E, (s_am, s_ak), (s_bg, s_bn, s_bk) = self.K, self.num_groups, self.x_strides, self.w_strides

        def build(rows, s_row, s_k, s_g, elsize, block_r):
            if s_k != 1 or (s_row * elsize) % 16 or block_r > 256 or cfg.BLOCK_K > 256:
                return None
            if s_g and (s_g % s_row or s_g < rows * s_row):  # groups must start on rows of one matrix
                return None
            span = (E - 1) * (s_g // s_row) + rows if s_g else rows  # (a gate or up view: every other block)
            return _Descriptor((span, K), (s_row, 1), (block_r, cfg.BLOCK_K), False)

        a = None
        if not self.gather:
            s_ag = self.group_strides.get("stride_ag", 0) if self.tile_map == modes.MAP_BATCHED else 0
            a = build(self.x_rows, s_am, s_ak, s_ag, self.x_elsize, cfg.BLOCK_M)
        return a, build(self.N, s_bn, s_bk, s_bg, self.w_elsize, cfg.BLOCK_N)

    def _per_call(self, direct=None):
        """One call as a flat function (see DensePlan._per_call): allocate C, launch."""
        idx, device, out_shape, out_dtype, tail = self.device_index, self.device, self.out_shape, self.out_dtype, self.tail
        a_desc, b_desc = self.a_desc, self.b_desc  # (b2, the up weight of a gated plan, is laid out as w)
        out_strides = contiguous_strides(out_shape)
        empty, launch_regular, flat = torch.empty_strided, self.launch, direct is not None
        if flat:
            launch, gx, gy, gz, function, lead = direct
            stream, hook, slow = torch._C._cuda_getCurrentRawStream, launch_hooks(), self._call

        def per_call(x, w, offsets, a_rows, c_rows, row_weights, bias, a_scale, b_scale, b2=None):
            if flat and (_get_device() != idx or hook_set(hook)):
                return slow(x, w, offsets, a_rows, c_rows, row_weights, bias, a_scale, b_scale, b2)
            out = empty(out_shape, out_strides, dtype=out_dtype, device=device)
            if flat:
                ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
                launch(gx, gy, gz, stream(idx), function, *lead,
                       x.data_ptr() if a_desc is None else a_desc(x, True),
                       w.data_ptr() if b_desc is None else b_desc(w, True), out.data_ptr(),
                       None, None, ptr(bias), ptr(a_scale), ptr(b_scale), None, None, None, None, ptr(a_rows),
                       ptr(c_rows), ptr(row_weights), ptr(offsets),
                       ptr(b2) if b_desc is None or b2 is None else b_desc(b2, True), None, *tail)
            else:
                launch_regular((x if a_desc is None else a_desc(x, False), w if b_desc is None else b_desc(w, False), out,
                                None, None, bias, a_scale, b_scale, None, None, None, None, a_rows, c_rows,
                                row_weights, offsets, b2 if b_desc is None or b2 is None else b_desc(b2, False),
                                None), tail)
            return out

        return per_call


def scale_kind(name: str, s, per_row: set, per_group: set, one_per_group: set) -> tuple[Scale, int]:
    """(scale kind, group stride) of a float32 scale: 1 element (per tensor, stride 0), one of
    `one_per_group`'s shapes (a per-tensor scale per group), `per_row` (per row, shared by the
    groups) or `per_group` (per row and group, contiguous)."""
    from . import validate as v

    v.check_tensor(name, s, (torch.float32,))
    shape = tuple(s.shape)
    if s.numel() == 1:
        return Scale.TENSOR, 0
    if not s.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous())")
    if shape in one_per_group and (shape in per_row or shape in per_group):  # (e.g. (N,) with N == B)
        others = sorted((one_per_group | per_row | per_group) - {shape})
        raise ValueError(f"{name} has shape {shape}: ambiguous here, the shape of one value per group (batch entry "
                         f"or expert) and of one value per row alike; give it as one of "
                         f"{', '.join(map(str, others))} to say which")
    if shape in one_per_group:
        return Scale.TENSOR, 1
    if shape in per_row:
        return Scale.ROW, 0
    if shape in per_group:
        return Scale.ROW, s.stride(0)
    raise ValueError(f"{name} has shape {shape}: expected one value, "
                     f"{' or '.join(str(x) for x in sorted(one_per_group | per_row | per_group))}")


def index_extent(*tensors) -> int:
    """Largest element offset among the tensors (decides INDEX_64)."""
    return max(_span(t) for t in tensors)


def group_bias_stride(bias, groups: int, N: int, what: str, dtypes) -> int:
    """Group stride of a bias: (groups, N) contiguous -> N, (N,) (shared) -> 0; else ValueError."""
    from . import validate as v

    if bias is None:
        return 0
    v.check_tensor("bias", bias, dtypes)
    if tuple(bias.shape) == (groups, N) and bias.is_contiguous():
        return N
    if tuple(bias.shape) != (N,) or not bias.is_contiguous():
        raise ValueError(f"bias must be contiguous ({what}, N) = ({groups}, {N}) or (N,) = ({N},), "
                         f"got {tuple(bias.shape)}")
    return 0


def group_epilogue(kind: str, x, w, bias, x_scale, w_scale, out_dtype, groups: int, N: int, what: str,
                   x_shapes: tuple, w_shapes: tuple):
    """(bias group stride, out_dtype, A scale kind, its group stride, B scale kind, its group
    stride) of a grouped or batched call: "a16w16" (no scales; output x's dtype by default) or
    "a8w8" (check_8bit_scales with these shape sets; bf16 output by default)."""
    from . import validate as v

    s_biasg = group_bias_stride(bias, groups, N, what, v.BIAS_DTYPES)
    out_dtype = v.check_out_dtype(out_dtype, None, x.dtype if kind == "a16w16" else torch.bfloat16)
    if kind != "a8w8":
        return s_biasg, out_dtype, Scale.NONE, 0, Scale.NONE, 0
    return (s_biasg, out_dtype, *check_8bit_scales(x, w, x_scale, w_scale, x_shapes, w_shapes))


def check_8bit_scales(x, w, x_scale, w_scale, x_shapes: tuple, w_shapes: tuple):
    """(A scale kind, its group stride, B scale kind, its group stride) of 8-bit operands, which
    must be K-contiguous; `x_shapes` / `w_shapes`: scale_kind's shape sets after the name."""
    if x_scale is None or w_scale is None:
        raise ValueError("x_scale and w_scale are required (float32)")
    a = scale_kind("x_scale", x_scale, *x_shapes)
    b = scale_kind("w_scale", w_scale, *w_shapes)
    check_k_major(x, w)
    return (*a, *b)


def check_k_major(x, w) -> None:
    """8-bit tensor-core operands must be K-contiguous: ValueError naming the one that is not."""
    for name, t in (("x", x), ("w", w)):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must be K-contiguous (stride 1 along K): FP8/INT8 tensor-core operands "
                             "are K-major (call .contiguous())")


def family_config_for(config, M: int, N: int, K: int, dev: DeviceInfo, a: OperandFormat, b: OperandFormat,
                      out_bytes: int, table: str | None, batch: int = 0) -> GemmConfig:
    """The caller's config (checked), else the table's entry (`gemmkit tune <table's ToolOp>`),
    else one derived from the device (table None: always derived). M: rows per group (grouped:
    the average per expert, what the grouped tables are keyed by). `batch` (batched GEMMs): the
    problem count, for batched_derived; grouped GEMMs' derived configs load through TMA."""
    from .config import derive_config, fit_to_smem, lookup_entry, resolve_config

    if config is None and table is None:
        cfg = derive_config(M, N, K, dev, a, b, out_bytes)
    else:
        cfg = resolve_config(table, config, M, N, K, dev, a, b, out_bytes)
    if config is None and (table is None or lookup_entry(dev.name, table, M, N, K)[0] is None):
        if batch:
            cfg = batched_derived(cfg, M, N, batch, dev, a, b, out_bytes)
        elif dev.has_tma:  # grouped: weights through TMA, 3 stages (scripts/grouped_probe.py: at 64 to
            # 4096 tokens of Qwen3-30B-A3B and DeepSeek-V3 layers 0.83-1.11x _grouped_mm against
            # 0.79-1.07x for the derived pointer-load, 6-stage configs; level or better on 9 of 12)
            cfg = dataclasses.replace(cfg, TMA=True, num_stages=min(cfg.num_stages, 3))
            if 8 <= M < 64:  # tens of rows per expert on average, but routing can be skewed: 32x64x128
                # tiles (grouped_probe.py --tiles at 512 tokens: 0.95-1.11x _grouped_mm where the
                # average-sized 16- or 32-row tiles gave 0.82x on DeepSeek-V3's Zipf routing; below
                # 8 rows, 64 tokens, the average-sized tiles did as well in bf16 and better in FP8)
                cfg = dataclasses.replace(cfg, BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4)
            cfg = fit_to_smem(cfg, dev, a, b, out_bytes)
    return cfg


def batched_derived(cfg: GemmConfig, M: int, N: int, batch: int, dev: DeviceInfo, a: OperandFormat,
                    b: OperandFormat, out_bytes: int) -> GemmConfig:
    """A derived config for `batch` problems of (M, N): where the batch's tiles fill the SMs, 3
    stages for 128x128 tiles (4 warps) and, from 256 rows and 4096 columns per problem, 128x256
    tiles with 8 warps and 4 stages on the persistent grid, instead of the deepest pipeline that
    fits (scripts/batched_probe.py on the H100: 0.94-0.96x torch.bmm at 8x512x4096x4096 and
    8x2048x1024x1024, where the 6-stage derived configs gave 0.77-0.78x; with fewer tiles than
    SMs the deep pipeline stays: 32x128x128x4096 ran best with it)."""
    from .config import fit_to_smem

    tiles = batch * -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
    if tiles < dev.num_sms or cfg.BLOCK_M != 128:
        return cfg
    if M >= 256 and N >= 4096:
        cfg = dataclasses.replace(cfg, BLOCK_N=256, num_warps=8, num_stages=4, PERSISTENT=cfg.TMA)
    else:
        cfg = dataclasses.replace(cfg, num_stages=min(cfg.num_stages, 3))
    return fit_to_smem(cfg, dev, a, b, out_bytes)
