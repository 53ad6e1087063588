"""What the commands share: the storage ``--storage`` names (and where the CLI looked), what a
version's summary says, printing text or ``--json``, progress bars, and the parsing of
comma-separated and count options."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import yogadl_plus as ydl
from yogadl_plus.progress import progress_bar
from yogadl_plus.storage import local_root

__all__ = [
    "DEFAULT_ROOT",
    "count_option",
    "default_note",
    "describe_summary",
    "emit",
    "field_list",
    "positive_option",
    "progress_for",
    "storage_of",
    "table",
    "version_summary",
    "where_it_looked",
]


def storage_of(args: argparse.Namespace, *, reading: bool = False) -> ydl.Storage:
    """The storage ``--storage`` names (default: ``ydl.default_storage()``). Commands that only
    read never create a local root: one that does not exist is DatasetNotFound naming it."""
    root = local_root(args.storage)
    if reading and root is not None and not os.path.isdir(root):
        raise ydl.DatasetNotFound(
            f"no storage at {root}{default_note(args)}; nothing was created there. "
            f"{_LOOK_ELSEWHERE}"
        )
    return ydl.open_storage(args.storage) if args.storage else ydl.default_storage()


DEFAULT_ROOT = "$YOGADL_PLUS_HOME or ~/.cache/yogadl_plus"


_LOOK_ELSEWHERE = "Name another with --storage PATH (or s3://, gs://), or set $YOGADL_PLUS_HOME"


def default_note(args: argparse.Namespace) -> str:
    """Why the CLI looked where it did, when no --storage named the place."""
    return "" if args.storage else f" (the default: {DEFAULT_ROOT})"


def where_it_looked(args: argparse.Namespace) -> str:
    """For a "not found" in the default storage, which the message names: that it was the
    default, and how to look elsewhere (a quickstart that cached into another folder is the
    usual reason)."""
    if not hasattr(args, "storage") or args.storage:
        return ""
    return f"; that is the default storage ({DEFAULT_ROOT}). {_LOOK_ELSEWHERE}."


def _where(storage: ydl.Storage, ref: ydl.DataRef) -> str:
    """The folder of a local version, the URL of a remote one."""
    if isinstance(storage, ydl.LocalStorage):
        return ref.directory
    return f"{getattr(storage, 'url', storage)}/{ref.dataset_id}/{ref.version}"


def version_summary(storage: ydl.Storage, ref: ydl.DataRef) -> dict[str, Any]:
    """What build, push and pull report about the version they leave behind."""
    return {
        "dataset_id": ref.dataset_id,
        "version": ref.version,
        "records": len(ref),
        "chunks": len(ref.manifest.chunks),
        "bytes": sum(c.bytes for c in ref.manifest.chunks),
        "where": _where(storage, ref),
    }


def describe_summary(summary: dict[str, Any]) -> str:
    """A version's summary on one line, for people."""
    return (
        f"{summary['dataset_id']}:{summary['version']}: {summary['records']} records in "
        f"{summary['chunks']} chunk(s), {summary['bytes'] / 2**20:.1f} MiB, at {summary['where']}"
    )


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print ``data`` as JSON with --json, else the text meant for people (if any)."""
    if args.json:
        print(json.dumps(data))
    elif text:
        print(text)


def progress_for(
    args: argparse.Namespace, desc: str, total: int | None, unit: str, scale: bool = True
) -> contextlib.AbstractContextManager[Callable[[int], object]]:
    """An ``advance(n)`` for a bar on stderr, or a no-op when stderr is no terminal or
    --no-progress was given (``scale``: as ``progress_bar``'s)."""
    return progress_bar(not args.no_progress, desc, total, unit, scale=scale)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    lines = [header, *rows]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def field_list(text: str | None) -> list[str] | None:
    """The names of a comma-separated option (None: not given, so all)."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise ValueError(f"a field name is empty in {text!r}: name the fields, comma-separated")
    return names


def count_option(text: str) -> int:
    """A count option: an integer >= 0 (argparse says otherwise a usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_option(text: str) -> int:
    """A count option that must be 1 or more."""
    value = count_option(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value
