"""Warm shuffled batches against numpy gathering the same rows from arrays in RAM, same run.

    python -m bench.bench_warm [--records 100000 1000000] [--rounds 5] [--data DIR] [--json F]

Data: ``{"x": float32[64], "y": int64}`` (264 bytes a record) cached from numpy columns, one
version per ``--records`` (built once into ``--data``, a temporary folder by default), its files
in the page cache. Every row reads one whole shuffled epoch; its figure is the best of
``--rounds`` rounds, the rows of a round run in one order in odd rounds and the reverse in even
ones, after one untimed epoch of each. The ratio's range over the rounds is printed beside the
best.

Rows (the baseline, ``numpy gather``, in the same run): per batch of 256, ``x[idx]`` and
``y[idx]`` from the arrays in RAM, ``idx`` the stream's own order of an epoch (computed ahead,
outside the timing):

- ``stream(shuffle=True, batch_size=256)``;
- the ceiling: the order computed as a stream does (``plan().indices``, 8192 positions a
  call) with the numpy gather, nothing else;
- the faces: ``make_dataloader(stream, num_workers=0)`` (torch), and ``make_tf_dataset(stream)``
  iterated eagerly, also against tf.data's own batches of the epoch's rows from memory
  (``from_tensor_slices(...).batch(256)``, its ceiling);
- record by record: ``stream(shuffle=True)`` against gathering each batch of rows with numpy
  and handing them out as dicts (``{"x": xb[j], "y": yb[j]}``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import yogadl_plus as ydl
from bench.harness import smoke, time_once, warm, write_json

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BATCH = 256
PLACED = 8192  # positions a stream places in one call (StreamSource.place_block)


def version(folder: str, records: int) -> tuple[ydl.DataRef, np.ndarray, np.ndarray]:
    """The version of ``records`` records (built into ``folder`` unless it is there), and its
    columns in RAM."""
    storage = ydl.LocalStorage(folder)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(records, 64)).astype(np.float32)
    y = np.arange(records, dtype=np.int64)
    name = f"warm-{records}"
    try:
        ref = storage.fetch(name, "v1")
    except ydl.YogaError:
        ref = ydl.cache_dataset({"x": x, "y": y}, name, "v1", storage, progress=False)
    warm(ref.directory)
    return ref, x, y


def rows(ref: ydl.DataRef, x: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], int]]:
    """Each row: a function reading one epoch, returning the records it read."""
    stream = ref.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH)
    plan = stream.plan()
    n = len(ref)

    def order(epoch: int) -> Iterator[np.ndarray]:
        for start in range(0, n, PLACED):
            indices = plan.indices(epoch, start, min(start + PLACED, n))
            for first in range(0, len(indices), BATCH):
                yield indices[first : first + BATCH]

    # (The baselines' order: the stream's own for an epoch, computed ahead, outside the time.)
    perm = plan.indices(0, 0, n)

    def numpy_gather() -> int:
        for idx in batches_of(perm):
            x[idx], y[idx]
        return n

    def order_and_numpy() -> int:
        for idx in order(stream.next_epoch_position[0]):
            x[idx], y[idx]
        return n

    def batches() -> int:
        return sum(len(b["y"]) for b in stream)

    records = ref.stream(shuffle=True, shuffle_seed=0)

    def record_by_record() -> int:
        return sum(1 for _ in records)

    def numpy_dicts() -> int:
        count = 0
        for idx in batches_of(perm):
            xb, yb = x[idx], y[idx]
            for j in range(len(idx)):
                {"x": xb[j], "y": yb[j]}
                count += 1
        return count

    out: dict[str, Callable[[], int]] = {
        "numpy gather": numpy_gather,
        "stream(shuffle=True, batch_size=256)": batches,
        "ceiling: the order + numpy gather": order_and_numpy,
        "numpy gather, rows as dicts": numpy_dicts,
        "stream(shuffle=True), record by record": record_by_record,
    }
    out.update(faces(ref, x, y))
    return out


def faces(ref: ydl.DataRef, x: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], int]]:
    """The torch and tf.data faces over the same stream, and tf.data's own batches of the
    epoch's rows in memory (absent where not installed)."""
    out: dict[str, Callable[[], int]] = {}
    try:
        loader = ydl.torch.make_dataloader(
            ref.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH), num_workers=0
        )
        out["make_dataloader(num_workers=0)"] = lambda: sum(len(b["y"]) for b in loader)
    except ImportError:
        pass
    try:
        dataset = ydl.tensorflow.make_tf_dataset(
            ref.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH)
        )
        out["make_tf_dataset, eager"] = lambda: sum(len(b["y"]) for b in dataset)
        import tensorflow as tf

        perm = np.random.default_rng(0).permutation(len(x))
        rows = tf.data.Dataset.from_tensor_slices({"x": x[perm], "y": y[perm]}).batch(BATCH)
        out["tf.data in memory: the epoch's rows, .batch(256), eager"] = lambda: sum(
            len(b["y"]) for b in rows
        )
    except ImportError:
        pass
    return out


def batches_of(indices: np.ndarray) -> Iterator[np.ndarray]:
    for first in range(0, len(indices), BATCH):
        yield indices[first : first + BATCH]


BASELINES = {
    "stream(shuffle=True), record by record": "numpy gather, rows as dicts",
    "make_tf_dataset, eager": "tf.data in memory: the epoch's rows, .batch(256), eager",
}


def measure(runs: dict[str, Callable[[], int]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each row per round (alternating order), after one untimed epoch of each."""
    for run in runs.values():
        run()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            seconds[name].append(time_once(runs[name])[0])
    return seconds


def table(records: int, seconds: dict[str, list[float]]) -> list[dict[str, Any]]:
    print(f"\n{records:,} records of 264 bytes, batches of {BATCH}\n")
    print("| row | records/s (best) | us a batch | / its baseline (best) | per round |")
    # (Baseline: numpy gather; record by record: the rows as dicts; make_tf_dataset: tf.data.)
    print("| --- | ---: | ---: | ---: | ---: |")
    out = []
    for name, times in seconds.items():
        base = BASELINES.get(name, "numpy gather")
        best, base_best = min(times), min(seconds[base])
        per_round = [b / t for b, t in zip(seconds[base], times)]
        ratio = base_best / best
        cell = "1.00x" if name == base else f"{ratio:.2f}x"
        spread = f"{min(per_round):.2f}-{max(per_round):.2f}"
        print(
            f"| {name} | {records / best:,.0f} | {best / records * BATCH * 1e6:.1f} | {cell} "
            f"| {spread} |"
        )
        out.append({"row": name, "records": records, "best_s": best, "ratio": ratio})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=smoke([100_000, 10**6], [5000]))
    parser.add_argument("--rounds", type=int, default=smoke(5, 1))
    parser.add_argument("--data", default=None, help="keep the versions here (built once)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    folder = args.data or tempfile.mkdtemp(prefix="ydl-bench-warm-")
    results = []
    try:
        for records in args.records:
            ref, x, y = version(folder, records)
            results += table(records, measure(rows(ref, x, y), args.rounds))
            ref.close()
    finally:
        if args.data is None:
            shutil.rmtree(folder, ignore_errors=True)
    write_json(args.json, {"rows": results})


if __name__ == "__main__":
    main()
