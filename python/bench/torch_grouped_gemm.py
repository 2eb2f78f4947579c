"""The same gpt-oss MoE layer through PyTorch's bf16 grouped GEMM, beside mxmoe's (a benchmark).

    python python/bench/torch_grouped_gemm.py [--tokens 128 1024 4096] [--models gpt-oss-20b gpt-oss-120b]
                                              [--json FILE]

What a user without mxmoe would run: the experts dequantised to bf16 once (4x the memory of MXFP4),
then per forward, from router logits: top-k + softmax, a sort of the (token, slot) pairs by expert,
the gathered rows through torch._grouped_mm for FC1 (+ bias, the gpt-oss SwiGLU), FC2 (+ bias),
the routing weights, and a scatter-add back to the tokens. Both layers take the same MXFP4 weights
(random codes and scales; the bf16 copy is exact) and the same logits, each is captured in a CUDA
graph, and replays are timed with CUDA events (median of 20). mxmoe's rotates over 8 layers'
weights as `mxmoe bench` does; the bf16 layer uses one (each bf16 expert, 50 MB, is larger than L2
already). The relative error of the two outputs by norm is printed beside the times, and so is
the time of the bf16 layer's two grouped GEMMs alone (inputs permuted beforehand): what the layer
would cost if its routing, gathers, biases, SwiGLU and scatter were free.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import mxmoe
import mxmoe.torch as mxtorch
from mxfp4_weights import dequantize, random_mxfp4
from timing import SHAPES, graph_us


class TorchLayer:
    """The layer in PyTorch with bf16 experts: the routing, torch._grouped_mm, SwiGLU, scatter-add."""

    def __init__(self, t: dict, top_k: int):
        self.k = top_k
        self.w1 = dequantize(t["gate_up_blocks"], t["gate_up_scales"])  # [E, H, 2I], columns glu, linear alternating
        self.w2 = dequantize(t["down_blocks"], t["down_scales"])        # [E, I, H]
        self.b1, self.b2 = t["gate_up_bias"], t["down_bias"]            # bf16 [E, 2I], [E, H]

    def gemms(self, x: torch.Tensor, logits: torch.Tensor):
        """The two grouped GEMMs alone, on inputs permuted beforehand: a callable to time."""
        experts = torch.topk(logits, self.k, dim=1).indices.flatten()
        order = torch.argsort(experts, stable=True)
        offs = torch.cumsum(torch.nn.functional.one_hot(experts, logits.shape[1]).sum(0), 0).to(torch.int32)
        rows = x[order // self.k]
        a = torch.empty(rows.shape[0], self.w2.shape[1], dtype=torch.bfloat16, device=x.device).normal_()
        return lambda: (torch._grouped_mm(rows, self.w1, offs=offs), torch._grouped_mm(a, self.w2, offs=offs))

    def __call__(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        tokens, e = logits.shape
        top = torch.topk(logits, self.k, dim=1)
        weights = torch.softmax(top.values, dim=1).flatten()
        experts = top.indices.flatten()
        order = torch.argsort(experts, stable=True)
        counts = torch.nn.functional.one_hot(experts, e).sum(0)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        sorted_experts = experts[order]
        rows = x[order // self.k]
        h = torch._grouped_mm(rows, self.w1, offs=offs) + self.b1[sorted_experts]
        glu, lin = h[:, 0::2].clamp(max=7.0), h[:, 1::2].clamp(-7.0, 7.0)
        a = (glu * torch.sigmoid(1.702 * glu) * (lin + 1)).to(torch.bfloat16)
        y = (torch._grouped_mm(a, self.w2, offs=offs) + self.b2[sorted_experts]).float() * weights[order, None]
        return torch.zeros(tokens, x.shape[1], device=x.device).index_add_(0, order // self.k, y).to(torch.bfloat16)


def layer_tensors(gen: torch.Generator, e: int, h: int, i: int) -> dict:
    fc1 = random_mxfp4(gen, e, 2 * i, h, 3.0)
    fc2 = random_mxfp4(gen, e, h, i, 1.0)
    bias = lambda *shape: (0.1 * torch.randn(*shape, device="cuda", generator=gen)).to(torch.bfloat16)  # noqa: E731
    return {"gate_up_blocks": fc1[0], "gate_up_scales": fc1[1], "gate_up_bias": bias(e, 2 * i),
            "down_blocks": fc2[0], "down_scales": fc2[1], "down_bias": bias(e, h),
            "router_weight": bias(e, h), "router_bias": bias(e)}


def mxmoe_weights(t: dict, top_k: int) -> mxmoe.Weights:
    host = lambda a: a.view(torch.int16).cpu().numpy().view(np.uint16) if a.dtype == torch.bfloat16 else a.cpu().numpy()  # noqa: E731
    return mxmoe.weights_from_tensors({
        "router.weight": host(t["router_weight"]), "router.bias": host(t["router_bias"]),
        "experts.gate_up_proj_blocks": host(t["gate_up_blocks"]), "experts.gate_up_proj_scales": host(t["gate_up_scales"]),
        "experts.gate_up_proj_bias": host(t["gate_up_bias"]), "experts.down_proj_blocks": host(t["down_blocks"]),
        "experts.down_proj_scales": host(t["down_scales"]), "experts.down_proj_bias": host(t["down_bias"])}, top_k=top_k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 1024, 4096])
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = []
    for model in args.models:
        e, k, h, i = SHAPES[model]
        gen = torch.Generator(device="cuda").manual_seed(e)
        moe, bf16 = [], None
        for layer in range(8):  # mxmoe rotates over 8 layers' weights; the bf16 layer holds the first's
            t = layer_tensors(gen, e, h, i)
            moe.append(mxtorch.MoeLayer(mxmoe_weights(t, k), max_tokens=max(args.tokens)))
            if layer == 0:
                bf16 = TorchLayer(t, k)
            del t
        for tokens in args.tokens:
            xs = [torch.randn(tokens, h, device="cuda", generator=gen).bfloat16() for _ in moe]
            logits = [torch.randn(tokens, e, device="cuda", generator=gen) for _ in moe]
            expected = bf16(xs[0], logits[0]).float()
            error = (torch.linalg.norm(moe[0](xs[0], logits[0]).float() - expected) / torch.linalg.norm(expected)).item()
            mxmoe_us = graph_us(lambda: [m(x, l) for m, x, l in zip(moe, xs, logits)]) / len(moe)
            torch_us = graph_us(lambda: bf16(xs[0], logits[0]))
            gemms_us = graph_us(bf16.gemms(xs[0], logits[0]))
            rows.append({"model": model, "tokens": tokens, "mxmoe_us": mxmoe_us, "torch_grouped_mm_bf16_us": torch_us,
                         "torch_gemms_only_us": gemms_us, "relative_error": error})
            print(f"{model} T={tokens}: mxmoe {mxmoe_us:.1f} us, torch bf16 grouped {torch_us:.1f} us", flush=True)
        for m in moe:
            m.free()
        bf16 = None  # its bf16 experts, before the next model's
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}: us per layer, CUDA-graph replays, median")
    print(f"{'model':<13} {'T':>6} {'mxmoe':>9} {'torch bf16':>11} {'torch/mxmoe':>12} {'GEMMs only':>11} "
          f"{'rel.err':>8}")
    for r in rows:
        print(f"{r['model']:<13} {r['tokens']:>6} {r['mxmoe_us']:>9.1f} {r['torch_grouped_mm_bf16_us']:>11.1f} "
              f"{r['torch_grouped_mm_bf16_us'] / r['mxmoe_us']:>12.2f} {r['torch_gemms_only_us']:>11.1f} "
              f"{r['relative_error']:>8.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
