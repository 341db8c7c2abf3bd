"""Bench / tune integration of the MoE and batched ops (gemmkit.tools.moe_ops): variants
`<op>@<model>[:routing]` and `@b<B>`, routing, FLOPs and bytes, tables keyed by rows per expert."""

import json

import pytest
import torch

from gemmkit.core import config as cfgmod
from gemmkit.tools import bench, moe_ops, registry, tune
from conftest import DEVICE, ON_GPU


def test_variants_read_models_json():
    op = registry.get_op("grouped_a16w16@deepseek-v3-moe:zipf")
    assert (op.experts, op.top_k, op.routing, op.table) == (256, 8, "zipf", "grouped_a16w16")
    assert op.make_inputs(4, 16, 32, "bf16", "cpu")["w"].shape == (256, 16, 32)  # the variant's own E
    default = registry.get_op("grouped_a16w16")
    assert (default.experts, default.top_k, default.routing) == (8, 2, "balanced")
    assert registry.get_op("moe_mlp@qwen3-30b-a3b-moe-mlp").experts == 128
    assert registry.get_op("batched_a16w16@b32").batch == 32
    for bad in ("grouped_a16w16@nope", "grouped_a16w16@mixtral-8x7b-moe:uniform", "batched_a16w16@32",
                "a16w16@mixtral-8x7b-moe"):
        with pytest.raises(SystemExit):
            registry.get_op(bad)
    models = registry.load_models()
    for name, (E, k) in {"mixtral-8x7b-moe": (8, 2), "qwen3-30b-a3b-moe": (128, 8), "deepseek-v3-moe": (256, 8)}.items():
        assert (models[name]["experts"], models[name]["top_k"]) == (E, k)
    assert registry.model_shapes(["mixtral-8x7b-moe"]) == [("mixtral-8x7b-moe.gate_up", 28672, 4096),
                                                          ("mixtral-8x7b-moe.down", 4096, 14336)]
    problems = bench.bench_problems(op, None, ["deepseek-v3-moe"], [64, 4096])
    assert [p[1:] for p in problems] == [(64, 4096, 7168), (4096, 4096, 7168), (64, 7168, 2048), (4096, 7168, 2048)]


def test_routing_flops_bytes():
    bal = moe_ops.route(6, 2, 4, "balanced")
    assert bal.tolist() == [[0, 1], [2, 3], [0, 1], [2, 3], [0, 1], [2, 3]]
    z = moe_ops.route(4000, 8, 64, "zipf")
    assert torch.equal(z, moe_ops.route(4000, 8, 64, "zipf"))  # seeded
    assert all(len(set(r)) == 8 for r in z.tolist())  # top-k distinct experts
    counts = torch.bincount(z.flatten(), minlength=64)
    assert counts[0] > 4 * counts[32] and counts[0] > 4000 * 8 / 64  # skewed towards low ids
    op = registry.get_op("grouped_a16w16@deepseek-v3-moe")
    assert op.flops(64, 4096, 7168) == 2 * 64 * 8 * 4096 * 7168
    assert all(op.table_m(op.problem_m(m)) == m for m in (1, 2, 16, 100, 1024))  # the autotune hook's problem
    assert op.touched(1) == 8 and op.touched(64) == 256 and op.table_m(64) == 2 and op.table_m(4096) == 128
    # 1 token touches 8 experts' weights, 64 tokens all 256 (balanced)
    assert op.nbytes(1, 4096, 7168) == 8 * 4096 * 7168 * 2 + 8 * 7168 * 2 + 8 * 4096 * 2 + 4 * 8
    zipf = registry.get_op("grouped_a16w16@deepseek-v3-moe:zipf")
    assert zipf.touched(64) < 256 and zipf.nbytes(64, 4096, 7168) < op.nbytes(64, 4096, 7168)
    b = registry.get_op("batched_a16w16@b4")
    assert b.flops(8, 16, 32) == 4 * 2 * 8 * 16 * 32


def test_moe_rotation_sized_on_the_touched_experts():
    """One call reads only the experts its routing touches (the same in every input set): the timing rotation is
    sized on those bytes, so that at few tokens the sets still exceed the L2 three times."""
    import dataclasses

    from gemmkit.core.device import INTERPRETER_DEVICE

    op = registry.get_op("grouped_a16w16@mixtral-8x7b-moe")
    M, N, K = 1, 256, 128
    dev = dataclasses.replace(INTERPRETER_DEVICE, l2_bytes=3 * op.nbytes(M, N, K))
    sets = tune.input_sets(op, M, N, K, "bf16", dev, device=DEVICE)
    assert len(sets) * op.rotation_bytes(M, N, K) >= 3 * dev.l2_bytes and len(sets) == 9


@pytest.mark.parametrize("name", ["grouped_a16w16@qwen3-30b-a3b-moe:zipf", "grouped_a8w8@mixtral-8x7b-moe:zipf",
                                  "grouped_a8w8_blockscale@mixtral-8x7b-moe", "moe_mlp@mixtral-8x7b-moe-mlp:zipf",
                                  "moe_mlp_unfused@mixtral-8x7b-moe-mlp", "moe_mlp_fp8@mixtral-8x7b-moe-mlp:zipf",
                                  "moe_mlp_fp8_block@mixtral-8x7b-moe-mlp", "batched_a16w16@b3"])
def test_variant_runs(name):
    """Each variant's inputs, gemmkit call and float reference agree (on the suite's device); the
    torch baseline is checked on the CPU (on the GPU `gemmkit bench` checks it at real sizes)."""
    op = registry.get_op(name)
    inp = op.make_inputs(9, 16, 32, op.dtypes[0], DEVICE)
    assert tune.rel_error(op.run(inp), op.reference(inp)) < op.tolerance
    if ON_GPU or name.startswith(("grouped_a8w8", "moe_mlp_fp8")):  # torch._scaled_grouped_mm is CUDA-only
        return
    assert tune.rel_error(op.baseline(inp), op.reference(inp)) < op.tolerance


def test_tables_registered_and_keyed_by_rows_per_expert(tmp_path):
    for table in ("grouped_a16w16", "grouped_a8w8", "batched_a16w16"):
        assert table in cfgmod.TABLES and registry.table_op(table).table == table
    cfg = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}
    key = json.dumps(cfg, sort_keys=True)
    cache = {(64, 4096, 7168, "bf16", key): {"us": 10.0}, (4096, 4096, 7168, "bf16", key): {"us": 50.0}}
    out = tmp_path / "t.json"
    table = tune.write_table("grouped_a16w16", "bf16", cache, out, "test", "DEV")
    assert set(table["shapes"]["4096,7168"]) == {cfgmod.m_bucket(2), cfgmod.m_bucket(1024)}  # E 8, top-2: T k / E


def test_moe_sort_op_binds_the_variant():
    """moe_sort@<model>: run, baseline and reference sort among that model's experts (bench's correctness check)."""
    for name, E in (("moe_sort@qwen3-30b-a3b-moe:zipf", 128), ("moe_sort@mixtral-8x7b-moe", 8)):
        op = registry.get_op(name)
        inp = op.make_inputs(23, 1, 1, "int64", DEVICE)
        g, s, o = op.run(inp)
        assert o.shape == (E + 1,) and tune.rel_error(op.run(inp), op.reference(inp)) == 0.0
        assert all(torch.equal(a, b) for a, b in zip((g, s, o), op.baseline(inp)))
