"""What the benchmarks in this folder share: the gpt-oss layer shapes and CUDA-event timing, of a
callable or of a CUDA graph captured from one (run a script from anywhere: its folder is on the path)."""

from __future__ import annotations

import statistics

import torch

SHAPES = {"gpt-oss-20b": (32, 4, 2880, 2880), "gpt-oss-120b": (128, 4, 2880, 2880)}  # E, k, H, I


def median_us(run, repeats: int) -> float:
    """Median microseconds of run() over `repeats` runs timed with CUDA events, after one warm-up."""
    run()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def capture(calls) -> torch.cuda.CUDAGraph:
    """calls() captured in a CUDA graph, after a warm-up call on the capture's side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        calls()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    return graph


def graph_us(calls, repeats: int = 20) -> float:
    """Median microseconds of one replay of calls() captured in a CUDA graph."""
    return median_us(capture(calls).replay, repeats)
