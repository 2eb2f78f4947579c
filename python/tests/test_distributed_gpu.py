"""mxmoe.distributed on 2 and 4 GPUs (NCCL, one process per GPU): the expert- and tensor-parallel layers
against the single-GPU layer on the same tokens, within 5e-3 relative by norm (the bf16 rounding of the
ranks' partial sums), for both gpt-oss models and both DeepSeek-V4 models (sqrt-softplus routing;
V4-Flash's 256 experts and V4-Pro's 13.4 GB layer are where expert parallelism is needed): eager,
expert parallelism by each of its paths (low latency and all-to-all), and captured in a CUDA graph
and replayed (the low-latency path, with the most tokens of a rank given, and tensor parallelism).
Skipped with fewer than 2 CUDA devices visible."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if torch.cuda.device_count() < 2:
    pytest.skip(f"{torch.cuda.device_count()} CUDA device(s) visible: the multi-GPU tests need 2 or 4",
                allow_module_level=True)

import mxmoe  # noqa: E402
import mxmoe.torch  # noqa: E402
from mxmoe.distributed import ExpertParallelLayer, TensorParallelLayer  # noqa: E402
from cuda_graphs import capture  # noqa: E402
from ranks import run_ranks  # noqa: E402

EP_TOKENS = [61, 0, 64, 1]  # rank r's own tokens (the first `world`): odd counts and a rank with none
TP_TOKENS = 61
TOLERANCE = 5e-3


def inputs(weights: mxmoe.Weights, tokens: int, seed: int, device: torch.device) -> dict:
    """Seeded tokens, their router logits (the layer's router in float32) and a caller's routing."""
    e, k, h, _ = weights.shape
    gen = torch.Generator(device).manual_seed(seed)
    x = torch.randn(tokens, h, generator=gen, device=device).bfloat16()
    weight, bias = (torch.from_numpy(a).to(device) for a in weights.router)
    softmax = weights.spec.router == "softmax-top-k"  # sqrt-softplus: the bias selects, it is no logit bias
    return {
        "x": x,
        "logits": torch.nn.functional.linear(x.float(), weight, bias if softmax else None),
        "ids": torch.randint(-1, e, (tokens, k), generator=gen, device=device),  # -1: no expert
        "weights": torch.rand(tokens, k, generator=gen, device=device),
    }


def outputs(layer, a: dict, **call_args) -> dict:
    return {"router": layer(a["x"], **call_args), "logits": layer(a["x"], a["logits"], **call_args),
            "engine": layer.experts(a["x"], a["ids"], a["weights"], **call_args)}


def captured(layer, a: dict, **call_args) -> dict:
    """outputs(), captured in one CUDA graph (after a warm-up on a side stream, which also sets up the
    collectives' communicators) and replayed once. Inside the capture the engine form reads no ids."""
    graph, out = capture(lambda: outputs(layer, a, **call_args))
    graph.replay()
    torch.cuda.synchronize()
    return out


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return (torch.linalg.norm(got.float() - want.float()) / torch.linalg.norm(want.float())).item()


def rank_checks(rank: int, world: int, model: str) -> None:
    device = torch.device("cuda", rank)
    weights = mxmoe.synthetic_model_weights(model, seed=1)
    single = mxmoe.torch.MoeLayer(weights, device)
    ep_inputs, tp_inputs = inputs(weights, EP_TOKENS[rank], 100 + rank, device), inputs(weights, TP_TOKENS, 0, device)
    decode_inputs = inputs(weights, 1, 200 + rank, device)  # one token on every rank
    max_rank_tokens = max(EP_TOKENS[:world])
    errors = {}
    # Expert parallel: each rank's own tokens. On the all-to-all path its router's float32 logits (torch)
    # may differ from the single layer's in the last bits, and on the low-latency path mxmoe routes the
    # world's tokens at once, whose logits may differ from those of this rank's tokens alone in the last
    # bits: both take the same logits (cases "logits" and "engine").
    # Tensor parallel: the same tokens on every rank; every shard routes as the layer does.
    variants = (
        ("ep-ll", lambda: ExpertParallelLayer(weights, device=device), ep_inputs, ("logits", "engine"), {}),
        ("ep-a2a", lambda: ExpertParallelLayer(weights, device=device, low_latency_max_tokens=0), ep_inputs,
         ("logits", "engine"), {}),
        ("ep-ll-graph", lambda: ExpertParallelLayer(weights, device=device), ep_inputs, ("logits", "engine"),
         {"max_rank_tokens": max_rank_tokens}),
        ("ep-ll-graph-decode", lambda: ExpertParallelLayer(weights, device=device), decode_inputs,
         ("logits", "engine"), {"max_rank_tokens": 1}),
        ("tp", lambda: TensorParallelLayer(weights, device=device), tp_inputs, ("router", "logits", "engine"), {}),
        ("tp-graph", lambda: TensorParallelLayer(weights, device=device), tp_inputs, ("router", "logits", "engine"),
         {}),
    )
    for name, make, a, cases, call_args in variants:
        layer = make()
        got = captured(layer, a, **call_args) if "-graph" in name else outputs(layer, a, **call_args)
        want = outputs(single, a)
        layer.free()
        for case in cases:
            if a["x"].shape[0]:
                errors[f"{name}/{case}"] = relative_error(got[case], want[case])
    single.free()
    print(f"{model}, rank {rank} of {world}: relative error against the single-GPU layer "
          + ", ".join(f"{case} {error:.2e}" for case, error in errors.items()), flush=True)
    assert max(errors.values()) < TOLERANCE, f"{model}, rank {rank} of {world}: {errors}"


@pytest.mark.parametrize("model", mxmoe.MODELS)
@pytest.mark.parametrize("world", [2, 4])
def test_parallel_layers_equal_the_single_gpu_layer(world, model, tmp_path):
    if torch.cuda.device_count() < world:
        pytest.skip(f"{torch.cuda.device_count()} CUDA devices visible, {world} needed")
    run_ranks(rank_checks, world, "nccl", tmp_path, model)
