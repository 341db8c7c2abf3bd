"""The Hopper INT4 decode kernel (sm_90; kernels/gemm_w4_decode.py, core/hopper_w4.py): which
gemm_a16w4 calls take it and, on a Hopper GPU, its results against float64 references of the
dequantized weights. The CPU tests check the dispatch rules and the K relabelling the kernel's
register tile and its staging of x must agree on (emulated with torch)."""

import inspect

import pytest
import torch

import gemmkit
from gemmkit import quant
from gemmkit.core import config as config_mod
from gemmkit.core import hopper_w4, hopper_ws
from gemmkit.core.device import device_info
from gemmkit.core import plan as plan_mod
from conftest import ON_GPU, assert_close, poisoned, randn, reference, spy_plans
import w4_checks
from w4_checks import int4_weight

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
HOPPER = ON_GPU and torch.cuda.get_device_capability() == (9, 0) and hopper_ws.gluon_kernel() is not None
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel runs on sm_90 GPUs only")


@pytest.fixture
def built(monkeypatch):
    """The W4DecodePlans built while the test runs (plan caches cleared first). The size rule is
    widened to every M <= 64, N and K the kernel can take, so that its results are checked
    beyond the sizes it is routed (test_size_rule checks the rule itself)."""
    monkeypatch.setattr(hopper_w4, "DECODE_MAX_M", 64)
    monkeypatch.setattr(hopper_w4, "MX_DECODE_MAX_M", 64)
    monkeypatch.setattr(hopper_w4, "SMALL_DECODE_MAX_M", 64)
    yield from spy_plans(monkeypatch, hopper_w4.W4DecodePlan, config_mod.clear_caches)


# the K relabelling (CPU) ---------------------------------------------------------------------------

@pytest.mark.skipif(hopper_ws.gluon_kernel() is None, reason="this Triton has no Gluon")
def test_register_tile_relabelling_matches_x_order():
    """The decode's outputs (register i of a word pair = element i of each word), stacked as the
    kernel's joins stack them and relabelled by its reshape / PERM / reshape, hold at position k'
    the weight column true_k(k') that x is staged at: emulated on random bytes of 64 rows."""
    from gemmkit.kernels import gemm_w4_decode as k

    g = torch.Generator().manual_seed(0)
    packed = torch.randint(0, 256, (64, 64), dtype=torch.uint8, generator=g)  # one 128-deep step
    nibbles = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(64, 128)  # element e of the row
    words = packed.view(64, 16, 4)  # word w: bytes 4w..4w+3 (elements 8w..8w+7)
    outs = [(words[..., i // 2] >> (4 * (i % 2))) & 15 for i in range(8)]  # register i: element i of each word

    def join(a, b):
        return torch.stack([a, b], dim=-1)

    t = join(join(join(outs[0], outs[1]), join(outs[2], outs[3])), join(join(outs[4], outs[5]), join(outs[6], outs[7])))
    t = t.reshape(64, 2, 2, 2, 2, 2, 2, 2).permute(*k.PERM).reshape(64, 128)
    order = [k.host_true_k(kp) for kp in range(128)]
    assert sorted(order) == list(range(128))
    assert torch.equal(t, nibbles[:, order])
    assert str(list(k.PERM)) in inspect.getsource(k)  # the kernel's permute is PERM


@pytest.mark.skipif(hopper_ws.gluon_kernel() is None, reason="this Triton has no Gluon")
def test_x_relabelling_matches_true_k():
    """x, read in K order, relabelled by _permuted_x's reshape / X_PERM / reshape, holds at position k'
    column host_true_k(k'), the weight's order."""
    from gemmkit.kernels import gemm_w4_decode as k

    x = torch.arange(3 * 128).reshape(3, 128)
    t = x.reshape(3, 2, 2, 2, 2, 2, 2, 2).permute(*k.X_PERM).reshape(3, 128)
    assert torch.equal(t, x[:, [k.host_true_k(kp) for kp in range(128)]])
    assert str(list(k.X_PERM)) in inspect.getsource(k._permuted_x.fn)  # the kernel's permute is X_PERM


def _run_ptx(ptx: str, w0: int, w1: int) -> list:
    """$0..$7 after the decode block on words $8 = w0, $9 = w1 (the PTX instructions the decoders
    use: prmt in its default mode, lop3 0xEA = (a & b) | c, and, shr, mul.lo; 32-bit)."""
    regs = {"$8": w0, "$9": w1}
    mask = 0xFFFFFFFF

    def val(x):
        return int(x, 0) if x[0].isdigit() else regs[x]

    for line in ptx.splitlines():
        line = line.strip().rstrip(";")
        if not line or line[0] in "{}." or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        d, *src = [x.strip() for x in rest.split(",")]
        v = [val(x) for x in src]
        if op == "prmt.b32":
            pool = [(v[0] >> (8 * i)) & 255 for i in range(4)] + [(v[1] >> (8 * i)) & 255 for i in range(4)]
            regs[d] = sum(pool[(v[2] >> (4 * i)) & 7] << (8 * i) for i in range(4))
        elif op == "lop3.b32":
            assert v[3] == 0xEA
            regs[d] = (v[0] & v[1]) | v[2]
        elif op == "and.b32":
            regs[d] = v[0] & v[1]
        elif op in ("shr.u32", "shr.b32"):
            regs[d] = v[0] >> v[1]
        elif op == "shl.b32":
            regs[d] = (v[0] << v[1]) & mask
        elif op == "mul.lo.u32":
            regs[d] = (v[0] * v[1]) & mask
        else:
            raise AssertionError(f"unexpected instruction {line!r}")
    return [regs[f"${i}"] for i in range(8)]


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e2m1"])
def test_decode_ptx_semantics(fmt):
    """The decode blocks on random word pairs: register i holds element i (nibble i) of each word,
    the first word's in the low half, as MAGIC | q (INT4) or the bf16 of the e2m1 bits."""
    from gemmkit.kernels import gemm_w4_decode as k

    ptx = {"bf16": k._decode_ptx(0x4300), "fp16": k._decode_ptx(0x6400), "e2m1": k._e2m1_ptx()}[fmt]

    def expect(q):
        if fmt == "e2m1":
            return ((q & 7) << 6) | ((q & 8) << 12)
        return (0x4300 if fmt == "bf16" else 0x6400) | q

    g = torch.Generator().manual_seed(1)
    for w0, w1 in torch.randint(0, 2**32, (64, 2), dtype=torch.int64, generator=g).tolist():
        out = _run_ptx(ptx, w0, w1)
        for i in range(8):
            q0, q1 = (w0 >> (4 * i)) & 15, (w1 >> (4 * i)) & 15
            assert out[i] == expect(q0) | (expect(q1) << 16), (fmt, hex(w0), hex(w1), i)


def test_decode_ptx_reads_both_words():
    from gemmkit.kernels.gemm_w4_decode import _decode_ptx

    ptx = _decode_ptx(0x4300)
    assert ptx.count("prmt.b32") == 4 and ptx.count("lop3.b32") == 8 and "0x43004300" in ptx
    assert all(f"${i}," in ptx for i in range(8)) and "$8, $9" in ptx


# the dispatch rule (CPU) ---------------------------------------------------------------------------

@pytest.mark.parametrize("group,K,shift", [(128, 4096, 0), (256, 4096, 1), (1024, 4096, 3), (4096, 4096, 30),
                                           (3584, 3584, 30), (64, 4096, None), (384, 4608, None)])
def test_group_shift(group, K, shift):
    assert hopper_w4.group_shift(group, K) == shift


@pytest.mark.parametrize("target,steps,ks", [(4, 32, 4), (4, 112, 4), (4, 38, 2), (4, 6, 3), (4, 5, 5), (4, 7, 7),
                                             (4, 1, 1), (4, 30, 5), (2, 32, 2), (2, 9, 3), (2, 7, 1)])
def test_slice_steps(target, steps, ks):
    """KS: the divisor of the step count nearest the target, the larger on a tie."""
    assert hopper_w4.slice_steps(steps, target) == ks and steps % ks == 0


@pytest.mark.parametrize("ks,box", [(1, 1), (2, 2), (3, 1), (4, 2), (6, 2), (7, 1), (8, 2)])
def test_box_steps(ks, box):
    """Steps per TMA load: a power of two up to BOX_STEPS dividing KS (a box never crosses slices)."""
    assert hopper_w4.box_steps(ks) == box and ks % box == 0


@pytest.mark.parametrize("M,N,K,group,mxfp4,kind", [
    (1, 4096, 4096, 128, False, "SHORT_INT4"), (1, 8192, 8192, 128, False, "SHORT_INT4"),
    (2, 6144, 4096, 256, False, "SHORT_INT4"), (1, 6144, 4096, 64, False, "SHORT"),
    (1, 28672, 4096, 128, False, "LONG"), (2, 57344, 8192, 128, False, "LONG"),
    (1, 8192, 28672, 4096 * 7, False, "LONG"), (3, 4096, 4096, 128, False, "SHORT_INT4"),
    (4, 8192, 8192, 128, False, "LONG"), (1, 8192, 8192, 128, False, "SHORT_INT4"),
    (2, 4096, 14336, 128, False, "LONG"), (4, 9216, 3072, 128, False, "SHORT_INT4"), (5, 4096, 4096, 128, False, "LONG"), (3, 4096, 4096, 32, True, "SHORT"),
    (5, 4096, 4096, 32, True, "LONG"),
    (1, 57344, 8192, 32, False, "SHORT"), (1, 57344, 8192, 32, True, "SHORT"), (16, 4096, 4096, 32, True, "LONG"),
    (32, 8192, 8192, 32, True, "LONG"), (33, 8192, 8192, 32, True, "WIDE"), (64, 8192, 8192, 32, True, "WIDE"),
    (16, 8192, 8192, 32, False, "LONG"), (17, 8192, 8192, 128, False, "WIDE"), (64, 8192, 8192, 256, False, "WIDE"),
    (16, 57344, 8192, 128, False, "LONG")])
def test_split_kind(M, N, K, group, mxfp4, kind):
    """SHORT up to 4 rows, LONG from 5; INT4 groups of 128 or more at 1-4 rows: LONG on layers that give
    each of the H100's SMs 96 or more 64 x 128 weight tile-steps at one row (Llama-3-8B gate_up: 108),
    48 or more from two rows (Llama-3-70B o: 62, 8B down: 54; the held-out 9216 x 3072: 26), else
    SHORT_INT4; MXFP4 from 33 rows and INT4 groups of 128 or more from 17: WIDE (128-row tiles)."""
    from gemmkit.core.device import known_device

    h100 = known_device("NVIDIA_H100_80GB_HBM3")
    assert hopper_w4.split_kind(M, N, K, h100, group, mxfp4) == getattr(hopper_w4, kind)
    sp = hopper_w4.decode_split(M, N, K, h100, group, mxfp4)
    assert sp.slices * sp.ks == K // 128 and sp.programs % sp.slices == 0 and sp.ks % sp.box == 0
    assert sp.programs <= sp.slices * max(1, sp.per_sm * h100.num_sms // sp.slices)
    assert sp.bn == getattr(hopper_w4, kind).bn


@pytest.mark.parametrize("M,N,K,group,mxfp4", [(1, 4096, 4096, 128, False), (1, 57344, 8192, 128, False),
                                              (7, 3000, 2048, 128, False), (64, 8192, 8192, 32, True),
                                              (33, 100, 1024, 32, True), (16, 28672, 4096, 32, False),
                                              (2, 8192, 8192, 128, False)])
def test_finish_rounds(monkeypatch, M, N, K, group, mxfp4):
    """finish_rounds: the round trips of the largest tile group's epilogue, counted tile by tile the
    way the kernel assigns them (program p: tiles p // SLICES, + programs / SLICES, ...), FIN_V values
    per thread; the plan launches finish_sums (as a programmatic dependent) for sliced K, and finishes
    in the kernel only where FINISH_HERE asks for it."""
    from gemmkit.core.device import known_device

    h100 = known_device("NVIDIA_H100_80GB_HBM3")
    sp = hopper_w4.decode_split(M, N, K, h100, group, mxfp4)
    groups, tiles = sp.programs // sp.slices, -(-N // sp.bn)
    per_round = hopper_w4.FIN_V * 32 * (sp.bn // 16)
    assert hopper_w4.sums_transposed(M) == (12 <= M <= 16)
    rows = hopper_w4.x_rows(M) if hopper_w4.sums_transposed(M) else M  # transposed sums: x's padding rows too
    worst = max(-(-rows * len(range(g, tiles, groups)) * sp.bn // per_round) for g in range(groups))
    assert hopper_w4.finish_rounds(sp, M, N) == worst
    x, w_q = torch.empty(M, K, dtype=BF16), torch.empty(N, K // 2, dtype=torch.uint8)
    plan = hopper_w4.W4DecodePlan(h100, x, w_q, None, None, M, N, K, group, None, None, BF16, (M, N), False, mxfp4)
    assert not plan.finish_here
    assert plan.values["PDL"] == (sp.slices > 1 and hopper_w4.pdl_ok())
    monkeypatch.setattr(hopper_w4, "FINISH_HERE", True)
    plan = hopper_w4.W4DecodePlan(h100, x, w_q, None, None, M, N, K, group, None, None, BF16, (M, N), False, mxfp4)
    assert plan.finish_here == (sp.slices > 1) and plan.values["FINISH_HERE"] == plan.finish_here
    assert not plan.values["PDL"]


@pytest.mark.parametrize("M,N,K,ok", [(1, 57344, 8192, True), (2, 8192, 28672, True), (4, 6144, 4096, True),
                                      (3, 8192, 16384, True), (3, 8192, 28672, True), (8, 4096, 4096, True),
                                      (9, 4096, 4096, True), (16, 3072, 3072, True), (17, 3072, 3072, True),
                                      (16, 57344, 8192, True), (12, 10240, 8192, True), (12, 8192, 8192, True),
                                      (12, 6144, 4096, True), (16, 14336, 2048, True),
                                      (17, 57344, 8192, True), (32, 6144, 4096, True), (33, 6144, 4096, False),
                                      (64, 8192, 4096, True), (64, 57344, 8192, True), (65, 4096, 4096, False),
                                      (1, 100, 256, True),
                                      (1, 8192, 8000, False)])
def test_size_rule(monkeypatch, M, N, K, ok):
    """The sizes gemm_a16w4 routes to the kernel (up to 16 rows, 17 to 32 rows, 33 to 64 on weights of 2^25
    or more; K a multiple of 128), with the
    device checks passing; MXFP4 (gemm_a16wfp4): up to 64 rows, bf16 x;
    INT4 groups of 32: up to 16 rows."""
    monkeypatch.setattr(hopper_w4, "ws_enabled", lambda dev, device: True)
    x, w_q = torch.empty(M, K, dtype=BF16), torch.empty(N, K // 2, dtype=torch.uint8)
    assert hopper_w4.w4_decode_ok(None, x, w_q, M, N, K, 128 if K % 128 == 0 else K, None) == ok
    mx_ok = M <= 64 and K % 128 == 0
    assert hopper_w4.w4_decode_ok(None, x, w_q, M, N, K, 32, None, mxfp4=True) == mx_ok
    assert hopper_w4.w4_decode_ok(None, x, w_q, M, N, K, 32, None) == (M <= 16 and K % 128 == 0)
    assert not hopper_w4.w4_decode_ok(None, x.half(), w_q, M, N, K, 32, None, mxfp4=True)


def test_slices_fit_shared_memory():
    """A step count whose nearest divisor is large (13, a prime) at 64 rows of x: the slice is cut to
    what the shared memory holds (one step), and every M's x tile of the largest slice fits."""
    from gemmkit.core.device import known_device

    h100 = known_device("NVIDIA_H100_80GB_HBM3")
    assert hopper_w4.slice_steps(13, 8) == 13
    stages = hopper_w4.LONG.stages
    assert hopper_w4.max_slice_steps(64, h100, stages) < 13
    assert hopper_w4.slice_steps(13, 8, hopper_w4.max_slice_steps(64, h100, stages)) == 1
    for bm in (16, 32, 64):
        for split in (hopper_w4.SHORT, hopper_w4.SHORT_INT4, hopper_w4.LONG):
            ks = hopper_w4.max_slice_steps(bm, h100, split.stages)
            box = hopper_w4.BOX_STEPS
            used = ks * bm * (2 * 128 + 4) + split.stages * box * 64 * 64 + hopper_w4.SMEM_RESERVE
            assert used <= h100.smem_per_block


def test_configs_show_route():
    """`gemmkit configs show` on an sm_90 profile names the decode kernel's split where it takes a call."""
    from gemmkit.core.device import known_device
    from gemmkit.tools.configs import w4_route

    h100 = known_device("NVIDIA_H100_80GB_HBM3")
    assert ("64-row weight tiles, K in 16 slices of 2 x 128, up to 5 programs per SM, 2 loads of 2 x 128 in flight, "
            "the slices' sums finished by a second launch" in w4_route("a16w4", 1, 4096, 4096, h100))
    assert "sums finished by a second launch" in w4_route("a16w4", 2, 4096, 4096, h100)
    assert w4_route("a16w4", 65, 4096, 4096, h100).startswith("the prefill kernel")  # tests/test_w4_prefill.py
    assert w4_route("a16w4", 2048, 4096, 4096, h100) is None
    assert ("K in 8 slices of 4 x 128, up to 6 programs per SM, 2 loads of 2 x 128 in flight"
            in w4_route("a16wfp4", 16, 4096, 4096, h100))
    assert w4_route("a16wfp4", 64, 8192, 8192, h100).startswith("128-row weight tiles, K in 8 slices of 8 x 128")
    assert w4_route("a16wfp4", 2048, 4096, 4096, h100) is None and w4_route("a16w16", 1, 4096, 4096, h100) is None
    assert w4_route("a16w4", 1, 4096, 4096, device_info(torch.device("cpu"))) is None


@pytest.mark.skipif(hopper_ws.gluon_kernel() is None, reason="this Triton has no Gluon")
def test_output_overlapping_an_input_is_refused_before_launch():
    """A y that shares memory with x: a clear error from the plan, before anything is launched."""
    from gemmkit.core.device import known_device

    x = torch.randn(4, 256).to(BF16)
    w_q = torch.zeros(64, 128, dtype=torch.uint8)
    ws = torch.ones(64, 2, dtype=BF16)
    y = x.view(-1)[:256].view(4, 64)
    plan = hopper_w4.W4DecodePlan(known_device("NVIDIA_H100_80GB_HBM3"), x, w_q, None, y, 4, 64, 256, 128, None,
                                  "none", BF16, (4, 64), False)
    with pytest.raises(ValueError, match="y shares memory with x"):
        plan._run(x, w_q, None, y, ws, None)


def test_not_taken_off_hopper(built):
    """On the CPU (the interpreter) or another GPU the tl kernel serves every call."""
    if HOPPER:
        pytest.skip("on sm_90 the decode kernel takes these calls")
    w4_checks.check_not_taken_off_hopper(built, 2, hopper_w4.w4_decode_ok)


# results on the H100 (GPU) -------------------------------------------------------------------------

@needs_hopper
@pytest.mark.parametrize("M", [1, 2, 4, 5, 9, 16, 17, 40, 64])
@pytest.mark.parametrize("N,K", [(64, 128), (100, 384), (4096, 4096), (1000, 4864), (6144, 1152)])
def test_shapes(built, M, N, K):
    w4_checks.check_shape(built, M, N, K)


@needs_hopper
@w4_checks.groups_and_dtypes
def test_groups_and_dtypes(built, group_size, symmetric, dtype):
    w4_checks.check_group_and_dtype(built, 5, group_size, symmetric, dtype)


@needs_hopper
@w4_checks.activations_and_out_dtypes
def test_bias_activation_out_dtype_3d(built, activation, out_dtype):
    w4_checks.check_bias_activation_out_dtype_3d(built, 3, activation, out_dtype)


@needs_hopper
def test_strided_x_y_and_scales(built):
    """x rows strided, y a column slice of a wider buffer, scales and zero points transposed views."""
    w4_checks.check_strided(built, randn(12, 2 * 1536, dtype=BF16)[:, 1536:], 520)


SPLITS = {"SHORT": hopper_w4.SHORT, "LONG": hopper_w4.LONG, "128 rows": hopper_w4.Split(4, 3, 2, 128),
          "128 rows, 2 steps": hopper_w4.Split(2, 2, 3, 128)}


FINISHES = {"launch": (False, False), "launch, PDL": (False, True), "here": (True, False)}


@needs_hopper
@pytest.mark.parametrize("kind", list(SPLITS))
@pytest.mark.parametrize("box", [1, 2])
@pytest.mark.parametrize("finish", list(FINISHES))
@pytest.mark.parametrize("M", [3, 14, 33])
def test_split_variants(built, monkeypatch, kind, box, finish, M):
    """Each split (64- and 128-row tiles) with one- and two-step weight loads, the K slices' sums
    finished by finish_sums (launched plainly or as a programmatic dependent) or by the last
    program of each tile group, repeated (the sums buffer and counters reused), ragged N."""
    split = SPLITS[kind]
    here, pdl = FINISHES[finish]
    for kind in ("SHORT", "SHORT_INT4", "LONG", "WIDE"):
        monkeypatch.setattr(hopper_w4, kind, split)
    monkeypatch.setattr(hopper_w4, "BOX_STEPS", box)
    monkeypatch.setattr(hopper_w4, "PDL", pdl)
    monkeypatch.setattr(hopper_w4, "FINISH_HERE", here)
    x = randn(M, 4096, dtype=BF16)
    q, s, z, wd = int4_weight(2000, 4096, 128)
    for _ in range(2):
        y = poisoned((M, 2000), BF16)
        assert_close(gemmkit.gemm_a16w4(x, q, s, z, group_size=128, y=y), reference(x, wd))
    plan = built[0]
    assert plan.slices > 1 and plan.values["BOX"] == box and plan.finish_here == here
    assert plan.values["PDL"] == (pdl and not here and hopper_w4.pdl_ok())
    assert plan.values["BN"] == split.bn and plan.num_warps == split.bn // 16


@needs_hopper
@pytest.mark.parametrize("fmt", ["int4 g128", "mxfp4"])
@pytest.mark.parametrize("M", [3, 13, 40])
def test_finish_here_many_round_trips(built, monkeypatch, fmt, M):
    """The last program of each tile group finishes its sums FIN_V values per thread at a time: with
    one value per thread, many round trips (tiles of a group and x's rows across them), bias,
    activation, a strided fp32 y; repeated, counters and sums left zero."""
    monkeypatch.setattr(hopper_w4, "FIN_V", 1)
    monkeypatch.setattr(hopper_w4, "FINISH_HERE", True)
    N, K = 3000, 2048
    x = randn(M, K, dtype=BF16)
    bias = randn(N, dtype=BF16)
    for _ in range(2):
        buf = poisoned((M, N + 8), FP32)
        y = buf[:, :N]
        if fmt == "mxfp4":
            w, sc = quant.quantize_mxfp4(randn(N, K, dtype=FP32, scale=K**-0.5))
            out = gemmkit.gemm_a16wfp4(x, w, sc, bias=bias, activation="silu", out_dtype=FP32, y=y)
            wd = quant.dequantize_mxfp4(w, sc, torch.float64)
        else:
            q, s, z, wd = int4_weight(N, K, 128)
            out = gemmkit.gemm_a16w4(x, q, s, z, group_size=128, bias=bias, activation="silu", out_dtype=FP32, y=y)
        assert out is y
        assert_close(out, reference(x, wd, bias, "silu"))
        assert torch.isnan(buf[:, N:]).all()
    plan = built[-1]
    split = hopper_w4.decode_split(M, N, K, device_info(x.device), 32 if fmt == "mxfp4" else 128, fmt == "mxfp4")
    assert plan.finish_here and hopper_w4.finish_rounds(split, M, N) > 1
    torch.cuda.synchronize()
    assert all(int(b.abs().sum()) == 0 for _, b in plan_mod._zeroed.values())


@pytest.mark.parametrize("regs,shared,warps,n", [(80, 24720, 4, 6), (81, 24592, 4, 5), (96, 24720, 4, 5),
                                                 (182, 163856, 8, 1), (24, 0, 4, 16), (1, 0, 4, 16)])
def test_resident_programs(regs, shared, warps, n):
    """Programs per SM: 64K registers allocated in 8s per thread, 228 KB of shared memory (1 KB each
    beside the kernel's), 2048 threads."""
    assert hopper_w4.resident_programs(regs, shared, warps) == n


@needs_hopper
def test_programs_cut_to_what_an_sm_holds(built, monkeypatch):
    """A split asking for more programs per SM than the compiled kernel's registers allow: from the
    second call, the plan launches as many as are resident at once; results right before and after."""
    monkeypatch.setattr(hopper_w4, "SHORT_INT4", hopper_w4.Split(2, 2, 16))
    x = randn(1, 4096, dtype=BF16)
    q, s, z, wd = int4_weight(8192, 4096, 128)
    for _ in range(3):
        assert_close(gemmkit.gemm_a16w4(x, q, s, z, group_size=128, y=poisoned((1, 8192), BF16)), reference(x, wd))
    plan = built[0]
    kernel = plan.launch.kernel
    resident = hopper_w4.resident_programs(kernel.n_regs, kernel.metadata.shared, plan.num_warps)
    assert plan.fitted and resident < 16
    assert plan.launch.grid[0] == plan.slices * min(128, resident * plan.num_sms // plan.slices)
    assert plan.groups == plan.launch.grid[0] // plan.slices


@needs_hopper
@pytest.mark.parametrize("here", [False, True])
def test_transposed_sums_padding_rows_put_back_to_zero(built, monkeypatch, here):
    """Transposed sums (12 to 16 rows: x's padding rows summed too): a NaN scale makes the padding
    rows' sums NaN; they are put back to zero, so that a following call with more rows through the
    same buffer sees NaN only in the NaN scale's output column."""
    monkeypatch.setattr(hopper_w4, "FINISH_HERE", here)
    N, K = 1000, 2048
    wq, ws = quant.quantize_mxfp4(randn(N, K, dtype=FP32, scale=K**-0.5))
    ws_nan = ws.clone()
    ws_nan[5, 3] = 255
    out = gemmkit.gemm_a16wfp4(randn(12, K, dtype=BF16), wq, ws_nan)
    assert out[:, 5].isnan().all() and not out[:, :5].isnan().any()
    x = randn(16, K, dtype=BF16)
    out = gemmkit.gemm_a16wfp4(x, wq, ws)
    assert_close(out, reference(x, quant.dequantize_mxfp4(wq, ws, torch.float64)))
    assert all(p.values["SUMS_T"] and p.finish_here == here for p in built)
    torch.cuda.synchronize()
    assert all(int(b.abs().sum()) == 0 for _, b in plan_mod._zeroed.values())


@needs_hopper
def test_zero_buffers_left_zero_and_repeat_calls(built):
    """The K slices' sums and arrival counters are reused by the next launch: left zero."""
    x = randn(16, 4096, dtype=BF16)
    q, s, z, wd = int4_weight(4096, 4096, 128)
    for _ in range(3):
        assert_close(gemmkit.gemm_a16w4(x, q, s, z, group_size=128), reference(x, wd))
    assert built[0].slices > 1
    torch.cuda.synchronize()
    assert all(int(b.abs().sum()) == 0 for _, b in plan_mod._zeroed.values())


@needs_hopper
def test_not_taken(built):
    """K not a multiple of 128, M > 64, x not K-contiguous, an explicit config: the tl kernel (even
    with the widened size rule)."""
    x = randn(4, 1024, dtype=BF16)
    q2, s2, z2, wd2 = int4_weight(256, 1088, None)  # one group per channel, K not a multiple of 128
    x2 = randn(4, 1088, dtype=BF16)
    assert_close(gemmkit.gemm_a16w4(x2, q2, s2, z2, group_size=None), reference(x2, wd2))
    q3, s3, z3, wd3 = int4_weight(256, 1024, 128)
    x65 = randn(65, 1024, dtype=BF16)
    assert_close(gemmkit.gemm_a16w4(x65, q3, s3, z3, group_size=128), reference(x65, wd3))
    xt = randn(1024, 4, dtype=BF16).t()
    assert_close(gemmkit.gemm_a16w4(xt, q3, s3, z3, group_size=128), reference(xt, wd3))
    assert_close(gemmkit.gemm_a16w4(x, q3, s3, z3, group_size=128, config=dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128)),
                 reference(x, wd3))
    assert not built


@needs_hopper
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (2, 333, 1152), (4, 1000, 256), (16, 64, 128), (64, 2048, 512),
                                   (40, 64, 128), (33, 100, 384), (64, 200, 4096)])
def test_mxfp4(built, M, N, K):
    """gemm_a16wfp4 (MXFP4 weight, bf16 x): e2m1 codes decoded with their e8m0 scales; from 33 rows in
    128-row tiles (WIDE), also where N is under a tile."""
    plan = w4_checks.check_mxfp4(built, M, N, K)
    assert plan.values["BN"] == (128 if M >= hopper_w4.WIDE_MIN_M else 64)


@needs_hopper
@pytest.mark.parametrize("fmt", ["mxfp4", "g32", "g64", "g256 fp16"])
@pytest.mark.parametrize("M", [1, 20, 64])
def test_rows128_formats(built, monkeypatch, fmt, M):
    """128-row tiles (two warp groups) with every scale form: MXFP4 blocks, small INT4 groups applied
    before the product, groups of 128 or more after it (fp16 x)."""
    for kind in ("SHORT", "SHORT_INT4", "LONG", "WIDE"):
        monkeypatch.setattr(hopper_w4, kind, hopper_w4.Split(4, 3, 2, 128))
    N, K = 1000, 2048
    if fmt == "mxfp4":
        x = randn(M, K, dtype=BF16)
        wq, ws = quant.quantize_mxfp4(randn(N, K, dtype=FP32, scale=K**-0.5))
        out, ref = gemmkit.gemm_a16wfp4(x, wq, ws), reference(x, quant.dequantize_mxfp4(wq, ws, torch.float64))
    else:
        group, dtype = (256, FP16) if fmt == "g256 fp16" else (int(fmt[1:]), BF16)
        x = randn(M, K, dtype=dtype)
        q, s, z, wd = int4_weight(N, K, group, dtype=dtype)
        out, ref = gemmkit.gemm_a16w4(x, q, s, z, group_size=group), reference(x, wd)
    assert len(built) == 1 and built[0].values["BN"] == 128
    assert_close(out, ref)


@needs_hopper
def test_mxfp4_extreme_scales_and_fp16_x(built):
    """Scales at the ends of the e8m0 range stay exact; fp16 x: the tl kernel."""
    x, wq, ws = w4_checks.check_mxfp4_extreme_scales(built, 2)
    gemmkit.gemm_a16wfp4(x.half(), wq, ws.clone().fill_(127))
    assert len(built) == 1


@needs_hopper
def test_cuda_graph_replays_new_inputs(built):
    w4_checks.check_cuda_graph(built, 4)


@needs_hopper
def test_disabled_by_env(built, monkeypatch):
    w4_checks.check_disabled_by_env(built, monkeypatch, 4)
