"""mxmoe across the ranks of a torch.distributed process group, under the engine's communication.

Expert parallel: each rank holds E / world of the layer's experts and its own tokens, by one of two
paths, chosen by the most tokens any rank takes in the call (M):
- low latency, M <= low_latency_max_tokens (decode, speculative decoding): every rank's tokens,
  padded to M rows, are all-gathered to every rank; each rank runs its shard over all of them
  (pairs routed to experts it does not hold add nothing), and one reduce-scatter sums the ranks'
  outputs back to each rank's own tokens. Nothing is read on the host: capturable in a CUDA graph.
- all-to-all, above: a token's row goes, by all_to_all_single, to each rank that holds one of its
  top-k experts (once per rank, with its whole routing), runs there through that rank's expert call,
  and comes back as that rank's weighted partial sum. The split sizes are read on the host (a
  synchronisation): this path cannot be captured.
Tensor parallel: each rank holds a slice of the intermediate dimension and the same tokens; one
all-reduce sums the ranks' outputs. Nothing is read on the host: capturable.

    import torch.distributed as dist, mxmoe, mxmoe.distributed
    dist.init_process_group("nccl")    # "gloo" runs the CPU layer, on CPU tensors
    ep = mxmoe.distributed.ExpertParallelLayer(weights, device=local_rank, max_tokens=4096)
    y = ep(x)                          # x: this rank's tokens [T, H] bf16 (T may differ per rank, 0 too)
    y = ep(x, max_rank_tokens=8)       # no rank has more than 8 tokens: no host read (graph capture)
    y = ep(x, router_logits)           # routing from given logits [T, E] float32
    y = ep.experts(x, topk_ids, topk_weights, check_ids=False, max_rank_tokens=8)   # the engine form
    tp = mxmoe.distributed.TensorParallelLayer(weights, device=local_rank)
    y = tp(x)                          # x: the same tokens on every rank, which all get the output

On a CUDA device a rank's layer is an mxmoe.torch.MoeLayer (NCCL moves the rows); on the CPU it is
an mxmoe.CpuLayer (gloo); the code around the collectives is the same. Every rank of the group must
make the same call (the same max_rank_tokens too). Arguments are checked before any communication,
so a rank that raises leaves the others waiting in the collective, as torch.distributed's own calls
do.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch
import torch.distributed as dist

import mxmoe
from mxmoe.torch import MoeLayer, _check_routing, _check_tensor, _eager

__all__ = ["ExpertParallelLayer", "TensorParallelLayer", "Gathered", "Dispatched", "NVLINK_MULTICAST_OFF",
           "LOW_LATENCY_MAX_TOKENS"]

# The environment mxmoe's tests and benchmark give the ranks they start: NVLink multicast (NVLS) off in
# NCCL, PyTorch and NVSHMEM. The layers need none of it, and on the shared multi-GPU machines they run on
# a program that uses it can put the host's GPUs out of service.
NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# The most tokens per rank that ExpertParallelLayer sends by the low-latency path by default. With
# top-4 routing over 2 ranks most tokens have an expert on each rank, so the all-to-all moves nearly
# as many rows as the all-gather and adds a host synchronisation. python/bench/distributed.py on 4
# H200s (NVLink) measured the low-latency path faster at every T it times up to 4096 tokens a rank
# at 2 ranks (gpt-oss-120b 2463 us against 3312) and on gpt-oss-20b at 4 (2344 against 3632); at 4
# ranks gpt-oss-120b's two paths tie at 4096 (3606 against 3576): the crossover (docs/distributed.md).
LOW_LATENCY_MAX_TOKENS = 4096


class _RankLayer:
    """This rank's mxmoe layer, bf16 tensors in and out: an mxmoe.torch.MoeLayer on a CUDA device, an
    mxmoe.CpuLayer (through CPU tensors) on the CPU. A call of no tokens runs nothing."""

    def __init__(self, weights: mxmoe.Weights, device: torch.device, max_tokens: Optional[int]):
        self.on_cpu = device.type == "cpu"
        self.routed_experts = weights.routed_experts
        self.layer = mxmoe.CpuLayer(weights) if self.on_cpu else MoeLayer(weights, device, max_tokens)

    def forward(self, x: torch.Tensor, router_logits: Optional[torch.Tensor]) -> torch.Tensor:
        if x.shape[0] == 0:
            return torch.empty_like(x)
        if self.on_cpu:
            return _bf16_tensor(self.layer(x, router_logits))
        return self.layer(x, router_logits)

    def experts(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """The ids were checked by the caller, or not (check_ids=False): a slot whose id is outside
        [0, E) adds nothing, on the CPU as on the GPU (the GPU layer is not asked to read them)."""
        if x.shape[0] == 0:
            return torch.empty_like(x)
        if self.on_cpu:
            valid = (topk_ids >= 0) & (topk_ids < self.routed_experts)
            return _bf16_tensor(self.layer.experts(x, topk_ids.where(valid, -1), topk_weights))
        return self.layer.experts(x, topk_ids, topk_weights, check_ids=False)

    def free(self) -> None:
        self.layer.free()


def _bf16_tensor(values: np.ndarray) -> torch.Tensor:
    """The CPU layer's float32 output (every value a bf16) as a bf16 tensor, exactly."""
    return torch.from_numpy(values).to(torch.bfloat16)


def _device_for(group, device) -> torch.device:
    """The rank's device: the one given, else the current CUDA device under NCCL and the CPU otherwise;
    refused where the group's backend cannot move tensors of that device."""
    backend = dist.get_backend(group)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected a CUDA device or the CPU, got {device}")
    if backend == "nccl" and device.type == "cpu":
        raise ValueError("device: the group's backend is nccl, which moves CUDA tensors only; use gloo for the CPU")
    if backend == "gloo" and device.type == "cuda":
        raise ValueError(f"device: the group's backend is gloo, whose all_to_all moves CPU tensors only; "
                         f"use nccl for {device}")
    return device


class _ParallelLayer(torch.nn.Module):
    """What the expert- and tensor-parallel layers share: the group, the device, argument checks. A
    subclass says which shard a rank holds (_shard) and how many tokens its layer may take at once."""

    def __init__(self, weights: mxmoe.Weights, group=None, device=None, max_tokens: Optional[int] = None):
        """`weights`: the whole layer's, the same on every rank. `group`: the process group (default: the
        world). `device`: this rank's (default: the current CUDA device under NCCL, else the CPU).
        `max_tokens`: the most tokens of one call, prepared for at once on a GPU (mxmoe.torch.MoeLayer)."""
        super().__init__()
        if not isinstance(weights, mxmoe.Weights):
            raise TypeError(f"weights: expected mxmoe.Weights, got {type(weights).__name__}")
        if weights.global_experts != list(range(weights.routed_experts)):
            raise ValueError("weights: expected a whole layer's weights, got an expert-parallel shard")
        if max_tokens is not None:
            mxmoe._check_int("max_tokens", max_tokens)
        if not dist.is_initialized():
            raise ValueError("group: torch.distributed is not initialised (call init_process_group first)")
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.device = _device_for(group, device)
        self.shape = weights.shape
        self.spec = weights.spec
        self._freed = False
        self._rank_layer = _RankLayer(self._shard(weights), self.device,
                                      None if max_tokens is None else self._rank_tokens(max_tokens))

    def _shard(self, weights: mxmoe.Weights) -> mxmoe.Weights:
        raise NotImplementedError

    def _rank_tokens(self, max_tokens: int) -> int:
        return max_tokens

    def free(self) -> None:
        """Frees this rank's layer (its device memory); a later call raises ValueError."""
        self._freed = True
        self._rank_layer.free()

    def extra_repr(self) -> str:
        s = self.shape
        return (f"E={s.num_experts}, k={s.top_k}, H={s.hidden}, I={s.intermediate}, rank {self.rank} of "
                f"{self.world}, device={self.device}")

    def _check_x(self, x: torch.Tensor, router_logits: Optional[torch.Tensor] = None) -> None:
        if self._freed:
            raise ValueError("layer: this layer was freed")
        _check_tensor(x, "x", torch.bfloat16, self.device, (None, self.shape.hidden))
        if router_logits is not None:
            _check_tensor(router_logits, "router_logits", torch.float32, self.device,
                          (x.shape[0], self.shape.num_experts))

    def _check_routed(self) -> None:
        """The layer form needs a router: a hash-routed (caller-top-k) layer takes the engine form only."""
        if self.spec.router == "caller-top-k":
            raise ValueError("layer: a hash-routed (caller-top-k) layer has no router: call experts() with the "
                             "caller's top-k")

    def _check_routing(self, x: torch.Tensor, topk_ids, topk_weights, check_ids: bool) -> torch.Tensor:
        self._check_x(x)
        return _check_routing(topk_ids, topk_weights, x.shape[0], self.shape.top_k, self.shape.num_experts,
                              self.device, check_ids)


class Gathered(NamedTuple):
    """Every rank's tokens on every rank (the low-latency path): rank r's at rows [r M, r M + T_r),
    padded to M rows per rank."""
    x: torch.Tensor                        # [W M, H] bf16, zero in the padding
    router_logits: Optional[torch.Tensor]  # [W M, E] float32, or None: the layer's router routes
    topk_ids: Optional[torch.Tensor]       # [W M, k] int32, -1 in the padding; None unless the caller routes
    topk_weights: Optional[torch.Tensor]   # [W M, k] float32
    num_tokens: int                        # T: this rank's own tokens
    rank_tokens: int                       # M: the rows per rank


class Dispatched(NamedTuple):
    """The rows an expert-parallel rank received (the all-to-all path), and how to send their results
    back."""
    x: torch.Tensor              # [R, H] bf16: the received tokens' rows
    topk_ids: torch.Tensor       # [R, k] int32: their whole routing (the layer's expert ids)
    topk_weights: torch.Tensor   # [R, k] float32
    sent_tokens: torch.Tensor    # [S] int64: the sender's token of each row it sent, by destination rank
    send_splits: list[int]       # rows sent to each rank
    recv_splits: list[int]       # rows received from each rank
    num_tokens: int              # the sender's tokens


class ExpertParallelLayer(_ParallelLayer):
    """Rank `rank` of an expert-parallel layer: it holds the experts [E rank / world, E (rank + 1) / world)
    (weights.expert_parallel_shard) and the whole router, and takes its own tokens.

    A call goes by the low-latency path (gather -> compute_gathered -> reduce_scatter) when the most
    tokens of any rank, M, is at most `low_latency_max_tokens`, else by the all-to-all path (route ->
    dispatch -> compute -> combine). The stages are public so that they can be timed one by one
    (python/bench/distributed.py)."""

    def __init__(self, weights: mxmoe.Weights, group=None, device=None, max_tokens: Optional[int] = None,
                 low_latency_max_tokens: int = LOW_LATENCY_MAX_TOKENS):
        """As for TensorParallelLayer; `max_tokens` counts a call's tokens on any rank, and the rank's layer
        is prepared for the world's, which it may receive. `low_latency_max_tokens`: the most tokens per
        rank (M) sent by the low-latency path; 0 sends every call by the all-to-all path."""
        mxmoe._check_int("low_latency_max_tokens", low_latency_max_tokens)
        if low_latency_max_tokens < 0:
            raise ValueError(f"low_latency_max_tokens: expected 0 or more, got {low_latency_max_tokens}")
        super().__init__(weights, group, device, max_tokens)
        self.low_latency_max_tokens = int(low_latency_max_tokens)
        self.experts_per_rank = self.shape.num_experts // self.world
        self._router_weight = self._router_bias = None  # a hash-routed layer has no router
        if self.spec.router != "caller-top-k":
            weight, bias = weights.router
            self._router_weight = torch.from_numpy(weight).to(self.device)
            self._router_bias = torch.from_numpy(bias).to(self.device)

    def _shard(self, weights: mxmoe.Weights) -> mxmoe.Weights:
        if weights.routed_experts % self.world:
            raise ValueError(f"world: {weights.routed_experts} experts do not divide over {self.world} ranks "
                             "(expert parallelism gives each rank E / world)")
        return weights.expert_parallel_shard(self.rank, self.world)

    def _rank_tokens(self, max_tokens: int) -> int:
        return self.world * max_tokens

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, low_latency_max_tokens={self.low_latency_max_tokens}"

    def path(self, max_rank_tokens: int) -> str:
        """"low-latency" or "all-to-all": the path of a call in which no rank has more than
        `max_rank_tokens` tokens."""
        return "low-latency" if max_rank_tokens <= self.low_latency_max_tokens else "all-to-all"

    def forward(self, x: torch.Tensor, router_logits: Optional[torch.Tensor] = None, *,
                max_rank_tokens: Optional[int] = None) -> torch.Tensor:
        """The layer's output [T, H] bf16 for this rank's tokens x [T, H] bf16.

        `max_rank_tokens`: the most tokens any rank takes in this call (at least T; the same on every
        rank): an engine that pads each rank's batch to one size passes that size. None: the ranks
        exchange their counts, which reads them on the host (a synchronisation, refused inside a CUDA
        graph capture or torch.compile). On the low-latency path the layer's router routes inside
        mxmoe, as the single-device layer does; on the all-to-all path the routing is route()'s."""
        self._check_x(x, router_logits)
        self._check_routed()
        rank_tokens = self._max_rank_tokens(x, max_rank_tokens)
        if self.path(rank_tokens) == "low-latency":
            return self._low_latency(x, rank_tokens, router_logits=router_logits)
        topk_ids, topk_weights = self.route(x, router_logits)
        return self._all_to_all(x, topk_ids, topk_weights)

    def experts(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                check_ids: Optional[bool] = None, *, max_rank_tokens: Optional[int] = None) -> torch.Tensor:
        """The engine form: the experts and the weighted sum for the caller's routing, topk_ids [T, k]
        int32 or int64 (the layer's expert ids, -1 for a slot that goes to no expert) and topk_weights
        [T, k] float32. `check_ids` as for mxmoe.torch.MoeLayer.experts (None: read the ids on the host
        to check them in eager calls only; unchecked, a slot with an id outside [0, E) adds nothing);
        `max_rank_tokens` as for forward()."""
        if check_ids is None:
            check_ids = _eager(self.device)
        topk_weights = self._check_routing(x, topk_ids, topk_weights, check_ids)
        rank_tokens = self._max_rank_tokens(x, max_rank_tokens)
        if self.path(rank_tokens) == "low-latency":
            return self._low_latency(x, rank_tokens, topk_ids=topk_ids, topk_weights=topk_weights)
        return self._all_to_all(x, topk_ids, topk_weights)

    def _max_rank_tokens(self, x: torch.Tensor, max_rank_tokens: Optional[int]) -> int:
        """M, given (and checked against this rank's tokens) or exchanged between the ranks on the host."""
        tokens = x.shape[0]
        if max_rank_tokens is not None:
            mxmoe._check_int("max_rank_tokens", max_rank_tokens)
            if max_rank_tokens < tokens:
                raise ValueError(f"max_rank_tokens: expected at least this rank's {tokens} tokens, got {max_rank_tokens}")
            rank_tokens = int(max_rank_tokens)
        else:
            if not _eager(self.device):
                raise ValueError("max_rank_tokens: required inside a CUDA graph capture or torch.compile "
                                 "(without it the ranks' token counts are exchanged on the host)")
            counts = torch.empty(self.world, dtype=torch.int64, device=self.device)
            dist.all_gather_into_tensor(counts, torch.tensor([tokens], dtype=torch.int64, device=self.device),
                                        group=self.group)
            rank_tokens = int(counts.max())
        if self.path(rank_tokens) == "all-to-all" and not _eager(self.device):
            raise ValueError(f"max_rank_tokens: {rank_tokens} is above low_latency_max_tokens "
                             f"({self.low_latency_max_tokens}), and the all-to-all path reads its split sizes on "
                             "the host: it cannot run inside a CUDA graph capture or torch.compile")
        return rank_tokens

    # ---- the low-latency path: all-gather, every token through this rank's experts, reduce-scatter ----

    def gather(self, x: torch.Tensor, rank_tokens: int, router_logits: Optional[torch.Tensor] = None,
               topk_ids: Optional[torch.Tensor] = None, topk_weights: Optional[torch.Tensor] = None) -> Gathered:
        """Every rank's tokens (and their given logits or routing), padded to `rank_tokens` rows per rank,
        on every rank: one all_gather_into_tensor (x alone, or its columns packed side by side as bytes)."""
        columns = [(x, 0)]
        if router_logits is not None:
            columns.append((router_logits, 0))
        if topk_ids is not None:
            columns += [(topk_ids.to(torch.int32), -1), (topk_weights, 0)]
        padded = [_pad_rows(t, rank_tokens, fill) for t, fill in columns]
        rows = padded[0] if len(padded) == 1 else _pack(padded)
        gathered = rows.new_empty((self.world * rank_tokens, rows.shape[1]))
        dist.all_gather_into_tensor(gathered, rows, group=self.group)
        parts = [gathered] if len(padded) == 1 else _unpack(gathered, [(t.dtype, t.shape[1]) for t in padded])
        logits = parts[1] if router_logits is not None else None
        ids, weights = parts[-2:] if topk_ids is not None else (None, None)
        return Gathered(parts[0], logits, ids, weights, x.shape[0], rank_tokens)

    def compute_gathered(self, gathered: Gathered) -> torch.Tensor:
        """This rank's experts over every rank's tokens [W M, H]: each token's weighted sum over the
        experts held here, routed inside mxmoe (by the router or the given logits) or by the caller."""
        if gathered.topk_ids is not None:
            return self._rank_layer.experts(gathered.x, gathered.topk_ids, gathered.topk_weights)
        return self._rank_layer.forward(gathered.x, gathered.router_logits)

    def reduce_scatter(self, gathered: Gathered, partial: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's partial outputs (bf16: at 2 ranks the exact sum rounded once) for this
        rank's own tokens: one reduce_scatter_tensor."""
        out = partial.new_empty((gathered.rank_tokens, self.shape.hidden))
        dist.reduce_scatter_tensor(out, partial, group=self.group)
        return out[:gathered.num_tokens]

    def _low_latency(self, x, rank_tokens: int, **columns) -> torch.Tensor:
        if rank_tokens == 0:  # no rank has a token: nothing to send
            return torch.empty_like(x)
        gathered = self.gather(x, rank_tokens, **columns)
        return self.reduce_scatter(gathered, self.compute_gathered(gathered))

    # ---- the all-to-all path: each token to the ranks of its experts and back ------------------------

    def route(self, x: torch.Tensor, router_logits: Optional[torch.Tensor] = None):
        """(topk_ids [T, k] int64, topk_weights [T, k] float32), as mxmoe's layer routes by its spec, from
        the logits (given, or the layer's router in float32): softmax-top-k, the top-k of the logits and
        the softmax over the k selected; sqrt-softplus (DeepSeek-V4), scores sqrt(softplus(logits)), the
        top-k of scores + selection bias, weights the chosen scores over their sum times routed_scaling.
        Logits computed here may differ from mxmoe's own in their last bits (another summation order),
        which can turn a near tie between the k-th and the next expert the other way; given logits route
        alike."""
        self._check_x(x, router_logits)
        self._check_routed()
        sqrt_softplus = self.spec.router == "sqrt-softplus"
        if router_logits is None:  # sqrt-softplus: the router's bias selects, it is no logit bias
            router_logits = torch.nn.functional.linear(x.float(), self._router_weight,
                                                       None if sqrt_softplus else self._router_bias)
        if not sqrt_softplus:
            top = torch.topk(router_logits, self.shape.top_k, dim=1)
            return top.indices, torch.softmax(top.values, dim=1)
        scores = torch.nn.functional.softplus(router_logits).sqrt()
        ids = torch.topk(scores + self._router_bias, self.shape.top_k, dim=1).indices
        chosen = scores.gather(1, ids)
        return ids, chosen / chosen.sum(dim=1, keepdim=True) * self.spec.routed_scaling

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        """Sends each token's row and routing once to every rank that holds one of its experts; receives
        the rows other ranks send here. A slot whose id is outside [0, E) goes to no rank."""
        tokens = x.shape[0]
        valid = (topk_ids >= 0) & (topk_ids < self.shape.num_experts)
        owners = torch.div(topk_ids, self.experts_per_rank, rounding_mode="floor").where(valid, 0)
        slots_per_rank = torch.zeros(tokens, self.world, dtype=torch.int32, device=x.device)
        slots_per_rank.scatter_add_(1, owners, valid.to(torch.int32))
        sends = slots_per_rank.T > 0                                       # [world, T]
        send_counts = sends.sum(dim=1)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send_splits, recv_splits = torch.stack((send_counts, recv_counts)).tolist()
        sent_tokens = sends.nonzero()[:, 1]                                # by destination rank, then token
        rows = _pack((x[sent_tokens], topk_ids[sent_tokens].to(torch.int32), topk_weights[sent_tokens]))
        received = self._exchange(rows, send_splits, recv_splits)
        rx, rids, rweights = _unpack(received, ((torch.bfloat16, self.shape.hidden), (torch.int32, self.shape.top_k),
                                                (torch.float32, self.shape.top_k)))
        return Dispatched(rx, rids, rweights, sent_tokens, send_splits, recv_splits, tokens)

    def compute(self, dispatched: Dispatched) -> torch.Tensor:
        """This rank's experts over the received rows: each row's weighted sum over the experts held here."""
        return self._rank_layer.experts(dispatched.x, dispatched.topk_ids, dispatched.topk_weights)

    def combine(self, dispatched: Dispatched, partial: torch.Tensor) -> torch.Tensor:
        """Sends each received row's partial sum back to its sender, and adds up each token's partial sums
        (in float32, then rounded to bf16)."""
        (back,) = _unpack(self._exchange(_pack((partial,)), dispatched.recv_splits, dispatched.send_splits),
                          ((torch.bfloat16, self.shape.hidden),))
        out = torch.zeros(dispatched.num_tokens, self.shape.hidden, dtype=torch.float32, device=back.device)
        return out.index_add_(0, dispatched.sent_tokens, back.float()).to(torch.bfloat16)

    def _all_to_all(self, x, topk_ids, topk_weights) -> torch.Tensor:
        dispatched = self.dispatch(x, topk_ids, topk_weights)
        return self.combine(dispatched, self.compute(dispatched))

    def _exchange(self, rows: torch.Tensor, send_splits: list[int], recv_splits: list[int]) -> torch.Tensor:
        received = rows.new_empty((sum(recv_splits), rows.shape[1]))
        dist.all_to_all_single(received, rows, recv_splits, send_splits, group=self.group)
        return received


def _pad_rows(t: torch.Tensor, rows: int, fill) -> torch.Tensor:
    """t [T, *] with rows T..rows-1 added, filled with `fill` (t itself where T is already `rows`)."""
    if t.shape[0] == rows:
        return t.contiguous()
    return torch.cat((t, t.new_full((rows - t.shape[0], *t.shape[1:]), fill)))


def _pack(columns) -> torch.Tensor:
    """Tensors of the same rows [N, *] side by side as bytes [N, B]: one message for all of them."""
    return torch.cat([c.contiguous().view(torch.uint8) for c in columns], dim=1)


def _unpack(rows: torch.Tensor, columns):
    """The inverse of _pack for columns (dtype, width) in order."""
    out, start = [], 0
    for dtype, width in columns:
        size = width * dtype.itemsize
        out.append(rows[:, start:start + size].contiguous().view(dtype))
        start += size
    return out


class TensorParallelLayer(_ParallelLayer):
    """Rank `rank` of a tensor-parallel layer: it holds a slice of the intermediate dimension
    (weights.tensor_parallel_shard) of every expert, and every rank takes the same tokens; its output
    and the other ranks' add up, by one all-reduce (in bf16), to the layer's. Nothing is read on the
    host (with check_ids=False in the engine form): capturable in a CUDA graph."""

    def _shard(self, weights: mxmoe.Weights) -> mxmoe.Weights:
        return weights.tensor_parallel_shard(self.rank, self.world)

    def forward(self, x: torch.Tensor, router_logits: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The layer's output [T, H] bf16 for x [T, H] bf16, the same tokens on every rank."""
        self._check_routed()
        return self.reduce(self.compute(x, router_logits))

    def experts(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                check_ids: Optional[bool] = None) -> torch.Tensor:
        """The engine form (as ExpertParallelLayer.experts), the same routing on every rank. `check_ids` as
        for mxmoe.torch.MoeLayer.experts: reading the ids on the host is this call's only synchronisation."""
        if check_ids is None:
            check_ids = _eager(self.device)
        topk_weights = self._check_routing(x, topk_ids, topk_weights, check_ids)
        return self.reduce(self._rank_layer.experts(x, topk_ids, topk_weights))

    def compute(self, x: torch.Tensor, router_logits: Optional[torch.Tensor] = None) -> torch.Tensor:
        """This rank's share of the output: its slice of every expert, routed by the whole router."""
        self._check_x(x, router_logits)
        return self._rank_layer.forward(x, router_logits)

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's share, on every rank."""
        dist.all_reduce(partial, group=self.group)
        return partial
