"""Cache a Parquet dataset and read it as disjoint, reshuffled shards (one per training process).

Run: python examples/parquet_shards.py [STORAGE_DIR]
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import yogadl_plus as ydl


def write_parquet(folder: str) -> str:
    """Stand-in for your warehouse: two Parquet files of feature vectors and labels."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(1)
    for part in range(2):
        n = 5_000
        features = rng.standard_normal((n, 32)).astype(np.float32)
        table = pa.table(
            {
                "id": np.arange(part * n, (part + 1) * n),
                "features": pa.FixedSizeListArray.from_arrays(pa.array(features.ravel()), 32),
                "label": rng.integers(0, 2, n).astype(np.int8),
            }
        )
        pq.write_table(table, os.path.join(folder, f"part-{part}.parquet"))
    return folder


def main(root: str) -> None:
    parquet = write_parquet(os.path.join(root, "parquet"))
    storage = ydl.LocalStorage(os.path.join(root, "caches"))
    source = ydl.sources.ParquetSource(parquet, columns=["id", "features", "label"])
    ref = ydl.cache_dataset(source, "features", "2026-11", storage, progress=False)
    print(ref)

    world = 4
    for epoch in range(2):
        seen = []
        for rank in range(world):
            shard = ref.stream(
                shuffle=True,
                shuffle_seed=7,
                num_shards=world,
                shard_rank=rank,
                drop_shard_remainder=True,
                batch_size=256,
                start_offset=epoch * (len(ref) // world),
            )
            seen.extend(int(i) for batch in shard for i in batch["id"])
        assert len(seen) == len(set(seen)) == len(ref)
        print(f"epoch {epoch}: {world} shards, disjoint, together every record once")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:  # a temporary folder, removed at the end
        with tempfile.TemporaryDirectory(prefix="yogadl_plus_") as folder:
            main(folder)
