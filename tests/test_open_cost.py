"""What opening a version costs: its chunk list, never its records. A version of ten times the
chunks opens, streams and hands out its first batch holding no more than its chunk list's
memory, whatever the stream's arguments; and the manifest's quick, column-wise check of a long chunk
list accepts exactly what the entry-by-entry checks accept. (The figures: bench/bench_scale.py.)
"""

from __future__ import annotations

import json
import tracemalloc
import uuid

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.cache import manifest as manifest_module
from yogadl_plus.cache.manifest import ChunkInfo, Manifest, chunk_id

CHUNK_RECORDS = 2_000
SMALL, BIG = 10 * CHUNK_RECORDS, 100 * CHUNK_RECORDS

# The stream's arguments (predicates and n-grams aside: they read every record by nature).
ARGUMENTS = {
    "shuffle": {"shuffle": True},
    "in order": {},
    "shuffle_window": {"shuffle": True, "shuffle_window": 2},
    "shards by records": {"shuffle": True, "num_shards": 3, "shard_rank": 1},
    "shards by chunks": {"shuffle": True, "num_shards": 2, "shard_rank": 1, "shard_by": "chunks"},
    "padded shards, drop_last": {
        "shuffle": True,
        "num_shards": 3,
        "shard_rank": 2,
        "pad_shard_remainder": True,
        "drop_last": True,
    },
    "start_offset": {"shuffle": True, "start_offset": "0.9N"},
    "global_start": {"shuffle": True, "num_shards": 3, "shard_rank": 1, "global_start": "0.9N"},
    "skip": {"shuffle": True, "skip": [3, 5, 7]},
    "fields": {"shuffle": True, "fields": ["i"]},
}


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("open-cost"))
    for n in (SMALL, BIG):
        column = {"i": np.arange(n, dtype=np.int64)}
        ref = ydl.cache_dataset(
            column, f"v{n}", "v1", storage, chunk_bytes=CHUNK_RECORDS * 16, progress=False
        )
        assert n // (2 * CHUNK_RECORDS) <= len(ref.manifest.chunks) <= 2 * n // CHUNK_RECORDS
        ref.close()
    return storage


def peak_bytes(storage, records: int, arguments: dict, mixed: bool = False) -> int:
    """The most Python and numpy memory held at once from opening the version of ``records``
    records through its stream's first batch of 256."""
    given_args = {k: int(0.9 * records) + 7 if v == "0.9N" else v for k, v in arguments.items()}
    tracemalloc.start()
    try:
        ref = storage.fetch(f"v{records}", "v1")
        source = ydl.mix({"a": ref, "b": ref}) if mixed else ref
        stream = source.stream(shuffle_seed=1, batch_size=256, **given_args)
        batch = next(iter(stream))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(batch["i"]) == 256
    ref.close()
    return peak


# A mixture shuffles its epoch whole and shards by records; its skip lists are by source.
NOT_MIXED = ("shuffle_window", "shards by chunks")
CASES = [
    pytest.param(arguments, False, id=f"{name}, a version") for name, arguments in ARGUMENTS.items()
]
CASES += [
    pytest.param(
        {**arguments, "skip": {"a": arguments["skip"]}} if "skip" in arguments else arguments,
        True,
        id=f"{name}, a mixture",
    )
    for name, arguments in ARGUMENTS.items()
    if name not in NOT_MIXED
]


@pytest.mark.parametrize("arguments, mixed", CASES)
def test_opening_holds_no_memory_per_record(storage, arguments, mixed):
    """Ten times the chunks (and records) cost less than 8 bytes a record more, all per-chunk
    bookkeeping included: no int64 per record is made between opening a version and its first
    batch. Counted by tracemalloc, not timed."""
    peak_bytes(storage, SMALL, arguments, mixed)  # (lazy imports and first calls)
    small = peak_bytes(storage, SMALL, arguments, mixed)
    big = peak_bytes(storage, BIG, arguments, mixed)
    assert big - small < 8 * (BIG - SMALL), (small, big)


# --- the quick check of a chunk list agrees with the entry-by-entry one ---

SCHEMA = ydl.Schema([ydl.Field("i", np.int64), ydl.Field("s", str)])
BUILD = "0123456789abcdef0123456789abcdef"


def manifest_text(chunks: int, format_version: int) -> str:
    parts = max(chunks // 2, 1)
    infos = []
    for k in range(chunks):
        name = f"p{k // parts:05d}-1a2b3c4d-chunk-{k % parts:05d}.mdb"
        infos.append(
            ChunkInfo(
                file=f"b-0123456789abcdef/{name}",
                records=100 + k % 7,
                bytes=4096 * (1 + k % 5),
                sha256=uuid.UUID(int=k).hex * 2,
                columns=("i",),
                id=chunk_id(BUILD, name) if format_version >= 2 else "",
            )
        )
    build = BUILD if format_version >= 3 else ""
    manifest = Manifest(
        "ds", "v1", SCHEMA, infos, "fp", "it", "0", format_version=format_version, build=build
    )
    return manifest.to_json()


DAMAGE = [
    ("records", -1),
    ("records", True),
    ("records", 1.0),
    ("records", 2**32),
    ("bytes", 0),
    ("bytes", 2**62 + 1),
    ("sha256", "A" * 64),
    ("sha256", "a" * 63),
    ("sha256", "é" * 64),
    ("id", "0" * 32),
    ("id", "g" * 32),
    ("id", None),
    ("file", "../x.mdb"),
    ("file", "b-1/chunk-00000.mdb\nchunk-00001.mdb"),
    ("file", "b-0123456789abcdef/p00000-1a2b3c4d-chunk-00009.mdb"),
    ("file", "chunk-٣.mdb"),
    ("file", 7),
    ("columns", ["i", "i"]),
    ("columns", ["s"]),
    ("columns", [["i"]]),
    ("columns", "i"),
    ("columns", []),
    ("tokens", {"i": 3}),
    ("tokens", []),
    ("offset", 0),
]


def parse_both(text: str) -> tuple[object, object]:
    """What Manifest.parse makes of ``text`` (the manifest, or the error's message), with the
    quick check, then with the entry-by-entry checks alone."""
    results = []
    for quick in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            if not quick:
                patch.setattr(manifest_module, "_checked_at_once", lambda *args: None)
            try:
                results.append(Manifest.parse(text.encode(), "here"))
            except ydl.CacheCorrupted as exc:
                results.append(str(exc))
    return results[0], results[1]


@settings(max_examples=60, deadline=None)
@given(
    format_version=st.integers(1, 4),
    chunks=st.integers(1, 6),
    where=st.integers(0, 5),
    damage=st.none() | st.sampled_from(DAMAGE),
    drop_build=st.booleans(),
)
def test_the_quick_check_accepts_what_the_entries_checks_accept(
    format_version, chunks, where, damage, drop_build
):
    body = json.loads(manifest_text(chunks, format_version))
    entry = body["chunks"][where % chunks]
    if damage is not None:
        entry[damage[0]] = damage[1]
    if drop_build:
        body.pop("build", None)
    quick, entries = parse_both(json.dumps(body))
    assert quick == entries
    if damage is None and not (drop_build and format_version >= 3):
        assert isinstance(quick, Manifest)
        assert [c.file for c in quick.chunks] == [e["file"] for e in body["chunks"]]
