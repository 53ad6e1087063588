"""Mixture benchmark: a stream over ``ydl.mix`` against a plain stream over the same bytes.

    python -m bench.bench_mixture [--small-records 300000] [--big-records 8000] [--rounds 3]
                                  [--only small,big] [--tmp DIR] [--json out.json]

Data (built once per run in a temporary folder, from one generator per case):

- small: ``{"x": float32[64], "y": int64}`` (264 bytes), --small-records in all;
- big: ``{"x": uint8[96 KiB], "y": int64}``, --big-records in all.

Each case is cached three times: source A (the first two thirds of the records), source B (the
last third) and, for the plain rows, one DataRef holding all of them (A then B). ``y`` is the
record's number in that order, so every row is checked outside the timing: the plain epoch holds
each record once, and each mixture epoch holds exactly its shares of A's and B's records.

Rows, each shuffled (``shuffle=True, shuffle_seed=0``), record by record and in batches of 256:

- plain: ``ref.stream(...)`` over the one DataRef;
- ``ydl.mix({"A": a, "B": b}, weights, epoch_size=len(a) + len(b)).stream(...)`` with weights
  None (in proportion to the sizes: each record once an epoch, as in the plain stream), 1:1 (A
  down-sampled, B up-sampled) and 3:1 (A up-sampled, B down-sampled).

Every epoch has as many records of the same size, so records/s compare like with like. A row's
figure is the best (shortest) epoch over --rounds rounds, stream construction included; in each
round the page cache is warmed (every chunk file read) and the rows run one after the other, the
plain row first in odd rounds and last in even ones. The consumer counts the items and drops them.
The ratio is mixture / plain; the target is >= 0.9x.

A last mode times the order's arithmetic alone (where every position of an epoch reads, in the
blocks a stream places at once, nothing read). A mixture's order does more than a plain one: the
interleave of its sources and each source's own permutation. A table bounds mixture / plain
for batches by that extra work alone: plain / (plain + extra), as if reading and merging a
mixture's records cost no more than a plain stream's.

The last table bounds it for any code that deals the same order: the least extra work a mixture
has, each part timed alone, at its fastest, in the same round. Its order permutes every source's
positions with the source's own keyed permutation (a second permutation per record, beyond the
slots' own, which a plain stream also has), and deals every slot to its source (the interleave,
in the blocks a stream places). Those two alone give the first ceiling, plain / (plain + both):
what a reader could reach if a mixture's rows cost no more to read than a plain stream's, which
needs every source's chunk files mapped into one address range (numpy gathers from one array).
Read as numpy must read separate files, each batch's rows come from two gathers and are then put
in position order, where a plain stream gathers once (timed over rows in memory, rows as single
items): the second ceiling adds that extra.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import yogadl_plus as ydl
from bench.harness import smoke, target_cell, time_once, warm, write_json
from yogadl_plus.order.interleave import Interleave
from yogadl_plus.order.mixing import source_seed
from yogadl_plus.order.permutation import Permutation

CASES = ("small", "big")
BIG_BYTES = 96 << 10
BATCH = 256
TARGET = 0.9
WEIGHTS: dict[str, dict[str, float] | None] = {
    "sizes": None,
    "1:1": {"A": 1, "B": 1},
    "3:1": {"A": 3, "B": 1},
}
MODES = ("records", f"batches of {BATCH}")
ARITHMETIC = "where each position reads (no reading)"
# The least a mixture of A and B does beyond a plain stream over the same records, each timed
# on its own: its sources' own permutations (one call each, over every position), and the extra
# of reading a batch's rows from two arrays in memory, then putting them in position order,
# over reading them from one (numpy alone, the rows already in memory).
FLOOR = "a mixture's least extra work"
SECOND_PERMUTATION = "each source's own permutation"
INTERLEAVE = "the interleave"
TWO_SOURCES = "rows from two sources, in order"


# --- data ---


def small_records(start: int, stop: int) -> Iterator[dict[str, Any]]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((stop, 64), dtype=np.float32)
    for i in range(start, stop):
        yield {"x": x[i], "y": np.int64(i)}


def big_records(start: int, stop: int) -> Iterator[dict[str, Any]]:
    block = np.random.default_rng(0).integers(0, 256, BIG_BYTES, dtype=np.uint8)
    for i in range(start, stop):
        yield {"x": np.roll(block, i), "y": np.int64(i)}


MAKERS: dict[str, Callable[[int, int], Iterator[dict[str, Any]]]] = {
    "small": small_records,
    "big": big_records,
}


def build(storage: ydl.LocalStorage, case: str, n: int) -> dict[str, ydl.DataRef]:
    """Sources A and B, and the plain DataRef holding A's records then B's."""
    split = 2 * n // 3
    make = MAKERS[case]
    refs = {}
    for name, start, stop in (("A", 0, split), ("B", split, n), ("plain", 0, n)):
        refs[name] = ydl.cache_dataset(
            make(start, stop), f"{case}-{name}", f"n{n}", storage, progress=False
        )
    return refs


# --- timing ---


def epoch_seconds(source: Any, batched: bool) -> tuple[float, int]:
    """One epoch of a stream made by ``source()``: seconds, construction included, and items."""

    def epoch() -> int:
        stream = source()
        if batched:
            return sum(len(batch["y"]) for batch in stream)
        return sum(1 for _ in stream)

    return time_once(epoch)


def arithmetic_seconds(source: Any) -> float:
    """Seconds to work out where every position of a shuffled epoch reads (the order's
    arithmetic alone, in the blocks the stream places at once), reading nothing."""
    units = source.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH).plan().units
    n, block = len(source), source.place_block
    start = time.perf_counter()
    for first in range(0, n, block):
        units.placed(0, first, min(n, first + block))
    return time.perf_counter() - start


def second_permutation_seconds(sizes: list[int]) -> float:
    """Seconds to permute every position of sources of ``sizes`` records, one call each: what a
    shuffled mixture computes per epoch beyond a plain stream's one permutation of its slots."""
    permutations = [Permutation(size, source_seed(0, str(j)), 0) for j, size in enumerate(sizes)]
    positions = [np.arange(size, dtype=np.uint64) for size in sizes]
    start = time.perf_counter()
    for permutation, values in zip(permutations, positions):
        permutation.permute(values)
    return time.perf_counter() - start


def interleave_seconds(sizes: list[int], block: int) -> float:
    """Seconds to deal every slot of a shuffled epoch to its source (which source, and which of
    its items), in blocks of ``block`` slots as a stream places them: what a mixture's order
    computes per slot beyond its permutations."""
    interleave = Interleave(sizes)
    slots = np.random.default_rng(0).permutation(sum(sizes))
    start = time.perf_counter()
    for first in range(0, len(slots), block):
        interleave.deal(slots[first : first + block])
    return time.perf_counter() - start


def two_sources_extra_seconds(sizes: list[int], row_bytes: int) -> float:
    """Seconds a shuffled epoch of batches costs beyond one gather of each batch's rows, when
    the rows come from two arrays (in proportion to ``sizes``) and are scattered into position
    order: numpy alone, the rows in memory, each batch's positions dealt at random."""
    rng = np.random.default_rng(0)
    sources = [rng.integers(0, 256, (size, row_bytes), np.uint8) for size in sizes]
    whole = np.concatenate(sources)
    row = np.dtype((np.void, row_bytes))
    rows = [s.view(row)[:, 0] for s in sources]
    whole_rows = whole.view(row)[:, 0]  # (a row one item: numpy's fastest gather of rows)
    n = len(whole)
    batches = []
    for _ in range(n // BATCH):
        share = rng.random(BATCH) < sizes[0] / n
        at = [np.flatnonzero(share), np.flatnonzero(~share)]
        picks = [rng.integers(0, size, len(a)) for size, a in zip(sizes, at)]
        batches.append((rng.integers(0, n, BATCH), at, picks))
    start = time.perf_counter()
    for one, _, _ in batches:
        whole_rows[one]
    single = time.perf_counter() - start
    start = time.perf_counter()
    for _, at, picks in batches:
        out = np.empty(BATCH, row)
        for source, where, pick in zip(rows, at, picks):
            out[where] = source[pick]
    return time.perf_counter() - start - single


def check(refs: dict[str, ydl.DataRef], mixtures: dict[str, ydl.Mixture]) -> None:
    """Untimed: each stream's epoch holds what it should (one batched epoch each)."""
    n = len(refs["plain"])
    split = len(refs["A"])
    args = dict(shuffle=True, shuffle_seed=0, batch_size=BATCH, fields=["y"])
    seen = np.concatenate([b["y"] for b in refs["plain"].stream(**args)])
    assert np.array_equal(np.sort(seen), np.arange(n)), "the plain epoch is not each record once"
    for label, mix in mixtures.items():
        seen = np.concatenate([b["y"] for b in mix.stream(**args)])
        from_a = int((seen < split).sum())
        assert len(seen) == n and [from_a, n - from_a] == mix.counts, (label, mix.counts)
        counts = np.bincount(seen, minlength=n)
        for lo, hi in ((0, split), (split, n)):
            # The balance property: a source's records are read as evenly as its share allows.
            assert counts[lo:hi].max() - counts[lo:hi].min() <= 1, label
        if label == "sizes":
            assert np.array_equal(np.sort(seen), np.arange(n)), "weights=None: each record once"


def run(case: str, n: int, rounds: int, root: str) -> dict[str, dict[str, list[float]]]:
    """records/s of every row in every round: {mode: {row: [rate per round]}}."""
    storage = ydl.LocalStorage(os.path.join(root, case))
    began = time.perf_counter()
    refs = build(storage, case, n)
    print(f"{case}: built {n} records (x3) in {time.perf_counter() - began:.1f} s", file=sys.stderr)
    epoch = len(refs["A"]) + len(refs["B"])
    mixtures = {
        label: ydl.mix({"A": refs["A"], "B": refs["B"]}, weights, epoch_size=epoch)
        for label, weights in WEIGHTS.items()
    }
    check(refs, mixtures)
    rows: dict[str, Any] = {"plain": refs["plain"]}
    rows.update({f"mix {label}": mix for label, mix in mixtures.items()})
    modes = (*MODES, ARITHMETIC)
    rates: dict[str, dict[str, list[float]]] = {mode: {row: [] for row in rows} for mode in modes}
    rates[FLOOR] = {SECOND_PERMUTATION: [], INTERLEAVE: [], TWO_SOURCES: []}
    source_sizes = [len(refs["A"]), len(refs["B"])]
    for round_ in range(rounds):
        for ref in refs.values():
            warm(ref.directory)
        order = list(rows) if round_ % 2 == 0 else [*list(rows)[1:], "plain"]
        for mode in MODES:
            batched = mode != "records"
            kwargs = dict(shuffle=True, shuffle_seed=0, batch_size=BATCH if batched else None)
            for row in order:
                make = functools.partial(rows[row].stream, **kwargs)
                seconds, count = epoch_seconds(make, batched)
                assert count == n, (row, mode, count, n)
                rates[mode][row].append(n / seconds)
        for row in order:
            rates[ARITHMETIC][row].append(n / arithmetic_seconds(rows[row]))
        floor = rates[FLOOR]
        floor[SECOND_PERMUTATION].append(n / second_permutation_seconds(source_sizes))
        place_block = mixtures["sizes"].place_block
        floor[INTERLEAVE].append(n / interleave_seconds(source_sizes, place_block))
        row_bytes = refs["plain"].layout.row_bytes
        if row_bytes:  # (records of fixed-shape fields, gathered as rows)
            floor[TWO_SOURCES].append(n / two_sources_extra_seconds(source_sizes, row_bytes))
        print(f"{case}: round {round_ + 1}/{rounds} done", file=sys.stderr)
    for ref in refs.values():
        ref.close()
    return rates


# --- the table ---


def table(results: dict[str, dict[str, dict[str, list[float]]]], sizes: dict[str, int]) -> str:
    lines = [
        "| data | mode | row | records/s (best) | mixture / plain | target |",
        "| --- | --- | --- | ---: | ---: | --- |",
    ]
    for case, rates in results.items():
        for mode, rows in rates.items():
            if mode == FLOOR:
                continue  # (seconds of extra work, in the ceiling table)
            plain = max(rows["plain"])
            for row, values in rows.items():
                best = max(values)
                if row == "plain" or mode in (ARITHMETIC, FLOOR):
                    ratio, target = "", ""
                else:
                    ratio = f"{best / plain:.2f}x"
                    target = target_cell(f">= {TARGET}x", best / plain >= TARGET)
                label = f"{case} ({sizes[case]:,})"
                lines.append(f"| {label} | {mode} | {row} | {best:,.0f} | {ratio} | {target} |")
    return "\n".join([*lines, "", *ceilings(results, sizes)])


def ceilings(
    results: dict[str, dict[str, dict[str, list[float]]]], sizes: dict[str, int]
) -> list[str]:
    """How close a mixture's batches can come to the plain stream's: given the extra arithmetic
    of its order in this code (plain / (plain + extra), as if reading and merging a mixture's
    records cost no more than a plain stream's), and given the least extra work of any code."""
    lines = [
        f"| data | row | extra arithmetic per epoch (s) | plain epoch, {MODES[1]} (s) | "
        "mixture / plain at most |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    floors = [
        "",
        "The least extra work of any mixture of A and B (each timed alone, at its fastest; "
        "ceilings plain / (plain + the order's) and plain / (plain + all three)):",
        "",
        f"| data | {SECOND_PERMUTATION} (s) | {INTERLEAVE} (s) | {TWO_SOURCES}, extra (s) | "
        f"plain epoch, {MODES[1]} (s) | at most, rows read as one gather | at most, rows "
        "gathered per source |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for case, rates in results.items():
        n = sizes[case]
        plain = n / max(rates[MODES[1]]["plain"])
        base = n / max(rates[ARITHMETIC]["plain"])
        for row, values in rates[ARITHMETIC].items():
            if row != "plain":
                extra = n / max(values) - base
                bound = plain / (plain + max(extra, 0.0))
                lines.append(f"| {case} | {row} | {extra:.4f} | {plain:.4f} | {bound:.2f}x |")
        least = {
            part: n / max(rates[FLOOR][part]) if rates[FLOOR][part] else 0.0
            for part in rates[FLOOR]
        }
        order = least[SECOND_PERMUTATION] + least[INTERLEAVE]
        two = max(least[TWO_SOURCES], 0.0)
        floors.append(
            f"| {case} | {least[SECOND_PERMUTATION]:.4f} | {least[INTERLEAVE]:.4f} | "
            f"{two:.4f} | {plain:.4f} | {plain / (plain + order):.2f}x | "
            f"{plain / (plain + order + two):.2f}x |"
        )
    return lines + floors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--small-records", type=int, default=smoke(300_000, 3_000), help="264-byte records"
    )
    parser.add_argument(
        "--big-records", type=int, default=smoke(8_000, 96), help="96 KiB records"
    )
    parser.add_argument(
        "--rounds", type=int, default=smoke(3, 1), help="rounds (the best counts)"
    )
    parser.add_argument("--only", default=",".join(CASES), help="cases: small,big")
    parser.add_argument("--tmp", default=None, help="parent of the temporary data folder")
    parser.add_argument("--json", help="also write every round's figures here")
    args = parser.parse_args(argv)
    wanted = [c for c in args.only.split(",") if c]
    unknown = set(wanted) - set(CASES)
    if unknown:
        parser.error(f"--only: unknown cases {sorted(unknown)}; choose from {CASES}")
    counts = {"small": args.small_records, "big": args.big_records}
    sizes = {case: counts[case] for case in wanted}
    print(f"yogadl_plus from {os.path.dirname(ydl.__file__)}", file=sys.stderr)
    root = tempfile.mkdtemp(prefix="ydl-bench-mixture-", dir=args.tmp)
    try:
        results = {case: run(case, n, args.rounds, root) for case, n in sizes.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n{os.cpu_count()} CPUs, best of {args.rounds} rounds, shuffled, stream construction "
        f"included; load average at the end {os.getloadavg()[0]:.2f}\n"
    )
    print(table(results, sizes))
    write_json(args.json, {"sizes": sizes, "rounds": args.rounds, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
