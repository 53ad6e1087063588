"""Caching columns in memory in one call (issue 27), against the floors and the peers, same run.

    python bench/bench_build_columns.py [--rows 1000000] [--rounds 3] [--peers .baselines/peers]

Data: ``{"x": float32[64], "y": int64}`` (--rows records, 264 bytes each), made once in memory.
Rows, each run --rounds times in alternating order (the best is reported, with the range of the
ratio over rounds), each writing into a fresh folder of the same disk:

- ``cache_dataset({"x": x, "y": y}, ...)``: the columnar build (encode a batch per call, values
  cut as LMDB takes them, chunk hashed while the disk syncs), every check included;
- ``cache_dataset`` of the same records as an iterable of dicts (the record-by-record path);
- raw LMDB: a Python loop of ``txn.put(key, value, append=True)`` of the same record bytes into
  one environment, committing every 100,000 records and syncing at the end (no hashing, no
  manifest): the floor the issue names (target: the columnar build >= 1.0x of it);
- Lance ``lance.write_dataset(table)`` and ArrayRecord (``ArrayRecordWriter`` with
  ``group_size:1,uncompressed``, the random-access layout bench_peers_big.py reads, each record's
  264 bytes) writing the same arrays, each in the peers' side venv (--peers, from
  bench/baselines/venvs.sh), timed inside that process from arrays already in memory.
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
from collections.abc import Callable

import lmdb
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import yogadl_plus as ydl  # noqa: E402

_PEER = r"""
import sys, time, numpy as np
kind, data, out = sys.argv[1:4]
x = np.load(data + "/x.npy"); y = np.load(data + "/y.npy")
if kind == "lance":
    import lance, pyarrow as pa
    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 64), "y": y})
    began = time.perf_counter()
    lance.write_dataset(table, out)
else:
    from array_record.python.array_record_module import ArrayRecordWriter
    rows = np.concatenate([x.view(np.uint8), y.view(np.uint8).reshape(-1, 8)], axis=1)
    data = rows.tobytes(); width = rows.shape[1]
    began = time.perf_counter()
    writer = ArrayRecordWriter(out, "group_size:1,uncompressed")
    for i in range(len(y)):
        writer.write(data[i * width:(i + 1) * width])
    writer.close()
print(time.perf_counter() - began)
"""


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


def peer(python: str, kind: str, data: str, folder: str) -> float:
    """Seconds a peer took to write the arrays saved in ``data``, timed in its own process."""
    out = os.path.join(folder, "peer.array_record" if kind == "array_record" else "peer.lance")
    done = subprocess.run(
        [python, "-c", _PEER, kind, data, out], capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", default=os.path.join(os.path.dirname(HERE), ".baselines/peers"))
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
        "raw LMDB put loop": lambda f: raw_lmdb(f, x, y),
    }
    if os.path.exists(python):
        rows["Lance write_dataset"] = lambda f: peer(python, "lance", data, f)
        rows["ArrayRecord writer"] = lambda f: peer(python, "array_record", data, f)
    else:
        print(f"no peers venv at {args.peers}: Lance and ArrayRecord left out", file=sys.stderr)
    times: dict[str, list[float]] = {name: [] for name in rows}
    try:
        for round_ in range(args.rounds):
            order = list(rows) if round_ % 2 == 0 else list(reversed(rows))
            for name in order:
                folder = tempfile.mkdtemp(dir=root)
                began = time.perf_counter()
                inside = rows[name](folder)
                took = time.perf_counter() - began
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(times, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
