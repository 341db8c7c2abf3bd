"""Timing used by the benchmark and the tuner (one implementation for both).

Two figures per callable:
- graph: kernel time under CUDA-graph replay (`triton.testing.do_bench_cudagraph`, median): what
  an inference engine with graphs sees, free of the host's launch gaps.
- eager: per-call time of back-to-back eager calls, measured with events around a long loop: what
  a user without graphs sees. When the host is slower than the GPU this is the host's cost per
  call (Python, argument handling, launch).

Inputs rotate over several sets whose total size exceeds the L2 several times, so weights are
not served from L2 by the previous call.
"""

from __future__ import annotations

import statistics

import torch


def rotation_count(bytes_per_set: int, l2_bytes: int, max_sets: int = 32) -> int:
    """Input sets needed so that one pass over them is at least 3x the L2."""
    if bytes_per_set <= 0:
        return 1
    return int(max(1, min(max_sets, -(-3 * max(l2_bytes, 1) // bytes_per_set))))


def time_graph_us(calls, rep_ms: float = 25, retries: int = 10) -> float:
    """Median µs per call of `calls` (zero-argument callables, run in turn) under CUDA-graph
    replay: one graph holds enough rounds of all calls to last about `rep_ms`; it is replayed
    `retries` times (the method of triton.testing.do_bench_cudagraph, with fewer retries
    available for the tuner)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for call in calls:  # warm-up: compilation, caches, allocator
            call()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            for call in calls:
                call()
        end.record()
        end.synchronize()
        est_ms = max(start.elapsed_time(end) / 3, 1e-3)
        rounds = max(1, int(rep_ms / est_ms))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(rounds):
                for call in calls:
                    call()
        torch.cuda.synchronize()
        graph.replay()  # first replay uploads the graph
        samples = []
        for _ in range(retries):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / (rounds * len(calls)))
    del graph
    return statistics.median(samples)


def time_eager_us(calls, min_calls: int = 200, min_ms: float = 30.0, repeats: int = 5) -> float:
    """Median µs per call of back-to-back eager calls (host launch cost included)."""
    for call in calls:  # warm-up: compilation, caches, allocator
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for call in calls:
        call()
    end.record()
    end.synchronize()
    est_ms = max(start.elapsed_time(end) / len(calls), 1e-3)
    n = max(min_calls, int(min_ms / est_ms))
    n = -(-n // len(calls)) * len(calls)
    samples = []
    for _ in range(repeats):
        start.record()
        for i in range(n):
            calls[i % len(calls)]()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / n)
    return statistics.median(samples)
