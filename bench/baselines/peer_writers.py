"""Lance, Parquet and ArrayRecord writing the arrays of bench_build_columns, run in the peers
venv from the repository root; prints {"seconds": ...}, timed in this process from arrays in
memory. Parquet (``pyarrow.parquet.write_table``, ``compression="none"``) is timed with the
fsync of its file; Lance and ArrayRecord as they write by default (neither syncs).

    .baselines/peers/bin/python -m bench.baselines.peer_writers lance|parquet|array_record DATA OUT
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from bench.harness import time_once


def write(kind: str, data: str, out: str) -> float:
    """Seconds ``kind`` took to write x.npy and y.npy of ``data`` to ``out``."""
    x = np.load(data + "/x.npy")
    y = np.load(data + "/y.npy")
    if kind in ("lance", "parquet"):
        import pyarrow as pa

        table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 64), "y": y})
        if kind == "parquet":
            return time_once(lambda: parquet(table, out))[0]
        import lance

        return time_once(lambda: lance.write_dataset(table, out))[0]
    from array_record.python.array_record_module import ArrayRecordWriter

    rows = np.concatenate([x.view(np.uint8), y.view(np.uint8).reshape(-1, 8)], axis=1)
    blob, width = rows.tobytes(), rows.shape[1]

    def write_all() -> None:
        writer = ArrayRecordWriter(out, "group_size:1,uncompressed")
        for i in range(len(y)):
            writer.write(blob[i * width : (i + 1) * width])
        writer.close()

    return time_once(write_all)[0]


def parquet(table: object, out: str) -> None:
    """``table`` written as one Parquet file without compression, and synced."""
    import pyarrow.parquet as pq

    pq.write_table(table, out, compression="none")
    fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


if __name__ == "__main__":
    print(json.dumps({"seconds": write(*sys.argv[1:4])}))
