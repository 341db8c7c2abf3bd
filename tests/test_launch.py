"""The flat launch path that plans bind after their first launch (gemmkit.core.dense.DensePlan.run).

On the CPU the kernel is interpreted and the flat path never binds, so the first test pretends the
kernel was compiled and compares, call by call, the arguments the flat path hands to Triton's C
launcher with those of the regular path. On a GPU the other tests run it for real."""

import types
import weakref

import pytest
import torch

import gemmkit
from gemmkit.core import dense, launcher
from gemmkit.core import plan as plan_mod
from gemmkit.ops import a8w8, a16w16
from gemmkit import quant
from conftest import DEVICE, ON_GPU, assert_close, kernel_paths, poisoned, randn, reference, sizes

BF16, FP32, E4M3 = torch.bfloat16, torch.float32, torch.float8_e4m3fn
PATHS = kernel_paths(gpu_block_k=64)
FLAT_PATHS = ["ptr", "ptr_small_m", "ptr_splitk", "tma", "tma_persistent_subtile", "tma_splitk", "ptr_streamk"]


def _canonical(arg):
    """A launcher argument as comparable data: descriptors by their fields."""
    if hasattr(arg, "block_shape"):
        return ("desc", arg.base.data_ptr(), list(arg.shape), list(arg.strides), list(arg.block_shape), arg.padding)
    return arg


def _calls(op):
    """(call, the plan cache it fills, an x that must be passed as a flattened copy) for each op
    and argument mix."""
    M, N, K = 9, 40, 96
    x, w = randn(2, M, K, dtype=BF16), randn(N, K, dtype=BF16)  # a 3-D x: flattened by the plan
    bias = randn(N, dtype=FP32)
    if op == "a16w16":
        y = poisoned((2, M, N), BF16)
        xt = randn(M, 2, K, dtype=BF16).transpose(0, 1)  # (2, M, K) that no view flattens: a copy per call
        return (lambda cfg: gemmkit.gemm_a16w16(xt, w, bias, activation="silu", y=y, config=cfg)), a16w16._plans, xt
    wq, ws = quant.quantize_fp8(w.float(), "row")
    if op == "a8w8_static":
        xq, xs = quant.quantize_fp8(x, "row")
        return (lambda cfg: gemmkit.gemm_a8w8(xq, wq, xs, ws.reshape(1, N), bias, config=cfg)), a8w8._plans, None
    return (lambda cfg: gemmkit.gemm_a8w8(x[0], wq, None, ws.reshape(N), bias, config=cfg)), a8w8._plans, None


@pytest.mark.skipif(ON_GPU, reason="CPU stand-in for the GPU tests below (needs the interpreter)")
@pytest.mark.parametrize("op", ["a16w16", "a8w8_static", "a8w8_dynamic"])
@pytest.mark.parametrize("path", FLAT_PATHS)
def test_flat_path_passes_the_regular_arguments(monkeypatch, op, path):
    call, plans, x_copied = _calls(op)
    plans.clear()
    call(PATHS[path])  # interpreted: builds the plan
    (plan,) = plans.values()
    gemm_plan = plan.fused if op == "a8w8_dynamic" else plan
    assert isinstance(gemm_plan, dense.DensePlan)

    recorded = []
    compiled = types.SimpleNamespace(function="compiled kernel")
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 1234, raising=False)
    monkeypatch.setattr(plan_mod, "_get_device", lambda: gemm_plan.device_index)
    monkeypatch.setattr(dense, "_get_device", lambda: gemm_plan.device_index)
    gemm_plan.launch.kernel = compiled
    gemm_plan.launch.direct = (compiled, lambda *args: recorded.append(args), ("lead",))

    # workspaces must stay allocated until the launch (else the counters may get the same block)
    allocated, real_empty, real_counters = [], torch.empty_strided, dense.split_k_counters

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        allocated.append(weakref.ref(t))
        return t

    monkeypatch.setattr(torch, "empty_strided", empty)

    def counters(*args):
        assert all(ref() is not None for ref in allocated[-1:]), "workspace freed before the launch"
        return real_counters(*args)

    monkeypatch.setattr(dense, "split_k_counters", counters)
    call(PATHS[path])  # regular path: CachedLaunch -> launch_direct; then binds the flat path
    assert gemm_plan.run != gemm_plan._call, "the flat path was not bound"
    call(PATHS[path])  # flat path
    assert len(recorded) == 2
    regular, flat = ([_canonical(a) for a in args] for args in recorded)
    assert len(regular) == len(flat)
    # (grid x, y, z, stream, function), lead, then a, b, c, ws, counters, ...: outputs and
    # workspaces are fresh allocations per call (unless y is given): compare all but their address
    # (the counters are one buffer reused by every call on the stream: the same address)
    c_slot, fresh = 5 + 1 + 2, {5 + 1 + 3} if gemm_plan.pieces else set()
    if op != "a16w16":
        fresh.add(c_slot)
    if x_copied is not None:
        fresh.add(c_slot - 2)
    for i, (r, f) in enumerate(zip(regular, flat)):
        if i == c_slot - 2 and x_copied is not None:
            x_ptrs = [a[1] if isinstance(a, tuple) else a for a in (r, f)]
            assert x_copied.data_ptr() not in x_ptrs and 0 not in x_ptrs, "x not flattened"
        elif i in fresh and isinstance(r, tuple):
            assert r[0] == f[0] == "desc" and r[2:] == f[2:] and f[1] != 0, (i, r, f)
        elif i in fresh:
            assert isinstance(r, int) and isinstance(f, int) and f != 0, (i, r, f)
        else:
            assert r == f, (i, r, f)


@pytest.mark.parametrize("path", FLAT_PATHS)
def test_repeated_calls_every_path(path):
    """Calls after the first (the flat path on a GPU) compute the same function on fresh data,
    fresh outputs and preallocated poisoned ones, 3-D inputs, bias and activation."""
    M, N, K = sizes((13, 40, 96), (300, 1000, 1024))
    w, bias = randn(N, K, dtype=BF16), randn(N, dtype=BF16)
    for i in range(4):
        x = randn(2, M, K, dtype=BF16)
        y = poisoned((2, M, N), BF16) if i % 2 else None
        out = gemmkit.gemm_a16w16(x, w, bias, activation="relu", y=y, config=PATHS[path])
        assert y is None or out is y
        assert_close(out, reference(x.reshape(-1, K), w, bias, "relu").reshape(2, M, N))
        w = randn(N, K, dtype=BF16)


@pytest.mark.parametrize("dynamic", [False, True])
def test_repeated_a8w8_calls(dynamic):
    """Static and dynamic (quantize-inside-the-GEMM) FP8 calls after the first, on fresh data."""
    M, N, K = sizes((3, 40, 96), (16, 6144, 4096))
    for _ in range(3):
        x, w = randn(M, K, dtype=BF16), randn(N, K, dtype=BF16)
        wq, ws = quant.quantize_fp8(w.float(), "row")
        xq, xs = quant.quantize_fp8(x, "row")
        out = gemmkit.gemm_a8w8(x, wq, None, ws.reshape(1, N)) if dynamic else gemmkit.gemm_a8w8(
            xq, wq, xs, ws.reshape(1, N))
        ref = reference(xq.float(), wq.float(), None, "none", xs, ws.reshape(1, N))
        assert_close(out, ref)


@pytest.mark.skipif(not ON_GPU, reason="device switching needs a GPU")
def test_flat_path_on_another_current_device():
    """A plan bound on device 0 called while another device is current still runs on its own."""
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU")
    x, w = randn(8, 64, dtype=BF16), randn(32, 64, dtype=BF16)
    for _ in range(2):
        gemmkit.gemm_a16w16(x, w)
    with torch.cuda.device(1):
        assert_close(gemmkit.gemm_a16w16(x, w), reference(x, w))


def test_launch_hooks_fall_back_to_triton(monkeypatch):
    """While a profiler hooks launches, calls go through Triton's regular launch."""
    calls = []
    monkeypatch.setattr(launcher, "hook_set", lambda knobs: True)
    monkeypatch.setattr(dense, "hook_set", lambda knobs: True)
    original = launcher.launch_jit
    monkeypatch.setattr(launcher, "launch_jit", lambda *a: (calls.append(1), original(*a))[1])
    x, w = randn(5, 64, dtype=BF16), randn(24, 64, dtype=BF16)
    for _ in range(3):
        assert_close(gemmkit.gemm_a16w16(x, w), reference(x, w))
    assert len(calls) == 3


def test_zeroed_slot_per_stream_and_capture(monkeypatch):
    """Which zeroed buffer a launch gets (core/plan.zeroed_slot), the CUDA side faked: one per device,
    stream and dtype eagerly; under capture one per capture (the driver's id as the tag, so that a
    new capture on the same stream gets a new buffer), and a fresh one where the capture has no id."""
    cuda = torch.device("cuda", 1)
    stream = {"raw": 77}
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: stream["raw"], raising=False)
    monkeypatch.setattr(plan_mod, "capturing", lambda: False)
    assert plan_mod.zeroed_slot(cuda, 1, torch.int32) == ((1, 77, torch.int32), None)
    stream["raw"] = 78
    assert plan_mod.zeroed_slot(cuda, 1, torch.float32) == ((1, 78, torch.float32), None)
    ids = iter([5, 5, 6, None])
    monkeypatch.setattr(plan_mod, "capturing", lambda: True)
    monkeypatch.setattr(plan_mod, "capture_id", lambda raw: next(ids))
    first, again, other = (plan_mod.zeroed_slot(cuda, 1, torch.int32) for _ in range(3))
    assert first == again == ((1, 78, torch.int32, "capture"), 5) and other == (first[0], 6)
    assert plan_mod.zeroed_slot(cuda, 1, torch.int32) is None
    cpu = torch.device("cpu")
    assert plan_mod.zeroed_slot(cpu, 0, torch.int32) == (("cpu", 0, torch.int32), None)


def test_zeroed_buffer_reused_per_slot_and_tag(monkeypatch):
    """zeroed_buffer hands out the slot's buffer while its tag matches and it is large enough,
    a new zeroed one otherwise, and a fresh one (not cached) where the slot is None."""
    slots = iter([(("k",), 5), (("k",), 5), (("k",), 5), (("k",), 6), None])
    monkeypatch.setattr(plan_mod, "zeroed_slot", lambda device, index, dtype: next(slots))
    monkeypatch.setattr(plan_mod, "_zeroed", {})
    cpu = torch.device("cpu")
    a = plan_mod.zeroed_buffer(cpu, 0, 10, torch.int32)
    assert a.numel() >= 10 and int(a.abs().sum()) == 0
    assert plan_mod.zeroed_buffer(cpu, 0, 100, torch.int32).data_ptr() == a.data_ptr()
    big = plan_mod.zeroed_buffer(cpu, 0, 10000, torch.int32)
    assert big.numel() >= 10000 and big.data_ptr() != a.data_ptr()
    assert plan_mod.zeroed_buffer(cpu, 0, 10, torch.int32).data_ptr() != big.data_ptr()  # a new capture
    fresh = plan_mod.zeroed_buffer(cpu, 0, 10, torch.int32)
    assert fresh.numel() == 10 and all(fresh.data_ptr() != b.data_ptr() for _, b in plan_mod._zeroed.values())
