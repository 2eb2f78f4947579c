"""mxmoe: the mixture-of-experts layer of MXFP4 models (gpt-oss, DeepSeek-V4) on NVIDIA GPUs, and its
CPU reference.

Weights come from a gpt-oss or DeepSeek-V4 checkpoint, from one layer's tensors (any of their
namings; gpt-oss's also as dense bf16 experts), or are synthetic; they are repacked once by the
layer built from them.

    import mxmoe
    weights = mxmoe.load_checkpoint("gpt-oss-20b/original", layer=3)
    layer = mxmoe.CpuLayer(weights)              # NumPy, no GPU needed
    y = layer(x)                                 # x [T, H]: float32, float16, or uint16 bf16 bits
    y = mxmoe.experts(x, topk_ids, topk_weights, layer)   # routing done by the caller

On a GPU, through PyTorch: `import mxmoe.torch` (mxmoe/torch.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from . import _mxmoe
from ._mxmoe import Error

__version__ = "0.1.0"
__all__ = [
    "Error",
    "Shape",
    "Spec",
    "Weights",
    "CpuLayer",
    "load_checkpoint",
    "weights_from_tensors",
    "synthetic_weights",
    "synthetic_model_weights",
    "MODELS",
    "experts",
]


class Shape(NamedTuple):
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int


class Spec(NamedTuple):
    """What a layer computes besides its sizes (include/mxmoe/layer_spec.hpp). An expert:
    gate = min(gate, swiglu_limit), up = clamp(up, -swiglu_limit, swiglu_limit),
    a = gate * sigmoid(swiglu_alpha * gate) * (up + up_offset). gpt-oss: alpha 1.702, limit 7, up + 1,
    interleaved gate/up rows, expert biases, softmax-top-k. DeepSeek-V4: alpha 1, limit 10, up + 0,
    concatenated [gate; up], no biases, sqrt-softplus (weights times routed_scaling) or, on its
    hash-routed layers, caller-top-k (the engine form only)."""
    router: str           # "softmax-top-k", "sqrt-softplus" or "caller-top-k"
    routed_scaling: float
    swiglu_alpha: float
    swiglu_limit: float
    up_offset: float
    gate_up: str          # "interleaved" or "concatenated"
    expert_biases: bool


class Weights:
    """One MoE layer's weights with MXFP4 experts, held on the host. `shape.num_experts` counts the
    experts held; an expert-parallel shard holds some of the layer's `routed_experts`."""

    def __init__(self, core: _mxmoe.Weights):
        self._core = core

    @property
    def shape(self) -> Shape:
        return Shape(*self._core.shape)

    @property
    def spec(self) -> Spec:
        return Spec(*self._core.spec)

    @property
    def routed_experts(self) -> int:
        """The experts the routing picks among: the layer's (a shard's router scores all of them)."""
        return self._core.routed_experts

    @property
    def global_experts(self) -> list[int]:
        """The layer's id of each expert held (0..E-1 for a whole layer)."""
        return list(self._core.global_experts)

    @property
    def router(self) -> tuple[np.ndarray, np.ndarray]:
        """The router, which every shard holds whole: weight [R, H] (float32 holding bf16 values) and
        bias [R] float32. softmax-top-k: logits = x weight^T + bias (a bf16 bias). sqrt-softplus: the
        scores sqrt(softplus(x weight^T)) weigh the experts, scores + bias choose them. A caller-top-k
        (hash-routed) layer has none: ValueError."""
        if self.spec.router == "caller-top-k":
            raise ValueError("router: the layer is hash-routed (caller-top-k): it has no router")
        weight, bias = self._core.router
        return _bf16_bits_to_float32(weight), bias

    def tensor_parallel_shard(self, rank: int, world: int) -> Weights:
        """Rank `rank` of `world` tensor-parallel shards: a slice of the intermediate dimension (its
        gate/up rows and FC2 columns, widened to whole 32-column scale blocks with zeros outside its
        own columns), FC2's bias on rank 0 only. The shards' outputs sum to the layer's."""
        _check_int("rank", rank)
        _check_int("world", world)
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank: expected 0 <= rank < world, got rank {rank} of world {world}")
        return Weights(self._core.tensor_parallel_shard(rank, world))

    def expert_parallel_shard(self, rank: int, world: int) -> Weights:
        """Rank `rank` of `world` expert-parallel shards: the experts [E rank / world, E (rank + 1) / world)
        of the layer's E, with the whole router. Routing still picks among all E; pairs routed to experts
        another rank holds add nothing, so the shards' outputs sum to the layer's."""
        _check_int("rank", rank)
        _check_int("world", world)
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank: expected 0 <= rank < world, got rank {rank} of world {world}")
        if self.routed_experts // world < self.shape.top_k:
            raise ValueError(f"world: {self.routed_experts} experts over {world} ranks leaves a rank fewer experts "
                             f"than the top-k ({self.shape.top_k})")
        return Weights(self._core.expert_parallel_shard(rank, world))

    def expert_shard(self, experts) -> Weights:
        """The shard holding the layer's experts `experts` (distinct ids, in any order: held expert e is
        experts[e]), with the whole router: an expert-parallel placement of the caller's choosing."""
        ids = [int(e) for e in experts]
        if len(set(ids)) != len(ids) or any(not 0 <= e < self.routed_experts for e in ids):
            raise ValueError(f"experts: expected distinct ids in [0, {self.routed_experts}), got {ids}")
        if len(ids) < self.shape.top_k:
            raise ValueError(f"experts: expected at least the top-k ({self.shape.top_k}) experts, got {len(ids)}")
        if self.global_experts != list(range(self.routed_experts)):
            raise ValueError("experts: these weights are already an expert-parallel shard")
        return Weights(self._core.expert_shard(ids))

    def __repr__(self) -> str:
        s, spec = self.shape, self.spec
        shard = "" if self.routed_experts == s.num_experts else f" of {self.routed_experts}"
        router = "" if spec.router == "softmax-top-k" else f", router={spec.router}"
        if spec.router == "sqrt-softplus":
            router += f"*{spec.routed_scaling:g}"
        return f"mxmoe.Weights(E={s.num_experts}{shard}, k={s.top_k}, H={s.hidden}, I={s.intermediate}{router})"


def load_checkpoint(path: str, layer: int = 0, *, scheme: str | None = None,
                    quantize_bf16_experts: bool = False) -> Weights:
    """Layer `layer` of a gpt-oss or DeepSeek-V4 checkpoint: a .safetensors file, a directory with
    model.safetensors.index.json, or a directory of .safetensors files; gpt-oss's openai
    (block.N.mlp.*) or Hugging Face (model.layers.N.mlp.*) names, DeepSeek-V4's own (layers.N.ffn.*)
    or transformers' (model.layers.N.mlp.*). `scheme` ("openai", "hf", "deepseek", "deepseek-hf")
    chooses where a checkpoint holds several; `quantize_bf16_experts` quantises a dequantised save's bf16 experts to MXFP4."""
    _check_int("layer", layer)
    if scheme not in (None, "openai", "hf", "deepseek", "deepseek-hf"):
        raise ValueError(f"scheme: expected 'openai', 'hf', 'deepseek', 'deepseek-hf' or None, got {scheme!r}")
    return Weights(_mxmoe.load_checkpoint(str(path), layer, scheme, bool(quantize_bf16_experts)))


def synthetic_weights(num_experts: int, top_k: int, hidden: int, intermediate: int, seed: int = 0) -> Weights:
    """Seeded random MXFP4 weights (what `mxmoe make-checkpoint --seed` writes for a layer)."""
    for name, value in (("num_experts", num_experts), ("top_k", top_k), ("hidden", hidden),
                        ("intermediate", intermediate), ("seed", seed)):
        _check_int(name, value)
    return Weights(_mxmoe.synthetic_weights(num_experts, top_k, hidden, intermediate, seed))


# The model presets (mxmoe's --model names): gpt-oss-20b, gpt-oss-120b, deepseek-v4-flash, deepseek-v4-pro.
MODELS = tuple(_mxmoe.model_names())


def synthetic_model_weights(model: str, seed: int = 0) -> Weights:
    """Seeded random MXFP4 weights of one layer of the preset `model` (one of MODELS) with that model's
    layer spec: DeepSeek-V4's sqrt-softplus router with its selection bias and [gate; up] SiLU-clamped
    experts without biases, gpt-oss's softmax router and biased SwiGLU (for a gpt-oss model the same
    weights as synthetic_weights with its shape and seed). A DeepSeek-V4-Pro layer takes 13.4 GB."""
    if model not in MODELS:
        raise ValueError(f"model: expected one of {', '.join(MODELS)}, got {model!r}")
    _check_int("seed", seed)
    return Weights(_mxmoe.synthetic_model_weights(model, seed))


# One layer's tensors by the end of their names, in each naming scheme.
_HF_NAMES = {
    "router_weight": "router.weight", "router_bias": "router.bias",
    "fc1_blocks": "experts.gate_up_proj_blocks", "fc1_scales": "experts.gate_up_proj_scales",
    "fc1_bias": "experts.gate_up_proj_bias", "fc2_blocks": "experts.down_proj_blocks",
    "fc2_scales": "experts.down_proj_scales", "fc2_bias": "experts.down_proj_bias",
}
_OPENAI_NAMES = {
    "router_weight": "gate.weight", "router_bias": "gate.bias",
    "fc1_blocks": "mlp1_weight.blocks", "fc1_scales": "mlp1_weight.scales", "fc1_bias": "mlp1_bias",
    "fc2_blocks": "mlp2_weight.blocks", "fc2_scales": "mlp2_weight.scales", "fc2_bias": "mlp2_bias",
}
_DENSE_NAMES = {
    "router_weight": "router.weight", "router_bias": "router.bias",
    "gate_up": "experts.gate_up_proj", "gate_up_bias": "experts.gate_up_proj_bias",
    "down": "experts.down_proj", "down_bias": "experts.down_proj_bias",
}


# DeepSeek-V4's layer in transformers' names (the experts stacked, [w1; w3] as gate_up) and in DeepSeek's
# own (the router here, each expert's w1, w3, w2 apart: _DEEPSEEK_EXPERT_W1).
_DEEPSEEK_HF_NAMES = {
    "router_weight": "gate.weight", "selection_bias": "gate.e_score_correction_bias", "tid2eid": "gate.tid2eid",
    "fc1": "experts.gate_up_proj", "fc1_scales": "experts.gate_up_proj_scale_inv",
    "fc2": "experts.down_proj", "fc2_scales": "experts.down_proj_scale_inv",
}
_DEEPSEEK_NAMES = {"router_weight": "gate.weight", "selection_bias": "gate.bias", "tid2eid": "gate.tid2eid"}
_DEEPSEEK_EXPERT_W1 = re.compile(r"(?:^|\.)experts\.(\d+)\.w1\.weight$")


def weights_from_tensors(tensors: Mapping[str, Any], *, top_k: int | None = None,
                         routed_scaling: float | None = None) -> Weights:
    """One layer's weights from its tensors (NumPy arrays or CPU torch tensors), named as in a
    checkpoint, with or without their layer prefix:
      gpt-oss, Hugging Face  router.weight/bias, experts.gate_up_proj_blocks/_scales/_bias,
                    experts.down_proj_blocks/_scales/_bias (MXFP4: uint8 blocks and E8M0 scales)
      gpt-oss, openai  gate.weight/bias, mlp1_weight.blocks/.scales, mlp1_bias, mlp2_weight.blocks/.scales,
                    mlp2_bias
      gpt-oss, dense bf16  router.weight/bias, experts.gate_up_proj [E, H, 2I], experts.gate_up_proj_bias,
                    experts.down_proj [E, I, H], experts.down_proj_bias (transformers' GptOssExperts),
                    quantised to MXFP4 here (losslessly for weights that were MXFP4)
      DeepSeek-V4, transformers  gate.weight [E, H], gate.e_score_correction_bias [E] float32,
                    experts.gate_up_proj [E, 2I, H/2] ([gate; up]) and experts.down_proj [E, H, I/2]
                    (int8 or uint8: two E2M1 a byte, low nibble first), their _scale_inv [.., K/32]
                    (uint8 or float8_e8m0fnu)
      DeepSeek-V4, DeepSeek  gate.weight, gate.bias [E] float32, experts.{e}.w1/w3.weight [I, H/2] (gate, up),
                    experts.{e}.w2.weight [H, I/2], each with its .scale [.., K/32]
    A DeepSeek-V4 layer with gate.tid2eid is hash-routed: no router is read, and only the engine form
    (CpuLayer.experts) runs it.
    Router weights and gpt-oss's biases may be bf16, float16 or float32 (rounded to bf16).
    top_k: the experts per token (default the model's: 4 for gpt-oss, 6 for DeepSeek-V4).
    routed_scaling: DeepSeek-V4's routed_scaling_factor (config.json; V4-Flash 1.5, V4-Pro 2.5), required
    for its sqrt-softplus-routed layers; a hash-routed layer's weights, scaling included, are the caller's."""
    if top_k is not None:
        _check_int("top_k", top_k)
    if routed_scaling is not None and not (isinstance(routed_scaling, (int, float, np.floating))
                                           and not isinstance(routed_scaling, bool)
                                           and np.isfinite(routed_scaling) and routed_scaling > 0):
        raise ValueError(f"routed_scaling: expected a finite number above 0, got {routed_scaling!r}")
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors: expected a mapping of names to arrays, got {type(tensors).__name__}")
    if _is_deepseek_v4(tensors):
        stacked = _find(tensors, _DEEPSEEK_HF_NAMES["fc1_scales"], required=False) is not None
        return _deepseek_v4_weights(tensors, stacked, 6 if top_k is None else top_k, routed_scaling)
    if routed_scaling is not None:
        raise ValueError("routed_scaling: gpt-oss layers have none (it is DeepSeek-V4's routed_scaling_factor)")
    top_k = 4 if top_k is None else top_k
    for scheme, names in (("hf", _HF_NAMES), ("openai", _OPENAI_NAMES)):
        if _find(tensors, names["fc1_blocks"], required=False) is not None:
            return _mxfp4_weights(tensors, names, top_k)
    if _find(tensors, _DENSE_NAMES["gate_up"], required=False) is not None:
        return _dense_weights(tensors, top_k)
    raise ValueError("tensors: no MoE expert tensors (looked for names ending in "
                     f"'{_HF_NAMES['fc1_blocks']}', '{_OPENAI_NAMES['fc1_blocks']}', '{_DENSE_NAMES['gate_up']}', "
                     f"'{_DEEPSEEK_HF_NAMES['fc1_scales']}' or 'experts.0.w1.weight')")


def _mxfp4_weights(tensors, names, top_k) -> Weights:
    a = {key: _find(tensors, suffix) for key, suffix in names.items()}
    fc1_blocks = _as_uint8(a["fc1_blocks"], names["fc1_blocks"])
    if fc1_blocks.ndim != 4 or fc1_blocks.shape[3] != 16 or fc1_blocks.shape[1] % 2:
        raise ValueError(f"{names['fc1_blocks']}: expected [E, 2I, H/32, 16] uint8, got {list(fc1_blocks.shape)}")
    e, rows1, h_blocks, _ = fc1_blocks.shape
    h, i = 32 * h_blocks, rows1 // 2
    expected = {
        "router_weight": (e, h), "router_bias": (e,), "fc1_scales": (e, rows1, h_blocks), "fc1_bias": (e, rows1),
        "fc2_blocks": (e, h, i // 32, 16), "fc2_scales": (e, h, i // 32), "fc2_bias": (e, h),
    }
    arrays = {"fc1_blocks": fc1_blocks}
    for key, shape in expected.items():
        convert = _as_uint8 if key.endswith(("_blocks", "_scales")) else _as_bf16_bits
        arrays[key] = _expect_shape(convert(a[key], names[key]), shape, names[key])
    _check_top_k(top_k, e)
    return Weights(_mxmoe.weights_from_mxfp4(top_k=top_k, **arrays))


def _dense_weights(tensors, top_k) -> Weights:
    names = _DENSE_NAMES
    gate_up = _as_bf16_bits(_find(tensors, names["gate_up"]), names["gate_up"])
    if gate_up.ndim != 3 or gate_up.shape[2] % 2:
        raise ValueError(f"{names['gate_up']}: expected [E, H, 2I], got {list(gate_up.shape)}")
    e, h, rows1 = gate_up.shape
    expected = {"router_weight": (e, h), "router_bias": (e,), "gate_up_bias": (e, rows1),
                "down": (e, rows1 // 2, h), "down_bias": (e, h)}
    arrays = {"gate_up": gate_up}
    for key, shape in expected.items():
        arrays[key] = _expect_shape(_as_bf16_bits(_find(tensors, names[key]), names[key]), shape, names[key])
    _check_top_k(top_k, e)
    return Weights(_mxmoe.weights_from_bf16_experts(top_k=top_k, **arrays))


def _is_deepseek_v4(tensors) -> bool:
    """Whether the tensors are a DeepSeek-V4 layer's, in either naming."""
    return (_find(tensors, _DEEPSEEK_HF_NAMES["fc1_scales"], required=False) is not None
            or any(_DEEPSEEK_EXPERT_W1.search(name) for name in tensors))


def _deepseek_v4_weights(tensors, stacked: bool, top_k: int, routed_scaling) -> Weights:
    names = _DEEPSEEK_HF_NAMES if stacked else _DEEPSEEK_NAMES
    if stacked:
        fc1 = _as_e2m1_pairs(_find(tensors, names["fc1"]), names["fc1"])
        if fc1.ndim != 3 or fc1.shape[1] % 2:
            raise ValueError(f"{names['fc1']}: expected [E, 2I, H/2] int8, got {list(fc1.shape)}")
        e, rows1, half_h = fc1.shape
        h, i = 2 * half_h, rows1 // 2
        _check_multiples_of_32(h, i, names["fc1"])
        fc1_scales = _expect_shape(_as_e8m0(_find(tensors, names["fc1_scales"]), names["fc1_scales"]),
                                   (e, rows1, h // 32), names["fc1_scales"])
        fc2 = _expect_shape(_as_e2m1_pairs(_find(tensors, names["fc2"]), names["fc2"]), (e, h, i // 2), names["fc2"])
        fc2_scales = _expect_shape(_as_e8m0(_find(tensors, names["fc2_scales"]), names["fc2_scales"]),
                                   (e, h, i // 32), names["fc2_scales"])
    else:
        fc1, fc1_scales, fc2, fc2_scales = _stacked_deepseek_experts(tensors)
        e, rows1, half_h = fc1.shape
        h, i = 2 * half_h, rows1 // 2
    _check_top_k(top_k, e)
    router_weight = selection_bias = None
    if _find(tensors, names["tid2eid"], required=False) is None:
        if routed_scaling is None:
            raise ValueError("routed_scaling: a DeepSeek-V4 layer routed by its scores needs its routed_scaling_factor "
                             "(config.json; V4-Flash 1.5, V4-Pro 2.5)")
        router_weight = _expect_shape(_as_bf16_bits(_find(tensors, names["router_weight"]), names["router_weight"]),
                                      (e, h), names["router_weight"])
        selection_bias = _expect_shape(_as_float32(_find(tensors, names["selection_bias"]), names["selection_bias"]),
                                       (e,), names["selection_bias"])
    return Weights(_mxmoe.weights_from_deepseek_v4_mxfp4(
        router_weight, selection_bias, fc1.reshape(e, rows1, h // 32, 16), fc1_scales,
        fc2.reshape(e, h, i // 32, 16), fc2_scales, top_k,
        1.0 if router_weight is None else float(routed_scaling), None))


def _stacked_deepseek_experts(tensors):
    """DeepSeek's per-expert tensors stacked as transformers holds them: FC1 [E, 2I, H/2] ([w1; w3] of
    each expert) with its scales [E, 2I, H/32], FC2 [E, H, I/2] with [E, H, I/32]."""
    prefixes = {}
    for name in tensors:
        match = _DEEPSEEK_EXPERT_W1.search(name)
        if match:
            expert = int(match.group(1))
            if expert in prefixes:
                raise ValueError(f"tensors: several tensors end in 'experts.{expert}.w1.weight' "
                                 f"({prefixes[expert]}w1.weight, {name}); give one layer's tensors")
            prefixes[expert] = name[:-len("w1.weight")]
    missing = sorted(set(range(max(prefixes) + 1)) - set(prefixes))
    if missing:
        raise ValueError(f"tensors: no tensor named 'experts.{missing[0]}.w1.weight' (experts 0 to {max(prefixes)} "
                         "are expected)")

    def get(expert: int, suffix: str, convert, shape):
        name = prefixes[expert] + suffix
        if name not in tensors:
            raise ValueError(f"tensors: no tensor named '{name}'")
        array = convert(tensors[name], name)
        if shape is not None:
            _expect_shape(array, shape, name)
        return array

    first = get(0, "w1.weight", _as_e2m1_pairs, None)
    if first.ndim != 2:
        raise ValueError(f"{prefixes[0]}w1.weight: expected [I, H/2] int8, got {list(first.shape)}")
    i, h = first.shape[0], 2 * first.shape[1]
    _check_multiples_of_32(h, i, prefixes[0] + "w1.weight")
    fc1, fc1_scales, fc2, fc2_scales = [], [], [], []
    for e in range(len(prefixes)):
        fc1.append(np.concatenate([get(e, "w1.weight", _as_e2m1_pairs, (i, h // 2)),
                                   get(e, "w3.weight", _as_e2m1_pairs, (i, h // 2))]))
        fc1_scales.append(np.concatenate([get(e, "w1.scale", _as_e8m0, (i, h // 32)),
                                          get(e, "w3.scale", _as_e8m0, (i, h // 32))]))
        fc2.append(get(e, "w2.weight", _as_e2m1_pairs, (h, i // 2)))
        fc2_scales.append(get(e, "w2.scale", _as_e8m0, (h, i // 32)))
    return np.stack(fc1), np.stack(fc1_scales), np.stack(fc2), np.stack(fc2_scales)


def _check_multiples_of_32(h: int, i: int, name: str) -> None:
    if h % 32 or i % 32 or h < 32 or i < 32:
        raise ValueError(f"{name}: H and I must be positive multiples of 32 (one E8M0 scale per 32), got H {h}, I {i}")


ACTIVATIONS = ("bf16", "mxfp8", "fp8")


def _check_activations(activations) -> str:
    """The rows the expert GEMMs take: bf16 (default), mxfp8 (MXFP8 per 32 along K) or fp8 (E4M3 with
    one power-of-two scale per 128 along K, DeepSeek-V4's own quantisation)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations: expected one of {', '.join(ACTIVATIONS)}, got {activations!r}")
    return activations


class CpuLayer:
    """The layer on the CPU (mxmoe's float32 reference, threaded), on NumPy arrays.

    Inputs x [T, H]: float32, float64 or float16 (rounded to bf16, as the layer takes bf16), or uint16
    holding bf16 bits. Outputs: float32 [T, H], every value a bf16 (the layer's output rounding).
    `activations` (ACTIVATIONS): the rows the expert GEMMs take, rounded as the GPU layer with the
    same option computes them."""

    def __init__(self, weights: Weights, activations: str = "bf16"):
        if not isinstance(weights, Weights):
            raise TypeError(f"weights: expected mxmoe.Weights, got {type(weights).__name__}")
        self.activations = _check_activations(activations)
        self._weights = weights
        self.shape = weights.shape

    def __call__(self, x, router_logits=None) -> np.ndarray:
        """The whole layer: routing (from the layer's router, or from `router_logits` [T, R] float32, R
        the routed experts), the experts and the weighted sum."""
        core = self._live()
        if core.spec.router == "caller-top-k":
            raise ValueError("layer: hash-routed (its experts come from token ids): call experts() with the "
                             "caller's routing")
        bits = self._input(x)
        logits = None
        if router_logits is not None:
            logits = _as_float32(router_logits, "router_logits")
            _expect_shape(logits, (bits.shape[0], core.routed_experts), "router_logits")
        return _bf16_bits_to_float32(_mxmoe.cpu_forward(core._core, bits, logits, self.activations))

    def experts(self, x, topk_ids, topk_weights) -> np.ndarray:
        """The engine form: the experts and the weighted sum for the caller's routing, topk_ids [T, k]
        (integers in [0, R), or -1 for a slot that goes to no expert; k the layer's top-k) and
        topk_weights [T, k]."""
        core = self._live()
        bits = self._input(x)
        ids, weights = _check_routing(topk_ids, topk_weights, bits.shape[0], self.shape, core.routed_experts)
        return _bf16_bits_to_float32(_mxmoe.cpu_experts(core._core, bits, ids, weights, self.activations))

    def free(self) -> None:
        """Drops the weights; a later call raises ValueError."""
        self._weights = None

    def _live(self) -> Weights:
        if self._weights is None:
            raise ValueError("layer: this layer was freed")
        return self._weights

    def _input(self, x) -> np.ndarray:
        bits = _as_bf16_bits(x, "x")
        if bits.ndim != 2 or bits.shape[1] != self.shape.hidden or bits.shape[0] < 1:
            raise ValueError(f"x: expected [T, {self.shape.hidden}] with T >= 1, got {list(bits.shape)}")
        return bits


def experts(x, topk_ids, topk_weights, layer):
    """The engine form, as vLLM's and SGLang's fused-MoE expert calls take it: `layer`'s experts
    applied to x [T, H] for the caller's routing (topk_ids [T, k], topk_weights [T, k]), weighted and
    summed per token. `layer` is an mxmoe.CpuLayer (NumPy) or an mxmoe.torch.MoeLayer (tensors)."""
    method = getattr(layer, "experts", None)
    if method is None:
        raise TypeError(f"layer: expected an mxmoe layer, got {type(layer).__name__}")
    return method(x, topk_ids, topk_weights)


# ---- argument checks and conversions (shared with mxmoe.torch) -------------------------------------

def _check_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}")


def _check_top_k(top_k: int, num_experts: int) -> None:
    if not 1 <= top_k <= min(num_experts, 32):
        raise ValueError(f"top_k: expected 1 <= top_k <= min(E, 32) = {min(num_experts, 32)}, got {top_k}")


def _find(tensors, suffix: str, required: bool = True):
    matches = [name for name in tensors if name == suffix or name.endswith("." + suffix)]
    if len(matches) > 1:
        raise ValueError(f"tensors: several tensors end in '{suffix}' ({', '.join(sorted(matches)[:4])}); "
                         "give one layer's tensors")
    if not matches:
        if required:
            raise ValueError(f"tensors: no tensor named '{suffix}' (with or without a layer prefix)")
        return None
    return tensors[matches[0]]


def _expect_shape(a: np.ndarray, shape, name: str) -> np.ndarray:
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(a.shape)}")
    return a


def _to_numpy(a, name: str) -> np.ndarray:
    """A host array's values as NumPy (CPU torch tensors included; bf16 ones as their uint16 bits)."""
    if isinstance(a, np.ndarray):
        return a
    module = type(a).__module__
    if module.startswith("torch"):
        if a.device.type != "cpu":
            raise ValueError(f"{name}: expected a CPU tensor or a NumPy array here, got one on {a.device}")
        if not a.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor")
        import torch
        if a.dtype == torch.bfloat16:
            return a.view(torch.int16).numpy().view(np.uint16)
        if a.dtype == getattr(torch, "float8_e8m0fnu", None):  # NumPy has no such dtype: its bits
            return a.view(torch.uint8).numpy()
        return a.numpy()
    try:
        return np.asarray(a)
    except Exception as e:  # noqa: BLE001 - any conversion failure is the caller's type
        raise TypeError(f"{name}: expected an array, got {type(a).__name__}") from e


def _as_uint8(a, name: str) -> np.ndarray:
    arr = _to_numpy(a, name)
    if arr.dtype != np.uint8:
        raise TypeError(f"{name}: expected uint8 (packed E2M1 codes or E8M0 scales), got {arr.dtype}")
    return np.ascontiguousarray(arr)


def _as_e2m1_pairs(a, name: str) -> np.ndarray:
    """Packed E2M1 values (two a byte), int8 as DeepSeek-V4's checkpoints store them or uint8, as uint8."""
    arr = _to_numpy(a, name)
    if arr.dtype not in (np.int8, np.uint8):
        raise TypeError(f"{name}: expected int8 or uint8 (packed E2M1 values), got {arr.dtype}")
    return np.ascontiguousarray(arr).view(np.uint8)


def _as_e8m0(a, name: str) -> np.ndarray:
    """E8M0 scales, uint8 or float8_e8m0fnu (ml_dtypes, torch), as their uint8 bits."""
    arr = _to_numpy(a, name)
    if arr.dtype != np.uint8 and arr.dtype.name != "float8_e8m0fnu":
        raise TypeError(f"{name}: expected uint8 or float8_e8m0fnu (E8M0 scales), got {arr.dtype}")
    return np.ascontiguousarray(arr).view(np.uint8)


def _as_float32(a, name: str) -> np.ndarray:
    arr = _to_numpy(a, name)
    if arr.dtype not in (np.float32, np.float64, np.float16):
        raise TypeError(f"{name}: expected float32, got {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def _as_bf16_bits(a, name: str) -> np.ndarray:
    """bf16 bits (uint16) of an array: bf16 bits kept, ml_dtypes bfloat16 viewed, floats rounded to
    nearest even."""
    arr = _to_numpy(a, name)
    if arr.dtype == np.uint16:
        return np.ascontiguousarray(arr)
    if arr.dtype.name == "bfloat16":  # ml_dtypes
        return np.ascontiguousarray(arr).view(np.uint16)
    if arr.dtype in (np.float32, np.float64, np.float16):
        return _float32_to_bf16_bits(np.ascontiguousarray(arr, dtype=np.float32))
    raise TypeError(f"{name}: expected bf16 (uint16 bits or ml_dtypes.bfloat16), float16 or float32, got {arr.dtype}")


def _float32_to_bf16_bits(f: np.ndarray) -> np.ndarray:
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def _bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _check_routing(topk_ids, topk_weights, tokens: int, shape: Shape, routed_experts: int):
    ids = _to_numpy(topk_ids, "topk_ids")
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"topk_ids: expected integers, got {ids.dtype}")
    if ids.shape != (tokens, shape.top_k):
        raise ValueError(f"topk_ids: expected [{tokens}, {shape.top_k}] (tokens, the layer's top-k), got {list(ids.shape)}")
    if ids.size and (ids.min() < -1 or ids.max() >= routed_experts):
        raise ValueError(f"topk_ids: expected expert ids in [0, {routed_experts}) or -1 (no expert), got values in "
                         f"[{ids.min()}, {ids.max()}]")
    weights = _as_float32(topk_weights, "topk_weights")
    _expect_shape(weights, ids.shape, "topk_weights")
    return np.ascontiguousarray(ids, dtype=np.int64), weights
