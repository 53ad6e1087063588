"""Input files turned into records by a function of the user's: ``fn(path)`` for each file, in
order, in parallel where the build is."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from yogadl_plus.errors import SchemaError, YogaError
from yogadl_plus.sources.base import Description, Source, even_ranges
from yogadl_plus.sources.locations import (
    expand_braces,
    has_wildcard,
    local_matches,
    remote_matches,
    resolve_paths,
    url_of,
)

__all__ = ["Files"]

#: What ``fn`` returns for one file: a record, or its records in order.
Made = Mapping[str, Any] | Sequence[Mapping[str, Any]]


class Files(Source):
    """The records ``fn(path)`` makes of each file: ``paths`` is a path, a glob, a brace range
    (``clips-{000..099}.wav``), an ``s3://`` or ``gs://`` URL or glob, or a list of those;
    each reaches ``fn`` as a string (a glob's matches sorted, local ones as absolute paths,
    bucket ones as URLs). ``fn`` returns a record (a dict) or a list of records.

    The records are the files' in order, each file's in the order ``fn`` gives them, whether
    the build is serial or parallel (``workers=``, where ``fn`` must be picklable: a function
    at the top level of a module, or ``engine="ray"``). An exception in ``fn`` is a YogaError
    naming the file; ``filesystem`` (a ``pyarrow.fs`` filesystem) lists bucket globs with an
    endpoint and credentials of your own.
    """

    kind = "files"

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        fn: Callable[[str], Made],
        *,
        filesystem: Any = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"Files(paths, fn): fn must be callable (path -> records), got {fn!r}")
        items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        self.paths = [name for item in items for name in _named(item, filesystem)]
        if not self.paths:
            raise ValueError("Files(paths, fn) needs at least one path")
        self.fn = fn

    def __repr__(self) -> str:
        return f"Files({len(self.paths)} files: {self.paths[0]!r}, ..., fn={_name_of(self.fn)})"

    def description(self) -> Description:
        """Nothing: only ``fn`` tells how many records a file makes, and what they hold."""
        return Description()

    def fingerprint(self) -> str:
        """The paths (with size and modification time, for local files), and ``fn``'s name."""
        digest = hashlib.sha256(f"{_name_of(self.fn)}\n".encode())
        for path in self.paths:
            try:
                stat = os.stat(path)
                digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
            except OSError:  # a URL, or a name only fn understands
                digest.update(f"{path}\n".encode())
        return "files-sha256:" + digest.hexdigest()[:32]

    def records(self) -> Iterator[Mapping[str, Any]]:
        return _SomeFiles(self.paths, self.fn).records()

    def split(self, parts: int) -> list[Source]:
        """Runs of consecutive files (how many records each makes is only known by reading)."""
        return [
            _SomeFiles(self.paths[run.start : run.stop], self.fn)
            for run in even_ranges(len(self.paths), parts)
        ]


class _SomeFiles(Source):
    """Consecutive files of a Files source, read in a task of a parallel build."""

    kind = "files"

    def __init__(self, paths: list[str], fn: Callable[[str], Made]) -> None:
        self.paths = paths
        self.fn = fn

    def __repr__(self) -> str:
        return f"<Files {self.paths[0]!r} .. {self.paths[-1]!r}>"

    def records(self) -> Iterator[Mapping[str, Any]]:
        for path in self.paths:
            yield from _records_of(self.fn, path)


def _named(item: Any, filesystem: Any) -> list[str]:
    """The paths one item of ``paths`` names: its braces expanded, its globs matched."""
    if not isinstance(item, (str, os.PathLike)):
        raise TypeError(f"Files(paths, fn): paths holds {item!r}, not a path or URL")
    names: list[str] = []
    for text in expand_braces(os.fspath(item)):
        if not has_wildcard(text):
            names.append(text)
        elif "://" in text:
            bucket, (path,) = resolve_paths(text, filesystem, "Files")
            names += [url_of(bucket, info.path) for info in remote_matches(bucket, path, "Files")]
        else:
            names += local_matches(text, "Files")
    return names


def _records_of(fn: Callable[[str], Made], path: str) -> list[Mapping[str, Any]]:
    """``fn(path)`` as a list of records; a YogaError naming the file if ``fn`` raised, a
    SchemaError if it gave something else than records."""
    try:
        made = fn(path)
    except Exception as exc:
        raise YogaError(f"Files: fn({path!r}) raised {type(exc).__name__}: {exc}") from exc
    if isinstance(made, Mapping):
        return [made]
    if isinstance(made, (list, tuple)) and all(isinstance(r, Mapping) for r in made):
        return list(made)
    raise SchemaError(
        f"Files: fn({path!r}) returned {type(made).__name__} {str(made)[:60]}: fn returns a "
        "record (a dict) or a list of records"
    )


def _name_of(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
