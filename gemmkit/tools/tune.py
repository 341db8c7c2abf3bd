"""`gemmkit tune`: measure candidate configs on the GPU and write the op's JSON config table (yours,
in the user config directory, unless --package or --out).

Per problem (M, N, K): candidates from the op's pruned search space are compiled in parallel
worker processes (filling Triton's on-disk cache), then timed one by one in this process under
CUDA-graph replay with rotating inputs; a candidate whose result is wrong is discarded, and one
that compiled to the same binaries and grids as an earlier candidate is not timed again (on
sm_90, Triton 3.6 ignores WARP_SPECIALIZE: identical SASS with and without it). Every
measurement is appended to a JSONL cache, so an interrupted run resumes where it stopped. The
best config per (N, K, M bucket) goes to the table's "shapes" section; per bucket, the config with
the best geometric-mean slowdown over all tuned shapes becomes the generic "buckets" entry.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch

from ..core.config import GemmConfig, clear_caches, m_bucket, read_table, table_path, user_config_dir
from ..core.device import device_info
from .registry import get_op, import_model_shapes, load_models, model_shapes, op_dtype, search_space
from .timing import rotation_count, time_graph_us, time_graphs_us


def _progress(total: int, desc: str, verbose: bool = True):
    """A progress bar with the time left: tqdm's if it is installed (`pip install gemmkit[tune]`),
    else a line every 5%; nothing when not verbose."""
    if not verbose:
        return _PlainProgress(total, desc, out=None)
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, file=sys.stdout, mininterval=2.0, ascii=True)
    except ImportError:
        return _PlainProgress(total, desc)


def format_seconds(s: float) -> str:
    s = max(0, round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class _PlainProgress:
    """Prints `desc: n/total (elapsed, ETA left)` every 5% of the total; out=None: silent."""

    def __init__(self, total, desc, out=sys.stdout, clock=time.monotonic):
        self.total, self.desc, self.n, self.out, self.clock = total, desc, 0, out, clock
        self.t0 = clock()

    def update(self, k=1):
        self.n += k
        if self.out is not None and (self.n == self.total or self.n % max(1, self.total // 20) == 0):
            elapsed = self.clock() - self.t0
            eta = "" if self.n >= self.total else f", ETA {format_seconds(elapsed / self.n * (self.total - self.n))}"
            print(f"{self.desc}: {self.n}/{self.total} ({format_seconds(elapsed)}{eta})", file=self.out, flush=True)

    def close(self):
        pass


def cfg_key(cfg: GemmConfig) -> str:
    return json.dumps(cfg.to_dict(), sort_keys=True)


def input_sets(op, M, N, K, dtype, dev, device="cuda"):
    """Input sets for timing: enough that one pass over them reads 3x the L2, for gemmkit's
    call and for the baseline's (op.reads: which inputs each side reads)."""
    first = op.make_inputs(M, N, K, dtype, device)
    sides = op.reads or (tuple(first),)
    per_call = op.rotation_bytes(M, N, K)  # (the MoE ops: a call reads only the experts its routing touches)
    if per_call is not None:
        n = rotation_count(int(per_call), dev.l2_bytes)
    else:
        n = max(rotation_count(sum(first[k].numel() * first[k].element_size() for k in keys
                                   if isinstance(first[k], torch.Tensor)), dev.l2_bytes) for keys in sides)
    return [first] + [op.make_inputs(M, N, K, dtype, device) for _ in range(n - 1)]


def rel_error(out, ref) -> float:
    """Relative Frobenius error of out against ref (tuples of tensors: over all of them together)."""
    if isinstance(out, tuple):
        diff = sum((o.float() - r).norm() ** 2 for o, r in zip(out, ref, strict=True))
        return (diff.sqrt() / sum(r.norm() ** 2 for r in ref).sqrt().clamp_min(1e-30)).item()
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# ---------------------------------------------------------------------------------------------
# parallel compilation


def kernel_signature(run) -> tuple | None:
    """Call `run()`; return the kernels it compiled and launched through Triton, as (hash of the
    binary, grid) pairs: two configs with equal signatures run the same code on the same grid.
    None where a binary cannot be read (then nothing is deduplicated)."""
    from ..core import launcher

    seen, real = [], launcher.launch_jit

    def recording(fn, grid, args, num_warps, num_stages):
        kernel = real(fn, grid, args, num_warps, num_stages)
        if kernel is not None:
            try:
                binary = hashlib.sha1(kernel.asm["cubin"]).hexdigest()
            except (AttributeError, KeyError, TypeError):
                binary = None
            seen.append((binary, tuple(grid)))
        return kernel

    launcher.launch_jit = recording
    try:
        run()
    finally:
        launcher.launch_jit = real
    return None if any(b is None for b, _ in seen) else tuple(seen)


def _compile_worker(op_name, M, N, K, dtype, cfg_dict):
    """Run one candidate once in a worker process; Triton caches the compiled kernel on disk.
    Returns (None or why the candidate failed, its kernel_signature or None). Running out of
    device memory (the workers share the GPU) says nothing about the candidate: (None, None),
    and the measuring process then compiles that candidate itself."""
    try:
        op = get_op(op_name)
        inp = op.make_inputs(M, N, K, dtype, "cuda")
        signature = kernel_signature(lambda: op.run(inp, GemmConfig.from_dict(cfg_dict)))
        torch.cuda.synchronize()
        return None, signature or None
    except torch.cuda.OutOfMemoryError:
        return None, None
    except Exception as e:  # noqa: BLE001 - any failure disqualifies the candidate
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", None
    finally:
        inp = None
        torch.cuda.empty_cache()  # workers live on: hand the inputs' memory back to the others


def duplicates(cfg_keys, signatures: dict) -> dict:
    """{cfg_key: the earlier cfg_key (in `cfg_keys` order) whose candidate compiled to the same
    kernel_signature}; candidates without a signature are never duplicates."""
    first, dup = {}, {}
    for ck in cfg_keys:
        sig = signatures.get(ck)
        if sig is None:
            continue
        if sig in first:
            dup[ck] = first[sig]
        else:
            first[sig] = ck
    return dup


def worker_count(op, jobs, workers: int, device_bytes: int) -> int:
    """At most `workers`, and no more than fit in device memory at once with the largest job
    (inputs as built, from float32 with temporaries, the output, and a CUDA context per process)."""
    if not jobs:
        return 1
    largest = max(8 * (M * K + N * K + M * N) + op.nbytes(M, N, K) for M, N, K, _, _ in jobs)
    return max(1, min(workers, int(0.6 * device_bytes // (largest + (1 << 30)))))


def precompile(op_name, jobs, workers: int, verbose: bool = True) -> dict:
    """jobs: [(M, N, K, dtype, cfg)] -> {(M, N, K, cfg_key): (error or None, signature or None)}.
    workers=0: compile one by one in this process (no process pool)."""
    results = {}
    if not jobs:
        return results
    bar = _progress(len(jobs), "compile", verbose)
    if workers == 0:
        for M, N, K, dt, cfg in jobs:
            results[(M, N, K, cfg_key(cfg))] = _compile_worker(op_name, M, N, K, dt, cfg.to_dict())
            bar.update(1)
        bar.close()
        return results
    import multiprocessing as mp

    workers = worker_count(get_op(op_name), jobs, workers, torch.cuda.get_device_properties(0).total_memory)
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(_compile_worker, op_name, M, N, K, dt, cfg.to_dict()): (M, N, K, cfg_key(cfg))
                   for M, N, K, dt, cfg in jobs}
        for fut in as_completed(futures):
            try:
                results[futures[fut]] = fut.result()
            except Exception as e:  # noqa: BLE001 - a crashed worker
                results[futures[fut]] = (f"worker failed: {e!r}"[:200], None)
            bar.update(1)
    bar.close()
    return results


# ---------------------------------------------------------------------------------------------
# the tuning run


# the STREAM_K schedule a record measured (kernels/gemm.py); records of STREAM_K configs without it
# timed the earlier one (contiguous shares of (tile, K) iterations) and are measured again
STREAM_K_SCHEDULE = "last-wave-k-slices"


def load_cache(path: Path) -> dict:
    """Measurements by (M, N, K, dtype, config key), the last record of each winning. A line that
    does not parse (a run killed mid-write) is skipped with a warning: its candidate is re-measured;
    so are STREAM_K configs timed with an earlier stream-K schedule (STREAM_K_SCHEDULE)."""
    cache, stale = {}, 0
    if path.is_file():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    r = json.loads(line)
                    key = (r["M"], r["N"], r["K"], r["dtype"], r["cfg"])
                    if json.loads(r["cfg"]).get("STREAM_K") and r.get("schedule") != STREAM_K_SCHEDULE:
                        stale += 1
                        continue
                    cache[key] = r
                except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                    print(f"{path}:{number}: skipping a malformed record", file=sys.stderr)
    if stale:
        print(f"{path}: {stale} STREAM_K records of an earlier stream-K schedule left out (re-measured)",
              file=sys.stderr)
    return cache


def seeded_candidates(seed: dict, problem: tuple, dtype: str, top: int) -> list[GemmConfig] | None:
    """The `top` fastest configs of `problem` among another device's measurements (a tuning cache
    of another Hopper part: `--seed`), fastest under sustained load first, else by `us`; None where
    the seed never measured the problem (it then gets the whole search space)."""
    recs = [r for k, r in seed.items() if k[:4] == (*problem, dtype) and ("us" in r or "us_sustained" in r)]
    if not recs:
        return None
    recs.sort(key=lambda r: (r.get("us_sustained") is None, r.get("us_sustained") or r["us"]))
    keys = list(dict.fromkeys(r["cfg"] for r in recs))[:top]
    return [GemmConfig.from_dict(json.loads(k)) for k in keys]


def tune(op_name, problems, dtype, out_path: Path, cache_path: Path, workers: int, rep_ms: int,
         command: str, time_budget_s: float | None = None, buckets: bool = True, verbose: bool = True,
         seed: dict | None = None, seed_top: int = 8) -> dict:
    """Measure the candidates of each (M, N, K) in `problems` (workers: compile processes, 0: in
    this one) and write the table at out_path (buckets: also its generic buckets); verbose:
    progress on stdout. seed: another device's measurements (load_cache); each problem it holds is
    tuned over its `seed_top` fastest configs there instead of the whole search space."""
    op = get_op(op_name)
    dev = device_info()
    if out_path.is_file():  # (a table the measurements would be merged into: refused now, not after them)
        read_table(out_path)
    cache = load_cache(cache_path)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    say = print if verbose else (lambda *a, **k: None)

    problems = list(dict.fromkeys(problems))  # each once
    def space(p):
        seeded = seeded_candidates(seed, p, dtype, seed_top) if seed else None
        return seeded if seeded is not None else search_space(op, op.table_m(p[0]), *p[1:], dev)

    todo = {p: [c for c in space(p) if (*p, dtype, cfg_key(c)) not in cache] for p in problems}
    jobs = [(M, N, K, dtype, c) for (M, N, K), cands in todo.items() for c in cands]
    say(f"tuning {op_name} ({dtype}) on {dev.name}: {len(problems)} problems, {len(jobs)} candidates to measure "
        f"({sum(1 for k in cache if k[3] == dtype)} cached)", flush=True)
    compiled = precompile(op_name, jobs, workers, verbose)

    bar = _progress(len(jobs), "measure", verbose)
    with open(cache_path, "a") as log:
        for (M, N, K), cands in todo.items():
            if not cands:
                continue
            if time_budget_s is not None and time.time() - t_start > time_budget_s:
                say("time budget spent; rerun to resume", flush=True)
                break
            sets = input_sets(op, M, N, K, dtype, dev)
            ref = op.reference(sets[0])
            same = duplicates([cfg_key(c) for c in cands],
                              {cfg_key(c): compiled.get((M, N, K, cfg_key(c)), (None, None))[1] for c in cands})
            for cfg in cands:
                rec = {"M": M, "N": N, "K": K, "dtype": dtype, "cfg": cfg_key(cfg)}
                if cfg.STREAM_K:
                    rec["schedule"] = STREAM_K_SCHEDULE
                err = compiled.get((M, N, K, rec["cfg"]), (None, None))[0]
                if rec["cfg"] in same:  # the same binaries on the same grid: timed once
                    rec["same_kernel_as"] = same[rec["cfg"]]
                elif err is None:
                    try:
                        e = rel_error(op.run(sets[0], cfg), ref)
                        if not e < op.tolerance:
                            err = f"wrong result: relative error {e:.2e}"
                        else:
                            rec["us"] = time_graph_us([lambda s=s: op.run(s, cfg) for s in sets], rep_ms=rep_ms, retries=5)
                    except Exception as ex:  # noqa: BLE001
                        err = f"{type(ex).__name__}: {str(ex).splitlines()[0][:200] if str(ex) else ''}"
                if err is not None:
                    rec["error"] = err
                cache[(M, N, K, dtype, rec["cfg"])] = rec
                log.write(json.dumps(rec) + "\n")
                log.flush()
                bar.update(1)
            del sets, ref
            torch.cuda.empty_cache()
        bar.close()
        deadline = None if time_budget_s is None else t_start + time_budget_s
        verify_finalists(op, problems, dtype, dev, cache, log, deadline, verbose)
    table = write_table(op_name, dtype, cache, out_path, command, dev.name, buckets)
    say(f"wrote {out_path} ({format_seconds(time.time() - t_start)})", flush=True)
    return table


FINALISTS = 4
REP_MS = 8  # graph replay time per measurement (ms)


def verify_finalists(op, problems, dtype, dev, cache: dict, log, deadline: float | None,
                     verbose: bool = True) -> None:
    """Re-time the fastest FINALISTS candidates of each problem together, their graph replays
    interleaved for a second or more of sustained load, as `gemmkit bench` times them; record
    the result as "us_sustained". The first ranking times each candidate alone in a short burst,
    at boost clocks; under the benchmark's sustained load its winner was often not the best
    (tuning/*.jsonl: compare `us` and `us_sustained` of a problem's verified records). Problems
    whose current finalists were all verified together are skipped; a verification stamps its
    records, and only the latest one of a problem decides."""
    by_problem = {}
    for (M, N, K, dt, _), rec in cache.items():
        if dt == dtype and "us" in rec:
            by_problem.setdefault((M, N, K), []).append(rec)

    def finalists(p):
        return sorted(by_problem[p], key=lambda r: r["us"])[:FINALISTS]

    def verified_together(recs):
        return len({r.get("verified") for r in recs}) == 1 and "verified" in recs[0]

    todo = [p for p in problems if len(by_problem.get(p, ())) > 1 and not verified_together(finalists(p))]
    bar = _progress(len(todo), "verify", verbose)
    for M, N, K in todo:
        if deadline is not None and time.time() > deadline:
            if verbose:
                print("time budget spent; rerun to resume", flush=True)
            break
        recs = finalists((M, N, K))
        sets = input_sets(op, M, N, K, dtype, dev)
        lists = [[lambda s=s, c=GemmConfig.from_dict(json.loads(r["cfg"])): op.run(s, c) for s in sets]
                 for r in recs]
        stamp = time.time()
        for rec, us in zip(recs, time_graphs_us(*lists, rep_ms=15)):
            rec = dict(rec, us_sustained=us, verified=stamp)
            cache[(M, N, K, dtype, rec["cfg"])] = rec
            log.write(json.dumps(rec) + "\n")
        log.flush()
        del sets, lists
        torch.cuda.empty_cache()
        bar.update(1)
    bar.close()


LARGE_M = 4096


def write_table(op_name, dtype, cache, out_path: Path, command: str, device_name: str, buckets: bool = True) -> dict:
    """Regenerate the tuned entries of the JSON table at out_path from all measurements in
    `cache` for this dtype (entries of the table that the cache does not cover are kept).

    shapes: the fastest config per (N, K) and M bucket (under sustained load where the finalists
    were verified, else in the first ranking); the largest tuned M of an (N, K) also fills its
    "any" when it is at least LARGE_M (else larger M falls through to the generic buckets: a
    config tuned for M = 16 is no guess for M = 4096). buckets: per tuned M, the config with the
    least geometric-mean slowdown over every (N, K) measured at that M (among the configs
    measured on all of them); not written where `buckets` is false (a table of a few shapes
    tuned on demand must not set the configs of all others).
    """
    table_m = get_op(op_name).table_m  # the M the op's table is keyed by (MoE: rows per expert)
    cache = {(table_m(M), N, K, dt, ck): rec for (M, N, K, dt, ck), rec in cache.items()}
    table = read_table(out_path) if out_path.is_file() else {}
    table.setdefault("buckets", {})
    table.setdefault("shapes", {})
    by_problem, sustained, latest = {}, {}, {}
    for (M, N, K, dt, ck), rec in cache.items():
        if dt == dtype and "us" in rec:
            by_problem.setdefault((M, N, K), {})[ck] = rec["us"]
            if "verified" in rec:
                latest[(M, N, K)] = max(latest.get((M, N, K), 0), rec["verified"])
    for (M, N, K, dt, ck), rec in cache.items():
        if dt == dtype and "verified" in rec and rec["verified"] == latest[(M, N, K)]:
            sustained.setdefault((M, N, K), {})[ck] = rec["us_sustained"]
    largest_m = {}
    for M, N, K in by_problem:
        largest_m[(N, K)] = max(M, largest_m.get((N, K), 0))
    overall_largest = max(largest_m.values(), default=0)
    slowdowns = {}
    for (M, N, K), times in sorted(by_problem.items()):
        finals = sustained.get((M, N, K))
        best_key = min(finals, key=finals.get) if finals else min(times, key=times.get)
        fastest = min(times.values())
        entry = table["shapes"].setdefault(f"{N},{K}", {})
        entry[m_bucket(M)] = json.loads(best_key)
        if M == largest_m[(N, K)] >= LARGE_M:
            entry["any"] = json.loads(best_key)
        elif largest_m[(N, K)] < LARGE_M:
            entry.pop("any", None)
        for ck, t in times.items():
            slowdowns.setdefault(M, {}).setdefault(ck, []).append(t / fastest)
    for M, per_cfg in (slowdowns.items() if buckets else ()):
        most = max(map(len, per_cfg.values()))
        covered = {ck: v for ck, v in per_cfg.items() if len(v) == most}
        generic = json.loads(min(covered, key=lambda ck: math.fsum(map(math.log, covered[ck]))))
        table["buckets"][m_bucket(M)] = generic
        if M == overall_largest:
            table["buckets"]["any"] = generic
    table["_meta"] = {
        "op": op_name, "device": device_name, "dtype": dtype,
        "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command, "triton": _triton_version(), "torch": torch.__version__,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(_sorted_table(table), indent=1) + "\n")
    clear_caches()
    return table


def _sorted_table(table):
    out = {"_meta": table["_meta"], "buckets": dict(sorted(table["buckets"].items(), key=_bucket_order))}
    # generated by the tuner from measurements; see _meta.command
    out["shapes"] = {k: dict(sorted(v.items(), key=_bucket_order)) for k, v in sorted(table["shapes"].items())}
    return out


def _bucket_order(item):
    return (1, 0) if item[0] == "any" else (0, int(item[0].rsplit("_", 1)[1]))


def _triton_version():
    import triton

    return triton.__version__


def default_cache(device_name: str, op_name: str) -> Path:
    """The measurements of an op on a device, beside its user table (so a rerun resumes)."""
    return user_config_dir() / device_name / f"{op_name}.tune.jsonl"


def main(argv=None):
    p = argparse.ArgumentParser(prog="gemmkit tune", description=__doc__.split("\n\n")[0])
    p.add_argument("op", help="op to tune, e.g. a16w16")
    p.add_argument("--shapes", type=int, nargs="+", metavar="N K", help="(N, K) weight shapes, pairs of ints")
    p.add_argument("--model", nargs="+", default=[], help="models from gemmkit/tools/models.json")
    p.add_argument("--from-model", action="append", default=[], metavar="MODULE:ATTR",
                   help="the nn.Linear shapes of a Python model: an nn.Module or a zero-argument callable "
                        "returning one (repeatable)")
    p.add_argument("--m", type=int, nargs="+", default=[16, 64, 256, 1024, 4096],
                   help="M values to tune the (N, K) shapes at, one per bucket (the largest, if >= 4096, also "
                        "fills the shape's 'any')")
    p.add_argument("--shape", type=int, nargs=3, action="append", default=[], metavar=("M", "N", "K"),
                   help="tune exactly this problem (M picks the bucket); repeatable")
    p.add_argument("--dtype", default=None, help="operand dtype (default: the op's first)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=None,
                       help="table to write/merge (default: your user table, see `gemmkit configs show`)")
    where.add_argument("--package", action="store_true", help="write the package's shipped table (maintainers)")
    p.add_argument("--no-buckets", action="store_true",
                   help="write the tuned shapes' entries only, not the generic buckets that serve all other shapes")
    p.add_argument("--cache", type=Path, default=None,
                   help="JSONL of measurements, for resuming (default: beside the user table)")
    p.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)),
                   help="compile processes (0: compile in this process)")
    p.add_argument("--rep-ms", type=int, default=REP_MS, help="graph replay time per measurement")
    p.add_argument("--time-budget-s", type=float, default=None, help="stop measuring after this long")
    p.add_argument("--seed", type=Path, default=None, metavar="JSONL",
                   help="another device's tuning records (e.g. the H100's tuning/tune_a16w16.jsonl for an H200): "
                        "problems it measured are tuned over its --seed-top fastest configs only")
    p.add_argument("--seed-top", type=int, default=8, help="configs per problem taken from --seed")
    args = p.parse_args(argv)
    op = get_op(args.op)
    if op.table is None:
        raise SystemExit(f"{args.op} has no config table to tune")
    dtype = op_dtype(op, args.dtype)  # the table and the cache records are per dtype
    heldout = [m for m in args.model if load_models().get(m, {}).get("heldout")]
    if heldout and args.package:
        raise SystemExit(f"--package: {', '.join(heldout)} judge the configs of untuned shapes; the shipped "
                         "tables must never see them")
    shapes = model_shapes(args.model) if args.model else []
    for spec in args.from_model:
        shapes += import_model_shapes(spec)
    if args.shapes:
        if len(args.shapes) % 2:
            raise SystemExit("--shapes takes pairs: N K [N K ...]")
        shapes += [(f"{n}x{k}", n, k) for n, k in zip(args.shapes[::2], args.shapes[1::2])]
    if not shapes and not args.shape:
        raise SystemExit("give --shape M N K, --shapes N K ..., --model NAME ... and/or --from-model MODULE:ATTR")
    problems = [(M, N, K) for _, N, K in shapes for M in sorted(set(args.m))] + [tuple(s) for s in args.shape]
    if min(min(p) for p in problems) < 1:
        raise SystemExit("--shape, --shapes and --m take sizes >= 1")
    if args.workers < 0:
        raise SystemExit("--workers takes a count >= 0")
    if not torch.cuda.is_available():
        raise SystemExit("gemmkit tune measures kernels on a CUDA GPU; none is available here")
    dev = device_info()
    out = args.out or table_path(dev.name, op.table, "shipped" if args.package else "user")
    cache = args.cache or default_cache(dev.name, args.op)
    command = "gemmkit tune " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.seed is not None and not args.seed.is_file():
        raise SystemExit(f"--seed {args.seed}: no such file")
    if args.seed_top < 1:
        raise SystemExit("--seed-top takes a count >= 1")
    tune(args.op, problems, dtype, out, cache, args.workers, args.rep_ms, command, args.time_budget_s,
         buckets=not args.no_buckets, seed=load_cache(args.seed) if args.seed else None, seed_top=args.seed_top)
