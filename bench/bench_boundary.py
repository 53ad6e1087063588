"""Boundary benchmark: transforms in worker processes, and a selective predicate that never
touches a large field. Optionally Petastorm 0.13.1's make_reader on the same data (side venv).

    python bench/bench_boundary.py [--records 20000] [--big-records 6000] [--petastorm]
                                   [--json out.json]

Each figure is the best (minimum time) of --repeats runs (3 by default), page cache warm.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import yogadl_plus as ydl  # noqa: E402

PETASTORM_PYTHON = os.path.join(ROOT, ".baselines", "petastorm", "bin", "python")


def best_time(run: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def drain(items: Iterable[Any]) -> int:
    return sum(1 for _ in items)


# --- a transform that costs ~50 microseconds of pure Python per record ---

_SPIN = 0


def calibrate_spin(target_seconds: float = 50e-6) -> int:
    n = 1000
    while True:
        start = time.perf_counter()
        for _ in range(200):
            spin_loop(n)
        per_call = (time.perf_counter() - start) / 200
        if per_call > target_seconds / 4:
            return max(1, int(n * target_seconds / per_call))
        n *= 2


def spin_loop(n: int) -> int:
    total = 0
    for k in range(n):
        total += k ^ (k >> 3)
    return total


def costly_transform(record: dict[str, Any]) -> dict[str, Any]:
    record["spin"] = spin_loop(_SPIN)
    return record


def bench_transform(root: str, records: int, repeats: int) -> list[dict[str, Any]]:
    global _SPIN
    _SPIN = calibrate_spin()
    start = time.perf_counter()
    for _ in range(100):
        costly_transform({})
    per_record_us = (time.perf_counter() - start) / 100 * 1e6
    rng = np.random.default_rng(0)
    x = rng.standard_normal((records, 64), dtype=np.float32)
    ref = ydl.cache_dataset(
        ({"x": x[i], "label": np.int64(i)} for i in range(records)),
        "transform",
        "v1",
        ydl.LocalStorage(root),
        progress=False,
    )
    rows = []
    configs = [("inline", 0, "thread"), ("2 threads", 2, "thread"), ("2 processes", 2, "process")]
    baseline = None
    for name, workers, kind in configs:
        stream = ref.stream(
            shuffle=True,
            shuffle_seed=0,
            transform=costly_transform,
            num_workers=workers,
            worker_type=kind,
        )
        drain(stream)  # warm up: start the workers, fill the page cache
        seconds = best_time(lambda s=stream: drain(s), repeats)
        stream.close()
        rate = records / seconds
        baseline = baseline or rate
        rows.append(
            {
                "metric": f"transform ~{per_record_us:.0f} us/record, {name}",
                "records_per_s": rate,
                "ratio_vs_inline": rate / baseline,
                "target": ">= 1.6x inline" if kind == "process" else "",
            }
        )
    return rows


# --- a 1%-selective predicate over records with a 100 KB second field ---


def make_big_parquet(path: str, records: int, big_bytes: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    block = rng.integers(0, 256, big_bytes, dtype=np.uint8)
    writer = None
    for start in range(0, records, 500):
        ids = np.arange(start, min(start + 500, records), dtype=np.int64)
        big = [(block ^ np.uint8(i % 251)).tobytes() for i in ids]
        table = pa.table({"id": ids, "key": ids % 100, "big": pa.array(big, pa.binary())})
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    assert writer is not None
    writer.close()


def bench_predicate(root: str, parquet: str, repeats: int) -> list[dict[str, Any]]:
    ref = ydl.cache_dataset(parquet, "big", "v1", ydl.LocalStorage(root), progress=False)
    n = len(ref)
    wanted = ydl.predicates.in_set("key", [0])

    def decode_everything_then_filter() -> int:
        return sum(1 for r in ref.stream() if r["key"] == 0)

    def with_predicate() -> int:
        return drain(ref.stream(predicate=wanted))

    def with_predicate_batches() -> int:
        return sum(len(b["id"]) for b in ref.stream(predicate=wanted, batch_size=32))

    assert decode_everything_then_filter() == with_predicate() == n // 100
    full = best_time(decode_everything_then_filter, repeats)
    rows = [
        {
            "metric": "decode every record (100 KB field), filter in Python",
            "records_per_s": n / full,
            "ratio_vs_inline": 1.0,
            "target": "",
        }
    ]
    for name, run in (
        ("predicate in_set(key, [0]), records", with_predicate),
        ("predicate in_set(key, [0]), batches of 32", with_predicate_batches),
    ):
        seconds = best_time(run, repeats)
        rows.append(
            {
                "metric": name,
                "records_per_s": n / seconds,
                "ratio_vs_inline": full / seconds,
                "target": ">= 20x decoding everything",
            }
        )
    return rows


def bench_petastorm(workdir: str, records: int, big_bytes: int) -> dict[str, Any] | None:
    if not os.path.exists(PETASTORM_PYTHON):
        print(
            "petastorm: n/a (make the side venv: bash bench/baselines/venvs.sh .baselines)",
            file=sys.stderr,
        )
        return None
    out = os.path.join(workdir, "petastorm.json")
    subprocess.run(
        [
            PETASTORM_PYTHON,
            os.path.join(HERE, "_petastorm_baseline.py"),
            "--rows",
            str(records),
            "--big-bytes",
            str(big_bytes),
            "--workdir",
            os.path.join(workdir, "petastorm"),
            "--json",
            out,
        ],
        check=True,
    )
    with open(out) as f:
        return json.load(f)  # type: ignore[no-any-return]


def print_petastorm(petastorm: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Petastorm's make_reader on the same Parquet rows, against the yogadl_plus predicate rows."""
    ours = {r["metric"]: r["records_per_s"] for r in rows}
    ydl_predicate = ours["predicate in_set(key, [0]), records"]
    ydl_full = ours["decode every record (100 KB field), filter in Python"]
    print("\nPetastorm 0.13.1 make_reader (thread pool) on the same rows, side venv:\n")
    print("| Petastorm figure | workers | rows scanned/s | yogadl_plus / Petastorm |")
    print("|---|---:|---:|---:|")
    names = {
        "full_scan": ("full scan, all fields decoded", ydl_full),
        "predicate_1pct": ("predicate in_set([0], 'key')", ydl_predicate),
        "drop_partitions_4": ("shuffle_row_drop_partitions=4, one epoch", ydl_full),
    }
    for workers, results in sorted(petastorm["results"].items()):
        for key, (label, ours_rate) in names.items():
            rate = results[key]["rows_scanned_per_s"]
            print(f"| {label} | {workers.split('_')[-1]} | {rate:,.0f} | {ours_rate / rate:.1f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--records", type=int, default=20_000, help="records for the transform rows"
    )
    parser.add_argument("--big-records", type=int, default=8_000, help="records of 100 KB")
    parser.add_argument("--big-bytes", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--petastorm", action="store_true", help="also run Petastorm 0.13.1")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="ydl-bench-boundary-")
    try:
        rows = bench_transform(os.path.join(workdir, "a"), args.records, args.repeats)
        petastorm = None
        if args.petastorm:
            petastorm = bench_petastorm(workdir, args.big_records, args.big_bytes)
        parquet = (petastorm or {}).get("plain_parquet_path") or os.path.join(
            workdir, "big.parquet"
        )
        if not os.path.exists(parquet):
            make_big_parquet(parquet, args.big_records, args.big_bytes)
        rows += bench_predicate(os.path.join(workdir, "b"), parquet, args.repeats)
        print(f"# yogadl_plus boundary benchmark ({os.cpu_count()} CPUs)\n")
        print("| metric | records/s | ratio | target |\n|---|---:|---:|---|")
        for row in rows:
            print(
                f"| {row['metric']} | {row['records_per_s']:,.0f} | "
                f"{row['ratio_vs_inline']:.2f}x | {row['target']} |"
            )
        if petastorm is not None:
            print_petastorm(petastorm, rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": rows, "petastorm": petastorm}, f, indent=1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
