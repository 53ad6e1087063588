"""Turning the things users have (iterables, Parquet, and more) into records plus a schema."""

from __future__ import annotations

import os
from typing import Any

from yogadl_plus.sources.base import Source
from yogadl_plus.sources.iterable import IterableSource
from yogadl_plus.sources.parquet import ParquetSource

__all__ = ["IterableSource", "ParquetSource", "Source", "as_source"]


def _is_path_list(obj: Any) -> bool:
    return (
        isinstance(obj, (list, tuple))
        and bool(obj)
        and all(isinstance(p, (str, os.PathLike)) for p in obj)
    )


def as_source(obj: Any) -> Source:
    """The Source for what the user passed to cache_dataset."""
    if isinstance(obj, Source):
        return obj
    if isinstance(obj, (str, os.PathLike)) or _is_path_list(obj):
        return ParquetSource(obj)
    if callable(obj) or hasattr(obj, "__iter__"):
        return IterableSource(obj)
    raise TypeError(
        f"cannot cache a {type(obj).__name__}: pass an iterable of dicts, a zero-argument "
        "callable returning one, or Parquet path(s)"
    )
