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
    "config float warps": (lambda: ((_x(), _w()), {"config": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4.0}}), ValueError, "num_warps"),
    "config int TMA": (lambda: ((_x(), _w()), {"config": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "TMA": 1}}), ValueError, "TMA"),
    "config bool GROUP_M": (lambda: ((_x(), _w()), {"config": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": True}}), ValueError, "GROUP_M"),
    "y rows share memory": (lambda: ((_x(), _w()), {"y": torch.empty(8, dtype=BF16, device=DEVICE).expand(4, 8)}), ValueError, "share memory"),
    "y rows interleaved": (lambda: ((_x(), _w()), {"y": torch.empty(40, dtype=BF16, device=DEVICE).as_strided((4, 8), (4, 1))}), ValueError, "share memory"),
    "y columns share memory": (lambda: ((_x(), _w()), {"y": torch.empty(4, 1, dtype=BF16, device=DEVICE).expand(4, 8)}), ValueError, "share memory"),
    "y 3-D rows share memory": (lambda: ((_x(6).view(2, 3, 32), _w()), {"y": torch.empty(8, dtype=BF16, device=DEVICE).expand(2, 3, 8)}), ValueError, "y"),
    "x sparse": (lambda: ((_x().to_sparse(), _w()), {}), TypeError, "x is a sparse"),
    "w sparse": (lambda: ((_x(), _w().to_sparse()), {}), TypeError, "w is a sparse"),
    "bias sparse": (lambda: ((_x(), _w(), randn(8, dtype=BF16).to_sparse()), {}), TypeError, "bias is a sparse"),
    "y sparse": (lambda: ((_x(), _w()), {"y": torch.zeros(4, 8, dtype=BF16, device=DEVICE).to_sparse()}), TypeError, "y is a sparse"),
    "w sparse csr": (lambda: ((_x(), _w().to_sparse_csr()), {}), TypeError, "w is a sparse"),
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
    """gemm_a16w16 is differentiable (tests/test_autograd.py), but not into a preallocated y, and y itself never
    requires grad (torch refuses out= tensors that do)."""
    with pytest.raises(ValueError, match="y= .*autograd"):
        gemmkit.gemm_a16w16(_x().requires_grad_(), _w(), y=torch.zeros(4, 8, dtype=BF16, device=DEVICE))
    with pytest.raises(ValueError, match="y requires grad"):
        gemmkit.gemm_a16w16(_x(), _w(), y=torch.zeros(4, 8, dtype=BF16, device=DEVICE, requires_grad=True))
    with pytest.raises(ValueError, match="config= .*autograd"):
        gemmkit.gemm_a16w16(_x(), torch.nn.Parameter(_w()), config=dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16))


def test_config_types_are_part_of_the_plan_key():
    """A valid config cached under a key must not serve an invalid one that compares equal
    (TMA=1 == True, num_warps=4.0 == 4)."""
    base = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}
    for good, bad in (({"TMA": True}, {"TMA": 1}), ({"num_warps": 4}, {"num_warps": 4.0})):
        key = gemmkit.core.validate.config_key
        assert key(dict(base, **good)) != key(dict(base, **bad))
        with pytest.raises(ValueError, match="config"):
            gemmkit.GemmConfig.from_dict(dict(base, **bad))


def test_clear_caches_drops_plans(tmp_path, monkeypatch):
    """After a table is rewritten and clear_caches() called, shapes called before get the new
    config too (the ops' plans hold configs)."""
    import json

    from gemmkit.core import config as config_mod
    from gemmkit.core.device import device_info
    from gemmkit.ops import a16w16

    monkeypatch.undo()  # this test launches
    dev = device_info(torch.device(DEVICE))
    x, w = _x(), _w()

    def write(block_m):
        cfg = {"BLOCK_M": block_m, "BLOCK_N": 16, "BLOCK_K": 16}
        (tmp_path / dev.name).mkdir(exist_ok=True)
        (tmp_path / dev.name / "a16w16.json").write_text(json.dumps({"buckets": {"M_LEQ_16": cfg, "any": cfg}}))

    monkeypatch.setenv("GEMMKIT_CONFIG_DIR", str(tmp_path))
    try:
        write(16)
        config_mod.clear_caches()
        gemmkit.gemm_a16w16(x, w)
        assert [p.cfg.BLOCK_M for p in a16w16._plans.values()] == [16]
        write(32)
        config_mod.clear_caches()
        gemmkit.gemm_a16w16(x, w)
        assert [p.cfg.BLOCK_M for p in a16w16._plans.values()] == [32]
    finally:
        monkeypatch.delenv("GEMMKIT_CONFIG_DIR")
        config_mod.clear_caches()


def test_plan_cache_evicts_least_recently_used():
    from gemmkit.core.plan import PlanCache

    cache = PlanCache(capacity=3)
    built = []
    build = lambda name: built.append(name) or name  # noqa: E731
    for key in "abc":
        cache.plan_for(key, build, key)
    assert cache.plan_for("a", build, "a") == "a" and built == ["a", "b", "c"]  # a hit: a is now the newest
    cache.plan_for("d", build, "d")  # full: evicts b, the least recently used
    assert set(cache) == {"a", "c", "d"}
    assert cache.plan_for(None, build, "x") == "x" and None not in cache  # no key: built, never stored

