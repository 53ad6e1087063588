"""Grain's side of bench_peers_big, run in the peers venv from the repository root: writes the
same records to ArrayRecord once, then times a shuffled pass record by record with Grain's
random-access MapDataset and with its prefetching iterator. Prints JSON (records/s).

    .baselines/peers/bin/python -m bench.baselines.grain_big FOLDER RECORDS SIZE SECONDS
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

from bench.harness import count_for, warm

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(folder: str, count: int, size: int, seconds: float) -> dict[str, float]:
    import grain
    from array_record.python.array_record_module import ArrayRecordWriter

    path = os.path.join(folder, f"grain-{count}-{size}-uncompressed.array_record")
    if not os.path.exists(path):
        base = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
        writer = ArrayRecordWriter(path + ".tmp", "group_size:1,uncompressed")
        for i in range(count):
            writer.write(np.roll(base, i % 997).tobytes() + np.int64(i).tobytes())
        writer.close()
        os.rename(path + ".tmp", path)
    warm(path)

    def parse(data: bytes) -> dict[str, Any]:
        return {
            "x": np.frombuffer(data, np.uint8, size),
            "y": np.frombuffer(data, np.int64, 1, size),
        }

    def one(record: dict[str, Any]) -> int:
        assert record["x"].nbytes == size
        return 1

    def rate(dataset: Any) -> float:
        n, took = count_for(dataset, seconds, one)
        return n / took

    source = grain.sources.ArrayRecordDataSource([path])
    shuffled = grain.MapDataset.source(source).shuffle(seed=1).map(parse)
    return {
        "map": max(rate(shuffled) for _ in range(2)),
        "iter": max(rate(shuffled.to_iter_dataset()) for _ in range(2)),
    }


if __name__ == "__main__":
    folder, count, size, seconds = sys.argv[1:5]
    print(json.dumps(main(folder, int(count), int(size), float(seconds))))
