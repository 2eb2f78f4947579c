"""What the Python call adds to the C++ runner, per layer call (a benchmark, not a test).

    python python/bench/call_overhead.py [--tokens 1 8 64] [--models gpt-oss-20b gpt-oss-120b] [--json FILE]

For each model and token count, over a rotation of 8 layers' weights (so that L2 does not hold the
experts, as in docs/benchmarking.md), with router logits given:
  graph C++    the extension's Runner.forward (the C++ runner, device pointers) captured in a CUDA
               graph, replays timed with CUDA events: the GPU time of the layer, as `mxmoe bench` times it
  graph torch  mxmoe.torch.MoeLayer called from PyTorch, captured the same way
  eager C++    Runner.forward called in a loop, no graph (the binding's own cost included)
  eager torch  MoeLayer(x, logits) in a loop: argument checks, the custom op's dispatch, output and
               workspace allocation
  eager engine MoeLayer.experts(x, ids, weights, check_ids=False) in a loop
  host torch   the host time of one eager torch call (perf_counter over one rotation, before the sync)
Eager figures are wall time per call with the GPU kept busy (events around the whole loop), so a
call whose host cost exceeds its GPU time shows that excess. Added cost outside a graph: eager torch -
eager C++; inside one: graph torch - graph C++ (the same kernels, so zero within noise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import mxmoe
import mxmoe.torch as mxtorch
from timing import SHAPES, graph_us, median_us

LAYERS = 8


def measure(layers, tokens: int, loops: int = 20) -> dict:
    e, k, h, _ = layers[0].shape
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    xs = [torch.randn(tokens, h, device="cuda", generator=gen).bfloat16() for _ in layers]
    logits = [torch.randn(tokens, e, device="cuda", generator=gen) for _ in layers]
    tops = [torch.topk(l, k, dim=1) for l in logits]
    ids = [t.indices.int() for t in tops]
    weights = [torch.softmax(t.values, dim=1) for t in tops]
    outs = [torch.empty_like(x) for x in xs]
    workspace = torch.empty(layers[0]._runner.workspace_size(tokens), dtype=torch.uint8, device="cuda")

    def cpp():
        stream = torch.cuda.current_stream().cuda_stream
        for layer, x, l, out in zip(layers, xs, logits, outs):
            layer._runner.forward(x.data_ptr(), l.data_ptr(), out.data_ptr(), tokens, workspace.data_ptr(),
                                  workspace.numel(), stream)

    def torch_layer():
        for layer, x, l in zip(layers, xs, logits):
            layer(x, l)

    def torch_engine():
        for layer, x, i, w in zip(layers, xs, ids, weights):
            layer.experts(x, i, w, check_ids=False)

    per_call = len(layers)
    row = {}
    for name, calls in (("graph C++", cpp), ("graph torch", torch_layer)):
        row[name] = graph_us(calls) / per_call
    for name, calls in (("eager C++", cpp), ("eager torch", torch_layer), ("eager engine", torch_engine)):
        row[name] = median_us(lambda: [calls() for _ in range(loops)], 5) / (loops * per_call)
    host = []
    for _ in range(5):  # a few calls ahead of the GPU at most, so that the launch queue never fills
        torch.cuda.synchronize()
        begin = time.perf_counter()
        torch_layer()
        host.append((time.perf_counter() - begin) * 1e6 / per_call)
    row["host torch"] = statistics.median(host)
    torch.cuda.synchronize()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    columns = ["graph C++", "graph torch", "eager C++", "eager torch", "eager engine", "host torch"]
    rows = []
    for model in args.models:
        layers = [mxtorch.MoeLayer(mxmoe.synthetic_weights(*SHAPES[model], seed=s), max_tokens=max(args.tokens))
                  for s in range(LAYERS)]
        for tokens in args.tokens:
            rows.append({"model": model, "tokens": tokens, **measure(layers, tokens)})
        for layer in layers:
            layer.free()
    print(f"{torch.cuda.get_device_name()}; microseconds per layer call, {LAYERS}-layer rotation, median")
    print(f"{'model':<13} {'T':>4} " + " ".join(f"{c:>12}" for c in columns) + f" {'added eager':>12} {'added graph':>12}")
    for r in rows:
        added = r["eager torch"] - r["eager C++"], r["graph torch"] - r["graph C++"]
        print(f"{r['model']:<13} {r['tokens']:>4} " + " ".join(f"{r[c]:>12.1f}" for c in columns) +
              f" {added[0]:>12.1f} {added[1]:>12.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
