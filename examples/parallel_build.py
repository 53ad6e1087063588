"""Build one cache with a pool of processes, and (if Ray is installed) with Ray tasks; both
equal the serial build record for record.

The bundled dataset is small (5,000 records, a fraction of a second to build serially), so here
the pool and Ray are slower: they start their processes first (a second or two), which pays
only for builds that take longer than that. On 2M records of Parquet, bench/bench_build.py
measured the pool of 2 at 1.29x a serial build of 3.7 s (docs/performance.md).

Run: python examples/parallel_build.py [STORAGE_DIR]
"""

from __future__ import annotations

import sys
import tempfile
import time

import numpy as np

import yogadl_plus as ydl
from yogadl_plus.demo import DEMO_PARQUET


def timed_build(storage: ydl.Storage, version: str, **options: object) -> ydl.DataRef:
    started = time.perf_counter()
    ref = ydl.cache_dataset(DEMO_PARQUET, "sensors", version, storage, **options)
    took = time.perf_counter() - started
    print(f"{version:>8}: {len(ref)} records in {len(ref.manifest.chunks)} chunk(s), {took:.2f} s")
    return ref


def main(folder: str) -> None:
    storage = ydl.LocalStorage(folder)
    serial = timed_build(storage, "serial")
    builds = [timed_build(storage, "pool", workers=2)]  # one task per Parquet row group
    try:
        import ray
    except ImportError:
        print("Ray is not installed (pip install 'yogadl_plus[ray]'): skipping engine='ray'")
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        builds.append(timed_build(storage, "ray", engine="ray"))
        ray.shutdown()

    every = list(range(len(serial)))
    expected = serial.get_batch(every)
    for ref in builds:
        got = ref.get_batch(every)
        assert all(np.array_equal(expected[name], got[name]) for name in expected), ref.version
    print("every build holds the same records, in the same order")
    print("(a pool starts its processes first: on data this small, serial is faster)")


if __name__ == "__main__":  # the pool's workers are spawned: they import this file
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:  # a temporary folder, removed at the end
        with tempfile.TemporaryDirectory(prefix="yogadl_plus_") as folder:
            main(folder)
