"""Reading a bucket's version four times bigger than the local cache, on demand, against the
same stream over a fully pulled local copy, in one run.

Builds one version of ``--mb`` MB in chunks of ``--chunk-mb`` MB on a SeaweedFS started for the
run (as the tests do: 127.0.0.1, its own ports, stopped by PID). Then, best of ``--repeats``:

- ``pulled copy`` (the baseline): the stream over a local copy pulled whole beforehand;
- ``pull, then read``: a whole pull into an empty cache without a limit, then the stream;
- ``on demand``: ``fetch`` into an empty cache whose ``local_cache_limit`` is ``--fraction``
  of the version (so it must read on demand), then the stream, chunks fetched as read and
  ahead of the reads; fetches per chunk counted and the cache folder's size sampled.

The stream reads in chunk order (``shuffle=False``), or with ``--window W`` a windowed
shuffle (``shuffle=True, shuffle_window=W``) where the stream takes that argument. The reads
that fetch go straight to SeaweedFS, then through a proxy in this process that delivers
every byte ``--delay-ms`` late each way (loopback latency, as ``tc netem`` would add, on no
interface), and through the same proxy with no delay (what the proxy itself costs).
Every ratio is against the baseline measured in the same run (higher is better).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

import yogadl_plus as ydl
from bench.delay_proxy import DelayProxy
from bench.harness import machine, smoke, start_seaweedfs, time_once, write_json
from yogadl_plus.stream import Stream

RECORD_FLOATS = 16384  # 64 KiB records


def build(storage: Any, mb: int, chunk_mb: int) -> ydl.DataRef:
    n = (mb << 20) // (RECORD_FLOATS * 4)
    rng = np.random.default_rng(0)
    block = rng.standard_normal((256, RECORD_FLOATS)).astype(np.float32)

    def records() -> Any:
        for i in range(n):
            yield {"x": block[i % 256] + np.float32(i), "label": np.int64(i)}

    return ydl.cache_dataset(
        records, "bench", "v1", storage, chunk_bytes=chunk_mb << 20, progress=False
    )


def cache_bytes(folder: Path) -> int:
    seen: dict[tuple[int, int], int] = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


class Peak:
    """The largest size of ``folder`` seen while the block runs (sampled every 10 ms)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.bytes = folder, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.bytes = max(self.bytes, cache_bytes(self.folder))

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.bytes = max(self.bytes, cache_bytes(self.folder))


def storage(server: Any, port: int, cache: Path, **options: Any) -> ydl.S3Storage:
    return ydl.S3Storage(
        "bench",
        "caches",
        local_cache=cache,
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name=server.region,
        **options,
    )


def count_fetches(machine: Any) -> Counter[str]:
    """Fetches per chunk key (their first ranged reads)."""
    fetches: Counter[str] = Counter()
    original = machine.objects.read_range

    def read_range(key: str, start: int, stop: int) -> bytes:
        if start == 0:
            fetches[key] += 1
        return original(key, start, stop)

    machine.objects.read_range = read_range
    return fetches


def count_ready(ref: Any, ready: list[bool]) -> None:
    """Appends to ``ready``, for each chunk a reader opens, whether it was on disk already
    (fetched ahead of the read)."""
    fetcher = ref.provider  # the ChunkFetcher that brings chunks to local disk
    original = fetcher.acquire

    def acquire(number: int) -> Any:
        ready.append(os.path.exists(os.path.join(fetcher.folder, fetcher.chunks[number].file)))
        return original(number)

    fetcher.acquire = acquire


def stream_pass(ref: ydl.DataRef, options: dict[str, Any], batch_size: int, step: float) -> None:
    """One epoch of the stream; ``step`` seconds of work per batch (a training step)."""
    count = 0
    for batch in ref.stream(batch_size=batch_size, **options):
        count += len(batch["label"])
        if step:
            time.sleep(step)
    assert count == len(ref), (count, len(ref))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mb", type=int, default=smoke(256, 8), help="version size in MB (default 256)"
    )
    parser.add_argument(
        "--chunk-mb", type=int, default=smoke(8, 1), help="chunk size in MB (default 8)"
    )
    parser.add_argument(
        "--fraction", type=float, default=0.25, help="cache limit / version size (default 0.25)"
    )
    parser.add_argument("--delay-ms", type=float, default=5.0, help="added latency each way")
    parser.add_argument("--window", type=int, default=None, help="shuffle_window=W (shuffled)")
    parser.add_argument("--batch-size", type=int, default=64, help="stream batch size")
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="work per batch, as a training step's (0)"
    )
    parser.add_argument("--repeats", type=int, default=smoke(3, 1), help="best of this many (3)")
    parser.add_argument("--transfers", type=int, default=8, help="max_transfers (default 8)")
    parser.add_argument("--tmp", default=None, help="parent of the temporary folder")
    parser.add_argument("--json", default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    options: dict[str, Any] = {"shuffle": False}
    if args.window is not None:
        if "shuffle_window" not in inspect.signature(Stream.__init__).parameters:
            parser.error("--window: this yogadl_plus's Stream takes no shuffle_window yet")
        options = {"shuffle": True, "shuffle_seed": 0, "shuffle_window": args.window}

    work = Path(tempfile.mkdtemp(prefix="ydl-bench-ondemand-", dir=args.tmp))
    rows: dict[str, dict[str, Any]] = {}
    try:
        with contextlib.ExitStack() as stack:
            server = start_seaweedfs(stack, work / "seaweedfs")
            server.make_bucket("bench")
            port = int(server.endpoint_url.rsplit(":", 1)[1])
            builder = storage(server, port, work / "builder")
            start = time.perf_counter()
            build(builder, args.mb, args.chunk_mb)
            build_s = time.perf_counter() - start
            del builder
            shutil.rmtree(work / "builder")
            pulled = storage(server, port, work / "pulled").fetch("bench", "v1")
            chunks = pulled.manifest.chunks
            total = sum(c.bytes for c in chunks)
            limit = int(total * args.fraction)
            largest = max(c.bytes for c in chunks)
            times: dict[tuple[str, str], list[float]] = {}
            step = args.step_ms / 1000

            def timed(key: tuple[str, str], run: Any) -> None:
                times.setdefault(key, []).append(time_once(run)[0])

            def pull_then_read(network: str, to: int, r: int) -> None:
                cache = work / f"pull-{to}-{r}"

                def run() -> None:
                    ref = storage(server, to, cache, max_transfers=args.transfers).fetch(
                        "bench", "v1", on_demand=False
                    )
                    stream_pass(ref, options, args.batch_size, step)

                timed(("pull, then read", network), run)
                shutil.rmtree(cache)

            def on_demand(network: str, to: int, r: int) -> None:
                cache = work / f"demand-{to}-{r}"
                machine = storage(
                    server, to, cache, local_cache_limit=limit, max_transfers=args.transfers
                )
                fetches = count_fetches(machine)
                ready: list[bool] = []

                def run() -> None:
                    ref = machine.fetch("bench", "v1")
                    count_ready(ref, ready)
                    stream_pass(ref, options, args.batch_size, step)

                with Peak(cache) as peak:
                    timed(("on demand", network), run)
                row = rows.setdefault(network, {"fetches_per_chunk": [], "ahead": [], "peak": []})
                row["fetches_per_chunk"].append(max(fetches.values()))
                row["missing"] = len(chunks) - len(fetches)
                row["ahead"].append(sum(ready) / max(len(ready), 1))
                row["peak"].append(peak.bytes)
                shutil.rmtree(cache)

            delayed = f"proxy, +{args.delay_ms:g} ms each way"
            with (
                DelayProxy(port, 0.0) as bare,
                DelayProxy(port, args.delay_ms / 1000) as slow,
            ):
                networks = [("direct", port), ("proxy, +0 ms", bare.port), (delayed, slow.port)]
                for r in range(args.repeats):  # alternating, so that drift hits all alike
                    timed(
                        ("pulled copy", "-"),
                        lambda: stream_pass(pulled, options, args.batch_size, step),
                    )
                    for network, to in networks:
                        pull_then_read(network, to, r)
                        on_demand(network, to, r)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    best = {k: min(v) for k, v in times.items()}
    base = best[("pulled copy", "-")]
    info = machine()
    order = "chunk order (shuffle=False)"
    if args.window is not None:
        order = f"shuffle=True, shuffle_window={args.window}"
    print(
        f"# yogadl_plus on demand: {info['cpus']} CPUs, {info['cpu_model']}; a version of "
        f"{total / 1e6:,.0f} MB in {len(chunks)} chunks (largest {largest / 1e6:.1f} MB), "
        f"local_cache_limit {limit / 1e6:,.0f} MB ({args.fraction:g} of it); stream "
        f"batch_size={args.batch_size}, {order}, {args.step_ms:g} ms of work per batch; "
        f"SeaweedFS on 127.0.0.1; max_transfers={args.transfers}; best of {args.repeats}, "
        f"alternating (build took {build_s:.1f} s)\n"
    )
    print(
        "| stream over | network | s | MB/s | ratio to pulled copy | ratio to pull, then read "
        "| fetches per chunk (max) | chunks fetched ahead | peak cache / limit |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (kind, network), seconds in best.items():
        row = rows.get(network) if kind == "on demand" else None
        versus = ""
        if kind == "on demand":
            versus = f"{best[('pull, then read', network)] / seconds:.2f}x"
        extra = "| | | |"
        if row is not None:
            extra = (
                f"| {max(row['fetches_per_chunk'])} | {min(row['ahead']):.0%} | "
                f"{max(row['peak']) / limit:.2f} |"
            )
            if row["missing"]:
                extra = f"| {row['missing']} chunks never fetched! | | |"
        print(
            f"| {kind} | {network} | {seconds:.2f} | {total / seconds / 1e6:,.0f} | "
            f"{base / seconds:.2f}x | {versus} {extra}"
        )
    write_json(
        args.json,
        {
            "bytes": total,
            "chunks": len(chunks),
            "limit": limit,
            "times_s": {f"{k[0]} ({k[1]})": v for k, v in times.items()},
            "rows": rows,
            "options": options,
        },
        info,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
