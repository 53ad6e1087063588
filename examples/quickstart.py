"""Cache a Python generator once, read any record by index, stream it shuffled and resume.

Run: python examples/quickstart.py [STORAGE_DIR]
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np

import yogadl_plus as ydl


def records():
    """Any iterable of dicts works; this one is slow to produce in real life."""
    rng = np.random.default_rng(0)
    for i in range(10_000):
        yield {"image": rng.integers(0, 255, (8, 8), dtype=np.uint8), "label": np.int64(i % 10)}


def main(root: str) -> None:
    storage = ydl.LocalStorage(root)
    ref = ydl.cache_dataset(records, "toy-images", "v1", storage, progress=False)
    print(f"{ref}: record 1234 has label {ref[1234]['label']}")

    stream = ref.stream(shuffle=True, shuffle_seed=42, batch_size=128)
    batches = iter(stream)
    for _ in range(30):
        batch = next(batches)
    print(f"30 batches in: batch shape {batch['image'].shape}, offset {stream.offset}")

    # After a crash, a new stream at the saved offset continues with the very next batch.
    resumed = ref.stream(shuffle=True, shuffle_seed=42, batch_size=128, start_offset=stream.offset)
    assert np.array_equal(next(iter(resumed))["label"], next(batches)["label"])
    print("resumed mid-epoch at the exact next batch")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:  # a temporary folder, removed at the end
        with tempfile.TemporaryDirectory(prefix="yogadl_plus_") as folder:
            main(folder)
