"""Builds of equal-size records, whose LMDB pages are written directly (cache/pagewriter.py), with
this checkout's page writer against another tree's, in the same run:

    git worktree add /tmp/ydl-before <commit>         # once: the tree to compare with
    python -m bench.bench_page_writer --before /tmp/ydl-before [--rounds 3]

Rows, each a ``cache_dataset`` into a fresh folder, timed in a fresh process with that tree's
yogadl_plus, the trees in alternating order (best of each, and B/A by round):

- ``columns``: 1,000,000 records of ``{"x": float32[64], "y": int64}`` from numpy columns (values
  on their leaf pages);
- ``records``: 300,000 of the same records as a list of dicts (the records path, whose values
  are all one size);
- ``big values``: 2,000 records of ``float32[25000]`` (100 KB, each on pages of its own) from
  numpy columns, batches of 8,192 rows;
- ``big values, a row at a time``: the same records from a Parquet file of one row per row group
  (the file written first, untimed), which the build reads a row at a time.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import tempfile
import time

import numpy as np

from bench.harness import ROOT, SMOKE, alternate, call_in_tree, smoke, smoke_tree, write_json

MODULE = "bench_page_writer"
ROWS = {
    "columns": 1_000_000,
    "records": 300_000,
    "big values": 2_000,
    "big values, a row at a time": 2_000,
}


def build(row: str, rows: int) -> float:
    """Seconds of one ``cache_dataset`` of ``rows`` records of the kind ``row`` names."""
    import yogadl_plus as ydl

    folder = tempfile.mkdtemp(prefix="ydl-bench-pages-")
    try:
        rng = np.random.default_rng(0)
        source: object
        if row in ("columns", "records"):
            x = rng.standard_normal((rows, 64)).astype(np.float32)
            source = {"x": x, "y": np.arange(rows, dtype=np.int64)}
            if row == "records":
                source = [{"x": x[i], "y": np.int64(i)} for i in range(rows)]
        else:
            x = rng.standard_normal((rows, 25_000)).astype(np.float32)
            source = {"x": x}
            if row == "big values, a row at a time":
                import pyarrow as pa
                import pyarrow.parquet as pq

                column = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
                source = os.path.join(folder, "x.parquet")
                pq.write_table(pa.table({"x": column}), source, row_group_size=1)
        storage = ydl.LocalStorage(os.path.join(folder, "store"))
        started = time.perf_counter()
        ydl.cache_dataset(source, "ds", "v1", storage, progress=False)
        return time.perf_counter() - started
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _build_in(_: str, tree: str, row: str, rows: int) -> float:
    """``build(row, rows)`` in a fresh process with ``tree``'s yogadl_plus."""
    return float(call_in_tree(tree, MODULE, "build", row, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="the tree to compare with (A)")
    parser.add_argument("--rounds", type=int, default=smoke(3, 1))
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    before = args.before or (smoke_tree() if SMOKE else None)
    if before is None:
        parser.error("--before TREE is needed (a checkout to compare this one with)")
    trees = {"A (before)": before, "B (this checkout)": ROOT}
    results = {}
    print(f"{'row':<30} {'A s':>7} {'B s':>7} {'B/A speed':>10}  by round")
    for row, rows in ROWS.items():
        rows = smoke(rows, 200)
        times = alternate(trees, args.rounds, functools.partial(_build_in, row=row, rows=rows))
        a, b = (times[side] for side in trees)
        by_round = [x / y for x, y in zip(a, b)]
        print(
            f"{row:<30} {min(a):7.3f} {min(b):7.3f} {min(a) / min(b):9.2f}x  "
            f"{min(by_round):.2f}x-{max(by_round):.2f}x",
            flush=True,
        )
        results[row] = {"rows": rows, "a_seconds": a, "b_seconds": b}
    write_json(args.json, results)


if __name__ == "__main__":
    main()
