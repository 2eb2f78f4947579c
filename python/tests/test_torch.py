"""The PyTorch layer on a GPU (skipped without PyTorch or a CUDA device): against the CPU layer,
from given router logits, inside a CUDA graph, under torch.compile(fullgraph=True), the custom op's
own checks, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible: the PyTorch layer's tests are skipped", allow_module_level=True)

import mxmoe  # noqa: E402
import mxmoe.torch  # noqa: E402
import oracle  # noqa: E402

GPU_TOLERANCE = 1e-2  # bf16 activations (../shared/docs/BENCHMARK.md)


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
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(x)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(x)
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
    layer.free()
    with pytest.raises(ValueError, match="freed"):
        layer(x)
