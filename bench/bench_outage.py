"""A training loop reading a bucket on demand while the bucket is gone for five minutes.

    python -m bench.bench_outage [--outage-s 300] [--records 20000] [--tmp DIR]

Too slow for the test suite (tests/test_outages.py stops the server for 8 s); this is the
five-minute outage at full length (2 s in smoke mode). A SeaweedFS on 127.0.0.1 holds a version
of --records records (``{"x": float32[64], "label": int64}``) in chunks of 100 kB; a node reads
it on demand through a local cache limited to half of it, with the default ``retry_timeout``
(300 s), in shuffled batches of 100 with ``shuffle_window=4``. After a fifth of the epoch's
batches the server is stopped (its port refuses connections) for --outage-s seconds, then
started again on the same port with the same data. The loop "trains" at 10 ms a batch. Printed:
the outage, the longest wait for a batch, the WARNING lines the ``yogadl_plus`` logger wrote
during the wait (at the first retry, then every 30 s), and whether every record of the epoch was
handed out once.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import yogadl_plus as ydl
from bench.harness import local_servers, or_skip, smoke


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage-s", type=float, default=smoke(300.0, 2.0))
    parser.add_argument("--records", type=int, default=smoke(20_000, 2_000))
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args(argv)
    servers = or_skip(local_servers)
    from botocore.config import Config

    work = Path(tempfile.mkdtemp(prefix="bench-outage-", dir=args.tmp))
    weed = or_skip(lambda: servers.SeaweedFS(work / "weed"))
    warnings_seen: list[tuple[float, str]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings_seen.append((time.monotonic(), record.getMessage()))

    logging.getLogger("yogadl_plus").addHandler(Keep(logging.WARNING))
    try:
        weed.start()
        server = weed.server
        bucket = server.make_bucket()

        def storage(cache: Path, **options: object) -> ydl.S3Storage:
            return ydl.S3Storage(
                bucket, "team", local_cache=cache, endpoint_url=server.endpoint_url,
                aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key,
                region_name=server.region,
                config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
                **options,  # type: ignore[arg-type]
            )  # fmt: skip

        rng = np.random.default_rng(0)
        columns = {
            "x": rng.standard_normal((args.records, 64)).astype(np.float32),
            "label": np.arange(args.records),
        }
        built = ydl.cache_dataset(
            columns, "d", "v", storage(work / "builder"), chunk_bytes=100_000, progress=False
        )
        limit = sum(c.bytes for c in built.manifest.chunks) // 2
        ref = storage(work / "node", local_cache_limit=limit).fetch("d", "v")
        stream = ref.stream(batch_size=100, shuffle=True, shuffle_seed=0, shuffle_window=4)
        batches = len(stream)
        seen: list[int] = []
        waits: list[float] = []
        down_at = up_at = 0.0

        def outage() -> None:
            nonlocal down_at, up_at
            down_at = time.monotonic()
            weed.stop()
            time.sleep(args.outage_s)
            weed.start()
            up_at = time.monotonic()

        thread = threading.Thread(target=outage, daemon=True)
        began = last = time.monotonic()
        for k, batch in enumerate(stream):
            now = time.monotonic()
            waits.append(now - last)
            seen += batch["label"].tolist()
            if k == batches // 5:
                thread.start()
                time.sleep(0.5)  # (the server is down before the next batch is asked for)
            time.sleep(0.010)  # the training step
            last = time.monotonic()
        ended = time.monotonic()
        thread.join()
        during = [(t - down_at, m) for t, m in warnings_seen if down_at <= t <= ended]
        whole = sorted(seen) == list(range(args.records))
        print(
            f"{args.records} records in {len(built.manifest.chunks)} chunks; local cache "
            f"limit {limit:,} bytes; {batches} batches"
        )
        print(
            f"outage: {up_at - down_at:.0f} s; epoch: {ended - began:.0f} s; longest wait for "
            f"a batch: {max(waits):.0f} s"
        )
        print(f"every record handed out once: {whole}")
        print(f"WARNING lines from the outage to the epoch's end: {len(during)}")
        for t, message in during:
            print(f"  +{t:5.0f} s  {message[:150]}")
        return 0 if whole else 1
    finally:
        weed.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
