"""Before/after benchmark of the read and build hot paths, for a change to them (first written
for the integrity checks on every read). Two checkouts of yogadl_plus run the same rows on the
same data, alternately, in fresh processes, in one run:

    git worktree add /tmp/ydl-before <commit before the change>
    python -m bench.bench_integrity --before /tmp/ydl-before [--after .] [--rounds 3]

Each row is the best (minimum time) over every round of that checkout; the ratio is after/before
in throughput (1.00x: unchanged; below 1: slower). Page cache warm; nothing is read from disk.

Rows (S = 200,000 records of float32[64] + int64, 264 bytes; B = 3,000 records of uint8[96 KiB]
+ int64, in chunks of 8 MiB, so a shuffled batch touches dozens of chunks):
  S shuffled records       dataref.stream(shuffle=True), record by record, one epoch
  S shuffled batch256      the same in batches of 256
  S sequential batch256    shuffle=False, batches of 256 (LMDB cursor walks)
  S random getitem         dataref[i] for 50,000 random i
  S get_batch random256    dataref.get_batch(256 random indices), 400 times
  S fetch + first record   storage.fetch(...) then dataref[0], on a version already cached
  S build                  cache_dataset of the 200,000 records
  B shuffled batch64       shuffled batches of 64 big records (many chunks open)
  B shuffled records       shuffled, record by record
  S pool build, 2 workers  cache_dataset(<4 Parquet files of S>, workers=2): the process pool
  S torch loader ...       ydl.torch.make_dataloader, shuffled batches of 256, 2 worker processes
  S torch StreamSampler    the record indices of one shuffled epoch
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

from bench.harness import ROOT, SMOKE, alternate, call_in_tree, smoke, smoke_tree, timed, write_json

SMALL = smoke(200_000, 2_000)
BIG = smoke(3_000, 64)
BIG_BYTES = 96 << 10
ROWS = [
    ("S shuffled records", "records/s"),
    ("S shuffled batch256", "records/s"),
    ("S sequential batch256", "records/s"),
    ("S random getitem", "records/s"),
    ("S get_batch random256", "records/s"),
    ("S fetch + first record", "opens/s"),
    ("S build", "records/s"),
    ("B shuffled batch64", "records/s"),
    ("B shuffled records", "records/s"),
    ("S pool build, 2 workers", "records/s"),
    ("S torch loader batch256, 2 workers", "records/s"),
    ("S torch StreamSampler", "indices/s"),
]


# --------------------------------------------------------------------------- one checkout


def worker(data: str, repeats: int) -> dict[str, float]:
    """Times every row with the yogadl_plus this process imports; {row: best seconds per unit
    of work}."""
    import numpy as np

    import yogadl_plus as ydl

    def best(run: Any, count: int) -> float:
        return min(timed(run, repeats)) / count

    rng = np.random.default_rng(0)
    x = rng.standard_normal((SMALL, 64), dtype=np.float32)
    label = rng.integers(0, 1000, SMALL, dtype=np.int64)
    out: dict[str, float] = {}
    storage = ydl.LocalStorage(os.path.join(data, "store"))

    def small_records() -> Any:
        return ({"x": x[i], "label": label[i]} for i in range(SMALL))

    built = [0]

    def build() -> None:
        built[0] += 1
        ydl.cache_dataset(small_records, "s", f"b{built[0]}", storage, progress=False).close()

    out["S build"] = best(build, SMALL)
    ref = ydl.cache_dataset(small_records, "s", "v1", storage, progress=False)

    def epoch(**kwargs: Any) -> Any:
        return lambda: sum(1 for _ in ref.stream(**kwargs))

    ref.get_batch(np.arange(SMALL))  # warm
    out["S shuffled records"] = best(epoch(shuffle=True, shuffle_seed=0), SMALL)
    out["S shuffled batch256"] = best(epoch(shuffle=True, shuffle_seed=0, batch_size=256), SMALL)
    out["S sequential batch256"] = best(epoch(batch_size=256), SMALL)
    order = rng.permutation(SMALL)[:50_000].tolist()

    def getitem() -> None:
        for i in order:
            ref[i]

    out["S random getitem"] = best(getitem, len(order))
    batches = [rng.integers(0, SMALL, 256) for _ in range(400)]

    def get_batch() -> None:
        for indices in batches:
            ref.get_batch(indices)

    out["S get_batch random256"] = best(get_batch, 400 * 256)

    def fetch_first() -> None:
        for _ in range(200):
            opened = storage.fetch("s", "v1")
            opened[0]
            opened.close()

    out["S fetch + first record"] = best(fetch_first, 200)

    big = rng.integers(0, 255, (8, BIG_BYTES), dtype=np.uint8)
    big_ref = ydl.cache_dataset(
        lambda: ({"x": big[i % 8], "i": np.int64(i)} for i in range(BIG)),
        "b",
        "v1",
        storage,
        progress=False,
        chunk_bytes=8 << 20,
    )
    big_ref.get_batch(np.arange(BIG), fields=["x"])  # warm

    def big_epoch(**kwargs: Any) -> Any:
        return lambda: sum(1 for _ in big_ref.stream(shuffle=True, shuffle_seed=0, **kwargs))

    out["B shuffled batch64"] = best(big_epoch(batch_size=64), BIG)
    out["B shuffled records"] = best(big_epoch(), BIG)

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(x.reshape(-1), 64), "label": label})
    parquet = os.path.join(data, "parquet")
    os.makedirs(parquet)
    for part in range(4):
        rows = table.slice(part * SMALL // 4, SMALL // 4)
        pq.write_table(rows, os.path.join(parquet, f"part-{part}.parquet"), row_group_size=10_000)
    pool_builds = [0]

    def pool_build() -> None:
        pool_builds[0] += 1
        name = f"p{pool_builds[0]}"
        ydl.cache_dataset(parquet, "s", name, storage, progress=False, workers=2).close()

    out["S pool build, 2 workers"] = best(pool_build, SMALL)
    try:
        import torch  # noqa: F401
    except ImportError:
        return out
    loader = ydl.torch.make_dataloader(
        ref.stream(shuffle=True, shuffle_seed=0, batch_size=256), num_workers=2
    )
    out["S torch loader batch256, 2 workers"] = best(lambda: sum(1 for _ in loader), SMALL)
    sampler = ydl.torch.StreamSampler(ref, shuffle=True, shuffle_seed=0)
    out["S torch StreamSampler"] = best(lambda: sum(1 for _ in sampler), SMALL)
    return out


def run_checkout(library: str, repeats: int) -> dict[str, float]:
    """``worker`` in a fresh process that imports yogadl_plus from ``library``."""
    with tempfile.TemporaryDirectory(prefix="ydl-bench-integrity-") as data:
        result: dict[str, float] = call_in_tree(library, "bench_integrity", "worker", data, repeats)
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--before",
        required=not SMOKE,
        help="checkout of the code before the change (smoke mode: a copy of this one)",
    )
    parser.add_argument("--after", default=ROOT, help="checkout of the changed code (this one)")
    parser.add_argument("--rounds", type=int, default=smoke(3, 1), help="alternating rounds (3)")
    parser.add_argument("--repeats", type=int, default=smoke(3, 1), help="timings per row a round")
    parser.add_argument("--json", help="also write every timing here")
    args = parser.parse_args(argv)
    before = os.path.abspath(args.before) if args.before else smoke_tree()
    sides = {"before": before, "after": os.path.abspath(args.after)}
    timings = alternate(sides, args.rounds, lambda _, tree: run_checkout(tree, args.repeats))
    best = {
        side: {row: min(t[row] for t in runs) for row, _ in ROWS} for side, runs in timings.items()
    }
    print(f"\n{os.cpu_count()} CPUs, load average at the end {os.getloadavg()[0]:.2f}\n")
    print("| row | unit | before | after | after / before |")
    print("| --- | --- | ---: | ---: | ---: |")
    for row, unit in ROWS:
        before, after = 1 / best["before"][row], 1 / best["after"][row]
        print(f"| {row} | {unit} | {before:,.0f} | {after:,.0f} | {after / before:.2f}x |")
    write_json(args.json, {"trees": sides, "timings": timings, "best": best})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
