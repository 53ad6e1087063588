"""Train with DistributedDataParallel on a cached Parquet dataset, get killed, resume exactly.

Two ranks (processes, gloo on CPU) each stream their shard of one shuffled epoch through
``ydl.torch.make_dataloader``. After some steps they checkpoint the model and every rank's
``loader.state_dict()``; then the parent SIGKILLs them mid-epoch, as a preempting scheduler
would. Two new ranks load the checkpoint and finish the epoch. The parent checks that every
record of the epoch was trained on exactly once, and that the resumed model equals the model of
a run that was never interrupted.

Run: python examples/torch_ddp_resume.py [STORAGE_DIR]
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import yogadl_plus as ydl

try:
    import torch  # noqa: F401  (the ranks use it; checked here, before any rank starts)
except ModuleNotFoundError as missing:  # say which pip install brings it
    raise SystemExit(ydl.missing_extra(missing, "examples/torch_ddp_resume.py")) from None

WORLD = 2
ROWS = 4_000
DIM = 16
BATCH = 32
SEED = 2024  # the shuffle seed: every rank (and every restart) must use the same one
CHECKPOINT_AFTER = 25  # steps before the checkpoint; an epoch has ROWS / WORLD / BATCH steps


def write_parquet(path: str) -> None:
    """Stand-in for the warehouse: ids, 16 features and a label that depends on them."""
    rng = np.random.default_rng(0)
    features = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    labels = (features[:, :4].sum(axis=1) > 0).astype(np.int64)
    table = pa.table(
        {
            "id": np.arange(ROWS, dtype=np.int64),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(features.ravel()), DIM),
            "label": labels,
        }
    )
    pq.write_table(table, path, row_group_size=1_000)


def rank_main(rank: int, root: str, rendezvous: str, mode: str) -> None:
    """One training process. mode: "first" (checkpoint, then keep going until killed),
    "resume" (load the checkpoint, finish the epoch) or "reference" (one uninterrupted epoch)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    faulthandler.enable(all_threads=True)  # should a rank ever abort, say where every thread was
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=WORLD)
    dataref = ydl.LocalStorage(os.path.join(root, "caches")).fetch("ddp-train", "v1")

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(DIM, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    stream = dataref.stream(
        shuffle=True,
        shuffle_seed=SEED,
        num_shards=WORLD,
        shard_rank=rank,
        batch_size=BATCH,
        drop_shard_remainder=True,
    )
    loader = ydl.torch.make_dataloader(stream, num_workers=1)
    checkpoint_path = os.path.join(root, "checkpoint.pt")
    seen: list[int] = []  # ids this rank trained on, since the start of the epoch
    step = 0
    if mode == "resume":
        checkpoint = torch.load(checkpoint_path, weights_only=True)
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        loader.load_state_dict(checkpoint["loaders"][rank])
        seen, step = list(checkpoint["seen"][rank]), checkpoint["step"]

    for batch in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(batch["features"]), batch["label"])
        loss.backward()
        optimizer.step()
        seen.extend(batch["id"].tolist())
        step += 1
        if mode == "first" and step == CHECKPOINT_AFTER:
            # Every rank's loader state goes into one checkpoint, written by rank 0.
            states: list[Any] = [None] * WORLD
            dist.all_gather_object(states, {"loader": loader.state_dict(), "seen": seen})
            if rank == 0:
                checkpoint = {
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loaders": [s["loader"] for s in states],
                    "seen": [s["seen"] for s in states],
                    "step": step,
                }
                torch.save(checkpoint, checkpoint_path + ".tmp")
                os.replace(checkpoint_path + ".tmp", checkpoint_path)
                print(f"  step {step}: checkpoint written (loss {loss.item():.3f})", flush=True)
        if mode == "first" and step > CHECKPOINT_AFTER:
            time.sleep(0.05)  # a bigger model: the kill lands in the middle of the epoch
            with open(os.path.join(root, f"lost-rank{rank}.txt"), "a") as lost:
                lost.write(f"{step}\n")

    if mode == "first":
        raise SystemExit("finished the epoch: the parent should have killed this rank by now")
    everyone: list[Any] = [None] * WORLD
    dist.all_gather_object(everyone, seen)
    if rank == 0:
        weights = torch.cat([p.detach().flatten() for p in model.module.parameters()])
        with open(os.path.join(root, f"{mode}.json"), "w") as out:
            json.dump({"seen": everyone, "weights": weights.tolist(), "step": step}, out)
        print(f"  {mode}: epoch done after {step} steps (loss {loss.item():.3f})", flush=True)
    # Tear down in order while the interpreter is whole: every rank done talking, then the
    # objects that hold the process group, then the group. A gloo thread still alive when
    # Python finalizes can abort the process ("terminate called without an active exception").
    dist.barrier()
    del model, loader, optimizer
    dist.destroy_process_group()


def launch(root: str, mode: str) -> list[subprocess.Popen[bytes]]:
    """WORLD fresh processes, as torchrun would start them, meeting at a new rendezvous file.
    Each leads its own process group, so that a kill reaches its DataLoader workers too."""
    rendezvous = "file://" + os.path.join(root, f"rendezvous-{uuid.uuid4().hex}")
    return [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", str(rank), root, rendezvous, mode],
            start_new_session=True,
        )
        for rank in range(WORLD)
    ]


def wait(ranks: list[subprocess.Popen[bytes]], timeout: float = 120) -> None:
    for rank, process in enumerate(ranks):
        if process.wait(timeout) != 0:
            raise SystemExit(f"rank {rank} failed with exit code {process.returncode}")


def main(root: str) -> None:
    start = time.perf_counter()
    os.makedirs(root, exist_ok=True)
    parquet = os.path.join(root, "train.parquet")
    if not os.path.exists(parquet):
        write_parquet(parquet)
    ref = ydl.cache_dataset(
        parquet, "ddp-train", "v1", ydl.LocalStorage(os.path.join(root, "caches")), progress=False
    )
    print(f"cached {ref}")
    for name in os.listdir(root):  # what an earlier run in this folder left
        if name.startswith(("checkpoint.pt", "lost-rank", "rendezvous-")):
            os.remove(os.path.join(root, name))

    print(f"run 1: {WORLD} ranks train until step {CHECKPOINT_AFTER}, checkpoint, go on...")
    began = time.perf_counter()
    ranks = launch(root, "first")
    try:
        while not os.path.exists(os.path.join(root, "checkpoint.pt")):
            if any(p.poll() is not None for p in ranks):
                wait(ranks)
                raise SystemExit("a rank stopped before the checkpoint")
            time.sleep(0.01)
        time.sleep(0.3)  # they train on past the checkpoint: that work is lost with them
        assert all(p.poll() is None for p in ranks), "a rank ended before it was killed"
    finally:
        for process in ranks:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    assert all(p.wait() == -signal.SIGKILL for p in ranks)
    lost = 0
    for r in range(WORLD):
        log = os.path.join(root, f"lost-rank{r}.txt")
        if os.path.exists(log):
            with open(log) as f:
                lost += len(f.read().split())
    print(
        f"  SIGKILLed both ranks mid-epoch after {time.perf_counter() - began:.1f} s; "
        f"the {lost} batches they trained after the checkpoint are lost"
    )

    print("run 2: two new ranks load the checkpoint and finish the epoch")
    began = time.perf_counter()
    wait(launch(root, "resume"))
    print(f"  run 2 took {time.perf_counter() - began:.1f} s")
    print("run 3 (for comparison): one uninterrupted epoch")
    began = time.perf_counter()
    wait(launch(root, "reference"))
    print(f"  run 3 took {time.perf_counter() - began:.1f} s")

    with open(os.path.join(root, "resume.json")) as f:
        resumed = json.load(f)
    with open(os.path.join(root, "reference.json")) as f:
        reference = json.load(f)
    ids = [i for rank_ids in resumed["seen"] for i in rank_ids]
    counts = np.bincount(ids, minlength=ROWS)
    assert len(ids) == ROWS and (counts == 1).all(), "some record was repeated or skipped"
    assert not set(resumed["seen"][0]) & set(resumed["seen"][1]), "the ranks' shards overlap"
    assert resumed["seen"] == reference["seen"], "the resumed order differs from the uninterrupted"
    gap = float(np.abs(np.subtract(resumed["weights"], reference["weights"])).max())
    assert gap < 1e-6, f"the resumed model differs from the uninterrupted one by {gap}"
    print(
        f"across both runs every one of the {ROWS} records was trained on exactly once, in the "
        f"uninterrupted order; the resumed model equals the uninterrupted one (max diff {gap:.1e})"
    )
    print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        rank_main(int(sys.argv[2]), *sys.argv[3:6])
        sys.exit()
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:  # a temporary folder, removed at the end
        with tempfile.TemporaryDirectory(prefix="yogadl_plus_") as folder:
            main(folder)
