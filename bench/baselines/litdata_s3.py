"""litdata 0.2.76 streaming from an S3-compatible server: one cold epoch, run in the peers venv.

    .baselines/peers/bin/python -m bench.baselines.litdata_s3 --mode prepare \
        --endpoint http://127.0.0.1:PORT --bucket B --prefix P --access-key K --secret-key S \
        --work DIR [--records 200000] [--chunk-bytes 8MB]
    .baselines/peers/bin/python -m bench.baselines.litdata_s3 --mode read \
        --endpoint http://127.0.0.1:PORT --bucket B --prefix P --access-key K --secret-key S \
        --work DIR [--records 200000] [--batch-size 256] [--num-workers 0]

Data (N records): ``{"i": i, "x": X[i]}`` with ``i`` an int64 (litdata's ``int`` serializer) and
``X = np.random.default_rng(0).standard_normal((N, 64)).astype(np.float32)`` (litdata stores each
row header-less, 256 bytes).

``--mode prepare`` writes the records with ``litdata.optimize`` into ``DIR/optimized/`` (replaced
if present; ``--chunk-bytes`` per chunk, 2 worker processes), uploads every file of it to
``s3://B/P/`` with boto3 (path-style addressing) and deletes any other object left under ``P/``,
so the prefix holds exactly this dataset. Prints ``{"prepared", "files", "bytes"}``.

``--mode read`` streams one epoch from a cold cache: it times (``time.perf_counter``) from the
construction of ``StreamingDataset("s3://B/P", shuffle=True, seed=0)`` with an empty cache folder
(``DIR/cache-<pid>-<ns>/``, removed afterwards) through a ``StreamingDataLoader`` to the end of
the epoch, so the figure includes fetching ``index.json`` and every chunk. It counts the records
and checks that each index 0..N-1 came exactly once (and the shape and dtype of ``x`` in the
first batch). Prints ``{"records", "seconds", "records_per_s", "all_once", "first_batch_s",
"chunk_fetch"}``: ``first_batch_s`` is construction to first batch, ``chunk_fetch`` the client
that fetched the chunks (``obstore`` or ``boto3``, below).

How litdata reaches the server: ``storage_options`` (``endpoint_url``, keys, ``region_name``),
which litdata passes to ``boto3.Session().client("s3", ...)``. Chunks are then fetched with
obstore (an ``S3Store`` built from that client's endpoint, region and credentials, path-style as
the endpoint is not amazonaws.com) when obstore is installed, as in the peers venv, and
``index.json`` with boto3; this litdata has no s5cmd path. obstore gets fixed client options
from litdata that refuse http:// endpoints, so this module adds ``allow_http`` to them (see
below). The ``AWS_*`` variables are also set to the same server, so that no code path can fall
back to AWS or to ambient credentials.

The last line of stdout is one JSON object. Does not import yogadl_plus.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import litdata
import numpy as np
from litdata.constants import _OBSTORE_AVAILABLE
from litdata.streaming import downloader as litdata_downloader

# litdata fetches chunks with obstore and passes it fixed client options that leave out
# ``allow_http``, so obstore refuses an http:// endpoint ("BadScheme"; its AWS_ALLOW_HTTP variable
# is then ignored too). Allowing plain HTTP changes nothing else (https still uses TLS). Done at
# import so that DataLoader workers started with spawn, which re-import this module, get it too.
litdata_downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True

FEATURES = 64
SEED = 0
PREPARE_WORKERS = 2
MAX_CACHE_SIZE = "100GB"  # a budget, not an allocation: far above the dataset, so no eviction


def point_env_at(args: argparse.Namespace) -> None:
    """Make every default boto3 / botocore client in this process use the given server."""
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": args.endpoint,
            "AWS_ENDPOINT_URL_S3": args.endpoint,
            "AWS_ACCESS_KEY_ID": args.access_key,
            "AWS_SECRET_ACCESS_KEY": args.secret_key,
            "AWS_DEFAULT_REGION": args.region,
            "AWS_REGION": args.region,
        }
    )
    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE",
    ):
        os.environ.pop(name, None)


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for ``boto3.Session().client("s3", ...)``, as litdata takes them."""
    return {
        "endpoint_url": args.endpoint,
        "aws_access_key_id": args.access_key,
        "aws_secret_access_key": args.secret_key,
        "region_name": args.region,
    }


def s3_client(args: argparse.Namespace) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        **storage_options(args),
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )


class Record:
    """``optimize``'s ``fn``: index ``i`` -> record ``i`` (picklable: sent to spawned workers)."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x

    def __call__(self, i: int) -> dict[str, Any]:
        return {"i": i, "x": self.x[i]}


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    n = args.records
    out = Path(args.work, "optimized").resolve()
    shutil.rmtree(out, ignore_errors=True)
    x = np.random.default_rng(SEED).standard_normal((n, FEATURES)).astype(np.float32)
    litdata.optimize(
        fn=Record(x),
        inputs=list(range(n)),
        output_dir=str(out),
        chunk_bytes=args.chunk_bytes,
        num_workers=PREPARE_WORKERS,
        verbose=False,
    )

    client = s3_client(args)
    prefix = args.prefix.strip("/")
    uploaded: set[str] = set()
    total = 0
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        key = f"{prefix}/{path.relative_to(out).as_posix()}"
        client.upload_file(str(path), args.bucket, key)
        uploaded.add(key)
        total += path.stat().st_size
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=args.bucket, Prefix=prefix + "/"
    ):
        for item in page.get("Contents", []):
            if item["Key"] not in uploaded:
                client.delete_object(Bucket=args.bucket, Key=item["Key"])
    return {"prepared": n, "files": len(uploaded), "bytes": total}


def read(args: argparse.Namespace) -> dict[str, Any]:
    n = args.records
    cache = Path(args.work, f"cache-{os.getpid()}-{time.time_ns()}").resolve()
    cache.mkdir(parents=True)
    seen: list[np.ndarray] = []
    first_batch_s: float | None = None
    try:
        start = time.perf_counter()
        dataset = litdata.StreamingDataset(
            input_dir=f"s3://{args.bucket}/{args.prefix.strip('/')}",
            shuffle=True,
            seed=SEED,
            cache_dir=str(cache),
            max_cache_size=MAX_CACHE_SIZE,
            storage_options=storage_options(args),
        )
        loader = litdata.StreamingDataLoader(
            dataset, batch_size=args.batch_size, num_workers=args.num_workers
        )
        for batch in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
                x = batch["x"]
                if tuple(x.shape[1:]) != (FEATURES,) or str(x.dtype) != "torch.float32":
                    raise RuntimeError(f"unexpected x in a batch: {x.shape} {x.dtype}")
            seen.append(batch["i"].numpy())
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    indices = np.sort(np.concatenate(seen)) if seen else np.empty(0, dtype=np.int64)
    records = int(indices.size)
    all_once = records == n and bool((indices == np.arange(n)).all())
    return {
        "records": records,
        "seconds": seconds,
        "records_per_s": records / seconds,
        "all_once": all_once,
        "first_batch_s": first_batch_s,
        "chunk_fetch": "obstore" if _OBSTORE_AVAILABLE else "boto3",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mode", choices=("prepare", "read"), required=True)
    parser.add_argument(
        "--endpoint", required=True, help="S3 endpoint URL, e.g. http://127.0.0.1:8333"
    )
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--access-key", required=True)
    parser.add_argument("--secret-key", required=True)
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--work", required=True, help="a scratch folder this script may fill")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--chunk-bytes", default="8MB", help="litdata.optimize's chunk_bytes")
    parser.add_argument("--num-workers", type=int, default=0)
    args = parser.parse_args()

    point_env_at(args)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    result = prepare(args) if args.mode == "prepare" else read(args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
