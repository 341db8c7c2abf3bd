"""User config tables over the shipped ones, `gemmkit configs show`, the tuner's new requests
(--shape, --from-model, user table by default), GEMMKIT_AUTOTUNE's hook. CPU only, fast."""

import dataclasses
import io
import json

import pytest
import torch

import gemmkit
from gemmkit import cli
from gemmkit.core import config as cfgmod
from gemmkit.core.config import config_source, load_table, select_config, user_config_dir
from gemmkit.core.formats import dense
from gemmkit.core.device import INTERPRETER_DEVICE, KNOWN_DEVICES, DeviceInfo, known_device
from gemmkit.tools import autotune, registry, tune
from gemmkit.tools.configs import describe

H100 = known_device("NVIDIA_H100_80GB_HBM3")
BF16 = dense(torch.bfloat16)


def entry(bm):
    return {"BLOCK_M": bm, "BLOCK_N": 64, "BLOCK_K": 64}


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """Write tables for H100 into a shipped and a user directory: write(layer, table)."""
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    monkeypatch.setattr(cfgmod, "CONFIG_DIR", shipped)
    monkeypatch.setenv("GEMMKIT_CONFIG_DIR", str(user))
    cfgmod.clear_caches()

    def write(layer, table, op="a16w16", device=H100.name):
        path = (user if layer == "user" else shipped) / device / f"{op}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(table))
        cfgmod.clear_caches()
        return path

    yield write
    cfgmod.clear_caches()


def test_user_table_merges_over_shipped_per_shape_and_bucket(tables):
    tables("shipped", {"buckets": {"M_LEQ_16": entry(16), "any": entry(128)},
                       "shapes": {"4096,4096": {"M_LEQ_16": entry(16), "M_LEQ_64": entry(64)}}})
    tables("user", {"buckets": {"any": entry(256)},
                    "shapes": {"4096,4096": {"M_LEQ_64": entry(32)}, "100,200": {"M_LEQ_16": entry(32)}}})

    def pick(M, N, K):
        src = config_source("a16w16", M, N, K, H100)
        return select_config("a16w16", M, N, K, H100, BF16, BF16, 2).BLOCK_M, src[1], src[0]

    assert pick(16, 4096, 4096) == (16, "shipped table shape entry", entry(16))  # the user's entry lacks M_LEQ_16
    assert pick(64, 4096, 4096) == (32, "user table shape entry", entry(32))  # overridden per bucket
    assert pick(8, 100, 200) == (32, "user table shape entry", entry(32))  # a shape only the user tuned
    assert pick(1000, 4096, 4096)[:2] == (256, "user table generic bucket")  # no shape bucket: user "any"
    # an untuned shape at small M: the nearest tuned shape's entry (here the user's (100, 200)), its
    # 32 rows cut to M's 16 (fit_rows)
    assert pick(10, 1, 1)[:2] == (16, "user table nearest shape 100,200")
    assert pick(10, 4000, 5000)[:2] == (16, "shipped table nearest shape 4096,4096")
    assert pick(300, 1, 1)[:2] == (256, "user table generic bucket")
    assert config_source("a16w16", 16, 4096, 4096, INTERPRETER_DEVICE) == (None, "derived from the device")
    merged = load_table(H100.name, "a16w16")
    assert merged["shapes"]["4096,4096"] == {"M_LEQ_16": entry(16), "M_LEQ_64": entry(32)}
    assert merged["buckets"] == {"M_LEQ_16": entry(16), "any": entry(256)}
    assert load_table(H100.name, "a16w16", "user")["buckets"] == {"any": entry(256)}
    with pytest.raises(ValueError, match="layer"):
        load_table(H100.name, "a16w16", "mine")


def test_user_table_alone_and_default_directory(tables, tmp_path, monkeypatch):
    tables("user", {"shapes": {"4096,4096": {"M_LEQ_16": entry(32)}}}, op="a8w8_fp8", device="NEW_GPU")
    dev = DeviceInfo("NEW_GPU", (9, 0), 132, 232448, 60 << 20)
    assert config_source("a8w8_fp8", 16, 4096, 4096, dev) == (entry(32), "user table shape entry")
    assert config_source("a8w8_fp8", 256, 4096, 4096, dev) == (None, "derived from the device")
    monkeypatch.delenv("GEMMKIT_CONFIG_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_config_dir() == tmp_path / "xdg" / "gemmkit" / "configs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_config_dir() == tmp_path / "home" / ".cache" / "gemmkit" / "configs"


def test_other_hopper_parts_read_the_h100_table_until_they_have_their_own(tables):
    """An H200 (or H800, GH200, H100 NVL) without a shipped table of its own for an op reads the
    H100's, re-fitted to itself; its own shipped table, once there, replaces it; user tables stay
    per device; other GPUs derive."""
    h200 = known_device("NVIDIA_H200")
    tables("shipped", {"shapes": {"4096,4096": {"M_LEQ_16": entry(16)}}})
    assert config_source("a16w16", 8, 4096, 4096, h200) == (
        entry(16), "shipped table (NVIDIA_H100_80GB_HBM3's, the Hopper fallback) shape entry")
    assert select_config("a16w16", 8, 4096, 4096, h200, BF16, BF16, 2).BLOCK_M == 16
    for name in ("NVIDIA_H800", "NVIDIA_GH200_480GB", "NVIDIA_H100_NVL"):
        assert cfgmod.shipped_device(name, "a16w16") == H100.name
    a100 = DeviceInfo("NVIDIA_A100_SXM4_80GB", (8, 0), 108, 166912, 40 << 20)
    assert config_source("a16w16", 8, 4096, 4096, a100) == (None, "derived from the device")
    assert cfgmod.table_path(h200.name, "a16w16", "shipped") == cfgmod.CONFIG_DIR / h200.name / "a16w16.json"  # tune writes
    assert cfgmod.table_path(h200.name, "a16w16", "shipped", read=True).parent.name == H100.name
    tables("shipped", {"shapes": {"4096,4096": {"M_LEQ_16": entry(32)}}}, device=h200.name)
    assert config_source("a16w16", 8, 4096, 4096, h200) == (entry(32), "shipped table shape entry")
    tables("user", {"shapes": {"4096,4096": {"M_LEQ_16": entry(64)}}}, device=H100.name)
    assert config_source("a16w16", 8, 4096, 4096, h200)[0] == entry(32)  # the H100 user's table is the H100's


def test_known_devices():
    assert known_device("NVIDIA H100 80GB HBM3") is H100 and H100.num_sms == 132
    h200 = known_device("NVIDIA_H200")
    assert h200.l2_bytes > H100.l2_bytes and h200.smem_per_block == H100.smem_per_block
    assert known_device("TRITON_INTERPRETER") is INTERPRETER_DEVICE
    with pytest.raises(ValueError, match="known: NVIDIA_H100_80GB_HBM3"):
        known_device("NVIDIA A100")
    from gemmkit.tools import codegen

    assert codegen.H100 is KNOWN_DEVICES["NVIDIA_H100_80GB_HBM3"]


def test_table_op_maps_every_table():
    for table in cfgmod.TABLES:
        assert registry.table_op(table).table == table
    assert registry.table_op("a8w8_fp8").name == "a8w8" and registry.table_op("a8w8_fp8_dynamic").name == "a8w8_dynamic"
    with pytest.raises(ValueError, match="a16w16"):
        registry.table_op("nope")


def test_configs_show_on_this_device(tables, capsys):
    assert cli.main(["configs", "show", "--op", "a16w16", "a8w8", "--shape", "16", "4096", "4096"]) == 0
    out = capsys.readouterr().out
    dev = gemmkit.device_info()
    assert f"device: {dev.name}" in out
    assert "a16w16: table a16w16, bf16 operands, bf16 output" in out and "a8w8: table a8w8_fp8, e4m3" in out
    assert out.count("M=16 N=4096 K=4096: ") == 2
    if dev.interpreter:
        assert "the Triton interpreter's profile" in out and "--device-name NVIDIA_H100_80GB_HBM3" in out
        assert out.count("[derived from the device]") == 2
    cli.main(["configs", "show"])  # defaults: one op per table, the illustrative shapes
    out = capsys.readouterr().out
    for table in cfgmod.TABLES:
        assert f"table {table}," in out
    assert out.count(" N=") == len(cfgmod.TABLES) * 5


def test_configs_show_for_a_named_device(tables, capsys):
    wide = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "TMA": True, "num_warps": 8, "num_stages": 4}
    tables("shipped", {"shapes": {"4096,4096": {"M_LEQ_16": entry(16), "any": wide}}})
    user = tables("user", {"shapes": {"4096,4096": {"M_LEQ_16": dict(entry(32), SPLIT_K=2)}}})
    argv = ["configs", "show", "--device-name", "NVIDIA_H100_80GB_HBM3", "--op", "a16w16",
            "--shape", "16", "4096", "4096", "--shape", "4096", "4096", "4096", "--out-dtype", "fp32"]
    cli.main(argv)
    out = capsys.readouterr().out
    assert "device: NVIDIA_H100_80GB_HBM3 (its known profile: 132 SMs" in out
    assert f"user table: {user}\n" in out and "fp32 output" in out
    assert "M=16 N=4096 K=4096: 32x64x64 GROUP_M=8 SPLIT_K=2 warps=4 stages=3  [user table shape entry]" in out
    # its fp32 output tile does not fit beside four stages: split epilogue, three stages
    assert ("M=4096 N=4096 K=4096: 128x256x64 GROUP_M=8 SPLIT_K=1 warps=8 stages=3 TMA EPILOGUE_SUBTILE  "
            "[shipped table shape entry, fitted to the shared memory]") in out
    # an sm_90 profile: where the warp-specialized Gluon kernel takes the call instead, and its tiles
    assert out.count("Gluon kernel runs it instead") == 1
    assert "[shipped table shape entry, fitted to the shared memory]\n    on sm_90 the warp-specialized Gluon kernel " \
           "runs it instead: 128 x 256 tiles (128 + 128) (core/hopper_ws.py" in out
    user.unlink()
    cfgmod.clear_caches()
    cli.main(argv)
    out = capsys.readouterr().out
    assert "(none)" in out and "M=16 N=4096 K=4096: 16x64x64 GROUP_M=8 SPLIT_K=1 warps=4 stages=3  [shipped table shape entry]" in out


def test_configs_show_grouped_and_gated_as_the_ops_resolve_them(capsys):
    """The grouped and gated ops resolve their configs through their own rules (one piece per tile, the grouped
    tiles' TMA loads; the gated GEMM's whole tiles): configs show prints what those give, not the plain lookup."""
    from gemmkit.core.grouped import family_config
    from gemmkit.ops.fused import _gated_config
    from gemmkit.ops.grouped import grouped_config
    from gemmkit.tools.registry import get_op

    cli.main(["configs", "show", "--device-name", "NVIDIA_H100_80GB_HBM3", "--op", "grouped_a16w16", "ff_gated",
              "--shape", "16", "14336", "4096", "--shape", "256", "4096", "14336"])
    out = capsys.readouterr().out
    g, f = get_op("grouped_a16w16"), get_op("ff_gated")
    for M, N, K in ((16, 14336, 4096), (256, 4096, 14336)):
        grouped = family_config(grouped_config("a16w16", False, None, M, N, K, H100, *g.formats, 2))
        assert f"M={M} rows per expert N={N} K={K}: {describe(grouped)}  [" in out
        gated = _gated_config(None, "ff_gated_a16w16", M, N, K, H100, *f.formats, 2)
        assert f"M={M} N={N} K={K}: {describe(gated)}  [" in out and gated.SPLIT_K == 1 and grouped.SPLIT_K == 1


@pytest.mark.parametrize("argv", [["show", "--device-name", "NVIDIA A100"], ["show", "--op", "quant_fp8_row"],
                                  ["show", "--op", "nope"], ["show", "--shape", "0", "1", "1"], ["show", "--shape", "1", "2"],
                                  ["show", "--dtype", "fp64"], ["show", "--op", "a16w16", "--dtype", "e4m3"], []])
def test_configs_show_argument_errors(argv):
    from gemmkit.tools import configs

    with pytest.raises(SystemExit) as e:
        configs.main(argv)
    assert e.value.code != 0


# --from-model ------------------------------------------------------------------------------


class TinyModel(torch.nn.Module):
    built_on = []

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.block = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(128, 64, bias=False), torch.nn.Linear(64, 128))
        self.conv = torch.nn.Conv1d(4, 4, 3)
        TinyModel.built_on.append(self.fc1.weight.device.type)


tiny_instance = torch.nn.Sequential(torch.nn.Linear(8, 16))
not_a_model = 3


def no_linear():
    return torch.nn.ReLU()


def broken():
    raise RuntimeError("needs weights")


def test_from_model_collects_linear_layers():
    assert registry.linear_shapes(TinyModel(), "m") == [("m.fc1", 128, 64), ("m.block.1", 64, 128)]
    TinyModel.built_on.clear()
    assert registry.import_model_shapes(f"{__name__}:TinyModel") == [
        (f"{__name__}:TinyModel.fc1", 128, 64), (f"{__name__}:TinyModel.block.1", 64, 128)]
    assert TinyModel.built_on == ["meta"]  # no weights allocated
    assert registry.import_model_shapes(f"{__name__}:tiny_instance")[0][1:] == (16, 8)
    for spec, why in [("nocolon", "MODULE:ATTR"), ("no_such_module_xyz:m", "ModuleNotFoundError"),
                      (f"{__name__}:missing", "AttributeError"), (f"{__name__}:not_a_model", "not an nn.Module"),
                      (f"{__name__}:no_linear", "no nn.Linear"), (f"{__name__}:broken", "needs weights")]:
        with pytest.raises(SystemExit, match=why):
            registry.import_model_shapes(spec)


# gemmkit tune ------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["a16w16", "--shape", "16", "64"], ["a16w16", "--shape", "0", "64", "64"], ["a16w16", "--shape", "16", "64", "-1"],
    ["a16w16", "--from-model", "nocolon"], ["a16w16", "--from-model", f"{__name__}:not_a_model"], ["a16w16"],
    ["a16w16", "--shape", "16", "64", "64", "--out", "t.json", "--package"],
    ["a16w16", "--shape", "16", "64", "64", "--workers", "-1"], ["quant_fp8_row", "--shape", "16", "64", "64"],
    ["a16w16", "--model", "heldout-phi3-mini", "--package"]])
def test_tune_argument_errors_come_before_the_gpu_check(argv):
    with pytest.raises(SystemExit) as e:
        tune.main(argv)
    assert e.value.code != 0 and "CUDA" not in str(e.value)


def test_tune_requests_and_default_table(tables, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(tune.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tune, "device_info", lambda: H100)
    monkeypatch.setattr(tune, "tune", lambda *a, **k: calls.append((a, k)))
    tune.main(["a16w16", "--shape", "100", "4096", "4096", "--shape", "8", "1", "2", "--shapes", "64", "128",
               "--m", "16", "1", "--from-model", f"{__name__}:TinyModel"])
    (op, problems, dtype, out, cache, workers, *_), kw = calls[-1]
    assert (op, dtype, kw["buckets"]) == ("a16w16", "bf16", True)
    # --from-model, then --shapes, at each --m; then each --shape as given (tune() drops repeats)
    assert problems == [(1, 128, 64), (16, 128, 64), (1, 64, 128), (16, 64, 128), (1, 64, 128), (16, 64, 128),
                        (100, 4096, 4096), (8, 1, 2)]
    assert out == user_config_dir() / H100.name / "a16w16.json" and str(out).startswith(str(tmp_path / "user"))
    assert cache.parent == out.parent and cache.suffix == ".jsonl"
    tune.main(["a8w8", "--shape", "16", "64", "64", "--package", "--no-buckets", "--workers", "0"])
    (op, problems, dtype, out, cache, workers, *_), kw = calls[-1]
    assert out == cfgmod.CONFIG_DIR / H100.name / "a8w8_fp8.json" and workers == 0 and not kw["buckets"]
    assert problems == [(16, 64, 64)]


def test_tune_seeded_from_another_devices_records(tables, monkeypatch, tmp_path):
    """--seed: a problem the other device measured is tuned over its fastest configs there (sustained
    times first), one it never measured over the whole search space; errors are never seeds."""
    recs = [{"M": 16, "N": 64, "K": 64, "dtype": "bf16", "cfg": tune.cfg_key(cfgmod.GemmConfig(16, bn, 64)), **t}
            for bn, t in ((16, {"us": 5.0}), (32, {"us": 3.0}), (64, {"us": 4.0, "us_sustained": 4.5}),
                          (128, {"error": "wrong result"}))]
    seed_path = tmp_path / "h100.jsonl"
    seed_path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    seed = tune.load_cache(seed_path)
    assert [c.BLOCK_N for c in tune.seeded_candidates(seed, (16, 64, 64), "bf16", 2)] == [64, 32]
    assert [c.BLOCK_N for c in tune.seeded_candidates(seed, (16, 64, 64), "bf16", 8)] == [64, 32, 16]
    assert tune.seeded_candidates(seed, (256, 64, 64), "bf16", 8) is None
    calls = []
    monkeypatch.setattr(tune.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tune, "device_info", lambda: known_device("NVIDIA_H200"))
    monkeypatch.setattr(tune, "tune", lambda *a, **k: calls.append((a, k)))
    tune.main(["a16w16", "--shape", "16", "64", "64", "--package", "--seed", str(seed_path), "--seed-top", "3"])
    (_, _, _, out, *_), kw = calls[-1]
    assert kw["seed_top"] == 3 and len(kw["seed"]) == 4
    assert out == cfgmod.CONFIG_DIR / "NVIDIA_H200" / "a16w16.json"  # the H200's own table, not the H100's it reads
    for bad in (["--seed", str(tmp_path / "none.jsonl")], ["--seed", str(seed_path), "--seed-top", "0"]):
        with pytest.raises(SystemExit):
            tune.main(["a16w16", "--shape", "16", "64", "64", *bad])


def test_precompile_without_workers_runs_in_this_process(monkeypatch):
    seen = []
    monkeypatch.setattr(tune, "_compile_worker", lambda *a: seen.append(a) or (None, (("h", (1,)),)))
    cfg = cfgmod.GemmConfig(16, 16, 32)
    res = tune.precompile("a16w16", [(16, 32, 64, "bf16", cfg), (32, 32, 64, "bf16", cfg)], 0, verbose=False)
    assert [s[1] for s in seen] == [16, 32]
    assert res[(16, 32, 64, tune.cfg_key(cfg))] == (None, (("h", (1,)),))


def test_write_table_without_buckets(tmp_path):
    key = tune.cfg_key(cfgmod.GemmConfig(32, 64, 64))
    out = tmp_path / "t.json"
    out.write_text(json.dumps({"buckets": {"any": entry(16)}}))
    table = tune.write_table("a16w16", "bf16", {(16, 100, 200, "bf16", key): {"us": 1.0}}, out, "c", "DEV", buckets=False)
    assert table["buckets"] == {"any": entry(16)} and table["shapes"]["100,200"]["M_LEQ_16"]["BLOCK_M"] == 32


def test_plain_progress_prints_an_eta():
    ticks = iter([0.0, 20.0, 40.0, 3725.0])
    buf = io.StringIO()
    bar = tune._PlainProgress(4, "measure", out=buf, clock=lambda: next(ticks))
    bar.update()  # t = 20: 1 of 4 took 20 s
    bar.update()  # t = 40
    bar.update(2)  # t = 3725: done, no ETA
    assert buf.getvalue().splitlines() == ["measure: 1/4 (20 s, ETA 1 min 00 s)", "measure: 2/4 (40 s, ETA 40 s)",
                                           "measure: 4/4 (1 h 02 min)"]
    silent = tune._PlainProgress(4, "x", out=None)
    silent.update(4)
    assert silent.n == 4
    assert tune.format_seconds(59.6) == "1 min 00 s" and tune.format_seconds(-3) == "0 s"


# GEMMKIT_AUTOTUNE ---------------------------------------------------------------------------


@pytest.fixture
def autotuning(tables, monkeypatch):
    """Autotune on, a CUDA device that is not capturing, a fake tuner: returns its calls."""
    calls = []
    monkeypatch.setenv("GEMMKIT_AUTOTUNE", "1")
    monkeypatch.setattr(autotune, "_tried", set())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(tune, "tune", lambda *a, **k: calls.append((a, k)))
    tables("shipped", {"shapes": {"4096,4096": {"M_LEQ_16": entry(16)}}})
    return calls


def test_autotune_tunes_an_untuned_problem_once(autotuning, capsys):
    assert autotune.maybe_autotune("a8w8_fp8", 100, 123, 456, H100, torch.float8_e4m3fn)
    (op, problems, dtype, out, cache), kw = autotuning[0][0][:5], autotuning[0][1]
    assert (op, problems, dtype) == ("a8w8", [(100, 123, 456)], "e4m3")
    assert out == user_config_dir() / H100.name / "a8w8_fp8.json"
    assert kw["workers"] == 0 and kw["buckets"] is False and kw["verbose"] is False
    assert not autotune._tuning
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "autotuned a8w8_fp8 M=100 (bucket <= 128) N=123 K=456 (e4m3)" in err[0]
    assert str(out) in err[0]
    assert not autotune.maybe_autotune("a8w8_fp8", 128, 123, 456, H100)  # same bucket: tried already
    assert autotune.maybe_autotune("a16w16", 20000, 4096, 4096, H100)  # "any" bucket, no entry
    assert autotuning[-1][0][2] == "bf16"


def test_autotune_refuses(autotuning, monkeypatch, capsys):
    assert not autotune.maybe_autotune("a16w16", 16, 4096, 4096, H100)  # has a shape entry
    assert not autotune.maybe_autotune("a16w16", 0, 4096, 4096, H100)  # nothing to tune
    monkeypatch.setattr(autotune, "_tuning", True)
    assert not autotune.maybe_autotune("a16w16", 16, 1, 1, H100)  # called from the tuner's own GEMMs
    monkeypatch.setattr(autotune, "_tuning", False)
    assert not autotune.maybe_autotune("a16w16", 16, 1, 1, INTERPRETER_DEVICE)  # not CUDA
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not autotune.maybe_autotune("a16w16", 16, 1, 1, H100)  # capturing a graph
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not autotune.maybe_autotune("a16w16", 16, 1, 1, H100)  # tracing for torch.compile
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not autotune.maybe_autotune("a16w16", 16, 1, 1, H100)  # no CUDA
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for off in ("0", ""):
        monkeypatch.setenv("GEMMKIT_AUTOTUNE", off)
        assert not autotune.maybe_autotune("a16w16", 16, 1, 1, H100)
    assert autotuning == [] and capsys.readouterr().err == ""
    monkeypatch.setenv("GEMMKIT_AUTOTUNE", "1")

    def failing(*a, **k):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(tune, "tune", failing)
    assert not autotune.maybe_autotune("a16w16", 16, 1, 1, H100) and not autotune._tuning
    assert "autotuning a16w16 M=16 (bucket <= 16) N=1 K=1 failed" in capsys.readouterr().err
    assert not autotune.maybe_autotune("a16w16", 16, 1, 1, H100, "fp32")  # tried once per process


@pytest.mark.parametrize("rows", [8, 64, 1024, 4096])
def test_gated_grouped_configs_keep_two_accumulators_in_registers(rows):
    """The gated grouped GEMM (moe_mlp's gate/up) never takes a derived tile wider than 128 x 128
    per accumulator (Mixtral-8x7B at 1024 rows per expert derived 128 x 256: two accumulators of
    that size spilled, 6x slower on the H100), with 8 warps from 128 x 128."""
    from gemmkit.core.config import gated_tiles
    from gemmkit.core.grouped import family_config_for

    two_b = dataclasses.replace(BF16, bits=32)  # two B tiles per K step, as ops/grouped.py counts them
    cfg = gated_tiles(family_config_for(None, rows, 14336, 4096, H100, BF16, two_b, 2, None))
    assert cfg.BLOCK_M * cfg.BLOCK_N <= 128 * 128
    assert cfg.num_warps == (8 if cfg.BLOCK_M * cfg.BLOCK_N == 128 * 128 else 4)
    assert gated_tiles(cfgmod.GemmConfig(128, 256, 64, num_warps=8)) == cfgmod.GemmConfig(128, 128, 64, num_warps=8)


@pytest.mark.parametrize("M", [1, 16, 64, 256, 1024])
def test_gated_search_space_takes_only_whole_tiles(M):
    """`gemmkit tune ff_gated` enumerates only configs the gated GEMM runs: whole tiles (no
    split-K or stream-K), at most 128 x 128 per accumulator, two B tiles' shared memory."""
    op = registry.get_op("ff_gated")
    cands = registry.search_space(op, M, 14336, 4096, H100)
    assert cands
    two_b = dataclasses.replace(BF16, bits=32)
    for c in cands:
        assert c.SPLIT_K == 1 and not c.STREAM_K and c.BLOCK_M * c.BLOCK_N <= 128 * 128, c
        assert c.fits(H100, BF16, two_b, 2), c


def test_heldout_shapes_are_in_no_shipped_table():
    """models.json's heldout-* layers judge the configs of untuned shapes: no shipped table of any
    device holds one of them as a shape entry."""
    heldout = {(N, K) for m in registry.load_models().values() if m.get("heldout") for N, K in m["layers"].values()}
    assert len(heldout) >= 20
    tuned = [m for m in registry.load_models().values() if not m.get("heldout")]
    assert not heldout & {tuple(nk) for m in tuned for nk in m["layers"].values()}
    for path in cfgmod.CONFIG_DIR.glob("*/*.json"):
        shapes = {tuple(int(v) for v in nk.split(",")) for nk in json.loads(path.read_text()).get("shapes", {})}
        assert not heldout & shapes, path


@pytest.mark.parametrize("table,match", [
    ("{not json", "cannot be read as JSON"), ("", "cannot be read as JSON"), ([1, 2], "expected an object"),
    ({"shapes": None}, "shapes: expected an object"), ({"rows": {}}, "unknown keys"),
    ({"shapes": {"32x64": {"M_LEQ_16": entry(16)}}}, "is not \"N,K\""),
    ({"shapes": {"4096,4096": {"M<=16": entry(16)}}}, "bucket key 'M<=16'"),
    ({"shapes": {"4096,4096": {"M_LEQ_48": entry(16)}}}, "bucket key 'M_LEQ_48'"),
    ({"buckets": {"M_LEQ_16": dict(entry(16), num_warps=3)}}, "buckets M_LEQ_16: config: num_warps=3"),
    ({"shapes": {"4096,4096": {"any": dict(entry(16), FOO=1)}}}, "shapes 4096,4096 any: config: unknown keys"),
    ({"shapes": {"4096,4096": {"any": "16x64x64"}}}, "shapes 4096,4096 any: config must be")])
def test_bad_user_table_named_in_the_error(tables, table, match):
    """A hand-edited or truncated user table: one ValueError naming the file and the entry, at the first lookup
    (not a JSONDecodeError / AttributeError / IndexError from deep inside, nor a silently ignored entry)."""
    path = tables("user", {})
    path.write_text(table if isinstance(table, str) else json.dumps(table))
    cfgmod.clear_caches()
    f = dense(torch.bfloat16)
    with pytest.raises(ValueError, match=match) as e:
        select_config("a16w16", 16, 4096, 4096, H100, f, f, 2)
    assert str(path) in str(e.value)


def test_table_entry_below_the_operands_block_k(tables):
    """A user table entry the operands cannot take (8-bit dots need BLOCK_K >= 32): refused naming the table, as a
    config= argument is, not compiled."""
    tables("user", {"shapes": {"256,64": {"M_LEQ_32": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}}}}, op="a8w8_fp8")
    f8 = dense(torch.float8_e4m3fn, cfgmod.Scale.ROW)
    with pytest.raises(ValueError, match="a8w8_fp8 .*BLOCK_K=16 is below 32"):
        select_config("a8w8_fp8", 32, 256, 64, H100, f8, f8, 2)


def test_shipped_tables_valid_for_their_ops():
    """Every shipped table reads as a valid table, and each entry suits its op's operands once fitted to the
    device's shared memory (what the ops' lookups now check)."""
    from gemmkit.core.formats import check_block_k

    paths = sorted(cfgmod.CONFIG_DIR.glob("*/*.json"))
    assert paths
    for path in paths:
        dev, table = known_device(path.parent.name), cfgmod.read_table(path)
        a, b = registry.table_op(path.stem).formats
        entries = list(table.get("buckets", {}).values()) + [e for es in table.get("shapes", {}).values()
                                                             for e in es.values()]
        for e in entries:
            assert check_block_k(cfgmod.fit_to_smem(cfgmod.GemmConfig.from_dict(e), dev, a, b, 2).BLOCK_K, a, b) is None


def test_autotune_is_asked_for_the_quantized_dtype(monkeypatch):
    """x quantized in the kernel (the dynamic FP8 tables): GEMMKIT_AUTOTUNE's tuner is named by the quantized dtype
    (its tool op takes e4m3), not x's storage dtype."""
    from gemmkit.core.formats import quantized_in_kernel
    from gemmkit.tools import autotune as at

    asked = []
    monkeypatch.setattr(at, "maybe_autotune", lambda table, M, N, K, dev, dtype=None: asked.append(dtype) or False)
    a = quantized_in_kernel(torch.bfloat16, torch.float8_e4m3fn, "row")
    select_config("a8w8_fp8_dynamic", 16, 4096, 4096, H100, a, dense(torch.float8_e4m3fn, cfgmod.Scale.ROW), 2)
    f = dense(torch.bfloat16)
    select_config("a16w16", 16, 4096, 4096, H100, f, f, 2)
    assert asked == [torch.float8_e4m3fn, torch.bfloat16]


def test_nearest_shape_entry(tables):
    tables("shipped", {"shapes": {"4096,4096": {"M_LEQ_16": entry(16)}, "8192,8192": {"M_LEQ_16": entry(32),
                                                                                     "M_LEQ_256": entry(64)}}})
    assert cfgmod.nearest_shape_entry(H100.name, "a16w16", 8, 5000, 4000) == (entry(16), (4096, 4096))
    assert cfgmod.nearest_shape_entry(H100.name, "a16w16", 8, 7000, 9000) == (entry(32), (8192, 8192))
    assert cfgmod.nearest_shape_entry(H100.name, "a16w16", 100, 4096, 4096) == (entry(64), (8192, 8192))
    assert cfgmod.nearest_shape_entry(H100.name, "a8w8_fp8", 8, 4096, 4096) == (None, (None, None))
    # an empty problem (K or N 0: fused_gemm_a16w16_split_cat with K = 0 resolved its config): no log of 0
    assert cfgmod.nearest_shape_entry(H100.name, "a16w16", 8, 20, 0) == (entry(16), (4096, 4096))
    assert cfgmod.nearest_shape_entry(H100.name, "a16w16", 8, 0, 64) == (entry(16), (4096, 4096))


@pytest.mark.parametrize("N,K,split", [(1280, 8192, 3), (3072, 8192, 1), (1280, 256, 1), (2560, 8192, 1)])
def test_borrowed_entry_split_refitted_to_few_tiles(N, K, split):
    """A nearest-shape entry whose tiles would fill under half of the SMs gets split-K up to a wave
    (64 x 32 tiles at M = 32: N = 1280, 40 tiles -> 3 slices); 96 or 80 tiles, or a K of under 4 K
    tiles a slice, keep the entry's split."""
    from gemmkit.core.config import GemmConfig, fit_waves
    from gemmkit.core.device import known_device

    cfg = GemmConfig.from_dict(dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=6))
    assert fit_waves(cfg, 32, N, K, known_device("NVIDIA_H100_80GB_HBM3")).SPLIT_K == split


@pytest.mark.parametrize("M,rows", [(32, 32), (20, 32), (9, 16), (1, 16), (64, 64)])
def test_borrowed_entry_rows_cut_to_m(M, rows):
    """fit_rows: a tile taller than M's rows (a power of two from 16) is cut to them; shorter ones stay."""
    from gemmkit.core.config import GemmConfig, fit_rows

    tall = GemmConfig.from_dict(dict(BLOCK_M=128, BLOCK_N=32, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=6))
    assert fit_rows(tall, M) == dataclasses.replace(tall, BLOCK_M=rows)
    short = dataclasses.replace(tall, BLOCK_M=16)
    assert fit_rows(short, M) == short


def test_a16w16_borrowed_entries_take_m_rows_exact_entries_keep_theirs():
    """select_config for a16w16 at M = 32: an entry borrowed from the nearest tuned shape gets
    BLOCK_M <= 32 (Qwen3-32B TP2 down borrows N, K = 4096, 12288's 64-row tiles); that shape's own
    entry keeps its 64 rows; other tables' borrowed entries are not cut (measured on a16w16 only)."""
    bf16 = dense(torch.bfloat16)
    entry, source = cfgmod.lookup_entry(H100.name, "a16w16", 32, 4096, 12288)
    assert "shape entry" in source and entry["BLOCK_M"] == 64
    assert select_config("a16w16", 32, 4096, 12288, H100, bf16, bf16, 2).BLOCK_M == 64
    _, source = cfgmod.lookup_entry(H100.name, "a16w16", 32, 5120, 12800)
    assert cfgmod.NEAREST in source
    assert select_config("a16w16", 32, 5120, 12800, H100, bf16, bf16, 2).BLOCK_M == 32
    assert "a8w8_fp8" not in cfgmod.ROWS_CAP_TABLES


def test_borrowed_entry_keeps_its_split_where_x_is_quantized_in_the_kernel():
    """Where the GEMM quantizes x itself, a K slice quantizes its own range: the split is part of
    the result, so a borrowed entry of the dynamic table keeps its own (a bf16 table's is refitted)."""
    from gemmkit.core.config import GemmConfig, fit_waves, nearest_shape_entry
    from gemmkit.core.formats import Scale, quantized_in_kernel

    a = quantized_in_kernel(torch.bfloat16, torch.float8_e4m3fn, "row")
    b = dense(torch.float8_e4m3fn, Scale.ROW)
    entry, _ = nearest_shape_entry(H100.name, "a8w8_fp8_dynamic", 64, 1000, 2048)
    assert fit_waves(GemmConfig.from_dict(entry), 64, 1000, 2048, H100).SPLIT_K != entry["SPLIT_K"]
    assert select_config("a8w8_fp8_dynamic", 64, 1000, 2048, H100, a, b, 2).SPLIT_K == entry["SPLIT_K"]


def test_gluon_route_names_the_ragged_tiles():
    """`gemmkit configs show` on sm_90: the warp-specialized kernel's tiles as core/hopper_ws.py picks them, the
    64-row and swapped ones at M not a multiple of 128 included."""
    from gemmkit.core import hopper_ws
    from gemmkit.tools.configs import gluon_route

    if hopper_ws.gluon_kernel() is None:
        pytest.skip("this Triton has no Gluon")
    assert gluon_route("a16w16", 300, 8192, 8192, H100).startswith("swapped operands: 128 weight rows x 160 rows of x")
    assert gluon_route("a16w16", 200, 4096, 4096, H100).startswith("64 x ")
    assert gluon_route("a16w16", 4096, 4096, 4096, H100).startswith("128 x 256 tiles")
    assert gluon_route("a16w16", 16, 4096, 4096, H100) is None


@pytest.mark.parametrize("device_name", ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"])
def test_every_table_picks_a_valid_config_on_hopper(device_name):
    """`gemmkit configs show` for every tunable op over M from 1 to 8192 (multiples of the tiles and not) on layers
    tuned and not (odd N and K among them) on both Hopper tables: a config comes back for each (a tuned entry, a
    borrowed one refitted, or one derived), never an exception (the host side of every call those ops make)."""
    from gemmkit.tools.configs import show_lines
    from gemmkit.tools.registry import OPS

    dev = known_device(device_name)
    ops = [op for op in OPS.values() if op.table is not None and op.formats is not None]
    shapes = [(M, N, K) for M in (1, 7, 16, 33, 64, 100, 128, 200, 300, 512, 777, 1024, 2100, 4096, 8192)
              for N, K in ((4096, 4096), (14336, 4096), (1280, 8192), (2112, 7168), (1000, 1040), (8192, 3696))]
    lines = show_lines(ops, shapes, dev, None, "bf16")
    assert len([line for line in lines if line.lstrip().startswith("M=")]) == len(ops) * len(shapes)
