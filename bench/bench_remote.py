"""Pulling a version from S3 (a local SeaweedFS) against plain parallel boto3 downloads.

Builds one version of about ``--gb`` GB in chunks of ``--chunk-mb`` MB on a SeaweedFS started
for the run (as the tests do: 127.0.0.1, its own ports, stopped by PID), then alternates, best
of ``--repeats``:

- ``boto3_download_file``: the chunk objects downloaded like ``aws s3 cp --recursive``: one
  ``download_file`` per object (ranged parts in parallel), ``--transfers`` objects at a time;
- ``ydl_fetch``: ``S3Storage.fetch`` into an empty local cache: the same downloads, plus the
  manifest, a sha256 check of every chunk and the atomic publish of the local copy.

Then the local read path of the pulled copy against the builder's own local copy of the same
files (shuffled batches of 256). Prints a markdown table; ``--json`` also writes it.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

import yogadl_plus as ydl
from bench.harness import machine, smoke, start_seaweedfs, target_cell, time_once, write_json

RECORD_FLOATS = 16384  # 64 KiB records


def drop(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def build(storage: Any, gb: float, chunk_mb: int) -> ydl.DataRef:
    n = int(gb * (1 << 30)) // (RECORD_FLOATS * 4)
    rng = np.random.default_rng(0)
    block = rng.standard_normal((256, RECORD_FLOATS)).astype(np.float32)

    def records() -> Any:
        for i in range(n):
            yield {"x": block[i % 256] + np.float32(i), "label": np.int64(i)}

    return ydl.cache_dataset(
        records, "bench", "v1", storage, chunk_bytes=chunk_mb << 20, progress=False
    )


def boto3_baseline(client: Any, bucket: str, keys: list[str], target: Path, transfers: int) -> None:
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig()  # the aws cli's defaults: 8 MB parts, 10 threads per object
    target.mkdir(parents=True)

    def one(key: str) -> None:
        client.download_file(bucket, key, str(target / key.replace("/", "_")), Config=config)

    with ThreadPoolExecutor(transfers) as pool:
        list(pool.map(one, keys))


def stream_pass(dataref: ydl.DataRef) -> float:
    start = time.perf_counter()
    count = 0
    for batch in dataref.stream(shuffle=True, shuffle_seed=1, batch_size=256):
        count += len(batch["label"])
    assert count == len(dataref)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gb", type=float, default=smoke(1.0, 0.01), help="version size in GB (default 1)"
    )
    parser.add_argument(
        "--chunk-mb", type=int, default=smoke(64, 1), help="chunk size in MB (default 64)"
    )
    parser.add_argument("--repeats", type=int, default=smoke(3, 1), help="best of this many (3)")
    parser.add_argument("--transfers", type=int, default=8, help="objects in flight (default 8)")
    parser.add_argument("--tmp", default=None, help="parent of the temporary folder")
    parser.add_argument("--json", default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="ydl-bench-remote-", dir=args.tmp))
    try:
        with contextlib.ExitStack() as stack:
            server = start_seaweedfs(stack, work / "seaweedfs")
            client = server.client()
            bucket = server.make_bucket("bench")
            builder = ydl.S3Storage(
                bucket, "caches", local_cache=work / "builder", client=client,
                max_transfers=args.transfers,
            )  # fmt: skip
            start = time.perf_counter()
            built = build(builder, args.gb, args.chunk_mb)
            build_s = time.perf_counter() - start
            total = sum(c.bytes for c in built.manifest.chunks)
            keys = [f"caches/bench/v1/{c.file}" for c in built.manifest.chunks]
            times: dict[str, list[float]] = {"boto3_download_file": [], "ydl_fetch": []}
            for r in range(args.repeats):
                target = work / f"boto3-{r}"
                seconds, _ = time_once(
                    lambda target=target: boto3_baseline(
                        client, bucket, keys, target, args.transfers
                    )
                )
                times["boto3_download_file"].append(seconds)
                drop(target)
                copy = ydl.S3Storage(
                    bucket, "caches", local_cache=work / f"machine-{r}", client=client,
                    max_transfers=args.transfers,
                )  # fmt: skip
                seconds, pulled = time_once(lambda copy=copy: copy.fetch("bench", "v1"))
                times["ydl_fetch"].append(seconds)
                if r < args.repeats - 1:
                    del pulled
                    drop(work / f"machine-{r}")
            read_times = {"pulled": [], "built": []}
            for _ in range(args.repeats):
                read_times["pulled"].append(stream_pass(pulled))
                read_times["built"].append(stream_pass(built))
    finally:
        drop(work)

    best = {k: min(v) for k, v in times.items()}
    rates = {k: total / v / 1e6 for k, v in best.items()}
    ratio = rates["ydl_fetch"] / rates["boto3_download_file"]
    read_best = {k: min(v) for k, v in read_times.items()}
    read_rates = {k: len(built) / v for k, v in read_best.items()}
    read_ratio = read_rates["pulled"] / read_rates["built"]
    info = machine()
    machine_line = f"{info['cpus']} CPUs, {info['cpu_model']}"
    print(
        f"# yogadl_plus remote pull: {machine_line}, {total / 1e9:.2f} GB in "
        f"{len(built.manifest.chunks)} chunks of {args.chunk_mb} MB, SeaweedFS on 127.0.0.1, "
        f"{args.transfers} transfers, best of {args.repeats} (build took {build_s:.1f} s)\n"
    )
    print("| metric | MB/s | baseline | baseline MB/s | ratio | target |")
    print("|---|---:|---|---:|---:|---|")
    print(
        f"| ydl_fetch | {rates['ydl_fetch']:,.0f} | boto3_download_file | "
        f"{rates['boto3_download_file']:,.0f} | {ratio:.2f}x | "
        f"{target_cell('>= 0.7x', ratio >= 0.7)} |"
    )
    print()
    print("| metric | records/s | baseline | baseline records/s | ratio |")
    print("|---|---:|---|---:|---:|")
    print(
        f"| shuffled batch256 on the pulled copy | {read_rates['pulled']:,.0f} | same on the "
        f"builder's local copy | {read_rates['built']:,.0f} | {read_ratio:.2f}x |"
    )
    write_json(
        args.json,
        {
            "bytes": total,
            "chunks": len(built.manifest.chunks),
            "times_s": times,
            "read_times_s": read_times,
            "ratio": ratio,
            "read_ratio": read_ratio,
            "build_s": build_s,
        },
        info,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
