"""The package on the CPU (NumPy): every way of giving the weights, the layer and the engine form
against a float64 NumPy evaluation, tensor- and expert-parallel shards, a checkpoint round trip, and
bad input."""

from __future__ import annotations

import numpy as np
import pytest

import mxmoe
import oracle

# Odd shapes beside a gpt-oss-like one: E not a power of two, top-3, H and I multiples of 32 only.
SHAPES = [(5, 3, 96, 160), (32, 4, 256, 192)]
BF16_OUTPUT_TOLERANCE = 4e-3  # the output's own bf16 rounding, by norm


def make(shape, seed):
    e, k, h, i = shape
    rng = np.random.default_rng(seed)
    return oracle.random_layer(rng, e, h, i), k, rng


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tokens", [1, 7, 33])
def test_layer_matches_float64(shape, tokens):
    t, k, rng = make(shape, 100 + tokens)
    layer = mxmoe.CpuLayer(mxmoe.weights_from_tensors(t, top_k=k))
    x = rng.normal(size=(tokens, shape[2])).astype(np.float32)
    y = layer(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert np.isfinite(y).all()
    expected = oracle.layer(t, oracle.bf16_bits(x), k)
    assert oracle.relative_error(y, expected) < BF16_OUTPUT_TOLERANCE
    assert np.array_equal(y, oracle.bf16_round(y))  # every value a bf16


@pytest.mark.parametrize("tokens", [1, 9])
def test_fp8_activations_match_float64_rounding_the_same_rows(tokens):
    t, k, rng = make(SHAPES[1], 200 + tokens)
    w = mxmoe.weights_from_tensors(t, top_k=k)
    x = rng.normal(size=(tokens, 256)).astype(np.float32)
    y = mxmoe.CpuLayer(w, activations="fp8")(x)
    assert oracle.relative_error(y, oracle.layer(t, oracle.bf16_bits(x), k, activations="fp8")) < BF16_OUTPUT_TOLERANCE
    # What FP8 rows cost against bf16 ones: far past the output's own rounding.
    assert oracle.relative_error(y, oracle.layer(t, oracle.bf16_bits(x), k)) > 5 * BF16_OUTPUT_TOLERANCE
    with pytest.raises(ValueError, match="activations: expected one of bf16, mxfp8, fp8, got 'fp9'"):
        mxmoe.CpuLayer(w, activations="fp9")


def test_input_dtypes_agree():
    t, k, rng = make(SHAPES[0], 1)
    layer = mxmoe.CpuLayer(mxmoe.weights_from_tensors(t, top_k=k))
    x = oracle.bf16_round(rng.normal(size=(4, 96))).astype(np.float32)  # exact in every dtype below
    bits = oracle.bf16_bits(x)
    for given in (x, x.astype(np.float64), bits):
        assert np.array_equal(layer(given), layer(x))


def test_openai_names_and_layer_prefixes_give_the_same_layer():
    t, k, rng = make(SHAPES[0], 2)
    openai = {
        "block.3.mlp.gate.weight": t["router.weight"], "block.3.mlp.gate.bias": t["router.bias"],
        "block.3.mlp.mlp1_weight.blocks": t["experts.gate_up_proj_blocks"],
        "block.3.mlp.mlp1_weight.scales": t["experts.gate_up_proj_scales"],
        "block.3.mlp.mlp1_bias": t["experts.gate_up_proj_bias"],
        "block.3.mlp.mlp2_weight.blocks": t["experts.down_proj_blocks"],
        "block.3.mlp.mlp2_weight.scales": t["experts.down_proj_scales"],
        "block.3.mlp.mlp2_bias": t["experts.down_proj_bias"],
    }
    hf = {"model.layers.3.mlp." + name: a for name, a in t.items()}
    x = rng.normal(size=(6, 96)).astype(np.float32)
    a = mxmoe.CpuLayer(mxmoe.weights_from_tensors(openai, top_k=k))(x)
    b = mxmoe.CpuLayer(mxmoe.weights_from_tensors(hf, top_k=k))(x)
    assert np.array_equal(a, b)


def test_dense_bf16_experts_are_quantised_losslessly():
    t, k, rng = make(SHAPES[0], 3)
    # transformers' GptOssExperts layout: gate_up [E, H, 2I] (x @ W), down [E, I, H].
    w1 = oracle.dequantize(t["experts.gate_up_proj_blocks"], t["experts.gate_up_proj_scales"])
    w2 = oracle.dequantize(t["experts.down_proj_blocks"], t["experts.down_proj_scales"])
    dense = {
        "router.weight": t["router.weight"], "router.bias": t["router.bias"],
        "experts.gate_up_proj": oracle.bf16_bits(w1.transpose(0, 2, 1)),
        "experts.gate_up_proj_bias": oracle.from_bf16_bits(t["experts.gate_up_proj_bias"]).astype(np.float32),
        "experts.down_proj": oracle.bf16_bits(w2.transpose(0, 2, 1)),
        "experts.down_proj_bias": t["experts.down_proj_bias"],
    }
    x = rng.normal(size=(9, 96)).astype(np.float32)
    a = mxmoe.CpuLayer(mxmoe.weights_from_tensors(dense, top_k=k))(x)
    b = mxmoe.CpuLayer(mxmoe.weights_from_tensors(t, top_k=k))(x)
    assert np.array_equal(a, b)


def test_engine_form_matches_float64_for_the_callers_routing():
    t, k, rng = make(SHAPES[1], 4)
    layer = mxmoe.CpuLayer(mxmoe.weights_from_tensors(t, top_k=k))
    x = rng.normal(size=(11, 256)).astype(np.float32)
    ids = rng.integers(0, 32, size=(11, k))  # repeats allowed: each pair counts
    ids[::3, 1] = -1  # slots that go to no expert (an engine's padding)
    weights = rng.random(size=(11, k)).astype(np.float32)
    y = mxmoe.experts(x, ids, weights, layer)
    expected = oracle.layer(t, oracle.bf16_bits(x), ids=ids, weights=weights.astype(np.float64))
    assert oracle.relative_error(y, expected) < BF16_OUTPUT_TOLERANCE


def test_router_logits_given_decide_the_routing():
    t, k, rng = make(SHAPES[0], 5)
    layer = mxmoe.CpuLayer(mxmoe.weights_from_tensors(t, top_k=k))
    x = rng.normal(size=(5, 96)).astype(np.float32)
    logits = rng.normal(size=(5, 5)).astype(np.float32)
    y = layer(x, router_logits=logits)
    ids = np.argsort(-logits.astype(np.float64), axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(logits.astype(np.float64), ids, axis=1)
    weights = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    expected = oracle.layer(t, oracle.bf16_bits(x), ids=ids, weights=weights)
    assert oracle.relative_error(y, expected) < BF16_OUTPUT_TOLERANCE


@pytest.mark.parametrize("world", [2, 4, 8])
def test_tensor_parallel_shards_sum_to_the_layer(world):
    rng = np.random.default_rng(6)
    t = oracle.random_layer(rng, 4, 64, 2880)  # I = 2880: slices of 1440, 720 and 360 columns
    weights = mxmoe.weights_from_tensors(t, top_k=2)
    x = rng.normal(size=(5, 64)).astype(np.float32)
    full = oracle.layer(t, oracle.bf16_bits(x), 2)
    total = np.zeros_like(full)
    for rank in range(world):
        shard = weights.tensor_parallel_shard(rank, world)
        assert shard.shape.intermediate % 32 == 0
        total += mxmoe.CpuLayer(shard)(x)
    assert oracle.relative_error(total, full) < 1e-2  # world bf16 roundings of partial sums


@pytest.mark.parametrize("world", [2, 3, 4])
def test_expert_parallel_shards_sum_to_the_layer(world):
    t, k, rng = make(SHAPES[1], 9)
    weights = mxmoe.weights_from_tensors(t, top_k=k)
    x = rng.normal(size=(9, 256)).astype(np.float32)
    ids = rng.integers(-1, 32, size=(9, k))
    given = rng.random(size=(9, k)).astype(np.float32)
    full = oracle.layer(t, oracle.bf16_bits(x), k)
    full_given = oracle.layer(t, oracle.bf16_bits(x), ids=ids, weights=given.astype(np.float64))
    total, total_given = np.zeros_like(full), np.zeros_like(full)
    for rank in range(world):
        shard = weights.expert_parallel_shard(rank, world)
        held = list(range(32 * rank // world, 32 * (rank + 1) // world))
        assert shard.global_experts == held and shard.routed_experts == 32 and shard.shape.num_experts == len(held)
        layer = mxmoe.CpuLayer(shard)
        y, y_given = layer(x), mxmoe.experts(x, ids, given, layer)
        assert oracle.relative_error(y, oracle.layer(t, oracle.bf16_bits(x), k, held=held)) < BF16_OUTPUT_TOLERANCE
        assert oracle.relative_error(
            y_given, oracle.layer(t, oracle.bf16_bits(x), ids=ids, weights=given.astype(np.float64), held=held)
        ) < BF16_OUTPUT_TOLERANCE
        total += y
        total_given += y_given
    assert oracle.relative_error(total, full) < 1e-2  # world bf16 roundings of partial sums
    assert oracle.relative_error(total_given, full_given) < 1e-2


def test_an_expert_shard_of_any_experts():
    t, k, rng = make(SHAPES[0], 10)
    weights = mxmoe.weights_from_tensors(t, top_k=k)
    x = rng.normal(size=(6, 96)).astype(np.float32)
    shard = weights.expert_shard([4, 0, 2])
    assert shard.global_experts == [4, 0, 2]
    y = mxmoe.CpuLayer(shard)(x)
    assert oracle.relative_error(y, oracle.layer(t, oracle.bf16_bits(x), k, held=[4, 0, 2])) < BF16_OUTPUT_TOLERANCE
    with pytest.raises(ValueError, match="distinct ids"):
        weights.expert_shard([1, 1, 2])
    with pytest.raises(ValueError, match="distinct ids"):
        weights.expert_shard([0, 1, 5])
    with pytest.raises(ValueError, match="at least the top-k"):
        weights.expert_shard([0, 1])
    with pytest.raises(ValueError, match="already an expert-parallel shard"):
        shard.expert_shard([0, 1, 2])
    with pytest.raises(ValueError, match="fewer experts than the top-k"):
        weights.expert_parallel_shard(0, 2)  # 5 experts over 2 ranks: 2 each, top-3


def test_checkpoint_round_trip(tmp_path):
    t, k, rng = make(SHAPES[0], 7)
    oracle.write_safetensors(tmp_path / "model.safetensors", {"model.layers.0.mlp." + n: a for n, a in t.items()})
    (tmp_path / "config.json").write_text('{"num_experts_per_tok": 3}')
    loaded = mxmoe.load_checkpoint(tmp_path, layer=0)
    assert loaded.shape == mxmoe.Shape(5, 3, 96, 160)
    x = rng.normal(size=(4, 96)).astype(np.float32)
    assert np.array_equal(mxmoe.CpuLayer(loaded)(x), mxmoe.CpuLayer(mxmoe.weights_from_tensors(t, top_k=k))(x))
    with pytest.raises(mxmoe.Error, match="no MoE tensors for layer 1"):
        mxmoe.load_checkpoint(tmp_path, layer=1)
    with pytest.raises(mxmoe.Error, match="JSON file"):
        mxmoe.load_checkpoint(tmp_path / "config.json")


def test_synthetic_weights_are_seeded():
    a = mxmoe.CpuLayer(mxmoe.synthetic_weights(6, 2, 64, 96, seed=1))
    b = mxmoe.CpuLayer(mxmoe.synthetic_weights(6, 2, 64, 96, seed=1))
    x = np.ones((2, 64), np.float32)
    assert np.array_equal(a(x), b(x))


def test_synthetic_model_weights_are_the_presets():
    assert mxmoe.MODELS == ("gpt-oss-20b", "gpt-oss-120b", "deepseek-v4-flash", "deepseek-v4-pro")
    w = mxmoe.synthetic_model_weights("gpt-oss-20b", seed=5)
    assert w.shape == (32, 4, 2880, 2880) and w.spec.router == "softmax-top-k" and w.spec.expert_biases
    same = mxmoe.synthetic_weights(32, 4, 2880, 2880, seed=5)
    x = np.random.default_rng(0).standard_normal((2, 2880)).astype(np.float32)
    assert np.array_equal(mxmoe.CpuLayer(w)(x), mxmoe.CpuLayer(same)(x))
    assert not np.array_equal(mxmoe.CpuLayer(w)(x), mxmoe.CpuLayer(mxmoe.synthetic_model_weights("gpt-oss-20b"))(x))
    with pytest.raises(ValueError, match="model: expected one of gpt-oss-20b, .*deepseek-v4-pro, got 'llama'"):
        mxmoe.synthetic_model_weights("llama")


def test_bad_input_names_the_argument():
    t, k, rng = make(SHAPES[0], 8)
    weights = mxmoe.weights_from_tensors(t, top_k=k)
    layer = mxmoe.CpuLayer(weights)
    x = rng.normal(size=(3, 96)).astype(np.float32)
    ids, w = np.zeros((3, k), np.int64), np.full((3, k), 0.5, np.float32)
    with pytest.raises(TypeError, match="x: expected bf16"):
        layer(x.astype(np.int32))
    with pytest.raises(ValueError, match=r"x: expected \[T, 96\]"):
        layer(np.zeros((3, 64), np.float32))  # another layer's hidden size
    with pytest.raises(ValueError, match=r"x: expected \[T, 96\]"):
        layer(np.zeros((96,), np.float32))
    with pytest.raises(ValueError, match="router_logits: expected shape"):
        layer(x, router_logits=np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"topk_ids: expected expert ids in \[0, 5\) or -1"):
        mxmoe.experts(x, ids + 5, w, layer)
    with pytest.raises(ValueError, match="topk_ids: expected expert ids"):
        mxmoe.experts(x, ids - 2, w, layer)
    with pytest.raises(TypeError, match="topk_ids: expected integers"):
        mxmoe.experts(x, ids.astype(np.float32), w, layer)
    with pytest.raises(ValueError, match="topk_weights: expected shape"):
        mxmoe.experts(x, ids, w[:, :1], layer)
    with pytest.raises(ValueError, match="topk_ids: expected"):
        mxmoe.experts(x, ids[:, :1], w[:, :1], layer)
    with pytest.raises(TypeError, match="layer: expected an mxmoe layer"):
        mxmoe.experts(x, ids, w, object())
    with pytest.raises(ValueError, match="top_k"):
        mxmoe.weights_from_tensors(t, top_k=9)
    with pytest.raises(ValueError, match="experts.down_proj_scales: expected shape"):
        mxmoe.weights_from_tensors({**t, "experts.down_proj_scales": t["experts.down_proj_scales"][:, :, :2]}, top_k=k)
    with pytest.raises(TypeError, match="experts.gate_up_proj_blocks: expected uint8"):
        mxmoe.weights_from_tensors({**t, "experts.gate_up_proj_blocks": t["experts.gate_up_proj_blocks"].astype(np.int8)})
    with pytest.raises(ValueError, match="no tensor named 'router.bias'"):
        mxmoe.weights_from_tensors({n: a for n, a in t.items() if n != "router.bias"}, top_k=k)
    with pytest.raises(ValueError, match="no MoE expert tensors"):
        mxmoe.weights_from_tensors({"router.weight": t["router.weight"]})
    with pytest.raises(ValueError, match="rank"):
        weights.tensor_parallel_shard(2, 2)
    with pytest.raises(TypeError, match="layer: expected an integer"):
        mxmoe.load_checkpoint("x", layer=1.5)
    layer.free()
    with pytest.raises(ValueError, match="freed"):
        layer(x)
