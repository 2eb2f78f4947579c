"""A call captured in a CUDA graph, as the GPU tests capture and replay the layers."""

from __future__ import annotations

import torch


def capture(call):
    """(graph, output) of call() captured in a CUDA graph, after a warm-up call on the capture's side
    stream, which also makes lazy set-up (kernel loads, NCCL communicators) happen outside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    return graph, out
