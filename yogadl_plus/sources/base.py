"""A source is anything yogadl_plus can read records from once, to cache them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any

from yogadl_plus.schema import Schema

__all__ = ["Source"]


class Source(ABC):
    """Records plus what is known about them before reading: schema, size, fingerprint."""

    #: A short name stored in the manifest ("iterable", "parquet", ...).
    kind: str = ""

    @abstractmethod
    def records(self) -> Iterator[Mapping[str, Any]]:
        """The records, in storage order; called once per build."""

    @property
    def schema(self) -> Schema | None:
        """The schema when the source knows it without reading records (Arrow, tf element_spec)."""
        return None

    @property
    def length(self) -> int | None:
        """The number of records when known cheaply, for the progress bar."""
        return None

    def fingerprint(self) -> str | None:
        """A cheap identity of the data (file paths, sizes, mtimes), or None when there is none."""
        return None
