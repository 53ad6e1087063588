"""The manifest: the one small JSON file that makes a folder of chunks a published version.

It is written last. A version without a manifest does not exist; a manifest names everything a
reader needs (schema, chunk files with their record counts, sizes, checksums and ids) and
nothing that needs unpickling. A manifest is checked strictly before use (``Manifest.parse``):
every type, range and sum, so that a damaged or tampered one is a CacheCorrupted naming the
field, never records served from the wrong place.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from operator import itemgetter
from typing import Any

import numpy as np

from yogadl_plus.cache.tokencolumns import TokenCounts, token_fields
from yogadl_plus.checks import check_name
from yogadl_plus.errors import CacheCorrupted, SchemaError, unreadable
from yogadl_plus.files import write_durably
from yogadl_plus.schema import Schema

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "MAX_CHUNK_RECORDS",
    "ChunkInfo",
    "Manifest",
    "chunk_id",
    "new_build_id",
    "schema_digest",
]

# 2: every chunk has an id, stored in the chunk too (see ChunkWriter), with its counts and the
# digest of the schema it was written with. 3: the manifest names its build, which each chunk
# records too and which its id is made from (chunk_id). 4: every chunk keeps token columns
# (cache/tokencolumns.py), and its entry (and identity) their token counts. Formats 1 to 3 are
# still read, as chunks without token columns.
FORMAT_VERSION = 4
MANIFEST_NAME = "manifest.json"
MAX_CHUNK_RECORDS = 2**32 - 1  # record keys are 4 bytes; the largest key is the chunk's identity
_FORMAT_NAME = "yogadl_plus.cache"
# A chunk file name, optionally inside one build folder ("b-1f2e/chunk-00000.mdb"): a manifest
# read from a remote store must not name a path outside its version.
_CHUNK_FILE = re.compile(r"(?:[A-Za-z0-9_-][A-Za-z0-9._-]*/)?[A-Za-z0-9_-][A-Za-z0-9._-]*")
# The name a chunk is written under (ChunkWriter; tasks of parallel builds prefix their part
# and attempt): chunks follow one another in the manifest in the order of these names.
_WRITTEN_NAME = re.compile(r"(?:p(\d+)-[0-9a-f]+-)?chunk-(\d+)\.mdb")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CHUNK_ID = re.compile(r"[0-9a-f]{32}")  # (a build id too)
_CHUNK_KEYS = {"file", "records", "bytes", "sha256", "columns", "id"}
# The file names of a whole chunk list, one a line, each a _CHUNK_FILE that is a _WRITTEN_NAME
# (ASCII digits, at most 9: part and number fit any int): its name, part and number.
_WRITTEN_FILES = re.compile(
    r"^(?:[A-Za-z0-9_-][A-Za-z0-9._-]*/)?((?:p([0-9]{1,9})-[0-9a-f]+-)?chunk-([0-9]{1,9})\.mdb)$",
    re.MULTILINE,
)
_HEX = b"0123456789abcdef"
_MAX_TOKENS = 2**62
_NO_TOKENS = TokenCounts()


def new_build_id() -> str:
    """A new build's id: what every chunk it writes records, and its manifest names."""
    return uuid.uuid4().hex


def chunk_id(build: str, name: str) -> str:
    """The id of the chunk written as ``name`` (its file name, without a build folder) by build
    ``build``: made from both, so that a chunk entry copied from another build's manifest (its
    file, sha256 and id) does not fit this one's build (Manifest.parse refuses it)."""
    return hashlib.sha256(f"{build}/{name}".encode()).hexdigest()[:32]


def schema_digest(schema: Schema) -> str:
    """The sha256 of a schema's canonical JSON: what a chunk records of the schema it holds."""
    text = json.dumps(schema.to_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ChunkInfo:
    """One LMDB chunk file: its name inside the version, records, size in bytes, sha256, the
    fields it also holds as whole column arrays (see ChunkWriter), its random id ("" in
    format 1 caches), and the tokens of each token column it keeps (format 4; none before)."""

    file: str
    records: int
    bytes: int
    sha256: str
    columns: tuple[str, ...] = ()
    id: str = ""
    tokens: Mapping[str, int] = _NO_TOKENS

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        if type(self.tokens) is not TokenCounts:
            object.__setattr__(self, "tokens", TokenCounts(self.tokens))
        if not isinstance(self.file, str) or not _CHUNK_FILE.fullmatch(self.file):
            raise ValueError(f"chunk file name {self.file!r} is not a plain relative name")


@dataclass
class Manifest:
    """A version: its name, schema and chunks, where it came from, and (format 3) ``build``, the
    id of the build that wrote its chunks ("" in older formats)."""

    dataset_id: str
    version: str
    schema: Schema
    chunks: list[ChunkInfo]
    source_fingerprint: str | None = None
    source_kind: str = ""
    library_version: str = ""
    #: The schema the source told without reading its records (``Source.description``), or
    #: None (it told none, the build was given ``schema=``, or the version is older): what a
    #: later ``cache_dataset`` of the version compares its source with.
    source_schema: Schema | None = None
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    format_version: int = FORMAT_VERSION
    build: str = ""

    @property
    def num_records(self) -> int:
        return sum(c.records for c in self.chunks)

    def to_json(self) -> str:
        """The manifest's JSON text: its fields indented, then the chunks, one line each.

        (``json.dumps(indent=...)`` would run the pure-Python encoder over every chunk: 0.3 s
        for 10^4 chunks, paid on each publish and each DataRef sent to a worker process.)
        """
        body = {
            "format": _FORMAT_NAME,
            "format_version": self.format_version,
            "dataset_id": self.dataset_id,
            "version": self.version,
            "num_records": self.num_records,
            "schema": self.schema.to_json(),
            "source": {
                "kind": self.source_kind,
                "fingerprint": self.source_fingerprint,
                "schema": None if self.source_schema is None else self.source_schema.to_json(),
            },
            "library_version": self.library_version,
            "created": self.created,
        }
        if self.format_version >= 3:
            body["build"] = self.build
        head = json.dumps(body, indent=1)  # "{\n ...\n}": the chunks go before its "\n}"
        lines = ",\n  ".join(map(json.dumps, self._chunks_json()))
        chunks = f"[\n  {lines}\n ]" if lines else "[]"
        return f'{head[:-2]},\n "chunks": {chunks}\n}}'

    def _chunks_json(self) -> Iterator[dict[str, Any]]:
        with_id, with_tokens = self.format_version >= 2, self.format_version >= 4
        for c in self.chunks:
            entry = {
                "file": c.file,
                "records": c.records,
                "bytes": c.bytes,
                "sha256": c.sha256,
                "columns": list(c.columns),
            }
            if with_id:
                entry["id"] = c.id
            if with_tokens:
                entry["tokens"] = dict(c.tokens)
            yield entry

    @classmethod
    def parse(cls, data: bytes, where: str) -> Manifest:
        """The manifest in ``data`` (read from ``where``), checked strictly; CacheCorrupted
        naming the field for anything that is not exactly what a builder writes."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise CacheCorrupted(f"{where}: the manifest is not UTF-8 text") from None
        return cls.from_json(text, where)

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        # The cycle collector is paused meanwhile: the parse makes objects by the hundred
        # thousand and none of them cyclic garbage, and at 10^4 chunks its passes over them
        # were a quarter of opening a version (15 ms of 60).
        collecting = gc.isenabled()
        gc.disable()
        try:
            try:
                body = json.loads(text)
            except RecursionError:
                raise CacheCorrupted(f"{where}: the manifest is nested too deeply") from None
            except ValueError as exc:
                raise CacheCorrupted(f"{where}: the manifest is not JSON ({exc})") from None
            return _Checker(where).manifest(body)
        finally:
            if collecting:
                gc.enable()

    def write(self, directory: str) -> None:
        """Write the manifest durably: temp file, fsync, rename."""
        write_durably(os.path.join(directory, MANIFEST_NAME), self.to_json().encode())

    @classmethod
    def read(cls, directory: str) -> Manifest:
        """The manifest of the version in ``directory``; FileNotFoundError if there is none."""
        path = os.path.join(directory, MANIFEST_NAME)
        return cls.parse(read_manifest_bytes(path), path)


def read_manifest_bytes(path: str) -> bytes:
    """The bytes of a manifest file; FileNotFoundError if it (or its folder) does not exist, a
    CacheCorrupted if something else stands in its place, a StorageError if it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(path) from None
    except IsADirectoryError:
        raise CacheCorrupted(f"{path}: the manifest is a directory, not a file") from None
    except OSError as exc:
        raise unreadable(path, exc, "manifest") from None


class _Checker:
    """Checks a parsed manifest field by field; every complaint names the field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, name: str, expected: str, value: Any) -> CacheCorrupted:
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return CacheCorrupted(
            f"{self.where}: field {name} must be {expected}, got {shown}; the manifest is damaged "
            "or was edited: rebuild the version (or pull it again)"
        )

    def get(self, body: Mapping[str, Any], key: str, name: str) -> Any:
        if key not in body:
            raise CacheCorrupted(f"{self.where}: the manifest has no field {name}")
        return body[key]

    def integer(self, value: Any, name: str, low: int, high: int) -> int:
        if type(value) is not int or not low <= value <= high:
            raise self.fail(name, f"an int in [{low}, {high}]", value)
        return value

    def text(self, value: Any, name: str, check: Callable[[str], bool] = bool) -> str:
        if not isinstance(value, str) or not check(value):
            raise self.fail(name, "a non-empty str" if check is bool else "a valid str", value)
        return value

    def schema(self, spec: Any, name: str) -> Schema:
        """The schema in field ``name``, or a CacheCorrupted naming it."""
        try:
            return Schema.from_json(spec)
        except CacheCorrupted:
            raise
        except (SchemaError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CacheCorrupted(
                f"{self.where}: field {name} is not a valid schema ({type(exc).__name__}: {exc})"
            ) from None

    def manifest(self, body: Any) -> Manifest:
        if not isinstance(body, dict) or body.get("format") != _FORMAT_NAME:
            raise CacheCorrupted(f"{self.where}: not a yogadl_plus manifest")
        version = self.get(body, "format_version", "format_version")
        if type(version) is int and version > FORMAT_VERSION:
            raise CacheCorrupted(
                f"{self.where}: cache format {version} is newer than this yogadl_plus reads "
                f"({FORMAT_VERSION}); upgrade yogadl_plus"
            )
        version = self.integer(version, "format_version", 1, FORMAT_VERSION)
        names = {}
        for key in ("dataset_id", "version"):
            value = self.get(body, key, key)
            try:
                names[key] = check_name(key, value)
            except ValueError:
                raise self.fail(key, "a valid name", value) from None
        schema = self.schema(self.get(body, "schema", "schema"), "schema")
        chunks_json = self.get(body, "chunks", "chunks")
        if not isinstance(chunks_json, list):
            raise self.fail("chunks", "a list", chunks_json)
        columns_allowed = {f.name for f in schema if f.fixed and f.shape == ()}
        tokens = _token_columns(schema) if version >= 4 else None
        build = body.get("build", "") if version >= 3 else ""
        quick = _checked_at_once(chunks_json, version, columns_allowed, tokens, build)
        # Where anything is wrong, the entries are checked one by one, and what is named.
        chunks = quick or self.chunks(chunks_json, version, columns_allowed, tokens)
        if quick is None:
            self.in_written_order(chunks)
            for attribute in ("file", "id"):
                self.distinct(chunks, attribute)
        if version >= 3:
            build = self.get(body, "build", "build")
            build = self.text(build, "build", lambda s: bool(_CHUNK_ID.fullmatch(s)))
            if quick is None:
                self.of_build(chunks, build)
        total = sum(c.records for c in chunks)
        count = self.integer(self.get(body, "num_records", "num_records"), "num_records", 0, 2**62)
        if count != total:
            raise CacheCorrupted(
                f"{self.where}: field num_records is {count} but the chunks hold {total} records"
            )
        source = self.get(body, "source", "source")
        if not isinstance(source, dict):
            raise self.fail("source", "an object", source)
        kind = self.get(source, "kind", "source.kind")
        if not isinstance(kind, str):
            raise self.fail("source.kind", "a str", kind)
        fingerprint = self.get(source, "fingerprint", "source.fingerprint")
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise self.fail("source.fingerprint", "a str or null", fingerprint)
        source_schema = self.source_schema(source.get("schema"))
        library = self.get(body, "library_version", "library_version")
        if not isinstance(library, str):
            raise self.fail("library_version", "a str", library)
        return Manifest(
            dataset_id=names["dataset_id"],
            version=names["version"],
            schema=schema,
            chunks=chunks,
            source_fingerprint=fingerprint,
            source_kind=kind,
            library_version=library,
            source_schema=source_schema,
            created=self.text(self.get(body, "created", "created"), "created"),
            format_version=version,
            build=build,
        )

    def source_schema(self, spec: Any) -> Schema | None:
        """The source's own schema, when the manifest holds one (older ones do not)."""
        if spec is None:
            return None
        return self.schema(spec, "source.schema")

    def distinct(self, chunks: list[ChunkInfo], attribute: str) -> None:
        """No two chunks share a file or an id ("" in format 1: no ids)."""
        values = [getattr(c, attribute) for c in chunks]
        named = [v for v in values if v]
        if len(set(named)) == len(named):
            return
        seen: dict[str, int] = {}
        for i, key in enumerate(values):
            if key and key in seen:
                raise CacheCorrupted(
                    f"{self.where}: chunks[{seen[key]}] and chunks[{i}] have the same "
                    f"{attribute} {key!r}"
                )
            seen[key] = i

    def of_build(self, chunks: list[ChunkInfo], build: str) -> None:
        """Every chunk's id is the one build ``build`` gave it (chunk_id): an entry copied from
        another build's manifest, or a build id edited, is refused before a record is read."""
        for i, c in enumerate(chunks):
            if c.id != chunk_id(build, c.file.rpartition("/")[2]):
                raise CacheCorrupted(
                    f"{self.where}: chunks[{i}] ({c.file}, id {c.id}) is not a chunk of build "
                    f"{build}, which the manifest names: its entry was copied from another build "
                    "or version, or the manifest edited; rebuild the version (or pull it again)"
                )

    def chunks(
        self,
        chunks_json: list[Any],
        version: int,
        allowed: set[str],
        tokens: Mapping[str, int | None] | None,
    ) -> list[ChunkInfo]:
        """Every chunk entry, checked. A manifest may list tens of thousands of chunks, so each
        entry gets one quick test; only an entry that fails it goes through ``chunk``, which
        names what is wrong (or accepts it after all: the quick test is never the looser).
        ``tokens``: the token columns every chunk keeps (``_token_columns``), None before
        format 4."""
        required = _chunk_keys(version)
        out = []
        last_columns: list[str] = []  # the last entry's columns, known to be good
        for i, c in enumerate(chunks_json):
            if type(c) is dict and c.keys() == required:
                file, records, size = c["file"], c["records"], c["bytes"]
                sha256, columns, chunk_id = c["sha256"], c["columns"], c.get("id", "")
                # Strings and ints exactly as the checks of ``chunk`` want them; the columns
                # equal to the last entry's (a str never equals a value of another JSON type).
                if (
                    type(file) is str
                    and _CHUNK_FILE.fullmatch(file)
                    and type(records) is int
                    and 0 <= records < MAX_CHUNK_RECORDS
                    and type(size) is int
                    and 1 <= size <= 2**62
                    and type(sha256) is str
                    and _SHA256.fullmatch(sha256)
                    and (version < 2 or (type(chunk_id) is str and _CHUNK_ID.fullmatch(chunk_id)))
                    and (columns == last_columns or columns == [])
                    and (tokens is None or _tokens_fit(c["tokens"], records, tokens))
                ):
                    counts = TokenCounts(c["tokens"]) if tokens is not None else _NO_TOKENS
                    info = ChunkInfo(file, records, size, sha256, tuple(columns), chunk_id, counts)
                    out.append(info)
                    continue
            out.append(self.chunk(c, i, version, allowed, tokens))
            last_columns = c["columns"]
        return out

    def in_written_order(self, chunks: list[ChunkInfo]) -> None:
        """Chunks are listed in the order they were written, none left out: their names say it
        (a writer numbers its chunks 0, 1, 2, ...; the tasks of a parallel build prefix their
        part) and each chunk holds its name, so records cannot be moved by editing the list."""
        last: tuple[int, int] | None = None
        for i, c in enumerate(chunks):
            written = _WRITTEN_NAME.fullmatch(c.file, c.file.rfind("/") + 1)
            if written is None:
                raise self.fail(f"chunks[{i}].file", "a chunk file name as written", c.file)
            key = (int(written.group(1) or -1), int(written.group(2)))
            if last is None or key[0] != last[0]:
                follows = key[1] == 0 and (last is None or key[0] > last[0])
            else:
                follows = key[1] == last[1] + 1
            if not follows:
                raise CacheCorrupted(
                    f"{self.where}: chunks[{i}] ({c.file}) is not the chunk written after the one "
                    "listed before it: the chunk list was reordered or a chunk left out; rebuild "
                    "the version (or pull it again)"
                )
            last = key

    def chunk(
        self,
        c: Any,
        i: int,
        version: int,
        allowed: set[str],
        tokens: Mapping[str, int | None] | None,
    ) -> ChunkInfo:
        name = f"chunks[{i}]"
        if not isinstance(c, dict):
            raise self.fail(name, "an object", c)
        keys = set(c)
        required = _chunk_keys(version)
        if keys != required:
            missing, extra = sorted(required - keys), sorted(keys - required)
            raise CacheCorrupted(
                f"{self.where}: {name} has fields {sorted(keys)}; missing {missing}, "
                f"unknown {extra}"
            )
        file = self.text(c["file"], f"{name}.file", lambda s: bool(_CHUNK_FILE.fullmatch(s)))
        columns = c["columns"]
        if (
            not isinstance(columns, list)
            or not all(isinstance(column, str) for column in columns)
            or len(set(columns)) != len(columns)
        ):
            raise self.fail(f"{name}.columns", "a list of distinct field names", columns)
        for column in columns:
            if column not in allowed:
                raise self.fail(f"{name}.columns", "names of scalar fixed-size fields", columns)
        records = self.integer(c["records"], f"{name}.records", 0, MAX_CHUNK_RECORDS - 1)
        return ChunkInfo(
            file=file,
            records=records,
            bytes=self.integer(c["bytes"], f"{name}.bytes", 1, 2**62),
            sha256=self.text(c["sha256"], f"{name}.sha256", lambda s: bool(_SHA256.fullmatch(s))),
            columns=tuple(columns),
            id=self.text(c["id"], f"{name}.id", lambda s: bool(_CHUNK_ID.fullmatch(s)))
            if version >= 2
            else "",
            tokens=self.token_counts(c["tokens"], f"{name}.tokens", records, tokens)
            if tokens is not None
            else _NO_TOKENS,
        )

    def token_counts(
        self, counts: Any, name: str, records: int, expected: Mapping[str, int | None]
    ) -> TokenCounts:
        """A chunk's token counts: one per token field of the schema (``expected``: each
        one's tokens per record where every record has as many), none other."""
        if not isinstance(counts, dict):
            raise self.fail(name, "an object of field name -> token count", counts)
        if counts.keys() != expected.keys():
            missing = sorted(expected.keys() - counts.keys())
            unknown = sorted(map(str, counts.keys() - expected.keys()))
            raise CacheCorrupted(
                f"{self.where}: {name} names fields {sorted(counts)}; the token fields of the "
                f"schema are {sorted(expected)}: missing {missing}, unknown {unknown}; the "
                "manifest is damaged or was edited: rebuild the version (or pull it again)"
            )
        for token_field, count in counts.items():
            where = f"{name}[{token_field!r}]"
            self.integer(count, where, 0, _MAX_TOKENS)
            per = expected[token_field]
            if per is not None and count != per * records:
                raise self.fail(where, f"{per * records} ({per} per record)", count)
        return TokenCounts(counts)


def _chunk_keys(version: int) -> set[str]:
    """The fields of a chunk's entry in a manifest of format ``version``."""
    if version >= 4:
        return _CHUNK_KEYS | {"tokens"}
    return _CHUNK_KEYS if version >= 2 else _CHUNK_KEYS - {"id"}


def _token_columns(schema: Schema) -> dict[str, int | None]:
    """The token fields of ``schema``, each with its tokens per record where every record
    has as many (a fixed length, not nullable), else None."""
    return {
        f.name: None if f.nullable or f.shape[0] is None else f.shape[0]
        for f in token_fields(schema)
    }


def _tokens_fit(counts: Any, records: int, expected: Mapping[str, int | None]) -> bool:
    """The quick test of a chunk's token counts (``_Checker.token_counts`` names what fails)."""
    if type(counts) is not dict or counts.keys() != expected.keys():
        return False
    for token_field, count in counts.items():
        per = expected[token_field]
        if type(count) is not int or not 0 <= count <= _MAX_TOKENS:
            return False
        if per is not None and count != per * records:
            return False
    return True


def _checked_at_once(
    entries: list[Any],
    version: int,
    allowed: set[str],
    tokens: Mapping[str, int | None] | None,
    build: Any,
) -> list[ChunkInfo] | None:
    """The chunks of a manifest's entries, checked a field at a time over all entries (10^4
    entries in a few milliseconds, where one by one took 80): or None if any check fails, and
    ``_Checker`` checks them one by one, naming what is wrong. It checks all that
    ``_Checker.chunks``, ``in_written_order``, ``distinct`` and ``of_build`` (``build``: the
    manifest's field, format 3 on) check, never less; what it accepts, they accept."""
    count = len(entries)
    if not count:
        return None
    required = _chunk_keys(version)
    try:
        if set(map(type, entries)) != {dict}:
            return None
        if any(
            len(keys) != len(required) or set(keys) != required for keys in set(map(tuple, entries))
        ):
            return None
        files, records, sizes, hashes, columns = (
            list(map(itemgetter(key), entries))
            for key in ("file", "records", "bytes", "sha256", "columns")
        )
        ids = list(map(itemgetter("id"), entries)) if version >= 2 else [""] * count
        if not (
            _all(files, str) and _all(records, int) and _all(sizes, int) and _all(columns, list)
        ):
            return None
        if min(records) < 0 or max(records) >= MAX_CHUNK_RECORDS:
            return None
        if min(sizes) < 1 or max(sizes) > 2**62 or not _hex(hashes, 64):
            return None
        if version >= 2 and not (_hex(ids, 32) and len(set(ids)) == count):
            return None
        column_lists = list(map(tuple, columns))
        for listed in set(column_lists):  # (a value that is no str is unhashable, or refused)
            if (
                not _all(listed, str)
                or len(set(listed)) != len(listed)
                or not allowed.issuperset(listed)
            ):
                return None
    except TypeError:  # an unhashable value
        return None
    names = _written_in_order(files)
    counts = _token_counts(entries, records, tokens)
    if names is None or counts is None or len(set(files)) != count:
        return None
    if version >= 3:
        if type(build) is not str or not _CHUNK_ID.fullmatch(build):
            return None
        made = hashlib.sha256(f"{build}/".encode())
        if list(map(lambda name: _continued(made, name), names)) != ids:
            return None
    return list(map(_chunk_info, files, records, sizes, hashes, column_lists, ids, counts))


def _all(values: Any, kind: type) -> bool:
    """Every one of ``values`` is exactly of type ``kind`` (a bool is no int)."""
    return set(map(type, values)) <= {kind}


def _hex(values: list[str], length: int) -> bool:
    """Every one of ``values`` is a str of ``length`` lowercase hex digits."""
    if not _all(values, str) or set(map(len, values)) != {length}:
        return False
    try:
        joined = "".join(values).encode("ascii")
    except UnicodeEncodeError:
        return False
    return not joined.translate(None, _HEX)


def _written_in_order(files: list[str]) -> list[str] | None:
    """The names (without the build folder) of chunk ``files`` that are plain relative names
    as ChunkWriter writes them, listed in the order they were written (see
    ``_Checker.in_written_order``); None if any is not."""
    lines = "\n".join(files)
    if lines.count("\n") != len(files) - 1:
        return None
    found = _WRITTEN_FILES.findall(lines)
    if len(found) != len(files):
        return None
    names, parts, numbers = zip(*found)
    part = np.array([int(p) if p else -1 for p in parts], dtype=np.int64)
    number = np.array(list(map(int, numbers)), dtype=np.int64)
    same_part = part[1:] == part[:-1]
    follows = np.where(
        same_part, number[1:] == number[:-1] + 1, (number[1:] == 0) & (part[1:] > part[:-1])
    )
    return list(names) if number[0] == 0 and follows.all() else None


def _token_counts(
    entries: list[dict[str, Any]], records: list[int], tokens: Mapping[str, int | None] | None
) -> list[TokenCounts] | None:
    """Each entry's token counts, checked (``_tokens_fit``); None if one is wrong."""
    if tokens is None:
        return [_NO_TOKENS] * len(entries)
    counts = list(map(itemgetter("tokens"), entries))
    if not tokens:  # no token fields: every entry's counts are {}
        return [_NO_TOKENS] * len(entries) if _all(counts, dict) and not any(counts) else None
    if not all(map(lambda c, r: _tokens_fit(c, r, tokens), counts, records)):
        return None
    return list(map(TokenCounts, counts))


def _continued(digest: Any, name: str) -> str:
    """``chunk_id(build, name)``, from the digest of ``build + "/"``."""
    ours = digest.copy()
    ours.update(name.encode())
    return str(ours.hexdigest()[:32])


def _chunk_info(
    file: str,
    records: int,
    size: int,
    sha256: str,
    columns: tuple[str, ...],
    id: str,
    tokens: TokenCounts,
) -> ChunkInfo:
    """A ChunkInfo of values checked already (``ChunkInfo(...)`` would check them again, and
    takes three times as long)."""
    info = object.__new__(ChunkInfo)
    fields = info.__dict__
    fields["file"] = file
    fields["records"] = records
    fields["bytes"] = size
    fields["sha256"] = sha256
    fields["columns"] = columns
    fields["id"] = id
    fields["tokens"] = tokens
    return info
