"""The one list of gemmkit's public ops: where each lives and which config tables it reads.

`gemmkit.<name>` (lazy exports), the config tables (`gemmkit.core.config.TABLES`) and the tools
(bench, tune) all read this; adding an op means adding one entry here (and its ToolOp in
gemmkit.tools.registry for bench and tune).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpEntry:
    module: str  # the module defining the public function of the same name
    tables: tuple = ()  # config tables (gemmkit/configs/<DEVICE>/<table>.json) it reads


OPS = {
    "gemm_a16w16": OpEntry("gemmkit.ops.a16w16", ("a16w16",)),
    "gemm_a8w8": OpEntry("gemmkit.ops.a8w8", ("a8w8_fp8", "a8w8_int8", "a8w8_fp8_dynamic", "a8w8_fp8_exact")),
    "gemm_a8w8_blockscale": OpEntry("gemmkit.ops.a8w8_blockscale", ("a8w8_blockscale", "a8w8_blockscale_dynamic")),
    # MoE / batched family (issue 13): grouped tables keyed by the average rows per expert
    "grouped_gemm_a16w16": OpEntry("gemmkit.ops.grouped", ("grouped_a16w16",)),
    "grouped_gemm_a8w8": OpEntry("gemmkit.ops.grouped", ("grouped_a8w8",)),
    "grouped_gemm_a8w8_blockscale": OpEntry("gemmkit.ops.grouped"),  # DeepSeek-V3 block scales (derived configs)
    "grouped_gated_a16w16": OpEntry("gemmkit.ops.grouped"),  # moe_mlp's gate/up GEMM (derived configs)
    "batched_gemm_a16w16": OpEntry("gemmkit.ops.batched", ("batched_a16w16",)),
    "batched_gemm_a8w8": OpEntry("gemmkit.ops.batched"),  # derived configs (no ToolOp)
    # fused feed-forward and fused-epilogue GEMMs (issue 14)
    "ff_a16w16_gated": OpEntry("gemmkit.ops.fused", ("ff_gated_a16w16",)),
    "ff_a16w16": OpEntry("gemmkit.ops.fused"),
    "ff_a8w8_gated": OpEntry("gemmkit.ops.fused", ("ff_gated_a8w8",)),
    "fused_gemm_a16w16_mul_add": OpEntry("gemmkit.ops.fused"),
    "fused_gemm_a16w16_split_cat": OpEntry("gemmkit.ops.fused"),
    "fused_gemm_a8w8_split_cat": OpEntry("gemmkit.ops.fused"),
    "gemm_a16w4": OpEntry("gemmkit.ops.a16w4", ("a16w4",)),
    "gemm_a16wfp4": OpEntry("gemmkit.ops.fp4", ("a16wfp4",)),
    "gemm_afp4wfp4": OpEntry("gemmkit.ops.fp4", ("afp4wfp4",)),
    "quantize_fp8": OpEntry("gemmkit.quant"),
    "quantize_int8": OpEntry("gemmkit.quant"),
    "dequantize": OpEntry("gemmkit.quant"),
}

TABLES = tuple(dict.fromkeys(t for entry in OPS.values() for t in entry.tables))
