"""Test setup: the same tests run on CUDA (larger sizes) or, without a GPU, under the Triton
interpreter on CPU tensors (small sizes). The interpreter must be chosen before gemmkit defines
its kernels, hence here, before any test module imports them."""

import atexit
import os
import shutil
import tempfile
import zlib

import pytest
import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

# The tests read the shipped config tables only, never the tables you tuned (the user config
# directory), and never tune on their own.
os.environ["GEMMKIT_CONFIG_DIR"] = tempfile.mkdtemp(prefix="gemmkit-test-configs-")
atexit.register(shutil.rmtree, os.environ["GEMMKIT_CONFIG_DIR"], True)
os.environ.pop("GEMMKIT_AUTOTUNE", None)

DEVICE = "cuda" if ON_GPU else "cpu"
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def pytest_report_header(config):
    if ON_GPU:
        return f"gemmkit tests on {torch.cuda.get_device_name()}"
    return "gemmkit tests under the Triton interpreter (TRITON_INTERPRET=1, CPU tensors)"


def sizes(cpu, gpu):
    """Pick the CPU (interpreter) or GPU variant of a parameter list."""
    return gpu if ON_GPU else cpu


def kernel_paths(gpu_block_k):
    """Configs that force each kernel path. CPU sizes keep the interpreter quick while still giving
    several tiles, several K iterations and ragged edges; GPU sizes are realistic (BLOCK_K: one
    128-byte line of the operand type)."""
    big = sizes(dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32),
                dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=gpu_block_k, num_warps=8))
    small = sizes(dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64),
                  dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=2 * gpu_block_k, num_stages=4))
    return {
        "ptr": dict(big),
        "ptr_small_m": dict(small),
        "ptr_persistent": dict(big, PERSISTENT=True),
        "ptr_splitk": dict(small, SPLIT_K=3),
        "tma": dict(big, TMA=True),
        "tma_persistent": dict(big, TMA=True, PERSISTENT=True),
        "tma_persistent_subtile": dict(big, TMA=True, PERSISTENT=True, EPILOGUE_SUBTILE=True),
        "tma_warp_specialized": dict(big, TMA=True, PERSISTENT=True, WARP_SPECIALIZE=True),
        "tma_splitk": dict(big, TMA=True, SPLIT_K=2),
        "ptr_streamk": dict(big, PERSISTENT=True, STREAM_K=True),
        "tma_streamk": dict(big, TMA=True, PERSISTENT=True, STREAM_K=True),
        "tma_streamk_small_m": dict(small, TMA=True, PERSISTENT=True, STREAM_K=True, EPILOGUE_SUBTILE=True),
    }


def randn(*shape, dtype, device=DEVICE, scale=1.0):
    return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype)


def poisoned(shape, dtype, device=DEVICE):
    """An output buffer full of NaN: any element a kernel forgets to write fails the check."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


ACT_REF = {
    "none": lambda t: t,
    "relu": torch.relu,
    "silu": torch.nn.functional.silu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
}


def reference(x, w, bias=None, activation="none", x_scale=None, w_scale=None):
    """float64 reference of activation(x @ w.T * scales + bias), computed by torch."""
    acc = x.double() @ w.double().T
    if x_scale is not None:
        acc = acc * x_scale.double().reshape(-1, 1) if x_scale.numel() > 1 else acc * x_scale.double().reshape(())
    if w_scale is not None:
        acc = acc * w_scale.double().reshape(1, -1) if w_scale.numel() > 1 else acc * w_scale.double().reshape(())
    if bias is not None:
        acc = acc + bias.double()
    return ACT_REF[activation or "none"](acc)


def assert_close(out, ref, dtype=None, tol=None):
    dtype = dtype or out.dtype
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not torch.isnan(out).any(), "output has NaN (unwritten elements or bad math)"
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    tol = TOL[dtype] if tol is None else tol
    assert err < tol, f"relative error {err:.3e} >= {tol:.0e}"


@pytest.fixture(autouse=True)
def _seed(request):
    # fresh data per test, reproducible per test id
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def check_refused(monkeypatch, op, args, exc, word):
    """op(*args) raises `exc` matching `word` (the argument's name) before any kernel launch."""
    from gemmkit.core import launcher

    monkeypatch.setattr(launcher, "launch_jit", lambda *a: pytest.fail("launched"))
    with pytest.raises(exc, match=word):
        op(*args)


def check_compiles(program, args, y_shape, backend):
    """`program(*args, y)` traces with no graph break and, compiled with fullgraph=True, returns
    what it does eagerly; returns the compiled call's y (its preallocated output)."""
    ref = program(*args, torch.empty(y_shape, device=DEVICE))
    torch._dynamo.reset()
    assert torch._dynamo.explain(program)(*args, torch.empty(y_shape, device=DEVICE)).graph_break_count == 0
    torch._dynamo.reset()
    y = torch.empty(y_shape, device=DEVICE)
    out = torch.compile(program, fullgraph=True, backend=backend)(*args, y)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    return y


def replay_with_new_inputs(call, refresh, replays=1):
    """Capture call() in a CUDA graph (run it once before: plans built and compiled outside the
    capture), run refresh() (new values copied into the captured inputs), replay, and return the
    graph's output."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    refresh()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return out


def spy_plans(monkeypatch, cls, clear_caches):
    """Generator for a fixture: yields the list of the `cls` plans built while the test runs (the
    plan caches cleared by clear_caches() before and after, so that every plan is built anew)."""
    plans = []
    real = cls.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        plans.append(self)

    monkeypatch.setattr(cls, "__init__", spy)
    clear_caches()
    yield plans
    clear_caches()


def assert_compiles(model, x, backend):
    """model(x) under torch.compile(fullgraph=True, backend): no graph break, the eager result (no grad)."""
    with torch.no_grad():
        ref = model(x)
        torch._dynamo.reset()
        assert torch._dynamo.explain(model)(x).graph_break_count == 0
        torch._dynamo.reset()
        out = torch.compile(model, fullgraph=True, backend=backend)(x)
    torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)
