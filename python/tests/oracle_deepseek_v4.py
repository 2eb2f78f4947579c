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
    out = np.zeros_like(x)
    for token in range(x.shape[0]):
        for slot in range(top_k):
            if ids[token, slot] not in held:
                continue
            j = held.index(ids[token, slot])
            w1 = oracle.dequantize(experts["gate_up_blocks"][j], experts["gate_up_scales"][j])  # [2I, H]
            w2 = oracle.dequantize(experts["down_blocks"][j], experts["down_scales"][j])        # [H, I]
            gate, up = np.split(w1 @ x[token], 2)
            gate, up = np.minimum(gate, SWIGLU_LIMIT), np.clip(up, -SWIGLU_LIMIT, SWIGLU_LIMIT)
            out[token] += weights[token, slot] * (w2 @ (gate / (1.0 + np.exp(-gate)) * up))
    return out
