"""One rank of a 3-process DDP job (gloo, CPU) for test_ddp.py: a DistributedDataParallel model
trained on ``make_dataloader`` (or a DataLoader with a ``StreamSampler``) over one shard each.

    python tests/jobs/ddp_job.py ROOT RANK WORLD PORT FACE MODE

FACE is "loader" or "sampler"; MODE is "default", "drop", "pad" or "allow" (uneven shards
allowed: the job that hangs). Prints "refused: <message>" when the face refuses at
construction, else "trained <steps> <ids...>" once every step ran.
"""

from __future__ import annotations

import datetime
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import yogadl_plus as ydl

RECORDS, BATCH, SEED = 50, 4, 3
# Starting and the final barrier: long enough for the ranks' start on a loaded machine.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=20)
# The training steps' all-reduce in mode "allow", which waits for a step one rank never takes:
# short, so that the test sees the hang in seconds; still many times a step's time.
HANGING_STEP_TIMEOUT = datetime.timedelta(seconds=5)


def dataref(root: str) -> ydl.DataRef:
    storage = ydl.LocalStorage(root)
    try:
        return storage.fetch("ddp", "v1")
    except ydl.DatasetNotFound:
        records = ({"id": np.int64(i), "x": np.full(2, i, np.float32)} for i in range(RECORDS))
        return ydl.cache_dataset(records, "ddp", "v1", storage, progress=False)


def batches(ref: ydl.DataRef, rank: int, world: int, face: str, mode: str) -> object:
    order = {
        "shuffle": True,
        "shuffle_seed": SEED,
        "shard_rank": rank,
        "num_shards": world,
        "drop_shard_remainder": mode == "drop",
        "pad_shard_remainder": mode == "pad",
    }
    allow = mode == "allow"
    if face == "loader":
        stream = ref.stream(batch_size=BATCH, **order)
        return ydl.torch.make_dataloader(stream, allow_uneven_shards=allow)
    sampler = ydl.torch.StreamSampler(ref, allow_uneven_shards=allow, **order)
    return DataLoader(ydl.torch.RecordDataset(ref), batch_size=BATCH, sampler=sampler)


def main(root: str, rank: int, world: int, port: int, face: str, mode: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=COLLECTIVE_TIMEOUT,
    )
    ref = dataref(root) if rank == 0 else None
    dist.barrier()  # rank 0 built the cache
    ref = ref or dataref(root)
    try:
        loader = batches(ref, rank, world, face, mode)
    except ValueError as exc:
        print(f"refused: {exc}", flush=True)
        dist.destroy_process_group()
        return
    torch.manual_seed(0)
    steps_group = dist.new_group(timeout=HANGING_STEP_TIMEOUT) if mode == "allow" else None
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Linear(2, 1), process_group=steps_group
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps, seen = 0, []
    for batch in loader:
        loss = model(batch["x"].float()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # DDP's all-reduce of the gradients: every rank must take part
        optimizer.step()
        steps += 1
        seen += batch["id"].tolist()
    dist.barrier()
    print("trained", steps, *seen, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    root, rank, world, port, face, mode = sys.argv[1:]
    main(root, int(rank), int(world), int(port), face, mode)
