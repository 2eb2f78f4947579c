"""The expert- and tensor-parallel layers (mxmoe.distributed) timed per rank on 2 and 4 GPUs, beside
the one-GPU layer (a benchmark).

    python python/bench/distributed.py [--worlds 2 4] [--tokens 1 8 64 1024 4096]
                                       [--models gpt-oss-20b gpt-oss-120b] [--repeats 20] [--json FILE]

This is the launcher: for one GPU (the baseline) and then each world of --worlds that the visible GPUs
allow, it starts torchrun with one process per GPU, in an environment with NVLink multicast off
(mxmoe.distributed.NVLINK_MULTICAST_OFF), and prints one table from what the ranks measured.

Each rank takes T tokens of its own at each --tokens (expert parallel; the world's tokens number
world x T) or the same T tokens as every rank (tensor parallel), unit-normal, routed by the layer's
router, with synthetic weights seeded alike on every rank. It times each stage of a forward with CUDA
events on its stream: for expert parallelism the routing (router and top-k, in torch), the
communication (the dispatch: split-size exchange, with its host synchronisation, and one
all_to_all_single; the combine: one all_to_all_single and the float32 sum) and its mxmoe expert call;
for tensor parallelism its mxmoe layer call and the communication (one bf16 all-reduce). A rank
reports each stage's median over --repeats forwards, each begun after a barrier. The one-GPU rows are
the whole layer at T and, for comparing expert parallelism's throughput, at world x T.

Every rank checks its output at each T against the whole layer on its own device, both routed by the
same logits: the table's max_error is the largest relative error by norm, and the launcher exits
non-zero where one reaches CHECK_TOLERANCE.

--device cpu runs the same over gloo with the CPU layer, timed by the host clock: a check of the
plumbing where there is no GPU, not a measurement.
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
from mxmoe.distributed import NVLINK_MULTICAST_OFF, ExpertParallelLayer, TensorParallelLayer
from timing import SHAPES

CHECK_TOLERANCE = 5e-3  # the bf16 rounding of the ranks' partial sums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 1024, 4096])
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=20)
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
    failed = [r for r in records if r.get("error", 0.0) >= CHECK_TOLERANCE]
    if args.json:
        device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "environment": NVLINK_MULTICAST_OFF,
                       "records": records}, f, indent=1)
    if failed:
        sys.exit(f"check failed: {len(failed)} rank(s) at or above {CHECK_TOLERANCE} relative error, e.g. {failed[0]}")


def print_table(records: list) -> None:
    """One row per model, layout, world and T: the slowest rank's total, each rank's communication and
    mxmoe time (and routing time for expert parallelism), the one-GPU layer at T and world x T, and the
    largest error of a rank's output."""
    one_gpu = {(r["model"], r["tokens"]): r["mxmoe_us"] for r in records if r["layout"] == "one-gpu"}
    rows = {}
    for r in records:
        if r["layout"] != "one-gpu":
            rows.setdefault((r["model"], r["layout"], r["world"], r["tokens"]), []).append(r)
    print(f"{'model':<13} {'layout':<6} {'world':>5} {'T':>5} {'total_us':>9}  {'comm_us by rank':<28} "
          f"{'mxmoe_us by rank':<28} {'routing_us by rank':<24} {'1gpu_us@T':>9} {'1gpu_us@wT':>10} {'max_error':>9}")
    for (model, layout, world, tokens), ranks in sorted(rows.items()):
        ranks.sort(key=lambda r: r["rank"])

        def by_rank(key):
            return "/".join(f"{r[key]:.1f}" for r in ranks) if key in ranks[0] else "-"

        world_tokens = one_gpu.get((model, world * tokens)) if layout == "ep" else None
        print(f"{model:<13} {layout:<6} {world:>5} {tokens:>5} {max(r['total_us'] for r in ranks):>9.1f}  "
              f"{by_rank('comm_us'):<28} {by_rank('mxmoe_us'):<28} {by_rank('routing_us'):<24} "
              f"{one_gpu.get((model, tokens), float('nan')):>9.1f} "
              f"{'-' if world_tokens is None else f'{world_tokens:.1f}':>10} "
              f"{max(r['error'] for r in ranks):>9.2e}")


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


def ep_stages(layer: ExpertParallelLayer, x: torch.Tensor):
    """(name, what it counts as, function of the previous stage's result) for one forward."""
    return [
        ("route", "routing_us", lambda _: layer.route(x)),
        ("dispatch", "comm_us", lambda routing: layer.dispatch(x, *routing)),
        ("compute", "mxmoe_us", lambda dispatched: (dispatched, layer.compute(dispatched))),
        ("combine", "comm_us", lambda result: layer.combine(*result)),
    ]


def tp_stages(layer: TensorParallelLayer, x: torch.Tensor):
    return [
        ("compute", "mxmoe_us", lambda _: layer.compute(x)),
        ("reduce", "comm_us", lambda partial: layer.reduce(partial)),
    ]


def time_stages(stages, clock: Clock, repeats: int) -> dict:
    """Medians over `repeats` forwards (after two untimed ones) of each kind of stage and of the total."""
    totals, per_kind = [], {}
    for repeat in range(repeats + 2):
        dist.barrier()
        clock.mark()
        result = None
        for _, _, run in stages:
            result = run(result)
            clock.mark()
        us = clock.intervals_us()
        if repeat < 2:
            continue
        totals.append(sum(us))
        kinds = {}
        for (_, kind, _), stage_us in zip(stages, us):
            kinds[kind] = kinds.get(kind, 0.0) + stage_us
        for kind, value in kinds.items():
            per_kind.setdefault(kind, []).append(value)
    return {"total_us": statistics.median(totals), **{k: statistics.median(v) for k, v in per_kind.items()}}


def run_rank(args) -> None:
    os.environ.update(NVLINK_MULTICAST_OFF)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    clock = Clock(cuda)
    if world == 1:  # the whole layer (a tensor-parallel layer of one rank), also at each world x T
        layouts = [("one-gpu", TensorParallelLayer, tp_stages)]
        tokens_list = sorted({w * t for w in [1, *args.worlds] for t in args.tokens})
    else:  # checked against the whole layer in a group of its rank alone (every rank makes every group)
        layouts = [("ep", ExpertParallelLayer, ep_stages), ("tp", TensorParallelLayer, tp_stages)]
        tokens_list = args.tokens
        own_group = [dist.new_group([r]) for r in range(world)][rank]
    records = []
    for model in args.models:
        weights = mxmoe.synthetic_weights(*SHAPES[model], seed=0)
        whole = None
        if world > 1:
            whole = TensorParallelLayer(weights, own_group, device, max(tokens_list))
            router_weight, router_bias = (torch.from_numpy(a).to(device) for a in weights.router)
        for layout, cls, stages_of in layouts:
            layer = cls(weights, device=device, max_tokens=max(tokens_list))
            for tokens in tokens_list:
                seed = rank if layout == "ep" else 0  # expert parallel: each rank's own tokens
                gen = torch.Generator(device).manual_seed(seed)
                x = torch.randn(tokens, SHAPES[model][2], generator=gen, device=device).bfloat16()
                record = {"model": model, "layout": layout, "world": world, "rank": rank, "tokens": tokens,
                          **time_stages(stages_of(layer, x), clock, args.repeats)}
                if whole is not None:
                    logits = torch.nn.functional.linear(x.float(), router_weight, router_bias)
                    got, want = layer(x, logits).float(), whole(x, logits).float()
                    record["error"] = (torch.linalg.norm(got - want) / torch.linalg.norm(want)).item()
                records.append(record)
            layer.free()
        if whole is not None:
            whole.free()
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(records, gathered)
    if rank == 0:
        with open(args.rank_records, "w") as f:
            json.dump([r for rank_records in gathered for r in rank_records], f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
