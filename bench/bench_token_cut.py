"""Token blocks: cutting blocks out of token columns against Megatron's floor, and the cost of
a version without token columns.

1. The cut (``tokencut.cut_blocks``) over in-memory token columns, against gathering the same
   blocks from a numpy memmap of the concatenation (Megatron's ``.bin``): 400k documents of
   1-127 int32 tokens, blocks of 2049, a shuffled epoch in batches of 16; with and without
   eos, one chunk and 64, with and without segments. Ratios are memmap time / cut time (1.0:
   as fast as the floor), same run, best of 3.
2. The same through a version (``token_blocks(ref)``): ``get_batch`` and a shuffled
   ``stream`` of batches, built in one chunk and in about 100, against the same floor.
3. The scanned index of a version without token columns (every document's length read once
   through ``get_batch``), in seconds per million documents.

Run: ``python -m bench.bench_token_cut [--documents N]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np

import yogadl_plus as ydl
from yogadl_plus.cache.tokencolumns import TokenChunk
from yogadl_plus.dataref import DataRef
from yogadl_plus.tokencut import cut_blocks

LENGTH, BATCH, EOS = 2049, 16, 50256


def _columns(
    lengths: np.ndarray, tokens: np.ndarray, chunks: int, eos: bool
) -> tuple[list[TokenChunk], np.ndarray]:
    """The documents as ``chunks`` token columns, and the flat tokens before each."""
    ends_all = np.cumsum(lengths)
    columns, cum = [], [0]
    for part in np.array_split(np.arange(len(lengths)), chunks):
        a = int(ends_all[part[0]] - lengths[part[0]])
        b = int(ends_all[part[-1]])
        ends = ends_all[part] - a
        columns.append(TokenChunk(tokens[a:b], ends, ends + np.arange(1, len(part) + 1)))
        cum.append(cum[-1] + (b - a) + (len(part) if eos else 0))
    return columns, np.array(cum, np.int64)


def _flat(lengths: np.ndarray, tokens: np.ndarray, eos: bool) -> np.ndarray:
    if not eos:
        return tokens
    out = np.empty(len(tokens) + len(lengths), np.int32)
    last = np.cumsum(lengths) + np.arange(len(lengths))
    keep = np.ones(len(out), bool)
    keep[last] = False
    out[keep] = tokens
    out[last] = EOS
    return out


def _best(run: Callable[[], None], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return min(times)


def cut_against_memmap(documents: int) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 128, documents)
    tokens = rng.integers(0, 50000, int(lengths.sum())).astype(np.int32)
    folder = tempfile.mkdtemp()
    for eos in (False, True):
        flat = _flat(lengths, tokens, eos)
        path = os.path.join(folder, f"flat{int(eos)}.bin")
        flat.tofile(path)
        memmap = np.memmap(path, np.int32, "r")
        order = rng.permutation(len(flat) // LENGTH)
        for chunks in (1, 64):
            columns, cum = _columns(lengths, tokens, chunks, eos)
            for segments in (False, True):
                floor = _best(lambda: _gather(memmap, order))  # noqa: B023
                ours = _best(lambda: _cut(columns, cum, order, EOS if eos else None, segments))  # noqa: B023
                print(
                    f"eos={eos!s:5} chunks={chunks:3} segments={segments!s:5}  memmap "
                    f"{floor * 1e3:7.1f} ms  cut {ours * 1e3:7.1f} ms  ratio {floor / ours:.2f}x"
                )


def _gather(memmap: np.ndarray, order: np.ndarray) -> None:
    """An epoch of Megatron's reads: each block one slice of the concatenation."""
    for s in range(0, len(order), BATCH):
        batch = order[s : s + BATCH]
        out = np.empty((len(batch), LENGTH), np.int32)
        for k, i in enumerate(batch.tolist()):
            out[k] = memmap[i * LENGTH : (i + 1) * LENGTH]


def _cut(
    columns: list[TokenChunk], cum: np.ndarray, order: np.ndarray, eos: int | None, segments: bool
) -> None:
    """An epoch of the same blocks cut out of the token columns."""
    for s in range(0, len(order), BATCH):
        starts = order[s : s + BATCH] * LENGTH
        cut_blocks(starts, LENGTH, cum, columns.__getitem__, np.dtype(np.int32), eos, segments)


def through_a_version(documents: int) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 128, documents)
    tokens = rng.integers(0, 50000, int(lengths.sum())).astype(np.int32)
    schema = ydl.Schema([ydl.Field("tokens", np.int32, (None,))])
    folder = tempfile.mkdtemp()
    for chunks in (1, 100):
        records = ({"tokens": d} for d in np.split(tokens, np.cumsum(lengths)[:-1]))
        settings = {} if chunks == 1 else {"chunk_bytes": tokens.nbytes * 13 // 10 // chunks}
        storage = ydl.LocalStorage(os.path.join(folder, str(chunks)))
        ref = ydl.cache_dataset(
            records, "toks", "v", storage, schema=schema, progress=False, **settings
        )
        for eos, segments in ((False, False), (True, False), (True, True)):
            flat = _flat(lengths, tokens, eos)
            path = os.path.join(folder, f"flat{int(eos)}.bin")
            flat.tofile(path)
            memmap = np.memmap(path, np.int32, "r")
            blocks = ydl.token_blocks(
                ref, length=LENGTH, eos=EOS if eos else None, segments=segments
            )
            order = np.random.default_rng(1).permutation(len(blocks))
            floor = _best(lambda: _gather(memmap, order))  # noqa: B023
            batch = _best(lambda: _get_batches(blocks, order))  # noqa: B023
            stream = _best(lambda: _stream(blocks))  # noqa: B023
            print(
                f"version chunks={len(ref.chunk_records):3} eos={eos!s:5} segments={segments!s:5}  "
                f"memmap {floor * 1e3:6.1f} ms  get_batch {batch * 1e3:6.1f} ms "
                f"({floor / batch:.2f}x)  stream {stream * 1e3:6.1f} ms ({floor / stream:.2f}x)"
            )


def _get_batches(blocks: ydl.TokenBlocks, order: np.ndarray) -> None:
    for s in range(0, len(order), BATCH):
        blocks.get_batch(order[s : s + BATCH])


def _stream(blocks: ydl.TokenBlocks) -> None:
    for _ in blocks.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH, drop_last=True):
        pass


class _NoTokenColumns(DataRef):
    def token_counts(self, field: str) -> np.ndarray | None:
        return None


def scanned_index(documents: int) -> None:
    rng = np.random.default_rng(1)
    schema = ydl.Schema([ydl.Field("tokens", np.int32, (None,))])
    records = (
        {"tokens": rng.integers(0, 50000, n).astype(np.int32)}
        for n in rng.integers(1, 128, documents)
    )
    storage = ydl.LocalStorage(tempfile.mkdtemp())
    ref = ydl.cache_dataset(records, "scan", "v", storage, schema=schema, progress=False)
    scanned = _NoTokenColumns(ref.directory, ref.manifest)
    began = time.perf_counter()
    blocks = ydl.token_blocks(scanned, length=LENGTH, eos=EOS)
    made = time.perf_counter() - began
    began = time.perf_counter()
    n = len(blocks)
    index = time.perf_counter() - began
    began = time.perf_counter()
    next(iter(blocks.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH)))
    first = time.perf_counter() - began
    print(
        f"scanned: token_blocks() {made * 1e3:.1f} ms; index of {documents} documents "
        f"{index:.2f} s ({index / documents * 1e6:.2f} s per million); {n} blocks; then the "
        f"first shuffled batch {first * 1e3:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=400_000)
    parser.add_argument("--scanned", type=int, default=200_000)
    args = parser.parse_args()
    cut_against_memmap(args.documents)
    through_a_version(args.documents)
    scanned_index(args.scanned)


if __name__ == "__main__":
    main()
