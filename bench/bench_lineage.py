"""Lineage at scale: which records made the next 10^4 items of a stream over 10^8 records.

    python -m bench.bench_lineage [--records 100000000] [--items 10000] [--rounds 3]

The version is a stand-in that opens no files (its records are never read: without a predicate
or skip list, lineage is the order's arithmetic alone), with the order of a real one: one chunk
of ``--records`` records of 8 bytes. Each row is ``stream.lineage(items)`` from an offset deep
in epoch 3 (a resumed run), best of --rounds, against the order's own ``plan().indices`` over
the same positions (the floor: lineage adds the grouping into items).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

import yogadl_plus as ydl
from bench.harness import smoke, timed


class HugeRef(ydl.DataRef):
    """A DataRef of ``n`` records that opens no files: enough for a stream's order."""

    def __init__(self, n: int) -> None:
        schema = ydl.Schema([ydl.Field("i", np.int64)])
        chunk = SimpleNamespace(records=n, bytes=8 * n, sha256="0" * 64, file="none")
        self.manifest = SimpleNamespace(  # type: ignore[assignment]
            dataset_id="huge", version="v", schema=schema, chunks=[chunk], num_records=n
        )
        self._len = n
        self._fingerprint = None

    def read_ahead(self, indices: np.ndarray) -> None:
        pass

    def close(self) -> None:
        pass


def best(run: Callable[[], Any], rounds: int) -> float:
    return min(timed(run, rounds))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=smoke(100_000_000, 1_000_000))
    parser.add_argument("--items", type=int, default=smoke(10_000, 100))
    parser.add_argument("--rounds", type=int, default=smoke(3, 1))
    args = parser.parse_args(argv)
    ref = HugeRef(args.records)
    print(f"\n{args.records:,} records, lineage of {args.items:,} items, best of {args.rounds}\n")
    print("| stream | lineage s | positions | order alone s | lineage / order |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, options in (
        ("shuffled records", {}),
        ("shuffled batches of 256", {"batch_size": 256}),
        ("shard 3 of 8, batches of 256", {"batch_size": 256, "num_shards": 8, "shard_rank": 3}),
    ):
        start = 3 * (args.records // options.get("num_shards", 1)) + 12_345
        stream = ref.stream(shuffle=True, shuffle_seed=0, start_offset=start, **options)
        took = best(lambda s=stream: s.lineage(args.items), args.rounds)
        positions = args.items * options.get("batch_size", 1)
        plan = stream.plan()
        epoch, position = plan.position_of(start)
        floor = best(
            lambda p=plan, e=epoch, q=position, k=positions: [
                p.indices(e, a, min(a + 8192, q + k)) for a in range(q, q + k, 8192)
            ],
            args.rounds,
        )
        print(f"| {name} | {took:.3f} | {positions:,} | {floor:.3f} | {took / floor:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
