"""DeepSeek-V4's routed experts on the CPU: mxmoe's reference against the float64 NumPy oracle written
from the model's definition, at both V4 shapes (real H, I, top-k, routed experts and scaling) and odd
T. The layers hold only the experts their tokens route to: whole layers are 3.4 GB (Flash) and
13.4 GB (Pro). Then small layers read from checkpoints and from tensors in both namings, hash-routed
layers, and bad tensors."""

from __future__ import annotations

import json

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
    expected = v4.routed_experts(experts, list(range(routed)), oracle.from_bf16_bits(oracle.bf16_bits(x)), ids,
                                 topk_weights)
    assert oracle.relative_error(y, expected) < BF16_OUTPUT_TOLERANCE


# E 8, k 3, H 64, I 96: both K dimensions two or more scale blocks.
SMALL = (8, 3, 64, 96, 1.5)
V4_SPEC = mxmoe.Spec("sqrt-softplus", 1.5, 1.0, 10.0, 0.0, "concatenated", False)


def write_checkpoint(path, naming, router, experts, config):
    tensors, dtype_names = v4.checkpoint_tensors(naming, 0, router, experts)
    oracle.write_safetensors(path / "model.safetensors", tensors, dtype_names)
    (path / "config.json").write_text(json.dumps(config))
    return tensors


@pytest.mark.parametrize("naming", ["deepseek", "deepseek-hf"])
def test_checkpoint_and_tensors_in_either_naming_compute_the_layer(tmp_path, naming):
    routed, k, h, i, scaling = SMALL
    rng = np.random.default_rng(11)
    router, experts = v4.random_router(rng, routed, h), v4.random_experts(rng, routed, h, i)
    tensors = write_checkpoint(tmp_path, naming, router, experts,
                               {"num_experts_per_tok": k, "routed_scaling_factor": scaling, "scoring_func": "sqrtsoftplus"})
    loaded = mxmoe.load_checkpoint(tmp_path, layer=0)
    assert loaded.shape == mxmoe.Shape(routed, k, h, i)
    assert loaded.spec == V4_SPEC
    assert "router=sqrt-softplus*1.5" in repr(loaded)
    weight, bias = loaded.router
    assert np.array_equal(weight, oracle.from_bf16_bits(router["gate.weight"]).astype(np.float32))
    assert np.array_equal(bias, router["gate.bias"])
    x = rng.normal(size=(7, h)).astype(np.float32)
    y = mxmoe.CpuLayer(loaded)(x)
    expected = v4.layer(router, experts, list(range(routed)), oracle.bf16_bits(x), k, scaling)
    assert oracle.relative_error(y, expected) < BF16_OUTPUT_TOLERANCE
    from_tensors = mxmoe.weights_from_tensors(tensors, top_k=k, routed_scaling=scaling)
    assert from_tensors.spec == V4_SPEC
    assert np.array_equal(mxmoe.CpuLayer(from_tensors)(x), y)


@pytest.mark.parametrize("naming", ["deepseek", "deepseek-hf"])
def test_a_hash_routed_layer_runs_only_in_the_engine_form(tmp_path, naming):
    routed, k, h, i, _ = SMALL
    rng = np.random.default_rng(12)
    experts = v4.random_experts(rng, routed, h, i)
    tensors = write_checkpoint(tmp_path, naming, None, experts, {"num_experts_per_tok": k, "num_hash_layers": 1})
    x = rng.normal(size=(5, h)).astype(np.float32)
    ids = np.stack([rng.permutation(routed)[:k] for _ in range(5)])
    topk_weights = rng.uniform(0.1, 1.0, size=(5, k)).astype(np.float32)
    expected = v4.routed_experts(experts, list(range(routed)), oracle.from_bf16_bits(oracle.bf16_bits(x)), ids,
                                 topk_weights)
    for weights in (mxmoe.load_checkpoint(tmp_path), mxmoe.weights_from_tensors(tensors, top_k=k)):
        assert weights.spec.router == "caller-top-k"
        layer = mxmoe.CpuLayer(weights)
        assert oracle.relative_error(layer.experts(x, ids, topk_weights), expected) < BF16_OUTPUT_TOLERANCE
        with pytest.raises(ValueError, match="hash-routed"):
            layer(x)
        with pytest.raises(ValueError, match="hash-routed"):
            weights.router
        halves = [mxmoe.CpuLayer(weights.expert_shard(held)).experts(x, ids, topk_weights)
                  for held in ([0, 2, 4, 6], [1, 3, 5, 7])]
        assert oracle.relative_error(halves[0] + halves[1], expected) < 2 * BF16_OUTPUT_TOLERANCE


def test_bad_tensors_are_named():
    routed, k, h, i, scaling = SMALL
    rng = np.random.default_rng(13)
    router, experts = v4.random_router(rng, routed, h), v4.random_experts(rng, routed, h, i)
    own, _ = v4.checkpoint_tensors("deepseek", 0, router, experts)
    hf, _ = v4.checkpoint_tensors("deepseek-hf", 0, router, experts)
    with pytest.raises(ValueError, match="routed_scaling"):
        mxmoe.weights_from_tensors(hf, top_k=k)
    with pytest.raises(ValueError, match="routed_scaling: gpt-oss"):
        mxmoe.weights_from_tensors(oracle.random_layer(rng, 4, 64, 64), routed_scaling=1.5)
    down_scale = "model.layers.0.mlp.experts.down_proj_scale_inv"
    with pytest.raises(ValueError, match=r"experts.down_proj_scale_inv: expected shape \[8, 64, 3\]"):
        mxmoe.weights_from_tensors(hf | {down_scale: hf[down_scale][:, :, :1]}, routed_scaling=scaling)
    w2_scale = "layers.0.ffn.experts.3.w2.scale"
    with pytest.raises(ValueError, match=w2_scale):
        mxmoe.weights_from_tensors({n: a for n, a in own.items() if n != w2_scale}, routed_scaling=scaling)
    with pytest.raises(ValueError, match="experts.5.w1.weight"):
        mxmoe.weights_from_tensors({n: a for n, a in own.items() if ".experts.5." not in n}, routed_scaling=scaling)
    w1 = "layers.0.ffn.experts.0.w1.weight"
    with pytest.raises(TypeError, match=w1):
        mxmoe.weights_from_tensors(own | {w1: own[w1].astype(np.float32)}, routed_scaling=scaling)
