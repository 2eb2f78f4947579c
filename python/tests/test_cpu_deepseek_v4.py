"""DeepSeek-V4's routed experts on the CPU: mxmoe's reference against the float64 NumPy oracle written
from the model's definition, at both V4 shapes (real H, I, top-k, routed experts and scaling) and odd
T. The layers hold only the experts their tokens route to: whole layers are 3.4 GB (Flash) and
13.4 GB (Pro)."""

from __future__ import annotations

import numpy as np
import pytest

import mxmoe
import oracle
import oracle_deepseek_v4 as v4

# name: (routed experts, top-k, H, I, routed_scaling_factor)
SHAPES = {"deepseek-v4-flash": (256, 6, 4096, 2048, 1.5), "deepseek-v4-pro": (384, 6, 7168, 3072, 2.5)}
BF16_OUTPUT_TOLERANCE = 4e-3  # the output's own bf16 rounding, by norm


@pytest.mark.parametrize("name,tokens", [("deepseek-v4-flash", 5), ("deepseek-v4-pro", 3)])
def test_layer_matches_float64(name, tokens):
    routed, k, h, i, scaling = SHAPES[name]
    rng = np.random.default_rng(tokens)
    router = v4.random_router(rng, routed, h)
    x = rng.normal(size=(tokens, h)).astype(np.float32)
    ids, _ = v4.routing(router, oracle.from_bf16_bits(oracle.bf16_bits(x)), k, scaling)
    held = sorted(set(ids.flatten().tolist()))
    experts = v4.random_experts(rng, len(held), h, i)
    weights = mxmoe.Weights(mxmoe._mxmoe.weights_from_deepseek_v4_mxfp4(
        router["gate.weight"], router["gate.bias"], experts["gate_up_blocks"], experts["gate_up_scales"],
        experts["down_blocks"], experts["down_scales"], k, scaling, held))
    y = mxmoe.CpuLayer(weights)(x)
    assert y.shape == x.shape and np.isfinite(y).all()
    expected = v4.layer(router, experts, held, oracle.bf16_bits(x), k, scaling)
    assert oracle.relative_error(y, expected) < BF16_OUTPUT_TOLERANCE
    assert np.array_equal(y, oracle.bf16_round(y))


def test_the_engine_form_takes_the_callers_routing():
    """A hash-routed layer's experts come from the caller: the engine form against the oracle's experts."""
    routed, k, h, i, scaling = 16, 6, 96, 160, 1.5
    rng = np.random.default_rng(7)
    router = v4.random_router(rng, routed, h)
    experts = v4.random_experts(rng, routed, h, i)
    weights = mxmoe.Weights(mxmoe._mxmoe.weights_from_deepseek_v4_mxfp4(
        router["gate.weight"], router["gate.bias"], experts["gate_up_blocks"], experts["gate_up_scales"],
        experts["down_blocks"], experts["down_scales"], k, scaling, None))
    x = rng.normal(size=(9, h)).astype(np.float32)
    ids = np.stack([rng.permutation(routed)[:k] for _ in range(9)])
    topk_weights = rng.uniform(0.1, 1.0, size=(9, k)).astype(np.float32)
    y = mxmoe.CpuLayer(weights).experts(x, ids, topk_weights)
    xf = oracle.from_bf16_bits(oracle.bf16_bits(x))
    expected = np.zeros_like(xf)
    for t in range(9):
        for s in range(k):
            e = ids[t, s]
            gate, up = np.split(oracle.dequantize(experts["gate_up_blocks"][e], experts["gate_up_scales"][e]) @ xf[t], 2)
            gate, up = np.minimum(gate, 10.0), np.clip(up, -10.0, 10.0)
            a = gate / (1.0 + np.exp(-gate)) * up
            expected[t] += topk_weights[t, s] * (oracle.dequantize(experts["down_blocks"][e], experts["down_scales"][e]) @ a)
    assert oracle.relative_error(y, expected) < BF16_OUTPUT_TOLERANCE
