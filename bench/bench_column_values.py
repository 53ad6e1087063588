"""Building a version from columns of each kind of value, in records/s: the build path that
turns Arrow and Python values into records (sources/arrow.py, sources/columnar.py).

    python -m bench.bench_column_values [--rows 100000] [--rounds 3] [--json out.json]
    python -m bench.bench_column_values --tree /path/to/other/tree     # another checkout

Each case is a table of --rows rows, made once in memory (fixed seed), cached with
``cache_dataset`` into a fresh folder --rounds times; the best round is reported. Run it with
two checkouts alternately (``--tree``) to compare them on the same machine:

- ``str``: a dict holding a Python list of str (8-40 characters);
- ``tokens``: ``list<int32>`` of 1-127 token ids a row (a text dataset's tokens);
- ``int64 nulls``: ``int64`` with a null in one row of ten (a nullable field);
- ``timestamp nulls``: ``timestamp[ns]`` with a null in one row of ten;
- ``ragged 2-d``: ``list<list<float32>>``, 0-7 rows of 4 values a row;
- ``fixed 16``: ``fixed_size_list<float32, 16>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

import yogadl_plus as ydl
from bench.harness import rerun_in_tree, smoke, time_once, write_json


def cases(rows: int) -> dict[str, Callable[[], Any]]:
    """Each case's name and what makes its source (made once: the same objects each round)."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 128, rows)
    tokens = pa.ListArray.from_arrays(
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
        pa.array(rng.integers(0, 50_000, int(lengths.sum())).astype(np.int32)),
    )
    nulls = rng.random(rows) < 0.1
    ints = pa.array(rng.integers(0, 2**40, rows), mask=nulls)
    stamps = pa.array(rng.integers(0, 2**60, rows).astype("datetime64[ns]"), mask=nulls)
    inner = rng.integers(0, 8, rows)
    grids = pa.array(
        [rng.random((n, 4), dtype=np.float32).tolist() for n in inner],
        pa.list_(pa.list_(pa.float32())),
    )
    fixed = pa.FixedSizeListArray.from_arrays(rng.random(rows * 16, dtype=np.float32), 16)
    strings = ["x" * int(n) for n in rng.integers(8, 41, rows)]
    made = {
        "str": {"s": strings},
        "tokens": pa.table({"t": tokens}),
        "int64 nulls": pa.table({"i": ints}),
        "timestamp nulls": pa.table({"ts": stamps}),
        "ragged 2-d": pa.table({"g": grids}),
        "fixed 16": pa.table({"f": fixed}),
    }
    return {name: (lambda source=source: source) for name, source in made.items()}


def best_build(source: Any, rounds: int) -> float:
    """The fastest of ``rounds`` builds of ``source``, each into a fresh folder, in seconds."""
    best = float("inf")
    for _ in range(rounds):
        folder = tempfile.mkdtemp(prefix="ydl-bench-values-")
        try:
            seconds, _ = time_once(
                lambda folder=folder: ydl.cache_dataset(
                    source, "values", "v", ydl.LocalStorage(folder), progress=False
                )
            )
            best = min(best, seconds)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=smoke(100_000, 500))
    parser.add_argument("--rounds", type=int, default=smoke(3, 1))
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--tree", help="measure this checkout's yogadl_plus (default: this one)")
    args = parser.parse_args()
    if args.tree:
        again = ["--rows", str(args.rows), "--rounds", str(args.rounds)]
        again += ["--json", os.path.abspath(args.json)] if args.json else []
        rerun_in_tree("bench_column_values", args.tree, again)
    print(f"yogadl_plus from {ydl.__file__}", flush=True)
    results = {}
    for name, make in cases(args.rows).items():
        seconds = best_build(make(), args.rounds)
        results[name] = args.rows / seconds
        print(f"  {name:16s} {results[name]:>12,.0f} records/s ({seconds:.3f} s)", flush=True)
    write_json(args.json, {"rows": args.rows, "records_per_s": results})


if __name__ == "__main__":
    main()
