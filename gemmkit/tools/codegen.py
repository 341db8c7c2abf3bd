"""`python -m gemmkit.tools.codegen`: compile the shared GEMM kernel for sm_90 without a GPU.

Builds a plan for a problem and config as the ops do (with an H100 profile), derives the
specialization Triton would compile at launch (argument types, 16-byte divisibility, integer
arguments equal to 1 as constants), compiles with `triton.compile(..., target=GPUTarget("cuda",
90, 32))` (ptxas ships with Triton) and reports registers, local memory (spills), shared memory
and the tensor-core instructions in the SASS. Checks what the interpreter cannot: that GPU-only
paths (TMA, persistent, split-K, stream-K, in-kernel quantization) lower and fit, that the
persistent TMA K loop costs what a bare tutorial-09 kernel's does (tools/bare_kernel.py), and
what a switch changes in the binary. Needs TRITON_INTERPRET unset (the kernels must be JIT functions).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.config import SMEM_SLACK, GemmConfig
from ..core.device import DeviceInfo, known_device

H100 = known_device("NVIDIA_H100_80GB_HBM3")
_TT_TYPES = {torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5", torch.bfloat16: "bf16",
             torch.float16: "fp16", torch.float32: "fp32", torch.int8: "i8", torch.int32: "i32",
             torch.uint8: "u8", torch.int64: "i64"}


@dataclass
class Binary:
    registers: int
    local_bytes: int
    shared_bytes: int
    sass: str
    sha1: str
    ptx: str = ""

    def count(self, opcode: str) -> int:
        """Occurrences of an instruction (prefix match, e.g. "QGMMA", "HGMMA", "UTMALDG")."""
        return len(re.findall(r"\b" + re.escape(opcode) + r"[.\s]", self.sass))


def _tools_dir() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def _arg_type(value):
    """(signature type, constant or None, divisible by 16) of one runtime argument."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if value is None:
        return "constexpr", None, False
    if isinstance(value, TensorDescriptor):
        block = ", ".join(map(str, value.block_shape))
        return f"tensordesc<{_TT_TYPES[value.base.dtype]}[{block}]>", None, False
    if isinstance(value, torch.Tensor):
        return "*" + _TT_TYPES[value.dtype], None, value.data_ptr() % 16 == 0
    if isinstance(value, bool):
        return "i1", None, False
    if isinstance(value, int):
        if value == 1:
            return "constexpr", 1, False
        return ("i32" if -(2**31) <= value < 2**31 else "i64"), None, value % 16 == 0
    raise TypeError(f"cannot type argument {value!r}")


def compile_gemm(M: int, N: int, K: int, cfg: GemmConfig, x_dtype=torch.bfloat16, w_dtype=None,
                 out_dtype=torch.bfloat16, a_scale: str = "", b_scale: str = "", a_quant: str = "",
                 activation: str = "none", exact: bool = False, dev: DeviceInfo = H100, gated: bool = False,
                 split_cat: tuple | None = None, a_scale_col: bool = False, mul_add: bool = False) -> Binary:
    """Compile gemm_kernel for sm_90 as a launch of this problem would. a_scale / b_scale: "",
    "tensor", "vector" (per row) or "kblock" (1x128 / 128x128 block scales); a_quant: "" or how a
    16-bit x is quantized to w's type in the kernel ("row", "group"); exact: fp32 promotion of
    each K tile (gemm_a8w8's fast_accum=False); gated: the fused feed-forward's gated GEMM (w as
    both the gate and the up weight, SiLU); split_cat: (d1, d2, d3) of the split/cat output map
    (N = heads * (d1 + d2)); a_scale_col: a "kblock" x_scale stored column-major (what
    quantize_fp8_blockwise(..., scale_layout="col") returns)."""
    from ..core.dense import DensePlan, _jit_kernel
    from ..core.epilogue import EpilogueSpec
    from ..core.formats import Scale, dense, quantized_in_kernel

    w_dtype = w_dtype or x_dtype
    x = torch.empty(M, K, dtype=x_dtype)
    w = torch.empty(N, K, dtype=w_dtype)
    y = torch.empty(M, N, dtype=out_dtype)
    kind = {"": Scale.NONE, "tensor": Scale.TENSOR, "vector": Scale.ROW, "kblock": Scale.KBLOCK}
    groups = lambda s: (128, 128) if s == "kblock" else (0, 1)  # noqa: E731
    if a_quant:
        a_fmt = quantized_in_kernel(x_dtype, w_dtype, a_quant, 128 if a_quant == "group" else 0)
    else:
        a_fmt = dense(x_dtype, kind[a_scale], groups(a_scale)[0])
    b_fmt = dense(w_dtype, kind[b_scale], *groups(b_scale))
    g = -(-K // 128)
    scales = {"": None, "tensor": torch.empty((), dtype=torch.float32)}
    a_s = scales.get(a_scale, torch.empty(M, g, dtype=torch.float32) if a_scale == "kblock"
                     else torch.empty(M, dtype=torch.float32))
    if a_scale_col:
        a_s = torch.empty(g, M, dtype=torch.float32).t()
    b_s = scales.get(b_scale, torch.empty(-(-N // 128), g, dtype=torch.float32) if b_scale == "kblock"
                     else torch.empty(N, dtype=torch.float32))
    spec = EpilogueSpec("silu", gated=True) if gated else EpilogueSpec(activation)
    sc = c2 = src = None
    if split_cat:
        d1, d2, d3 = split_cat
        heads = N // (d1 + d2)
        out1 = torch.empty(M, heads, d1 + d3, dtype=out_dtype)
        c2, src = torch.empty(M, heads, d2, dtype=out_dtype), torch.empty(M, heads, d3, dtype=out_dtype)
        sc = dict(d1=d1, dh=d1 + d2, d3=d3, out1=out1, out2=c2, src=src)
        y = out1.view(M, -1)
    mul = add = torch.empty(M, N, dtype=out_dtype) if mul_add else None
    plan = DensePlan(x, w, y, a_fmt, b_fmt, spec, cfg, dev, out_dtype=out_dtype, out_shape=(M, N), flatten_x=False,
                     inputs=dict(a_scale=a_s, b_scale=b_s, b2=w if gated else None, mul=mul, add=add),
                     exact_accumulation=exact, up_scale=(N, 1) if gated and b_scale == "vector" else (0, 0),
                     split_cat=sc)
    head = plan.head(x, w, y, torch.empty(plan.ws_shape, dtype=plan.ws_dtype) if plan.pieces else None,
                     torch.empty(plan.num_tiles, dtype=torch.int32) if plan.pieces else None, None, a_s, b_s, mul,
                     add, checked=False, b2=w if gated else None, c2=c2, cat_src=src)
    return _compile(_jit_kernel(), (*head, *plan.tail), cfg)


def compile_grouped(M: int, N: int, K: int, cfg: GemmConfig, x_dtype=torch.bfloat16, out_dtype=torch.bfloat16,
                    tile_map: str = "grouped", experts: int = 8, gather: bool = True, scatter: bool = True,
                    dev: DeviceInfo = H100, gated: bool = False, block_scales: bool = False) -> Binary:
    """Compile gemm_kernel for sm_90 as a grouped (MoE: M sorted rows over `experts`, gathered
    A rows, weighted scattered C rows) or batched (`experts` problems of M rows) launch would;
    `gated`: the gate / up halves of (experts, 2N, K) weights with the gated epilogue (moe_mlp's);
    `block_scales` (FP8, grouped): DeepSeek-V3's 1x128 / 128x128 scales in the K loop."""
    from ..core.dense import _jit_kernel
    from ..core.epilogue import EpilogueSpec
    from ..core.formats import Scale, dense
    from ..core.grouped import GroupedPlan
    from ..kernels import modes

    fp8 = x_dtype.itemsize == 1
    x = torch.empty(M, K, dtype=x_dtype)
    w = torch.empty(experts, 2 * N, K, dtype=x_dtype)[:, :N] if gated else torch.empty(experts, N, K, dtype=x_dtype)
    xs, ws = (torch.empty(M, dtype=torch.float32), torch.empty(experts, N, dtype=torch.float32)) if fp8 else (None, None)
    a_fmt, b_fmt = dense(x_dtype, Scale.ROW if fp8 else Scale.NONE), dense(x_dtype, Scale.ROW if fp8 else Scale.NONE)
    scale_strides, s_bsg = None, N
    if block_scales:
        G = -(-K // 128)
        xs, ws = torch.empty(M, G, dtype=torch.float32), torch.empty(experts, -(-N // 128), G, dtype=torch.float32)
        a_fmt, b_fmt = dense(x_dtype, Scale.KBLOCK, 128), dense(x_dtype, Scale.KBLOCK, 128, 128)
        scale_strides = dict(stride_asm=G, stride_ask=1, stride_bsn=G, stride_bsk=1)
        s_bsg = ws.stride(0)
    grouped = tile_map == "grouped"
    plan = GroupedPlan(modes.MAP_GROUPED if grouped else modes.MAP_BATCHED, x, w,
                       (M, N) if grouped else (experts, M, N), (N, 1), M, experts, a_fmt, b_fmt,
                       EpilogueSpec("silu", gated=True) if gated else EpilogueSpec("none"),
                       cfg, dev, out_dtype=out_dtype,
                       group_strides=dict(stride_bsg=s_bsg) if grouped else dict(stride_ag=M * K, stride_cg=M * N,
                                                                                 stride_bsg=N),
                       gather=grouped and gather, index_extent=0, scale_strides=scale_strides)
    idx = torch.empty(M, dtype=torch.int32)
    head = (x if plan.a_desc is None else plan.a_desc(x, False), w if plan.b_desc is None else plan.b_desc(w, False),
            torch.empty(M, N, dtype=out_dtype), None, None, None, xs, ws, None, None, None, None,
            idx if grouped and gather else None, idx if grouped and scatter else None,
            torch.empty(M, dtype=torch.float32) if grouped and scatter else None,
            torch.empty(experts + 1, dtype=torch.int32) if grouped else None,
            (w if plan.b_desc is None else plan.b_desc(w, False)) if gated else None, None)
    return _compile(_jit_kernel(), (*head, *plan.tail), plan.cfg)


def compile_packed(M: int, N: int, K: int, cfg: GemmConfig, packed: str, x_dtype=torch.bfloat16,
                   out_dtype=torch.bfloat16, group: int = 128, dev: DeviceInfo = H100, zero: bool = True) -> Binary:
    """Compile gemm_kernel for sm_90 with 4-bit operands: packed "int4" (group scales, zero points
    unless not `zero`) or "mxfp4" weights with a 16-bit x, or "afp4wfp4" (both MXFP4)."""
    from ..core.dense import DensePlan, _jit_kernel
    from ..core.epilogue import EpilogueSpec

    a_fmt, b_fmt = packed_formats(packed, x_dtype, group)
    fp4_x = packed == "afp4wfp4"
    x = torch.empty(M, K // 2 if fp4_x else K, dtype=torch.uint8 if fp4_x else x_dtype)
    w = torch.empty(N, K // 2, dtype=torch.uint8)
    y = torch.empty(M, N, dtype=out_dtype)
    if packed == "int4":
        b_s, a_s = torch.empty(N, K // group, dtype=x_dtype), None
        b_z = torch.empty(N, K // group, dtype=torch.uint8) if zero else None
    else:
        b_s, b_z = torch.empty(N, K // 32, dtype=torch.uint8), None
        a_s = torch.empty(M, K // 32, dtype=torch.uint8) if fp4_x else None
    plan = DensePlan(x, w, y, a_fmt, b_fmt, EpilogueSpec("none"), cfg, dev, out_dtype=out_dtype, out_shape=(M, N),
                     flatten_x=False, inputs=dict(a_scale=a_s, b_scale=b_s, b_zero=b_z), logical_k=K)
    head = plan.head(x, w, y, torch.empty(plan.ws_shape, dtype=plan.ws_dtype) if plan.pieces else None,
                     torch.empty(plan.num_tiles, dtype=torch.int32) if plan.pieces else None, None, a_s, b_s, None,
                     None, checked=False, b_zero=b_z)
    tail = list(plan.tail)  # the plan was built on the CPU: take the CUDA build's nibble decoding
    tail[_jit_kernel().arg_names.index("FAST_UNPACK") - len(head)] = True
    return _compile(_jit_kernel(), (*head, *tail), cfg)


def packed_formats(packed: str, x_dtype=torch.bfloat16, group: int = 128):
    """(A, B) OperandFormats of a 4-bit problem of compile_packed."""
    from ..core.formats import Scale, dense, packed4

    if packed == "int4":
        return dense(x_dtype), packed4(x_dtype, Scale.GROUP, group)
    if packed == "mxfp4":
        return dense(x_dtype), packed4(x_dtype, Scale.MX, 32)
    return packed4(torch.bfloat16, Scale.MX, 32), packed4(torch.bfloat16, Scale.MX, 32)


def compile_bare(M: int, N: int, K: int, cfg: GemmConfig, dtype=torch.float8_e4m3fn, out_dtype=torch.bfloat16,
                 scales: bool = True, dev: DeviceInfo = H100) -> Binary:
    """Compile tools/bare_kernel.py's tutorial-09-style kernel for sm_90 with cfg's tiles."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from .bare_kernel import bare_persistent_gemm

    bm, bn, bk = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    descs = [TensorDescriptor.from_tensor(torch.empty(r, c, dtype=dt), block)
             for r, c, dt, block in ((M, K, dtype, [bm, bk]), (N, K, dtype, [bn, bk]), (M, N, out_dtype, [bm, bn]))]
    args = (*descs, torch.empty(M, dtype=torch.float32), torch.empty(N, dtype=torch.float32), M, N, K,
            bm, bn, bk, cfg.GROUP_M, dev.num_sms, scales)
    return _compile(bare_persistent_gemm, args, cfg)


def compile_ws(M: int, N: int, K: int, scales: str = "kblock", promote: bool = True, dtype=torch.float8_e4m3fn,
               xs_tma: bool = True, out_dtype=torch.bfloat16, num_sms: int = H100.num_sms, gated: bool = False,
               tiles=None, batch: int = 1, swap: bool = False, experts: int = 0, gather: bool = False,
               scatter: bool = False) -> Binary:
    """Compile the warp-specialized Gluon kernel (kernels/gemm_ws.py) for sm_90 with the arguments
    core/hopper_ws.WSPlan passes for this problem: scales "kblock" (x scales by TMA or by register
    loads), "rowcol" or "none" (bf16 / fp16), FP8 promoted or not, the plan's tile width, TMA stores
    for 16-bit outputs (pointer stores for fp32). gated: the fused feed-forward's gated tiles
    (silu(x @ gate^T) * (x @ up^T), N the intermediate size; per-channel scales for "rowcol").
    tiles: (rows, column parts) forced (WSPlan's tiles; rows 64: one consumer warp group).
    batch: that many (M, N, K) problems with weights of their own (gemmkit.batched_gemm_a16w16); swap: their
    operands swapped (the weight's rows as the tiles' rows, `tiles`' parts over x's rows; ws_batched_swap).
    experts: M sorted rows over that many experts' (N, K) weights (the expert map: gemmkit.grouped_gemm_a16w16 /
    grouped_gated_a16w16 through hopper_ws.ws_grouped_plan; gated: N the intermediate size, gate and up rows of
    each expert in one (E, 2N, K) weight; gather: A's rows gathered from x by the producer's cp.async; scatter: rows
    stored at their c_rows and weighted, by pointers)."""
    from ..core import hopper_ws as hw

    kernel = hw.gluon_kernel().gemm_ws_kernel
    G = -(-K // hw.BLOCK)
    x, w = torch.empty(batch * M, K, dtype=dtype), torch.empty(batch * N, K, dtype=dtype)
    c = torch.empty(batch * M, N, dtype=out_dtype)
    if scales == "kblock":
        xs = torch.empty(G, M).t() if xs_tma else torch.empty(M, G)
        ws = torch.empty(-(-N // hw.BLOCK), G)
    elif scales == "rowcol":
        xs, ws = torch.empty(M, 1), torch.empty(1, 2 * N if gated else N)
    else:
        xs = ws = None
    bias = torch.empty(N, dtype=out_dtype)
    if gated:
        bias = None
    if experts:  # the plan ws_grouped_plan makes (without its device checks)
        w3 = torch.empty(experts, 2 * N if gated else N, K, dtype=dtype)
        w_rows = ((experts - 1) * w3.shape[1] + N, K)
        w2 = torch.as_strided(w3, w_rows, (K, 1))
        up = torch.as_strided(w3[:, N:], w_rows, (K, 1)) if gated else None
        bias = None if gated else torch.empty(experts, N, dtype=out_dtype)
        xs, ws = (torch.empty(M), torch.empty(experts, N)) if scales == "rowcol" else (None, None)
        plan = hw.WSPlan(x, w2, None, M, N, K, scales, xs, ws, bias, out_dtype, (M, N), False, num_sms,
                         promote=False, gated=("silu", (0, 1)) if gated else None,
                         tiles=tiles or (None if gated else hw.ws_tiles(M, N, num_sms, dtype in hw._FP8)),
                         experts=(experts, w3.shape[1], N if scales == "rowcol" else 0), gather=gather,
                         scatter=(scatter, scatter))
        rows = torch.zeros(M, dtype=torch.int32)
        return _compile_gluon(kernel, (*plan.arguments(x, w2, c, bias, xs, ws, up,
                                                       torch.zeros(experts + 1, dtype=torch.int32),
                                                       rows if gather else None, rows if scatter else None,
                                                       torch.empty(M) if scatter else None), *plan.tail))
    plan = hw.WSPlan(x, w, None, M, N, K, scales, xs, ws, bias, out_dtype, (M, N), False, num_sms, promote,
                     gated=("silu", (N, 1)) if gated else None, tiles=tiles,
                     batch=(batch, N) if batch > 1 else None, swap=swap)
    if plan.splits > 1:  # the kernel writes K slices' fp32 partials into the workspace
        c = torch.empty(plan.ws_shape, dtype=torch.float32)
    return _compile_gluon(kernel, (*plan.arguments(x, w, c, bias, xs, ws, w if gated else None), *plan.tail))


def _compile_gluon(kernel, args, num_warps: int = 4) -> Binary:
    """Compile a Gluon kernel for sm_90 with the specialization a launch with `args` would get."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import JITFunction, create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    bound, specialization, opts = create_function_from_signature(kernel.signature, kernel.params, backend)(
        *args, num_warps=num_warps)
    opts, signature, constexprs, attrs = JITFunction._pack_args(kernel, backend, dict(num_warps=num_warps), bound,
                                                               specialization, opts)
    compiled = triton.compile(GluonASTSource(kernel, signature, constexprs, attrs), target=target,
                              options=opts.__dict__)
    b = _inspect(compiled.asm["cubin"], compiled.metadata.shared, with_stack=True)
    b.ptx = compiled.asm["ptx"]
    return b


def ptxas_serializes_wgmma(ptx: str) -> bool | None:
    """Whether the CUDA 12 ptxas that Triton ships beside its newer one (Triton 3.6, as on the device, builds
    sm_90 with it) serializes the kernel's wgmma (C7514: every product waited for; the newer ptxas that
    compiled this binary may not say so). None where this Triton ships no such ptxas."""
    import tempfile

    ptxas = _tools_dir() / "ptxas"
    if not ptxas.is_file():
        return None
    version = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True).stdout
    if "release 12." not in version:
        return None
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(re.sub(r"^\.version \d+\.\d+", ".version 8.7", ptx, count=1, flags=re.M))
        run = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(src), "-o", str(Path(d) / "k.cubin")],
                             capture_output=True, text=True)
    return "C7514" in run.stdout + run.stderr


def _w4_example(M: int, N: int, K: int, dtype, group: int, zero: bool, bias: bool, mxfp4: bool) -> tuple:
    """(x, packed weight, scales, zero points or None, bias or None, y) of a 4-bit problem (CPU tensors:
    only their facts matter to a compile)."""
    x, w_q = torch.empty(M, K, dtype=dtype), torch.empty(N, K // 2, dtype=torch.uint8)
    ws = torch.empty(N, K // group, dtype=torch.uint8 if mxfp4 else dtype)
    wz = torch.empty(N, K // group, dtype=torch.uint8) if zero and not mxfp4 else None
    b = torch.empty(N, dtype=dtype) if bias else None
    return x, w_q, ws, wz, b, torch.empty(M, N, dtype=dtype)


def compile_w4_decode(M: int, N: int, K: int, dtype=torch.bfloat16, group: int = 128, zero: bool = True,
                      bias: bool = False, activation: str = "none", mxfp4: bool = False,
                      dev: DeviceInfo = H100) -> Binary:
    """Compile the Hopper INT4 decode kernel (kernels/gemm_w4_decode.py) for sm_90 with the
    arguments core/hopper_w4.W4DecodePlan passes for this problem (INT4 weight, `group`-wide
    scale groups, zero points or not; mxfp4: MXFP4 weight, e8m0 scales of 32)."""
    from ..core import hopper_w4 as hw

    x, w_q, ws, wz, b, y = _w4_example(M, N, K, dtype, group, zero, bias, mxfp4)
    plan = hw.W4DecodePlan(dev, x, w_q, wz, None, M, N, K, group, b, activation, dtype, (M, N), False, mxfp4)
    kernel = hw.decode_kernel()
    sums = torch.empty(M * N, dtype=torch.float32) if plan.slices > 1 else None
    counters = torch.empty(plan.groups, dtype=torch.int32) if plan.finish_here else None
    return _compile_gluon(kernel, (plan.w_desc(w_q.view(torch.int32)), x, ws, wz, y, b, sums, counters,
                                   *plan._tail(ws, wz)), plan.num_warps)


def compile_w4_prefill(M: int, N: int, K: int, dtype=torch.bfloat16, group: int = 128, zero: bool = True,
                       bias: bool = False, activation: str = "none", mxfp4: bool = False,
                       dev: DeviceInfo = H100) -> Binary:
    """Compile the Hopper 4-bit prefill kernel (kernels/gemm_w4_prefill.py) for sm_90 with the arguments
    core/hopper_w4.W4PrefillPlan passes for this problem (as compile_w4_decode)."""
    from ..core import hopper_w4 as hw

    x, w_q, ws, wz, b, y = _w4_example(M, N, K, dtype, group, zero, bias, mxfp4)
    plan = hw.W4PrefillPlan(dev, x, w_q, wz, None, M, N, K, group, b, activation, dtype, (M, N), False, mxfp4)
    sums = torch.empty(plan.sums_rows * N, dtype=torch.float32) if plan.splits > 1 else None
    return _compile_gluon(plan.kernel, (plan.w_desc(w_q.view(torch.int32)), plan.x_desc(x), ws, wz, y, b, sums,
                                        *plan._tail(ws, wz)), plan.values["BN"] // 16)


def compile_w4_tile(M: int, N: int, K: int, dtype=torch.bfloat16, group: int = 128, zero: bool = True,
                    bias: bool = False, mxfp4: bool = False, out_dtype=None, tiles=None,
                    dev: DeviceInfo = H100) -> Binary:
    """Compile the warp-specialized GEMM with a 4-bit weight (kernels/gemm_ws.py W_FORMAT) for sm_90 with the
    arguments core/hopper_w4.W4TilePlan passes for this problem (tiles: forced (weight rows, x's parts))."""
    from ..core import hopper_w4 as hw

    x, w_q, ws, wz, b, y = _w4_example(M, N, K, dtype, group, zero, bias, mxfp4)
    plan = hw.W4TilePlan(dev, x, w_q, ws, wz, None, M, N, K, group, b, out_dtype or dtype, (M, N), False, mxfp4,
                         tiles)
    c = torch.empty(plan.ws_shape, dtype=torch.float32) if plan.splits > 1 else y.to(out_dtype or dtype)
    return _compile_gluon(plan.kernel, (*plan.arguments(x, w_q, c, b if plan.splits == 1 else None, ws, wz),
                                        *plan.tail))


def _compile(kernel, args, cfg: GemmConfig) -> Binary:
    """Compile a JIT kernel for sm_90 with the specialization a launch with `args` would get."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, constants, attrs = {}, {}, {}
    for i, (param, value) in enumerate(zip(kernel.params, args)):
        if param.is_constexpr:
            signature[param.name], constants[(i,)] = "constexpr", value
            continue
        ty, const, div16 = _arg_type(value)
        signature[param.name] = ty
        if ty == "constexpr":
            constants[(i,)] = const
        elif div16:
            attrs[(i,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(kernel, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    return _inspect(compiled.asm["cubin"], compiled.metadata.shared)


def k_loop(sass: str) -> list[str]:
    """Opcodes (with modifiers, without predicates and operands) of the basic block that holds
    the tensor-core instructions: the K loop's steady state."""
    body = []
    for line in sass.splitlines():
        line = re.sub(r"/\*.*?\*/", "", line).strip()
        if re.match(r"^\.L\w*:", line):
            body.append(":")
        elif line and line[0] in "@ABCDEFGHIJKLMNOPQRSTUVWXYZ":
            body.append(re.sub(r"^@!?U?P\w+\s+", "", line).split()[0].rstrip(";"))
    mma = [i for i, op in enumerate(body) if op.split(".")[0] in _MMA]
    if not mma:
        return []
    start = max(i for i in range(mma[0]) if body[i] == ":") + 1 if ":" in body[:mma[0]] else 0
    end = next((i for i in range(mma[-1], len(body)) if body[i].startswith("BRA")), len(body) - 1)
    return body[start:end + 1]


def _inspect(cubin: bytes, shared_bytes: int, with_stack: bool = False) -> Binary:
    import tempfile

    tools = _tools_dir()
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([str(tools / "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    local = int(re.search(r"LOCAL:(\d+)", usage).group(1))
    if with_stack:  # ptxas spills into the stack frame too (the warp-specialized kernel's did)
        local += sum(map(int, re.findall(r"STACK:(\d+)", usage)))
    return Binary(regs, local, shared_bytes, sass, hashlib.sha1(cubin).hexdigest())


_FP8 = dict(x_dtype=torch.float8_e4m3fn, a_scale="vector", b_scale="vector")  # row-wise x, column-wise w
_BLOCK = dict(x_dtype=torch.float8_e4m3fn, a_scale="kblock", b_scale="kblock")  # DeepSeek-V3 block scales
_DYNAMIC = dict(w_dtype=torch.float8_e4m3fn, b_scale="vector", a_quant="row")  # bf16 x quantized in the GEMM


def _tiles(bm, bn, bk, stages, warps=8, **flags):
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=stages, num_warps=warps, **flags)


_PERSISTENT = dict(TMA=True, PERSISTENT=True)
# The configs the shipped tables lean on, by regime: (M, N, K, config, compile_gemm arguments,
# the tensor-core instruction expected: warpgroup MMA (HGMMA bf16/fp16, QGMMA fp8, IGMMA int8)
# for 64-row and larger tiles, HMMA (mma.sync) for 16-row ones).
CHECKS = {
    "bf16 persistent TMA 128x256x64": (8192, 8192, 8192, _tiles(128, 256, 64, 3, **_PERSISTENT), {}, "HGMMA"),
    "fp8 persistent TMA 128x256x128, row/column scales": (
        8192, 8192, 8192, _tiles(128, 256, 128, 3, **_PERSISTENT), _FP8, "QGMMA"),
    "fp8 persistent TMA 128x256x128, 4 stages, split epilogue (at the shared-memory limit)": (
        8192, 8192, 8192, _tiles(128, 256, 128, 4, EPILOGUE_SUBTILE=True, **_PERSISTENT), _FP8, "QGMMA"),
    "fp8 persistent TMA 128x256x256, 2 stages, split epilogue": (
        8192, 8192, 8192, _tiles(128, 256, 256, 2, EPILOGUE_SUBTILE=True, **_PERSISTENT), _FP8, "QGMMA"),
    "fp8 stream-K": (4096, 4096, 4096, _tiles(128, 256, 128, 3, STREAM_K=True, **_PERSISTENT), _FP8, "QGMMA"),
    "int8 TMA 128x128x128": (1024, 4096, 4096, _tiles(128, 128, 128, 4, TMA=True),
                             dict(_FP8, x_dtype=torch.int8), "IGMMA"),
    "bf16 small-M split-K, pointer loads": (16, 4096, 14336, _tiles(16, 64, 128, 4, 4, SPLIT_K=4), {}, "HMMA"),
    "fp8 small-M, pointer loads, 4 stages of 16x128x512": (16, 8192, 8192, _tiles(16, 128, 512, 4, 4), _FP8, "HMMA"),
    "dynamic FP8 (quantized in the GEMM), M=16": (16, 6144, 4096, _tiles(16, 64, 512, 3, 4), _DYNAMIC, "HMMA"),
    "dynamic FP8 (quantized in the GEMM), M=64, split-K": (
        64, 6144, 4096, _tiles(64, 128, 256, 3, 4, SPLIT_K=2), _DYNAMIC, "QGMMA"),
    "fp8 blockscale (1x128 / 128x128 scales) persistent TMA 128x128x128": (
        4096, 7168, 7168, _tiles(128, 128, 128, 4, **_PERSISTENT), _BLOCK, "QGMMA"),
    "fp8 blockscale, pointer loads, M=16": (16, 7168, 2048, _tiles(16, 64, 128, 4, 4), _BLOCK, "HMMA"),
    "fp8 blockscale, column-major x_scale (dynamic x quantized first, large M), persistent TMA 128x128x128": (
        4096, 7168, 7168, _tiles(128, 128, 128, 4, **_PERSISTENT), dict(_BLOCK, a_scale_col=True), "QGMMA"),
    "dynamic fp8 blockscale (x quantized per 1x128 group in the GEMM), M=64": (
        64, 7168, 7168, _tiles(64, 128, 128, 3, 4), dict(w_dtype=torch.float8_e4m3fn, a_quant="group",
                                                           b_scale="kblock"), "QGMMA"),
    "fp8 exact accumulation (fast_accum=False) persistent TMA 128x256x128": (
        8192, 8192, 8192, _tiles(128, 256, 128, 3, EPILOGUE_SUBTILE=True, **_PERSISTENT), dict(_FP8, exact=True),
        "QGMMA"),
    "dynamic INT8 (quantized in the GEMM), M=16": (
        16, 6144, 4096, _tiles(16, 64, 256, 3, 4), dict(_DYNAMIC, w_dtype=torch.int8), "IMMA"),
    # MoE / batched family (pointer loads, persistent; kw "tile_map" selects compile_grouped)
    "bf16 grouped (MoE: gathered A rows, weighted scattered C rows) persistent 128x128x64": (
        8192, 4096, 7168, _tiles(128, 128, 64, 3, PERSISTENT=True), dict(tile_map="grouped", experts=256), "HGMMA"),
    "fp8 grouped (MoE), per-token / per-channel scales, persistent 128x128x128": (
        8192, 4096, 7168, _tiles(128, 128, 128, 3, PERSISTENT=True),
        dict(tile_map="grouped", experts=256, x_dtype=torch.float8_e4m3fn), "QGMMA"),
    "fp8 grouped (MoE) with DeepSeek-V3 block scales, TMA weights, 128x64x128 (derived for 128 rows per expert)": (
        8192, 4096, 7168, _tiles(128, 64, 128, 3, 4, TMA=True),
        dict(tile_map="grouped", experts=256, x_dtype=torch.float8_e4m3fn, block_scales=True), "QGMMA"),
    "bf16 batched persistent 128x128x64": (
        2048, 2048, 2048, _tiles(128, 128, 64, 3, PERSISTENT=True), dict(tile_map="batched", experts=8), "HGMMA"),
    "bf16 grouped (MoE, sorted rows), TMA descriptors over every expert 32x64x128 (derived for 8-63 rows per expert)": (
        4096, 4096, 7168, _tiles(32, 64, 128, 3, 4, **_PERSISTENT), dict(tile_map="grouped", experts=256, gather=False),
        "HMMA"),
    "bf16 grouped gated (moe_mlp's fused activation: gate / up halves, two accumulators), TMA 32x64x128": (
        4096, 1536, 2048, _tiles(32, 64, 128, 3, 4, **_PERSISTENT), dict(tile_map="grouped", experts=128, gated=True),
        "HMMA"),
    "bf16 batched, TMA descriptors over every batch entry, persistent 128x256x64, 4 stages (derived)": (
        512, 4096, 4096, _tiles(128, 256, 64, 4, 8, **_PERSISTENT), dict(tile_map="batched", experts=8), "HGMMA"),
    # fused feed-forward: the gated GEMM (gate and up tiles per K step, two accumulators), Llama-3 8B
    "gated bf16 (fused gate/up) persistent TMA 128x128x64, M=4096": (
        4096, 14336, 4096, _tiles(128, 128, 64, 3, **_PERSISTENT), dict(gated=True), "HGMMA"),
    "gated bf16, pointer loads, M=16": (16, 14336, 4096, _tiles(16, 64, 128, 3, 4), dict(gated=True), "HMMA"),
    "gated fp8 persistent TMA 128x128x128, row/column scales": (
        4096, 14336, 4096, _tiles(128, 128, 128, 3, **_PERSISTENT), dict(_FP8, gated=True), "QGMMA"),
    "gated dynamic FP8 (quantized in the GEMM), M=16": (
        16, 14336, 4096, _tiles(16, 64, 256, 3, 4), dict(_DYNAMIC, gated=True), "HMMA"),
    # fused split/cat output map (MLA kv_b_proj, DeepSeek-V3: 128 heads of 128 + 128, rope 64)
    "split/cat bf16 TMA loads 128x128x64, M=1024": (
        1024, 32768, 512, _tiles(128, 128, 64, 4, TMA=True), dict(split_cat=(128, 128, 64)), "HGMMA"),
    "split/cat fp8 pointer loads, M=16": (
        16, 32768, 512, _tiles(16, 64, 128, 4, 4), dict(_FP8, split_cat=(128, 128, 64)), "HMMA"),
    # 4-bit weights (issue 17): packed tiles decoded in registers, 16-bit dots
    "int4 weights (group 128), M=16, split-K 16x128x128 (derived for decode)": (
        16, 4096, 4096, _tiles(16, 128, 128, 3, 4, SPLIT_K=4), dict(packed="int4"), "HMMA"),
    "int4 weights (group 128), M=16, pointer loads 16x32x256": (
        16, 4096, 4096, _tiles(16, 32, 256, 6, 4), dict(packed="int4"), "HMMA"),
    "int4 weights (group 32: 4 groups per K tile), M=16, split-K 16x64x128": (
        16, 4096, 14336, _tiles(16, 64, 128, 3, 4, SPLIT_K=4), dict(packed="int4", group=32), "HMMA"),
    "int4 weights (group 128), M=1024, 128x128x64, TMA x": (
        1024, 4096, 4096, _tiles(128, 128, 64, 3, 8, TMA=True), dict(packed="int4"), "HGMMA"),
    "mxfp4 weights, M=16, split-K 16x128x128 (derived for decode)": (
        16, 4096, 4096, _tiles(16, 128, 128, 3, 4, SPLIT_K=4), dict(packed="mxfp4"), "HMMA"),
    "mxfp4 weights, M=1024, 128x128x64, TMA x": (
        1024, 4096, 4096, _tiles(128, 128, 64, 3, 8, TMA=True), dict(packed="mxfp4"), "HGMMA"),
    "afp4wfp4 (both MXFP4), M=1024, 128x128x64": (
        1024, 4096, 4096, _tiles(128, 128, 64, 3, 8), dict(packed="afp4wfp4"), "HGMMA"),
}
_MMA = ("HGMMA", "QGMMA", "IGMMA", "HMMA", "IMMA")
# K-loop instructions per decoded weight value (per thread) allowed for the 4-bit decode paths:
# decoding from the bits with the nibbles kept as even / odd halves measured 3.3 (INT4) and 5.7
# (MXFP4) with triton 3.6 and 3.9; the join + int-to-float decode it replaced took 6.4 (INT4).
PACKED_LOOP_LIMITS = {"int4 weights (group 128), M=16, split-K 16x128x128 (derived for decode)": 4.0,
                      "mxfp4 weights, M=16, split-K 16x128x128 (derived for decode)": 6.5}


def _formats(kw: dict):
    """The (A, B) OperandFormats a CHECKS entry's compile_gemm arguments describe (for the
    shared-memory estimate)."""
    from ..core.formats import dense, quantized_in_kernel

    x_dtype = kw.get("x_dtype", torch.bfloat16)
    if kw.get("packed"):
        return packed_formats(kw["packed"], x_dtype, kw.get("group", 128))
    w_dtype = kw.get("w_dtype") or x_dtype
    a = quantized_in_kernel(x_dtype, w_dtype, kw["a_quant"], 128) if kw.get("a_quant") else dense(x_dtype)
    b = dense(w_dtype)
    if kw.get("gated"):  # two B tiles per K step
        import dataclasses

        b = dataclasses.replace(b, bits=2 * b.bits)
    return a, b  # (scales take no shared memory)


def check(name: str, dev: DeviceInfo = H100) -> tuple[bool, Binary, str]:
    """Compile one of CHECKS: (passed, binary, one-line report). Passing: no local memory (spills
    or stack arrays), at most 255 registers, the expected tensor-core instruction present, and
    the shared memory within the device's limit and within SMEM_SLACK of GemmConfig.smem_bytes
    (the estimate that the tuner's search space and fit_to_smem rely on)."""
    M, N, K, cfg, kw, mma = CHECKS[name]
    cfg = GemmConfig.from_dict(cfg)
    if "tile_map" in kw:
        b = compile_grouped(M, N, K, cfg, **kw)
    else:
        b = compile_packed(M, N, K, cfg, **kw) if kw.get("packed") else compile_gemm(M, N, K, cfg, **kw)
    estimate = cfg.smem_bytes(*_formats(kw), kw.get("out_dtype", torch.bfloat16).itemsize)
    found = {op: b.count(op) for op in _MMA if b.count(op)}
    ok = (b.local_bytes == 0 and b.registers <= 255 and mma in found and b.shared_bytes <= dev.smem_per_block
          and b.shared_bytes <= estimate + SMEM_SLACK)
    if kw.get("a_quant") and kw.get("w_dtype") == torch.int8:  # round-half-even by adding and subtracting 1.5 * 2^23: both kept
        ok = ok and b.sass.count("12582912") >= 2 and "-12582912" in b.sass
    loop = ""
    if "tile_map" in kw and cfg.TMA:  # the descriptors are used: tensor loads in the binary
        ok = ok and b.count("UTMALDG") > 0
    if name in PACKED_LOOP_LIMITS:
        per_value = len(k_loop(b.sass)) / (cfg.BLOCK_N * cfg.BLOCK_K / (32 * cfg.num_warps))
        ok = ok and per_value <= PACKED_LOOP_LIMITS[name]
        loop = f"; K loop {per_value:.2f} instructions per weight value (at most {PACKED_LOOP_LIMITS[name]})"
    plain_loop = not (kw.get("a_quant") or kw.get("exact") or kw.get("gated") or kw.get("split_cat") or kw.get("packed")
                      or "kblock" in (kw.get("a_scale"), kw.get("b_scale")))
    if "tile_map" not in kw and cfg.TMA and cfg.PERSISTENT and not cfg.STREAM_K and cfg.SPLIT_K == 1 and plain_loop:
        same, loop = _compare_bare(b, M, N, K, cfg, kw, dev)
        ok = ok and same
    return ok, b, (f"{'ok ' if ok else 'BAD'} {name}: {b.registers} registers, {b.local_bytes} B local, "
                   f"{b.shared_bytes} B shared (estimate {estimate}), tensor-core instructions {found} "
                   f"(expected {mma}){loop}")


# K-loop instructions the shared kernel may spend beyond the bare kernel's (the two schedule
# the same work differently by a few integer/uniform-register instructions).
K_LOOP_SLACK = 4
_LOOP_KEY_OPS = _MMA + ("UTMALDG", "BAR", "SYNCS", "WARPGROUP")


def _compare_bare(b: Binary, M, N, K, cfg: GemmConfig, kw: dict, dev: DeviceInfo) -> tuple[bool, str]:
    """Whether gemm_kernel's K loop costs what a bare tutorial-09 kernel's does with the same
    tiles and scaling: the same tensor-core, TMA and barrier instructions, and at most
    K_LOOP_SLACK more in all."""
    bare = compile_bare(M, N, K, cfg, kw.get("x_dtype", torch.bfloat16), kw.get("out_dtype", torch.bfloat16),
                        scales=kw.get("a_scale") == kw.get("b_scale") == "vector", dev=dev)
    ours, ref = k_loop(b.sass), k_loop(bare.sass)

    def key(ops):
        return sorted(op for op in ops if op.split(".")[0] in _LOOP_KEY_OPS)

    same = bool(ours) and key(ours) == key(ref) and len(ours) <= len(ref) + K_LOOP_SLACK
    return same, f"; K loop {len(ours)} instructions (bare tutorial-09 kernel {len(ref)}{'' if same else ', DIFFERENT'})"


# The warp-specialized Gluon kernel's variants (compile_ws arguments, widths and K slices as WSPlan
# picks them for each problem): each must compile without local memory or stack (its 256-wide
# block-scaled form spilled 968 bytes into a 200-byte stack frame and ran 2.5x slower), with
# warpgroup MMAs of the operands' type, TMA loads, TMA stores for 16-bit outputs and K slices'
# partials, and shared memory within the device's limit.
WS_CHECKS = {  # (M, N, K, compile_ws keywords, tensor-core instruction)
    "gluon fp8 blockscale, x scales by TMA, TMA stores": (4096, 7168, 7168, dict(scales="kblock"), "QGMMA"),
    "gluon fp8 blockscale, x scales by register loads, fp32 output by pointers": (
        4096, 7168, 7168, dict(scales="kblock", xs_tma=False, out_dtype=torch.float32), "QGMMA"),
    "gluon fp8 fast_accum=False, 128x256 tiles, TMA stores": (4096, 7168, 7168, dict(scales="rowcol"), "QGMMA"),
    "gluon fp8 fast_accum=False, 128x128 tiles, pointer stores": (
        1024, 6144, 4096, dict(scales="rowcol", out_dtype=torch.float32), "QGMMA"),
    "gluon fp8 fast accumulation, 128x160 tiles (128 + 32)": (
        512, 5120, 4096, dict(scales="rowcol", promote=False), "QGMMA"),
    "gluon bf16, 128x192 tiles (128 + 64), TMA stores": (
        512, 6144, 5120, dict(scales="none", promote=False, dtype=torch.bfloat16), "HGMMA"),
    "gluon bf16, 128x256 tiles, TMA stores": (
        4096, 4096, 4096, dict(scales="none", promote=False, dtype=torch.bfloat16), "HGMMA"),
    "gluon fp8 blockscale, 3 K slices into a workspace (34 tiles)": (256, 2112, 7168, dict(scales="kblock"), "QGMMA"),
    "gluon bf16, 64 x 80 tiles (64 + 16), one consumer warp group, TMA stores": (
        512, 1280, 8192, dict(scales="none", promote=False, dtype=torch.bfloat16, tiles=(64, (64, 16))), "HGMMA"),
    "gluon fp8 fast accumulation, 64 x 160 tiles (128 + 32), one consumer warp group": (
        512, 2560, 8192, dict(scales="rowcol", promote=False, tiles=(64, (128, 32))), "QGMMA"),
    "gluon bf16 batched (8 x 512 x 4096 x 2048), TMA stores": (
        512, 4096, 2048, dict(scales="none", promote=False, dtype=torch.bfloat16, batch=8), "HGMMA"),
    "gluon bf16 batched (3 x 300 x 1000 x 1040), TMA stores inside each entry, by pointers past it": (
        300, 1000, 1040, dict(scales="none", promote=False, dtype=torch.bfloat16, batch=3, tiles=(128, (128, 0))),
        "HGMMA"),
    "gluon bf16 batched (3 x 300 x 1000 x 1040), 128 x 256 tiles of a shared output buffer, ragged M": (
        300, 1000, 1040, dict(scales="none", promote=False, dtype=torch.bfloat16, batch=3, tiles=(128, (128, 128))),
        "HGMMA"),
    "gluon bf16 batched (3 x 300 x 1000 x 1040), 64-row tiles, ragged M": (
        300, 1000, 1040, dict(scales="none", promote=False, dtype=torch.bfloat16, batch=3, tiles=(64, (128, 0))),
        "HGMMA"),
    "gluon bf16 batched (3 x 300 x 1024 x 1040), swapped: 128 weight rows x 160 of x's, pointer stores": (
        300, 1024, 1040, dict(scales="none", promote=False, dtype=torch.bfloat16, batch=3, tiles=(128, (128, 32)),
                              swap=True), "HGMMA"),
    "gluon fp16 batched (3 x 777 x 2048 x 1024), swapped, fp32 output": (
        777, 2048, 1024, dict(scales="none", promote=False, dtype=torch.float16, batch=3, tiles=(128, (128, 64)),
                              swap=True, out_dtype=torch.float32), "HGMMA"),
    "gluon bf16 swapped (300 x 1280 x 8192), K slices into a workspace in y's orientation": (
        300, 1280, 8192, dict(scales="none", promote=False, dtype=torch.bfloat16, tiles=(128, (128, 32)), swap=True),
        "HGMMA"),
    "gluon bf16, 64 x 128 tiles in 4 K slices, one consumer warp group": (
        128, 1280, 8192, dict(scales="none", promote=False, dtype=torch.bfloat16, tiles=(64, (128, 0))), "HGMMA"),
    "gluon bf16, 4 K slices into a workspace (32 tiles)": (
        256, 2048, 8192, dict(scales="none", promote=False, dtype=torch.bfloat16), "HGMMA"),
    "gluon fp16, 128x144 tiles (128 + 16), fp32 output by pointers": (
        512, 4608, 4096, dict(scales="none", promote=False, dtype=torch.float16, out_dtype=torch.float32), "HGMMA"),
    "gluon bf16 gated (feed-forward), 128 x (128 + 128) tiles, TMA stores": (
        256, 14336, 4096, dict(scales="none", promote=False, dtype=torch.bfloat16, gated=True), "HGMMA"),
    "gluon fp8 gated, per-channel scales, 128 x (128 + 128) tiles, TMA stores": (
        256, 18944, 3584, dict(scales="rowcol", promote=False, gated=True), "QGMMA"),
    "gluon bf16 grouped (128 experts of 1536 x 2048), expert map, TMA stores inside each expert's rows": (
        32768, 1536, 2048, dict(scales="none", promote=False, dtype=torch.bfloat16, experts=128), "HGMMA"),
    "gluon bf16 grouped gated (256 experts, I = 2048, H = 7168), expert map, TMA stores": (
        32768, 2048, 7168, dict(scales="none", promote=False, dtype=torch.bfloat16, experts=256, gated=True), "HGMMA"),
    "gluon bf16 grouped, gathered rows (cp.async, 4 producer warps), TMA stores": (
        32768, 1536, 2048, dict(scales="none", promote=False, dtype=torch.bfloat16, experts=128, gather=True), "HGMMA"),
    "gluon fp8 grouped, gathered rows, per-token and per-expert-channel scales, TMA stores": (
        16384, 4096, 7168, dict(scales="rowcol", promote=False, experts=256, gather=True), "QGMMA"),
    "gluon bf16 grouped, gathered rows of 776 values (16-byte aligned, not 32), TMA stores": (
        4096, 3488, 776, dict(scales="none", promote=False, dtype=torch.bfloat16, experts=64, gather=True), "HGMMA"),
    "gluon bf16 grouped, gathered, scattered and weighted rows (moe_mlp's down), pointer stores": (
        32768, 2048, 768, dict(scales="none", promote=False, dtype=torch.bfloat16, experts=128, gather=True,
                               scatter=True), "HGMMA"),
    "gluon bf16 grouped, 64-row tiles, gathered rows": (
        6000, 1536, 2048, dict(scales="none", promote=False, dtype=torch.bfloat16, experts=128, gather=True,
                               tiles=(64, (128, 64))), "HGMMA"),
    "gluon bf16 grouped gated, gathered rows (moe_mlp's gate / up), TMA stores": (
        32768, 768, 2048, dict(scales="none", promote=False, dtype=torch.bfloat16, experts=128, gated=True,
                               gather=True), "HGMMA"),
}


def check_ws(name: str, dev: DeviceInfo = H100) -> tuple[bool, Binary, str]:
    """Compile one of WS_CHECKS: (passed, binary, one-line report)."""
    M, N, K, kw, mma = WS_CHECKS[name]
    b = compile_ws(M, N, K, **kw)
    stores = b.count("UTMASTG")
    ok = (b.local_bytes == 0 and b.count(mma) > 0 and b.count("UTMALDG") > 0
          and (stores > 0) == ((kw.get("out_dtype", torch.bfloat16) != torch.float32 or "slices" in name)
                               and "pointer stores" not in name and not kw.get("swap"))
          and b.shared_bytes <= dev.smem_per_block)
    serial = ptxas_serializes_wgmma(b.ptx) if kw.get("swap") else None  # (the transposed stores: C7514 before)
    ok = ok and not serial
    return ok, b, (f"{'ok ' if ok else 'BAD'} {name}: {b.registers} registers, {b.local_bytes} B local, "
                   f"{b.shared_bytes} B shared, {mma} {b.count(mma)}, UTMALDG {b.count('UTMALDG')}, "
                   f"UTMASTG {stores}" + ("" if serial is None else f", CUDA 12 ptxas C7514 {serial}"))


W4_CHECKS = {  # (M, N, K, compile_w4_decode keywords)
    "gluon int4 decode, one row, K slices summed by atomics": (1, 4096, 4096, dict()),
    "gluon int4 decode, two rows, the slices' sums finished by their last program": (2, 8192, 8192, dict()),
    "gluon int4 decode, fp16, per-channel scales, symmetric, bias + silu, one slice": (
        4, 1000, 256, dict(dtype=torch.float16, group=256, zero=False, bias=True, activation="silu")),
    "gluon int4 decode, 8 rows, groups of 256": (8, 8192, 8192, dict(group=256)),
    "gluon int4 decode, 64 rows (the widest x tile: 128-row weight tiles)": (64, 8192, 8192, dict()),
    "gluon mxfp4 decode, 64 rows (the widest x tile: 128-row weight tiles)": (64, 8192, 8192, dict(group=32, mxfp4=True)),
    "gluon mxfp4 decode, two rows": (2, 4096, 4096, dict(group=32, mxfp4=True)),
    "gluon int4 decode, groups of 32 (applied before the product)": (1, 4096, 4096, dict(group=32)),
}


W4_PREFILL_CHECKS = {  # (M, N, K, compile_w4_prefill keywords)
    "gluon int4 prefill, 128-row weight tiles by 256 rows of x": (1024, 8192, 8192, dict()),
    "gluon int4 prefill, 64-row weight tiles (two per SM), K slices": (128, 4096, 4096, dict()),
    "gluon int4 prefill, fp16, groups of 32, bias + silu": (300, 1000, 2048, dict(dtype=torch.float16, group=32,
                                                                                  bias=True, activation="silu")),
    "gluon mxfp4 prefill, 128-row weight tiles": (512, 28672, 4096, dict(group=32, mxfp4=True)),
}


def check_w4_prefill(name: str, dev: DeviceInfo = H100) -> tuple[bool, Binary, str]:
    """Compile one of W4_PREFILL_CHECKS: (passed, binary, one-line report): no local memory, registers and
    shared memory for the tile's programs per SM, HGMMA from registers with one product left in flight,
    TMA loads."""
    from ..core import hopper_w4 as hw

    M, N, K, kw = W4_PREFILL_CHECKS[name]
    b = compile_w4_prefill(M, N, K, **kw)
    _, bn, per_sm = hw.prefill_tile(M, N, dev)
    resident = hw.resident_programs(b.registers, b.shared_bytes, bn // 16)
    in_flight = "WARPGROUP.DEPBAR.LE gsb0, 0x1" in b.sass
    ok = (b.local_bytes == 0 and b.count("HGMMA") > 0 and b.count("UTMALDG") > 0 and in_flight
          and b.shared_bytes <= dev.smem_per_block and resident >= per_sm)
    return ok, b, (f"{'ok ' if ok else 'BAD'} {name}: {b.registers} registers, {b.local_bytes} B local, "
                   f"{b.shared_bytes} B shared, {resident} resident per SM ({per_sm} wanted), "
                   f"HGMMA {b.count('HGMMA')}, one product in flight: {in_flight}")


W4_TILE_CHECKS = {  # (M, N, K, compile_w4_tile keywords)
    "gluon int4 weight tiles, 128 x 256, bf16 out": (1024, 8192, 8192, dict()),
    "gluon int4 weight tiles, K slices, bias, groups of 32, fp16": (512, 2048, 4096, dict(
        dtype=torch.float16, group=32, bias=True)),
    "gluon int4 weight tiles, 64 x 128, per channel, fp32 out": (100, 1000, 512, dict(
        group=512, zero=False, out_dtype=torch.float32, tiles=(64, (128, 0)))),
    "gluon mxfp4 weight tiles, 128 x 256": (768, 5120, 5120, dict(group=32, mxfp4=True)),
}


def check_w4_tile(name: str, dev: DeviceInfo = H100) -> tuple[bool, Binary, str]:
    """Compile one of W4_TILE_CHECKS: (passed, binary, one-line report): no local memory, the shared memory
    fits, HGMMA with one K block's products left in flight, TMA loads, and no wgmma serialized by Triton's
    CUDA 12 ptxas (C7514; the transposed output's scalar stores did that)."""
    M, N, K, kw = W4_TILE_CHECKS[name]
    b = compile_w4_tile(M, N, K, **kw)
    serial = ptxas_serializes_wgmma(b.ptx)
    in_flight = re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x[12]\b", b.sass) is not None
    ok = (b.local_bytes == 0 and b.count("HGMMA") > 0 and b.count("UTMALDG") > 0 and in_flight and not serial
          and b.shared_bytes <= dev.smem_per_block)
    return ok, b, (f"{'ok ' if ok else 'BAD'} {name}: {b.registers} registers, {b.local_bytes} B local, "
                   f"{b.shared_bytes} B shared, HGMMA {b.count('HGMMA')}, products in flight: {in_flight}, "
                   f"CUDA 12 ptxas serializes them: {'not checked' if serial is None else serial}")


def check_w4(name: str, dev: DeviceInfo = H100) -> tuple[bool, Binary, str]:
    """Compile one of W4_CHECKS: (passed, binary, one-line report): no local memory, the
    registers and shared memory fit (the report says how many programs an SM holds against the
    split's per_sm: where fewer, W4DecodePlan launches fewer programs), HGMMA from
    registers, TMA loads of the weight."""
    from ..core import hopper_w4 as hw

    M, N, K, kw = W4_CHECKS[name]
    b = compile_w4_decode(M, N, K, **kw)
    sp = hw.decode_split(M, N, K, dev, kw.get("group", 128), kw.get("mxfp4", False))
    resident = hw.resident_programs(b.registers, b.shared_bytes, sp.bn // 16)
    ok = (b.local_bytes == 0 and b.count("HGMMA") > 0 and b.count("UTMALDG") > 0
          and b.shared_bytes <= dev.smem_per_block and b.registers <= 255 and resident >= 1)
    return ok, b, (f"{'ok ' if ok else 'BAD'} {name}: {b.registers} registers, {b.local_bytes} B local, "
                   f"{b.shared_bytes} B shared, {resident} resident per SM ({sp.per_sm} wanted), "
                   f"HGMMA {b.count('HGMMA')}, UTMALDG {b.count('UTMALDG')}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gemmkit.tools.codegen", description=__doc__.split("\n\n")[0])
    p.add_argument("--warp-specialize", action="store_true",
                   help="also compile each persistent config with WARP_SPECIALIZE and say whether the binary changes")
    p.add_argument("--digest", action="store_true",
                   help="print each Gluon binary's instruction digest (instruction_digest: compare two commits' "
                        "kernels without a GPU)")
    args = p.parse_args(argv)
    from ..core.device import interpreter_active

    if interpreter_active():
        raise SystemExit("the code-generation check compiles for sm_90: unset TRITON_INTERPRET")
    failed = 0
    for name, (M, N, K, cfg, kw, _) in CHECKS.items():
        ok, b, report = check(name)
        failed += not ok
        print(report, flush=True)
        cfg = GemmConfig.from_dict(cfg)
        if args.warp_specialize and cfg.PERSISTENT and "tile_map" not in kw:
            import dataclasses

            ws = compile_gemm(M, N, K, dataclasses.replace(cfg, WARP_SPECIALIZE=True), **kw)
            print(f"    WARP_SPECIALIZE: binary {'identical' if ws.sha1 == b.sha1 else 'different'}", flush=True)
    from ..core.hopper_ws import gluon_kernel

    if gluon_kernel() is None:
        print("BAD this Triton has no usable Gluon: the warp-specialized FP8 kernel cannot be checked", flush=True)
        return 1
    for checks, check_one in ((WS_CHECKS, check_ws), (W4_CHECKS, check_w4), (W4_PREFILL_CHECKS, check_w4_prefill),
                              (W4_TILE_CHECKS, check_w4_tile)):
        for name in checks:
            ok, b, report = check_one(name)
            failed += not ok
            print(report, flush=True)
            if args.digest:
                print(f"    instructions {instruction_digest(b)}", flush=True)
    return 1 if failed else 0


def instruction_digest(b: Binary) -> str:
    """A digest of the binary's SASS instructions, their addresses and the source lines left out ('sha1 count'):
    equal for two commits whose kernels compile to the same code (a refactor, a comment)."""
    lines = [re.sub(r"/\*[0-9a-f]+\*/", "", ln).strip() for ln in b.sass.splitlines()
             if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    return f"{hashlib.sha1(chr(10).join(lines).encode()).hexdigest()[:12]} {len(lines)}"


if __name__ == "__main__":
    sys.exit(main())
