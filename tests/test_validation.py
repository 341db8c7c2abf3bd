"""Bad input raises a clear TypeError/ValueError naming the argument, before any launch."""

import pytest
import torch

import gemmkit
from gemmkit.core import launcher
from conftest import DEVICE, randn

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a kernel was launched for invalid input")

    monkeypatch.setattr(launcher, "launch_jit", fail)
    monkeypatch.setattr(launcher, "launch_compiled", fail)
    monkeypatch.setattr(launcher, "launch_direct", fail)


def _x(M=4, K=32, dtype=BF16):
    return randn(M, K, dtype=dtype)


def _w(N=8, K=32, dtype=BF16):
    return randn(N, K, dtype=dtype)


CASES = {
    "x not a tensor": (lambda: (([[1.0]], _w()), {}), TypeError, "x"),
    "w not a tensor": (lambda: ((_x(), None), {}), TypeError, "w"),
    "x fp32": (lambda: ((_x(dtype=FP32), _w()), {}), TypeError, "x"),
    "w int8": (lambda: ((_x(), torch.zeros(8, 32, dtype=torch.int8, device=DEVICE)), {}), TypeError, "w"),
    "x fp16 w bf16": (lambda: ((_x(dtype=FP16), _w()), {}), TypeError, "w"),
    "x 0-d": (lambda: ((torch.tensor(1.0, dtype=BF16, device=DEVICE), _w()), {}), ValueError, "x"),
    "w 1-d": (lambda: ((_x(), randn(32, dtype=BF16)), {}), ValueError, "w"),
    "w 3-d": (lambda: ((_x(), randn(2, 8, 32, dtype=BF16)), {}), ValueError, "w"),
    "K mismatch": (lambda: ((_x(K=32), _w(K=16)), {}), ValueError, "K"),
    "bias shape": (lambda: ((_x(), _w(), randn(9, dtype=BF16)), {}), ValueError, "bias"),
    "bias 2-d": (lambda: ((_x(), _w(), randn(1, 8, dtype=BF16)), {}), ValueError, "bias"),
    "bias int": (lambda: ((_x(), _w(), torch.zeros(8, dtype=torch.int32, device=DEVICE)), {}), TypeError, "bias"),
    "bias strided": (lambda: ((_x(), _w(), randn(16, dtype=BF16)[::2]), {}), ValueError, "bias"),
    "unknown activation": (lambda: ((_x(), _w()), {"activation": "gelu_erf"}), ValueError, "activation"),
    "activation not str": (lambda: ((_x(), _w()), {"activation": torch.relu}), ValueError, "activation"),
    "out_dtype int8": (lambda: ((_x(), _w()), {"out_dtype": torch.int8}), TypeError, "out_dtype"),
    "y wrong shape": (lambda: ((_x(), _w()), {"y": torch.empty(4, 9, dtype=BF16, device=DEVICE)}), ValueError, "y"),
    "y wrong dtype": (lambda: ((_x(), _w()), {"y": torch.empty(4, 8, dtype=FP16, device=DEVICE), "out_dtype": BF16}), TypeError, "y"),
    "y not a tensor": (lambda: ((_x(), _w()), {"y": [0.0]}), TypeError, "y"),
    "y no unit stride": (lambda: ((_x(), _w()), {"y": torch.empty(8, 16, dtype=BF16, device=DEVICE)[::2, ::2]}), ValueError, "y"),
    "x no unit stride": (lambda: ((_x(K=64)[:, ::2], _w()), {}), ValueError, "x"),
    "w no unit stride": (lambda: ((_x(), _w(K=64)[:, ::2]), {}), ValueError, "w"),
    "config unknown key": (lambda: ((_x(), _w()), {"config": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "BLOK": 1}}), ValueError, "config"),
    "config missing key": (lambda: ((_x(), _w()), {"config": {"BLOCK_M": 16}}), ValueError, "config"),
    "config not pow2": (lambda: ((_x(), _w()), {"config": {"BLOCK_M": 48, "BLOCK_N": 16, "BLOCK_K": 16}}), ValueError, "BLOCK_M"),
    "config tiny block": (lambda: ((_x(), _w()), {"config": {"BLOCK_M": 8, "BLOCK_N": 16, "BLOCK_K": 16}}), ValueError, "BLOCK_M"),
    "config warps": (lambda: ((_x(), _w()), {"config": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 3}}), ValueError, "num_warps"),
    "config ws without tma": (lambda: ((_x(), _w()), {"config": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "WARP_SPECIALIZE": True}}), ValueError, "WARP_SPECIALIZE"),
    "config type": (lambda: ((_x(), _w()), {"config": "fast"}), TypeError, "config"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case):
    make, exc, word = CASES[case]
    args, kwargs = make()
    with pytest.raises(exc, match=word):
        gemmkit.gemm_a16w16(*args, **kwargs)


def test_cpu_tensors_outside_interpreter(monkeypatch):
    from gemmkit.core import validate

    monkeypatch.setattr(validate, "interpreter_active", lambda: False)
    x, w = torch.randn(4, 32).to(BF16), torch.randn(8, 32).to(BF16)
    with pytest.raises(ValueError, match="x is on cpu"):
        gemmkit.gemm_a16w16(x, w)


def test_mismatched_devices():
    other = "meta"  # a device that is neither this test's device nor usable by the kernels
    with pytest.raises(ValueError, match="w is on meta"):
        gemmkit.gemm_a16w16(_x(), torch.empty(8, 32, dtype=BF16, device=other))
    with pytest.raises(ValueError, match="bias is on meta"):
        gemmkit.gemm_a16w16(_x(), _w(), torch.empty(8, dtype=BF16, device=other))
    with pytest.raises(ValueError, match="y is on meta"):
        gemmkit.gemm_a16w16(_x(), _w(), y=torch.empty(4, 8, dtype=BF16, device=other))



def test_autograd_inputs_refused():
    with pytest.raises(ValueError, match="x requires grad"):
        gemmkit.gemm_a16w16(_x().requires_grad_(), _w())
    with pytest.raises(ValueError, match="w requires grad"):
        gemmkit.gemm_a16w16(_x(), torch.nn.Parameter(_w()))
