"""The ``yogadl-plus`` command: build, inspect, verify, copy, benchmark and remove cached versions.

Every command that prints takes ``--json`` (one JSON document; ``head``: one object per line);
long work shows a progress bar on stderr when it is a terminal. Exit codes are in EXIT_CODES.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import importlib
import io
import json
import logging
import math
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

import yogadl_plus as ydl
from yogadl_plus.building import ENGINES
from yogadl_plus.progress import progress_bar
from yogadl_plus.storage import copy_version, local_root
from yogadl_plus.stream import StreamState
from yogadl_plus.stream.lineage import skip_items
from yogadl_plus.stream.skips import Skips
from yogadl_plus.stream.stats import TIMED, time_epoch

__all__ = ["EXIT_CODES", "INTERNAL_ERROR", "main"]

# The first matching row gives the exit status (DatasetNotFound, StorageError and WorkerDied are
# YogaErrors too; StorageError is an OSError). 0: success; argparse's own usage errors exit 2;
# anything else is a bug of ours: its traceback, and INTERNAL_ERROR.
EXIT_CODES: tuple[tuple[tuple[type[BaseException], ...], int], ...] = (
    ((ydl.CacheCorrupted,), 1),
    ((ydl.DatasetNotFound,), 3),
    ((ydl.StorageError, OSError), 4),
    ((ydl.WorkerDied,), 5),
    ((ydl.YogaError, ValueError, NotImplementedError, ImportError), 2),
    ((KeyboardInterrupt,), 130),
)
INTERNAL_ERROR = 70  # EX_SOFTWARE (sysexits.h)

# "package.module:function" (a Parquet path or URL has a '/' or no ':').
_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


# --- shared by the commands ---


def _storage(args: argparse.Namespace, *, reading: bool = False) -> ydl.Storage:
    """The storage ``--storage`` names (default: ``ydl.default_storage()``). Commands that only
    read never create a local root: one that does not exist is DatasetNotFound naming it."""
    root = local_root(args.storage)
    if reading and root is not None and not os.path.isdir(root):
        raise ydl.DatasetNotFound(
            f"no storage at {root}{_default_note(args)}; nothing was created there. "
            f"{_LOOK_ELSEWHERE}"
        )
    return ydl.open_storage(args.storage) if args.storage else ydl.default_storage()


_DEFAULT_ROOT = "$YOGADL_PLUS_HOME or ~/.cache/yogadl_plus"
_LOOK_ELSEWHERE = "Name another with --storage PATH (or s3://, gs://), or set $YOGADL_PLUS_HOME"


def _default_note(args: argparse.Namespace) -> str:
    """Why the CLI looked where it did, when no --storage named the place."""
    return "" if args.storage else f" (the default: {_DEFAULT_ROOT})"


def _where_it_looked(args: argparse.Namespace) -> str:
    """For a "not found" in the default storage, which the message names: that it was the
    default, and how to look elsewhere (a quickstart that cached into another folder is the
    usual reason)."""
    if not hasattr(args, "storage") or args.storage:
        return ""
    return f"; that is the default storage ({_DEFAULT_ROOT}). {_LOOK_ELSEWHERE}."


def _not_a_root(root: str) -> str | None:
    """Why ``root``, holding no dataset, is likely a dataset's or a version's folder instead."""
    parent, name = os.path.split(root)
    versions = [v for d, v in ydl.LocalStorage(parent).list() if d == name]
    if versions:
        return (
            f"{root} is the folder of dataset {name!r} (its folders, such as {versions[0]!r}, "
            f"are versions); the storage root is {parent}"
        )
    grandparent, dataset = os.path.split(parent)
    if (dataset, name) in ydl.LocalStorage(grandparent).list():
        return (
            f"{root} is the folder of version {dataset}:{name}; the storage root is {grandparent}"
        )
    return None


def _where(storage: ydl.Storage, ref: ydl.DataRef) -> str:
    """The folder of a local version, the URL of a remote one."""
    if isinstance(storage, ydl.LocalStorage):
        return ref.directory
    return f"{getattr(storage, 'url', storage)}/{ref.dataset_id}/{ref.version}"


def _summary(storage: ydl.Storage, ref: ydl.DataRef) -> dict[str, Any]:
    """What build, push and pull report about the version they leave behind."""
    return {
        "dataset_id": ref.dataset_id,
        "version": ref.version,
        "records": len(ref),
        "chunks": len(ref.manifest.chunks),
        "bytes": sum(c.bytes for c in ref.manifest.chunks),
        "where": _where(storage, ref),
    }


def _describe(summary: dict[str, Any]) -> str:
    return (
        f"{summary['dataset_id']}:{summary['version']}: {summary['records']} records in "
        f"{summary['chunks']} chunk(s), {summary['bytes'] / 2**20:.1f} MiB, at {summary['where']}"
    )


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print ``data`` as JSON with --json, else the text meant for people (if any)."""
    if args.json:
        print(json.dumps(data))
    elif text:
        print(text)


def _progress(
    args: argparse.Namespace, desc: str, total: int | None, unit: str, scale: bool = True
) -> contextlib.AbstractContextManager[Callable[[int], object]]:
    """An ``advance(n)`` for a bar on stderr, or a no-op when stderr is no terminal or
    --no-progress was given (``scale``: as ``progress_bar``'s)."""
    return progress_bar(not args.no_progress, desc, total, unit, scale=scale)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    lines = [header, *rows]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def _show(value: Any, width: int = 60) -> str:
    """A short text for one field value: arrays as dtype[shape] and their first numbers."""
    if isinstance(value, np.ndarray):
        body = np.array2string(value.ravel()[:4], precision=4, separator=", ")
        more = ", ..." if value.size > 4 else ""
        return f"{value.dtype}{list(value.shape)} {body[:-1]}{more}]"[:width]
    if isinstance(value, np.datetime64):
        return str(value)
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _show_bytes(bytes(value))[:width]
    return (value if isinstance(value, str) else repr(value))[:width]


# The first bytes of the image formats ``head`` names: PNG, JPEG, GIF, WebP (a RIFF file).
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"RIFF")
_BYTES_SHOWN = 8  # first bytes shown of a value that is no image, in hex (twice as many of text)


def _show_bytes(value: bytes) -> str:
    """What a bytes value is: an image's format and size (from its header alone), else its
    length and first bytes in hex."""
    image = _image_header(value)
    if image is not None:
        return f"<{image}, {len(value):,} bytes>"
    if not value:
        return "<0 bytes>"
    text = value[: 2 * _BYTES_SHOWN]
    if text.isascii() and text.decode("ascii").isprintable():  # text: as text
        more = "..." if len(value) > len(text) else ""
        return f"<{len(value):,} bytes: {text!r}{more}>"
    more = " ..." if len(value) > _BYTES_SHOWN else ""
    return f"<{len(value):,} bytes: {value[:_BYTES_SHOWN].hex(' ')}{more}>"


def _image_header(value: bytes) -> str | None:
    """An image's format and size, as "PNG image 32x32", from the header Pillow reads
    (nothing is decoded); None for anything else."""
    if not value.startswith(_IMAGE_MAGIC):
        return None
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a huge image's size is all that is asked)
            with Image.open(io.BytesIO(value)) as image:  # reads the header only
                width, height = image.size
                return f"{image.format} image {width}x{height}"
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, SyntaxError):
        return None  # a header that only looks like one (SyntaxError: Pillow's for some)


# Floats JSON has no number for (as protobuf's JSON mapping writes them).
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _json_value(value: Any) -> Any:
    """One field value as JSON, whole: arrays as nested lists of numbers, bytes in base64,
    datetimes as ISO 8601 text, timedeltas as counts of their unit (the schema names it),
    complex numbers as [real, imaginary], NaN and infinities as "NaN", "Infinity",
    "-Infinity"."""
    if isinstance(value, (np.ndarray, np.generic)):
        if value.dtype.kind == "M":
            return value.astype(str).tolist()
        if value.dtype.kind == "m":
            return value.astype(np.int64).tolist()
        if value.dtype.kind == "c":  # [real, imaginary], as numpy's view of it
            return _json_value(np.stack([value.real, value.imag], axis=-1).tolist())
        return _json_value(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE[repr(value)]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


def _fields(text: str | None) -> list[str] | None:
    """The names of a comma-separated option (None: not given, so all)."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise ValueError(f"a field name is empty in {text!r}: name the fields, comma-separated")
    return names


def _count(text: str) -> int:
    """A count option: an integer >= 0 (argparse says otherwise a usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _positive(text: str) -> int:
    """A count option that must be 1 or more."""
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


# --- build ---


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
    storage = _storage(args)
    existed = (args.dataset_id, args.version) in storage.list()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", ydl.SourceChangedWarning)
        ref = ydl.cache_dataset(
            _source(args.source, _fields(args.columns)),
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
    summary = {**_summary(storage, ref), "built": built}
    how = "built" if built else "reused (already cached; --overwrite rebuilds it)"
    _emit(args, summary, f"{_describe(summary)}: {how}")
    return 0


# --- looking at versions ---


def cmd_ls(args: argparse.Namespace) -> int:
    storage = _storage(args, reading=True)
    pairs = storage.list()
    root = local_root(args.storage)
    why = _not_a_root(root) if not pairs and root is not None else None
    if why is not None:
        raise ydl.DatasetNotFound(f"no datasets: {why} (use --storage with it)")
    _emit(
        args,
        [{"dataset_id": d, "version": v} for d, v in pairs],
        "\n".join(f"{d}\t{v}" for d, v in pairs),
    )
    if not pairs and not args.json:
        print(f"no versions in {storage}{_default_note(args)}", file=sys.stderr)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    storage = _storage(args, reading=True)
    ref = storage.fetch(args.dataset_id, args.version)
    m = ref.manifest
    summary = _summary(storage, ref)
    lines = [
        f"dataset {m.dataset_id}  version {m.version}",
        f"  where     {summary['where']}",
        f"  records   {m.num_records}",
        f"  chunks    {len(m.chunks)} ({summary['bytes']:,} bytes)",
        f"  source    {m.source_kind} {m.source_fingerprint or ''}".rstrip(),
        f"  created   {m.created} by yogadl_plus {m.library_version}",
        "  fields",
        *(
            f"    {f.name:<20} {f.describe():<20} {f.codec!r}{', nullable' if f.nullable else ''}"
            for f in m.schema
        ),
    ]
    data = {**json.loads(m.to_json()), "bytes": summary["bytes"], "where": summary["where"]}
    _emit(args, data, "\n".join(lines))
    return 0


def cmd_head(args: argparse.Namespace) -> int:
    ref = _storage(args, reading=True).fetch(args.dataset_id, args.version)
    count = min(args.n, len(ref))
    batch = ref.get_batch(np.arange(count), fields=_fields(args.fields))
    names = list(batch)
    if args.json:
        records = [
            {"index": i, **{k: _json_value(batch[k][i]) for k in names}} for i in range(count)
        ]
        schema = [ref.schema[name].to_json() for name in names]
        print(
            json.dumps(
                {
                    "dataset_id": ref.dataset_id,
                    "version": ref.version,
                    "schema": schema,
                    "records": records,
                }
            )
        )
        return 0
    rows = [[str(i), *(_show(batch[k][i]) for k in names)] for i in range(count)]
    print(_table(["index", *names], rows))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    storage = _storage(args, reading=True)
    try:
        ref = storage.fetch(args.dataset_id, args.version)
        chunks = ref.manifest.chunks
        with _progress(
            args, f"verifying {ref.dataset_id}:{ref.version}", len(chunks), " chunk", scale=False
        ) as advance:
            ref.verify(on_chunk=lambda _: advance(1))
    except ydl.CacheCorrupted:
        if isinstance(storage, ydl.LocalStorage):
            raise
        # A remote storage pulls a damaged local copy again: only a damaged remote one fails.
        storage.verify(args.dataset_id, args.version)
        ref = storage.fetch(args.dataset_id, args.version)
    summary = {**_summary(storage, ref), "verified": True}
    _emit(args, summary, f"{_describe(summary)}: every chunk matches its checksum")
    return 0


# --- changing versions ---


def _copy(args: argparse.Namespace, source: ydl.Storage, target: ydl.Storage) -> int:
    """push and pull: the same copy, in opposite directions."""
    name = f"{args.dataset_id}:{args.version}"
    # One bar for the bytes moved: downloaded or uploaded by a bucket, checked and placed here.
    with _progress(args, f"{args.command}ing {name}", None, "B") as advance:
        ref = copy_version(
            source,
            target,
            args.dataset_id,
            args.version,
            overwrite=args.overwrite,
            progress=advance,
            on_transfer=advance,
        )
    summary = _summary(target, ref)
    _emit(args, summary, _describe(summary))
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    return _copy(args, _storage(args, reading=True), ydl.open_storage(args.url))


def cmd_pull(args: argparse.Namespace) -> int:
    return _copy(args, ydl.open_storage(args.url), _storage(args))


def cmd_rm(args: argparse.Namespace) -> int:
    storage = _storage(args, reading=True)
    storage.delete(args.dataset_id, args.version)
    _emit(
        args,
        {"dataset_id": args.dataset_id, "version": args.version, "removed": True},
        f"removed {args.dataset_id}:{args.version} from {storage}",
    )
    return 0


# --- lineage ---

# A stream state is a few hundred bytes (a mixture's schedule adds some): a file far bigger is
# not one, and is not read whole.
_STATE_MOST_BYTES = 1 << 20


def cmd_lineage(args: argparse.Namespace) -> int:
    state = _saved_state(args.state)
    ref = _storage(args, reading=True).fetch(args.dataset_id, args.version)
    if state.ngram is not None:
        raise ValueError(
            "--state is an n-gram stream's: its windows need the NGram, which the command "
            "line cannot rebuild; ask stream.lineage() in Python"
        )
    try:
        stream = ref.stream(**state.order, **_lineage_boundary(args, state, ref))
    except TypeError as exc:  # a value of the state's order of the wrong kind
        raise ValueError(f"--state {args.state}: {exc}") from None
    stream.load_state(state)
    first, stop = args.items
    # Items A..B only: where item A begins is arithmetic (counted, with a skip list).
    plan = stream.plan()
    start = plan.offset_of(*skip_items(plan, *plan.position_of(stream.offset), first))
    found = stream.lineage(stop - first, start_offset=start)
    rows = [
        {"item": first + k, "records": np.asarray(records).tolist()}
        for k, records in enumerate(found)
    ]
    text = "\n".join(f"{row['item']}\t{' '.join(map(str, row['records']))}" for row in rows)
    _emit(args, rows, text)
    if len(found) < stop - first:
        print(
            f"yogadl-plus lineage: note: there are no items {first + len(found)} to {stop - 1}:"
            " no later epoch of this shard hands out an item",
            file=sys.stderr,
        )
    return 0


def _saved_state(path: str) -> StreamState:
    """The stream state saved as JSON at ``path``; ValueError saying what is wrong with it."""
    try:
        with open(path, "rb") as f:
            data = f.read(_STATE_MOST_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"--state {path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > _STATE_MOST_BYTES:
        raise ValueError(
            f"--state {path} is over {_STATE_MOST_BYTES >> 20} MiB, so not a stream state "
            "(stream.state().to_dict() saved as JSON: a few hundred bytes)"
        )
    try:
        return StreamState.from_dict(json.loads(data))
    except RecursionError:
        raise ValueError(
            f"--state {path}: its JSON is nested too deeply to be a stream state "
            "(stream.state().to_dict() saved as JSON)"
        ) from None
    except ValueError as exc:  # not JSON, not UTF-8, or not a state
        raise ValueError(f"--state {path}: {exc}") from None


def _lineage_boundary(
    args: argparse.Namespace, state: StreamState, ref: ydl.DataRef
) -> dict[str, Any]:
    """The stream's ``batch_size``, ``drop_last`` and ``skip``: the options, checked against
    what the state says of the stream that saved it, so that no record it did not hand out
    is named without a word (a state saved before this was recorded: a note says so)."""
    skip = _skip_file(args.skip, ref) if args.skip is not None else None
    made = state.boundary
    if made is None:
        skipped = "the records of --skip" if skip is not None else "no record"
        print(
            f"yogadl-plus lineage: note: {args.state} was saved by an earlier release, which "
            "did not record the stream's batches, skip list or predicate: the items are as "
            f"--batch-size and --drop-last say, with {skipped} skipped",
            file=sys.stderr,
        )
        return {"batch_size": args.batch_size, "drop_last": args.drop_last, "skip": skip}
    if made["predicate"] is not None:
        raise ValueError(
            f"--state {args.state} was saved by a stream with the predicate "
            f"{made['predicate']}, which the command line cannot rebuild (without it, records "
            "the predicate rejected would be named): ask stream.lineage() of a stream made "
            "with it, in Python"
        )
    _check_skip(args, made["skip"], skip)
    size = made["batch_size"]
    if size is not None and args.batch_size not in (None, size):
        raise ValueError(
            f"--state {args.state} was saved by a stream of batches of {size}: --batch-size "
            f"{args.batch_size} would number other items; leave it out (the state says it)"
        )
    if size is not None and args.drop_last and not made["drop_last"]:
        raise ValueError(
            f"--state {args.state} was saved by a stream that kept each epoch's short last "
            "batch: leave out --drop-last"
        )
    return {
        "batch_size": args.batch_size if size is None else size,
        "drop_last": args.drop_last or made["drop_last"],
        "skip": skip,
    }


def _check_skip(
    args: argparse.Namespace, saved: Mapping[str, Any] | None, skip: Skips | None
) -> None:
    """ValueError unless --skip gives the skip list the state's stream had (any skip list
    where it had none: a state loads into a stream with one)."""
    if saved is None:
        return
    said = f"{saved['records']:,} records (sha256 {saved['sha256'][:16]}...)"
    if skip is None:
        raise ValueError(
            f"--state {args.state} was saved by a stream that skipped {said}: pass them with "
            "--skip FILE (a .npy or text file of their indices, or a bool mask), or records "
            "it never handed out would be named"
        )
    if skip.identity() != saved:
        raise ValueError(
            f"--skip {args.skip} holds {len(skip):,} records, not the {said} that the stream "
            f"which saved --state {args.state} skipped: pass that skip list"
        )


def _skip_file(path: str, ref: ydl.DataRef) -> Skips:
    """The skip list in ``path``, checked against ``ref``: a .npy array (indices, or a bool
    mask), or text of indices (or of true and false: a mask) apart by spaces, commas or lines."""
    try:
        if path.endswith(".npy"):
            given = np.load(path, allow_pickle=False)
        else:
            with open(path) as f:
                given = _skip_words(f.read().replace(",", " ").split())
        skips = Skips(given)
        skips.for_source(ref)
    except OSError as exc:
        raise ValueError(f"--skip {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:  # not .npy, not UTF-8, or not record indices
        raise ValueError(f"--skip {path}: {exc}") from None
    return skips


def _skip_words(words: list[str]) -> Any:
    """A text skip list's words: a bool mask, or record indices."""
    if words and all(word.lower() in ("true", "false") for word in words):
        return np.array([word.lower() == "true" for word in words])
    indices = []
    for number, word in enumerate(words, 1):
        try:
            indices.append(int(word))
        except ValueError:
            raise ValueError(
                f"word {number}, {word[:40]!r}, is not a record index: a text skip list is "
                "whole numbers apart by spaces, commas or lines (or true and false, a mask)"
            ) from None
    return indices


def _items(text: str) -> tuple[int, int]:
    """``A:B``: items A (included) to B (excluded) after the state's offset."""
    first, colon, stop = text.partition(":")
    try:
        bounds = (_count(first), _count(stop))
    except argparse.ArgumentTypeError:
        bounds = (-1, -1)
    if not colon or bounds[0] > bounds[1] or bounds[0] < 0:
        raise argparse.ArgumentTypeError(f"expected A:B with 0 <= A <= B, got {text!r}")
    return bounds


# --- bench ---


def _where_time_went(rows: list[dict[str, Any]], workers: bool) -> str:
    """One line: the seconds of every epoch timed, by kind of work."""
    total = sum(row["seconds"] for row in rows)
    spent = {name: sum(row["time"][name] for row in rows) for name in TIMED}
    parts = [
        f"{name.replace('_', ' ')} {seconds:.3f} s ({seconds / total:.0%})"
        for name, seconds in spent.items()
        if seconds >= 0.0005
    ]
    line = "time: " + ", ".join(parts)
    if workers:
        return line + " (the workers' work is summed over them)"
    # Without workers, what is not named is the stream's own: the order, handing items out.
    other = total - sum(spent.values()) + spent["waiting_on_workers"]
    return line + f", the stream's own {max(0.0, other):.3f} s ({max(0.0, other) / total:.0%})"


def _bench_row(row: dict[str, Any]) -> list[str]:
    def number(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    return [
        str(row["epoch"]),
        str(row["records"]),
        number(row["seconds"], ".3f"),
        number(row["records_per_s"], ",.0f"),
        number(row["batches_per_s"], ",.1f"),
        number(row["mb_per_s"], ",.1f"),
        number(None if row["first_item_s"] is None else row["first_item_s"] * 1e3, ".2f"),
    ]


def cmd_bench(args: argparse.Namespace) -> int:
    if args.shuffle and args.num_shards > 1 and args.seed is None:
        # (Said in the flags' words, before the stream says it in the API's.)
        raise ValueError(
            "--shuffle with --num-shards > 1 needs --seed N, the same on every rank: otherwise "
            "each rank would draw its own order and the shards would overlap"
        )
    ref = _storage(args, reading=True).fetch(args.dataset_id, args.version)
    stream = ref.stream(
        shuffle=args.shuffle,
        shuffle_seed=args.seed,
        batch_size=args.batch_size,
        fields=_fields(args.fields),
        num_workers=args.num_workers,
        num_shards=args.num_shards,
        shard_rank=args.shard_rank,
        shard_by=args.shard_by,
    )
    total = len(stream) * args.epochs
    try:
        with _progress(args, f"bench {ref.dataset_id}:{ref.version}", total, " item") as advance:
            rows = [time_epoch(stream, epoch, advance) for epoch in range(args.epochs)]
    finally:
        stream.close()
    header = ["epoch", "records", "seconds", "records/s", "batches/s", "MB/s", "first item ms"]
    text = _table(header, [_bench_row(row) for row in rows])
    if args.batch_size is None:
        text += "\n(batches/s: with --batch-size)"
    text += "\n" + _where_time_went(rows, bool(args.num_workers))
    summary = stream.stats().summary()
    text += "\n" + summary
    if args.plot:
        from yogadl_plus.plot import plot_epochs

        plot_epochs(rows, summary, args.plot, bool(args.num_workers))
        text += f"\n(drawn in {args.plot})"
    _emit(args, rows, text)
    return 0


# --- demo ---


def cmd_demo(args: argparse.Namespace) -> int:
    from yogadl_plus.demo import run_demo

    return run_demo(_storage(args))


# --- the parser ---


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line, as every other error is, naming
    the --help that shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="yogadl-plus",
        description="Versioned, random-access caches of deep-learning datasets.",
        epilog="exit codes: 0 ok, 1 verification failed, 2 bad usage or input, "
        "3 dataset/version not found, 4 storage unreachable or denied, 5 a build worker died, "
        "70 internal error (a bug: please report its traceback), 130 interrupted",
    )
    parser.add_argument("--version", action="version", version=f"yogadl_plus {ydl.__version__}")
    _storage_option(parser, None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str,
        run: Callable[[argparse.Namespace], int],
        about: str,
        *parents: _Parser,
        options: Callable[[argparse.ArgumentParser], None] | None = None,
    ) -> None:
        p = sub.add_parser(name, parents=list(parents), help=about, description=about)
        p.set_defaults(run=run)
        if options is not None:
            options(p)

    storage, output, progress, version = _shared_options()
    command("demo", cmd_demo, "cache the bundled example dataset and tour it", storage)
    command(
        "build",
        cmd_build,
        "cache Parquet data, or what a Python function returns, as a version",
        storage,
        output,
        progress,
        options=_build_options,
    )
    command("ls", cmd_ls, "list cached (dataset_id, version) pairs", storage, output)
    command("info", cmd_info, "show a version's schema, size, source and location", version)
    command("head", cmd_head, "print the first records as a table", version, options=_head_options)
    command("verify", cmd_verify, "re-check every chunk's checksum", version, progress)
    for name, run, about in (
        ("push", cmd_push, "copy a version from --storage to URL"),
        ("pull", cmd_pull, "copy a version from URL into --storage"),
    ):
        command(name, run, about, version, progress, options=_copy_options)
    command("rm", cmd_rm, "delete a version", version)
    command(
        "lineage",
        cmd_lineage,
        "which records made the items after a saved stream state",
        version,
        options=_lineage_options,
    )
    command(
        "bench",
        cmd_bench,
        "measure how fast a version streams",
        version,
        progress,
        options=_bench_options,
    )
    return parser


def _shared_options() -> tuple[_Parser, ...]:
    """Parent parsers of the options several commands take: --storage; --json;
    --no-progress; and a version (--storage, --json, dataset_id, version)."""
    storage = _Parser(add_help=False)
    # (SUPPRESS: given before the command, the main parser's value stands.)
    _storage_option(storage, argparse.SUPPRESS)
    output = _Parser(add_help=False)
    output.add_argument("--json", action="store_true", help="print JSON for scripts")
    progress = _Parser(add_help=False)
    progress.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown only on a terminal)"
    )
    version = _Parser(add_help=False, parents=[storage, output])
    version.add_argument("dataset_id")
    version.add_argument("version")
    return storage, output, progress, version


def _storage_option(parser: argparse.ArgumentParser, default: Any) -> None:
    """--storage, which the main parser takes before the command (as ``git -C`` does) and every
    command after its name."""
    parser.add_argument(
        "--storage",
        metavar="URL",
        default=default,
        help="where caches live: a path, file://, s3://bucket/prefix or gs://bucket/prefix "
        f"(default: {_DEFAULT_ROOT})",
    )


def _build_options(p: argparse.ArgumentParser) -> None:
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


def _head_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", type=_count, default=5, help="how many records (default 5)")
    p.add_argument("--fields", help="comma-separated fields to show")


def _lineage_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", required=True, help="a stream's state, as state().to_dict() saved")
    p.add_argument(
        "--items",
        type=_items,
        default=(0, 1),
        metavar="A:B",
        help="items A to B-1 after the state's offset (default 0:1)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        help="the stream's batch size (default: the state's; records for a state saved by an "
        "earlier release)",
    )
    p.add_argument(
        "--drop-last",
        action="store_true",
        help="the stream drops short batches (default: as the state says)",
    )
    p.add_argument(
        "--skip",
        metavar="FILE",
        help="the stream's skip list: a .npy array of record indices or a bool mask, or a text "
        "file of indices (needed when the state's stream had one)",
    )


def _copy_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL", help="s3://bucket/prefix, gs://bucket/prefix or a path")
    p.add_argument("--overwrite", action="store_true", help="replace the version if it exists")


def _bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shuffle", action="store_true", help="shuffle every epoch")
    p.add_argument(
        "--seed", type=int, help="shuffle seed (needed with --shuffle and --num-shards > 1)"
    )
    p.add_argument("--batch-size", type=int, help="stream batches of this size (default: records)")
    p.add_argument("--fields", help="comma-separated fields to read (default: all)")
    p.add_argument("--num-workers", type=int, default=0, help="reader threads (default 0)")
    p.add_argument("--num-shards", type=int, default=1, help="shards (default 1)")
    p.add_argument("--shard-rank", type=int, default=0, help="this shard (default 0)")
    p.add_argument("--shard-by", choices=["records", "chunks"], default="records")
    p.add_argument("--epochs", type=_positive, default=1, help="epochs to time (default 1)")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw where the time went, per stage and over the epochs (needs matplotlib: pip "
        "install 'yogadl_plus[plot]')",
    )


def _exit_code(exc: BaseException) -> int | None:
    for kinds, code in EXIT_CODES:
        if isinstance(exc, kinds):
            return code
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status (errors: one line on stderr, see EXIT_CODES)."""
    args = build_parser().parse_args(argv)
    # (The demo tells what it built or reused itself: the library's log would say it twice.)
    with _log_to_stderr(logging.WARNING if args.command == "demo" else logging.INFO):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Run the command ``args`` names; its exit status."""
    try:
        return int(args.run(args))
    except BrokenPipeError:
        # The reader of our output left (`yogadl-plus head ... | head -1`): nothing more to say.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (Exception, KeyboardInterrupt) as exc:
        code = _exit_code(exc)
        if code is None:
            traceback.print_exc()
            return INTERNAL_ERROR
        message = _message(exc)
        if isinstance(exc, ydl.DatasetNotFound) and "--storage" not in message:
            message += _where_it_looked(args)
        print(f"yogadl-plus {args.command}: error: {message}", file=sys.stderr)
        return code


@contextlib.contextmanager
def _log_to_stderr(level: int) -> Iterator[None]:
    """While a command runs: the library's log (what was built, pulled, evicted; retries) on
    stderr, ``level`` and up, unless the program running us set up the ``yogadl_plus`` logger
    itself. Taken away after (main() may run in a process that goes on: a test, a notebook)."""
    logger = logging.getLogger("yogadl_plus")
    if logger.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("yogadl-plus: %(message)s"))
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


def _message(exc: BaseException) -> str:
    """The error on one line (Ctrl-C has no text of its own)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return " ".join(str(exc).split()) or type(exc).__name__
