"""The tests' way of running a function on every rank of a torch.distributed group: one fresh (spawned)
process per rank, a file store in a temporary folder for the rendezvous (no network port), NVLink
multicast off (mxmoe.distributed.NVLINK_MULTICAST_OFF) and a timeout, so that a rank stuck in a
collective fails the test instead of hanging it. A rank's exception fails the call, with its traceback."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import mxmoe.distributed

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)


def run_ranks(fn, world: int, backend: str, folder: Path, *args) -> None:
    """fn(rank, world, *args) on `world` ranks of a `backend` group ("gloo" or "nccl": rank r on GPU r);
    `folder` holds the group's store."""
    store = Path(folder) / "store"
    mp.start_processes(_rank_main, args=(fn, world, backend, str(store), args), nprocs=world, start_method="spawn")


def _rank_main(rank: int, fn, world: int, backend: str, store: str, args) -> None:
    os.environ.update(mxmoe.distributed.NVLINK_MULTICAST_OFF)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=COLLECTIVE_TIMEOUT)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
