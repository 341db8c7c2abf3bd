"""What the benchmark and the tuner need to know about each op: inputs, the gemmkit call, the
torch baseline it competes with, a float32 reference, FLOPs and bytes, and the config search space.
Adding an op to the tools means adding one `ToolOp` here."""

from __future__ import annotations

import dataclasses

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..core.config import EXACT_MAX_BLOCK_K, PROMOTING_TABLES, TMA_MIN_M, GemmConfig, promotes
from ..core.device import DeviceInfo
from ..core.formats import OperandFormat, Scale, check_block_k, dense, packed4, quantized_in_kernel

# --dtype names of the tools, by torch dtype
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
               torch.float8_e4m3fn: "e4m3", torch.int8: "int8"}
DTYPES = {name: dt for dt, name in DTYPE_NAMES.items()}


@dataclass(frozen=True)
class ToolOp:
    name: str
    dtypes: tuple  # names accepted by --dtype
    make_inputs: Callable  # (M, N, K, dtype_name, device) -> dict of tensors
    run: Callable  # (inputs, config=None) -> output (allocated, as the baseline does)
    baseline: Callable  # (inputs) -> output, the torch op gemmkit competes with
    baseline_name: str
    reference: Callable  # (inputs) -> float32 result to compare run() with
    tolerance: float  # relative (Frobenius) error allowed against the reference
    in_bytes: float  # bytes per element of the op's input (elementwise ops)
    out_bytes: int
    operand_bits: int  # which datasheet peak applies
    table: str | None  # config table the op reads (what `gemmkit tune` writes); None: not tunable
    gemm: bool = True  # (M, N, K) problem; False: an elementwise op over (M, K)
    formats: tuple[OperandFormat, OperandFormat] | None = None  # GEMMs: (A, B) as the kernel reads them
    # (inputs gemmkit reads, inputs the baseline reads) where they differ: the timing rotation
    # must exceed the L2 for each side (None: both read all of make_inputs' tensors)
    reads: tuple | None = None
    # bytes of scales and zero points gemmkit reads beyond its operands, (M, N, K) -> bytes (4-bit weights)
    scale_bytes: Callable | None = None
    # the table's GEMM is a gated one (two B tiles per K step, two accumulators, whole tiles)
    gated: bool = False

    def flops(self, M, N, K) -> float:
        return 2.0 * M * N * K if self.gemm else 0.0

    def nbytes(self, M, N, K) -> float:
        """Bytes gemmkit's call must move at least: its operands read once, the output written."""
        if self.gemm:
            a, b = self.formats
            extra = self.scale_bytes(M, N, K) if self.scale_bytes else 0
            return M * K * a.bytes + N * K * b.bytes + M * N * self.out_bytes + extra
        return M * K * (self.in_bytes + self.out_bytes) + 4 * M

    def table_m(self, M: int) -> int:
        """The M its config table is keyed by (the MoE ops: average rows per expert)."""
        return M

    def rotation_bytes(self, M, N, K) -> float | None:
        """The bytes one call reads, where a call reads less than its input set (the MoE ops: the touched experts'
        weights); None: every input of the set (tune.input_sets sizes the timing's rotation by it)."""
        return None

    def problem_m(self, table_m: int) -> int:
        """An M of this op's problems whose table_m is table_m (the autotune hook's problem)."""
        return table_m


_F = torch.nn.functional


def _rand(shape, device, scale=1.0):
    return torch.randn(*shape, device=device, dtype=torch.float32) * scale


# weights as gemmkit.nn layers store them: rows padded to 32 bytes where K's bytes are not a multiple
# (gemmkit.align_rows); False (gemmkit bench --weights contiguous): as a plain quantizer returns them
ALIGNED_WEIGHTS = True


def _stored(w):
    from ..core.rows import align_rows

    return align_rows(w) if ALIGNED_WEIGHTS else w


# a16w16 --------------------------------------------------------------------------------------

def _a16w16_inputs(M, N, K, dtype, device):
    dt = DTYPES[dtype]
    return {"x": _rand((M, K), device).to(dt), "w": _stored((_rand((N, K), device) / K**0.5).to(dt))}


def _a16w16_run(inp, config=None):
    from ..ops.a16w16 import gemm_a16w16

    return gemm_a16w16(inp["x"], inp["w"], config=config)


@dataclass(frozen=True)
class TrainingToolOp(ToolOp):
    """The GEMMs of a linear layer's training step, as autograd runs them (gemmkit.autograd): the forward
    y = x w^T, dx = dy w and dw = dy^T x, three (M, N, K) problems per call; run / baseline return (y, dx, dw)."""

    def flops(self, M, N, K) -> float:
        return 3 * ToolOp.flops(self, M, N, K)

    def nbytes(self, M, N, K) -> float:
        return 3 * ToolOp.nbytes(self, M, N, K)


def _a16w16_train_inputs(M, N, K, dtype, device):
    return dict(_a16w16_inputs(M, N, K, dtype, device), dy=_rand((M, N), device).to(DTYPES[dtype]))


def _a16w16_train_run(inp, config=None):
    from ..ops.a16w16 import gemm_a16w16

    x, w, dy = inp["x"], inp["w"], inp["dy"]
    return gemm_a16w16(x, w), gemm_a16w16(dy, w.t()), gemm_a16w16(dy.t(), x.t())


def _a16w16_train_baseline(inp):
    x, w, dy = inp["x"], inp["w"], inp["dy"]
    return _F.linear(x, w), dy @ w, dy.t() @ x


def _a16w16_train_reference(inp):
    x, w, dy = inp["x"].float(), inp["w"].float(), inp["dy"].float()
    return x @ w.T, dy @ w, dy.T @ x


# a8w8 ----------------------------------------------------------------------------------------

def _a8w8_inputs(granularity):
    def make(M, N, K, dtype, device):
        from ..quant import quantize_fp8, quantize_int8

        x, w = _rand((M, K), device), _rand((N, K), device)
        if dtype == "int8":
            (xq, xs), (wq, ws) = quantize_int8(x, granularity), quantize_int8(w, granularity)
        else:
            (xq, xs), (wq, ws) = quantize_fp8(x, granularity), quantize_fp8(w, granularity)
        return {"x": xq, "w": _stored(wq), "xs": xs, "ws": ws if granularity == "tensor" else ws.reshape(1, N)}
    return make


def _a8w8_run(inp, config=None, fast_accum=True):
    from ..ops.a8w8 import gemm_a8w8

    return gemm_a8w8(inp["x"], inp["w"], inp["xs"], inp["ws"], config=config, fast_accum=fast_accum)


def _scaled_mm(inp, fast_accum=True):
    return torch._scaled_mm(inp["x"], inp["w"].t(), scale_a=inp["xs"], scale_b=inp["ws"],
                            out_dtype=torch.bfloat16, use_fast_accum=fast_accum)


def _int_mm_scaled(inp):
    return (torch._int_mm(inp["x"], inp["w"].t()) * inp["xs"] * inp["ws"]).to(torch.bfloat16)


def _a8w8_reference(inp):
    return (inp["x"].float() @ inp["w"].float().T) * inp["xs"] * inp["ws"]


# dynamic per-token quantization of bf16 activations ------------------------------------------

def _dynamic_inputs(M, N, K, dtype, device):
    from ..quant import quantize_fp8

    x, w = _rand((M, K), device).to(torch.bfloat16), _rand((N, K), device) / K**0.5
    wq, ws = quantize_fp8(w, "row")
    return {"x": x, "w": _stored(wq), "ws": ws.reshape(1, N), "w16": _stored(w.to(torch.bfloat16))}


def _dynamic_run(inp, config=None):
    """The public call (eagerly: one fused launch for small M; captured: quantizer + GEMM); with a
    config (the tuner), always the fused GEMM that quantizes x itself."""
    from ..ops.a8w8 import fused_dynamic_gemm, gemm_a8w8

    if config is None:
        return gemm_a8w8(inp["x"], inp["w"], None, inp["ws"])
    return fused_dynamic_gemm(inp["x"], inp["w"], inp["ws"], config=config)


def _dynamic_reference(inp):
    """The unquantized x times the FP8 weight: the dynamic op is judged by its error from that
    product (x's per-token FP8 rounding), whichever rows or K slices it quantizes together (with
    split-K, the one-launch GEMM scales each K slice on its own: docs/design.md)."""
    return inp["x"].float() @ inp["w"].float().T * inp["ws"]


# blockscale FP8 (DeepSeek-V3: 1x128 activation, 128x128 weight scales) ---------------------------

def _blockscale_inputs(M, N, K, dtype, device):
    """Block-quantized x (scales column-major, as engines and torch._scaled_mm take them) and w,
    plus the row-wise FP8 and bf16 forms of the same values for the other baselines."""
    from ..quant import quantize_fp8, quantize_fp8_blockwise

    x, w = _rand((M, K), device), _rand((N, K), device) / K**0.5
    xq, xs = quantize_fp8_blockwise(x, (1, 128), scale_layout="col")
    wq, ws = quantize_fp8_blockwise(w, (128, 128))
    (xr, xrs), (wr, wrs) = quantize_fp8(x, "row"), quantize_fp8(w, "row")
    return {"x": xq, "xs": xs, "w": _stored(wq), "ws": ws, "x16": x.to(torch.bfloat16),
            "w16": _stored(w.to(torch.bfloat16)), "xr": xr, "xrs": xrs, "wr": _stored(wr), "wrs": wrs.reshape(1, N)}


def _blockscale_run(inp, config=None):
    from ..ops.a8w8_blockscale import gemm_a8w8_blockscale

    return gemm_a8w8_blockscale(inp["x"], inp["w"], inp["xs"], inp["ws"], config=config)


def _blockscale_torch(inp):
    """torch's own block-wise FP8 GEMM (cuBLASLt): scale_a column-major (M, K/128), scale_b the
    (K/128, N/128) transposed view of the weight scales."""
    return torch._scaled_mm(inp["x"], inp["w"].t(), scale_a=inp["xs"], scale_b=inp["ws"].t(),
                            out_dtype=torch.bfloat16)


def _blockscale_reference(inp):
    from ..quant import dequantize_fp8_blockwise

    return dequantize_fp8_blockwise(inp["x"], inp["xs"]) @ dequantize_fp8_blockwise(inp["w"], inp["ws"], (128, 128)).T


def _blockscale_dynamic_inputs(M, N, K, dtype, device):
    """bf16 x (what the dynamic op quantizes per 1x128 group) and its block-quantized form (the
    static op's input, the baseline), the block-quantized weight."""
    from ..quant import quantize_fp8_blockwise

    x, w = _rand((M, K), device).to(torch.bfloat16), _rand((N, K), device) / K**0.5
    xq, xs = quantize_fp8_blockwise(x, (1, 128), scale_layout="col")
    wq, ws = quantize_fp8_blockwise(w, (128, 128))
    return {"x16": x, "x": xq, "xs": xs, "w": _stored(wq), "ws": ws}


def _blockscale_dynamic_run(inp, config=None):
    """The public call on bf16 x (eagerly: in-kernel quantization for small M; captured: quantizer
    + GEMM); with a config (the tuner), always the GEMM that quantizes x itself."""
    from ..ops.a8w8_blockscale import _dynamic_path, gemm_a8w8_blockscale

    if config is None:
        return gemm_a8w8_blockscale(inp["x16"], inp["w"], None, inp["ws"])
    return _dynamic_path(inp["x16"], inp["w"], inp["ws"], "fused", config=config)


def _blockscale_fused_run(inp, config=None):
    from ..ops.a8w8_blockscale import _dynamic_path

    return _dynamic_path(inp["x16"], inp["w"], inp["ws"], "fused", config=config)


def _blockscale_dynamic_op(name, run, baseline_name):
    """Dynamic blockscale against the static op on the pre-quantized x: the ratio is the cost of
    quantizing x in the call (dynamic / static)."""
    return ToolOp(name, ("e4m3",), _blockscale_dynamic_inputs, run, _blockscale_run, baseline_name,
                  _blockscale_reference, 1e-2, 1, 2, 8, "a8w8_blockscale_dynamic",
                  formats=(quantized_in_kernel(torch.bfloat16, torch.float8_e4m3fn, "group", 128),
                           dense(torch.float8_e4m3fn, Scale.KBLOCK, 128, 128)),
                  reads=(("x16", "w", "ws"), ("x", "xs", "w", "ws")))


def _blockscale_op(name, baseline, baseline_name, reads):
    return ToolOp(name, ("e4m3",), _blockscale_inputs, _blockscale_run, baseline, baseline_name,
                  _blockscale_reference, 1e-2, 1, 2, 8, "a8w8_blockscale",
                  formats=(dense(torch.float8_e4m3fn, Scale.KBLOCK, 128),
                           dense(torch.float8_e4m3fn, Scale.KBLOCK, 128, 128)),
                  reads=(("x", "xs", "w", "ws"), reads),
                  # (float32 scales: x's one per row and 128 K, w's one per 128 x 128 block)
                  scale_bytes=lambda M, N, K: 4 * (M * -(-K // 128) + -(-N // 128) * -(-K // 128)))


# quantizer -----------------------------------------------------------------------------------

def _quant_inputs(M, N, K, dtype, device):
    return {"x": _rand((M, K), device, 2.0).to(torch.bfloat16)}


def _quant_run(inp, config=None):
    from ..quant import dequantize, quantize_fp8

    return _Quantized(*quantize_fp8(inp["x"], "row"), dequantize)


def _quant_torch(inp):
    from ..quant import dequantize

    x = inp["x"].float()
    s = x.abs().amax(dim=1, keepdim=True) / 448.0
    return _Quantized((x / s).clamp(-448, 448).to(torch.float8_e4m3fn), s, dequantize)


class _Quantized:
    """Result of the quantizer, compared with the input through dequantization."""

    def __init__(self, q, s, dequantize):
        self.q, self.s, self.dequantize = q, s, dequantize

    def float(self):
        return self.dequantize(self.q, self.s)


# 4-bit weights (INT4 groups of 128, MXFP4) ------------------------------------------------------

INT4_GROUP = 128


def _a16w4_inputs(M, N, K, dtype, device):
    """x, the INT4 weight (asymmetric, groups of 128) and its bf16 dequantization (the F.linear
    baseline), plus tinygemm's packing of the same values where this torch build has it."""
    from ..quant import dequantize_int4, quantize_int4

    dt, g = DTYPES[dtype], _int4_group(K)
    x, w = _rand((M, K), device).to(dt), (_rand((N, K), device) / K**0.5).to(dt)
    wq, ws, wz = quantize_int4(w, g)
    return {"x": x, "wq": wq, "ws": ws, "wz": wz, "w16": dequantize_int4(wq, ws, wz, g, dt)}


def _int4_group(K):
    """128, or the largest of 64, 32 dividing a K that 128 does not."""
    return next(g for g in (INT4_GROUP, 64, 32) if K % g == 0 or g == 32)


def _tinygemm_inputs(M, N, K, dtype, device):
    """_a16w4_inputs plus tinygemm's form of the same weight: torch._convert_weight_to_int4pack
    of uint8 (N, K/2) with element 2j in the HIGH nibble (torch's order), and scales_and_zeros
    (K/group, N, 2) bf16 with w = (q - 8) * s + zero, zero = (8 - z) * s. CUDA only: elsewhere the
    baseline fails (bench reports it and goes on)."""
    inp = _a16w4_inputs(M, N, K, dtype, device)
    wq, ws, wz = inp["wq"], inp["ws"], inp["wz"]
    swapped = ((wq & 15) << 4) | (wq >> 4)
    try:
        inp["w_tiny"] = torch._convert_weight_to_int4pack(swapped, 8)
    except (RuntimeError, NotImplementedError):
        inp["w_tiny"] = None
    zero = (8.0 - wz.float()) * ws.float()
    inp["sz"] = torch.stack((ws.float().T, zero.T), dim=-1).to(torch.bfloat16).contiguous()
    return inp


def _a16w4_run(inp, config=None):
    from ..ops.a16w4 import gemm_a16w4

    return gemm_a16w4(inp["x"], inp["wq"], inp["ws"], inp["wz"], group_size=_int4_group(inp["x"].shape[1]),
                      config=config)


def _tinygemm(inp):
    if inp["w_tiny"] is None:
        raise RuntimeError("torch._convert_weight_to_int4pack is not available on this device")
    return torch._weight_int4pack_mm(inp["x"], inp["w_tiny"], _int4_group(inp["x"].shape[1]), inp["sz"])


def _a16w4_dequant_linear(inp):
    from ..quant import dequantize_int4

    g = _int4_group(inp["x"].shape[1])
    return _F.linear(inp["x"], dequantize_int4(inp["wq"], inp["ws"], inp["wz"], g, inp["x"].dtype))


def _int4_scale_bytes(M, N, K):
    return N * (K // _int4_group(K)) * (2 + 1)  # 16-bit scales, uint8 zero points


def _a16w4_op(name, dtypes, make_inputs, baseline, baseline_name, reads):
    return ToolOp(name, dtypes, make_inputs, _a16w4_run, baseline, baseline_name,
                  lambda i: i["x"].float() @ i["w16"].float().T, 1e-2, 2, 2, 16, "a16w4",
                  formats=(dense(torch.bfloat16), packed4(torch.bfloat16, Scale.GROUP, INT4_GROUP)),
                  reads=(("x", "wq", "ws", "wz"), reads), scale_bytes=_int4_scale_bytes)


@dataclass(frozen=True)
class FrozenTrainingToolOp(ToolOp):
    """The GEMMs of a frozen quantized layer's training step (adapters trained around it: gemmkit.autograd), the
    forward y = x w^T and dx = dy w, two (M, N, K) problems per call, both through autograd; run / baseline return
    (y, dx)."""

    def flops(self, M, N, K) -> float:
        return 2 * ToolOp.flops(self, M, N, K)

    def nbytes(self, M, N, K) -> float:
        return 2 * ToolOp.nbytes(self, M, N, K)


def _frozen_step(forward, x, dy):
    """(y, dx) of y = forward(x) through autograd (x a fresh leaf: what a training step runs)."""
    x = x.detach().requires_grad_()
    y = forward(x)
    return y.detach(), torch.autograd.grad(y, x, dy)[0]


def _a16w4_qlora_inputs(M, N, K, dtype, device):
    return dict(_a16w4_inputs(M, N, K, dtype, device), dy=_rand((M, N), device).to(DTYPES[dtype]))


def _a16w4_qlora_run(inp, config=None):
    from ..ops.a16w4 import gemm_a16w4

    g = _int4_group(inp["x"].shape[1])
    return _frozen_step(lambda x: gemm_a16w4(x, inp["wq"], inp["ws"], inp["wz"], group_size=g), inp["x"], inp["dy"])


def _a16w4_qlora_baseline(inp):
    return _frozen_step(lambda x: _F.linear(x, inp["w16"]), inp["x"], inp["dy"])


def _a16w4_qlora_reference(inp):
    x, w, dy = inp["x"].float(), inp["w16"].float(), inp["dy"].float()
    return x @ w.T, dy @ w


def _a16wfp4_inputs(M, N, K, dtype, device):
    from ..quant import dequantize_mxfp4, quantize_mxfp4

    dt = DTYPES[dtype]
    x, w = _rand((M, K), device).to(dt), _rand((N, K), device) / K**0.5
    wq, ws = quantize_mxfp4(w)
    return {"x": x, "wq": wq, "ws": ws, "w16": dequantize_mxfp4(wq, ws, dt)}


def _a16wfp4_run(inp, config=None):
    from ..ops.fp4 import gemm_a16wfp4

    return gemm_a16wfp4(inp["x"], inp["wq"], inp["ws"], config=config)


def _afp4wfp4_inputs(M, N, K, dtype, device):
    from ..quant import dequantize_mxfp4, quantize_mxfp4

    inp = _a16wfp4_inputs(M, N, K, dtype, device)
    inp["xq"], inp["xs"] = quantize_mxfp4(inp["x"])
    inp["x16"] = dequantize_mxfp4(inp["xq"], inp["xs"], torch.bfloat16)
    return inp


def _afp4wfp4_run(inp, config=None):
    from ..ops.fp4 import gemm_afp4wfp4

    return gemm_afp4wfp4(inp["xq"], inp["wq"], inp["xs"], inp["ws"], config=config)


_MX4 = packed4(torch.bfloat16, Scale.MX, 32)

_FP8_ROW = (dense(torch.float8_e4m3fn, Scale.ROW), dense(torch.float8_e4m3fn, Scale.ROW))

OPS = {
    "a16w16": ToolOp(
        "a16w16", ("bf16", "fp16"), _a16w16_inputs, _a16w16_run, lambda i: _F.linear(i["x"], i["w"]),
        "F.linear (cuBLAS)", lambda i: i["x"].float() @ i["w"].float().T, 1e-2, 2, 2, 16, "a16w16",
        formats=(dense(torch.bfloat16), dense(torch.bfloat16))),
    "a16w16_train": TrainingToolOp(
        "a16w16_train", ("bf16", "fp16"), _a16w16_train_inputs, _a16w16_train_run, _a16w16_train_baseline,
        "F.linear, dy @ w, dy.T @ x (cuBLAS: what autograd runs for F.linear)", _a16w16_train_reference, 1e-2, 2, 2, 16, None,
        formats=(dense(torch.bfloat16), dense(torch.bfloat16))),
    "a8w8": ToolOp(
        "a8w8", ("e4m3",), _a8w8_inputs("row"), _a8w8_run, _scaled_mm,
        "torch._scaled_mm row-wise (cuBLASLt/CUTLASS, use_fast_accum=True)", _a8w8_reference, 1e-2, 1, 2, 8,
        "a8w8_fp8", formats=_FP8_ROW),
    "a8w8_default_accum": ToolOp(
        "a8w8_default_accum", ("e4m3",), _a8w8_inputs("row"), lambda i, config=None: _a8w8_run(i, config, False),
        lambda i: _scaled_mm(i, False), "torch._scaled_mm row-wise with its default use_fast_accum=False (gemmkit "
        "with fast_accum=False: the same fp32 promotion per K tile)", _a8w8_reference, 1e-2, 1, 2, 8,
        "a8w8_fp8_exact", formats=_FP8_ROW),
    "a8w8_tensor": ToolOp(
        "a8w8_tensor", ("e4m3",), _a8w8_inputs("tensor"), _a8w8_run, _scaled_mm,
        "torch._scaled_mm tensor-wise (cuBLASLt, use_fast_accum=True)", _a8w8_reference, 1e-2, 1, 2, 8, "a8w8_fp8",
        formats=(dense(torch.float8_e4m3fn, Scale.TENSOR), dense(torch.float8_e4m3fn, Scale.TENSOR))),
    "a8w8_int8": ToolOp(
        "a8w8_int8", ("int8",), _a8w8_inputs("row"), _a8w8_run, _int_mm_scaled,
        "torch._int_mm + scaling in torch", _a8w8_reference, 1e-2, 1, 2, 8, "a8w8_int8",
        formats=(dense(torch.int8, Scale.ROW), dense(torch.int8, Scale.ROW))),
    "a8w8_dynamic": ToolOp(
        "a8w8_dynamic", ("e4m3",), _dynamic_inputs, _dynamic_run, lambda i: _F.linear(i["x"], i["w16"]),
        "F.linear bf16 (cuBLAS) on the unquantized weight", _dynamic_reference, 4e-2, 1, 2, 8, "a8w8_fp8_dynamic",
        formats=(quantized_in_kernel(torch.bfloat16, torch.float8_e4m3fn, "row"), dense(torch.float8_e4m3fn, Scale.ROW)),
        reads=(("x", "w", "ws"), ("x", "w16"))),
    "a8w8_blockscale": _blockscale_op("a8w8_blockscale", _blockscale_torch,
                                      "torch._scaled_mm block-wise (cuBLASLt, 1x128 / 128x128 scales)",
                                      ("x", "xs", "w", "ws")),
    "a8w8_blockscale_vs_rowwise": _blockscale_op(
        "a8w8_blockscale_vs_rowwise", lambda i: _scaled_mm(dict(x=i["xr"], w=i["wr"], xs=i["xrs"], ws=i["wrs"])),
        "torch._scaled_mm row-wise FP8 (cuBLASLt, use_fast_accum=True) on the same values", ("xr", "xrs", "wr", "wrs")),
    "a8w8_blockscale_vs_bf16": _blockscale_op(
        "a8w8_blockscale_vs_bf16", lambda i: _F.linear(i["x16"], i["w16"]), "F.linear bf16 (cuBLAS) on the same values",
        ("x16", "w16")),
    "a8w8_blockscale_dynamic": _blockscale_dynamic_op(
        "a8w8_blockscale_dynamic", _blockscale_dynamic_run,
        "gemmkit's static gemm_a8w8_blockscale on x quantized beforehand (the dynamic op's own GEMM)"),
    "a8w8_blockscale_dynamic_fused": _blockscale_dynamic_op(
        "a8w8_blockscale_dynamic_fused", _blockscale_fused_run,
        "gemmkit's static gemm_a8w8_blockscale on x quantized beforehand (x quantized inside the GEMM, always)"),
    "a16w4": _a16w4_op("a16w4", ("bf16", "fp16"), _a16w4_inputs, lambda i: _F.linear(i["x"], i["w16"]),
                       "F.linear bf16 (cuBLAS) on the dequantized weight", ("x", "w16")),
    "a16w4_tinygemm": _a16w4_op("a16w4_tinygemm", ("bf16",), _tinygemm_inputs, _tinygemm,
                                "torch._weight_int4pack_mm (tinygemm, group 128) on the same values",
                                ("x", "w_tiny", "sz")),
    "a16w4_dequant": _a16w4_op("a16w4_dequant", ("bf16", "fp16"), _a16w4_inputs, _a16w4_dequant_linear,
                               "dequantize_int4 then F.linear (cuBLAS)", ("x", "wq", "ws", "wz")),
    "a16w4_qlora": FrozenTrainingToolOp(
        "a16w4_qlora", ("bf16", "fp16"), _a16w4_qlora_inputs, _a16w4_qlora_run, _a16w4_qlora_baseline,
        "F.linear and its dx (cuBLAS, autograd) on the bf16 weight", _a16w4_qlora_reference, 1e-2, 2, 2, 16, None,
        formats=(dense(torch.bfloat16), packed4(torch.bfloat16, Scale.GROUP, INT4_GROUP)),
        reads=(("x", "wq", "ws", "wz", "dy"), ("x", "w16", "dy")), scale_bytes=_int4_scale_bytes),
    "a16wfp4": ToolOp(
        "a16wfp4", ("bf16", "fp16"), _a16wfp4_inputs, _a16wfp4_run, lambda i: _F.linear(i["x"], i["w16"]),
        "F.linear bf16 (cuBLAS) on the dequantized weight", lambda i: i["x"].float() @ i["w16"].float().T, 1e-2,
        2, 2, 16, "a16wfp4", formats=(dense(torch.bfloat16), _MX4),
        reads=(("x", "wq", "ws"), ("x", "w16")), scale_bytes=lambda M, N, K: N * (K // 32)),
    "afp4wfp4": ToolOp(
        "afp4wfp4", ("bf16",), _afp4wfp4_inputs, _afp4wfp4_run, lambda i: _F.linear(i["x16"], i["w16"]),
        "F.linear bf16 (cuBLAS) on the dequantized operands", lambda i: i["x16"].float() @ i["w16"].float().T,
        1e-2, 0.5, 2, 16, "afp4wfp4", formats=(_MX4, _MX4), reads=(("xq", "xs", "wq", "ws"), ("x16", "w16")),
        scale_bytes=lambda M, N, K: (M + N) * (K // 32)),
    "quant_fp8_row": ToolOp(
        "quant_fp8_row", ("bf16",), _quant_inputs, _quant_run, _quant_torch,
        "torch eager: absmax, divide, clamp, cast", lambda i: i["x"].float(), 0.08, 2, 1, 16, None, gemm=False),
}


# fused feed-forward and fused-epilogue GEMMs (issue 14) -----------------------------------------
# ff_gated / ff_gated_fp8 take (M, N, K) = (tokens, intermediate size I, hidden size H): the
# block's weights are gate/up (2I, H) and down (H, I); models.json's "<model>-mlp" entries list
# (I, H). FLOPs: 2 M (2 I H + I H).


@dataclass(frozen=True)
class FeedForwardToolOp(ToolOp):
    """A gated MLP block: three (I, H) weight matrices, (M, H) in and out. Its table is the gated
    GEMM's (the down GEMM reads the dense tables)."""

    gated: bool = True

    def flops(self, M, N, K) -> float:
        return 2.0 * M * 3 * N * K

    def nbytes(self, M, N, K) -> float:
        """x read once, the three weights, the output written (the (M, I) intermediate is not counted: a single
        fused pass need not write it; the two-launch form writes and reads it)."""
        a, b = self.formats
        return M * K * a.bytes + 3 * N * K * b.bytes + M * K * self.out_bytes


def _ff_inputs(M, N, K, dtype, device):
    dt = DTYPES[dtype]
    return {"x": _rand((M, K), device).to(dt), "w_gate_up": (_rand((2 * N, K), device) / K**0.5).to(dt),
            "w_down": (_rand((K, N), device) / N**0.5).to(dt)}


def _ff_run(inp, config=None):
    from ..ops.fused import ff_a16w16_gated

    return ff_a16w16_gated(inp["x"], inp["w_gate_up"], inp["w_down"], config=config)


def _ff_torch(inp):
    gate, up = _F.linear(inp["x"], inp["w_gate_up"]).chunk(2, dim=-1)
    return _F.linear(_F.silu(gate) * up, inp["w_down"])


def _ff_reference(inp, wgu="w_gate_up", wd="w_down"):
    gate, up = (inp["x"].float() @ inp[wgu].float().T).chunk(2, dim=-1)
    return (_F.silu(gate) * up) @ inp[wd].float().T


def _ff_fp8_inputs(M, N, K, dtype, device):
    from ..quant import quantize_fp8

    x, wgu, wd = _rand((M, K), device).to(torch.bfloat16), _rand((2 * N, K), device) / K**0.5, _rand((K, N), device) / N**0.5
    (wq, ws), (dq, ds) = quantize_fp8(wgu, "row"), quantize_fp8(wd, "row")
    return {"x": x, "w_gate_up": wq, "ws": ws.reshape(-1), "w_down": dq, "ds": ds.reshape(-1)}


def _ff_fp8_run(inp, config=None):
    from ..ops.fused import ff_a8w8_gated

    return ff_a8w8_gated(inp["x"], inp["w_gate_up"], inp["ws"], inp["w_down"], inp["ds"], config=config)


def _torch_quantize_rows(t):
    a = t.float()
    s = a.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 448.0
    return (a / s).clamp(-448, 448).to(torch.float8_e4m3fn), s


def _ff_fp8_torch(inp):
    """The unfused FP8 block: quantize, _scaled_mm, silu * mul, quantize, _scaled_mm."""
    xq, xs = _torch_quantize_rows(inp["x"])
    h = torch._scaled_mm(xq, inp["w_gate_up"].t(), scale_a=xs, scale_b=inp["ws"].reshape(1, -1),
                         out_dtype=torch.bfloat16, use_fast_accum=True)
    gate, up = h.chunk(2, dim=-1)
    hq, hs = _torch_quantize_rows(_F.silu(gate) * up)
    return torch._scaled_mm(hq, inp["w_down"].t(), scale_a=hs, scale_b=inp["ds"].reshape(1, -1),
                            out_dtype=torch.bfloat16, use_fast_accum=True)


def _ff_fp8_reference(inp):
    x = inp["x"].float()
    gate, up = (x @ (inp["w_gate_up"].float() * inp["ws"][:, None]).T).chunk(2, dim=-1)
    return (_F.silu(gate) * up) @ (inp["w_down"].float() * inp["ds"][:, None]).T


def _mul_add_inputs(M, N, K, dtype, device):
    inp = _a16w16_inputs(M, N, K, dtype, device)
    return dict(inp, a=torch.rand(M, 1, device=device) + 0.5, b=_rand((M, N), device).to(DTYPES[dtype]))


def _mul_add_run(inp, config=None):
    from ..ops.fused import fused_gemm_a16w16_mul_add

    return fused_gemm_a16w16_mul_add(inp["x"], inp["w"], inp["a"], inp["b"], config=config)


# split_cat: (M, N, K) with N = heads * (d1 + d2); MLA kv_b_proj (DeepSeek-V3: d1 = qk_nope 128,
# d2 = v 128, d3 = rope 64), heads = N // 256
_SPLIT = (128, 128, 64)


def _split_cat_inputs(M, N, K, dtype, device):
    d1, d2, d3 = _SPLIT
    heads = max(1, N // (d1 + d2))
    inp = _a16w16_inputs(M, heads * (d1 + d2), K, dtype, device)
    return dict(inp, y=_rand((M, heads, d3), device).to(DTYPES[dtype]))


def _split_cat_run(inp, config=None):
    from ..ops.fused import fused_gemm_a16w16_split_cat

    heads = inp["y"].shape[1]
    return _Pair(*fused_gemm_a16w16_split_cat(inp["x"], inp["w"], inp["y"], heads, *_SPLIT[:2], config=config))


def _split_cat_torch(inp):
    heads = inp["y"].shape[1]
    p = _F.linear(inp["x"], inp["w"]).view(inp["x"].shape[0], heads, -1)
    a, b = p.split(list(_SPLIT[:2]), dim=-1)
    return _Pair(torch.cat([a, inp["y"]], dim=-1), b.contiguous())


def _split_cat_reference(inp):
    heads = inp["y"].shape[1]
    p = (inp["x"].float() @ inp["w"].float().T).view(inp["x"].shape[0], heads, -1)
    a, b = p.split(list(_SPLIT[:2]), dim=-1)
    return torch.cat([torch.cat([a, inp["y"].float()], dim=-1).flatten(), b.flatten()])


class _Pair:
    """Two outputs, compared with the reference flattened into one vector."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def float(self):
        return torch.cat([self.a.float().flatten(), self.b.float().flatten()])


_BF16 = dense(torch.bfloat16)
_FUSED_OPS = {
    "ff_gated": FeedForwardToolOp(
        "ff_gated", ("bf16", "fp16"), _ff_inputs, _ff_run, _ff_torch,
        "F.linear to 2I, chunk, silu(g) * u, F.linear (cuBLAS + torch eager)", _ff_reference, 2e-2, 2, 2, 16,
        "ff_gated_a16w16",
        formats=(_BF16, _BF16)),
    "ff_gated_fp8": FeedForwardToolOp(
        "ff_gated_fp8", ("e4m3",), _ff_fp8_inputs, _ff_fp8_run, _ff_fp8_torch,
        "torch eager per-token quantize, _scaled_mm row-wise, silu * mul, quantize, _scaled_mm", _ff_fp8_reference,
        8e-2, 1, 2, 8, "ff_gated_a8w8",
        formats=(quantized_in_kernel(torch.bfloat16, torch.float8_e4m3fn, "row"), dense(torch.float8_e4m3fn, Scale.ROW))),
    "mul_add": ToolOp(
        "mul_add", ("bf16", "fp16"), _mul_add_inputs, _mul_add_run,
        lambda i: _F.linear(i["x"], i["w"]) * i["a"] + i["b"], "F.linear (cuBLAS), then * a + b in torch eager",
        lambda i: (i["x"].float() @ i["w"].float().T) * i["a"] + i["b"].float(), 1e-2, 2, 2, 16, None,
        formats=(_BF16, _BF16)),
    "split_cat": ToolOp(
        "split_cat", ("bf16", "fp16"), _split_cat_inputs, _split_cat_run, _split_cat_torch,
        "F.linear, view, split, torch.cat (and .contiguous() of the second part)", _split_cat_reference, 1e-2, 2, 2,
        16, None, formats=(_BF16, _BF16)),
}
OPS.update(_FUSED_OPS)

# MoE / batched family (issue 13): gemmkit.tools.moe_ops; variants `<op>@<spec>` (get_op)
from .moe_ops import OPS as _MOE_OPS  # noqa: E402

OPS.update(_MOE_OPS)


def op_dtype(op: ToolOp, requested: str | None) -> str:
    """The --dtype to use: the requested one if the op has it (else SystemExit), or its first."""
    dtype = requested or op.dtypes[0]
    if dtype not in op.dtypes:
        raise SystemExit(f"--dtype for {op.name}: one of {op.dtypes}")
    return dtype


def get_op(name: str) -> ToolOp:
    base, _, spec = name.partition("@")
    if spec and base in OPS and hasattr(OPS[base], "variant"):  # e.g. grouped_a16w16@mixtral-8x7b-moe:zipf
        return OPS[base].variant(spec)
    if name not in OPS:
        raise SystemExit(f"unknown op {name!r}; known: {', '.join(OPS)}")
    return OPS[name]


def table_op(table: str) -> ToolOp:
    """The op that tunes a config table: the first in OPS that reads it (a8w8_fp8: a8w8)."""
    for op in OPS.values():
        if op.table == table:
            return op
    raise ValueError(f"no tool op reads the config table {table!r}; tables: "
                     f"{', '.join(dict.fromkeys(op.table for op in OPS.values() if op.table))}")


# ---------------------------------------------------------------------------------------------
# model shapes

MODELS_FILE = Path(__file__).resolve().parent / "models.json"


def load_models() -> dict:
    with open(MODELS_FILE) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def model_shapes(names) -> list[tuple[str, int, int]]:
    """[(label, N, K)] for the named models, in file order, without repeating an (N, K)."""
    models = load_models()
    out, seen = [], set()
    for name in names:
        if name not in models:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join(models)}")
        for layer, (N, K) in models[name]["layers"].items():
            if (N, K) not in seen:
                seen.add((N, K))
                out.append((f"{name}.{layer}", N, K))
    return out


def linear_shapes(model: torch.nn.Module, label: str = "model") -> list[tuple[str, int, int]]:
    """[(label.layer, N, K)]: the (out_features, in_features) of the model's nn.Linear layers, in
    module order, without repeating an (N, K)."""
    out, seen = [], set()
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and (mod.out_features, mod.in_features) not in seen:
            seen.add((mod.out_features, mod.in_features))
            out.append((f"{label}.{name}", mod.out_features, mod.in_features))
    return out


def import_model_shapes(spec: str) -> list[tuple[str, int, int]]:
    """linear_shapes of "MODULE:ATTR": an nn.Module, or a zero-argument callable (a class, a
    factory) returning one, which is called on the meta device (no weights are allocated)."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"--from-model takes MODULE:ATTR (e.g. mypkg.models:build), got {spec!r}")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"--from-model {spec}: {type(e).__name__}: {e}") from None
    if not isinstance(obj, torch.nn.Module):
        if not callable(obj):
            raise SystemExit(f"--from-model {spec}: a {type(obj).__name__}, not an nn.Module or a callable")
        try:
            with torch.device("meta"):
                obj = obj()
        except Exception as e:  # noqa: BLE001 - the user's factory
            raise SystemExit(f"--from-model {spec}: calling it failed: {type(e).__name__}: {e}") from None
        if not isinstance(obj, torch.nn.Module):
            raise SystemExit(f"--from-model {spec}: returned a {type(obj).__name__}, not an nn.Module")
    shapes = linear_shapes(obj, spec)
    if not shapes:
        raise SystemExit(f"--from-model {spec}: the model has no nn.Linear layers")
    return shapes


# ---------------------------------------------------------------------------------------------
# tuning search space


def search_space(op: ToolOp, M: int, N: int, K: int, dev: DeviceInfo) -> list[GemmConfig]:
    """Candidate configs for one problem: a pruned grid by M regime, filtered by shared memory.

    Small M streams the weights: thin BLOCK_M, long BLOCK_K, deep pipelines, split-K when the
    tiles leave SMs idle; pointer loads (no per-call descriptor cost). Larger M is compute-bound:
    TMA, wide tiles, persistent schedules, stream-K where the tiles do not fill whole waves,
    warp specialization, epilogue subtiling.
    """
    a_fmt, b_fmt = op.formats
    if op.gated:  # two B tiles per K step (shared memory as for one of twice the width)
        b_fmt = dataclasses.replace(b_fmt, bits=2 * b_fmt.bits)
    # on sm_90 Triton (3.6 to 3.9) compiles WARP_SPECIALIZE to the binary of its plain persistent
    # twin (README, Architecture; `python -m gemmkit.tools.codegen --warp-specialize`): not enumerated
    warp_specialize = dev.capability != (9, 0)
    promoting = promotes(a_fmt, b_fmt, op.table)
    dot_bytes = max(a_fmt.dot_bits, b_fmt.dot_bits) // 8
    elem_k = 128 // dot_bytes  # BLOCK_K of one 128-byte line
    cands = []

    def add(bm, bn, bk, warps, stages, split=1, group_m=8, **flags):
        tiles = -(-M // bm) * -(-N // bn)
        if op.gated and (split > 1 or flags.get("STREAM_K") or bm * bn > 128 * 128):
            return  # whole tiles (the activation needs the full sums), two accumulators in registers
        if split > 1 and (tiles * split > 4 * dev.num_sms or -(-K // bk) < 4 * split):
            return
        if op.table in PROMOTING_TABLES and bk > EXACT_MAX_BLOCK_K:  # promoted at least every 128 of K
            return
        if flags.get("STREAM_K"):
            if tiles % dev.num_sms == 0:  # whole waves: the same schedule as plain persistent
                return
        elif flags.get("PERSISTENT") and tiles <= dev.num_sms // 2:
            return
        cfg = GemmConfig(bm, bn, bk, group_m, split, warps, stages, **flags)
        if cfg.fits(dev, a_fmt, b_fmt, op.out_bytes) and check_block_k(bk, a_fmt, b_fmt) is None:
            cands.append(cfg)

    if M < TMA_MIN_M:  # weight streaming: pointer loads, thin tiles, deep pipelines, split-K
        bm = 16 if M <= 16 else (32 if M <= 32 else 64)
        for bn in (16, 32, 64, 128) if bm == 16 else (32, 64, 128):
            steps = (((elem_k // 2, (4, 6)), (elem_k, (3, 4, 6))) if promoting  # K steps within a scale block
                     else ((elem_k, (4, 6)), (2 * elem_k, (3, 4, 6)), (4 * elem_k, (3, 4))))
            for bk, stage_opts in steps:
                if bm == 16 and bk == elem_k and not promoting:
                    continue
                for stages in stage_opts:
                    for split in (1, 2, 4):
                        add(bm, bn, bk, 4, stages, split)
    else:  # compute-bound: TMA, wide tiles, persistent, warp specialization, epilogue subtiling
        if M <= 512:
            tiles = [(64, 128, elem_k, 4, 4), (64, 128, elem_k, 4, 5), (128, 64, elem_k, 4, 4), (64, 64, 2 * elem_k, 4, 4),
                     (128, 128, elem_k, 4, 4), (128, 128, elem_k, 8, 4), (64, 256, elem_k, 8, 3), (128, 256, elem_k, 8, 3),
                     (256, 128, elem_k, 8, 3), (256, 64, elem_k, 8, 4),
                     # deeper pipelines that fit only without the TMA-store epilogue: split-K candidates
                     (256, 128, elem_k, 8, 4), (128, 256, elem_k, 8, 4)]
        else:
            tiles = [(128, 256, elem_k, 8, 3), (256, 128, elem_k, 8, 3), (128, 256, elem_k, 8, 4), (128, 128, elem_k, 8, 4),
                     (128, 128, elem_k, 8, 5), (128, 128, 2 * elem_k, 8, 3), (128, 128, 2 * elem_k, 4, 3),
                     # two-line K steps, two stages (with the split epilogue): half the loop's barriers per FLOP
                     (128, 256, 2 * elem_k, 8, 2)]
            if dot_bytes == 1:  # 8-bit: half-line K steps, more stages in flight (256-wide tiles)
                tiles += [(128, 256, elem_k // 2, 8, 4), (128, 256, elem_k // 2, 8, 5), (256, 128, elem_k // 2, 8, 4)]
        if promoting:  # small 4-warp tiles, two or three programs per SM (core.config.derive_config)
            tiles += [(64, 128, elem_k, 4, s) for s in (2, 3, 4)] + [(128, 64, elem_k, 4, s) for s in (2, 3, 4)]
            tiles += [(64, 64, elem_k, 4, 4), (128, 128, elem_k, 4, 2), (128, 128, elem_k, 8, 3)]
            tiles = list(dict.fromkeys(tiles))
        for bm, bn, bk, warps, stages in tiles:
            add(bm, bn, bk, warps, stages, 1, TMA=True)
            add(bm, bn, bk, warps, stages, 1, TMA=True, PERSISTENT=True)
            if warp_specialize:
                add(bm, bn, bk, warps, stages, 1, TMA=True, PERSISTENT=True, WARP_SPECIALIZE=True)
            if bn >= 128:
                add(bm, bn, bk, warps, stages, 1, TMA=True, PERSISTENT=True, EPILOGUE_SUBTILE=True)
            # stream-K: the ragged last wave's tiles in K slices (wide tiles, few waves)
            if bm * bn >= 128 * 128:
                add(bm, bn, bk, warps, stages, 1, TMA=True, PERSISTENT=True, STREAM_K=True)
                if warp_specialize:
                    add(bm, bn, bk, warps, stages, 1, TMA=True, PERSISTENT=True, WARP_SPECIALIZE=True, STREAM_K=True)
            if M <= 512:
                add(bm, bn, bk, warps, stages, 2, TMA=True)
                add(bm, bn, bk, warps, stages, 3, TMA=True)
                add(bm, bn, bk, warps, stages, 4, TMA=True)
            elif bn == 256:  # wider L2 groups for the largest tiles
                add(bm, bn, bk, warps, stages, 1, 16, TMA=True)
                add(bm, bn, bk, warps, stages, 1, 16, TMA=True, PERSISTENT=True)
    return cands
