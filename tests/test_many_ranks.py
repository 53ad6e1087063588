"""Many ranks of one node on one local cache: 8 processes that start together on a cold cache read
each chunk's bytes across the network once, and the manifest once.

A real SeaweedFS on 127.0.0.1 behind tests/fault_proxy.py, which counts the requests; the ranks
are real processes, each making its own storage (as torchrun's ranks do) on one local cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.fault_proxy import FaultProxy
from helpers.remote_helpers import records

import yogadl_plus as ydl

pytestmark = [pytest.mark.servers, pytest.mark.timeout(300)]

RANKS = 8
N = 3000

RANK = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import yogadl_plus as ydl

    spec = json.loads(sys.argv[1])
    while time.time() < spec["start_at"]:  # the ranks start together
        time.sleep(0.001)
    storage = ydl.S3Storage(
        spec["bucket"], "team", local_cache=spec["cache"], endpoint_url=spec["endpoint"],
        aws_access_key_id=spec["key"], aws_secret_access_key=spec["secret"],
        region_name="us-east-1", local_cache_limit=spec["limit"],
    )
    began = time.monotonic()
    ref = storage.fetch("d", "v", on_demand=spec["on_demand"])
    rank, world = spec["rank"], spec["world"]
    labels = []
    for batch in ref.stream(batch_size=100, shard_rank=rank, num_shards=world):
        labels += batch["label"].tolist()
    print(json.dumps({"labels": labels, "seconds": time.monotonic() - began}))
    """
)


def run_ranks(spec: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    start_at = time.time() + 3.0  # time enough for every interpreter to start
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                json.dumps({**spec, "rank": r, "world": RANKS, "start_at": start_at}),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(RANKS)
    ]
    outputs = []
    for rank in ranks:
        out, err = rank.communicate(timeout=240)
        assert rank.returncode == 0, err[-3000:]
        outputs.append(json.loads(out.splitlines()[-1]))
    return outputs


@pytest.mark.parametrize("on_demand", [False, True], ids=["pull", "on-demand"])
def test_eight_ranks_on_a_cold_cache_read_each_chunk_and_the_manifest_once(
    s3_server: Any, tmp_path: Path, on_demand: bool
) -> None:
    bucket = s3_server.make_bucket()
    builder = s3_server.storage(bucket, "team", tmp_path / "builder")
    built = ydl.cache_dataset(records(N), "d", "v", builder, chunk_bytes=40_000, progress=False)
    chunks = [c.file for c in built.manifest.chunks]
    assert len(chunks) >= 2 * RANKS
    with FaultProxy(s3_server.endpoint_url) as proxy:
        spec = {
            "bucket": bucket,
            "cache": str(tmp_path / "node"),
            "endpoint": proxy.url,
            "key": s3_server.access_key,
            "secret": s3_server.secret_key,
            # Reading on demand into a cache that holds the whole version: a smaller one would
            # evict chunks that another rank then fetches again, rightly.
            "limit": None,
            "on_demand": on_demand,
        }
        outputs = run_ranks(spec, tmp_path)
        manifest_reads = proxy.count("GET", "manifest.json")
        chunk_reads = {file: proxy.count("GET", file) for file in chunks}
    seen = sorted(label for out in outputs for label in out["labels"])
    assert seen == list(range(N))  # each rank its shard, every record once
    assert manifest_reads == 1, manifest_reads
    assert set(chunk_reads.values()) == {1}, chunk_reads
    assert len([p for p in (tmp_path / "node").rglob("+manifests/d/v")]) == 1
    assert os.path.isdir(tmp_path / "node")


def test_a_version_rebuilt_in_the_bucket_is_never_read_from_a_kept_manifest(
    s3_server: Any, tmp_path: Path
) -> None:
    # The node keeps the manifest it downloaded; another machine rebuilds the version; the
    # node's next fetch, on demand or pulled, reads the new build (the token changed).
    bucket = s3_server.make_bucket()
    other = s3_server.storage(bucket, "team", tmp_path / "other")
    ydl.cache_dataset(records(300), "d", "v", other, chunk_bytes=20_000, progress=False)
    node = s3_server.storage(bucket, "team", tmp_path / "node")
    first = node.fetch("d", "v", on_demand=True)
    assert int(first[5]["label"]) == 5
    rebuilt = [{**r, "label": r["label"] + 1000} for r in records(300)]
    ydl.cache_dataset(rebuilt, "d", "v", other, overwrite=True, chunk_bytes=20_000, progress=False)
    again = node.fetch("d", "v", on_demand=True)
    assert int(again[5]["label"]) == 1005
    assert int(node.fetch("d", "v", on_demand=False)[7]["label"]) == 1007


def test_two_buckets_sharing_a_local_cache_never_take_each_others_manifest(
    s3_server: Any, tmp_path: Path
) -> None:
    cache = tmp_path / "node"
    one, two = s3_server.make_bucket(), s3_server.make_bucket()
    for bucket, shift in ((one, 0), (two, 500)):
        data = [{**r, "label": r["label"] + shift} for r in records(200)]
        ydl.cache_dataset(data, "d", "v", s3_server.storage(bucket, "team", tmp_path / bucket))
    first = s3_server.storage(one, "team", cache).fetch("d", "v", on_demand=True)
    second = s3_server.storage(two, "team", cache).fetch("d", "v", on_demand=True)
    assert int(first[3]["label"]) == 3 and int(second[3]["label"]) == 503


def test_a_rebuild_on_the_node_returns_what_it_published(s3_server: Any, tmp_path: Path) -> None:
    bucket = s3_server.make_bucket()
    node = s3_server.storage(bucket, "team", tmp_path / "node")
    ydl.cache_dataset(records(100), "d", "v", node, progress=False)
    assert int(node.fetch("d", "v")[4]["label"]) == 4
    rebuilt = [{**r, "label": r["label"] + 1000} for r in records(100)]
    ref = ydl.cache_dataset(rebuilt, "d", "v", node, overwrite=True, progress=False)
    assert int(ref[4]["label"]) == 1004
    # A kept manifest damaged on disk is downloaded again, not taken.
    (kept,) = (tmp_path / "node").rglob("+manifests/d/v")
    kept.write_bytes(kept.read_bytes()[:-10] + b"0123456789")
    assert int(node.fetch("d", "v")[4]["label"]) == 1004
    node.delete("d", "v")
    assert not list((tmp_path / "node").rglob("+manifests/d/v*"))
