"""Runs the MoE layers of a transformers model through mxmoe: gpt-oss (GptOssForCausalLM,
GptOssModel) and DeepSeek-V4 (DeepseekV4ForCausalLM, DeepseekV4Model).

    import mxmoe.integrations.transformers as mxt
    model = GptOssForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda")
    mxt.use_mxmoe(model)          # gpt-oss: each decoder layer's `mlp` becomes an MxmoeMLP
    model.generate(...)
    mxt.use_mxmoe(deepseek_v4)    # DeepSeek-V4: each MoE block's `experts` becomes an MxmoeExperts

What is replaced, by the model's type (config.model_type; _FAMILIES):
  gpt_oss      the MoE block (`mlp`, a GptOssMLP) becomes an MxmoeMLP, which keeps the block's router
  deepseek_v4  the block's `experts` (DeepseekV4Experts, or FP8Experts holding FP4 experts) becomes
               an MxmoeExperts: the block's own router (hash-routed layers: tid2eid[input_ids];
               the others: sqrt-softplus scores plus the selection bias) chooses and weighs the
               experts, MxmoeExperts computes them through mxmoe's engine form, and the block adds
               its own shared expert.
Another model type is refused with a TypeError naming it.

Each layer's experts are read once from the model. Dense experts (bf16 or float32 weights, as
transformers holds them unquantised or after dequantising a checkpoint) are quantised to MXFP4,
exactly for weights that were MXFP4: gpt-oss's by mxmoe (on the GPU, or on the host), DeepSeek-V4's by
torch ops on their own device (_quantize_mxfp4, by the same OCP rules). MXFP4 experts held by
transformers are taken as they are: gpt-oss's (Mxfp4GptOssExperts) un-swizzled as transformers itself
saves them, DeepSeek-V4's (FP8Experts with expert_dtype "fp4": int8 E2M1 pairs and E8M0 or
power-of-two float32 scales) as they are. A model on a CUDA device is converted there, layer by layer
(mxmoe.torch.MoeLayer.from_tensors, which builds a DeepSeek-V4 layer's MXFP4 on the host and
uploads it); a model on the CPU is converted on the host (weights_of) and uploaded. With `checkpoint`, the experts come from the model's checkpoint instead. The layers' weights
come from PyTorch's allocator, to which each layer's old experts go back as it is converted.

Routing of gpt-oss: "transformers" (the default) keeps the model's own router module (bf16 logits,
torch.topk) and calls mxmoe's engine form with its choice, so the routing, and the router scores the
layer returns, are the model's. "mxmoe" routes inside mxmoe from float32 logits of the same router
weights (one call for the whole layer; ties among bf16 logits may then go another way than
torch.topk's). DeepSeek-V4 takes "transformers" only: its hash-routed layers route by token id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

import mxmoe
import mxmoe.torch as mxtorch

__all__ = ["MxmoeExperts", "MxmoeMLP", "use_mxmoe", "weights_of"]


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


class MxmoeExperts(torch.nn.Module):
    """A MoE block's experts module (transformers' DeepseekV4Experts) through mxmoe's engine form:
    (hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H] in hidden_states'
    dtype, as the experts module takes and returns them. The block's own router chose the experts
    and their weights; hidden_states go in as bf16, the weights as float32."""

    def __init__(self, moe: mxtorch.MoeLayer):
        super().__init__()
        self.moe = moe
        self.num_experts = moe.routed_experts

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        x16 = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
        out = self.moe.experts(x16.contiguous(), top_k_index.reshape(x.shape[0], -1).contiguous(),
                               top_k_weights.reshape(x.shape[0], -1).contiguous(), check_ids=False)
        return out.to(hidden_states.dtype).reshape(shape)


def weights_of(mlp: torch.nn.Module, top_k: int, routed_scaling: Optional[float] = None) -> mxmoe.Weights:
    """One MoE block's weights (its router and experts: a GptOssMLP, or a DeepseekV4SparseMoeBlock,
    whose `routed_scaling` is config.routed_scaling_factor) as mxmoe weights, on the host (gpt-oss's
    floating-point tensors rounded to bf16)."""
    family = _family_of_block(mlp)
    host = {name: _host(t, keep_float32=name in family.float32) for name, t in family.tensors(mlp).items()}
    options = {} if routed_scaling is None else {"routed_scaling": routed_scaling}
    return mxmoe.weights_from_tensors(host, top_k=top_k, **options)


def _gpt_oss_tensors(mlp: torch.nn.Module) -> dict[str, torch.Tensor]:
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


def _deepseek_v4_tensors(block: torch.nn.Module) -> dict[str, torch.Tensor]:
    """One DeepseekV4SparseMoeBlock's router and experts as tensors on their device, by transformers'
    names that mxmoe.weights_from_tensors takes: gate.weight, and gate.tid2eid (hash-routed layers)
    or gate.e_score_correction_bias (float32); the experts as MXFP4, experts.gate_up_proj [E, 2I, H/2]
    and experts.down_proj [E, H, I/2] (uint8, two E2M1 a byte, low nibble first) with their
    _scale_inv [.., K/32] (E8M0 codes). MXFP4 experts (FP8Experts with expert_dtype "fp4") are taken as
    they are; dense ones (DeepseekV4Experts: [E, 2I, H] and [E, H, I], bf16 or float32) are quantised
    on their device (_quantize_mxfp4)."""
    gate, experts = block.gate, block.experts
    tensors = {"gate.weight": gate.weight}
    if getattr(gate, "tid2eid", None) is not None:
        tensors["gate.tid2eid"] = gate.tid2eid
    else:
        tensors["gate.e_score_correction_bias"] = gate.e_score_correction_bias.float()
    name = type(experts).__name__
    for proj in ("gate_up_proj", "down_proj"):
        weight = getattr(experts, proj, None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 3:
            raise ValueError(f"{name}: no {proj} [E, N, K] (expected DeepseekV4Experts, or FP8Experts with FP4 "
                             "experts); pass checkpoint= to read the experts from the checkpoint")
        weight = weight.detach()
        scale = getattr(experts, f"{proj}_scale_inv", None)
        if weight.dtype in _E2M1_PAIR_DTYPES and isinstance(scale, torch.Tensor):
            codes, scales = weight.view(torch.uint8), _e8m0_codes(scale.detach(), f"{name}.{proj}_scale_inv")
        elif weight.dtype in (torch.bfloat16, torch.float32, torch.float16) and scale is None:
            codes, scales = _quantize_mxfp4(weight)
        else:
            raise ValueError(f"{name}.{proj}: {weight.dtype} experts are not MXFP4 (mxmoe takes MXFP4 experts, "
                             "expert_dtype 'fp4', or dense bf16/float32 ones, which it quantises to MXFP4)")
        tensors[f"experts.{proj}"] = codes
        tensors[f"experts.{proj}_scale_inv"] = scales
    return {name: t.detach() for name, t in tensors.items()}


# Packed E2M1 pairs as transformers holds DeepSeek-V4's FP4 experts.
_E2M1_PAIR_DTYPES = tuple(d for d in (torch.int8, torch.uint8, getattr(torch, "float4_e2m1fn_x2", None)) if d is not None)
# mxmoe's DeepSeek-V4 expert (include/mxmoe/layer_spec.hpp, deepseek_v4_spec): SiLU, gate and up clamped to 10.
_DEEPSEEK_V4_ACTIVATION = ("silu", 10.0)
# Elements of a dense expert tensor that _quantize_mxfp4 converts at a time (float32 temporaries of
# a few times this many bytes).
_QUANTIZE_CHUNK = 1 << 24


def _quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense experts w [E, N, K] (K a multiple of 32) as MXFP4 on their device: codes [E, N, K/2] uint8
    (two E2M1 a byte, the even element in the low nibble) and E8M0 scales [E, N, K/32] uint8, by the OCP
    rules mxmoe's quantiser follows (include/mxmoe/mx_format.hpp): a block's scale is
    2^(floor(log2(amax)) - 2), its code clamped to [0, 254] (an all-zero block: 0); elements are
    value / scale rounded to nearest even on the E2M1 grid, saturating at +-6, signs kept. Values that
    were MXFP4 come back exactly (the codes may differ where a block's largest code was below 4). The
    values are taken as float32 (bf16 and float16 exactly); a NaN or an infinity is refused."""
    e, n, k = w.shape
    if k % 32:
        raise ValueError(f"experts: K must be a multiple of 32 (one E8M0 scale per 32), got {list(w.shape)}")
    codes = torch.empty((e, n, k // 2), dtype=torch.uint8, device=w.device)
    scales = torch.empty((e, n, k // 32), dtype=torch.uint8, device=w.device)
    step = max(1, _QUANTIZE_CHUNK // max(1, n * k))
    for first in range(0, e, step):
        part = w[first:first + step].float()
        if not bool(torch.isfinite(part).all()):
            raise ValueError("experts: a NaN or an infinity among the expert weights (MXFP4 has none)")
        blocks = part.reshape(*part.shape[:-1], k // 32, 32)
        amax = blocks.abs().amax(dim=-1)
        exponent = torch.frexp(amax).exponent  # amax = m 2^exponent, m in [0.5, 1): floor(log2 amax) = exponent - 1
        code = torch.where(amax > 0, (exponent.to(torch.int32) - 1 - 2 + 127).clamp(0, 254), 0)
        # value / scale as value times 2^(127 - code), built from its bits: exact, and a normal float32
        # for every code a finite amax reaches (<= 252)
        q = blocks * ((254 - code) << 23).view(torch.float32)[..., None]
        mag = q.abs()
        # nearest on the grid 0, 0.5, 1, 1.5, 2, 3, 4, 6; a tie goes to the even code
        nibble = ((mag > 0.25).to(torch.uint8) + (mag >= 0.75) + (mag > 1.25) + (mag >= 1.75) + (mag > 2.5)
                  + (mag >= 3.5) + (mag > 5.0))
        nibble = nibble | (torch.signbit(q).to(torch.uint8) << 3)
        pairs = nibble.reshape(*part.shape[:-1], k // 2, 2)
        codes[first:first + step] = pairs[..., 0] | (pairs[..., 1] << 4)
        scales[first:first + step] = code.to(torch.uint8)
    return codes, scales


def _e8m0_codes(scales: torch.Tensor, name: str) -> torch.Tensor:
    """E8M0 scales as their uint8 codes: float8_e8m0fnu or uint8 as they are, float32 powers of two
    (transformers' scale_fmt "float") converted exactly; another value is refused."""
    if scales.dtype == torch.uint8 or scales.dtype == getattr(torch, "float8_e8m0fnu", None):
        return scales.view(torch.uint8)
    if scales.dtype != torch.float32:
        raise ValueError(f"{name}: expected E8M0 scales (float8_e8m0fnu, uint8 or float32 powers of two), "
                         f"got {scales.dtype}")
    mantissa, exponent = torch.frexp(scales)
    code = exponent.to(torch.int32) - 1 + 127
    if not bool(((mantissa == 0.5) & (code >= 0) & (code <= 254)).all()):
        raise ValueError(f"{name}: float32 scales that are not powers of two in [2^-127, 2^127] (E8M0)")
    return code.to(torch.uint8)


@dataclass(frozen=True)
class _Family:
    """What use_mxmoe reads of one model family's MoE block (a decoder layer's `mlp`) and what of it
    mxmoe's module replaces."""
    label: str                # the family in messages
    blocks: tuple[str, ...]   # class names of its MoE block
    router: str               # the block's router module (where its weights are)
    replaced: Optional[str]   # the block's module that mxmoe's replaces; None: the whole block
    routings: tuple[str, ...]  # use_mxmoe's `routing` values it takes
    tensors: Callable[[torch.nn.Module], dict[str, torch.Tensor]]  # the block's router and experts by weights_from_tensors' names
    float32: tuple[str, ...]  # of those, the ones weights_from_tensors takes in float32 (the others go as bf16)
    options: Callable[[Any], dict[str, Any]]  # weights_from_tensors' keywords, from the model's config
    wrap: Callable[[torch.nn.Module, mxtorch.MoeLayer, str], torch.nn.Module]  # (block, layer, routing) -> module


def _deepseek_v4_options(config) -> dict[str, Any]:
    activation = (getattr(config, "hidden_act", None), float(getattr(config, "swiglu_limit", float("nan"))))
    if activation != _DEEPSEEK_V4_ACTIVATION:
        raise ValueError(f"config: mxmoe computes DeepSeek-V4's experts with hidden_act {_DEEPSEEK_V4_ACTIVATION[0]!r} "
                         f"and swiglu_limit {_DEEPSEEK_V4_ACTIVATION[1]:g}, got {activation[0]!r} and {activation[1]:g}")
    return {"top_k": int(config.num_experts_per_tok), "routed_scaling": float(config.routed_scaling_factor)}


# By config.model_type.
_FAMILIES = {
    "gpt_oss": _Family(
        label="gpt-oss", blocks=("GptOssMLP",), router="router", replaced=None, routings=("transformers", "mxmoe"),
        tensors=_gpt_oss_tensors, float32=(), options=lambda config: {"top_k": int(config.num_experts_per_tok)},
        wrap=lambda block, moe, routing: MxmoeMLP(block.router, moe, routing)),
    "deepseek_v4": _Family(
        label="DeepSeek-V4", blocks=("DeepseekV4SparseMoeBlock",), router="gate", replaced="experts",
        routings=("transformers",), tensors=_deepseek_v4_tensors, float32=("gate.e_score_correction_bias",),
        options=_deepseek_v4_options, wrap=lambda block, moe, routing: MxmoeExperts(moe)),
}


def _family_of_block(block: torch.nn.Module) -> _Family:
    for family in _FAMILIES.values():
        if type(block).__name__ in family.blocks:
            return family
    known = ", ".join(name for family in _FAMILIES.values() for name in family.blocks)
    raise TypeError(f"mlp: expected a MoE block of a model mxmoe knows ({known}), got {type(block).__name__}")


def use_mxmoe(model: torch.nn.Module, *, device=None, max_tokens: Optional[int] = None,
              checkpoint: Optional[str] = None, routing: str = "transformers") -> torch.nn.Module:
    """Puts mxmoe into every MoE layer of a transformers gpt-oss or DeepSeek-V4 model on `device`
    (default: where the layer's router is), and returns the model: gpt-oss's `mlp` becomes an
    MxmoeMLP, DeepSeek-V4's `mlp.experts` an MxmoeExperts (the module docstring says what stays the
    model's). `max_tokens` prepares every launch up to that many tokens per call (a prefill's batch x
    sequence), so that no later call or graph capture waits on a kernel load. `checkpoint`: read the
    experts of decoder layer i from layer i of this checkpoint (a file or directory, of the model's
    family) instead of from the model."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    family = _FAMILIES.get(model_type)
    if layers is None or family is None:
        known = " or ".join(f"{f.label} ({t!r})" for t, f in _FAMILIES.items())
        got = type(model).__name__ + ("" if model_type is None else f" (model_type {model_type!r})")
        raise TypeError(f"model: expected a transformers model of type {known}, got {got}")
    if routing not in family.routings:
        raise ValueError(f"routing: expected {' or '.join(map(repr, family.routings))} for a {family.label} model, "
                         f"got {routing!r}")
    options = family.options(config)
    for index, block in enumerate(layers):
        block = block.mlp
        if isinstance(block if family.replaced is None else getattr(block, family.replaced), (MxmoeMLP, MxmoeExperts)):
            continue
        source = getattr(block, family.router).weight.device
        target = torch.device(device) if device is not None else source
        if checkpoint:
            moe = mxtorch.MoeLayer(mxmoe.load_checkpoint(checkpoint, layer=index), device=target, max_tokens=max_tokens)
        elif source.type == "cuda" and target.type == "cuda":
            tensors = {name: t.to(target) for name, t in family.tensors(block).items()}
            moe = mxtorch.MoeLayer.from_tensors(tensors, **options, max_tokens=max_tokens)
            del tensors
        else:
            moe = mxtorch.MoeLayer(weights_of(block, **options), device=target, max_tokens=max_tokens)
        converted = family.wrap(block, moe, routing)
        if family.replaced is None:
            layers[index].mlp = converted
        else:
            setattr(block, family.replaced, converted)
        del block  # the dense experts go with the old module
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return model


def _is_swizzled_mxfp4(experts) -> bool:
    proj = getattr(experts, "gate_up_proj", None)
    return hasattr(proj, "storage") and hasattr(getattr(proj.storage, "layout", None), "unswizzle_data")


def _host(t: torch.Tensor, keep_float32: bool = False):
    """A tensor's values on the host: floating point as bf16 bits in NumPy (rounded to nearest even
    where it is wider, on its own device: mxmoe takes bf16 biases, router weights and dense experts),
    or, with `keep_float32`, as a float32 CPU tensor; integers (and MXFP4 codes and scales) as they
    are, in NumPy."""
    t = t.detach()
    if keep_float32:
        return t.float().contiguous().cpu()
    if t.is_floating_point() and t.element_size() > 1:
        return t.to(torch.bfloat16).contiguous().view(torch.int16).cpu().numpy().view(np.uint16)
    if t.dtype == getattr(torch, "float8_e8m0fnu", None):
        t = t.view(torch.uint8)
    return t.contiguous().cpu().numpy()
