"""The bundled example dataset and the tour that `yogadl-plus demo` gives of it."""

from __future__ import annotations

import os
import time
from typing import Any, TextIO

import numpy as np

from yogadl_plus.stream.stats import time_epoch

__all__ = ["DEMO_PARQUET", "make_demo_table", "run_demo"]

DEMO_PARQUET = os.path.join(os.path.dirname(__file__), "data", "demo_sensors.parquet")
DEMO_ROWS = 5000


def make_demo_table(rows: int = DEMO_ROWS) -> Any:
    """Synthetic sensor readings (deterministic): what the bundled Parquet file holds."""
    import pyarrow as pa

    rng = np.random.default_rng(20261122)
    stations = np.array(["north", "south", "east", "west"])
    label = rng.integers(0, 4, rows).astype(np.int32)
    features = (rng.normal(size=(rows, 16)) + label[:, None]).astype(np.float32)
    start = np.datetime64("2026-01-01T00:00:00", "ms")
    timestamp = start + np.cumsum(rng.integers(100, 1000, rows)).astype("timedelta64[ms]")
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "timestamp": pa.array(timestamp),
            "station": pa.array(stations[rng.integers(0, 4, rows)]),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(features.ravel()), 16),
            "label": pa.array(label),
        }
    )


def write_demo_parquet(path: str = DEMO_PARQUET) -> None:
    import pyarrow.parquet as pq

    pq.write_table(
        make_demo_table(),
        path,
        row_group_size=1000,
        compression="zstd",
        use_dictionary=["station"],
    )


def run_demo(storage: Any = None, out: TextIO | None = None) -> int:
    """Cache the bundled dataset, then show random access, shuffled shards and resume."""
    import sys

    import yogadl_plus as ydl

    out = out or sys.stdout
    say = lambda *parts: print(*parts, file=out)  # noqa: E731
    storage = storage if storage is not None else ydl.default_storage()
    say(f"storage: {storage}")

    started = time.perf_counter()
    existed = ("demo-sensors", "v1") in storage.list()
    ref = ydl.cache_dataset(DEMO_PARQUET, "demo-sensors", "v1", storage, progress=False)
    how = "reused the cache built by an earlier run" if existed else "built the cache"
    say(
        f"{how}: {DEMO_PARQUET} as {ref.dataset_id}:{ref.version} "
        f"in {time.perf_counter() - started:.2f} s (built once, reused after)"
    )
    say(
        f"  {len(ref)} records; fields: "
        + ", ".join(f"{f.name} {f.describe()}" for f in ref.schema)
    )

    record = ref[1234]
    say(
        f"random access, ref[1234]: id={record['id']} station={record['station']!r} "
        f"label={record['label']} "
        f"features[:3]={[round(float(v), 3) for v in record['features'][:3]]}"
    )

    say("two shards, shuffled, seed 7 (each epoch reshuffles across shards):")
    for epoch in range(2):
        shards = []
        for rank in range(2):
            stream = ref.stream(
                shuffle=True,
                shuffle_seed=7,
                num_shards=2,
                shard_rank=rank,
                start_offset=epoch * (len(ref) // 2),
                fields=["id"],
            )
            shards.append([int(r["id"]) for r in stream])
        disjoint = not set(shards[0]) & set(shards[1])
        covering = sorted(shards[0] + shards[1]) == list(range(len(ref)))
        say(
            f"  epoch {epoch}: rank 0 starts {shards[0][:6]}, rank 1 starts {shards[1][:6]}; "
            f"disjoint={disjoint} covering={covering}"
        )

    stream = ref.stream(shuffle=True, shuffle_seed=7, fields=["id"])
    it = iter(stream)
    seen = [int(next(it)["id"]) for _ in range(3210)]
    offset = stream.offset
    resumed = ref.stream(shuffle=True, shuffle_seed=7, fields=["id"], start_offset=offset)
    following = [int(r["id"]) for r, _ in zip(resumed, range(5))]
    expected = [int(next(it)["id"]) for _ in range(5)]
    say(
        f"resume: after {len(seen)} records stream.offset={offset}; a new stream at that offset "
        f"continues with ids {following} (the original went on with {expected})"
    )

    # Timed as `yogadl-plus bench` times it (stream/stats.py, time_epoch): the same figures.
    stream = ref.stream(shuffle=True, shuffle_seed=7, batch_size=256)
    rates = [time_epoch(stream, epoch)["records_per_s"] for epoch in range(3)]
    say(
        f"three shuffled epochs in batches of 256, {len(ref)} records each: "
        + ", ".join(f"{rate:,.0f}" for rate in rates)
        + " records/s (the first opens the version; an epoch this small is quick to be "
        f"noisy). The same: yogadl-plus bench {ref.dataset_id} {ref.version} --shuffle --seed 7 "
        "--batch-size 256 --epochs 3"
    )

    storage.verify(ref.dataset_id, ref.version)
    say("checksums verified. Next: see README.md and docs/ for caching your own data.")
    return 0 if following == expected else 1
