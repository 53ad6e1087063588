"""Mixing benchmark: how well each shuffle mixes a chunked version, and what it costs a reader.

    python -m bench.bench_mixing [--quick] [--seed 0] [--json out.json]

For a chunk layout (records per chunk, in storage order), each scheme gives one epoch's order
(position -> record index); the script prints, per scheme:

- how far records move: ``|position - record index| / N``, mean and quantiles (a uniform
  permutation has mean 1/3; no shuffle 0);
- how neighbours correlate: the probability that items i and i+1 come from the same chunk, and
  the distinct chunks among 256 consecutive items (one batch), mean and minimum over the
  epoch's batches;
- what a reader must hold: the most chunks "open" at once (a chunk is open from its first to
  its last item in the order), the working set of a reader that reads each chunk once.

Schemes: no shuffle; the full shuffle (``shuffle=True``); the windowed shuffle
(``shuffle_window=W``, W in 1, 4, 16, 64); two simulations of other libraries' index orders,
written for this comparison from their published descriptions (not from their code):

- Mosaic Streaming's ``py1e`` (the default ``shuffle_algo``), after the Streaming docs' page
  "Shuffling" and the ``get_shuffle_py1e`` API reference: the shard order is shuffled, and the
  samples of each shard are placed at random in an expanded range of ``shuffle_block_size``
  samples around the shard's place. We place each sample uniformly in a range of
  ``block_size`` positions centred on the middle of its shard's span in the shuffled order
  (the docs do not give the constants of the Gaussian that py1e draws), one canonical node,
  and sort by those places. ``block_size`` takes the windowed rows' window sizes in records
  (for a like-for-like working set) and py1e's own ``1 << 18``.
- litdata's chunk shuffle (``StreamingDataset(shuffle=True)``, ``FullShuffle``), after its
  docstring ("shuffles the chunks and associates them to the ranks") and its README: the chunk
  order is shuffled each epoch, the chunks go to the workers in consecutive runs of about N / K
  items each, each worker reads its chunks one after another with the items of each chunk
  shuffled, and the DataLoader takes batches of 256 from the K workers in turn. Rows for
  K = 1 and K = 8 workers.

The last table is the cost of our orders: computing one epoch's order in blocks of 4096
positions, as a ratio of the time the full shuffle takes in the same run (best of 3).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.harness import smoke, time_once, write_json
from yogadl_plus.order import ShardByRecords

BATCH = 256
WINDOWS = (1, 4, 16, 64)


# --- chunk layouts ---------------------------------------------------------------------------


def layouts(quick: bool, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    chunks = 200 if quick else smoke(1000, 20)
    # Images of ~110 KB in 256 MB chunks: ~2,300 records a chunk, varying with the sizes, and
    # a short last chunk (what a build of a real image folder gives).
    varying = rng.normal(2300, 250, size=(chunks * 2) // 5).astype(np.int64)
    varying = np.append(varying, 517)
    return {
        f"{chunks} chunks x 1000 records": np.full(chunks, 1000, dtype=np.int64),
        f"{len(varying)} chunks of ~2300 records (+ a short last one)": varying,
    }


# --- the orders ------------------------------------------------------------------------------


def ours(counts: np.ndarray, window: int | None, seed: int) -> np.ndarray:
    n = int(counts.sum())
    order = ShardByRecords(
        n, shuffle=True, shuffle_seed=seed, shuffle_window=window, chunk_records=counts
    )
    return order.indices(0, 0, n)


def py1e(counts: np.ndarray, block_size: int, seed: int) -> np.ndarray:
    """Mosaic Streaming's py1e, simulated (see the module docstring)."""
    rng = np.random.default_rng(seed)
    starts = np.cumsum(counts) - counts
    shard_order = rng.permutation(len(counts))
    placed = counts[shard_order]
    span_ends = np.cumsum(placed)
    centres = span_ends - placed / 2.0  # the middle of each shard's span in the shuffled order
    width = np.maximum(placed, block_size).astype(np.float64)
    records = np.concatenate([np.arange(s, s + c) for s, c in zip(starts[shard_order], placed)])
    where = np.repeat(centres, placed) + (rng.random(len(records)) - 0.5) * np.repeat(width, placed)
    return records[np.argsort(where, kind="stable")]


def litdata(counts: np.ndarray, workers: int, seed: int) -> np.ndarray:
    """litdata's chunk shuffle, simulated (see the module docstring)."""
    rng = np.random.default_rng(seed)
    starts = np.cumsum(counts) - counts
    chunk_order = rng.permutation(len(counts))
    n = int(counts.sum())
    streams: list[list[np.ndarray]] = [[] for _ in range(workers)]
    worker, taken = 0, 0
    for chunk in chunk_order:
        streams[worker].append(starts[chunk] + rng.permutation(counts[chunk]))
        taken += counts[chunk]
        if taken >= n * (worker + 1) / workers and worker < workers - 1:
            worker += 1
    per_worker = [np.concatenate(s) if s else np.zeros(0, np.int64) for s in streams]
    batches = [np.array_split(s, range(BATCH, len(s), BATCH)) for s in per_worker]
    out = []
    for turn in range(max(len(b) for b in batches)):
        out += [b[turn] for b in batches if turn < len(b)]
    return np.concatenate(out)


def schemes(counts: np.ndarray, seed: int) -> dict[str, Callable[[], np.ndarray]]:
    n = int(counts.sum())
    typical = int(np.median(counts))
    found: dict[str, Callable[[], np.ndarray]] = {
        "no shuffle": lambda: np.arange(n, dtype=np.int64),
        "full shuffle (shuffle_window=None)": lambda: ours(counts, None, seed),
    }
    for w in WINDOWS:
        found[f"shuffle_window={w}"] = lambda w=w: ours(counts, w, seed)
    for w in WINDOWS[1:]:
        size = w * typical
        found[f"Mosaic py1e, block {size}"] = lambda size=size: py1e(counts, size, seed)
    found[f"Mosaic py1e, block {1 << 18}"] = lambda: py1e(counts, 1 << 18, seed)
    found["litdata chunk shuffle, 1 worker"] = lambda: litdata(counts, 1, seed)
    found["litdata chunk shuffle, 8 workers"] = lambda: litdata(counts, 8, seed)
    return found


# --- the statistics --------------------------------------------------------------------------


def statistics(order: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    n = len(order)
    assert np.array_equal(np.sort(order), np.arange(n)), "not a permutation"
    moved = np.abs(order - np.arange(n)) / n
    chunk = np.searchsorted(np.cumsum(counts), order, side="right")
    batches = chunk[: n - n % BATCH].reshape(-1, BATCH)
    ordered = np.sort(batches, axis=1)
    distinct = 1 + (np.diff(ordered, axis=1) != 0).sum(axis=1)
    # A chunk is open from its first item to its last: count the open chunks at each position.
    first = np.full(len(counts), n, dtype=np.int64)
    last = np.full(len(counts), -1, dtype=np.int64)
    positions = np.arange(n)
    np.minimum.at(first, chunk, positions)
    np.maximum.at(last, chunk, positions)
    used = last >= 0
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, first[used], 1)
    np.add.at(delta, last[used] + 1, -1)
    open_chunks = np.cumsum(delta)[:n]
    return {
        "moved_mean": float(moved.mean()),
        "moved_p10": float(np.quantile(moved, 0.1)),
        "moved_p50": float(np.quantile(moved, 0.5)),
        "moved_p90": float(np.quantile(moved, 0.9)),
        "same_chunk_next": float((chunk[1:] == chunk[:-1]).mean()),
        "chunks_per_batch_mean": float(distinct.mean()),
        "chunks_per_batch_min": int(distinct.min()),
        "open_chunks_max": int(open_chunks.max()),
        "open_chunks_mean": float(open_chunks.mean()),
    }


def mixing_table(name: str, counts: np.ndarray, seed: int) -> list[dict[str, Any]]:
    n = int(counts.sum())
    print(f"\n### Mixing: {name} ({n:,} records, {len(counts)} chunks, seed {seed})\n")
    print(
        "| scheme | moved: mean | p10 | p50 | p90 | P(next item, same chunk) "
        f"| chunks per {BATCH} items: mean | min | open chunks: max | mean |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for scheme, make in schemes(counts, seed).items():
        s = statistics(make(), counts)
        print(
            f"| {scheme} | {s['moved_mean']:.3f} | {s['moved_p10']:.3f} | {s['moved_p50']:.3f} "
            f"| {s['moved_p90']:.3f} | {s['same_chunk_next']:.4f} "
            f"| {s['chunks_per_batch_mean']:.1f} | {s['chunks_per_batch_min']} "
            f"| {s['open_chunks_max']} | {s['open_chunks_mean']:.1f} |"
        )
        rows.append({"layout": name, "scheme": scheme, **s})
    return rows


# --- the cost of our orders ------------------------------------------------------------------


def epoch_time(counts: np.ndarray, window: int | None, shards: int, seed: int) -> float:
    n = int(counts.sum())

    def walk(order: ShardByRecords) -> None:
        length = order.shard_length
        for start in range(0, length, 4096):
            order.indices(0, start, min(start + 4096, length))

    best = float("inf")
    for _ in range(smoke(3, 1)):
        # A fresh order each run: the epoch's chunk arrays and window tables are part of it.
        order = ShardByRecords(
            n, shuffle=True, shuffle_seed=seed, shuffle_window=window, chunk_records=counts,
            num_shards=shards,
        )  # fmt: skip
        best = min(best, time_once(lambda order=order: walk(order))[0])
    return best


def cost_table(name: str, counts: np.ndarray, seed: int) -> list[dict[str, Any]]:
    print(f"\n### Order cost: {name} (one shard's epoch in blocks of 4096 positions)\n")
    print("| scheme | 1 shard: ns/position | vs full | 8 shards: ns/position | vs full |")
    print("|---|---:|---:|---:|---:|")
    n = int(counts.sum())
    rows = []
    base = {s: epoch_time(counts, None, s, seed) for s in (1, 8)}
    for window in (None, *WINDOWS):
        t = {s: base[s] if window is None else epoch_time(counts, window, s, seed) for s in base}
        per = {s: t[s] / -(-n // s) * 1e9 for s in t}
        label = "full shuffle" if window is None else f"shuffle_window={window}"
        print(
            f"| {label} | {per[1]:.0f} | {t[1] / base[1]:.2f}x | {per[8]:.0f} "
            f"| {t[8] / base[8]:.2f}x |"
        )
        rows.append({"layout": name, "window": window, "seconds": t, "ns_per_position": per})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 chunks instead of 1000")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args()
    out: dict[str, Any] = {"mixing": [], "cost": []}
    for name, counts in layouts(args.quick, args.seed).items():
        out["mixing"] += mixing_table(name, counts, args.seed)
    for name, counts in layouts(args.quick, args.seed).items():
        out["cost"] += cost_table(name, counts, args.seed)
    write_json(args.json, out)


if __name__ == "__main__":
    main()
