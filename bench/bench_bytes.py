"""Bytes at the speed of the machine: big records warm against memcpy, and cold reads against
the disk's own bandwidth, measured in the same run.

Warm (page cache hot): for values of 64 KiB, 96 KiB, 1 MiB and 4 MiB (uint8[size] + int64,
about --gib GiB each), a shuffled epoch record by record and in batches of 64, as bytes/s and as
a ratio to one numpy copy of a 512 MiB array into memory it already touched (memcpy).

Cold (--cold, needs root: it runs ``sync; echo 3 > /proc/sys/vm/drop_caches`` before each
run): the disk's random reads of the record's size and of 4 KiB at queue depth 1 and 16, and
its sequential 1 MiB reads at depth 16 (O_DIRECT preads from threads, fio's equivalent), then a
true global shuffle, a sequential pass (shuffle=False) and a shuffle of small (264 B) records,
each for --seconds, as a ratio to the matching disk figure.

    python -m bench.bench_bytes [--root DIR] [--gib 1] [--cold] [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import yogadl_plus as ydl
from bench.harness import count_for, smoke, warm

SIZES = smoke([64 << 10, 96 << 10, 1 << 20, 4 << 20], [64 << 10])
SMALL = 256  # + the int64: 264 B records
ROUNDS = smoke(3, 1)
MEMCPY_BYTES = smoke(512 << 20, 16 << 20)


def build(storage: ydl.LocalStorage, size: int, count: int) -> ydl.DataRef:
    schema = ydl.Schema([ydl.Field("x", np.uint8, (size,)), ydl.Field("y", np.int64)])

    def records():
        base = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
        for i in range(count):
            yield {"x": np.roll(base, i % 997), "y": np.int64(i)}

    return ydl.cache_dataset(
        records, "bytes", f"s{size}-n{count}", storage, schema=schema, progress=False
    )


def memcpy_rate() -> float:
    source = np.ones(MEMCPY_BYTES, np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)
    best = 0.0
    for _ in range(ROUNDS):
        start = time.perf_counter()
        np.copyto(target, source)
        best = max(best, source.nbytes / (time.perf_counter() - start))
    return best


def same_values_rate(ref: ydl.DataRef) -> float:
    """Bytes/s of numpy copying each record's stored value, in the stream's shuffled order, out
    of the chunk files' maps into an array of its own: the copy a reader cannot avoid, with
    nothing else around it (a loop of one ``np.frombuffer(...).copy()`` per record). Where the
    values lie comes from the LMDB page map the read-ahead uses."""
    from yogadl_plus.cache.pages import page_map

    maps, offsets, lengths = [], [], []
    for info in ref.manifest.chunks:
        path = os.path.join(ref.directory, info.file)
        with open(path, "rb") as f:
            maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            pages = page_map(f.fileno(), info.records)
        assert pages is not None, path
        where, length = pages.spans(np.arange(info.records))
        offsets.append(where.tolist())
        lengths.append(length.tolist())
    starts = np.cumsum([0] + [c.records for c in ref.manifest.chunks])
    order = ref.stream(shuffle=True, shuffle_seed=1).plan().indices(0, 0, len(ref))
    chunk = np.searchsorted(starts, order, side="right") - 1
    local = order - starts[chunk]
    total = 0
    start = time.perf_counter()
    for c, i in zip(chunk.tolist(), local.tolist()):
        n = lengths[c][i]
        np.frombuffer(maps[c], np.uint8, count=n, offset=offsets[c][i]).copy()
        total += n
    elapsed = time.perf_counter() - start
    for m in maps:
        m.close()
    return total / elapsed


def epoch_rate(ref: ydl.DataRef, seconds: float | None = None, **kwargs: Any) -> float:
    """Bytes/s of the records' fields handed out by a stream (stopped after ``seconds``)."""
    stream = ref.stream(**kwargs)
    size = ref.schema["x"].shape[0] + 8
    batched = kwargs.get("batch_size") is not None
    count, took = count_for(stream, seconds, (lambda b: len(b["y"])) if batched else None)
    return count * size / took


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def disk_rate(paths: list[str], block: int, depth: int, seconds: float, sequential: bool) -> float:
    """Bytes/s of O_DIRECT reads of ``block`` bytes by ``depth`` threads over ``paths``."""
    drop_caches()
    fds = [os.open(p, os.O_RDONLY | os.O_DIRECT) for p in paths]
    sizes = [os.fstat(fd).st_size // block for fd in fds]
    deadline = time.perf_counter() + seconds

    def reader(k: int) -> int:
        buffer = mmap.mmap(-1, block)
        rng = np.random.default_rng(k)
        done = 0
        position = k
        while time.perf_counter() < deadline:
            if sequential:
                file = (position * block) // (sizes[0] * block) % len(fds)
                offset = position % sizes[file]
                position += depth
            else:
                file = int(rng.integers(len(fds)))
                offset = int(rng.integers(sizes[file]))
            done += os.preadv(fds[file], [buffer], offset * block)
        return done

    start = time.perf_counter()
    with ThreadPoolExecutor(depth) as pool:
        total = sum(pool.map(reader, range(depth)))
    elapsed = time.perf_counter() - start
    for fd in fds:
        os.close(fd)
    return total / elapsed


def fio_rate(paths: list[str], block: int, depth: int, seconds: float, sequential: bool) -> float:
    """Bytes/s fio reads with O_DIRECT and libaio at queue ``depth`` over ``paths`` (the
    reference; disk_rate's threads are the fallback where fio is not installed)."""
    drop_caches()
    done = subprocess.run(
        [
            "fio",
            "--name=disk",
            f"--filename={':'.join(paths)}",
            "--readonly",
            "--direct=1",
            "--ioengine=libaio",
            f"--iodepth={depth}",
            f"--bs={block}",
            f"--rw={'read' if sequential else 'randread'}",
            f"--runtime={seconds:.0f}",
            "--time_based",
            "--output-format=json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(done.stdout)["jobs"][0]["read"]["bw_bytes"])


def chunk_paths(ref: ydl.DataRef) -> list[str]:
    return [os.path.join(ref.directory, c.file) for c in ref.manifest.chunks]


def hint_cost(storage: ydl.LocalStorage, gib: float) -> int:
    """Warm, in one process: two DataRefs of one version of 264 B records, one whose chunks get
    page hints (the default) and one whose do not, each with its page maps already built;
    three rounds of each row, alternating; the best of each."""
    import yogadl_plus.cache.readahead as readahead_module

    small = build(storage, SMALL, int(gib * (1 << 30) // 350))
    default = readahead_module.MIN_RECORD_BYTES
    refs = {}
    for hinted in (True, False):
        readahead_module.MIN_RECORD_BYTES = default if hinted else 4096
        refs[hinted] = storage.fetch(small.dataset_id, small.version)
        for _ in refs[hinted].stream(batch_size=4096, shuffle=True, shuffle_seed=9):
            pass  # the page maps (and a warm streak) are made
    readahead_module.MIN_RECORD_BYTES = default
    rows = {
        "shuffled, record by record": {"shuffle": True, "shuffle_seed": 1},
        "sequential batches of 256": {"batch_size": 256},
        "shuffled batches of 256": {"batch_size": 256, "shuffle": True, "shuffle_seed": 1},
    }
    print(f"\nWarm, {len(small)} records of 264 B: hinted / not hinted (best of 3, alternating)\n")
    print("| row | hinted | not hinted | ratio |\n| --- | ---: | ---: | ---: |")
    for name, kwargs in rows.items():
        best = {True: 0.0, False: 0.0}
        for _ in range(ROUNDS):
            warm(small.directory)
            for hinted in (True, False):
                best[hinted] = max(best[hinted], epoch_rate(refs[hinted], **kwargs))
        print(
            f"| {name} | {best[True] / 1e6:.0f} MB/s | {best[False] / 1e6:.0f} MB/s "
            f"| {best[True] / best[False]:.2f}x |"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/ydl-bench-bytes")
    parser.add_argument("--gib", type=float, default=smoke(1.0, 0.01), help="GiB per warm dataset")
    parser.add_argument("--cold", action="store_true", help="cold runs (root: drops caches)")
    parser.add_argument("--cold-gib", type=float, default=4.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--no-warm", action="store_true", help="only the cold runs")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument(
        "--hint-cost", action="store_true", help="only what small-record hints cost warm"
    )
    args = parser.parse_args()
    if args.hint_cost:
        return hint_cost(ydl.LocalStorage(args.root), args.gib)
    storage = ydl.LocalStorage(args.root)
    print(f"yogadl_plus from {os.path.dirname(ydl.__file__)}")
    print("\nWarm, shuffled: bytes/s against a numpy copy of a 512 MiB array into memory it")
    print("already touched (memcpy), and against numpy copying the same stored values out of the")
    print("chunk files in the same order (same values); each measured in every round next to")
    print("the reads; best of 3 rounds\n")
    print(
        "| value | records | memcpy | same values | record by record | / memcpy | / same values "
        "| batches of 64 | / memcpy | / same values |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in [] if args.no_warm else [int(s) for s in args.sizes.split(",")]:
        count = max(64, int(args.gib * (1 << 30) // size))
        ref = build(storage, size, count)
        memcpy = same = records = batches = 0.0
        for _ in range(ROUNDS):
            warm(ref.directory)
            memcpy = max(memcpy, memcpy_rate())
            same = max(same, same_values_rate(ref))
            records = max(records, epoch_rate(ref, shuffle=True, shuffle_seed=1))
            batches = max(batches, epoch_rate(ref, shuffle=True, shuffle_seed=1, batch_size=64))
        print(
            f"| {size >> 10} KiB | {count} | {memcpy / 1e9:.1f} GB/s | {same / 1e9:.1f} GB/s "
            f"| {records / 1e9:.2f} GB/s | {records / memcpy:.2f}x | {records / same:.2f}x "
            f"| {batches / 1e9:.2f} GB/s | {batches / memcpy:.2f}x | {batches / same:.2f}x |"
        )
    if not args.cold:
        return 0
    if os.geteuid() != 0:
        print("\n--cold needs root (it drops the page cache); skipped")
        return 0
    size = 100 << 10
    big = build(storage, size, int(args.cold_gib * (1 << 30) // size))
    # Many more small records than a run reads, so that few share a leaf page with an earlier one.
    small = build(storage, SMALL, int(args.cold_gib * (1 << 30) // 300))
    seconds = args.seconds
    paths = chunk_paths(big)
    measure = fio_rate if shutil.which("fio") else disk_rate
    disk = {
        "random 100 KiB, depth 16": measure(paths, size, 16, seconds, False),
        "random 100 KiB, depth 1": measure(paths, size, 1, seconds, False),
        "sequential 1 MiB, depth 16": measure(paths, 1 << 20, 16, seconds, True),
        "random 4 KiB, depth 16": measure(chunk_paths(small), 4096, 16, seconds, False),
    }
    how = "fio, O_DIRECT, libaio" if measure is fio_rate else "O_DIRECT preads from threads"
    print(f"\nThe disk ({how})\n")
    for name, rate in disk.items():
        print(f"- {name}: {rate / 1e6:.0f} MB/s")

    import yogadl_plus.cache.readahead as readahead_module
    import yogadl_plus.stream.units as units_module

    defaults = (units_module.READ_AHEAD_BYTES, readahead_module.MIN_RECORD_BYTES)

    def cold(ref: ydl.DataRef, ahead: str = "default", **kwargs) -> float:
        """``ahead``: "default", "off" (no read-ahead, as the code once read), "big" (only
        records of 4 KiB or more hinted, as before small records were)."""
        units_module.READ_AHEAD_BYTES = 0 if ahead == "off" else defaults[0]
        readahead_module.MIN_RECORD_BYTES = 4096 if ahead == "big" else defaults[1]
        try:
            drop_caches()
            fresh = storage.fetch(ref.dataset_id, ref.version)
            return epoch_rate(fresh, seconds, **kwargs)
        finally:
            units_module.READ_AHEAD_BYTES, readahead_module.MIN_RECORD_BYTES = defaults

    shuffled = {"shuffle": True, "shuffle_seed": 1}
    rows = [
        ("true global shuffle, 100 KiB", cold(big, **shuffled), "random 100 KiB, depth 16", size),
        ("... without read-ahead", cold(big, "off", **shuffled), "random 100 KiB, depth 16", size),
        ("sequential (shuffle=False), 100 KiB", cold(big), "sequential 1 MiB, depth 16", size),
        ("... without read-ahead", cold(big, "off"), "sequential 1 MiB, depth 16", size),
        (
            "shuffle_window=4, 100 KiB",
            cold(big, shuffle_window=4, **shuffled),
            "random 100 KiB, depth 16",
            size,
        ),
        ("true global shuffle, 264 B", cold(small, **shuffled), "random 4 KiB, depth 16", SMALL),
        (
            "... small records not hinted",
            cold(small, "big", **shuffled),
            "random 4 KiB, depth 16",
            SMALL,
        ),
    ]
    print("\nCold (page cache dropped before each run)\n")
    print("| path | records/s | MB/s | against | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for name, rate, against, record in rows:
        record += 8  # the int64
        base = disk[against]
        # Small records: records/s against the disk's 4 KiB reads per second.
        ratio = (rate / record) / (base / 4096) if record < 4096 else rate / base
        print(f"| {name} | {rate / record:.0f} | {rate / 1e6:.0f} | {against} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
