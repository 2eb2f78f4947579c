"""A DeepSeek-V4 MoE layer (its routed experts) in NumPy float64, written from the model's definition
(transformers' DeepseekV4TopKRouter and DeepseekV4Experts, DeepSeek's inference/model.py Gate and
Expert) and not from mxmoe's code: the tests' oracle. MXFP4 decoding is oracle.py's."""

from __future__ import annotations

import numpy as np

import oracle

SWIGLU_LIMIT = 10.0


def random_router(rng: np.random.Generator, routed: int, h: int) -> dict:
    """The router of `routed` experts: gate.weight bf16 bits [R, H], gate.bias fp32 [R]."""
    return {
        "gate.weight": oracle.bf16_bits(rng.normal(0.0, 1.0 / np.sqrt(h), size=(routed, h))),
        "gate.bias": rng.normal(0.0, 0.1, size=routed).astype(np.float32),
    }


def checkpoint_tensors(naming: str, layer: int, router: dict | None, experts: dict) -> tuple[dict, dict]:
    """The layer's tensors as a checkpoint names them ("deepseek": DeepSeek's, each expert's w1, w3, w2
    apart; "deepseek-hf": transformers', stacked), MXFP4 values as int8, and the safetensors dtype of
    the scales (F8_E8M0, held as uint8). Without `router` the layer is hash-routed: gate.tid2eid only."""
    e, rows1, k1, _ = experts["gate_up_blocks"].shape
    i, h = rows1 // 2, 32 * k1
    fc1 = experts["gate_up_blocks"].reshape(e, rows1, h // 2).view(np.int8)
    fc2 = experts["down_blocks"].reshape(e, h, i // 2).view(np.int8)
    if naming == "deepseek-hf":
        p = f"model.layers.{layer}.mlp."
        t = {p + "experts.gate_up_proj": fc1, p + "experts.gate_up_proj_scale_inv": experts["gate_up_scales"],
             p + "experts.down_proj": fc2, p + "experts.down_proj_scale_inv": experts["down_scales"]}
        bias = "gate.e_score_correction_bias"
    else:
        p = f"layers.{layer}.ffn."
        t = {}
        for j in range(e):
            q = f"{p}experts.{j}."
            t |= {q + "w1.weight": fc1[j, :i], q + "w1.scale": experts["gate_up_scales"][j, :i],
                  q + "w3.weight": fc1[j, i:], q + "w3.scale": experts["gate_up_scales"][j, i:],
                  q + "w2.weight": fc2[j], q + "w2.scale": experts["down_scales"][j]}
        bias = "gate.bias"
    if router is None:
        t[p + "gate.tid2eid"] = np.zeros((16, 6), np.int32)
    else:
        t |= {p + "gate.weight": router["gate.weight"], p + bias: router["gate.bias"]}
    return t, {name: "F8_E8M0" for name in t if name.endswith(("scale", "_scale_inv"))}


def random_experts(rng: np.random.Generator, e: int, h: int, i: int) -> dict:
    """`e` experts' MXFP4 tensors, FC1 [gate; up], scaled so that FC1 outputs reach the +-10 clamp and
    the layer's output is O(1)."""
    def scales(shape, k, target):
        base = int(round(np.log2(target / np.sqrt(k * 8.5625))))
        return (127 + base + rng.integers(-1, 2, size=shape)).astype(np.uint8)

    return {
        "gate_up_blocks": rng.integers(0, 256, size=(e, 2 * i, h // 32, 16), dtype=np.uint8),
        "gate_up_scales": scales((e, 2 * i, h // 32), h, SWIGLU_LIMIT * 3 / 7),
        "down_blocks": rng.integers(0, 256, size=(e, h, i // 32, 16), dtype=np.uint8),
        "down_scales": scales((e, h, i // 32), i * 150.0, 1.0),
    }


def routing(router: dict, x: np.ndarray, top_k: int, routed_scaling: float):
    """Scores sqrt(softplus(x W^T)); the top-k of scores + bias (ties to the lower expert); weights the
    chosen scores over their sum, times routed_scaling."""
    logits = x @ oracle.from_bf16_bits(router["gate.weight"]).T
    scores = np.sqrt(np.logaddexp(0.0, logits))
    ids = np.argsort(-(scores + router["gate.bias"].astype(np.float64)), axis=1, kind="stable")[:, :top_k]
    chosen = np.take_along_axis(scores, ids, axis=1)
    return ids, chosen / chosen.sum(axis=1, keepdims=True) * routed_scaling


def layer(router: dict, experts: dict, held: list[int], x_bits: np.ndarray, top_k: int,
          routed_scaling: float) -> np.ndarray:
    """The routed experts' output in float64 (before the final bf16 rounding) for bf16 inputs; expert
    held[j] is experts' j-th, and pairs routed to experts not held add nothing."""
    x = oracle.from_bf16_bits(x_bits)
    ids, weights = routing(router, x, top_k, routed_scaling)
    return routed_experts(experts, held, x, ids, weights)


def routed_experts(experts: dict, held: list[int], x: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The experts' weighted sum for a given routing (ids, weights [T, k]) of x [T, H] float64 (a
    hash-routed layer's form); expert held[j] is experts' j-th."""
    out = np.zeros_like(x)
    for token in range(x.shape[0]):
        for slot in range(ids.shape[1]):
            if ids[token, slot] not in held:
                continue
            j = held.index(ids[token, slot])
            w1 = oracle.dequantize(experts["gate_up_blocks"][j], experts["gate_up_scales"][j])  # [2I, H]
            w2 = oracle.dequantize(experts["down_blocks"][j], experts["down_scales"][j])        # [H, I]
            gate, up = np.split(w1 @ x[token], 2)
            gate, up = np.minimum(gate, SWIGLU_LIMIT), np.clip(up, -SWIGLU_LIMIT, SWIGLU_LIMIT)
            out[token] += weights[token, slot] * (w2 @ (gate / (1.0 + np.exp(-gate)) * up))
    return out
