"""Runs every MoE layer of a transformers gpt-oss model (GptOssForCausalLM, GptOssModel) through mxmoe.

    import mxmoe.integrations.transformers as mxt
    model = GptOssForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda")
    mxt.use_mxmoe(model)          # each decoder layer's `mlp` becomes an MxmoeMLP
    model.generate(...)

Each layer's experts are read once from the model: dense experts (GptOssExperts: bf16 or float32
weights, as transformers holds them unquantised or after Mxfp4Config(dequantize=True)) are quantised
to MXFP4, exactly for weights that were MXFP4; MXFP4 experts held by transformers' quantizer
(Mxfp4GptOssExperts) are un-swizzled as transformers itself saves them. A model on a CUDA device is
converted there, layer by layer, with no copy through the host (mxmoe.torch.MoeLayer.from_tensors);
a model on the CPU is converted on the host (weights_of) and uploaded. With `checkpoint`, the experts
come from the gpt-oss checkpoint instead. The layers' weights come from PyTorch's allocator, to which
each layer's old experts go back as it is converted.

Routing: "transformers" (the default) keeps the model's own router module (bf16 logits, torch.topk)
and calls mxmoe's engine form with its choice, so the routing, and the router scores the layer
returns, are the model's. "mxmoe" routes inside mxmoe from float32 logits of the same router weights
(one call for the whole layer; ties among bf16 logits may then go another way than torch.topk's).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

import mxmoe
import mxmoe.torch as mxtorch

__all__ = ["MxmoeMLP", "use_mxmoe", "weights_of"]


class MxmoeMLP(torch.nn.Module):
    """A gpt-oss MoE block (transformers' GptOssMLP) through mxmoe: hidden_states [B, S, H] ->
    (out [B, S, H], router scores), as GptOssMLP returns them."""

    def __init__(self, router: torch.nn.Module, moe: mxtorch.MoeLayer, routing: str = "transformers"):
        super().__init__()
        if routing not in ("transformers", "mxmoe"):
            raise ValueError(f"routing: expected 'transformers' or 'mxmoe', got {routing!r}")
        self.router = router
        self.moe = moe
        self.routing = routing

    def forward(self, hidden_states: torch.Tensor):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        x16 = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
        if self.routing == "transformers":
            _, scores, indices = self.router(x)
            out = self.moe.experts(x16.contiguous(), indices, scores, check_ids=False)
        else:
            logits = torch.nn.functional.linear(x.float(), self.router.weight.float(), self.router.bias.float())
            out = self.moe(x16.contiguous(), logits)
            scores = None
        return out.to(hidden_states.dtype).reshape(shape), scores


def weights_of(mlp: torch.nn.Module, top_k: int) -> mxmoe.Weights:
    """One GptOssMLP's weights (its router and experts) as mxmoe weights, on the host (floating-point
    tensors rounded to bf16)."""
    return mxmoe.weights_from_tensors({name: _host(t) for name, t in _tensors_of(mlp).items()}, top_k=top_k)


def _tensors_of(mlp: torch.nn.Module) -> dict[str, torch.Tensor]:
    """One GptOssMLP's router and experts as tensors on their device, by the names
    mxmoe.weights_from_tensors takes: dense experts as they are; transformers' swizzled MXFP4 experts
    un-swizzled (by torch ops on their device) into the checkpoint's blocks [E, rows, K/32, 16] and
    scales [E, rows, K/32]."""
    router, experts = mlp.router, mlp.experts
    tensors = {"router.weight": router.weight, "router.bias": router.bias}
    if _is_swizzled_mxfp4(experts):
        e, h = experts.num_experts, experts.hidden_size
        for proj in ("gate_up_proj", "down_proj"):
            storage = getattr(experts, proj).storage
            scale_storage = getattr(experts, f"{proj}_precision_config").weight_scale.storage
            blocks = storage.layout.unswizzle_data(storage.data).transpose(-1, -2)
            scales = scale_storage.layout.unswizzle_data(scale_storage.data).transpose(-1, -2)
            rows = 2 * experts.intermediate_size if proj == "gate_up_proj" else h
            tensors[f"experts.{proj}_blocks"] = blocks.reshape(e, rows, -1, 16)
            tensors[f"experts.{proj}_scales"] = scales
            tensors[f"experts.{proj}_bias"] = getattr(experts, f"{proj}_bias")
    elif getattr(experts, "gate_up_proj", None) is not None and experts.gate_up_proj.dim() == 3:
        for name in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"):
            tensors[f"experts.{name}"] = getattr(experts, name)
    else:
        raise ValueError(f"{type(experts).__name__}: neither dense experts (gate_up_proj [E, H, 2I]) nor "
                         "transformers' MXFP4 experts; pass checkpoint= to read them from the checkpoint")
    return {name: t.detach() for name, t in tensors.items()}


def use_mxmoe(model: torch.nn.Module, *, device=None, max_tokens: Optional[int] = None,
              checkpoint: Optional[str] = None, routing: str = "transformers") -> torch.nn.Module:
    """Replaces the `mlp` of every decoder layer of a transformers gpt-oss model with an MxmoeMLP on
    `device` (default: where the layer's router is), and returns the model. `max_tokens` prepares every
    launch up to that many tokens per call (a prefill's batch x sequence), so that no later call or
    graph capture waits on a kernel load. `checkpoint`: read the experts of decoder layer i from layer i
    of this gpt-oss checkpoint (a file or directory) instead of from the model."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    config = getattr(model, "config", None)
    if layers is None or config is None or getattr(config, "model_type", None) != "gpt_oss":
        raise TypeError(f"model: expected a transformers gpt-oss model, got {type(model).__name__}")
    top_k = int(config.num_experts_per_tok)
    for index, block in enumerate(layers):
        mlp = block.mlp
        if isinstance(mlp, MxmoeMLP):
            continue
        target = torch.device(device) if device is not None else mlp.router.weight.device
        if checkpoint:
            moe = mxtorch.MoeLayer(mxmoe.load_checkpoint(checkpoint, layer=index), device=target, max_tokens=max_tokens)
        elif mlp.router.weight.device.type == "cuda" and target.type == "cuda":
            tensors = {name: t.to(target) for name, t in _tensors_of(mlp).items()}
            moe = mxtorch.MoeLayer.from_tensors(tensors, top_k=top_k, max_tokens=max_tokens)
            del tensors
        else:
            moe = mxtorch.MoeLayer(weights_of(mlp, top_k), device=target, max_tokens=max_tokens)
        block.mlp = MxmoeMLP(mlp.router, moe, routing)
        del mlp  # the dense experts go with the old block
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return model


def _is_swizzled_mxfp4(experts) -> bool:
    proj = getattr(experts, "gate_up_proj", None)
    return hasattr(proj, "storage") and hasattr(getattr(proj.storage, "layout", None), "unswizzle_data")


def _host(t: torch.Tensor) -> np.ndarray:
    """A tensor's values on the host as NumPy: floating point as bf16 bits (rounded to nearest even
    where it is wider, on its own device: mxmoe takes bf16 biases, router weights and dense experts),
    integers as they are."""
    t = t.detach()
    if t.is_floating_point():
        return t.to(torch.bfloat16).contiguous().view(torch.int16).cpu().numpy().view(np.uint16)
    return t.contiguous().cpu().numpy()
