"""Big records warm, against Grain in the same run: 20,000 records of uint8[96 KiB] + int64,
a true global shuffle read record by record (yogadl_plus) against Grain 0.2.18 over ArrayRecord
(its random-access MapDataset, and its prefetching iterator), each as records/s and as a ratio.

    bash bench/baselines/venvs.sh .baselines   # once: the peers venv
    python bench/bench_peers_big.py [--peers .baselines/peers/bin/python] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import yogadl_plus as ydl
from bench._common import warm

HERE = os.path.dirname(os.path.abspath(__file__))


def ours(ref: ydl.DataRef, seconds: float, **kwargs) -> float:
    start = time.perf_counter()
    n = 0
    for record in ref.stream(shuffle=True, shuffle_seed=1, **kwargs):
        n += len(record["y"]) if kwargs.get("batch_size") else 1
        if n % 64 == 0 and time.perf_counter() - start > seconds:
            break
    return n / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/ydl-bench-peers")
    parser.add_argument("--peers", default=".baselines/peers/bin/python")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=96 << 10)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.makedirs(args.root, exist_ok=True)
    size, count = args.size, args.records
    schema = ydl.Schema([ydl.Field("x", np.uint8, (size,)), ydl.Field("y", np.int64)])

    def records():
        base = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
        for i in range(count):
            yield {"x": np.roll(base, i % 997), "y": np.int64(i)}

    storage = ydl.LocalStorage(args.root)
    ref = ydl.cache_dataset(
        records, "peers", f"s{size}-n{count}", storage, schema=schema, progress=False
    )
    print(
        f"{count} records of uint8[{size}] + int64, shuffled, warm; yogadl_plus from "
        f"{os.path.dirname(ydl.__file__)}\n"
    )
    print(
        "| round | yogadl_plus records | Grain MapDataset | Grain iterator | ours / Grain map "
        "| ours / Grain iterator | yogadl_plus batches of 256 (records/s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for round_ in range(1, args.rounds + 1):
        grain = subprocess.run(
            [
                args.peers,
                os.path.join(HERE, "_grain_big.py"),
                args.root,
                str(count),
                str(size),
                str(args.seconds),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        peer = json.loads(grain.stdout.strip().splitlines()[-1])
        warm(ref.directory)
        mine = max(ours(ref, args.seconds) for _ in range(2))
        batches = ours(ref, args.seconds, batch_size=256)
        print(
            f"| {round_} | {mine:,.0f} | {peer['map']:,.0f} | {peer['iter']:,.0f} | "
            f"{mine / peer['map']:.2f}x | {mine / peer['iter']:.2f}x | {batches:,.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
