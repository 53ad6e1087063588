"""cache_dataset: read a source once into a published, versioned cache."""

from __future__ import annotations

import itertools
import sys
import warnings
from typing import TYPE_CHECKING, Any

from yogadl_plus.cache.layout import RecordLayout
from yogadl_plus.cache.manifest import Manifest
from yogadl_plus.cache.reader import ChunkSet
from yogadl_plus.cache.writer import DEFAULT_CHUNK_BYTES, ChunkWriter
from yogadl_plus.errors import SourceChangedWarning
from yogadl_plus.schema import Schema, infer_schema
from yogadl_plus.sources import as_source

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef
    from yogadl_plus.storage.base import Storage

__all__ = ["build_version", "cache_dataset"]

_INFER_RECORDS = 64
_BLOCK_RECORDS = 4096


def cache_dataset(
    source: Any,
    dataset_id: str,
    version: str,
    storage: Storage | None = None,
    *,
    schema: Schema | None = None,
    overwrite: bool = False,
    progress: bool = True,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> DataRef:
    """Cache ``source`` as (dataset_id, version) in ``storage`` and return its DataRef.

    If the version exists, the source is not read (unless ``overwrite``). Only one builder of a
    version runs at a time; concurrent callers wait and read what it published.
    """
    from yogadl_plus.storage import check_name, default_storage

    check_name("dataset_id", dataset_id)
    check_name("version", version)
    store = storage if storage is not None else default_storage()
    src = as_source(source)

    def build(folder: str) -> Manifest:
        return build_version(
            folder,
            src,
            dataset_id,
            version,
            schema=schema,
            progress=progress,
            chunk_bytes=chunk_bytes,
        )

    dataref = store.get_or_build(dataset_id, version, build, overwrite=overwrite)
    cached = dataref.manifest.source_fingerprint
    if not overwrite and cached is not None:
        current = src.fingerprint()
        if current is not None and current != cached:
            warnings.warn(
                f"the source of {dataset_id!r} version {version!r} has changed since it was "
                f"cached (cached fingerprint {cached}, now {current}); the cached data is "
                "returned as is: use a new version or overwrite=True to rebuild",
                SourceChangedWarning,
                stacklevel=2,
            )
    return dataref


def build_version(
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
    from yogadl_plus import __version__

    src = as_source(source)
    records = iter(src.records())
    if schema is None:
        schema = src.schema
    if schema is None:
        head = list(itertools.islice(records, _INFER_RECORDS))
        schema = infer_schema(head)
        records = itertools.chain(head, records)
    layout = RecordLayout(schema)
    bar = _progress_bar(progress, src.length, f"{dataset_id}:{version}")
    encode = layout.encode
    written = 0
    with ChunkWriter(folder, chunk_bytes) as writer:
        while block := list(itertools.islice(records, _BLOCK_RECORDS)):
            encoded = [encode(r, written + j) for j, r in enumerate(block)]
            columns = layout.decode_columns(encoded, layout.column_fields)
            writer.add_many(encoded, columns)
            written += len(block)
            if bar is not None:
                bar.update(len(block))
        chunks = writer.close()
    if bar is not None:
        bar.close()
    manifest = Manifest(
        dataset_id=dataset_id,
        version=version,
        schema=schema,
        chunks=chunks,
        source_fingerprint=src.fingerprint(),
        source_kind=src.kind,
        library_version=__version__,
    )
    _check_readable(folder, manifest, layout)
    manifest.write(folder)
    return manifest


def _check_readable(folder: str, manifest: Manifest, layout: RecordLayout) -> None:
    """Reopen what was written and decode the first and last record of every chunk."""
    chunk_set = ChunkSet(folder, manifest)
    try:
        for start, info in zip(chunk_set.starts, manifest.chunks):
            for index in {int(start), int(start) + info.records - 1}:
                layout.decode_record(chunk_set.get(index), manifest.schema.fields)
    finally:
        chunk_set.close()


def _progress_bar(enabled: bool, total: int | None, name: str) -> Any:
    if not enabled or not sys.stderr.isatty():
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"caching {name}", unit=" rec", unit_scale=True, file=sys.stderr)
