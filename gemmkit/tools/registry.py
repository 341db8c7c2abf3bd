"""What the benchmark and the tuner need to know about each op: inputs, the gemmkit call, the
torch baseline it competes with, a float32 reference, FLOPs and bytes, and the config search space.
Adding an op to the tools means adding one `ToolOp` here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..core.config import GemmConfig, TMA_MIN_M
from ..core.device import DeviceInfo

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ToolOp:
    name: str
    dtypes: tuple  # names accepted by --dtype
    make_inputs: Callable  # (M, N, K, dtype_name, device) -> dict of tensors
    run: Callable  # (inputs, config=None) -> output (allocated, as the baseline does)
    baseline: Callable  # (inputs) -> output, the torch op gemmkit competes with
    baseline_name: str
    reference: Callable  # (inputs) -> float32 result
    tolerance: float  # relative (Frobenius) error allowed against the reference
    in_bytes: float  # bytes per operand element
    out_bytes: int
    operand_bits: int  # for the roofline: which peak applies


def _a16w16_inputs(M, N, K, dtype, device):
    dt = _DTYPES[dtype]
    return {
        "x": torch.randn(M, K, device=device, dtype=torch.float32).to(dt),
        "w": (torch.randn(N, K, device=device, dtype=torch.float32) / K**0.5).to(dt),
    }


def _a16w16_run(inp, config=None):
    from ..ops.a16w16 import gemm_a16w16

    return gemm_a16w16(inp["x"], inp["w"], config=config)


def _a16w16_baseline(inp):
    return torch.nn.functional.linear(inp["x"], inp["w"])


def _a16w16_reference(inp):
    return inp["x"].float() @ inp["w"].float().T


OPS = {
    "a16w16": ToolOp(
        name="a16w16", dtypes=("bf16", "fp16"), make_inputs=_a16w16_inputs, run=_a16w16_run,
        baseline=_a16w16_baseline, baseline_name="F.linear (cuBLAS)", reference=_a16w16_reference,
        tolerance=1e-2, in_bytes=2, out_bytes=2, operand_bits=16,
    ),
}


def get_op(name: str) -> ToolOp:
    if name not in OPS:
        raise SystemExit(f"unknown op {name!r}; known: {', '.join(OPS)}")
    return OPS[name]


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


# ---------------------------------------------------------------------------------------------
# tuning search space


def search_space(op: ToolOp, M: int, N: int, K: int, dev: DeviceInfo) -> list[GemmConfig]:
    """Candidate configs for one problem: a pruned grid by M regime, filtered by shared memory.

    Small M streams the weights: thin BLOCK_M, long BLOCK_K, deep pipelines, split-K when the
    tiles leave SMs idle; pointer loads (no per-call descriptor cost). Larger M is compute-bound:
    TMA, wide tiles, persistent schedules, warp specialization, epilogue subtiling.
    """
    elem_k = int(128 // op.in_bytes)  # BLOCK_K of one 128-byte line
    cands = []

    def add(bm, bn, bk, warps, stages, split=1, group_m=8, **flags):
        tiles = -(-M // bm) * -(-N // bn)
        if split > 1 and (tiles * split > 4 * dev.num_sms or -(-K // bk) < 4 * split):
            return
        if flags.get("PERSISTENT") and tiles <= dev.num_sms // 2:
            return
        cfg = GemmConfig(bm, bn, bk, group_m, split, warps, stages, **flags)
        if cfg.smem_bytes(op.in_bytes, op.out_bytes) <= dev.smem_per_block - 8 * 1024:
            cands.append(cfg)

    if M < TMA_MIN_M:  # weight streaming: pointer loads, thin tiles, deep pipelines, split-K
        bm = 16 if M <= 16 else (32 if M <= 32 else 64)
        for bn in (16, 32, 64, 128) if bm == 16 else (32, 64, 128):
            for bk, stage_opts in ((elem_k, (4, 6)), (2 * elem_k, (3, 4, 6)), (4 * elem_k, (3, 4))):
                if bm == 16 and bk == elem_k:
                    continue
                for stages in stage_opts:
                    for split in (1, 2, 4):
                        add(bm, bn, bk, 4, stages, split)
    else:  # compute-bound: TMA, wide tiles, persistent, warp specialization, epilogue subtiling
        if M <= 512:
            tiles = [(64, 128, elem_k, 4, 4), (64, 128, elem_k, 4, 5), (128, 64, elem_k, 4, 4), (64, 64, 2 * elem_k, 4, 4),
                     (128, 128, elem_k, 4, 4), (128, 128, elem_k, 8, 4), (64, 256, elem_k, 8, 3), (128, 256, elem_k, 8, 3)]
        else:
            tiles = [(128, 256, elem_k, 8, 3), (256, 128, elem_k, 8, 3), (128, 256, elem_k, 8, 4), (128, 128, elem_k, 8, 4),
                     (128, 128, elem_k, 8, 5), (128, 128, 2 * elem_k, 8, 3), (128, 128, 2 * elem_k, 4, 3)]
        for bm, bn, bk, warps, stages in tiles:
            add(bm, bn, bk, warps, stages, 1, TMA=True)
            add(bm, bn, bk, warps, stages, 1, TMA=True, PERSISTENT=True)
            add(bm, bn, bk, warps, stages, 1, TMA=True, PERSISTENT=True, WARP_SPECIALIZE=True)
            if bn >= 128:
                add(bm, bn, bk, warps, stages, 1, TMA=True, PERSISTENT=True, EPILOGUE_SUBTILE=True)
            if M <= 512:
                add(bm, bn, bk, warps, stages, 2, TMA=True)
            elif bn == 256:  # wider L2 groups for the largest tiles
                add(bm, bn, bk, warps, stages, 1, 16, TMA=True)
                add(bm, bn, bk, warps, stages, 1, 16, TMA=True, PERSISTENT=True)
    return cands
