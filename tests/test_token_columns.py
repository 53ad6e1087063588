"""Token columns (cache/tokencolumns.py): every chunk keeps each 1-D integer field's tokens end to
end, with where each document ends, counted in the manifest (format 4) and checked like the
rest of the chunk; versions built before read as ever, without them."""

from __future__ import annotations

import json
import pickle
import uuid
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from helpers.damage import chunk_path, flip_byte
from hypothesis import given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.cache.layout import RecordLayout
from yogadl_plus.cache.manifest import ChunkInfo, Manifest, schema_digest
from yogadl_plus.cache.writer import ChunkWriter
from yogadl_plus.dataref import DataRef, DataRefOnDemand

DTYPES = [np.uint8, np.int32, np.int64]


def schema_of(dtype: Any, length: int | None, nullable: bool) -> ydl.Schema:
    return ydl.Schema(
        [
            ydl.Field("id", np.int64),
            ydl.Field("text", dtype, (length,), nullable=nullable),
            ydl.Field("note", str),
        ]
    )


def documents(
    rng: np.random.Generator, n: int, dtype: Any, length: int | None, nullable: bool
) -> list[np.ndarray | None]:
    """``n`` documents of random tokens (the whole range of ``dtype``), some empty, a few null
    where ``nullable``; all ``length`` long where given."""
    info = np.iinfo(dtype)
    docs: list[np.ndarray | None] = []
    for _ in range(n):
        size = length if length is not None else int(rng.choice([0, 1, 3, 17, 60]))
        docs.append(rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True))
        if nullable and rng.random() < 0.2:
            docs[-1] = None
    return docs


def build(
    storage: ydl.Storage, docs: list[Any], schema: ydl.Schema, path: str, **options: Any
) -> ydl.DataRef:
    n = len(docs)
    if path == "records":
        source: Any = [{"id": np.int64(i), "text": d, "note": f"d{i}"} for i, d in enumerate(docs)]
    else:
        fixed = schema["text"].shape[0] is not None and not schema["text"].nullable
        text = np.stack(docs) if fixed and n else docs
        source = {"id": np.arange(n), "text": text, "note": [f"d{i}" for i in range(n)]}
    options.setdefault("chunk_bytes", 600)
    return ydl.cache_dataset(source, "d", "v", storage, schema=schema, progress=False, **options)


def assert_token_columns(ref: ydl.DataRef, docs: list[Any], field: str = "text") -> None:
    """Each chunk's token column is its documents' tokens end to end, as numpy says."""
    dtype = ref.schema[field].dtype
    counts = ref.token_counts(field)
    assert counts is not None and counts.dtype == np.int64
    assert len(counts) == len(ref.manifest.chunks)
    first = 0
    for number, info in enumerate(ref.manifest.chunks):
        mine = docs[first : first + info.records]
        lengths = np.array([0 if d is None else len(d) for d in mine], np.int64)
        want = np.concatenate([np.empty(0, dtype), *(d for d in mine if d is not None)])
        chunk = ref.token_chunk(field, number)
        tokens = chunk.tokens[0 : len(chunk.tokens)]
        assert tokens.dtype == dtype
        np.testing.assert_array_equal(tokens, want)
        np.testing.assert_array_equal(chunk.ends, np.cumsum(lengths))
        np.testing.assert_array_equal(chunk.eos_ends, np.cumsum(lengths + 1))
        assert counts[number] == len(want) == info.tokens[field]
        first += info.records
    assert first == len(docs)


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 60),
    dtype=st.sampled_from(DTYPES),
    length=st.sampled_from([None, None, 0, 5]),
    nullable=st.booleans(),
    path=st.sampled_from(["records", "columns"]),
)
def test_each_chunks_token_column_is_its_documents_end_to_end(
    tmp_path_factory, seed, n, dtype, length, nullable, path
):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("store"))
    docs = documents(np.random.default_rng(seed), n, dtype, length, nullable)
    ref = build(storage, docs, schema_of(dtype, length, nullable), path)
    assert ref.manifest.format_version == 4
    assert_token_columns(ref, docs)
    batch = ref.get_batch(np.arange(n), fields="text")["text"]  # (the records as ever)
    for got, want in zip(batch, docs):
        assert (got is None) if want is None else np.array_equal(got, want)
    ref.close()


def test_a_parallel_build_keeps_token_columns(local_storage):
    docs = documents(np.random.default_rng(1), 400, np.int32, None, True)
    ref = build(local_storage, docs, schema_of(np.int32, None, True), "columns", workers=2)
    assert len({c.file.split("-chunk")[0] for c in ref.manifest.chunks}) >= 2  # parts
    assert_token_columns(ref, docs)


def test_a_chunk_with_token_columns_keeps_to_chunk_bytes(local_storage):
    """The token columns count in a chunk's size: it rolls over as soon as its records and
    token columns reach ``chunk_bytes``."""
    docs = [np.arange(100, dtype=np.int32)] * 400  # 400 bytes of tokens a record
    ref = build(local_storage, docs, schema_of(np.int32, None, False), "records", chunk_bytes=8000)
    for info in ref.manifest.chunks[:-1]:
        # Without its last record, a chunk's tokens, ends and eos_ends fit in chunk_bytes.
        assert (info.records - 1) * (400 + 16) < 8000
    assert_token_columns(ref, docs)


def test_token_columns_are_views_of_the_chunk_file(local_storage, tmp_path):
    """A large LMDB value is one run of overflow pages: read with buffers=True it is a view
    into the map (the same address twice, aligned), so a run of tokens costs one slice."""
    from yogadl_plus.cache.keys import token_key  # (new with token columns)

    docs = [np.arange(1000, dtype=np.int64) + i for i in range(50)]
    ref = build(local_storage, docs, schema_of(np.int64, None, False), "records", chunk_bytes=1e6)
    chunk = ref.token_chunk("text", 0)
    assert isinstance(chunk.tokens, np.ndarray) and not chunk.tokens.flags.owndata
    assert not chunk.tokens.flags.writeable  # (the map's read-only pages)
    copy = tmp_path / "chunk.mdb"  # (LMDB opens a file once per process)
    copy.write_bytes(chunk_path(ref).read_bytes())
    env = lmdb.open(str(copy), subdir=False, readonly=True, lock=False)
    with env.begin(buffers=True) as txn:
        key = token_key(ref.schema.names.index("text"), "tokens")
        a, b = (np.frombuffer(txn.get(key), np.int64) for _ in range(2))
        address = a.__array_interface__["data"][0]
        assert address == b.__array_interface__["data"][0] and address % 8 == 0
        np.testing.assert_array_equal(a, np.concatenate(docs))
    env.close()


def test_fields_without_token_columns_say_so(local_storage):
    schema = ydl.Schema(
        [
            ydl.Field("text", np.int32, (None,)),
            ydl.Field("floats", np.float32, (None,)),
            ydl.Field("grid", np.int32, (2, 2)),
            ydl.Field("id", np.int64),
        ]
    )
    records = [
        {"text": np.arange(i, dtype=np.int32), "floats": np.ones(i, np.float32)}
        | {"grid": np.zeros((2, 2), np.int32), "id": np.int64(i)}
        for i in range(5)
    ]
    ref = ydl.cache_dataset(records, "d", "v", local_storage, schema=schema, progress=False)
    assert ref.token_counts("text") is not None
    assert all(set(c.tokens) == {"text"} for c in ref.manifest.chunks)
    for field in ("floats", "grid", "id", "nothing"):
        assert ref.token_counts(field) is None
        with pytest.raises(ValueError, match=f"no token column of field {field!r}"):
            ref.token_chunk(field, 0)
    with pytest.raises(IndexError, match="chunk 1 out of range"):
        ref.token_chunk("text", 1)


def test_chunk_info_token_counts_are_frozen_and_travel():
    info = ChunkInfo("chunk-00000.mdb", 3, 100, "0" * 64, (), "1" * 32, {"b": 2, "a": 1})
    assert dict(info.tokens) == {"a": 1, "b": 2} and hash(info) == hash(
        pickle.loads(pickle.dumps(info))
    )
    assert pickle.loads(pickle.dumps(info)) == info
    with pytest.raises(TypeError):
        info.tokens["a"] = 5  # type: ignore[index]


def write_format_3(folder: Path, records: list[dict[str, Any]], schema: ydl.Schema) -> None:
    """A version as yogadl_plus wrote it before token columns: chunks without them, and a
    format 3 manifest (whose entries have no token counts)."""
    layout, build = RecordLayout(schema), uuid.uuid4().hex
    folder.mkdir(parents=True)
    with ChunkWriter(str(folder), 300, schema=schema_digest(schema), build=build) as writer:
        encoded = [layout.encode(r, i) for i, r in enumerate(records)]
        writer.add_many(encoded, layout.decode_columns(encoded, layout.column_fields))
    manifest = Manifest("d", "v", schema, writer.chunks, build=build, format_version=3)
    manifest.write(str(folder))
    body = json.loads((folder / "manifest.json").read_text())
    assert body["format_version"] == 3 and "tokens" not in body["chunks"][0]


def test_a_format_3_version_reads_as_ever_without_token_columns(tmp_path):
    docs = documents(np.random.default_rng(3), 30, np.int32, None, False)
    schema = schema_of(np.int32, None, False)
    records = [{"id": np.int64(i), "text": d, "note": f"d{i}"} for i, d in enumerate(docs)]
    write_format_3(tmp_path / "v", records, schema)
    ref = DataRef(str(tmp_path / "v"), Manifest.read(str(tmp_path / "v")))
    assert len(ref.manifest.chunks) >= 3
    assert ref.token_counts("text") is None
    with pytest.raises(ValueError, match="built before token columns"):
        ref.token_chunk("text", 0)
    for i, want in enumerate(docs):
        np.testing.assert_array_equal(ref[i]["text"], want)
    # Pickled as it travels to a worker, it stays format 3.
    assert pickle.loads(pickle.dumps(ref)).token_counts("text") is None


def edited(ref: ydl.DataRef, edit: Any) -> None:
    """Edit chunk 1's entry of ``ref``'s manifest on disk with ``edit(entry)``."""
    path = Path(ref.directory, "manifest.json")
    body = json.loads(path.read_text())
    edit(body["chunks"][1]["tokens"], body["chunks"][1])
    path.write_text(json.dumps(body))


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda t, c: t.update(text=-1), r"chunks\[1\]\.tokens\['text'\]"),
        (lambda t, c: t.update(text="7"), r"chunks\[1\]\.tokens\['text'\]"),
        (lambda t, c: t.update(other=3), r"chunks\[1\]\.tokens names .* unknown \['other'\]"),
        (lambda t, c: t.pop("text"), r"chunks\[1\]\.tokens names .* missing \['text'\]"),
        (lambda t, c: c.update(tokens=[5]), r"chunks\[1\]\.tokens must be"),
        (lambda t, c: c.pop("tokens"), r"chunks\[1\] has fields"),
    ],
)
def test_a_manifest_with_bad_token_counts_is_refused_when_read(local_storage, edit, named):
    docs = documents(np.random.default_rng(4), 40, np.int32, None, False)
    ref = build(local_storage, docs, schema_of(np.int32, None, False), "records")
    edited(ref, edit)
    with pytest.raises(ydl.CacheCorrupted, match=named):
        local_storage.fetch("d", "v")


def test_a_fixed_fields_token_count_must_be_its_length_times_the_records(local_storage):
    docs = documents(np.random.default_rng(5), 40, np.int64, 5, False)
    ref = build(local_storage, docs, schema_of(np.int64, 5, False), "columns")
    edited(ref, lambda tokens, chunk: tokens.update(text=tokens["text"] - 5))
    with pytest.raises(ydl.CacheCorrupted, match=r"chunks\[1\]\.tokens\['text'\] must be"):
        local_storage.fetch("d", "v")


def test_a_token_count_edited_in_the_manifest_is_refused_when_its_chunk_opens(local_storage):
    """A count that parses (an int) but is not the chunk's: the chunk's identity records its
    counts, so not one token or record of it is served."""
    docs = documents(np.random.default_rng(6), 40, np.int32, None, False)
    ref = build(local_storage, docs, schema_of(np.int32, None, False), "records")
    assert ref.manifest.chunks[1].tokens["text"] > 0
    edited(ref, lambda tokens, chunk: tokens.update(text=tokens["text"] - 1))
    opened = local_storage.fetch("d", "v")  # (chunk 0 is fine)
    start = int(ref.manifest.chunks[0].records)
    for read in (lambda: opened.token_chunk("text", 1), lambda: opened[start]):
        with pytest.raises(ydl.CacheCorrupted, match="its token count of field 'text'"):
            read()


def test_a_flipped_byte_in_a_token_column_is_found_before_a_token_is_served(local_storage):
    docs = [np.full(300, 7, np.int32)] * 20
    ref = build(local_storage, docs, schema_of(np.int32, None, False), "records", chunk_bytes=1e6)
    path = chunk_path(ref)
    ref.close()
    at = path.read_bytes().find(np.full(300 * 20, 7, np.int32).tobytes())
    assert at > 0
    flip_byte(path, at + 4 * 1234)
    with pytest.raises(ydl.CacheCorrupted, match="sha256"):
        local_storage.fetch("d", "v").token_chunk("text", 0)


@pytest.mark.servers
def test_a_pulled_or_on_demand_version_has_the_same_token_columns(s3_server, tmp_path):
    from helpers.remote_helpers import make_storage, spec_for

    spec = spec_for("s3", s3_server, s3_server.make_bucket(), prefix=uuid.uuid4().hex[:12])
    docs = documents(np.random.default_rng(7), 200, np.uint8, None, True)
    built = build(
        make_storage(spec, tmp_path / "builder"), docs, schema_of(np.uint8, None, True), "records"
    )
    assert len(built.manifest.chunks) >= 8
    pulled = make_storage(spec, tmp_path / "pulled").fetch("d", "v")
    limit = 4 * max(c.bytes for c in built.manifest.chunks)
    machine = make_storage(spec, tmp_path / "machine", local_cache_limit=limit)
    on_demand = machine.fetch("d", "v", on_demand=True)
    assert isinstance(on_demand, DataRefOnDemand)
    for ref in (pulled, on_demand):
        np.testing.assert_array_equal(ref.token_counts("text"), built.token_counts("text"))
        assert_token_columns(ref, docs)


def _resident_pages(path: Path) -> tuple[int, int]:
    """(pages of the file in the page cache, pages of the file), by mincore(2)."""
    import ctypes
    import mmap
    import os

    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        start = np.frombuffer(mapped, np.uint8)
        vector = (ctypes.c_ubyte * pages)()
        failed = libc.mincore(start.ctypes.data, size, vector)
        del start
    finally:
        mapped.close()
    if failed:
        pytest.skip(f"mincore failed: errno {ctypes.get_errno()}")
    return sum(b & 1 for b in vector), pages


@pytest.mark.skipif(not hasattr(__import__("os"), "posix_fadvise"), reason="needs posix_fadvise")
def test_reading_a_block_reads_its_pages_not_the_whole_column(local_storage):
    """py-lmdb's get reads every page of a value before handing it out: a whole column (a
    chunk's tokens, hundreds of megabytes) for the first block of it. Token columns are viewed
    in the map instead, so a block reads about its own pages."""
    import os

    docs = [np.arange(64, dtype=np.int32) + i for i in range(40_000)]  # 10 MB of tokens
    ref = build(
        local_storage, docs, schema_of(np.int32, None, False), "columns", chunk_bytes=1 << 30
    )
    assert len(ref.manifest.chunks) == 1
    path = chunk_path(ref)
    with open(path, "rb") as f:  # (clean pages: dropped from the page cache, no root needed)
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    before, pages = _resident_pages(path)
    if before > pages // 10:
        pytest.skip("this file system keeps the file's pages cached")
    blocks = ydl.token_blocks(ref, "text", length=2048, eos=0)
    middle = len(blocks) // 2
    flat = np.concatenate([np.append(d, 0) for d in docs])
    np.testing.assert_array_equal(
        blocks[middle]["tokens"], flat[middle * 2048 : (middle + 1) * 2048]
    )
    after, _ = _resident_pages(path)
    # The block's pages, the B-tree's, the ends searched: far fewer than the column's.
    assert after - before < pages // 4, (before, after, pages)
