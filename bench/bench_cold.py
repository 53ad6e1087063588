"""Cold reads against the disk's own limits: a stream over 1 GiB of 256 KiB records, the page
cache dropped before each run, against fio on the very chunk files in the same run.

The disk (fio, O_DIRECT, libaio, the cache's own chunk files): random reads of the record's
size at queue depths 1, 2, 4, 8, 16 and 32, and sequential 1 MiB reads at depth 1 and 16. Then
three cold streams, each a whole epoch in a fresh process (as a job starts): a true global
shuffle record by record (``shuffle=True``, no window), the same in batches of 16, and the
sequential pass (``shuffle=False``). The shuffles are given against fio's best random figure,
the sequential pass against its best sequential one. The ceiling of the true shuffle: fio
replaying its very reads (each record's pages, in the stream's order) at depths 1, 8 and 32.
Rounds alternate (the disk, then the streams, again), best of each: this virtual disk varies
from run to run. ``--tree CHECKOUT`` adds the streams of another checkout, in the same rounds
(before/after).

Needs root (``sync; echo 3 > /proc/sys/vm/drop_caches`` before every run) and fio; it says
why and stops where either is missing.

    sudo python -m bench.bench_cold [--root /tmp/ydl-bench-cold] [--rounds 3] [--seconds 4]
                                    [--tree CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

import numpy as np

from bench.bench_bytes import chunk_paths, drop_caches, fio_rate
from bench.harness import call_in_tree, skip, smoke

RECORD = 256 << 10  # an image of 512 x 512 bytes, and an int64
RECORDS = smoke(4096, 64)  # 1 GiB
RANDOM_DEPTHS = smoke([1, 2, 4, 8, 16, 32], [16])
SEQUENTIAL_DEPTHS = smoke([1, 16], [16])
REPLAY_DEPTHS = smoke([1, 8, 32], [8])
SHUFFLE = "true global shuffle, record by record"
STREAMS = {
    "true global shuffle, record by record": {"shuffle": True, "shuffle_seed": 1},
    "true global shuffle, batches of 16": {"shuffle": True, "shuffle_seed": 1, "batch_size": 16},
    "sequential (shuffle=False), record by record": {},
}


def build(root: str) -> Any:
    """The version read: RECORDS records of a 512 x 512 uint8 image and an int64 (built once,
    then reused)."""
    import yogadl_plus as ydl

    storage = ydl.LocalStorage(root)
    version = f"n{RECORDS}"
    if ("cold", version) in storage.list():
        return storage.fetch("cold", version)
    schema = ydl.Schema([ydl.Field("x", np.uint8, (512, 512)), ydl.Field("y", np.int64)])

    def records():
        base = np.random.default_rng(0).integers(0, 255, (512, 512), dtype=np.uint8)
        for i in range(RECORDS):
            yield {"x": np.roll(base, i % 997, axis=1), "y": np.int64(i)}

    return ydl.cache_dataset(records, "cold", version, storage, schema=schema, progress=False)


def cold_stream(root: str, version: str, kwargs: dict[str, Any]) -> float:
    """Bytes/s of one whole epoch of ``stream(**kwargs)``, cold (run in a fresh process, as a
    job starts). A first item is read before the page cache is dropped, so that the modules
    a stream imports are not read from the cold disk inside the time."""
    import yogadl_plus as ydl

    storage = ydl.LocalStorage(root)
    ref = storage.fetch("cold", version)
    next(iter(ref.stream(**kwargs)))
    ref.close()
    drop_caches()
    started = time.perf_counter()
    ref = storage.fetch("cold", version)
    batched = kwargs.get("batch_size") is not None
    count = 0
    for item in ref.stream(**kwargs):
        count += len(item["y"]) if batched else 1
    elapsed = time.perf_counter() - started
    assert count == len(ref), (count, len(ref))
    return count * (ref.schema["x"].nbytes + 8) / elapsed


def replay_rate(ref: Any, kwargs: dict[str, Any], depth: int, folder: str) -> float:
    """Bytes/s of records fio reads when it replays, cold, with O_DIRECT at queue ``depth``,
    the very reads a stream of ``kwargs`` makes: each record's value (its pages, 4 KiB
    aligned), in the stream's order of its first epoch. The ceiling of that stream on this
    disk: the same bytes, in the same order, with nothing but the disk between."""
    import yogadl_plus as ydl
    from yogadl_plus.cache.integrity import FileState
    from yogadl_plus.cache.pagemap import map_values

    stream = (
        ydl.LocalStorage(os.path.dirname(os.path.dirname(ref.directory)))
        .fetch("cold", ref.version)
        .stream(**kwargs)
    )
    order = stream.plan().indices(0, 0, len(ref))
    paths = chunk_paths(ref)
    starts = np.cumsum([0] + [c.records for c in ref.manifest.chunks])
    lines = ["fio version 2 iolog"] + [f"{path} add" for path in paths]
    lines += [f"{path} open" for path in paths]
    maps = []
    for number, path in enumerate(paths):
        st = os.stat(path)
        state = FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

        def value(i: int, first: int = int(starts[number])) -> bytes:
            record = ref[first + i]
            return record["x"].tobytes() + record["y"].tobytes()

        found = map_values(path, state, ref.manifest.chunks[number].records, value)
        assert found is not None, f"{path}: no value map"
        maps.append(found)
    chunk = np.searchsorted(starts, order, side="right") - 1
    for c, index in zip(chunk.tolist(), order.tolist()):
        found = maps[c]
        first = int(found.offsets[index - starts[c]])
        begin, end = first // 4096 * 4096, -(-(first + found.size) // 4096) * 4096
        lines.append(f"{paths[c]} read {begin} {end - begin}")
    lines += [f"{path} close" for path in paths]
    log = os.path.join(folder, "replay.iolog")
    with open(log, "w") as f:
        f.write("\n".join(lines) + "\n")
    drop_caches()
    done = subprocess.run(
        ["fio", "--name=replay", f"--read_iolog={log}", "--replay_no_stall=1", "--readonly",
         "--direct=1", "--ioengine=libaio", f"--iodepth={depth}", "--output-format=json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    runtime = json.loads(done.stdout)["jobs"][0]["read"]["runtime"] / 1000
    return len(order) * (ref.schema["x"].nbytes + 8) / runtime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/ydl-bench-cold")
    parser.add_argument("--rounds", type=int, default=smoke(3, 1))
    parser.add_argument("--seconds", type=float, default=smoke(4.0, 1.0), help="per fio run")
    parser.add_argument("--tree", help="another checkout whose streams to run too")
    args = parser.parse_args()
    if os.geteuid() != 0:
        skip("needs root: it drops the page cache before every run")
    if shutil.which("fio") is None:
        skip("needs fio (Debian: apt-get install fio)")
    root = os.path.abspath(args.root)
    ref = build(root)
    paths = chunk_paths(ref)
    disk = {f"random 256 KiB, depth {d}": (RECORD, d, False) for d in RANDOM_DEPTHS}
    disk |= {f"sequential 1 MiB, depth {d}": (1 << 20, d, True) for d in SEQUENTIAL_DEPTHS}
    trees = {"this checkout": None} | ({"--tree": args.tree} if args.tree else {})
    best: dict[tuple[str, str], float] = {}
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}/{args.rounds}", flush=True)
        for name, (block, depth, sequential) in disk.items():
            rate = fio_rate(paths, block, depth, args.seconds, sequential)
            best["fio", name] = max(best.get(("fio", name), 0.0), rate)
        for name, kwargs in STREAMS.items():
            for side, tree in trees.items():
                rate = call_in_tree(tree, "bench_cold", "cold_stream", root, ref.version, kwargs)
                best[side, name] = max(best.get((side, name), 0.0), rate)
        with tempfile.TemporaryDirectory() as folder:
            for depth in REPLAY_DEPTHS:
                rate = replay_rate(ref, STREAMS[SHUFFLE], depth, folder)
                best["replay", str(depth)] = max(best.get(("replay", str(depth)), 0.0), rate)
    report(best, disk, trees, len(ref))
    return 0


def report(
    best: dict[tuple[str, str], float], disk: dict[str, Any], trees: dict[str, Any], records: int
) -> None:
    """The tables: the disk, then the streams against its best figures."""
    print("\nThe disk: fio, O_DIRECT, libaio, over the chunk files, best of the rounds\n")
    print("| reads | MB/s | IOPS |\n| --- | ---: | ---: |")
    for name, (block, _, _) in disk.items():
        rate = best["fio", name]
        print(f"| {name} | {rate / 1e6:,.0f} | {rate / block:,.0f} |")
    random = max((best["fio", n], n) for n in disk if n.startswith("random"))
    sequential = max((best["fio", n], n) for n in disk if n.startswith("sequential"))
    print(f"\nCold streams over {records} records of 256 KiB, page cache dropped before each\n")
    header = " | ".join(f"{side}: MB/s | records/s | / the disk" for side in trees)
    print(f"| stream | {header} | against |")
    print("| --- |" + " ---: | ---: | ---: |" * len(trees) + " --- |")
    for name in STREAMS:
        against = sequential if name.startswith("sequential") else random
        cells = []
        for side in trees:
            rate = best[side, name]
            cells.append(f"{rate / 1e6:,.0f} | {rate / RECORD:,.0f} | {rate / against[0]:.2f}x")
        print(f"| {name} | {' | '.join(cells)} | {against[1]} |")
    print(f"\nThe ceiling: fio replaying the reads of the {SHUFFLE} (each record's pages, in\n"
          "its order; O_DIRECT, libaio, the page cache dropped), and this checkout's stream "
          "against it\n")  # fmt: skip
    print("| replay | MB/s | the stream / it |\n| --- | ---: | ---: |")
    for depth in REPLAY_DEPTHS:
        rate = best["replay", str(depth)]
        ratio = best["this checkout", SHUFFLE] / rate
        print(f"| depth {depth} | {rate / 1e6:,.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    raise SystemExit(main())
