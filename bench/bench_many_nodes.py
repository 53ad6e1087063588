"""Many nodes reading one version from one bucket, each through its own local cache.

    python -m bench.bench_many_nodes [--records 1000000] [--nodes 1,2,4] [--rounds 2]
                                     [--chunk-mb 4] [--tmp DIR]

A SeaweedFS on 127.0.0.1 holds a version of --records records ``{"i": int64, "x": float32[64]}``
(264 bytes each) in chunks of about --chunk-mb MB. For each N of --nodes, N processes stand in
for N nodes: each makes its own storage on its own empty local cache (limited to half of the
version, so it reads on demand) and reads its shard of one epoch (``shard_rank=node,
num_shards=N, shard_by="chunks"``, so a node fetches only its own chunks) with ``shuffle=True,
shuffle_window=8, batch_size=256``, all starting together. The aggregate rate is the version's
records over the slowest node's time.

The ceiling, in the same run: N processes that download the same chunks with plain boto3
``get_object`` calls (8 threads each, nothing decoded or written): what the server and this
machine give N readers at all. The peer, in the same run: litdata 0.2.76's ``StreamingDataset
(shuffle=True)`` through a ``StreamingDataLoader`` (batch 256, no worker processes: its fastest
setting on this machine) reading the same records (``bench/baselines/litdata_s3.py``, in the
peers venv, from a prefix of the same bucket, written by ``litdata.optimize`` in 8 MB chunks)
from an empty cache of unlimited size, against one node of ours.

The machine has 2 cores, which the server, the nodes and their transfers share: where the rows
stop scaling, that (not the bucket) is the limit here.
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
from bench.harness import (
    BASELINE_VENVS,
    finish_call,
    run_baseline,
    smoke,
    start_call,
    start_seaweedfs,
)


def _wait_until(start_at: float) -> None:
    while time.time() < start_at:
        time.sleep(0.001)


def node(spec: dict[str, Any]) -> dict[str, Any]:
    """One node (a fresh process): its shard of one epoch on its own empty local cache."""
    _wait_until(spec["start_at"])
    began = time.perf_counter()
    storage = ydl.S3Storage(
        spec["bucket"], "team", local_cache=spec["cache"], endpoint_url=spec["endpoint"],
        aws_access_key_id=spec["key"], aws_secret_access_key=spec["secret"],
        region_name="us-east-1", local_cache_limit=spec["limit"],
    )  # fmt: skip
    ref = storage.fetch("d", "v")
    stream = ref.stream(
        shuffle=True, shuffle_seed=0, shuffle_window=8, batch_size=256,
        shard_rank=spec["rank"], num_shards=spec["world"], shard_by="chunks",
    )  # fmt: skip
    n = 0
    first = None
    for batch in stream:
        n += len(batch["i"])
        first = first or time.perf_counter() - began
    return {"records": n, "seconds": time.perf_counter() - began, "first": first}


def raw_gets(spec: dict[str, Any]) -> dict[str, Any]:
    """The ceiling's node (a fresh process): plain boto3 GETs of its chunks, 8 threads."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url=spec["endpoint"], aws_access_key_id=spec["key"],
        aws_secret_access_key=spec["secret"], region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=16),
    )  # fmt: skip
    _wait_until(spec["start_at"])
    began = time.perf_counter()

    def get(key: str) -> int:
        return len(client.get_object(Bucket=spec["bucket"], Key=key)["Body"].read())

    with ThreadPoolExecutor(8) as pool:
        got = sum(pool.map(get, spec["keys"]))
    return {"bytes": got, "seconds": time.perf_counter() - began}


def run_together(function: str, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``function`` of this module for every spec, each in its own process, started together."""
    start_at = time.time() + 2.0
    calls = [
        start_call(None, "bench_many_nodes", function, {**spec, "start_at": start_at})
        for spec in specs
    ]
    return [finish_call(call) for call in calls]


def litdata(python: str, args: list[str]) -> dict[str, Any]:
    """bench.baselines.litdata_s3 in the peers venv."""
    result = run_baseline("peers", "litdata_s3", args, python=python, timeout=1800)
    if isinstance(result, str):
        raise SystemExit(f"litdata: {result}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=smoke(1_000_000, 10_000))
    parser.add_argument("--nodes", default=smoke("1,2,4", "1,2"))
    parser.add_argument("--rounds", type=int, default=smoke(2, 1))
    parser.add_argument("--chunk-mb", type=float, default=smoke(4.0, 0.5))
    parser.add_argument("--tmp", default=None)
    parser.add_argument(
        "--litdata-python",
        default=str(Path(BASELINE_VENVS) / "peers" / "bin" / "python"),
        help="the peers venv's python ('' to leave litdata out)",
    )
    args = parser.parse_args(argv)

    python = (
        args.litdata_python if args.litdata_python and Path(args.litdata_python).exists() else ""
    )
    peer: list[float] = []

    work = Path(tempfile.mkdtemp(prefix="bench-nodes-", dir=args.tmp))
    results: dict[int, dict[str, float]] = {}
    try:
        with contextlib.ExitStack() as stack:
            server = start_seaweedfs(stack, work / "weed")
            bucket = server.make_bucket()
            n = args.records
            columns = {
                "i": np.arange(n),
                "x": np.random.default_rng(0).standard_normal((n, 64), np.float32),
            }
            built = ydl.cache_dataset(
                columns, "d", "v", server.storage(bucket, "team", work / "builder"),
                chunk_bytes=int(args.chunk_mb * (1 << 20)), progress=False,
            )  # fmt: skip
            chunks = built.manifest.chunks
            total = sum(c.bytes for c in chunks)
            prefix = f"team/{built.manifest.dataset_id}/{built.manifest.version}/"
            keys = [prefix + c.file for c in chunks]
            built.close()
            shutil.rmtree(built.directory, ignore_errors=True)
            common = {"bucket": bucket, "endpoint": server.endpoint_url,
                      "key": server.access_key, "secret": server.secret_key}  # fmt: skip
            lit = ["--endpoint", server.endpoint_url, "--bucket", bucket, "--prefix", "litdata",
                   "--access-key", server.access_key, "--secret-key", server.secret_key,
                   "--records", str(n), "--work", str(work / "litdata")]  # fmt: skip
            if python:
                litdata(python, [*lit, "--mode", "prepare"])
            for round_ in range(args.rounds):
                for nodes in map(int, args.nodes.split(",")):
                    specs = [
                        {**common, "rank": r, "world": nodes, "limit": total // 2,
                         "cache": str(work / f"cache-{round_}-{nodes}-{r}")}
                        for r in range(nodes)
                    ]  # fmt: skip
                    ours = run_together("node", specs)
                    assert sum(o["records"] for o in ours) == n
                    raw = run_together(
                        "raw_gets", [{**common, "keys": keys[r::nodes]} for r in range(nodes)]
                    )
                    for spec in specs:
                        shutil.rmtree(spec["cache"], ignore_errors=True)
                    row = results.setdefault(nodes, {"ours": 0.0, "raw": 0.0, "first": 1e9})
                    row["ours"] = max(row["ours"], n / max(o["seconds"] for o in ours))
                    row["raw"] = max(row["raw"], total / max(r["seconds"] for r in raw))
                    row["first"] = min(row["first"], max(o["first"] for o in ours))
                    print(f"round {round_ + 1}, {nodes} node(s): {ours} / {raw}", file=sys.stderr)
                if python:
                    read = litdata(python, [*lit, "--mode", "read"])
                    assert read["all_once"] and read["records"] == n, read
                    peer.append(read["records_per_s"])
                    print(f"round {round_ + 1}, litdata: {read}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    one = results[min(results)]["ours"]
    print(
        f"{n:,} records, {len(chunks)} chunks, {total / 1e6:.0f} MB; best of {args.rounds} "
        "rounds; each node on a cold local cache of half the version\n"
    )
    print(
        "| nodes | records/s, all nodes | x 1 node | MB/s | raw boto3 GETs, MB/s | ours / raw "
        "| slowest node's first batch (s) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for nodes, row in sorted(results.items()):
        mb_s = row["ours"] * total / n / 1e6
        print(
            f"| {nodes} | {row['ours']:,.0f} | {row['ours'] / one:.2f}x | {mb_s:.0f} | "
            f"{row['raw'] / 1e6:.0f} | {mb_s * 1e6 / row['raw']:.2f}x | {row['first']:.2f} |"
        )
    if peer:
        print(
            "\none node against litdata StreamingDataset(shuffle=True), same records, same "
            f"bucket, cold: ours {one:,.0f} records/s, litdata {max(peer):,.0f} (best of "
            f"{len(peer)}): {one / max(peer):.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
