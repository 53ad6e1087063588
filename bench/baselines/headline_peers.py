"""The peers' side of bench.headline: Grain, Lance and litdata read the headline's data, run
in the peers venv from the repository root. Does not import yogadl_plus.

    .baselines/peers/bin/python -m bench.baselines.headline_peers ROW DATA WORK REPEATS

ROW is one of:

- ``grain-small``: WORK/peer.array_record (264-byte records, ``x`` float32[64] then ``y``
  int64, written by ``peer_writers``, as bench_build_columns writes it): Grain's shuffle of the
  record numbers (``grain.MapDataset.range(n).shuffle(seed=0).batch(256)``), each batch read
  with ``ArrayRecordDataSource.__getitems__`` (its batched read: Grain's
  ``MapDataset.source(...).batch(...)`` reads record by record, about 40x slower here) and
  split into ``x`` (256, 64) and ``y`` (256,);
- ``lance-small``: WORK/peer.lance (the same arrays, written by ``lance.write_dataset``), read
  with ``dataset.take`` of 256 shuffled row numbers at a time into the same two arrays;
- ``litdata-small``: writes DATA/x.npy and DATA/y.npy with ``litdata.optimize`` into
  WORK/litdata (timed once: the build), then reads one epoch of ``StreamingDataset(shuffle=True,
  seed=0)`` through ``StreamingDataLoader(batch_size=256)``, 0 workers and 2 workers;
- ``grain-tokens``, ``lance-tokens``: variable-length int32 token arrays (DATA/tokens.npy, all
  rows end to end, and DATA/offsets.npy), written once untimed (ArrayRecord: one record per
  row's bytes; Lance: a ``list<int32>`` column), then read shuffled in batches of 256 rows as
  above, each batch a list of 256 int32 arrays.

Every read figure is the best of REPEATS epochs, each checked to hold every record once (the
sum of ``y``, or of every token). The last line of stdout is one JSON object of records/s.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

BATCH = 256


def best_epoch(
    epoch: Callable[[], Iterable[Any]],
    count: Callable[[Any], tuple[int, int]],
    expected: tuple[int, int],
    repeats: int,
) -> float:
    """Records/s of the fastest of ``repeats`` epochs; each epoch's (records, checksum) is
    compared with ``expected``."""
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        records = checksum = 0
        for batch in epoch():
            n, s = count(batch)
            records += n
            checksum += s
        best = min(best, time.perf_counter() - began)
        if (records, checksum) != expected:
            raise RuntimeError(f"an epoch gave {(records, checksum)}, expected {expected}")
    return expected[0] / best


def small(row: str, data: str, work: str, repeats: int) -> dict[str, float]:
    y = np.load(os.path.join(data, "y.npy"))
    expected = (len(y), int(y.sum()))

    def count(batch: dict[str, Any]) -> tuple[int, int]:
        return len(batch["y"]), int(batch["y"].sum())

    if row == "grain-small":
        import grain

        source = grain.sources.ArrayRecordDataSource([os.path.join(work, "peer.array_record")])
        batches = grain.MapDataset.range(len(y)).shuffle(seed=0).batch(BATCH)

        def epoch() -> Iterable[dict[str, np.ndarray]]:
            for indices in batches:
                rows = np.frombuffer(b"".join(source.__getitems__(indices.tolist())), np.uint8)
                rows = rows.reshape(len(indices), 264)
                yield {
                    "x": rows[:, :256].copy().view(np.float32),
                    "y": rows[:, 256:].copy().view(np.int64)[:, 0],
                }

        return {"read": best_epoch(epoch, count, expected, repeats)}
    if row == "lance-small":
        import lance

        ds = lance.dataset(os.path.join(work, "peer.lance"))
        order = np.random.default_rng(0).permutation(len(y))

        def epoch() -> Iterable[dict[str, np.ndarray]]:
            for start in range(0, len(order), BATCH):
                table = ds.take(order[start : start + BATCH], columns=["x", "y"])
                x = table.column("x").combine_chunks().values.to_numpy().reshape(-1, 64)
                yield {"x": x, "y": table.column("y").to_numpy()}

        return {"read": best_epoch(epoch, count, expected, repeats)}
    return litdata_small(data, work, repeats, expected)


class _Record:
    """litdata.optimize's ``fn``: index ``i`` -> record ``i`` (picklable for its workers)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __call__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i], "y": int(self.y[i])}


def litdata_small(
    data: str, work: str, repeats: int, expected: tuple[int, int]
) -> dict[str, float]:
    import litdata

    x, y = np.load(os.path.join(data, "x.npy")), np.load(os.path.join(data, "y.npy"))
    out = os.path.join(work, "litdata")
    began = time.perf_counter()
    litdata.optimize(
        fn=_Record(x, y),
        inputs=list(range(len(y))),
        output_dir=out,
        chunk_bytes="8MB",
        num_workers=2,
        verbose=False,
    )
    built = time.perf_counter() - began

    def count(batch: dict[str, Any]) -> tuple[int, int]:
        return len(batch["y"]), int(batch["y"].sum())

    figures = {"build": len(y) / built}
    for workers in (0, 2):

        def epoch(workers: int = workers) -> Iterable[Any]:
            dataset = litdata.StreamingDataset(out, shuffle=True, seed=0)
            return litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers)

        figures[f"read_w{workers}"] = best_epoch(epoch, count, expected, repeats)
    return figures


def tokens(row: str, data: str, work: str, repeats: int) -> dict[str, float]:
    flat = np.load(os.path.join(data, "tokens.npy"))
    offsets = np.load(os.path.join(data, "offsets.npy"))
    n = len(offsets) - 1
    expected = (n, int(flat.sum(dtype=np.int64)))
    order = np.random.default_rng(0).permutation(n)

    def count(batch: list[np.ndarray]) -> tuple[int, int]:
        return len(batch), sum(int(t.sum(dtype=np.int64)) for t in batch)

    if row == "grain-tokens":
        import grain
        from array_record.python.array_record_module import ArrayRecordWriter

        path = os.path.join(work, "tokens.array_record")
        writer = ArrayRecordWriter(path, "group_size:1,uncompressed")
        for i in range(n):
            writer.write(flat[offsets[i] : offsets[i + 1]].tobytes())
        writer.close()
        source = grain.sources.ArrayRecordDataSource([path])
        batches = grain.MapDataset.range(n).shuffle(seed=0).batch(BATCH)

        def read() -> Iterable[list[np.ndarray]]:
            for indices in batches:
                yield [np.frombuffer(b, np.int32) for b in source.__getitems__(indices.tolist())]

        return {"read": best_epoch(read, count, expected, repeats)}
    import lance
    import pyarrow as pa

    column = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat))
    ds = lance.write_dataset(pa.table({"tokens": column}), os.path.join(work, "tokens.lance"))

    def epoch() -> Iterable[list[np.ndarray]]:
        for start in range(0, n, BATCH):
            got = ds.take(order[start : start + BATCH], columns=["tokens"]).column("tokens")
            got = got.combine_chunks()
            ends = got.offsets.to_numpy()
            values = got.values.to_numpy()
            yield [values[ends[k] : ends[k + 1]] for k in range(len(ends) - 1)]

    return {"read": best_epoch(epoch, count, expected, repeats)}


def main() -> None:
    row, data, work, repeats = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    run = tokens if row.endswith("-tokens") else small
    print(json.dumps(run(row, data, work, repeats)))


if __name__ == "__main__":
    main()
