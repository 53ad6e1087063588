"""Writing a whole version into a folder: the write primitives every build is made of (the
schema to write with, records encoded into chunk files that are checked as they close, the
manifest written last, the progress bar), and ``write_version``, which is those steps in a row.

A storage publishes the folder (``Storage.cacheable`` writes with ``write_version``); the
parallel builds of yogadl_plus.building run the same steps in their tasks.

Every chunk of a build records the build's id, and the manifest names it (cache/manifest.py,
format 3), so that no chunk of another build can pass for one of this one. The writers of a
build, in whatever process or machine, learn the id from the folder they write into
(``build_of``): the staging folder holds it, put there before the build starts
(``Storage.get_or_build``), as does each folder an upload sink hands its tasks.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from yogadl_plus._version import __version__
from yogadl_plus.cache.batch_encoder import BatchEncoder
from yogadl_plus.cache.layout import RecordLayout
from yogadl_plus.cache.manifest import ChunkInfo, Manifest, new_build_id, schema_digest
from yogadl_plus.cache.reader import ChunkSet
from yogadl_plus.cache.tokencolumns import TokenField
from yogadl_plus.cache.writer import DEFAULT_CHUNK_BYTES, ChunkWriter, EqualValues
from yogadl_plus.errors import unwritable
from yogadl_plus.progress import progress_bar
from yogadl_plus.schema import Schema, infer_schema
from yogadl_plus.sources import Source, as_source

__all__ = [
    "BUILD_FILE",
    "INFER_RECORDS",
    "build_of",
    "caching_bar",
    "finish_version",
    "mark_build",
    "source_blocks",
    "write_blocks",
    "write_version",
]

INFER_RECORDS = 64
#: In a folder a build writes chunks into: the build's id (see the module).
BUILD_FILE = "+build"
_BLOCK_RECORDS = 4096
# What a build writes, a block at a time: (records, their count) or a batch of columns
# (field name -> the rows' values, and the rows).
Blocks = Iterable[tuple["list[Any] | dict[str, Any]", int]]


def write_version(
    folder: str,
    source: Any,
    dataset_id: str,
    version: str,
    *,
    schema: Schema | None = None,
    progress: bool = True,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Manifest:
    """Write all records of ``source`` as chunks in ``folder``, check them, write the manifest."""
    src = as_source(source, schema)
    given = schema is not None
    schema, blocks = source_blocks(src, schema)
    with caching_bar(progress, src.length, dataset_id, version) as advance:
        chunks = write_blocks(folder, blocks, schema, chunk_bytes, on_block=advance)
    return finish_version(folder, src, schema, chunks, dataset_id, version, schema_given=given)


def source_blocks(src: Source, schema: Schema | None) -> tuple[Schema, Blocks]:
    """The schema to write with (given, known by the source, or inferred from its first
    records) and the source's records: as the source's batches of columns where it has them,
    else as records, none of them lost to the inference."""
    batches = src.column_batches()
    if batches is not None:
        schema = schema if schema is not None else src.schema
        assert schema is not None, "a source of columns knows its schema"
        return schema, batches
    records = iter(src.records())
    schema = schema if schema is not None else src.schema
    if schema is None:
        head = list(itertools.islice(records, INFER_RECORDS))
        schema = infer_schema(head)
        records = itertools.chain(head, records)
    return schema, _in_blocks(records)


def write_blocks(
    folder: str,
    blocks: Blocks,
    schema: Schema,
    chunk_bytes: int,
    *,
    first: int = 0,
    prefix: str = "",
    on_block: Callable[[int], Any] | None = None,
    on_chunk: Callable[[ChunkInfo], ChunkInfo] | None = None,
) -> list[ChunkInfo]:
    """Encode ``blocks`` (``source_blocks``'s) into chunk files ``<prefix>chunk-NNNNN.mdb`` in
    ``folder`` and check that each reads back. ``first`` is the index of the first record, for
    error messages. ``on_chunk`` takes each chunk as soon as it is checked (a build task
    uploads it while it writes the next) and returns it as the manifest will name it."""
    layout = RecordLayout(schema)
    batches = BatchEncoder(layout)
    written = first
    chunks: list[ChunkInfo] = []

    def closed(info: ChunkInfo) -> None:
        _check_readable(folder, schema, [info], layout)
        chunks.append(on_chunk(info) if on_chunk is not None else info)

    digest, build = schema_digest(schema), build_of(folder)
    positions = {name: field.position for name, field in TokenField.of_schema(schema).items()}
    writing = ChunkWriter(
        folder, chunk_bytes, prefix, on_close=closed, schema=digest, build=build, tokens=positions
    )
    with writing as writer:
        for block, rows in blocks:
            encoded: list[bytes] | EqualValues
            if isinstance(block, list):  # records
                encoded = [layout.encode(r, written + j) for j, r in enumerate(block)]
                columns = layout.decode_columns(encoded, layout.column_fields)
                tokens = layout.token_batches(encoded)
            else:  # a batch of columns, encoded a column at a time
                encoded, columns, tokens = batches.encode(block, rows, written)
            writer.add_many(encoded, columns, tokens)
            written += rows
            if on_block is not None:
                on_block(rows)
    return chunks


def _in_blocks(records: Iterable[Mapping[str, Any]]) -> Iterator[tuple[list[Any], int]]:
    records = iter(records)
    while block := list(itertools.islice(records, _BLOCK_RECORDS)):
        yield block, len(block)


def finish_version(
    folder: str,
    src: Source,
    schema: Schema,
    chunks: list[ChunkInfo],
    dataset_id: str,
    version: str,
    *,
    schema_given: bool = False,
) -> Manifest:
    """Write the manifest of ``chunks`` into ``folder``: the last step of every build. With it,
    what ``src`` tells of itself unread (its schema: unless ``schema_given``, the build was
    given one, which later calls are then compared with instead)."""
    told = None if schema_given else src.description().schema
    manifest = Manifest(
        dataset_id=dataset_id,
        version=version,
        schema=schema,
        chunks=chunks,
        source_fingerprint=src.fingerprint(),
        source_kind=src.kind,
        library_version=__version__,
        build=build_of(folder),
        source_schema=told,
    )
    manifest.write(folder)
    return manifest


def build_of(folder: str) -> str:
    """The id of the build writing chunks into ``folder``: the one its BUILD_FILE holds, else a
    new one, put there for the folder's other writers."""
    try:
        with open(os.path.join(folder, BUILD_FILE)) as f:
            return f.read()
    except FileNotFoundError:
        return mark_build(folder, new_build_id())


def mark_build(folder: str, build: str) -> str:
    """Make ``build`` the id of the build writing into ``folder`` unless it has one already
    (another writer was first): the id it has."""
    path = os.path.join(folder, BUILD_FILE)
    temp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(temp, "w") as f:
            f.write(build)
        try:
            os.link(temp, path)  # whole, and only if there is none
        except FileExistsError:
            pass
        except OSError:  # no hard links here
            os.replace(temp, path)
        with open(path) as f:
            return f.read()
    except OSError as exc:
        raise unwritable(path, exc) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)


def _check_readable(
    folder: str, schema: Schema, chunks: list[ChunkInfo], layout: RecordLayout
) -> None:
    """Reopen chunks just written and decode the first and last record of each."""
    checked = Manifest("check", "check", schema, chunks, build=build_of(folder))
    chunk_set = ChunkSet(folder, checked)
    try:
        for start, info in zip(chunk_set.starts, chunks):
            for index in {int(start), int(start) + info.records - 1}:
                layout.decode_record(chunk_set.get(index), schema.fields)
    finally:
        chunk_set.close()


def caching_bar(
    enabled: bool, total: int | None, dataset_id: str, version: str
) -> contextlib.AbstractContextManager[Callable[[int], object]]:
    """The progress bar of a build: records cached so far, out of ``total`` if known."""
    return progress_bar(enabled, f"caching {dataset_id}:{version}", total, " rec")
