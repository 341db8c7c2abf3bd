"""`gemmkit bench`: gemmkit against the torch baseline, same inputs, same run.

For each shape: check gemmkit's result (and the baseline's) against a float32 reference, then
time both under CUDA-graph replay (kernel time) and as back-to-back eager calls (per-call time,
host cost included), with inputs rotating over sets larger than the L2. Prints a table with
ratios (baseline time / gemmkit time: above 1 means gemmkit is faster), TFLOP/s, GB/s and % of
roofline (max of FLOP time and byte time at the device's datasheet peaks over measured time).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from ..core.device import device_info
from . import registry as tool_registry
from .registry import get_op, model_shapes, op_dtype
from .timing import time_eager_pair_us, time_eager_us, time_graphs_us
from .tune import input_sets, rel_error

DEFAULT_MODELS = ["llama3-8b", "llama3-70b"]
DEFAULT_M = [1, 16, 64, 256, 1024, 4096]
DEFAULT_SQUARES = [(4096, 4096, 4096), (8192, 8192, 8192)]


def geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def commit_id() -> str:
    if os.environ.get("GEMMKIT_COMMIT"):
        return os.environ["GEMMKIT_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def copy_bandwidth_gbps(dev) -> float:
    """Device-to-device copy bandwidth, bytes read plus written, measured now."""
    n = max(256 << 20, 8 * dev.l2_bytes)
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    us = time_graphs_us([lambda: dst.copy_(src)], rep_ms=25)[0]
    return 2 * n / us / 1e3


def measure(op, label, M, N, K, dtype, dev, rep_ms, eager: bool, copy_gbps: float) -> dict:
    sets = input_sets(op, M, N, K, dtype, dev)
    ref = op.reference(sets[0])
    row = {"shape": label, "M": M, "N": N, "K": K, "dtype": dtype, "err": rel_error(op.run(sets[0]), ref)}
    row["ok"] = row["err"] < op.tolerance
    try:
        row["base_err"] = rel_error(op.baseline(sets[0]), ref)
        has_base = True
    except Exception as e:  # noqa: BLE001 - e.g. torch._int_mm rejects M <= 16
        row["base_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        has_base = False
    ours = [lambda s=s: op.run(s) for s in sets]
    base = [lambda s=s: op.baseline(s) for s in sets]
    if has_base:
        row["graph_us"], row["base_graph_us"] = time_graphs_us(ours, base, rep_ms=rep_ms)
        row["ratio"] = row["base_graph_us"] / row["graph_us"]
    else:
        row["graph_us"] = time_graphs_us(ours, rep_ms=rep_ms)[0]
    if eager:
        if has_base:
            row["eager_us"], row["base_eager_us"] = time_eager_pair_us(ours, base)
            row["eager_ratio"] = row["base_eager_us"] / row["eager_us"]
        else:
            row["eager_us"] = time_eager_us(ours)
    flops, nbytes = op.flops(M, N, K), op.nbytes(M, N, K)
    row["tflops"] = flops / row["graph_us"] / 1e6
    row["gbps"] = nbytes / row["graph_us"] / 1e3
    if has_base:
        row["base_tflops"] = flops / row["base_graph_us"] / 1e6
        row["base_gbps"] = nbytes / row["base_graph_us"] / 1e3
    row["copy_pct"] = 100.0 * row["gbps"] / copy_gbps
    peak_f, peak_b = dev.peak_tflops(op.operand_bits), dev.peak_tbps()
    if peak_f and peak_b:
        floor_us = max(flops / (peak_f * 1e6), nbytes / (peak_b * 1e6))
        row["roofline_pct"] = 100.0 * floor_us / row["graph_us"]
    del sets
    torch.cuda.empty_cache()
    return row


def _fmt(v, nd=1):
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def table_lines(rows, eager: bool) -> list[str]:
    head = ["shape", "M", "N", "K", "graph µs", "base µs", "ratio"]
    if eager:
        head += ["eager µs", "base eager µs", "eager ratio"]
    head += ["TFLOP/s", "GB/s", "% copy BW", "% roofline", "rel err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["shape"], r["M"], r["N"], r["K"], _fmt(r["graph_us"]), _fmt(r.get("base_graph_us")),
                 _fmt(r.get("ratio"), 2)]
        if eager:
            cells += [_fmt(r.get("eager_us")), _fmt(r.get("base_eager_us")), _fmt(r.get("eager_ratio"), 2)]
        cells += [_fmt(r["tflops"]), _fmt(r["gbps"], 0), _fmt(r.get("copy_pct"), 0), _fmt(r.get("roofline_pct"), 0),
                  f"{r['err']:.1e}" + ("" if r["ok"] else " FAIL")]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def summary_lines(rows, eager: bool) -> list[str]:
    out = []

    def add(name, sel, key="ratio"):
        vals = [r[key] for r in rows if sel(r) and key in r]
        if vals:
            out.append(f"- {name}: geomean {geomean(vals):.3f}, min {min(vals):.3f} ({len(vals)} shapes)")

    add("graph ratio, all shapes", lambda r: True)
    add("graph ratio, M <= 16", lambda r: r["M"] <= 16)
    add("graph ratio, M >= 1024", lambda r: r["M"] >= 1024)
    if eager:
        add("eager ratio, all shapes", lambda r: True, "eager_ratio")
        add("eager ratio, M = 1", lambda r: r["M"] == 1, "eager_ratio")
    no_base = [f"{r['shape']} M={r['M']}" for r in rows if "base_error" in r]
    if no_base:
        out.append(f"- baseline failed (excluded from ratios) on: {', '.join(no_base)} ({rows[0].get('base_error', '')})"
                   if len(no_base) == len(rows) else f"- baseline failed (excluded from ratios) on: {', '.join(no_base)}")
    bad = [r["shape"] + f" M={r['M']}" for r in rows if not r["ok"]]
    out.append("- correctness: " + ("all results within tolerance" if not bad else "FAILED: " + ", ".join(bad)))
    return out


_PLOT_KEYS = {"time": ("graph_us", "base_graph_us", "µs (graph replay)"),
              "tflops": ("tflops", "base_tflops", "TFLOP/s"),
              "bandwidth": ("gbps", "base_gbps", "GB/s")}


def plot_series(rows, metric: str) -> dict:
    """{(shape, N, K): {"gemmkit": [(M, value)], "torch": [(M, value)]}} over M, for --plot;
    rows whose baseline failed have no torch point."""
    ours, base, _ = _PLOT_KEYS[metric]
    groups = {}
    for r in sorted(rows, key=lambda r: r["M"]):
        g = groups.setdefault((r["shape"], r["N"], r["K"]), {"gemmkit": [], "torch": []})
        g["gemmkit"].append((r["M"], r[ours]))
        if base in r:
            g["torch"].append((r["M"], r[base]))
    return groups


def plot(rows, metric: str, path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return
    groups = plot_series(rows, metric)
    n = len(groups)
    cols = min(4, n)
    fig, axes = plt.subplots(-(-n // cols), cols, figsize=(4.2 * cols, 3.2 * -(-n // cols)), squeeze=False)
    for ax, ((label, N, K), series) in zip(axes.flat, groups.items()):
        for name, style in (("gemmkit", "o-"), ("torch", "s--")):
            if series[name]:
                ax.plot(*zip(*series[name]), style, label=name)
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)  # a lone point's autoscaled axis would magnify a 1% difference
        ax.set_title(f"{label} (N={N}, K={K})", fontsize=8)
        ax.set_xlabel("M")
        ax.set_ylabel(_PLOT_KEYS[metric][2])
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def bench_problems(op, shape_args, models, m_sweep) -> list[tuple[str, int, int, int]]:
    """(label, M, N, K) to measure, in order, each once: the --shape triples (M K pairs for the
    elementwise ops), the models' layers at each --m-sweep M, and by default the Llama-3 layers
    and two squares. Raises SystemExit on a malformed request (before anything runs)."""
    problems = []
    for shape in shape_args or []:
        if len(shape) != (3 if op.gemm else 2):
            raise SystemExit(f"--shape for {op.name}: " + ("M N K" if op.gemm else "M K") + f", got {shape}")
        if min(shape) < 1:
            raise SystemExit(f"--shape sizes must be >= 1, got {shape}")
        m, n, k = shape if op.gemm else (shape[0], 0, shape[1])
        problems.append((f"{m}x{n}x{k}" if op.gemm else f"{m}x{k}", m, n, k))
    ms = list(dict.fromkeys(m_sweep or DEFAULT_M))
    if min(ms) < 1:
        raise SystemExit(f"--m-sweep values must be >= 1, got {m_sweep}")
    if models or not shape_args:
        shapes = model_shapes(models or DEFAULT_MODELS)
        if op.gemm:
            problems += [(label, m, n, k) for label, n, k in shapes for m in ms]
        else:  # elementwise over activations (M, K): each model's distinct K
            ks = sorted({k for _, _, k in shapes})
            problems += [(f"K={k}", m, 0, k) for k in ks for m in ms]
    if not shape_args and not models and op.gemm:
        problems += [(f"{m}x{n}x{k}", m, n, k) for m, n, k in DEFAULT_SQUARES]
    seen, unique = set(), []
    for prob in problems:  # a size asked for twice is measured (and summarized) once
        if prob[1:] not in seen:
            seen.add(prob[1:])
            unique.append(prob)
    return unique


def append_markdown(path: Path, text: str) -> None:
    """Append a section; after a file that does not end in a newline, start on a fresh line."""
    if path.is_file() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                text = "\n\n" + text
    with open(path, "a") as f:
        f.write(text)


def run_demo() -> int:
    from . import demo

    return demo.main([])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gemmkit bench", description=__doc__.split("\n\n")[0])
    p.add_argument("op", nargs="?", default="a16w16")
    p.add_argument("--shape", type=int, nargs="+", action="append", metavar="DIM",
                   help="one GEMM shape: M N K (for the elementwise quant ops: M K); repeat --shape for more")
    p.add_argument("--model", nargs="+", default=None, help="models from gemmkit/tools/models.json")
    p.add_argument("--m-sweep", type=int, nargs="+", default=None, help="M values for --model shapes")
    p.add_argument("--dtype", default=None)
    p.add_argument("--metric", choices=["time", "tflops", "bandwidth"], default=None,
                   help="what --plot shows (default: tflops for GEMMs, bandwidth for the quant ops)")
    p.add_argument("--weights", choices=["aligned", "contiguous"], default="aligned",
                   help="weights stored as gemmkit.nn layers store them (rows padded to 32 bytes where K's bytes "
                        "are not a multiple: gemmkit.align_rows; the default) or contiguous; both sides get the same")
    p.add_argument("--rep-ms", type=float, default=25)
    p.add_argument("--no-eager", action="store_true", help="skip the eager per-call timing")
    p.add_argument("--csv", type=Path)
    p.add_argument("--plot", type=Path)
    p.add_argument("--markdown", type=Path, help="append the result as a section to this Markdown file")
    args = p.parse_args(argv)
    argv_used = argv if argv is not None else sys.argv[2:]
    tool_registry.ALIGNED_WEIGHTS = args.weights == "aligned"
    op = get_op(args.op)
    dtype = op_dtype(op, args.dtype)
    problems = bench_problems(op, args.shape, args.model, args.m_sweep)
    metric = args.metric or ("tflops" if op.gemm else "bandwidth")

    if not torch.cuda.is_available():
        print("No CUDA GPU found: gemmkit bench times kernels on an NVIDIA GPU. Running a small CPU demo "
              "of the same kernels under the Triton interpreter instead (correctness only, no timing).\n")
        skipped = [f"--{name} {getattr(args, name)}" for name in ("csv", "plot", "markdown") if getattr(args, name)]
        if skipped or args.op != "a16w16":
            print(f"(the demo runs a16w16; not {args.op}'s timing, and nothing is written"
                  + (f" for {', '.join(skipped)}" if skipped else "") + ")\n")
        return run_demo()

    dev = device_info()
    title = (f"gemmkit bench {args.op} ({dtype}) on {dev.name}, baseline {op.baseline_name}; "
             f"torch {torch.__version__}, triton {_triton_version()}, commit {commit_id()}")
    copy_gbps = copy_bandwidth_gbps(dev)
    title += f"; device copy bandwidth {copy_gbps:.0f} GB/s (read + write, measured now)"
    print(title, flush=True)
    rows = []
    for i, (label, M, N, K) in enumerate(problems):
        row = measure(op, label, M, N, K, dtype, dev, args.rep_ms, not args.no_eager, copy_gbps)
        rows.append(row)
        print(f"[{i + 1}/{len(problems)}] {label} M={M} N={N} K={K}: graph {row['graph_us']:.1f} µs vs "
              f"{_fmt(row.get('base_graph_us'))} ({_fmt(row.get('ratio'), 2)}x)"
              + (f", eager {row['eager_us']:.1f} vs {_fmt(row.get('base_eager_us'))} ({_fmt(row.get('eager_ratio'), 2)}x)"
                 if "eager_us" in row else "") + ("" if row["ok"] else "  RESULT WRONG"), flush=True)
    lines = table_lines(rows, not args.no_eager)
    summary = summary_lines(rows, not args.no_eager)
    print("\n" + "\n".join(lines) + "\n\n" + "\n".join(summary))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
            writer.writeheader()
            writer.writerows(rows)
    if args.plot:
        plot(rows, metric, args.plot, title)
    if args.markdown:
        weights = ("rows padded to 32 bytes where K's bytes are not a multiple (gemmkit.align_rows)"
                   if tool_registry.ALIGNED_WEIGHTS else "contiguous")
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        section = [
            f"## {args.op} ({dtype}) on {dev.name}, {date}, commit {commit_id()}", "",
            f"Command: `gemmkit bench {' '.join(argv_used)}`  ",
            f"torch {torch.__version__}, triton {_triton_version()}; baseline: {op.baseline_name}, measured in "
            "the same run. graph = CUDA-graph replay (kernel time); eager = back-to-back eager calls "
            "(host cost included); ratio = baseline time / gemmkit time (> 1: gemmkit faster); weights: "
            f"{weights}; "
            f"% copy BW against the device copy measured in the same run ({copy_gbps:.0f} GB/s).", "",
            *lines, "", *summary, "", "",
        ]
        append_markdown(args.markdown, "\n".join(section))
        print(f"appended to {args.markdown}")
    return 0 if all(r["ok"] for r in rows) else 1


def _triton_version():
    import triton

    return triton.__version__
