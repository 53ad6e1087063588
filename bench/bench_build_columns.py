"""Caching columns in memory in one call, against the floors and the peers, in the same run.

    python -m bench.bench_build_columns [--rows 1000000] [--rounds 3] [--peers .baselines/peers]

Data: ``{"x": float32[64], "y": int64}`` (--rows records, 264 bytes each), made once in memory.
Rows, each run --rounds times in alternating order (the best is reported, with the range of the
ratio over rounds), each writing into a fresh folder of the same disk:

- ``cache_dataset({"x": x, "y": y}, ...)``: the columnar build (encode a batch per call, values
  cut as LMDB takes them, chunk hashed while the disk syncs), every check included;
- ``cache_dataset`` of the same records as an iterable of dicts (the record-by-record path);
- ``np.save`` of the two columns, each file fsynced: the same bytes written plainly, the floor;
- raw LMDB: a Python loop of ``txn.put(key, value, append=True)`` of the same record bytes into
  one environment, committing every 100,000 records and syncing at the end (no hashing, no
  manifest): the floor the columnar build was written against (target: >= 1.0x of it);
- Lance ``lance.write_dataset(table)`` (which does not fsync), Parquet
  (``pyarrow.parquet.write_table(table, compression="none")``, its file fsynced) and
  ArrayRecord (``ArrayRecordWriter`` with ``group_size:1,uncompressed``, the random-access
  layout bench_peers_big.py reads, each record's 264 bytes) writing the same arrays, each in
  the peers' side venv (--peers, from bench/baselines/venvs.sh; bench/baselines/peer_writers.py),
  timed inside that process from arrays already in memory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable

import lmdb
import numpy as np

import yogadl_plus as ydl
from bench.harness import BASELINE_VENVS, run_baseline, smoke, time_once, write_json


def raw_lmdb(folder: str, x: np.ndarray, y: np.ndarray) -> None:
    """The same record bytes, put one by one from Python into one LMDB environment."""
    rows = np.zeros((len(y), 264), np.uint8)
    rows[:, :256] = x.view(np.uint8)
    rows[:, 256:] = y.view(np.uint8).reshape(-1, 8)
    data = rows.tobytes()
    env = lmdb.open(
        os.path.join(folder, "raw.mdb"), subdir=False, map_size=4 << 30, lock=False,
        sync=False, metasync=False, meminit=False,
    )  # fmt: skip
    txn = env.begin(write=True)
    for i in range(len(y)):
        txn.put(i.to_bytes(4, "big"), data[i * 264 : (i + 1) * 264], append=True)
        if i % 100_000 == 99_999:
            txn.commit()
            txn = env.begin(write=True)
    txn.commit()
    env.sync(True)
    env.close()


def numpy_save(folder: str, x: np.ndarray, y: np.ndarray) -> None:
    """The columns' bytes written as .npy files and synced: no layout, no checks."""
    for name, column in (("x", x), ("y", y)):
        path = os.path.join(folder, f"{name}.npy")
        with open(path, "wb") as f:
            np.save(f, column)
            f.flush()
            os.fsync(f.fileno())


def peer(python: str, kind: str, data: str, folder: str) -> float:
    """Seconds a peer took to write the arrays saved in ``data``, timed in its own process."""
    out = os.path.join(folder, f"peer.{kind}")
    result = run_baseline("peers", "peer_writers", [kind, data, out], python=python)
    if isinstance(result, str):
        raise SystemExit(f"{kind}: {result}")
    return float(result["seconds"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=smoke(1_000_000, 2_000))
    parser.add_argument("--rounds", type=int, default=smoke(3, 1))
    parser.add_argument("--peers", default=os.path.join(BASELINE_VENVS, "peers"))
    parser.add_argument("--tmp", default=None, help="where to write (default: the temp folder)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, 64), dtype=np.float32)
    y = np.arange(args.rows, dtype=np.int64)
    root = tempfile.mkdtemp(prefix="ydl-build-columns-", dir=args.tmp)
    python = os.path.join(args.peers, "bin", "python")
    data = os.path.join(root, "arrays")
    os.makedirs(data)
    np.save(os.path.join(data, "x.npy"), x)
    np.save(os.path.join(data, "y.npy"), y)

    def ours(source: Callable[[], object]) -> Callable[[str], None]:
        def run(folder: str) -> None:
            ydl.cache_dataset(source(), "d", "v1", ydl.LocalStorage(folder), progress=False)

        return run

    def records() -> object:
        return ({"x": x[i], "y": y[i]} for i in range(args.rows))

    rows: dict[str, Callable[[str], float | None]] = {
        "yogadl_plus, columns": lambda f: ours(lambda: {"x": x, "y": y})(f),
        "yogadl_plus, records": lambda f: ours(records)(f),
        "np.save of the columns (floor)": lambda f: numpy_save(f, x, y),
        "raw LMDB put loop": lambda f: raw_lmdb(f, x, y),
    }
    if os.path.exists(python):
        rows["Lance write_dataset"] = lambda f: peer(python, "lance", data, f)
        rows["Parquet write_table, no compression"] = lambda f: peer(python, "parquet", data, f)
        rows["ArrayRecord writer"] = lambda f: peer(python, "array_record", data, f)
    else:
        print(f"no peers venv at {args.peers}: the peers left out", file=sys.stderr)
    times: dict[str, list[float]] = {name: [] for name in rows}
    try:
        for round_ in range(args.rounds):
            order = list(rows) if round_ % 2 == 0 else list(reversed(rows))
            for name in order:
                folder = tempfile.mkdtemp(dir=root)
                took, inside = time_once(lambda name=name, folder=folder: rows[name](folder))
                times[name].append(inside if isinstance(inside, float) else took)
                shutil.rmtree(folder)
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = "yogadl_plus, columns"
    load = os.getloadavg()[0]
    print(f"\n{args.rows:,} records of 264 bytes; {os.cpu_count()} CPUs; load {load:.2f}\n")
    print("| row | seconds (best) | records/s | columns build / row (best) | per round |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, row in times.items():
        per_round = [t / b for t, b in zip(row, times[base])]
        print(
            f"| {name} | {min(row):.2f} | {args.rows / min(row):,.0f} | "
            f"{min(row) / min(times[base]):.2f}x | {min(per_round):.2f}-{max(per_round):.2f} |"
        )
    write_json(args.json, {"rows": args.rows, "times": times})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
