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


class CapturedCalls:
    """`calls` (zero-argument callables, run in turn) captured `rounds` times into one CUDA graph
    lasting about `rep_ms` (at least once); `graph` replays them, `per_replay` calls a replay."""

    def __init__(self, calls, rep_ms: float, stream):
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
            self.rounds = max(1, int(rep_ms / est_ms))
            self.per_replay = self.rounds * len(calls)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                for _ in range(self.rounds):
                    for call in calls:
                        call()
        torch.cuda.synchronize()
        self.graph.replay()  # the first replay uploads the graph
        torch.cuda.synchronize()

    def replay_us(self, stream) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record()
            self.graph.replay()
            end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / self.per_replay


def time_graphs_us(*call_lists, rep_ms: float = 25, retries: int = 10) -> list[float]:
    """Median µs per call of each list of calls under CUDA-graph replay (the method of
    triton.testing.do_bench_cudagraph). With several lists, their replays alternate (A, B, A, B,
    ...) so that clock and temperature drift during the measurement affects all of them alike."""
    stream = torch.cuda.Stream()
    captured = [CapturedCalls(calls, rep_ms, stream) for calls in call_lists]
    samples = [[] for _ in captured]
    for _ in range(retries):
        for cap, out in zip(captured, samples):
            out.append(cap.replay_us(stream))
    del captured
    return [statistics.median(s) for s in samples]


def time_graph_us(calls, rep_ms: float = 25, retries: int = 10) -> float:
    """Median µs per call of `calls` under CUDA-graph replay."""
    return time_graphs_us(calls, rep_ms=rep_ms, retries=retries)[0]


def time_eager_pair_us(calls_a, calls_b, rounds: int = 3) -> tuple[float, float]:
    """Back-to-back eager per-call time of two lists of calls, alternating A, B, A, B, ..."""
    a, b = [], []
    for _ in range(rounds):
        a.append(time_eager_us(calls_a, repeats=3))
        b.append(time_eager_us(calls_b, repeats=3))
    return statistics.median(a), statistics.median(b)


def time_eager_us(calls, min_calls: int = 20, min_ms: float = 30.0, repeats: int = 5) -> float:
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
