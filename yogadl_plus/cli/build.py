"""``yogadl-plus build``: cache Parquet data, or what a Python ``module:function`` returns."""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import re
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import yogadl_plus as ydl
from yogadl_plus.building import ENGINES
from yogadl_plus.cli.common import (
    describe_summary,
    emit,
    field_list,
    storage_of,
    version_summary,
)

__all__ = ["build_options", "cmd_build"]

# "package.module:function" (a Parquet path or URL has a '/' or no ':').
_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def _source(texts: list[str], columns: list[str] | None) -> Any:
    """Parquet paths/URLs, or what a ``module:function`` returns when called."""
    if len(texts) == 1 and _FACTORY.fullmatch(texts[0]) and not os.path.exists(texts[0]):
        if columns:
            raise ValueError("--columns selects Parquet columns: a module:function has none")
        return _call_factory(texts[0])
    return ydl.sources.ParquetSource(texts if len(texts) > 1 else texts[0], columns=columns)


def _call_factory(spec: str) -> ydl.sources.Source:
    """Import the module (from the current directory first, as ``python -m`` would), call the
    function with no arguments, and make sure what it returns can be cached."""
    module_name, _, attribute = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # not found, or its own code failed (a SyntaxError, a raise)
        raise ValueError(
            f"{spec}: cannot import module {module_name!r} ({_raised(exc)}); "
            f"`python -c 'import {module_name}'` shows where"
        ) from None
    try:
        function = functools.reduce(getattr, attribute.split("."), module)
    except AttributeError:
        raise ValueError(f"{spec}: module {module_name!r} has no {attribute!r}") from None
    if not callable(function):
        raise ValueError(f"{spec}: {attribute!r} is a {type(function).__name__}, not a function")
    try:
        made = function()
    except Exception as exc:  # the user's code: one line, and how to see its traceback
        raise ValueError(
            f"{spec}() raised {_raised(exc)}; fix it, or see its traceback with "
            f"`python -c 'import {module_name}; {module_name}.{attribute}()'`"
        ) from None
    if isinstance(made, Iterator):  # records made as they are read: their errors are the user's
        made = _records_of(spec, made, f"import {module_name}; list({module_name}.{attribute}())")
    try:
        return ydl.sources.as_source(made)
    except TypeError as exc:
        raise ValueError(
            f"{spec}() returned a {type(made).__name__}, not a source: {exc}"
        ) from None


def _records_of(spec: str, records: Iterator[Any], call: str) -> Iterator[Any]:
    """``records``, an error raised in making them said in one line (the user's code: bad
    input, not a bug of ours), with how to see its traceback."""
    try:
        yield from records
    except Exception as exc:
        raise ValueError(
            f"the records {spec}() returned raised {_raised(exc)}; fix it, or see its "
            f"traceback with `python -c '{call}'`"
        ) from None


def _raised(exc: BaseException) -> str:
    """An exception from the user's code, on one line: its type and message."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def cmd_build(args: argparse.Namespace) -> int:
    """Cache the source as the version (reused if it exists, unless --overwrite) and print what was
    left."""
    storage = storage_of(args)
    existed = (args.dataset_id, args.version) in storage.list()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", ydl.SourceChangedWarning)
        ref = ydl.cache_dataset(
            _source(args.source, field_list(args.columns)),
            args.dataset_id,
            args.version,
            storage,
            overwrite=args.overwrite,
            progress=not args.no_progress,
            chunk_bytes=args.chunk_mb << 20,
            workers=args.workers,
            engine=args.engine,
        )
    for warning in said:  # one line each, as our errors are (not Python's warning format)
        print(f"yogadl-plus build: warning: {warning.message}", file=sys.stderr)
    built = args.overwrite or not existed
    summary = {**version_summary(storage, ref), "built": built}
    how = "built" if built else "reused (already cached; --overwrite rebuilds it)"
    emit(args, summary, f"{describe_summary(summary)}: {how}")
    return 0


def build_options(p: argparse.ArgumentParser) -> None:
    """The options of ``build``: the source, the version, and how to build it."""
    p.add_argument(
        "source",
        nargs="+",
        help="Parquet file(s), directory, glob or URL; or module:function, called with no "
        "arguments, returning something cache_dataset takes",
    )
    p.add_argument("dataset_id")
    p.add_argument("version")
    p.add_argument("--columns", help="comma-separated Parquet columns to cache (default: all)")
    p.add_argument("--overwrite", action="store_true", help="rebuild if the version exists")
    p.add_argument("--chunk-mb", type=int, default=256, help="chunk file size (MiB, default 256)")
    p.add_argument(
        "--workers",
        type=int,
        help="build with this many processes (or, with --engine ray, Ray tasks in flight); "
        "Parquet row groups or index ranges of a map-style dataset, one chunk per task",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="local",
        help="where parallel tasks run: local processes, or Ray (the cluster ray.init() joins, "
        "e.g. via RAY_ADDRESS)",
    )
