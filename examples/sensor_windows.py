"""Time-series windows, a held-out split, heavy preprocessing in worker processes, and a job
that resumes on a different number of machines mid-epoch.

Run: python examples/sensor_windows.py [STORAGE_DIR]
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np

import yogadl_plus as ydl
from yogadl_plus import predicates


def readings():
    """Sensor readings sorted by time; the sensor pauses now and then (gaps in 't')."""
    rng = np.random.default_rng(0)
    t = 0.0
    for i in range(20_000):
        t += 30.0 if rng.random() < 0.01 else 1.0
        yield {
            "id": i,
            "t": t,
            "signal": rng.standard_normal(16).astype(np.float32),
            "device": f"dev-{i % 8}",
        }


def spectrum(window):
    """Stand-in for costly preprocessing: one feature vector per window."""
    stacked = np.stack([window[k]["signal"] for k in (-2, -1, 0)])
    return {
        "features": np.abs(np.fft.rfft(stacked, axis=0)).ravel().astype(np.float32),
        "anchor": int(window[0]["id"]),
    }


def main(root: str) -> None:
    storage = ydl.LocalStorage(root)
    ref = ydl.cache_dataset(readings, "sensors", "v1", storage, progress=False)

    # 1. Three consecutive readings, only where the sensor did not pause.
    ngram = ydl.NGram(
        fields={-2: ["signal"], -1: ["signal"], 0: ["signal", "id"]},
        delta_threshold=1.0,
        timestamp_field="t",
    )
    stream = ref.stream(
        ngram=ngram,
        shuffle=True,
        shuffle_seed=1,
        transform=spectrum,
        num_workers=2,
        worker_type="process",
        batch_size=64,
    )
    batch = next(iter(stream))
    stream.close()
    print(f"{len(stream)} batches of windows; features {batch['features'].shape}")

    # 2. A held-out device, decided by a predicate on one small field.
    held_out = predicates.in_set("device", ["dev-7"])
    n_held = sum(1 for _ in ref.stream(predicate=held_out, fields=["id"]))
    print(f"held-out readings: {n_held}")

    # 3. Four ranks train to step 100, the job comes back on two ranks and finishes the epoch.
    args = dict(shuffle=True, shuffle_seed=9, batch_size=32, fields=["id"])
    ranks = [ref.stream(num_shards=4, shard_rank=r, **args) for r in range(4)]
    iters = [iter(s) for s in ranks]
    seen = [int(i) for _ in range(100) for it in iters for i in next(it)["id"]]
    checkpoint = ranks[0].global_offset  # the same on every rank: they are in step
    rest = [
        int(i)
        for r in range(2)
        for b in ref.stream(num_shards=2, shard_rank=r, global_start=checkpoint, **args)
        for i in b["id"]
    ]
    assert sorted(seen + rest) == list(range(len(ref)))
    print(f"resumed at global offset {checkpoint} on 2 ranks: every reading once")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:  # a temporary folder, removed at the end
        with tempfile.TemporaryDirectory(prefix="yogadl_plus_") as folder:
            main(folder)
