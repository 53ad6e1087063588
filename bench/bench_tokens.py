"""Token blocks for language models: ``ydl.token_blocks`` against the memmap floor, Megatron's
index build, litdata's TokensLoader, a mixture against one source, and versions without token
columns.

    python -m bench.bench_tokens [--quick] [--data /tmp/ydl-bench-tokens] [--repeats 3]
                                 [--only floor,first,litdata,mixture,scanned] [--json out.json]
                                 [--baselines .baselines] [--before CHECKOUT]

Data: documents of 1-127 int32 tokens (lengths and tokens drawn from fixed seeds, tokens in
[0, 50256)), end-of-document token 50256, blocks of 2049 tokens, shuffled batches of 16. Every
version and file is built once into ``--data`` (default /tmp/ydl-bench-tokens) and reused by
later runs: a version of 10^7 documents takes minutes to build and about 6 GB (its 2.6 GB of
tokens, twice: records and token column), its ``.bin`` 2.6 GB more. Delete the folder to
start again. Sizes (documents): floor, litdata and mixture 400,000 (``--quick`` 100,000); first
batch 10^5, 10^6, 10^7 (``--quick`` 10^5, 10^6); scanned 10^5, 10^6.

Sections (``--only``):

- ``floor``: a whole shuffled epoch of ``token_blocks(ref, length=2049, eos=...)``, with eos,
  without, and with ``segments=True``: ``blocks.stream(shuffle=True, shuffle_seed=0,
  batch_size=16)`` (construction included), and ``blocks.get_batch`` of the same batches,
  against the floor: the same blocks gathered from a ``numpy.memmap`` of the concatenation
  (Megatron's ``.bin`` layout: every document's tokens end to end, each followed by eos when
  there is one), ``np.stack([mm[i*L:(i+1)*L] for i in batch])`` for the stream's own batches
  (its ``lineage``); with segments, plus each block's positions and segments from the document
  starts (``np.searchsorted``, a cumulative sum). Page cache warm for both (the version's files
  and the ``.bin`` read just before, and one untimed epoch each); best of ``--repeats``
  epochs. Untimed checks: every epoch hands out every block once (block count and the sums of
  tokens, positions, segments), and the first batch is the same array on all three sides.
  Ratio = memmap time / ydl time; target >= 0.5x (aim 0.8x). With eos, the ceiling of putting
  it in with numpy: the same blocks cut from a memmap of the documents without eos by the
  fewest numpy steps (``numpy_eos_epoch``: two binary searches, the runs, one boolean scatter).
- ``first``: from ``ydl.token_blocks(ref)`` to the first shuffled batch, on an open DataRef, and
  from a fresh process opening the version (``storage.fetch`` + the same); each in a fresh
  process that first did the same on a small version (imports and first calls out of the
  figure), best of ``--repeats`` processes (the version's files read into the page cache just
  before each; Megatron's ``.bin`` before its run). Target
  < 0.2 s at every size, and flat in N (largest / smallest <= 1.5x). Against Megatron's
  GPTDataset (``bench/baselines/token_peers.py`` in the ``megatron`` side venv): its index
  build and first batch with an empty index cache, and with the cache a first run left; and,
  in this process, Megatron's three indices computed in numpy (the stand-in where megatron-core
  does not install; the megatron peer checks that they equal GPTDataset's).
- ``litdata``: litdata 0.2.76 (``peers`` side venv): ``optimize`` of the same documents (eos
  after each) into its token format, then ``StreamingDataset(item_loader=TokensLoader(
  block_size=2049), shuffle=True)`` + ``StreamingDataLoader(batch_size=16, num_workers=0)``:
  per-epoch time per block and time to the first batch, against ydl's eos stream of the floor
  section and its first batch in this process (best of ``--repeats``).
- ``mixture``: ``ydl.mix({"A": token_blocks(a), "B": token_blocks(b)}, {"A": 3, "B": 1},
  epoch_size=len(one))`` over two versions holding the first three quarters of the documents
  and the last quarter, against ``token_blocks(one)`` over one version holding all of them;
  shuffled batches of 16, a whole epoch each, best of ``--repeats``, alternating. Ratio = one
  source's time / the mixture's. Away from 1.0x (outside 0.9-1.1x), or with ``--profile``,
  both epochs are profiled (cProfile) and their top functions printed under the table.
- ``scanned``: a version built before token columns existed (by the code at
  ``BEFORE_TOKEN_COLUMNS``, or ``--before CHECKOUT``, in a fresh process): token blocks then
  scan every document's length once at first use. Time to the first shuffled batch on an open
  DataRef, per million documents, against a version with token columns at the same N.

A row that cannot run here (a side venv or an old checkout missing) prints "n/a" and why.
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import functools
import io
import os
import pstats
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import yogadl_plus as ydl
from bench.baselines.token_peers import numpy_indices
from bench.harness import (
    BASELINE_VENVS,
    ROOT,
    best_of,
    call_in_tree,
    run_baseline,
    run_baseline_on_arrays,
    skip,
    smoke,
    target_cell,
    time_once,
    warm,
    write_json,
)

SEED = 0
EOS = 50_256
MAX_DOCUMENT = 127
LENGTH = 2049
BATCH = 16
PIECE = 1 << 18  # documents drawn at a time (each piece its own seeds): 10^7 never sits in memory
VERSION = "1"
WARM_DOCUMENTS = 1_000
# The last commit whose chunks keep no token columns: its builds are "versions built before".
BEFORE_TOKEN_COLUMNS = "8ab6e0d"
FLOOR_TARGET, FLOOR_AIM = 0.5, 0.8
FIRST_BATCH_TARGET_S = 0.2
FLAT_TARGET = 1.5
SECTIONS = ("floor", "first", "litdata", "mixture", "scanned")


@dataclass(frozen=True)
class Sizes:
    """Documents in each section: the full run, --quick, or smoke mode."""

    floor: int
    first: tuple[int, ...]
    scanned: tuple[int, ...]

    @staticmethod
    def pick(quick: bool) -> Sizes:
        if smoke(False, True):
            return Sizes(5_000, (10_000, 20_000), (10_000,))
        if quick:
            return Sizes(100_000, (10**5, 10**6), (10**5, 10**6))
        return Sizes(400_000, (10**5, 10**6, 10**7), (10**5, 10**6))


@dataclass
class Row:
    """One line of the table: yogadl_plus's figure, the baseline's, their ratio and target."""

    section: str
    what: str
    ydl: str
    baseline: str = ""
    base: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None

    def line(self) -> str:
        ratio = "" if self.ratio is None else f"{self.ratio:.2f}x"
        cells = [self.section, self.what, self.ydl, self.baseline, self.base, ratio]
        return "| " + " | ".join([*cells, target_cell(self.target, self.met)]) + " |"


def seconds(s: float | None) -> str:
    if s is None:
        return "n/a"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


# --------------------------------------------------------------------------- the documents


def pieces(n: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``n`` documents, a piece at a time: (lengths int64, their tokens end to end int32)."""
    for k, start in enumerate(range(0, n, PIECE)):
        count = min(PIECE, n - start)
        lengths = np.random.default_rng([SEED, k, 0]).integers(1, MAX_DOCUMENT + 1, count)
        tokens = np.random.default_rng([SEED, k, 1]).integers(
            0, EOS, int(lengths.sum()), dtype=np.int32
        )
        yield lengths, tokens


def documents(n: int) -> tuple[np.ndarray, np.ndarray]:
    """All ``n`` documents: (lengths, tokens end to end)."""
    parts = list(pieces(n))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def with_eos(lengths: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """The tokens with EOS after every document (what ``flat`` is with ``eos=EOS``)."""
    out = np.empty(len(tokens) + len(lengths), np.int32)
    is_eos = np.zeros(len(out), bool)
    is_eos[np.cumsum(lengths + 1) - 1] = True
    out[is_eos] = EOS
    out[~is_eos] = tokens
    return out


def part_of(n: int, part: str) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """The documents of a version: "all" of them, or the mixture's "a" (the first three
    quarters) or "b" (the rest)."""
    if part == "all":
        return pieces(n)
    lengths, tokens = documents(n)
    cut = 3 * n // 4
    split = int(lengths[:cut].sum())
    if part == "a":
        return [(lengths[:cut], tokens[:split])]
    return [(lengths[cut:], tokens[split:])]


def write_parquet(path: str, parts: Iterable[tuple[np.ndarray, np.ndarray]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    for lengths, tokens in parts:
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens))
        table = pa.table({"tokens": column})
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    assert writer is not None
    writer.close()


def build_version(root: str, dataset_id: str, n: int, part: str) -> float:
    """Builds version VERSION of ``dataset_id`` (``n`` documents, ``part`` of them) in
    LocalStorage ``root`` unless there; the seconds it took (0 when it was there). Runs in a
    fresh process for an older checkout (``call_in_tree``): a version built before token
    columns, where this checkout would write them."""
    storage = ydl.LocalStorage(root)
    writes_columns = hasattr(ydl, "token_blocks")
    try:
        ref = storage.fetch(dataset_id, VERSION)
        if not writes_columns or ref.token_counts("tokens") is not None:
            return 0.0
    except ydl.DatasetNotFound:
        pass
    parquet = os.path.join(root, f"{dataset_id}.parquet")
    began = time.perf_counter()
    write_parquet(parquet, part_of(n, part))
    ref = ydl.cache_dataset(
        parquet,
        dataset_id,
        VERSION,
        storage,
        schema=ydl.Schema([ydl.Field("tokens", np.int32, (None,))]),
        overwrite=True,
        progress=False,
        workers=2 if n > 4 * PIECE else None,
    )
    took = time.perf_counter() - began
    os.remove(parquet)
    if writes_columns and ref.token_counts("tokens") is None:
        raise SystemExit(f"{dataset_id}: this checkout built it without a token column")
    return took


def write_bin(path: str, n: int, eos: bool) -> None:
    """The documents' tokens end to end (each followed by EOS if ``eos``) as raw int32: the
    layout of Megatron's ``.bin`` file. Written once; later runs reuse it."""
    if os.path.exists(path):
        return
    with open(path + ".tmp", "wb") as f:
        for lengths, tokens in pieces(n):
            (with_eos(lengths, tokens) if eos else tokens).tofile(f)
    os.replace(path + ".tmp", path)


class Data:
    """Where everything lives under --data: versions with token columns (``store``), versions
    built before them (``store-before``), ``.bin`` files, Megatron's index folders."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.store = os.path.join(folder, "store")
        self.before = os.path.join(folder, "store-before")
        self.bins = os.path.join(folder, "bin")
        for path in (self.store, self.before, self.bins):
            os.makedirs(path, exist_ok=True)

    def version(self, n: int, part: str = "all", tree: str | None = None) -> tuple[str, str]:
        """(storage root, dataset id) of ``n`` documents (``part`` of them), built if missing
        (by ``tree``'s code when given: then into store-before)."""
        root = self.store if tree is None else self.before
        dataset_id = f"docs-{n}" + ("" if part == "all" else f"-{part}")
        if tree is None:
            took = build_version(root, dataset_id, n, part)
        else:
            took = call_in_tree(tree, "bench_tokens", "build_version", root, dataset_id, n, part)
        if took:
            print(f"built {dataset_id} in {root}: {took:.1f} s", file=sys.stderr, flush=True)
        return root, dataset_id

    def open(self, n: int, part: str = "all") -> ydl.DataRef:
        root, dataset_id = self.version(n, part)
        warm(os.path.join(root, dataset_id, VERSION))
        return ydl.LocalStorage(root).fetch(dataset_id, VERSION)

    def bin(self, n: int, eos: bool) -> str:
        path = os.path.join(self.bins, f"docs-{n}{'-eos' if eos else ''}.bin")
        write_bin(path, n, eos)
        return path

    def lengths(self, n: int) -> str:
        """Each document's length with its EOS (int32 .npy), for Megatron's index."""
        path = os.path.join(self.bins, f"docs-{n}-lengths.npy")
        if not os.path.exists(path):
            lengths = np.concatenate([p[0] for p in pieces(n)])
            np.save(path, (lengths + 1).astype(np.int32))
        return path


# --------------------------------------------------------------------------- the floor


def block_segments(starts: np.ndarray, begin: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The positions and segments of the block at ``begin`` of the concatenation whose
    documents start at ``starts`` (sorted, no empty document): the floor's arithmetic."""
    first = int(np.searchsorted(starts, begin, side="right"))
    stop = int(np.searchsorted(starts, begin + length, side="left"))
    inside = starts[first:stop] - begin  # documents starting at offsets 1..length-1
    marks = np.zeros(length, np.int32)
    marks[inside] = 1
    segment = np.cumsum(marks, dtype=np.int32)
    base = np.concatenate([[begin - int(starts[first - 1])], -inside])
    position = np.arange(length, dtype=np.int64) + base[segment]
    return position, segment


def memmap_epoch(
    mm: np.ndarray,
    order: list[np.ndarray],
    starts: np.ndarray | None,
    visit: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """The floor: each batch of ``order`` gathered from the memmap, block by block."""
    for batch in order:
        item = {"tokens": np.stack([mm[i * LENGTH : (i + 1) * LENGTH] for i in batch])}
        if starts is not None:
            cut = [block_segments(starts, int(i) * LENGTH, LENGTH) for i in batch]
            item["position"] = np.stack([c[0] for c in cut])
            item["segment"] = np.stack([c[1] for c in cut])
        if visit is not None:
            visit(item)


def numpy_eos_epoch(
    plain: np.ndarray,
    eos_ends: np.ndarray,
    order: list[np.ndarray],
    visit: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """The ceiling of inserting eos in numpy: each batch of ``order`` cut from a memmap of the
    documents without eos (``plain``) by the fewest numpy steps (two binary searches, the
    blocks' token runs, one boolean scatter), what ``token_blocks(..., eos=...)`` does at
    least, with none of its bookkeeping."""
    for batch in order:
        n = len(batch)
        lo = np.asarray(batch, np.int64) * LENGTH
        done = eos_ends.searchsorted(np.concatenate([lo, lo + LENGTH]), "right")
        first, last = done[:n], done[n:]
        texts = np.concatenate(
            [plain[a:b] for a, b in zip((lo - first).tolist(), (lo + LENGTH - last).tolist())]
        )
        counts = last - first
        owner = np.repeat(np.arange(n), counts)
        ended = np.arange(int(counts.sum())) + np.repeat(
            first - (np.cumsum(counts) - counts), counts
        )
        at = owner * LENGTH + eos_ends[ended] - 1 - lo[owner]
        tokens = np.empty((n, LENGTH), np.int32)
        rest = np.ones(n * LENGTH, bool)
        rest[at] = False
        tokens.reshape(-1)[rest] = texts
        tokens.reshape(-1)[at] = EOS
        if visit is not None:
            visit({"tokens": tokens})


def stream_epoch(
    ref: Any,
    eos: int | None,
    segments: bool,
    visit: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    blocks = ydl.token_blocks(ref, length=LENGTH, eos=eos, segments=segments)
    for batch in blocks.stream(shuffle=True, shuffle_seed=SEED, batch_size=BATCH):
        if visit is not None:
            visit(batch)


def get_batch_epoch(
    ref: Any,
    order: list[np.ndarray],
    eos: int | None,
    segments: bool,
    visit: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    blocks = ydl.token_blocks(ref, length=LENGTH, eos=eos, segments=segments)
    for batch in order:
        item = blocks.get_batch(batch)
        if visit is not None:
            visit(item)


@dataclass
class Digest:
    """What an epoch handed out, for the untimed checks: blocks, sums, the first batch."""

    blocks: int = 0
    sums: dict[str, int] = field(default_factory=dict)
    first: dict[str, np.ndarray] | None = None

    def __call__(self, item: dict[str, Any]) -> None:
        arrays = {k: np.asarray(v) for k, v in item.items()}
        if self.first is None:
            self.first = arrays
        self.blocks += len(arrays["tokens"])
        for k, v in arrays.items():
            self.sums[k] = self.sums.get(k, 0) + int(v.sum(dtype=np.int64))

    def check(self, other: Digest, what: str) -> None:
        assert self.first is not None and other.first is not None
        same_first = self.first.keys() == other.first.keys() and all(
            np.array_equal(self.first[k], other.first[k]) for k in self.first
        )
        if (self.blocks, self.sums) != (other.blocks, other.sums) or not same_first:
            raise SystemExit(
                f"{what}: an epoch gave {other.blocks} blocks, sums {other.sums}, expected "
                f"{self.blocks}, {self.sums} (first batch the same: {same_first})"
            )


def floor_rows(data: Data, n: int, repeats: int) -> tuple[list[Row], dict[str, float]]:
    """The floor section's rows, and ydl's best eos-stream epoch (for litdata's rows)."""
    ref = data.open(n)
    lengths, _ = documents(n)
    rows: list[Row] = []
    kept: dict[str, float] = {}
    for name, eos, segments in (
        ("eos", EOS, False),
        ("no eos", None, False),
        ("eos, segments", EOS, True),
    ):
        path = data.bin(n, eos is not None)
        warm(path)
        mm = np.memmap(path, np.int32, mode="r")
        blocks = ydl.token_blocks(ref, length=LENGTH, eos=eos, segments=segments)
        if len(blocks) != len(mm) // LENGTH:
            raise SystemExit(f"{name}: {len(blocks)} blocks, expected {len(mm) // LENGTH}")
        stream = blocks.stream(shuffle=True, shuffle_seed=SEED, batch_size=BATCH)
        order = stream.lineage(-(-len(blocks) // BATCH))
        starts = None
        if segments:
            starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])
        runs: dict[str, Callable[..., None]] = {
            "memmap": functools.partial(memmap_epoch, mm, order, starts),
            "stream": functools.partial(stream_epoch, ref, eos, segments),
            "get_batch": functools.partial(get_batch_epoch, ref, order, eos, segments),
        }
        if eos is not None and not segments:
            plain = np.memmap(data.bin(n, False), np.int32, mode="r")
            eos_ends = np.cumsum(lengths) + np.arange(1, len(lengths) + 1)
            runs["numpy eos"] = functools.partial(numpy_eos_epoch, plain, eos_ends, order)
        digests = {side: Digest() for side in runs}
        for side, run in runs.items():  # untimed: page cache, first touches, the checks
            run(visit=digests[side])
        for side in runs:
            if side != "memmap":
                digests["memmap"].check(digests[side], f"{name}, {side}")
        best = {side: best_of(run, repeats)[0] for side, run in runs.items()}
        if "numpy eos" in best:
            rows.append(Row(
                "floor", f"{name}: the ceiling, eos put in by the fewest numpy steps",
                f"{len(blocks) / best['numpy eos']:,.0f} blocks/s", "numpy memmap gather",
                f"{len(blocks) / best['memmap']:,.0f} blocks/s", best["memmap"] / best["numpy eos"],
                "", None,
            ))  # fmt: skip
        for side in ("stream", "get_batch"):
            ratio = best["memmap"] / best[side]
            rows.append(Row(
                "floor", f"{name}: {side}, {len(blocks):,} blocks",
                f"{len(blocks) / best[side]:,.0f} blocks/s", "numpy memmap gather",
                f"{len(blocks) / best['memmap']:,.0f} blocks/s", ratio,
                f">= {FLOOR_TARGET}x (aim {FLOOR_AIM}x)", ratio >= FLOOR_TARGET,
            ))  # fmt: skip
        kept[name] = best["stream"] / len(blocks)
        del mm
    return rows, kept


# --------------------------------------------------------------------------- the first batch


def first_batch(ref: Any, eos: int | None = EOS) -> dict[str, Any]:
    """From ``token_blocks(ref)`` to its first shuffled batch."""
    blocks = ydl.token_blocks(ref, length=LENGTH, eos=eos)
    batch: dict[str, Any] = next(
        iter(blocks.stream(shuffle=True, shuffle_seed=SEED, batch_size=BATCH))
    )
    if np.asarray(batch["tokens"]).shape != (BATCH, LENGTH):
        raise SystemExit(f"a first batch of shape {np.asarray(batch['tokens']).shape}")
    return batch


def first_batch_process(root: str, dataset_id: str, warm_id: str) -> dict[str, float]:
    """In a fresh process (``call_in_tree``): the same on the small version ``warm_id`` first,
    then the seconds to open ``dataset_id`` (``open_s``), to its first batch (``first_s``) and
    to the first batch of a second TokenBlocks on the same DataRef (``again_s``)."""
    storage = ydl.LocalStorage(root)
    first_batch(storage.fetch(warm_id, VERSION))
    open_s, ref = time_once(lambda: storage.fetch(dataset_id, VERSION))
    first_s = time_once(lambda: first_batch(ref))[0]
    again_s = time_once(lambda: first_batch(ref))[0]
    return {"open_s": open_s, "first_s": first_s, "again_s": again_s}


def fresh_processes(
    root: str, dataset_id: str, warm_id: str, repeats: int, tree: str | None = None
) -> dict[str, float]:
    """``first_batch_process`` in ``repeats`` fresh processes: the best of each figure."""
    runs = []
    for _ in range(repeats):
        # This VM pages a file out seconds after its last read: every process starts warm.
        warm(os.path.join(root, dataset_id, VERSION))
        runs.append(
            call_in_tree(tree, "bench_tokens", "first_batch_process", root, dataset_id, warm_id)
        )
    best = {k: min(r[k] for r in runs) for k in runs[0]}
    best["fresh_s"] = min(r["open_s"] + r["first_s"] for r in runs)
    return best


def megatron_peer(data: Data, n: int, args: argparse.Namespace) -> dict[str, Any] | str:
    """Megatron's GPTDataset on the ``n`` documents (token_peers.py in the megatron venv)."""
    work = os.path.join(data.folder, "megatron", f"docs-{n}")
    warm(data.bin(n, eos=True))
    return run_baseline(
        "megatron",
        "token_peers",
        ["megatron", "--bin", data.bin(n, eos=True), "--lengths", data.lengths(n),
         "--workdir", work, "--eos", str(EOS), "--repeats", str(args.repeats)],
        python=os.path.join(args.baselines, "megatron", "bin", "python"),
        timeout=3600,
    )  # fmt: skip


def first_rows(data: Data, sizes: Sizes, args: argparse.Namespace) -> tuple[list[Row], list[str]]:
    """The first-batch section's rows and notes."""
    rows: list[Row] = []
    notes: list[str] = []
    _, warm_id = data.version(WARM_DOCUMENTS)
    firsts: dict[str, dict[int, float]] = {"first_s": {}, "again_s": {}}
    for n in sizes.first:
        root, dataset_id = data.version(n)
        ours = fresh_processes(root, dataset_id, warm_id, args.repeats)
        for key, by_n in firsts.items():
            by_n[n] = ours[key]
        peer = megatron_peer(data, n, args)
        if isinstance(peer, str):
            notes.append(f"Megatron at {n:,} documents: n/a, {peer}")
            peer = {}
        lengths = np.load(data.lengths(n))
        index_s, _ = best_of(functools.partial(numpy_indices, lengths, LENGTH - 1), args.repeats)
        met = ours["first_s"] < FIRST_BATCH_TARGET_S
        for what, mine, baseline, theirs in (
            ("DataRef open", ours["first_s"], "Megatron GPTDataset, index built",
             peer.get("build_first_batch_s")),
            ("fresh process: open + first batch", ours["fresh_s"],
             "Megatron GPTDataset, index from its cache", peer.get("cached_first_batch_s")),
            ("DataRef open", ours["first_s"], "Megatron's indices in numpy", index_s),
        ):  # fmt: skip
            rows.append(Row(
                "first batch", f"N = {n:,}: {what}", seconds(mine), baseline, seconds(theirs),
                None if theirs is None else theirs / mine,
                f"< {FIRST_BATCH_TARGET_S} s" if what == "DataRef open" else "",
                met if what == "DataRef open" else None,
            ))  # fmt: skip
        notes.append(
            f"N = {n:,}: a second token_blocks on the same DataRef to its first batch: "
            f"{seconds(ours['again_s'])}; opening the version: {seconds(ours['open_s'])}"
        )
    small, big = min(sizes.first), max(sizes.first)
    for key, what in (("first_s", "first batch"), ("again_s", "a second TokenBlocks' first batch")):
        flat = firsts[key][big] / firsts[key][small]
        rows.append(Row(
            "first batch", f"flat in N: {what} at {big:,} / at {small:,}", f"{flat:.2f}x",
            target=f"<= {FLAT_TARGET}x", met=flat <= FLAT_TARGET,
        ))  # fmt: skip
    return rows, notes


# --------------------------------------------------------------------------- litdata


def litdata_rows(
    data: Data, n: int, stream_per_block: float | None, args: argparse.Namespace
) -> tuple[list[Row], list[str]]:
    """litdata's TokensLoader on the same documents against ydl's eos stream and first batch."""
    ref = data.open(n)
    if stream_per_block is None:  # the floor section did not run: ydl's epoch, here
        blocks = len(ydl.token_blocks(ref, length=LENGTH, eos=EOS))
        stream_per_block = best_of(lambda: stream_epoch(ref, EOS, False), args.repeats)[0] / blocks
    first_batch(ref)
    first_s = best_of(lambda: first_batch(ref), args.repeats)[0]
    lengths, tokens = documents(n)
    peer = run_baseline_on_arrays(
        "peers",
        "token_peers",
        {"flat": with_eos(lengths, tokens), "ends": np.cumsum(lengths + 1)},
        data.folder,
        ["litdata", "--workdir", "{workdir}", "--length", str(LENGTH),
         "--batch-size", str(BATCH), "--repeats", str(args.repeats)],
        python=os.path.join(args.baselines, "peers", "bin", "python"),
    )  # fmt: skip
    if isinstance(peer, str):
        return [Row("litdata", "epoch, first batch", "n/a")], [f"litdata: n/a, {peer}"]
    theirs = peer["epoch_s"] / peer["blocks"]
    rows = [
        Row("litdata", f"shuffled epoch, {n:,} documents", f"{1 / stream_per_block:,.0f} blocks/s",
            f"litdata {peer['litdata']} TokensLoader", f"{1 / theirs:,.0f} blocks/s",
            theirs / stream_per_block),
        Row("litdata", "construction to first batch", seconds(first_s),
            "litdata StreamingDataset + loader", seconds(peer["first_batch_s"]),
            peer["first_batch_s"] / first_s),
    ]  # fmt: skip
    notes = [
        f"litdata: optimize took {peer['build_s']:.1f} s (1 worker, untimed for ydl); it cut "
        f"{peer['blocks']:,} blocks (blocks stay inside its chunks)"
    ]
    return rows, notes


# --------------------------------------------------------------------------- the mixture


def top_functions(run: Callable[[], Any], count: int = 12) -> list[str]:
    """Where ``run`` spends its time: the ``count`` functions of most own time (cProfile)."""
    profile = cProfile.Profile()
    profile.runcall(run)
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(count)
    text = out.getvalue()
    return text[text.find("ncalls") :].rstrip().splitlines()


def mixture_rows(data: Data, n: int, args: argparse.Namespace) -> tuple[list[Row], list[str]]:
    """A 3:1 mixture of two token sources against one source over the same documents."""
    one, a, b = data.open(n), data.open(n, "a"), data.open(n, "b")
    size = len(ydl.token_blocks(one, length=LENGTH, eos=EOS))

    def plain() -> int:
        blocks = ydl.token_blocks(one, length=LENGTH, eos=EOS)
        stream = blocks.stream(shuffle=True, shuffle_seed=SEED, batch_size=BATCH)
        return sum(len(batch["tokens"]) for batch in stream)

    def mixture() -> int:
        sources = {
            "A": ydl.token_blocks(a, length=LENGTH, eos=EOS),
            "B": ydl.token_blocks(b, length=LENGTH, eos=EOS),
        }
        mix = ydl.mix(sources, {"A": 3, "B": 1}, epoch_size=size)
        stream = mix.stream(shuffle=True, shuffle_seed=SEED, batch_size=BATCH)
        return sum(len(batch["tokens"]) for batch in stream)

    if (plain(), mixture()) != (size, size):  # untimed: page cache, and whole epochs
        raise SystemExit(f"an epoch is not {size} blocks")
    times: dict[str, list[float]] = {"one": [], "mix": []}
    for k in range(args.repeats):
        for side in ("one", "mix") if k % 2 == 0 else ("mix", "one"):
            times[side].append(time_once(plain if side == "one" else mixture)[0])
    best = {side: min(t) for side, t in times.items()}
    ratio = best["one"] / best["mix"]
    rows = [Row(
        "mixture", f"3:1 of two sources, {size:,} blocks an epoch",
        f"{size / best['mix']:,.0f} blocks/s", "one source, same documents",
        f"{size / best['one']:,.0f} blocks/s", ratio,
    )]  # fmt: skip
    notes: list[str] = []
    if args.profile or not 0.9 <= ratio <= 1.1:
        for name, run in (("mixture", mixture), ("one source", plain)):
            notes.append(f"profile of one {name} epoch (own time):\n\n    "
                         + "\n    ".join(top_functions(run)))  # fmt: skip
    return rows, notes


# --------------------------------------------------------------------------- scanned versions


def before_tree(checkout: str | None) -> str:
    """The checkout that builds versions without token columns: ``checkout``, or the code at
    BEFORE_TOKEN_COLUMNS taken from this repository's history (removed at exit)."""
    if checkout:
        return os.path.abspath(checkout)
    folder = tempfile.mkdtemp(prefix="ydl-bench-before-tokens-")
    atexit.register(shutil.rmtree, folder, True)
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", "--format=tar", BEFORE_TOKEN_COLUMNS, "yogadl_plus"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def scanned_rows(data: Data, sizes: Sizes, args: argparse.Namespace) -> tuple[list[Row], list[str]]:
    """Versions built before token columns: the first batch, against versions with them."""
    try:
        tree = before_tree(args.before)
    except (OSError, subprocess.CalledProcessError) as e:
        why = f"no checkout from before token columns ({e}); pass --before CHECKOUT"
        return [Row("scanned", "first batch", "n/a")], [f"scanned: {why}"]
    _, warm_before = data.version(WARM_DOCUMENTS, tree=tree)
    _, warm_id = data.version(WARM_DOCUMENTS)
    rows: list[Row] = []
    for n in sizes.scanned:
        before, before_id = data.version(n, tree=tree)
        scanned = fresh_processes(before, before_id, warm_before, args.repeats)["first_s"]
        root, dataset_id = data.version(n)
        columns = fresh_processes(root, dataset_id, warm_id, args.repeats)["first_s"]
        rows.append(Row(
            "scanned", f"N = {n:,}: first batch, DataRef open",
            f"{seconds(scanned)} ({seconds(scanned * 1e6 / n)} per million documents)",
            "a version with token columns", seconds(columns), columns / scanned,
        ))  # fmt: skip
    return rows, []


# --------------------------------------------------------------------------- the run


HEADER = (
    "| section | what | yogadl_plus | baseline | baseline's figure "
    "| ratio (baseline time / ydl time) | target |\n| --- | --- | ---: | --- | ---: | ---: | --- |"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (see the docstring)")
    parser.add_argument("--data", default="/tmp/ydl-bench-tokens",
                        help="the versions and files, built once and reused")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=smoke(3, 1), help="best of (default 3)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="sections, comma-separated")
    parser.add_argument("--baselines", default=BASELINE_VENVS, help="the side venvs' folder")
    parser.add_argument("--before", help="a checkout from before token columns (scanned)")
    parser.add_argument("--profile", action="store_true", help="profile the mixture anyway")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if not set(only) <= set(SECTIONS):
        parser.error(f"--only: sections are {', '.join(SECTIONS)}")
    if not hasattr(ydl, "token_blocks"):
        skip("this checkout has no ydl.token_blocks")
    sizes = Sizes.pick(args.quick)
    data = Data(args.data)
    rows: list[Row] = []
    notes: list[str] = []
    per_block: dict[str, float] = {}
    if "floor" in only:
        floor, per_block = floor_rows(data, sizes.floor, args.repeats)
        rows += floor
    sections: dict[str, Callable[[], tuple[list[Row], list[str]]]] = {
        "first": lambda: first_rows(data, sizes, args),
        "litdata": lambda: litdata_rows(data, sizes.floor, per_block.get("eos"), args),
        "mixture": lambda: mixture_rows(data, sizes.floor, args),
        "scanned": lambda: scanned_rows(data, sizes, args),
    }
    for name, run in sections.items():
        if name in only:
            print(f"{name} ...", file=sys.stderr, flush=True)
            more, said = run()
            rows += more
            notes += said
    print(HEADER)
    for row in rows:
        print(row.line())
    print(f"\nPage cache warm on both sides. Data in {args.data} (reused by later runs).\n")
    for note in notes:
        print(f"- {note}")
    write_json(args.json, {"rows": [vars(r) for r in rows], "notes": notes})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
