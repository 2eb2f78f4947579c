"""The same MoE layer through PyTorch's bf16 grouped GEMM, beside mxmoe's (a benchmark).

    python python/bench/torch_grouped_gemm.py [--tokens 128 1024 4096]
        [--models gpt-oss-20b gpt-oss-120b deepseek-v4-flash deepseek-v4-pro] [--json FILE]

What a user without mxmoe would run: the experts dequantised to bf16 once (4x the memory of MXFP4),
then per forward, from router logits: the model's router (gpt-oss: top-k + softmax; DeepSeek-V4:
sqrt(softplus), top-k of that plus the selection bias, weights over their sum times the routed
scaling), a sort of the (token, slot) pairs by expert, the gathered rows through torch._grouped_mm
for FC1 (+ bias where the model has one, the model's SwiGLU), FC2, the routing weights, and a
scatter-add back to the tokens. Both layers take the same MXFP4 weights (random codes and scales;
the bf16 copy is exact) and the same logits, each is captured in a CUDA graph, and replays are timed
with CUDA events (median of 20). mxmoe's rotates over 8 layers' weights as `mxmoe bench` does, or
over as many (at least 2) as fit beside the bf16 layer and an eighth of the card (DeepSeek-V4-Pro: a
13.4 GB layer, and 50.7 GB of bf16 experts); the bf16 layer uses one (each bf16 expert is larger
than L2 already). A model whose bf16 experts do not fit the card has no torch column. The relative
error of the two outputs by norm is printed beside the times, and so is the time of the bf16
layer's two grouped GEMMs alone (inputs permuted beforehand): what the layer would cost if its
routing, gathers, biases, SwiGLU and scatter were free.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import numpy as np
import torch

import mxmoe
import mxmoe.torch as mxtorch
from mxfp4_weights import dequantize, random_mxfp4
from timing import graph_us


@dataclass(frozen=True)
class Model:
    """A layer's sizes and what its spec computes (include/mxmoe/layer_spec.hpp)."""
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    alpha: float = 1.702
    limit: float = 7.0
    up_offset: float = 1.0
    concatenated: bool = False    # FC1's rows [gate; up], else gate and up interleaved
    biases: bool = True           # expert biases and the router's logit bias
    routed_scaling: float | None = None  # the sqrt-softplus router's; None: softmax over the top-k


MODELS = {
    "gpt-oss-20b": Model(32, 4, 2880, 2880),
    "gpt-oss-120b": Model(128, 4, 2880, 2880),
    "deepseek-v4-flash": Model(256, 6, 4096, 2048, 1.0, 10.0, 0.0, True, False, 1.5),
    "deepseek-v4-pro": Model(384, 6, 7168, 3072, 1.0, 10.0, 0.0, True, False, 2.5),
}


def route(m: Model, logits: torch.Tensor, selection_bias: torch.Tensor | None):
    """(experts [T, k], weights [T, k]) as the model's router picks and weighs them."""
    if m.routed_scaling is None:
        top = torch.topk(logits, m.top_k, dim=1)
        return top.indices, torch.softmax(top.values, dim=1)
    scores = torch.sqrt(torch.nn.functional.softplus(logits))
    experts = torch.topk(scores + selection_bias, m.top_k, dim=1).indices
    chosen = scores.gather(1, experts)
    return experts, chosen / chosen.sum(dim=1, keepdim=True) * m.routed_scaling


class TorchLayer:
    """The layer in PyTorch with bf16 experts: the routing, torch._grouped_mm, SwiGLU, scatter-add."""

    def __init__(self, t: dict, m: Model):
        self.m = m
        self.w1 = dequantize(t["gate_up_blocks"], t["gate_up_scales"])  # [E, H, 2I], columns in FC1's row order
        self.w2 = dequantize(t["down_blocks"], t["down_scales"])        # [E, I, H]
        self.b1, self.b2 = t.get("gate_up_bias"), t.get("down_bias")    # bf16 [E, 2I], [E, H], or None
        self.selection_bias = t.get("selection_bias")

    def gemms(self, x: torch.Tensor, logits: torch.Tensor):
        """The two grouped GEMMs alone, on inputs permuted beforehand: a callable to time."""
        experts = route(self.m, logits, self.selection_bias)[0].flatten()
        order = torch.argsort(experts, stable=True)
        offs = torch.cumsum(torch.nn.functional.one_hot(experts, logits.shape[1]).sum(0), 0).to(torch.int32)
        rows = x[order // self.m.top_k]
        a = torch.empty(rows.shape[0], self.w2.shape[1], dtype=torch.bfloat16, device=x.device).normal_()
        return lambda: (torch._grouped_mm(rows, self.w1, offs=offs), torch._grouped_mm(a, self.w2, offs=offs))

    def __call__(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        m = self.m
        tokens, e = logits.shape
        experts, weights = route(m, logits, self.selection_bias)
        experts, weights = experts.flatten(), weights.flatten()
        order = torch.argsort(experts, stable=True)
        counts = torch.nn.functional.one_hot(experts, e).sum(0)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        sorted_experts = experts[order]
        rows = x[order // m.top_k]
        h = torch._grouped_mm(rows, self.w1, offs=offs)
        if self.b1 is not None:
            h = h + self.b1[sorted_experts]
        gate, up = (h[:, :m.intermediate], h[:, m.intermediate:]) if m.concatenated else (h[:, 0::2], h[:, 1::2])
        glu, lin = gate.clamp(max=m.limit), up.clamp(-m.limit, m.limit)
        a = (glu * torch.sigmoid(m.alpha * glu) * (lin + m.up_offset)).to(torch.bfloat16)
        y = torch._grouped_mm(a, self.w2, offs=offs)
        if self.b2 is not None:
            y = y + self.b2[sorted_experts]
        y = y.float() * weights[order, None]
        return torch.zeros(tokens, x.shape[1], device=x.device).index_add_(0, order // m.top_k, y).to(torch.bfloat16)


def layer_tensors(gen: torch.Generator, m: Model, device: str = "cuda") -> dict:
    """A layer's random MXFP4 experts, router and the biases its spec has, on `device` (`gen`'s)."""
    e, h, i = m.experts, m.hidden, m.intermediate
    fc1 = random_mxfp4(gen, e, 2 * i, h, 3.0, device)
    fc2 = random_mxfp4(gen, e, h, i, 1.0, device)
    normal = lambda scale, *shape: scale * torch.randn(*shape, device=device, generator=gen)  # noqa: E731
    t = {"gate_up_blocks": fc1[0], "gate_up_scales": fc1[1], "down_blocks": fc2[0], "down_scales": fc2[1],
         "router_weight": normal(0.1, e, h).to(torch.bfloat16)}
    if m.biases:
        t.update(gate_up_bias=normal(0.1, e, 2 * i).to(torch.bfloat16), down_bias=normal(0.1, e, h).to(torch.bfloat16),
                 router_bias=normal(0.1, e).to(torch.bfloat16))
    if m.routed_scaling is not None:
        t["selection_bias"] = normal(0.1, e)  # fp32, about the scores' spread
    return t


def mxmoe_weights(t: dict, m: Model) -> mxmoe.Weights:
    host = lambda a: a.view(torch.int16).cpu().numpy().view(np.uint16) if a.dtype == torch.bfloat16 else a.cpu().numpy()  # noqa: E731
    if m.routed_scaling is not None:  # DeepSeek-V4, transformers' names: codes [E, N, K/2], scales [E, N, K/32]
        e = m.experts
        return mxmoe.weights_from_tensors({
            "gate.weight": host(t["router_weight"]), "gate.e_score_correction_bias": host(t["selection_bias"]),
            "experts.gate_up_proj": host(t["gate_up_blocks"].reshape(e, 2 * m.intermediate, m.hidden // 2)),
            "experts.gate_up_proj_scale_inv": host(t["gate_up_scales"]),
            "experts.down_proj": host(t["down_blocks"].reshape(e, m.hidden, m.intermediate // 2)),
            "experts.down_proj_scale_inv": host(t["down_scales"])}, top_k=m.top_k, routed_scaling=m.routed_scaling)
    return mxmoe.weights_from_tensors({
        "router.weight": host(t["router_weight"]), "router.bias": host(t["router_bias"]),
        "experts.gate_up_proj_blocks": host(t["gate_up_blocks"]), "experts.gate_up_proj_scales": host(t["gate_up_scales"]),
        "experts.gate_up_proj_bias": host(t["gate_up_bias"]), "experts.down_proj_blocks": host(t["down_blocks"]),
        "experts.down_proj_scales": host(t["down_scales"]), "experts.down_proj_bias": host(t["down_bias"])},
        top_k=m.top_k)


def bf16_bytes(m: Model) -> int:
    """The layer's experts in bf16 (TorchLayer's)."""
    return 2 * m.experts * 3 * m.hidden * m.intermediate


def mxfp4_bytes(m: Model) -> int:
    """The layer's experts in MXFP4: half a byte a value and a scale byte per 32 (mxmoe's, and the random
    tensors a layer is made from)."""
    return m.experts * 3 * m.hidden * m.intermediate * 17 // 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 1024, 4096])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = []
    for model in args.models:
        m = MODELS[model]
        gen = torch.Generator(device="cuda").manual_seed(m.experts)
        # Layers of mxmoe's rotation that fit beside the bf16 layer, an eighth of the card and the
        # next layer's random tensors (one more layer's bytes); at least 2, else no torch column.
        free, total = torch.cuda.mem_get_info()
        room = free - total // 8 - mxfp4_bytes(m)
        with_torch = (room - bf16_bytes(m)) // mxfp4_bytes(m) >= 2
        count = min(8, (room - (bf16_bytes(m) if with_torch else 0)) // mxfp4_bytes(m))
        if count < 2:
            raise SystemExit(f"{model}: two {mxfp4_bytes(m) / 1e9:.1f} GB layers do not fit this card")
        if not with_torch:
            print(f"{model}: its bf16 experts ({bf16_bytes(m) / 1e9:.1f} GB) do not fit beside two of mxmoe's "
                  "layers: no torch column", flush=True)
        moe, bf16 = [], None
        for layer in range(count):  # mxmoe rotates over the layers' weights; the bf16 layer holds the first's
            t = layer_tensors(gen, m)
            moe.append(mxtorch.MoeLayer(mxmoe_weights(t, m), max_tokens=max(args.tokens)))
            if layer == 0 and with_torch:
                bf16 = TorchLayer(t, m)
            del t
        print(f"{model}: mxmoe rotates over {len(moe)} layers", flush=True)
        for tokens in args.tokens:
            xs = [torch.randn(tokens, m.hidden, device="cuda", generator=gen).bfloat16() for _ in moe]
            logits = [torch.randn(tokens, m.experts, device="cuda", generator=gen) for _ in moe]
            mxmoe_us = graph_us(lambda: [layer(x, lg) for layer, x, lg in zip(moe, xs, logits)]) / len(moe)
            row = {"model": model, "tokens": tokens, "mxmoe_layers": len(moe), "mxmoe_us": mxmoe_us,
                   "torch_grouped_mm_bf16_us": None, "torch_gemms_only_us": None, "relative_error": None}
            if bf16 is not None:
                expected = bf16(xs[0], logits[0]).float()
                got = moe[0](xs[0], logits[0]).float()
                row["relative_error"] = (torch.linalg.norm(got - expected) / torch.linalg.norm(expected)).item()
                row["torch_grouped_mm_bf16_us"] = graph_us(lambda: bf16(xs[0], logits[0]))
                row["torch_gemms_only_us"] = graph_us(bf16.gemms(xs[0], logits[0]))
            rows.append(row)
            print(f"{model} T={tokens}: mxmoe {mxmoe_us:.1f} us, torch bf16 grouped {row['torch_grouped_mm_bf16_us']} us",
                  flush=True)
        for layer in moe:
            layer.free()
        bf16 = None  # its bf16 experts, before the next model's
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}: us per layer, CUDA-graph replays, median")
    print(f"{'model':<17} {'T':>6} {'mxmoe':>9} {'torch bf16':>11} {'torch/mxmoe':>12} {'GEMMs only':>11} "
          f"{'rel.err':>8}")
    for r in rows:
        if r["torch_grouped_mm_bf16_us"] is None:
            print(f"{r['model']:<17} {r['tokens']:>6} {r['mxmoe_us']:>9.1f} {'-':>11} {'-':>12} {'-':>11} {'-':>8}")
            continue
        print(f"{r['model']:<17} {r['tokens']:>6} {r['mxmoe_us']:>9.1f} {r['torch_grouped_mm_bf16_us']:>11.1f} "
              f"{r['torch_grouped_mm_bf16_us'] / r['mxmoe_us']:>12.2f} {r['torch_gemms_only_us']:>11.1f} "
              f"{r['relative_error']:>8.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
