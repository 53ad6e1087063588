"""Whether a source still is what an existing version was cached from, as far as the source
tells without being read: its fingerprint, its length, its schema; and whether a ``schema=``
given again is the one the version was cached with.

``cache_dataset`` returns an existing version without reading the source (a pipeline may take
hours to read). A source that tells otherwise gets a SourceChangedWarning naming each
difference; a ``schema=`` that contradicts the cached one is a SchemaError.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from yogadl_plus._version import __version__
from yogadl_plus.errors import SchemaError, SourceChangedWarning
from yogadl_plus.schema import Schema
from yogadl_plus.sources.base import Source

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef

__all__ = ["check_schema", "warn_if_changed"]

_REBUILD = "pass overwrite=True (the version is rebuilt) or a new version"


def check_schema(dataref: DataRef, schema: Schema) -> None:
    """A SchemaError naming each field where ``schema`` (given to ``cache_dataset`` again)
    contradicts the schema ``dataref`` was cached with: dtype, shape, nullability, codec, or a
    field one has and the other lacks. The same fields in another order are the same schema."""
    contradictions = schema.differences_from(dataref.schema, codecs=True)
    if contradictions:
        raise SchemaError(
            f"schema= contradicts the schema {dataref.dataset_id!r} version "
            f"{dataref.version!r} was cached with: {'; '.join(contradictions)}. Leave out "
            f"schema= (or pass the cached one, dataref.schema) to read the version as cached; to "
            f"cache with this schema instead, {_REBUILD}"
        )


def warn_if_changed(dataref: DataRef, src: Source, *, compare_schema: bool) -> None:
    """A SourceChangedWarning naming what ``src`` tells otherwise than the source ``dataref``
    was cached from: its fingerprint, its number of records, and (``compare_schema``: no
    ``schema=`` was given now) its schema, where it tells them without being read."""
    differences = _changes(dataref, src, compare_schema)
    if differences:
        warnings.warn(
            f"the source of {dataref.dataset_id!r} version {dataref.version!r} has changed "
            f"since it was cached: {'; '.join(differences)}. The cached data is returned as "
            f"it is; to cache this source instead, {_REBUILD}",
            SourceChangedWarning,
            stacklevel=3,
        )


def _changes(dataref: DataRef, src: Source, compare_schema: bool) -> list[str]:
    """What ``src`` tells otherwise than the source ``dataref`` was cached from, a phrase each.

    The schemas are compared only where the version holds the schema its source told (the
    build was given no ``schema=``), a source of the same kind tells one now, and this version
    of yogadl_plus built it (how a kind's types become fields may change between versions):
    anything else could set apart the same data.
    """
    manifest = dataref.manifest
    said = []
    cached_print = manifest.source_fingerprint
    current_print = src.fingerprint() if cached_print is not None else None
    if current_print is not None and current_print != cached_print:
        said.append(f"fingerprint {current_print} against {cached_print} cached")
    told = src.description()
    if told.length is not None and told.length != manifest.num_records:
        said.append(f"length {told.length} against {manifest.num_records} cached")
    if (
        compare_schema
        and told.schema is not None
        and manifest.source_schema is not None
        and manifest.source_kind == src.kind
        and manifest.library_version == __version__
    ):
        said += told.schema.differences_from(manifest.source_schema)
    return said
