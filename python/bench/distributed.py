"""The expert- and tensor-parallel layers (mxmoe.distributed) timed per rank on 2 and 4 GPUs, beside
the one-GPU layer (a benchmark).

    python python/bench/distributed.py [--worlds 2 4] [--tokens 1 2 8 64 1024 4096]
                                       [--models M ...] [--repeats 50] [--draws 4]
                                       [--low-latency-max-tokens N] [--json FILE]

--models takes any of mxmoe.MODELS (default gpt-oss-20b gpt-oss-120b; deepseek-v4-flash and
deepseek-v4-pro route by sqrt-softplus, and a V4-Pro layer is 13.4 GB on each rank's host and GPU).

This is the launcher: for one GPU (the baseline) and then each world of --worlds that the visible GPUs
allow, it starts torchrun with one process per GPU, in an environment with NVLink multicast off
(mxmoe.distributed.NVLINK_MULTICAST_OFF), and prints one table from what the ranks measured.

Each rank takes T tokens of its own at each --tokens (expert parallel: the world's tokens number
world x T) or the same T tokens as every rank (tensor parallel), unit-normal, routed by the layer's
router, with synthetic weights seeded alike on every rank. Every timing is repeated for --draws sets
of tokens (draw d: seed rank + 1000 d, or 1000 d where the ranks share them; the one-GPU layer takes
rank 0's): a small batch's experts, and so how its pairs split between the ranks, are those of its
tokens, and at T = 1 on 2 ranks one draw may give a rank 2 of the 8 pairs and another 6. The rows:
- one-gpu: mxmoe.torch.MoeLayer, the whole layer, at T and at world x T; captured in a CUDA graph.
- ep-ll: the expert-parallel layer's low-latency path (max_rank_tokens = T), captured. comm_us is
  the bare collectives of that path at the same sizes (all_gather_into_tensor of [T, H] bf16 and
  reduce_scatter_tensor of [world T, H] bf16), captured alone; mxmoe_us the rank's shard over the
  world's gathered tokens, captured alone.
- ep-a2a: the expert-parallel layer's all-to-all path, eager (it reads its split sizes on the host),
  stage by stage with CUDA events on the stream: routing_us (router and top-k, in torch), comm_us
  (the dispatch, with its host synchronisation, and the combine) and mxmoe_us.
- tp: the tensor-parallel layer, captured; comm_us the bare all-reduce of [T, H] bf16, captured
  alone; mxmoe_us the rank's shard, captured alone.
A captured timing is the median over --repeats replays of the graph, queued back to back behind a
short device sleep (so that the host's launches do not pace them), each between two CUDA events; an
eager one is the median over --repeats forwards, each begun after a barrier.

The table gives, per model, layout, world and T, means over the draws: the slowest rank's total (its
range over the draws beside it), each rank's times, the one-GPU layer at T and world x T, over_us
(the total less the one-GPU layer at T) and over/comm (over_us over the slowest rank's bare
collectives: the decode target is at most 1.1). The closing
lines say which path ExpertParallelLayer(low_latency_max_tokens=--low-latency-max-tokens) takes at
each T, where ep-ll beats ep-a2a, from which T each of ep and tp beats one GPU, and the decode
target's verdicts, each ep-ll one with how many experts the busiest rank's shard and the one-GPU
layer touch (means over the draws, from the draws' routing by the layer's router in torch): what a
rank reads beyond the one-GPU layer is the pairs' split between the ranks.

Every rank checks its output at each T against the whole layer on its own device, both routed by the
same logits (eager calls, each path of ep and tp): the table's max_error is the largest relative
error by norm, and the launcher exits non-zero where one reaches CHECK_TOLERANCE.

--device cpu runs the same over gloo with the CPU layer, timed by the host clock, uncaptured: a check
of the plumbing where there is no GPU, not a measurement (e.g. --models gpt-oss-20b --tokens 1 2
--repeats 2 --worlds 2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import mxmoe
import mxmoe.torch
from mxmoe.distributed import LOW_LATENCY_MAX_TOKENS, NVLINK_MULTICAST_OFF, ExpertParallelLayer, TensorParallelLayer
from timing import capture

CHECK_TOLERANCE = 5e-3  # the bf16 rounding of the ranks' partial sums
DECODE_TOKENS = 8       # the decode target holds for T up to this
DECODE_SLACK = 1.1      # over_us at most the bare collectives' time plus 10 %
LAYOUTS = ("ep-ll", "ep-a2a", "tp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 8, 64, 1024, 4096])
    parser.add_argument("--models", nargs="+", default=["gpt-oss-20b", "gpt-oss-120b"], choices=mxmoe.MODELS)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--draws", type=int, default=4, help="sets of tokens each timing is repeated for")
    parser.add_argument("--low-latency-max-tokens", type=int, default=LOW_LATENCY_MAX_TOKENS,
                        help="the threshold whose choice of path the closing lines report")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--json", help="write every rank's medians here")
    parser.add_argument("--rank-records", help=argparse.SUPPRESS)  # set by the launcher for the ranks it starts
    args = parser.parse_args()
    if args.rank_records:
        run_rank(args)
    else:
        launch(args)


# ---- the launcher -----------------------------------------------------------------------------------

def launch(args) -> None:
    env = {**os.environ, **NVLINK_MULTICAST_OFF}
    visible = torch.cuda.device_count() if args.device == "cuda" else os.cpu_count()
    rank_args = ["--tokens", *map(str, args.tokens), "--models", *args.models, "--repeats", str(args.repeats),
                 "--draws", str(args.draws),
                 "--device", args.device, "--worlds", *map(str, args.worlds)]
    records = []
    with tempfile.TemporaryDirectory() as folder:
        for world in [1, *args.worlds]:
            if world > visible:
                print(f"world {world}: skipped, {visible} {args.device} device(s) visible", flush=True)
                continue
            path = os.path.join(folder, f"world{world}.json")
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
                       os.path.abspath(__file__), *rank_args, "--rank-records", path]
            subprocess.run(command, env=env, check=True)
            with open(path) as f:
                records += json.load(f)
    print_table(records)
    print_summary(records, args.low_latency_max_tokens)
    failed = [r for r in records if r.get("error", 0.0) >= CHECK_TOLERANCE]
    if args.json:
        device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "environment": NVLINK_MULTICAST_OFF,
                       "low_latency_max_tokens": args.low_latency_max_tokens, "records": records}, f, indent=1)
    if failed:
        sys.exit(f"check failed: {len(failed)} rank(s) at or above {CHECK_TOLERANCE} relative error, e.g. {failed[0]}")


def group_rows(records: list):
    """({(model, T): the one-GPU layer's total}, {(model, layout, world, T): [records by rank]} of the
    parallel layouts, {(model, layout, world, T): the slowest rank's total in each draw} of every
    layout): a record's timings are the means over its draws, a row's total the mean of its slowest."""
    by_rank = {}
    for r in records:
        by_rank.setdefault((r["model"], r["layout"], r["world"], r["tokens"], r["rank"]), []).append(r)
    slowest = most_by_draw(records, "total_us")
    one_gpu = {(model, t): statistics.mean(v) for (model, layout, _, t), v in slowest.items() if layout == "one-gpu"}
    rows = {}
    for (*key, _), draws in sorted(by_rank.items()):
        if key[1] == "one-gpu":
            continue
        mean = {**draws[0], **{k: statistics.mean(d[k] for d in draws) for k in draws[0] if k.endswith("_us")}}
        mean["error"] = max(d["error"] for d in draws)
        rows.setdefault(tuple(key), []).append(mean)
    return one_gpu, rows, slowest


def print_table(records: list) -> None:
    """One row per model, layout, world and T (see the module's docstring)."""
    one_gpu, rows, slowest = group_rows(records)
    print(f"{'model':<13} {'layout':<7} {'world':>5} {'T':>5} {'graph':>5} {'total_us':>9} {'draws':<13} "
          f"{'comm_us by rank':<24} {'mxmoe_us by rank':<24} {'routing_us':<16} {'1gpu_us@T':>9} {'1gpu_us@wT':>10} {'over_us':>8} "
          f"{'over/comm':>9} {'max_error':>9}")
    one_gpu_captured = any(r["captured"] for r in records if r["layout"] == "one-gpu")
    for (model, tokens), total in sorted(one_gpu.items()):
        print(f"{model:<13} {'one-gpu':<7} {1:>5} {tokens:>5} {'yes' if one_gpu_captured else 'no':>5} "
              f"{total:>9.1f} {_range(slowest[model, 'one-gpu', 1, tokens]):<13}")
    for (model, layout, world, tokens), ranks in sorted(rows.items()):
        def by_rank(key):
            return "/".join(f"{r[key]:.1f}" for r in ranks) if key in ranks[0] else "-"

        total = statistics.mean(slowest[model, layout, world, tokens])
        single = one_gpu.get((model, tokens))
        world_tokens = one_gpu.get((model, world * tokens)) if layout.startswith("ep") else None
        over = total - single if single is not None else None
        over_comm = over / max(r["comm_us"] for r in ranks) if over is not None and ranks[0]["captured"] else None
        print(f"{model:<13} {layout:<7} {world:>5} {tokens:>5} {'yes' if ranks[0]['captured'] else 'no':>5} "
              f"{total:>9.1f} {_range(slowest[model, layout, world, tokens]):<13} {by_rank('comm_us'):<24} "
              f"{by_rank('mxmoe_us'):<24} {by_rank('routing_us'):<16} "
              f"{_us(single):>9} {_us(world_tokens):>10} {_us(over):>8} "
              f"{'-' if over_comm is None else f'{over_comm:.2f}':>9} {max(r['error'] for r in ranks):>9.2e}")


def print_summary(records: list, low_latency_max_tokens: int) -> None:
    """The closing lines: the path ep takes, where ep-ll beats ep-a2a, from which T each mode beats one
    GPU, and the decode target."""
    one_gpu, rows, slowest = group_rows(records)
    totals = {key: statistics.mean(slowest[key]) for key in rows}
    experts = touched_by_row(records)
    for model, world in sorted({(m, w) for m, _, w, _ in rows}):
        tokens = sorted({t for m, _, w, t in rows if (m, w) == (model, world)})

        def total(layout, t):
            return totals.get((model, layout, world, t))

        picks = ", ".join(f"{t}: {'ll' if t <= low_latency_max_tokens else 'a2a'}" for t in tokens)
        print(f"{model}, {world} ranks: ExpertParallelLayer(low_latency_max_tokens={low_latency_max_tokens}) "
              f"takes at T = {picks}")
        ll_wins = [t for t in tokens if None not in (total("ep-ll", t), total("ep-a2a", t))
                   and total("ep-ll", t) <= total("ep-a2a", t)]
        print(f"  ep-ll at most ep-a2a at T = {ll_wins or 'none'}")
        best_ep = {t: min(x for x in (total("ep-ll", t), total("ep-a2a", t)) if x is not None) for t in tokens}
        tp = {t: total("tp", t) for t in tokens}
        for name, times, baseline in (("ep (its faster path) faster than one GPU at T", best_ep,
                                       lambda t: one_gpu.get((model, t))),
                                      ("ep (its faster path) faster than one GPU at world x T (the same tokens)",
                                       best_ep, lambda t: one_gpu.get((model, world * t))),
                                      ("tp faster than one GPU at T", tp, lambda t: one_gpu.get((model, t)))):
            wins = [t for t in tokens if times.get(t) is not None and baseline(t) is not None and times[t] < baseline(t)]
            start = next((t for t in tokens if all(u in wins for u in tokens if u >= t)), None)
            print(f"  {name}: at T = {wins or 'none'}" + (f"; from T = {start} on" if start is not None else ""))
        for layout in ("ep-ll", "tp"):
            for t in (t for t in tokens if t <= DECODE_TOKENS and (model, layout, world, t) in rows):
                ranks = rows[model, layout, world, t]
                if not ranks[0]["captured"] or (model, t) not in one_gpu:
                    continue
                over, comm = total(layout, t) - one_gpu[model, t], max(r["comm_us"] for r in ranks)
                verdict = "met" if over <= DECODE_SLACK * comm else "missed"
                touched = experts.get((model, layout, world, t))
                clause = "" if touched is None else (f"; the busiest rank touches {touched[0]:.2f} experts a draw, "
                                                     f"the one-GPU layer {touched[1]:.2f}")
                print(f"  decode target, {layout} T = {t}: over {over:.1f} us, bare collectives {comm:.1f} us, "
                      f"ratio {over / comm:.2f} (at most {DECODE_SLACK}): {verdict}{clause}")


def most_by_draw(records: list, field: str) -> dict:
    """{(model, layout, world, T): [each draw's largest `field` over the row's ranks]} of the records
    that have `field`."""
    most = {}
    for r in records:
        if field in r:
            per_draw = most.setdefault((r["model"], r["layout"], r["world"], r["tokens"]), {})
            per_draw[r["draw"]] = max(per_draw.get(r["draw"], r[field]), r[field])
    return {key: list(per_draw.values()) for key, per_draw in most.items()}


def touched_by_row(records: list) -> dict:
    """{(model, layout, world, T): (busiest, one-GPU)} of the rows whose records count the experts their
    ranks touched (touched_experts): means over the draws of the most experts any rank's shard touched
    and of those the one-GPU layer touched (the same on every rank of a draw)."""
    busiest, one_gpu = most_by_draw(records, "experts"), most_by_draw(records, "one_gpu_experts")
    return {key: (statistics.mean(draws), statistics.mean(one_gpu[key])) for key, draws in busiest.items()}


def _us(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _range(values: list) -> str:
    return f"{min(values):.1f}-{max(values):.1f}"


# ---- a rank -----------------------------------------------------------------------------------------

class Clock:
    """Marks between a forward's stages: CUDA events on the current stream, or the host clock."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.marks = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals_us(self) -> list[float]:
        """Microseconds between consecutive marks (waits for the last one); clears the marks."""
        if self.cuda:
            self.marks[-1].synchronize()
            us = [a.elapsed_time(b) * 1e3 for a, b in zip(self.marks, self.marks[1:])]
        else:
            us = [(b - a) * 1e6 for a, b in zip(self.marks, self.marks[1:])]
        self.marks = []
        return us


def a2a_stages(layer: ExpertParallelLayer, x: torch.Tensor):
    """(what it counts as, function of the previous stage's result) for one all-to-all forward."""
    return [
        ("routing_us", lambda _: layer.route(x)),
        ("comm_us", lambda routing: layer.dispatch(x, *routing)),
        ("mxmoe_us", lambda dispatched: (dispatched, layer.compute(dispatched))),
        ("comm_us", lambda result: layer.combine(*result)),
    ]


def time_stages(stages, clock: Clock, repeats: int) -> dict:
    """Medians over `repeats` eager forwards (after two untimed ones) of each kind of stage and of the
    total."""
    totals, per_kind = [], {}
    for repeat in range(repeats + 2):
        dist.barrier()
        clock.mark()
        result = None
        for _, run in stages:
            result = run(result)
            clock.mark()
        us = clock.intervals_us()
        if repeat < 2:
            continue
        totals.append(sum(us))
        kinds = {}
        for (kind, _), stage_us in zip(stages, us):
            kinds[kind] = kinds.get(kind, 0.0) + stage_us
        for kind, value in kinds.items():
            per_kind.setdefault(kind, []).append(value)
    return {"total_us": statistics.median(totals), **{k: statistics.median(v) for k, v in per_kind.items()}}


def replay_us(calls, cuda: bool, repeats: int) -> float:
    """Median microseconds of calls(): one replay of its CUDA graph, replays queued back to back behind a
    device sleep; on the CPU, eager calls by the host clock, each after a barrier."""
    if not cuda:
        clock = Clock(False)
        return time_stages([("total_us", lambda _: calls())], clock, repeats)["total_us"]
    graph = capture(calls)
    dist.barrier()
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(repeats + 2)]
    torch.cuda._sleep(20_000_000)  # about 10 ms: the host queues every replay before the first starts
    events[0].record()
    for event in events[1:]:
        graph.replay()
        event.record()
    events[-1].synchronize()
    us = [a.elapsed_time(b) * 1e3 for a, b in zip(events[1:], events[2:])]  # the first replay absorbs the ranks' skew
    del graph
    return statistics.median(us)


def whole_layer(weights: mxmoe.Weights, device: torch.device, group, max_tokens: int):
    """The whole layer on this rank's device: mxmoe.torch.MoeLayer, or on the CPU a tensor-parallel layer
    of one rank (the CPU layer through the same tensors)."""
    if device.type == "cuda":
        return mxmoe.torch.MoeLayer(weights, device, max_tokens)
    return TensorParallelLayer(weights, group, device, max_tokens)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return (torch.linalg.norm(got.float() - want.float()) / torch.linalg.norm(want.float())).item()


def run_rank(args) -> None:
    os.environ.update(NVLINK_MULTICAST_OFF)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    own_group = [dist.new_group([r]) for r in range(world)][rank]  # every rank makes every group
    if world == 1:  # the whole layer, also at each world x T
        tokens_list = sorted({w * t for w in [1, *args.worlds] for t in args.tokens})
    else:
        tokens_list = args.tokens
    max_tokens = max(tokens_list)
    records = []
    for model in args.models:
        weights = mxmoe.synthetic_model_weights(model, seed=0)
        hidden = weights.shape.hidden
        whole = whole_layer(weights, device, own_group, max_tokens)
        router_weight, router_bias = (torch.from_numpy(a).to(device) for a in weights.router)
        if weights.spec.router != "softmax-top-k":  # sqrt-softplus: the bias selects, it is no logit bias
            router_bias = None

        def tokens_of(count: int, seed: int) -> torch.Tensor:
            gen = torch.Generator(device).manual_seed(seed)
            return torch.randn(count, hidden, generator=gen, device=device).bfloat16()

        if world == 1:
            for tokens in tokens_list:
                for draw in range(args.draws):
                    x = tokens_of(tokens, 1000 * draw)
                    records.append({"model": model, "layout": "one-gpu", "world": 1, "rank": rank, "tokens": tokens,
                                    "draw": draw, "captured": cuda,
                                    "total_us": replay_us(lambda: whole(x), cuda, args.repeats)})
        else:
            # One expert-parallel layer for both paths: the low-latency path by its forward (which takes it
            # at every T here), the all-to-all path by its stages.
            ep = ExpertParallelLayer(weights, device=device, max_tokens=max_tokens, low_latency_max_tokens=max_tokens)
            tp = TensorParallelLayer(weights, device=device, max_tokens=max_tokens)
            for tokens in tokens_list:
                for layout in LAYOUTS:
                    for draw in range(args.draws):
                        own = rank if layout.startswith("ep") else 0  # expert parallel: each rank's own tokens
                        x = tokens_of(tokens, own + 1000 * draw)
                        record = {"model": model, "layout": layout, "world": world, "rank": rank, "tokens": tokens,
                                  "draw": draw, **time_layout(layout, ep, tp, x, cuda, args.repeats)}
                        logits = torch.nn.functional.linear(x.float(), router_weight, router_bias)
                        record["error"] = relative_error(check_output(layout, ep, tp, x, logits), whole(x, logits))
                        records.append(record)
            ep.free()
            tp.free()
        whole.free()
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(records, gathered)
    if rank == 0:
        with open(args.rank_records, "w") as f:
            json.dump([r for rank_records in gathered for r in rank_records], f)
    dist.destroy_process_group()


def time_layout(layout: str, ep: ExpertParallelLayer, tp: TensorParallelLayer, x: torch.Tensor, cuda: bool,
                repeats: int) -> dict:
    """The timings of one layout at x's T on this rank (see the module's docstring)."""
    tokens, hidden = x.shape
    world = ep.world
    if layout == "ep-a2a":
        return {"captured": False, **time_stages(a2a_stages(ep, x), Clock(cuda), repeats)}
    if layout == "ep-ll":
        send = torch.zeros(tokens, hidden, dtype=torch.bfloat16, device=x.device)
        gathered_rows = send.new_zeros(world * tokens, hidden)

        def collectives():
            dist.all_gather_into_tensor(gathered_rows, send)
            dist.reduce_scatter_tensor(send, gathered_rows)

        gathered = ep.gather(x, tokens)
        return {"captured": cuda, **touched_experts(ep, gathered.x, tokens),
                "total_us": replay_us(lambda: ep(x, max_rank_tokens=tokens), cuda, repeats),
                "comm_us": replay_us(collectives, cuda, repeats),
                "mxmoe_us": replay_us(lambda: ep.compute_gathered(gathered), cuda, repeats)}
    reduced = torch.zeros(tokens, hidden, dtype=torch.bfloat16, device=x.device)
    return {"captured": cuda,
            "total_us": replay_us(lambda: tp(x), cuda, repeats),
            "comm_us": replay_us(lambda: dist.all_reduce(reduced), cuda, repeats),
            "mxmoe_us": replay_us(lambda: tp.compute(x), cuda, repeats)}


def touched_experts(ep: ExpertParallelLayer, gathered_x: torch.Tensor, tokens: int) -> dict:
    """How many experts the draw's routing touches (the layer's router, in torch): `experts`, this rank's
    own over the world's gathered tokens; `one_gpu_experts`, all ranks' over rank 0's T tokens (the
    gathered rows' first T), which the one-GPU layer takes."""
    ids = ep.route(gathered_x)[0]
    first = ep.rank * ep.experts_per_rank
    local = ids[(ids >= first) & (ids < first + ep.experts_per_rank)]
    return {"experts": int(local.unique().numel()), "one_gpu_experts": int(ids[:tokens].unique().numel())}


def check_output(layout: str, ep: ExpertParallelLayer, tp: TensorParallelLayer, x: torch.Tensor,
                 logits: torch.Tensor) -> torch.Tensor:
    """The layout's eager output for x routed by `logits`."""
    if layout == "ep-ll":
        return ep(x, logits, max_rank_tokens=x.shape[0])
    if layout == "ep-a2a":
        dispatched = ep.dispatch(x, *ep.route(x, logits))
        return ep.combine(dispatched, ep.compute(dispatched))
    return tp(x, logits)


if __name__ == "__main__":
    main()
