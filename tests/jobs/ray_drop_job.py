"""A Ray stream whose last reference goes on Ray's own event-loop thread (a garbage collection
runs finalizers on whichever thread allocates). Exits 0 when Ray still serves afterwards and
shuts down; before the fix, stopping the workers there waited for that very loop, forever.

    python tests/jobs/ray_drop_job.py FOLDER
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import ray

import yogadl_plus as ydl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for helpers
from helpers.servers import start_local_ray


@ray.remote
def later() -> int:
    time.sleep(0.5)
    return 1


def main(folder: str) -> None:
    start_local_ray(ray)
    records = ({"x": np.float32(i)} for i in range(1000))
    ref = ydl.cache_dataset(records, "d", "v1", ydl.LocalStorage(folder), progress=False)
    holder = [ref.stream(batch_size=10, num_workers=2, worker_type="ray")]
    next(iter(holder[0]))  # the actors run
    dropped = threading.Event()
    threads: list[str] = []

    def drop(_: object) -> None:
        threads.append(threading.current_thread().name)
        holder.clear()  # the stream, and its workers, go here
        dropped.set()

    later.remote().future().add_done_callback(drop)
    if not dropped.wait(60):
        sys.exit("dropping the stream on Ray's thread never returned")
    assert threads and threads[0] != "MainThread", threads
    assert ray.get(later.remote(), timeout=60) == 1, "Ray's event loop no longer serves"
    ray.shutdown()
    print("ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
