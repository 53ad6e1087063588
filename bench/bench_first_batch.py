"""Time to the first batch from a cold local cache, against the version's size.

    python -m bench.bench_first_batch [--records 100000,10000000] [--chunks 100,10000]
                                      [--rounds 3] [--tmp DIR]

A SeaweedFS on 127.0.0.1 holds one version per (records, chunks) pair, of records
``{"i": int64, "x": float32[4]}`` cut into that many chunks. For each, a fresh process (a rank
starting) makes a storage on an empty local cache and times: ``fetch`` (the manifest read and
parsed, the version opened on demand), the stream made (``shuffle=True, shuffle_window=8,
batch_size=256``, sharded 1 of 8), and its first batch (the chunks it needs fetched). A row's
figures are the best over --rounds fresh processes. The total should not grow with the
version's size; the ratio column is each row's total against the smallest version's.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import yogadl_plus as ydl
from bench.harness import call_in_tree, smoke, start_seaweedfs


def first_batch(spec: dict[str, Any]) -> dict[str, float]:
    """In a fresh process (a rank starting, yogadl_plus imported): seconds to fetch the
    version, make its stream and read its first batch."""
    started = time.perf_counter()
    storage = ydl.S3Storage(
        spec["bucket"], "team", local_cache=spec["cache"], endpoint_url=spec["endpoint"],
        aws_access_key_id=spec["key"], aws_secret_access_key=spec["secret"],
        region_name="us-east-1", local_cache_limit=64 << 20,
    )  # fmt: skip
    ref = storage.fetch(spec["dataset"], "v", on_demand=True)
    fetched = time.perf_counter()
    stream = ref.stream(shuffle=True, shuffle_seed=0, shuffle_window=8, batch_size=256,
                        shard_rank=3, num_shards=8)  # fmt: skip
    made = time.perf_counter()
    first = next(iter(stream))
    done = time.perf_counter()
    assert len(first["i"]) == 256
    return {"fetch": fetched - started, "stream": made - fetched, "batch": done - made,
            "total": done - started}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", default=smoke("100000,10000000", "20000"))
    parser.add_argument("--chunks", default=smoke("100,10000", "10"))
    parser.add_argument("--rounds", type=int, default=smoke(3, 1))
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-first-", dir=args.tmp))
    rows = []
    try:
        with contextlib.ExitStack() as stack:
            server = start_seaweedfs(stack, work / "weed")
            bucket = server.make_bucket()
            builder = server.storage(bucket, "team", work / "builder")
            for n in map(int, args.records.split(",")):
                for chunks in map(int, args.chunks.split(",")):
                    dataset = f"r{n}-c{chunks}"
                    columns = {
                        "i": np.arange(n),
                        "x": np.random.default_rng(0).standard_normal((n, 4), np.float32),
                    }
                    record_bytes = 8 + 16 + 8  # (fields and framing, near enough to aim)
                    ref = ydl.cache_dataset(
                        columns, dataset, "v", builder, progress=False,
                        chunk_bytes=max(4096, n * record_bytes // chunks),
                    )  # fmt: skip
                    got = len(ref.manifest.chunks)
                    size = sum(c.bytes for c in ref.manifest.chunks)
                    ref.close()
                    shutil.rmtree(ref.directory, ignore_errors=True)
                    best: dict[str, float] = {}
                    for round_ in range(args.rounds):
                        spec = {
                            "bucket": bucket, "dataset": dataset, "endpoint": server.endpoint_url,
                            "key": server.access_key, "secret": server.secret_key,
                            "cache": str(work / f"node-{dataset}-{round_}"),
                        }  # fmt: skip
                        times = call_in_tree(None, "bench_first_batch", "first_batch", spec)
                        if times["total"] < best.get("total", float("inf")):
                            best = times
                    rows.append((n, got, size, best))
                    print(f"{dataset}: {got} chunks, {size:,} bytes: {best}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = rows[0][3]["total"]
    print(
        "| records | chunks | bytes | fetch (s) | stream made (s) | first batch (s) | total (s) "
        "| x smallest |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, chunks, size, t in rows:
        print(
            f"| {n:,} | {chunks:,} | {size:,} | {t['fetch']:.3f} | {t['stream']:.3f} | "
            f"{t['batch']:.3f} | {t['total']:.3f} | {t['total'] / base:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
