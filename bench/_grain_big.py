"""Grain's side of bench_peers_big.py, run in the peers venv (bench/README.md): writes the same
records to ArrayRecord once, then times a shuffled pass record by record with Grain's
random-access MapDataset and with its prefetching iterator. Prints JSON (records/s)."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

folder, count, size, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import grain  # noqa: E402
from array_record.python.array_record_module import ArrayRecordWriter  # noqa: E402

path = os.path.join(folder, f"grain-{count}-{size}-uncompressed.array_record")
if not os.path.exists(path):
    base = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    writer = ArrayRecordWriter(path + ".tmp", "group_size:1,uncompressed")
    for i in range(count):
        writer.write(np.roll(base, i % 997).tobytes() + np.int64(i).tobytes())
    writer.close()
    os.rename(path + ".tmp", path)
with open(path, "rb") as f:
    while f.read(16 << 20):
        pass


def parse(data: bytes) -> dict:
    return {"x": np.frombuffer(data, np.uint8, size), "y": np.frombuffer(data, np.int64, 1, size)}


source = grain.sources.ArrayRecordDataSource([path])


def rate(dataset) -> float:
    start = time.perf_counter()
    n = 0
    for record in dataset:
        n += 1
        assert record["x"].nbytes == size
        if n % 64 == 0 and time.perf_counter() - start > seconds:
            break
    return n / (time.perf_counter() - start)


shuffled = grain.MapDataset.source(source).shuffle(seed=1).map(parse)
result = {
    "map": max(rate(shuffled) for _ in range(2)),
    "iter": max(rate(shuffled.to_iter_dataset()) for _ in range(2)),
}
print(json.dumps(result))
