"""The PyTorch layer on a GPU (skipped without PyTorch or a CUDA device): the layer and the engine
form against the CPU layer, from given router logits, inside a CUDA graph, under
torch.compile(fullgraph=True), the custom ops' own checks, tensor- and expert-parallel shards, and bad
input; layers built from CUDA tensors against those built from the same tensors on the host, and the
layer's memory as PyTorch's allocator counts it."""

from __future__ import annotations

import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible: the PyTorch layer's tests are skipped", allow_module_level=True)

import mxmoe  # noqa: E402
import mxmoe.torch  # noqa: E402
import oracle  # noqa: E402
from cuda_graphs import capture  # noqa: E402

GPU_TOLERANCE = 1e-2  # bf16 activations (docs/benchmarking.md, "Accuracy, beside speed")


@pytest.fixture(scope="module")
def weights():
    t = oracle.random_layer(np.random.default_rng(11), 32, 256, 192)
    return mxmoe.weights_from_tensors(t, top_k=4)


def to_bf16(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(oracle.bf16_bits(a).view(np.int16)).view(torch.bfloat16).cuda()


@pytest.mark.parametrize("tokens", [1, 7, 64, 300])
def test_layer_matches_the_cpu_layer(weights, tokens):
    layer = mxmoe.torch.MoeLayer(weights)
    x = np.random.default_rng(tokens).normal(size=(tokens, 256)).astype(np.float32)
    y = layer(to_bf16(x))
    assert y.dtype == torch.bfloat16 and y.shape == (tokens, 256) and y.device == layer.device
    expected = mxmoe.CpuLayer(weights)(x).astype(np.float64)
    assert oracle.relative_error(y.float().cpu().numpy(), expected) < GPU_TOLERANCE


@pytest.mark.parametrize("activations", ["fp8", "mxfp8"])
def test_rounded_activations_match_the_cpu_layer_with_the_same_option(weights, activations):
    layer = mxmoe.torch.MoeLayer(weights, activations=activations)
    assert layer.activations == activations
    x = np.random.default_rng(5).normal(size=(40, 256)).astype(np.float32)
    y = layer(to_bf16(x)).float().cpu().numpy()
    assert oracle.relative_error(y, mxmoe.CpuLayer(weights, activations=activations)(x).astype(np.float64)) < GPU_TOLERANCE
    assert oracle.relative_error(y, mxmoe.CpuLayer(weights)(x).astype(np.float64)) > GPU_TOLERANCE  # they were rounded
    with pytest.raises(ValueError, match="activations"):
        mxmoe.torch.MoeLayer(weights, activations="int8")


def test_router_logits_given(weights):
    layer = mxmoe.torch.MoeLayer(weights)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(9, 256)).astype(np.float32)
    logits = rng.normal(size=(9, 32)).astype(np.float32)
    y = layer(to_bf16(x), torch.from_numpy(logits).cuda())
    expected = mxmoe.CpuLayer(weights)(x, router_logits=logits).astype(np.float64)
    assert oracle.relative_error(y.float().cpu().numpy(), expected) < GPU_TOLERANCE


def test_cuda_graph_replays_the_eager_output(weights):
    layer = mxmoe.torch.MoeLayer(weights, max_tokens=16)
    x = to_bf16(np.random.default_rng(5).normal(size=(16, 256)))
    eager = layer(x)
    graph, captured = capture(lambda: layer(x))
    for _ in range(3):
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)


def test_torch_compile_fullgraph(weights):
    layer = mxmoe.torch.MoeLayer(weights)

    class Block(torch.nn.Module):  # ops around the layer whose bf16 results are exact either way
        def __init__(self):
            super().__init__()
            self.moe = layer

        def forward(self, x):
            return x + self.moe(x * 2)

    block = Block()
    x = to_bf16(np.random.default_rng(6).normal(size=(8, 256)))
    compiled = torch.compile(block, fullgraph=True)
    assert torch.equal(compiled(x), block(x))


def test_custom_op_passes_opcheck(weights):
    layer = mxmoe.torch.MoeLayer(weights)
    x = to_bf16(np.random.default_rng(7).normal(size=(4, 256)))
    torch.library.opcheck(torch.ops.mxmoe.layer.default, (x, None, layer._handle))


def given_routing(tokens: int, seed: int, experts: int = 32, top_k: int = 4):
    """A caller's routing: random experts (repeats allowed), positive weights, some slots -1."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, experts, size=(tokens, top_k))
    ids[::3, top_k // 2] = -1
    return ids, rng.random(size=(tokens, top_k)).astype(np.float32)


@pytest.mark.parametrize("tokens", [1, 7, 64, 300])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_engine_form_matches_the_cpu_layer(weights, tokens, id_dtype):
    layer = mxmoe.torch.MoeLayer(weights)
    x = np.random.default_rng(tokens).normal(size=(tokens, 256)).astype(np.float32)
    ids, w = given_routing(tokens, tokens)
    y = mxmoe.experts(to_bf16(x), torch.from_numpy(ids).to("cuda", id_dtype), torch.from_numpy(w).cuda(), layer)
    assert y.dtype == torch.bfloat16 and y.shape == (tokens, 256)
    expected = mxmoe.experts(x, ids, w, mxmoe.CpuLayer(weights)).astype(np.float64)
    assert oracle.relative_error(y.float().cpu().numpy(), expected) < GPU_TOLERANCE
    # bf16 weights are taken too (converted to float32)
    y16 = layer.experts(to_bf16(x), torch.from_numpy(ids).to("cuda", id_dtype), torch.from_numpy(w).cuda().bfloat16())
    assert oracle.relative_error(y16.float().cpu().numpy(), expected) < GPU_TOLERANCE


def test_engine_form_in_a_cuda_graph_and_under_compile(weights):
    layer = mxmoe.torch.MoeLayer(weights, max_tokens=16)
    x = to_bf16(np.random.default_rng(8).normal(size=(16, 256)))
    ids, w = given_routing(16, 9)
    ids, w = torch.from_numpy(ids).cuda(), torch.from_numpy(w).cuda()
    eager = layer.experts(x, ids, w)
    graph, captured = capture(lambda: layer.experts(x, ids, w))  # no ids read on the host inside a capture
    for _ in range(2):
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)

    def block(x, logits):  # routing by torch, experts by mxmoe, as an engine's model does it
        top = torch.topk(logits, 4, dim=1)
        return x + layer.experts(x, top.indices, torch.softmax(top.values, dim=1))

    logits = torch.randn(16, 32, device="cuda")
    assert torch.equal(torch.compile(block, fullgraph=True)(x, logits), block(x, logits))
    torch.library.opcheck(torch.ops.mxmoe.experts.default, (x, ids, w, layer._handle))


@pytest.mark.parametrize("experts", [32, 128], ids=["gpt-oss-20b", "gpt-oss-120b"])
def test_expert_parallel_shards_sum_to_the_layer(experts):
    t = oracle.random_layer(np.random.default_rng(experts + 1), experts, 2880, 2880)
    weights = mxmoe.weights_from_tensors(t, top_k=4)
    x = to_bf16(np.random.default_rng(2).normal(size=(64, 2880)))
    ids, w = given_routing(64, 3, experts)
    ids, w = torch.from_numpy(ids).cuda(), torch.from_numpy(w).cuda()
    layer = mxmoe.torch.MoeLayer(weights)
    full, full_given = layer(x).float(), layer.experts(x, ids, w).float()
    layer.free()
    for world in (2, 4):
        total, total_given = torch.zeros_like(full), torch.zeros_like(full)
        for rank in range(world):
            shard = mxmoe.torch.MoeLayer(weights.expert_parallel_shard(rank, world))
            total += shard(x).float()
            total_given += shard.experts(x, ids, w).float()
            shard.free()
        errors = [(torch.linalg.norm(a - b) / torch.linalg.norm(b)).item()
                  for a, b in ((total, full), (total_given, full_given))]
        print(f"E={experts} ep={world}: summed bf16 shard outputs against the layer {errors[0]:.2e} "
              f"(layer form), {errors[1]:.2e} (engine form)")
        assert max(errors) < 5e-3, f"ep={world}"


@pytest.mark.parametrize("experts", [32, 128], ids=["gpt-oss-20b", "gpt-oss-120b"])
def test_tensor_parallel_shards_sum_to_the_layer(experts):
    t = oracle.random_layer(np.random.default_rng(experts), experts, 2880, 2880)
    weights = mxmoe.weights_from_tensors(t, top_k=4)
    x = to_bf16(np.random.default_rng(1).normal(size=(64, 2880)))
    full = mxmoe.torch.MoeLayer(weights)(x).float()
    for world in (2, 4, 8):
        total = torch.zeros_like(full)
        for rank in range(world):
            shard = mxmoe.torch.MoeLayer(weights.tensor_parallel_shard(rank, world))
            total += shard(x).float()
            shard.free()
        error = (torch.linalg.norm(total - full) / torch.linalg.norm(full)).item()
        print(f"E={experts} tp={world}: summed bf16 shard outputs against the layer {error:.2e}")
        assert error < 5e-3, f"tp={world}"


def test_bad_input_names_the_argument(weights):
    layer = mxmoe.torch.MoeLayer(weights)
    x = to_bf16(np.zeros((4, 256), np.float32))
    with pytest.raises(TypeError, match="x: expected torch.bfloat16"):
        layer(x.float())
    with pytest.raises(ValueError, match="x: expected a tensor on cuda"):
        layer(x.cpu())
    with pytest.raises(ValueError, match=r"x: expected shape \[T, 256\]"):
        layer(x[:, :128].contiguous())
    with pytest.raises(ValueError, match="x: expected a contiguous tensor"):
        layer(torch.cat([x, x], dim=1)[:, ::2])
    with pytest.raises(ValueError, match=r"router_logits: expected shape \[4, 32\]"):
        layer(x, torch.zeros(4, 31, device=x.device))
    with pytest.raises(TypeError, match="router_logits: expected torch.float32"):
        layer(x, torch.zeros(4, 32, device=x.device, dtype=torch.bfloat16))
    ids = torch.zeros(4, 4, dtype=torch.int64, device=x.device)
    w = torch.full((4, 4), 0.25, device=x.device)
    with pytest.raises(TypeError, match="topk_ids: expected torch.int32 or torch.int64"):
        layer.experts(x, ids.float(), w)
    with pytest.raises(ValueError, match=r"topk_ids: expected shape \[4, 4\]"):
        layer.experts(x, ids[:, :3].contiguous(), w)
    with pytest.raises(ValueError, match="topk_ids: expected a tensor on cuda"):
        layer.experts(x, ids.cpu(), w)
    with pytest.raises(ValueError, match="topk_ids: expected a contiguous tensor"):
        layer.experts(x, torch.cat([ids, ids], dim=1)[:, ::2], w)
    with pytest.raises(ValueError, match=r"topk_ids: expected expert ids in \[0, 32\) or -1"):
        layer.experts(x, ids + 32, w)
    with pytest.raises(ValueError, match=r"topk_ids: expected expert ids in \[0, 32\) or -1"):
        layer.experts(x, ids - 2, w)
    with pytest.raises(TypeError, match="topk_weights: expected torch.float32"):
        layer.experts(x, ids, w.double())
    with pytest.raises(ValueError, match=r"topk_weights: expected shape \[4, 4\]"):
        layer.experts(x, ids, w[:3])
    with pytest.raises(ValueError, match=r"x: expected shape \[T, 128\]"):
        other = mxmoe.torch.MoeLayer(mxmoe.synthetic_weights(8, 4, 128, 64))  # another layer's shape
        other.experts(x, ids, w)
    # Unchecked, ids outside the layer go to no expert on the device (compute-sanitizer runs this).
    unchecked = layer.experts(x, torch.full_like(ids, 1 << 40), w, check_ids=False)
    assert torch.equal(unchecked, torch.zeros_like(unchecked))
    layer.free()
    with pytest.raises(ValueError, match="freed"):
        layer(x)
    with pytest.raises(ValueError, match="freed"):
        layer.experts(x, ids, w)


# ---- layers from CUDA tensors, and their memory ---------------------------------------------------

def cuda_tensors(host: dict, dtype: torch.dtype = torch.bfloat16, prefix: str = "") -> dict:
    """Host tensors (uint8 codes, uint16 bf16 bits) as CUDA tensors, floating point ones in `dtype`."""
    out = {}
    for name, a in host.items():
        t = torch.from_numpy(np.ascontiguousarray(a))
        if a.dtype == np.uint16:
            t = t.view(torch.int16).view(torch.bfloat16).to(dtype)
        out[prefix + name] = t.cuda()
    return out


def dense_layer(rng: np.random.Generator, e: int, h: int, i: int) -> dict:
    """Dense experts in transformers' layout (bf16 bits, not MXFP4 values: the quantiser rounds), with
    some all-zero and some large blocks, and the router and biases of a random layer."""
    t = oracle.random_layer(rng, e, h, i)
    gate_up = rng.normal(0.0, 0.05, size=(e, h, 2 * i))
    gate_up[0, :32, :] = 0.0
    gate_up[1, :32, 5] = 3e4
    down = rng.normal(0.0, 0.05, size=(e, i, h))
    down[2, 32:64, 7] = -1e-6
    return {"router.weight": t["router.weight"], "router.bias": t["router.bias"],
            "experts.gate_up_proj": oracle.bf16_bits(gate_up), "experts.gate_up_proj_bias": t["experts.gate_up_proj_bias"],
            "experts.down_proj": oracle.bf16_bits(down), "experts.down_proj_bias": t["experts.down_proj_bias"]}


def assert_same_layer(a: mxmoe.torch.MoeLayer, b: mxmoe.torch.MoeLayer, experts: int) -> None:
    """Bit-identical outputs of both forms, eagerly and (for `a`) replayed from a CUDA graph."""
    assert a.shape == b.shape and a.nbytes == b.nbytes
    for tokens in (1, 37, 300):
        x = to_bf16(np.random.default_rng(tokens).normal(size=(tokens, a.shape.hidden)))
        ids, w = given_routing(tokens, tokens, experts, a.shape.top_k)
        ids, w = torch.from_numpy(ids).cuda(), torch.from_numpy(w).cuda()
        assert torch.equal(a(x), b(x)), f"T={tokens}"
        assert torch.equal(a.experts(x, ids, w), b.experts(x, ids, w)), f"T={tokens}"
    x = to_bf16(np.random.default_rng(4).normal(size=(16, a.shape.hidden)))
    assert a.workspace_size(16) == b.workspace_size(16) > 0
    eager = a(x)
    graph, captured = capture(lambda: a(x))
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_layer_from_dense_cuda_tensors_is_the_host_ones(dtype):
    host = dense_layer(np.random.default_rng(21), 32, 256, 192)
    expected = mxmoe.torch.MoeLayer(mxmoe.weights_from_tensors(host, top_k=4))
    got = mxmoe.torch.MoeLayer.from_tensors(cuda_tensors(host, dtype), top_k=4)
    assert got.device == expected.device and got.routed_experts == 32
    assert_same_layer(got, expected, 32)


@pytest.mark.parametrize("names", ["hf", "openai", "hf-3d-fc2"])
def test_layer_from_mxfp4_cuda_tensors_is_the_host_ones(weights, names):
    host = oracle.random_layer(np.random.default_rng(11), 32, 256, 192)  # the `weights` fixture's tensors
    tensors = cuda_tensors(host, prefix="model.layers.3.mlp.")
    if names == "openai":
        renames = {"router.weight": "gate.weight", "router.bias": "gate.bias",
                   "experts.gate_up_proj_blocks": "mlp1_weight.blocks", "experts.gate_up_proj_scales": "mlp1_weight.scales",
                   "experts.gate_up_proj_bias": "mlp1_bias", "experts.down_proj_blocks": "mlp2_weight.blocks",
                   "experts.down_proj_scales": "mlp2_weight.scales", "experts.down_proj_bias": "mlp2_bias"}
        tensors = {"block.3.mlp." + renames[n[len("model.layers.3.mlp."):]]: t for n, t in tensors.items()}
    if names == "hf-3d-fc2":
        name = "model.layers.3.mlp.experts.down_proj_blocks"
        tensors[name] = tensors[name].reshape(32, 256, -1)
    got = mxmoe.torch.MoeLayer.from_tensors(tensors, top_k=4, max_tokens=16)
    assert_same_layer(got, mxmoe.torch.MoeLayer(weights), 32)


def test_layer_from_cuda_tensors_converts_float16_and_strided_tensors():
    host = dense_layer(np.random.default_rng(22), 8, 128, 64)
    tensors = cuda_tensors(host)
    expected = mxmoe.torch.MoeLayer.from_tensors(tensors, top_k=2)
    tensors["router.bias"] = tensors["router.bias"].half()  # these bf16 values are float16 values too
    down = tensors["experts.down_proj"]
    tensors["experts.down_proj"] = torch.stack([down, torch.zeros_like(down)], dim=-1).flatten(-2)[..., ::2]  # strided: copied
    assert not tensors["experts.down_proj"].is_contiguous()
    assert_same_layer(mxmoe.torch.MoeLayer.from_tensors(tensors, top_k=2), expected, 8)


def small_weights_and_tensors():
    """A layer small enough that PyTorch's allocator takes its weights from its small-block pool,
    which splits blocks exactly (a large block may come whole from the cache, up to 1 MiB more)."""
    host = oracle.random_layer(np.random.default_rng(23), 8, 128, 64)
    return mxmoe.weights_from_tensors(host, top_k=2), cuda_tensors(host)


def test_layer_memory_is_pytorchs():
    weights, tensors = small_weights_and_tensors()
    x = to_bf16(np.ones((4, 128), np.float32))
    for make in (lambda: mxmoe.torch.MoeLayer(weights), lambda: mxmoe.torch.MoeLayer.from_tensors(tensors, top_k=2)):
        gc.collect()  # earlier tests' garbage goes now, not inside the measurement
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        layer = make()
        assert layer.nbytes > 0 and layer.nbytes % 512 == 0
        assert layer.nbytes - layer._runner.device_bytes in range(512)
        assert torch.cuda.memory_allocated() - before == layer.nbytes
        y = layer(x)  # the call's workspace went back as it returned; its output is held here
        assert torch.cuda.memory_allocated() - before == layer.nbytes + y.untyped_storage().nbytes()
        del y
        layer.free()
        assert layer.nbytes == 0 and torch.cuda.memory_allocated() == before
        layer = make()
        assert torch.cuda.memory_allocated() - before == layer.nbytes
        del layer  # collected without free()
        gc.collect()
        assert torch.cuda.memory_allocated() == before


@pytest.mark.parametrize("fail_at", [1, 2], ids=["weights", "load-scratch"])
def test_allocation_failure_raises_pytorchs_oom_and_leaks_nothing(monkeypatch, fail_at):
    weights, tensors = small_weights_and_tensors()
    real = mxmoe.torch._empty
    for make in (lambda: mxmoe.torch.MoeLayer(weights), lambda: mxmoe.torch.MoeLayer.from_tensors(tensors, top_k=2)):
        calls = []

        def failing(nbytes, device):
            calls.append(nbytes)
            if len(calls) == fail_at:
                raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {nbytes} bytes (test)")
            return real(nbytes, device)

        monkeypatch.setattr(mxmoe.torch, "_empty", failing)
        gc.collect()  # earlier tests' garbage goes now, not inside the measurement
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        what = "weights" if fail_at == 1 else "load scratch"
        with pytest.raises(torch.cuda.OutOfMemoryError,
                           match=rf"MoE layer {what} \(E=8.*\d+ bytes\).*allocator returned no memory.*Tried to allocate"):
            make()
        assert len(calls) == fail_at
        gc.collect()
        assert torch.cuda.memory_allocated() == before

        def raising(nbytes, device):
            raise ValueError("no memory today")

        monkeypatch.setattr(mxmoe.torch, "_empty", raising)
        with pytest.raises(mxmoe.Error, match="allocator returned no memory.*ValueError: no memory today"):
            make()
        monkeypatch.setattr(mxmoe.torch, "_empty", real)
        assert torch.cuda.memory_allocated() == before


def test_bad_cuda_tensors_are_named():
    host = oracle.random_layer(np.random.default_rng(24), 8, 128, 64)
    good = cuda_tensors(host)

    def check(error, pattern, **changes):
        tensors = {**good, **changes}
        with pytest.raises(error, match=pattern):
            mxmoe.torch.MoeLayer.from_tensors(tensors, top_k=2)

    check(TypeError, r"experts.gate_up_proj_scales: expected torch.uint8 .* got torch.int8",
          **{"experts.gate_up_proj_scales": good["experts.gate_up_proj_scales"].view(torch.int8)})
    check(TypeError, r"router.weight: expected torch.bfloat16, torch.float32 or torch.float16, got torch.float64",
          **{"router.weight": good["router.weight"].double()})
    check(ValueError, r"experts.down_proj_bias: expected shape \[8, 128\], got \[8, 127\]",
          **{"experts.down_proj_bias": good["experts.down_proj_bias"][:, :127]})
    check(ValueError, r"experts.down_proj_scales: expected shape \[8, 128, 2\], got \[8, 128, 1\]",
          **{"experts.down_proj_scales": good["experts.down_proj_scales"][:, :, :1]})
    check(ValueError, r"router.bias: expected a tensor on cuda:\d+ \(where experts.gate_up_proj_blocks is\), got one on cpu",
          **{"router.bias": good["router.bias"].cpu()})
    check(ValueError, r"experts.gate_up_proj_blocks: expected a CUDA tensor, got cpu",
          **{"experts.gate_up_proj_blocks": good["experts.gate_up_proj_blocks"].cpu()})
    check(TypeError, r"experts.down_proj_bias: expected a CUDA torch.Tensor, got ndarray",
          **{"experts.down_proj_bias": host["experts.down_proj_bias"]})
    with pytest.raises(ValueError, match=r"top_k: expected 1 <= top_k <= min\(E, 32\) = 8, got 9"):
        mxmoe.torch.MoeLayer.from_tensors(good, top_k=9)
    without = {n: t for n, t in good.items() if n != "experts.down_proj_scales"}
    with pytest.raises(ValueError, match="no tensor named 'experts.down_proj_scales'"):
        mxmoe.torch.MoeLayer.from_tensors(without, top_k=2)
    dense = cuda_tensors(dense_layer(np.random.default_rng(25), 8, 128, 64))
    with pytest.raises(ValueError, match=r"experts.down_proj: expected shape \[8, 64, 128\], got \[8, 128, 64\]"):
        mxmoe.torch.MoeLayer.from_tensors({**dense, "experts.down_proj": dense["experts.down_proj"].transpose(1, 2)},
                                          top_k=2)
    with pytest.raises(TypeError, match="experts.gate_up_proj: expected torch.bfloat16, torch.float32 or torch.float16"):
        mxmoe.torch.MoeLayer.from_tensors({**dense, "experts.gate_up_proj": dense["experts.gate_up_proj"].to(torch.int32)},
                                          top_k=2)


def test_load_model_gives_each_layer_as_load_checkpoint_does(tmp_path, capsys):
    rng = np.random.default_rng(5)
    layers = [oracle.random_layer(rng, 8, 96, 64) for _ in range(3)]
    oracle.write_safetensors(tmp_path / "model.safetensors",
                             {f"model.layers.{i}.mlp.{n}": a for i, t in enumerate(layers) for n, a in t.items()})
    (tmp_path / "config.json").write_text('{"num_experts_per_tok": 2}')
    model = mxmoe.torch.load_model(tmp_path, max_tokens=16)
    assert len(model) == 3
    err = capsys.readouterr().err
    assert "layer 2 (3/3)" in err and "loaded 3 layers" in err
    x = to_bf16(np.random.default_rng(1).normal(size=(5, 96)).astype(np.float32))
    for i, layer in enumerate(model):
        alone = mxmoe.torch.MoeLayer(mxmoe.load_checkpoint(tmp_path, layer=i))
        assert torch.equal(layer(x), alone(x)), f"layer {i}"
    some = mxmoe.torch.load_model(tmp_path, layers=[2, 0], quiet=True)
    assert capsys.readouterr().err == ""
    assert torch.equal(some[0](x), model[2](x)) and torch.equal(some[1](x), model[0](x))
    with pytest.raises(mxmoe.Error, match="no MoE tensors for layer 7"):
        mxmoe.torch.load_model(tmp_path, layers=[0, 7], quiet=True)
    with pytest.raises(ValueError, match="at least one layer"):
        mxmoe.torch.load_model(tmp_path, layers=[])
