"""mxmoe.distributed on the CPU (gloo), 2 and 4 processes: the expert- and tensor-parallel layers against
the single-process CPU layer on the same tokens, routed by the layer's router, by given logits, and by
the caller (the engine form); expert parallelism by each of its paths (low latency, with the ranks'
token counts exchanged or given, and all-to-all), each checked to use its own collectives alone; odd
token counts, a rank with no tokens, ranks that receive none, routing skewed onto one rank, unchecked
out-of-range ids; and bad input. Two gpt-oss-spec shapes and one of DeepSeek-V4's spec (sqrt-softplus
routing with a selection bias, scaled; [gate; up] rows), whose hash-routed layers take the engine
form only. Skipped without PyTorch's gloo backend."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("PyTorch without the gloo backend: the distributed CPU tests are skipped", allow_module_level=True)

import mxmoe  # noqa: E402
import oracle  # noqa: E402
import oracle_deepseek_v4  # noqa: E402
from mxmoe.distributed import ExpertParallelLayer, TensorParallelLayer  # noqa: E402
from ranks import run_ranks  # noqa: E402

SHAPES = {"E8-top2": (8, 2, 96, 160), "E32-top4": (32, 4, 256, 192), "V4-E24-top6": (24, 6, 64, 96)}  # E, k, H, I
DEEPSEEK_V4 = {"V4-E24-top6": 1.5}  # the shapes of DeepSeek-V4's spec, and their routed_scaling
EP_TOKENS = {2: [7, 0], 4: [5, 0, 33, 1]}  # each rank's own tokens: odd counts, and a rank with none
# The expert-parallel variants, by layer arguments and call arguments, and the only collectives each may
# use: the low-latency path with the ranks' token counts exchanged (an all-gather) and with the most
# tokens of a rank given (padded beyond it), and the all-to-all path.
EP_VARIANTS = {
    "ep-ll": ({}, {}, {"all_gather_into_tensor", "reduce_scatter_tensor"}),
    "ep-ll-given": ({}, {"max_rank_tokens": 40}, {"all_gather_into_tensor", "reduce_scatter_tensor"}),
    "ep-a2a": ({"low_latency_max_tokens": 0}, {}, {"all_gather_into_tensor", "all_to_all_single"}),
}
COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "all_reduce")
TP_TOKENS = 9
# A rank's partial sums are rounded to bf16 before they add up (in float32 by the all-to-all path of
# expert parallelism, in bf16 by its low-latency path's reduce-scatter and by tensor parallelism's
# all-reduce); the single-process layer rounds once.
TOLERANCE = 5e-3


def layer_weights(name: str) -> mxmoe.Weights:
    e, k, h, i = SHAPES[name]
    rng = np.random.default_rng(list(SHAPES[name]))
    if name in DEEPSEEK_V4:
        tensors, _ = oracle_deepseek_v4.checkpoint_tensors("deepseek-hf", 0, oracle_deepseek_v4.random_router(rng, e, h),
                                                           oracle_deepseek_v4.random_experts(rng, e, h, i))
        return mxmoe.weights_from_tensors(tensors, top_k=k, routed_scaling=DEEPSEEK_V4[name])
    return mxmoe.weights_from_tensors(oracle.random_layer(rng, e, h, i), top_k=k)


def ep_inputs(shape, world: int, rank: int) -> dict:
    """Rank `rank`'s tokens and routings. skewed_logits send every token to rank 0's experts; ids never
    pick the last rank's experts (which so receives nothing); one_rank_ids put each token's experts on
    one rank."""
    e, k, h, _ = shape
    per_rank = e // world
    tokens = EP_TOKENS[world][rank]
    rng = np.random.default_rng([world, rank, e])
    skewed_logits = rng.normal(size=(tokens, e)).astype(np.float32)
    skewed_logits[:, :per_rank] += 8
    owners = rng.integers(0, world, size=(tokens, 1))
    ids = rng.integers(-1, e - per_rank, size=(tokens, k))  # -1: a slot that goes to no expert
    bad_ids = ids.copy()
    bad_ids[::2, 0] = e + np.arange(bad_ids[::2].shape[0])  # out of range: unchecked, they add nothing
    return {
        "x": oracle.bf16_bits(rng.normal(size=(tokens, h))),
        "skewed_logits": skewed_logits,
        "ids": ids,
        "weights": rng.random(size=(tokens, k)).astype(np.float32),
        "one_rank_ids": owners * per_rank + rng.integers(0, per_rank, size=(tokens, k)),
        "bad_ids": bad_ids,
    }


def tp_inputs(shape, world: int) -> dict:
    """The tokens and routings every rank takes."""
    e, k, h, _ = shape
    rng = np.random.default_rng([world, e])
    return {
        "x": oracle.bf16_bits(rng.normal(size=(TP_TOKENS, h))),
        "logits": rng.normal(size=(TP_TOKENS, e)).astype(np.float32),
        "ids": rng.integers(-1, e, size=(TP_TOKENS, k)),
        "weights": rng.random(size=(TP_TOKENS, k)).astype(np.float32),
    }


def bf16_tensor(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)


@contextlib.contextmanager
def only_collectives(allowed):
    """torch.distributed's collectives other than `allowed` raise while inside."""
    saved = {name: getattr(dist, name) for name in COLLECTIVES}

    def forbidden(name):
        def call(*args, **kwargs):
            raise AssertionError(f"{name}: not a collective of this path")
        return call

    for name in COLLECTIVES:
        if name not in allowed:
            setattr(dist, name, forbidden(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def rank_outputs(rank: int, world: int, folder) -> None:
    """One rank's outputs of every case, saved for the test process to compare."""
    out = {}
    for name, shape in SHAPES.items():
        weights = layer_weights(name)
        a = {key: torch.from_numpy(value) for key, value in ep_inputs(shape, world, rank).items()}
        x = bf16_tensor(a.pop("x").numpy())
        for variant, (layer_args, call_args, allowed) in EP_VARIANTS.items():
            ep = ExpertParallelLayer(weights, device="cpu", **layer_args)
            with only_collectives(allowed):
                out[f"{name}/{variant}/router"] = ep(x, **call_args)
                out[f"{name}/{variant}/skewed"] = ep(x, a["skewed_logits"], **call_args)
                out[f"{name}/{variant}/engine"] = ep.experts(x, a["ids"], a["weights"], **call_args)
                out[f"{name}/{variant}/one_rank"] = ep.experts(x, a["one_rank_ids"], a["weights"], **call_args)
                out[f"{name}/{variant}/unchecked"] = ep.experts(x, a["bad_ids"], a["weights"], check_ids=False,
                                                                **call_args)
            ep.free()
        ep = ExpertParallelLayer(weights, device="cpu")
        for case, routing in (("skewed", ep.route(x, a["skewed_logits"])), ("engine", (a["ids"], a["weights"]))):
            out[f"{name}/ep-a2a/{case}_rows_received"] = torch.tensor(sum(ep.dispatch(x, *routing).recv_splits))
        a = {key: torch.from_numpy(value) for key, value in tp_inputs(shape, world).items()}
        x = bf16_tensor(a.pop("x").numpy())
        tp = TensorParallelLayer(weights, device="cpu")
        out[f"{name}/tp/router"] = tp(x)
        out[f"{name}/tp/logits"] = tp(x, a["logits"])
        out[f"{name}/tp/engine"] = tp.experts(x, a["ids"], a["weights"])
    np.savez(folder / f"rank{rank}.npz", **{key: value.float().numpy() for key, value in out.items()})

    # Shapes that cannot be spread over this world, refused on every rank alike.
    with pytest.raises(ValueError, match=f"7 experts do not divide over {world} ranks"):
        ExpertParallelLayer(mxmoe.synthetic_weights(7, 1, 64, 64), device="cpu")
    if world == 4:
        with pytest.raises(ValueError, match="fewer experts than the top-k"):
            ExpertParallelLayer(mxmoe.synthetic_weights(8, 4, 64, 64), device="cpu")


@pytest.fixture(scope="module", params=[2, 4], ids=lambda world: f"{world}-ranks")
def outputs(request, tmp_path_factory):
    world = request.param
    folder = tmp_path_factory.mktemp(f"ranks{world}")
    run_ranks(rank_outputs, world, "gloo", folder, folder)
    return world, [dict(np.load(folder / f"rank{rank}.npz")) for rank in range(world)]


@pytest.mark.parametrize("variant", EP_VARIANTS)
@pytest.mark.parametrize("name", SHAPES)
def test_expert_parallel_equals_the_single_process_layer(outputs, name, variant):
    world, per_rank = outputs
    shape = SHAPES[name]
    single = mxmoe.CpuLayer(layer_weights(name))
    for rank in range(world):
        a, y = ep_inputs(shape, world, rank), per_rank[rank]
        x = a["x"]
        if x.shape[0] == 0:  # a rank with no tokens takes part and gets no rows back
            assert all(y[f"{name}/{variant}/{case}"].shape == (0, shape[2]) for case in ("router", "skewed", "engine"))
            continue
        bad = a["bad_ids"]
        expected = {
            "router": single(x),
            "skewed": single(x, router_logits=a["skewed_logits"]),
            "engine": mxmoe.experts(x, a["ids"], a["weights"], single),
            "unchecked": mxmoe.experts(x, np.where(bad >= shape[0], -1, bad), a["weights"], single),
        }
        for case, want in expected.items():
            error = oracle.relative_error(y[f"{name}/{variant}/{case}"], want)
            assert error < TOLERANCE, f"{case}, rank {rank} of {world}: relative error {error:.2e}"
        # Each token's experts on one rank: its one partial sum is the layer's output, bit for bit.
        assert np.array_equal(y[f"{name}/{variant}/one_rank"],
                              mxmoe.experts(x, a["one_rank_ids"], a["weights"], single))


@pytest.mark.parametrize("name", SHAPES)
def test_all_to_all_sends_rows_only_where_their_experts_are(outputs, name):
    world, per_rank = outputs
    # The routings were skewed as meant: all rows to rank 0; none to the last rank.
    received = [per_rank[rank][f"{name}/ep-a2a/skewed_rows_received"] for rank in range(world)]
    assert received[0] == sum(EP_TOKENS[world]) and not any(received[1:])
    assert per_rank[world - 1][f"{name}/ep-a2a/engine_rows_received"] == 0


@pytest.mark.parametrize("name", SHAPES)
def test_tensor_parallel_equals_the_single_process_layer(outputs, name):
    world, per_rank = outputs
    shape = SHAPES[name]
    single = mxmoe.CpuLayer(layer_weights(name))
    a = tp_inputs(shape, world)
    expected = {
        "router": single(a["x"]),
        "logits": single(a["x"], router_logits=a["logits"]),
        "engine": mxmoe.experts(a["x"], a["ids"], a["weights"], single),
    }
    for rank in range(world):
        for case, want in expected.items():
            y = per_rank[rank][f"{name}/tp/{case}"]
            assert np.array_equal(y, per_rank[0][f"{name}/tp/{case}"])  # every rank gets the same output
            error = oracle.relative_error(y, want)
            assert error < TOLERANCE, f"{case}, rank {rank} of {world}: relative error {error:.2e}"


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_an_uninitialised_group_is_refused():
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        TensorParallelLayer(layer_weights("E8-top2"), device="cpu")


def test_bad_input_names_the_argument(one_rank):
    weights = layer_weights("E8-top2")
    with pytest.raises(TypeError, match="weights: expected mxmoe.Weights"):
        ExpertParallelLayer(object(), device="cpu")
    with pytest.raises(ValueError, match="weights: expected a whole layer's weights"):
        ExpertParallelLayer(weights.expert_shard([0, 1, 2]), device="cpu")
    with pytest.raises(ValueError, match="device: the group's backend is gloo"):
        TensorParallelLayer(weights, device="cuda:0")
    with pytest.raises(TypeError, match="max_tokens: expected an integer"):
        TensorParallelLayer(weights, device="cpu", max_tokens=1.5)
    with pytest.raises(TypeError, match="low_latency_max_tokens: expected an integer"):
        ExpertParallelLayer(weights, device="cpu", low_latency_max_tokens=2.0)
    with pytest.raises(ValueError, match="low_latency_max_tokens: expected 0 or more, got -1"):
        ExpertParallelLayer(weights, device="cpu", low_latency_max_tokens=-1)
    ep, tp = ExpertParallelLayer(weights, device="cpu"), TensorParallelLayer(weights, device="cpu")
    x = torch.zeros(3, 96, dtype=torch.bfloat16)
    ids, w = torch.zeros(3, 2, dtype=torch.int64), torch.full((3, 2), 0.5)
    assert (ep.path(ep.low_latency_max_tokens), ep.path(ep.low_latency_max_tokens + 1)) == ("low-latency", "all-to-all")
    with pytest.raises(ValueError, match="max_rank_tokens: expected at least this rank's 3 tokens, got 2"):
        ep(x, max_rank_tokens=2)
    with pytest.raises(TypeError, match="max_rank_tokens: expected an integer"):
        ep.experts(x, ids, w, max_rank_tokens=3.0)
    assert ep(x[:0], max_rank_tokens=0).shape == (0, 96)  # no rank has a token: nothing is sent
    for layer in (ep, tp):
        with pytest.raises(TypeError, match="x: expected torch.bfloat16"):
            layer(x.float())
        with pytest.raises(ValueError, match=r"x: expected shape \[T, 96\]"):
            layer(x[:, :64].contiguous())
        with pytest.raises(ValueError, match=r"router_logits: expected shape \[3, 8\]"):
            layer(x, torch.zeros(3, 7))
        with pytest.raises(TypeError, match="topk_ids: expected torch.int32 or torch.int64"):
            layer.experts(x, ids.float(), w)
        with pytest.raises(ValueError, match=r"topk_ids: expected expert ids in \[0, 8\) or -1"):
            layer.experts(x, ids + 8, w)
        with pytest.raises(ValueError, match=r"topk_weights: expected shape \[3, 2\]"):
            layer.experts(x, ids, w[:2])
        layer.free()
        with pytest.raises(ValueError, match="freed"):
            layer(x)


def test_a_hash_routed_layer_takes_the_engine_form_only(one_rank):
    """DeepSeek-V4's hash-routed layers (gate.tid2eid, no router): the layer form and route() are refused
    with a message naming experts(), which gives the single-process layer's output."""
    e, k, h, i = SHAPES["V4-E24-top6"]
    rng = np.random.default_rng(11)
    tensors, _ = oracle_deepseek_v4.checkpoint_tensors("deepseek-hf", 0, None, oracle_deepseek_v4.random_experts(rng, e, h, i))
    weights = mxmoe.weights_from_tensors(tensors, top_k=k)
    x_bits = oracle.bf16_bits(rng.normal(size=(5, h)))
    ids = np.stack([rng.permutation(e)[:k] for _ in range(5)])
    topk_weights = rng.random(size=(5, k)).astype(np.float32)
    want = mxmoe.experts(x_bits, ids, topk_weights, mxmoe.CpuLayer(weights))
    x = bf16_tensor(x_bits)
    ep, tp = ExpertParallelLayer(weights, device="cpu"), TensorParallelLayer(weights, device="cpu")
    with pytest.raises(ValueError, match=r"hash-routed .* call experts\(\)"):
        ep.route(x)
    for layer in (ep, tp):
        with pytest.raises(ValueError, match=r"hash-routed .* call experts\(\)"):
            layer(x)
        got = layer.experts(x, torch.from_numpy(ids), torch.from_numpy(topk_weights)).float().numpy()
        assert oracle.relative_error(got, want) < TOLERANCE
