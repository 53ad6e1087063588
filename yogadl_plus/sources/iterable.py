"""Any iterable of records, or a zero-argument callable that returns one."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from yogadl_plus.sources.base import Description, Source, even_ranges

__all__ = ["IterableSource"]


class IterableSource(Source):
    """Records from an iterable of dicts (read once) or a callable returning one; a sequence
    (a list of dicts) can also be split for a parallel build."""

    kind = "iterable"

    def __init__(
        self, records: Iterable[Mapping[str, Any]] | Callable[[], Iterable[Mapping[str, Any]]]
    ) -> None:
        self._records = records

    def records(self) -> Iterator[Mapping[str, Any]]:
        produced = self._records() if callable(self._records) else self._records
        return iter(produced)

    @property
    def length(self) -> int | None:
        try:
            return len(self._records)  # type: ignore[arg-type]
        except TypeError:
            return None

    def description(self) -> Description:
        """The length of a sequence of records (a list); nothing of other iterables, whose
        ``len`` may only be a hint, nor of the records' schema, which only they tell."""
        if not isinstance(self._records, Sequence):
            return Description()
        return Description(len(self._records))

    def split(self, parts: int) -> list[Source] | None:
        records = self._records
        if not isinstance(records, Sequence) or isinstance(records, (str, bytes)):
            return None
        pieces: list[Source] = []
        for run in even_ranges(len(records), parts):
            piece = IterableSource(records[run.start : run.stop])
            piece.offset = run.start
            pieces.append(piece)
        return pieces
