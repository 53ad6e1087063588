"""How the bookkeeping scales: opening a version of 10^8 records in 10^4 chunks, its first
item and batch (warm or cold) and its memory, against a 10^6-record version of the same shape,
in one run.

    python -m bench.bench_scale                  # 10^8 records in 10^4 chunks vs 10^6 in 100
    python -m bench.bench_scale --quick          # 10^7 in 10^3 chunks vs 10^5 in 10
    python -m bench.bench_scale --keep DIR       # build into DIR once, reuse it on later runs
    python -m bench.bench_scale --keep DIR --cold           # page cache dropped before each row
    python -m bench.bench_scale --keep DIR --only batch     # only the rows whose name has "batch"
    python -m bench.bench_scale --tree CHECKOUT --keep DIR   # measure another checkout

The versions hold records ``{"i": int64}`` whose value is their own index, 10^4 records per
chunk. Every chunk is a real chunk file written by the library's own ChunkWriter (the same
bytes, identity entry, column array, checksum and stamp as ``cache_dataset`` writes), two
processes writing one part each as a parallel build does, and published by
``LocalStorage.get_or_build``: the manifest names every chunk and every chunk is on disk, so a
read anywhere (a random first item, a large offset) opens and checks a real chunk. Only the
encoding differs from ``cache_dataset``: the values are int64 bytes made by numpy (checked equal
to what RecordLayout encodes), which is what keeps a 10^8-record build near a minute instead of
several (10^8 records take about 3.2 GB).

Each row runs in a fresh process, after the same operation ran once on a small 8-chunk version (so
lazy imports and first calls are out of both sizes' figures), with the manifest and the chunks
it reads read into the page cache just before (some VMs, this one included, page idle file pages
out within seconds: warming whole versions once would not do). Time is the best of
``--repeats`` processes; RSS growth is the process's resident memory after the operation minus
before it, anonymous and file-backed (the LMDB maps' pages) apart; tracemalloc peak the most
Python and numpy memory held at once during it (measured in other processes, since tracing
slows allocation), and "kept" what it still holds afterwards. Ratios are big / small.

``--cold`` (root only; it skips otherwise) drops the page cache (``sync; echo 3 >
/proc/sys/vm/drop_caches``) right before each timed row instead of warming, so that the row
reads the manifest (rows from ``storage.fetch``) and every chunk it opens from the disk. The
memory table is left out: it does not depend on the cache.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import shutil
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.bench_bytes import drop_caches
from bench.harness import (
    checkout_of,
    last_json_line,
    rerun_in_tree,
    run_bench,
    skip,
    smoke,
    warm,
    write_json,
)

CHUNK_RECORDS = 10_000
DATASET = "scale"
VERSION = "v1"
WARM_ID = "scale-warm"
WARM_RECORDS = 8 * CHUNK_RECORDS  # 8 chunks: enough for 8 shards by chunks
SEED = 1

# --------------------------------------------------------------------------- building


def _schema() -> Any:
    import yogadl_plus as ydl

    return ydl.Schema([ydl.Field("i", np.int64)])


def _write_part(job: tuple[str, int, int, int]) -> list[Any]:
    """Chunks [first, stop) of the version, ``CHUNK_RECORDS`` records each, as part ``part``."""
    from yogadl_plus.cache.keys import KEY_BYTES
    from yogadl_plus.cache.manifest import schema_digest
    from yogadl_plus.cache.version_writer import build_of
    from yogadl_plus.cache.writer import ChunkWriter
    from yogadl_plus.storage.sink import part_prefix

    folder, part, first, stop = job
    prefix = part_prefix(part, uuid.uuid4().hex[:8])
    # Each chunk fills up after exactly CHUNK_RECORDS 8-byte values.
    size = CHUNK_RECORDS * (8 + KEY_BYTES)
    digest = schema_digest(_schema())
    with ChunkWriter(folder, size, prefix, schema=digest, build=build_of(folder)) as writer:
        for chunk in range(first, stop):
            values = np.arange(chunk * CHUNK_RECORDS, (chunk + 1) * CHUNK_RECORDS, dtype=np.int64)
            raw = values.tobytes()
            writer.add_many([raw[j : j + 8] for j in range(0, len(raw), 8)], {"i": values})
    assert all(c.records == CHUNK_RECORDS for c in writer.chunks)
    return writer.chunks


def build(root: str, dataset: str, records: int, workers: int) -> float:
    """Publish ``dataset`` of ``records`` records in ``root`` unless it is there; seconds taken."""
    import yogadl_plus as ydl
    from yogadl_plus.cache.layout import RecordLayout
    from yogadl_plus.cache.manifest import Manifest
    from yogadl_plus.cache.version_writer import build_of

    storage = ydl.LocalStorage(root)
    if (dataset, VERSION) in storage.list():
        return 0.0
    assert records % CHUNK_RECORDS == 0, "records must be a multiple of the chunk's records"
    layout = RecordLayout(_schema())
    assert layout.encode({"i": np.int64(12345)}, 0) == np.int64(12345).tobytes()
    chunks = records // CHUNK_RECORDS
    parts = max(1, min(workers, chunks))
    bounds = np.linspace(0, chunks, parts + 1).astype(int).tolist()

    def write(folder: str) -> Manifest:
        jobs = [(folder, p, bounds[p], bounds[p + 1]) for p in range(parts)]
        if parts == 1:
            written = [_write_part(jobs[0])]
        else:
            with multiprocessing.get_context("fork").Pool(parts) as pool:
                written = pool.map(_write_part, jobs)
        manifest = Manifest(
            dataset_id=dataset,
            version=VERSION,
            schema=_schema(),
            chunks=[c for part in written for c in part],
            source_kind="bench_scale",
            library_version=ydl.__version__,
            build=build_of(folder),
        )
        manifest.write(folder)
        return manifest

    start = time.perf_counter()
    storage.get_or_build(dataset, VERSION, write)
    return time.perf_counter() - start


# --------------------------------------------------------------------------- the operations

# row -> (what it runs, the stream's arguments for a version of n records). "open", the parse and
# "fetch_first" (from storage.fetch through the first item) start from the storage; the others
# from a DataRef opened before the timing.


SHUFFLED = {"shuffle": True, "shuffle_seed": SEED}


OPS: dict[str, tuple[str, Callable[[int], dict[str, Any]] | None]] = {
    "storage.fetch (open the version)": ("open", None),
    "  of which: manifest parse + checks": ("parse", None),
    "  of which: DataRef(folder, manifest)": ("dataref", None),
    "first item, shuffle=True": ("first", lambda n: SHUFFLED),
    "first item, start_offset=0.9N": (
        "first",
        lambda n: {**SHUFFLED, "start_offset": int(0.9 * n) + 7},
    ),
    "first item, 8 shards, global_start=0.9N": (
        "first",
        lambda n: {
            **SHUFFLED,
            "num_shards": 8,
            "shard_rank": 3,
            "global_start": int(0.9 * n) + 7,
        },
    ),
    "first item, 8 shards by chunks": (
        "first",
        lambda n: {**SHUFFLED, "num_shards": 8, "shard_rank": 3, "shard_by": "chunks"},
    ),
    "first batch of 256, shuffle=True": (
        "first",
        lambda n: {**SHUFFLED, "batch_size": 256},
    ),
    "fetch + first batch of 256, shuffle=True": (
        "fetch_first",
        lambda n: {**SHUFFLED, "batch_size": 256},
    ),
    "first batch of 256, num_workers=2 (processes)": (
        "first",
        lambda n: {**SHUFFLED, "batch_size": 256, "num_workers": 2, "worker_type": "process"},
    ),
    "ref[i], random i": ("getitem", None),
    "stream.state()": ("state", None),
    "pickle a DataRef (for a worker process)": ("pickle", None),
    "unpickle it (in the worker)": ("unpickle", None),
}


def _rss() -> tuple[int, int]:
    """This process's resident memory: (anonymous, file-backed) bytes. File-backed pages are
    the LMDB maps' (the page cache, shared and reclaimable); anonymous ones its own."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                found[key] = int(value.split()[0]) * 1024
    return found["RssAnon"], found["RssFile"]


Prepared = tuple[Callable[[], Any], Callable[[Any], None], list[int]]


def _prepare(kind: str, root: str, dataset: str, args: dict[str, Any]) -> Prepared:
    """What is timed for one row, everything it needs already made; the check of what it
    returned (records hold their own index, so a wrong record is seen), run after the timing;
    and the records it reads (their chunks are read into the page cache just before)."""
    import yogadl_plus as ydl
    from yogadl_plus.cache.manifest import MANIFEST_NAME, Manifest
    from yogadl_plus.dataref import DataRef

    storage = ydl.LocalStorage(root)
    folder = storage.path(dataset, VERSION)
    path = os.path.join(folder, MANIFEST_NAME)
    with open(path, "rb") as f:
        data = f.read()

    def same_ref(ref: Any) -> None:
        _check(ref[len(ref) - 1]["i"], len(ref) - 1)

    if kind == "open":
        return lambda: storage.fetch(dataset, VERSION), same_ref, [0]
    if kind == "parse":
        return lambda: Manifest.parse(data, path), lambda m: _check(len(m.chunks) > 0, True), []
    if kind == "dataref":
        manifest = Manifest.parse(data, path)
        return lambda: DataRef(folder, manifest), same_ref, [0]
    ref = storage.fetch(dataset, VERSION)
    if kind in ("first", "fetch_first"):
        stream = ref.stream(**args)
        epoch, position = stream.next_epoch_position
        # What the first item reads: one unit of records (32) or the batch.
        want = stream.plan().indices(epoch, position, position + args.get("batch_size", 32))
        del stream

        def first_is_right(item: Any) -> None:
            _check(np.atleast_1d(item["i"]), want[: len(np.atleast_1d(item["i"]))])

        if kind == "fetch_first":
            del ref  # (this row opens the version itself)
            return (
                lambda: next(iter(storage.fetch(dataset, VERSION).stream(**args))),
                first_is_right,
                want.tolist(),
            )
        return lambda: next(iter(ref.stream(**args))), first_is_right, want.tolist()
    if kind == "getitem":
        i = int(np.random.default_rng(SEED).integers(len(ref)))
        return lambda: ref[i], lambda record: _check(record["i"], i), [i]
    if kind == "state":
        stream = ref.stream(shuffle=True, shuffle_seed=SEED)
        return stream.state, lambda state: _check(state.offset, 0), []
    if kind == "pickle":
        return lambda: pickle.dumps(ref), lambda blob: same_ref(pickle.loads(blob)), []
    if kind == "unpickle":
        blob = pickle.dumps(ref)
        return lambda: pickle.loads(blob), same_ref, [0]
    raise ValueError(kind)


def _warm_chunks(root: str, dataset: str, records: list[int]) -> None:
    """Read the manifest and the chunk files (with their stamps) holding ``records`` into the
    page cache. (Some VMs page idle file pages out within seconds: this one's DAMON does.)"""
    from yogadl_plus.cache.manifest import MANIFEST_NAME, Manifest

    folder = os.path.join(root, dataset, VERSION)
    manifest = Manifest.read(folder)
    starts = np.cumsum([c.records for c in manifest.chunks])
    numbers = np.unique(np.searchsorted(starts, np.asarray(records, dtype=np.int64), "right"))
    paths = [os.path.join(folder, MANIFEST_NAME)]
    for number in numbers.tolist():
        path = os.path.join(folder, manifest.chunks[number].file)
        paths += [path, path + ".verified"]
    for path in paths:
        if os.path.exists(path):  # a stamp may be missing (it only saves a hash)
            warm(path)


def _check(value: Any, want: Any) -> None:
    if not np.array_equal(value, want):
        raise AssertionError(f"read {value}, expected {want}: wrong data")


def run_row(
    row: str, root: str, dataset: str, records: int, trace: bool, cold: bool
) -> dict[str, Any]:
    kind, make_args = OPS[row]
    warm_args = make_args(WARM_RECORDS) if make_args else {}
    run, check, _ = _prepare(kind, root, WARM_ID, warm_args)
    check(run())  # one-time costs (lazy imports, first calls) out of the figures
    args = make_args(records) if make_args else {}
    run, check, reads = _prepare(kind, root, dataset, args)
    if cold:
        drop_caches()
    else:
        _warm_chunks(root, dataset, reads)
    out: dict[str, Any] = {}
    if trace:
        tracemalloc.start()
        result = run()
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out.update(peak=peak, kept=current)
    else:
        before = _rss()
        start = time.perf_counter()
        result = run()
        out["seconds"] = time.perf_counter() - start
        after = _rss()
        out["rss_anon"], out["rss_file"] = after[0] - before[0], after[1] - before[1]
    check(result)
    if kind == "pickle":
        out["bytes"] = len(result)
    del result
    return out


def in_fresh_process(
    row: str, root: str, dataset: str, records: int, trace: bool, cold: bool
) -> dict[str, Any]:
    """``run_row`` in a fresh process, with the yogadl_plus this one imported."""
    import yogadl_plus

    args = ["--child", row, "--root", root, "--dataset", dataset, "--records", str(records)]
    args += ["--trace"] if trace else []
    args += ["--cold"] if cold else []
    tree = checkout_of(yogadl_plus.__file__)
    done = run_bench("bench_scale", *args, tree=tree)
    if done.returncode:
        raise RuntimeError(f"row {row!r} failed:\n{done.stderr}")
    result: dict[str, Any] = last_json_line(done.stdout)
    return result


# --------------------------------------------------------------------------- the table


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def _mib(size: float) -> str:
    return f"{size / 2**20:,.2f} MiB"


def _ratio(big: float, small: float) -> str:
    return f"{big / small:,.1f}x" if small > 0 else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--big", type=int, default=smoke(100_000_000, 160_000), help="records of the big version"
    )
    parser.add_argument(
        "--small", type=int, default=smoke(1_000_000, 80_000), help="records of the small one"
    )
    parser.add_argument("--quick", action="store_true", help="--big 10^7 --small 10^5")
    parser.add_argument("--repeats", type=int, default=smoke(3, 1))
    parser.add_argument("--tree", help="measure this checkout's yogadl_plus (default: this one)")
    parser.add_argument("--workers", type=int, default=2, help="processes writing the chunks")
    parser.add_argument("--keep", help="build into (and reuse) this folder; kept at the end")
    parser.add_argument("--tmp", default=None, help="parent of the temporary folder")
    parser.add_argument("--json", help="also write every figure here")
    parser.add_argument(
        "--cold", action="store_true", help="drop the page cache before each row (root only)"
    )
    parser.add_argument("--only", help="only the rows whose name holds this text")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--records", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = run_row(args.child, args.root, args.dataset, args.records, args.trace, args.cold)
        print(json.dumps(result))
        return
    if args.cold and os.geteuid() != 0:
        skip("--cold needs root (it drops the page cache)")
    if args.quick:
        args.big, args.small = 10_000_000, 100_000
    if args.tree:
        # The whole run (build, table and rows) with that checkout: this script, run again there
        # (from a folder of its own: the paths it is given become absolute).
        again = ["--big", str(args.big), "--small", str(args.small)]
        again += ["--repeats", str(args.repeats), "--workers", str(args.workers)]
        again += ["--cold"] if args.cold else []
        again += ["--only", args.only] if args.only else []
        for option in ("keep", "tmp", "json"):
            if getattr(args, option):
                again += [f"--{option}", os.path.abspath(getattr(args, option))]
        rerun_in_tree("bench_scale", args.tree, again)
    root = args.keep or tempfile.mkdtemp(prefix="ydl-bench-scale-", dir=args.tmp)
    try:
        report(args, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def report(args: argparse.Namespace, root: str) -> None:
    from yogadl_plus.cache.manifest import MANIFEST_NAME
    from yogadl_plus.storage.local import LocalStorage

    sizes = {"small": args.small, "big": args.big}
    ids = {label: f"{DATASET}-{n}" for label, n in sizes.items()}
    build(root, WARM_ID, WARM_RECORDS, 1)
    built = {label: build(root, ids[label], n, args.workers) for label, n in sizes.items()}
    storage = LocalStorage(root)
    facts: dict[str, dict[str, Any]] = {}
    for label, n in sizes.items():
        folder = storage.path(ids[label], VERSION)
        chunk_bytes = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs
        )
        facts[label] = {
            "records": n,
            "chunks": n // CHUNK_RECORDS,
            "manifest_bytes": os.path.getsize(os.path.join(folder, MANIFEST_NAME)),
            "folder_bytes": chunk_bytes,
            "build_seconds": built[label],
        }
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for label, n in sizes.items():
        for row in OPS:
            if args.only and args.only not in row:
                continue
            runs = [
                in_fresh_process(row, root, ids[label], n, False, args.cold)
                for _ in range(args.repeats)
            ]
            traced = {} if args.cold else in_fresh_process(row, root, ids[label], n, True, False)
            rows.setdefault(row, {})[label] = {
                "seconds": min(r["seconds"] for r in runs),
                "rss_anon": max(r["rss_anon"] for r in runs),
                "rss_file": max(r["rss_file"] for r in runs),
                "peak": traced.get("peak"),
                "kept": traced.get("kept"),
                "bytes": runs[0].get("bytes"),
                "runs": runs,
            }
    small, big = facts["small"], facts["big"]
    print(
        f"\nbig: {big['records']:,} records in {big['chunks']:,} chunks; "
        f"small: {small['records']:,} records in {small['chunks']:,} chunks "
        f"({CHUNK_RECORDS:,} records of int64 per chunk)\n"
    )
    print("| | small | big | big / small |")
    print("|---|---:|---:|---:|")
    print(
        f"| manifest on disk | {_mib(small['manifest_bytes'])} | {_mib(big['manifest_bytes'])} "
        f"| {_ratio(big['manifest_bytes'], small['manifest_bytes'])} |"
    )
    print(
        f"| version on disk | {_mib(small['folder_bytes'])} | {_mib(big['folder_bytes'])} "
        f"| {_ratio(big['folder_bytes'], small['folder_bytes'])} |"
    )
    for row, by in rows.items():
        s, b = by["small"], by["big"]
        if s["bytes"] is not None:
            print(
                f"| {row}: pickled size | {_mib(s['bytes'])} | {_mib(b['bytes'])} | "
                f"{_ratio(b['bytes'], s['bytes'])} |"
            )
    cache = "cold: page cache dropped before each row" if args.cold else "warm page cache"
    print(f"\n| operation ({cache}) | time, small | time, big | big / small |")
    print("|---|---:|---:|---:|")
    for row, by in rows.items():
        s, b = by["small"], by["big"]
        print(
            f"| {row} | {_ms(s['seconds'])} | {_ms(b['seconds'])} | "
            f"{_ratio(b['seconds'], s['seconds'])} |"
        )
    if args.cold:
        write_json(args.json, {"versions": facts, "rows": rows, "cold": True})
        return
    print(
        "\n| operation | tracemalloc peak, small | big | big / small | kept after, big "
        "| RSS anon growth, small | big | RSS file growth, big |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row, by in rows.items():
        s, b = by["small"], by["big"]
        print(
            f"| {row} | {_mib(s['peak'])} | {_mib(b['peak'])} | {_ratio(b['peak'], s['peak'])} "
            f"| {_mib(b['kept'])} | {_mib(s['rss_anon'])} | {_mib(b['rss_anon'])} "
            f"| {_mib(b['rss_file'])} |"
        )
    write_json(args.json, {"versions": facts, "rows": rows})


if __name__ == "__main__":
    main()
