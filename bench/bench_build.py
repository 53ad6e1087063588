"""Parallel builds: cache_dataset of a Parquet dataset serially, on a process pool
(workers=k) and on Ray tasks (engine="ray", a local cluster of k CPUs), against reading the same
Parquet data into numpy with pyarrow (the floor any build pays). Prints a markdown table.

    python -m bench.bench_build                   # 2M rows (~590 MB of Parquet), 2 workers
    python -m bench.bench_build --rows 100000 --workers 2 --json /tmp/build.json
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
import pyarrow.dataset as pads
import pyarrow.parquet as pq

import yogadl_plus as ydl
from bench.harness import smoke, timed, warm, write_json


def write_data(folder: str, rows: int, files: int, group: int) -> None:
    """``rows`` records {id, x: float32[64], label, name} in ``files`` Parquet files."""
    rng = np.random.default_rng(0)
    per_file = rows // files
    for f in range(files):
        ids = np.arange(f * per_file, (f + 1) * per_file)
        x = rng.standard_normal((per_file, 64)).astype(np.float32)
        table = pa.table(
            {
                "id": ids,
                "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 64),
                "label": (ids % 10).astype(np.int32),
                "name": pa.array([f"item-{i}" for i in ids]),
            }
        )
        pq.write_table(table, os.path.join(folder, f"part-{f:03d}.parquet"), row_group_size=group)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=smoke(2_000_000, 20_000))
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--row-group", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=smoke(3, 1))
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--json", help="also write every timing here")
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="yogadl_plus_bench_build_")
    try:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        write_data(data, args.rows, args.files, args.row_group)
        warm(data)
        megabytes = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data)) / 1e6
        storage = ydl.LocalStorage(os.path.join(tmp, "store"))
        counter = iter(range(10**6))

        def build(**options: Any) -> Callable[[], Any]:
            def run() -> None:
                version = f"v{next(counter)}"
                ydl.cache_dataset(data, "bench", version, storage, progress=False, **options)
                storage.delete("bench", version)

            return run

        def read_floor() -> None:
            table = pads.dataset(data, format="parquet").to_table()
            table.column("x").combine_chunks().flatten().to_numpy()
            table.column("name").to_pylist()

        rows: dict[str, list[float]] = {
            "pyarrow: read every column to numpy/Python (floor)": timed(read_floor, args.repeats),
            "cache_dataset, serial (baseline)": timed(build(), args.repeats),
            f"cache_dataset(workers={args.workers}), process pool": timed(
                build(workers=args.workers), args.repeats
            ),
        }
        if not args.no_ray:
            import ray

            ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
            build(engine="ray")()  # Ray starts its worker processes on the first tasks
            rows[f'cache_dataset(engine="ray"), {args.workers} CPUs'] = timed(
                build(engine="ray"), args.repeats
            )
            ray.shutdown()

        serial = min(rows["cache_dataset, serial (baseline)"])
        print(
            f"\n{args.rows:,} rows ({megabytes:.0f} MB of Parquet, {args.files} files, row groups "
            f"of {args.row_group:,}), {os.cpu_count()} CPUs, best of {args.repeats}\n"
        )
        print("| build | seconds | records/s | speed vs serial |")
        print("|---|---:|---:|---:|")
        for name, times in rows.items():
            best = min(times)
            print(f"| {name} | {best:.2f} | {args.rows / best:,.0f} | {serial / best:.2f}x |")
        write_json(args.json, {"args": vars(args), "times": rows})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
