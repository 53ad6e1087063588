"""The manifest: the one small JSON file that makes a folder of chunks a published version.

It is written last. A version without a manifest does not exist; a manifest names everything a
reader needs (schema, chunk files with their record counts, sizes and checksums) and nothing
that needs unpickling.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from yogadl_plus.errors import CacheCorrupted
from yogadl_plus.schema import Schema

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "ChunkInfo",
    "Manifest",
    "bytes_sha256",
    "check_chunk",
    "file_sha256",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
_FORMAT_NAME = "yogadl_plus.cache"
# A chunk file name, optionally inside one build folder ("b-1f2e/chunk-00000.mdb"): a manifest
# read from a remote store must not name a path outside its version.
_CHUNK_FILE = re.compile(r"(?:[A-Za-z0-9_-][A-Za-z0-9._-]*/)?[A-Za-z0-9_-][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class ChunkInfo:
    """One LMDB chunk file: its name inside the version, records, size in bytes, sha256, and
    the fields it also holds as whole column arrays (see ChunkWriter)."""

    file: str
    records: int
    bytes: int
    sha256: str
    columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        if not isinstance(self.file, str) or not _CHUNK_FILE.fullmatch(self.file):
            raise ValueError(f"chunk file name {self.file!r} is not a plain relative name")


@dataclass
class Manifest:
    dataset_id: str
    version: str
    schema: Schema
    chunks: list[ChunkInfo]
    source_fingerprint: str | None = None
    source_kind: str = ""
    library_version: str = ""
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    format_version: int = FORMAT_VERSION

    @property
    def num_records(self) -> int:
        return sum(c.records for c in self.chunks)

    def to_json(self) -> str:
        body = {
            "format": _FORMAT_NAME,
            "format_version": self.format_version,
            "dataset_id": self.dataset_id,
            "version": self.version,
            "num_records": self.num_records,
            "schema": self.schema.to_json(),
            "chunks": [asdict(c) for c in self.chunks],
            "source": {"kind": self.source_kind, "fingerprint": self.source_fingerprint},
            "library_version": self.library_version,
            "created": self.created,
        }
        return json.dumps(body, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        try:
            body = json.loads(text)
            if not isinstance(body, dict) or body.get("format") != _FORMAT_NAME:
                raise CacheCorrupted(f"{where}: not a yogadl_plus manifest")
            if body["format_version"] > FORMAT_VERSION:
                raise CacheCorrupted(
                    f"{where}: cache format {body['format_version']} is newer than this "
                    f"yogadl_plus reads ({FORMAT_VERSION}); upgrade yogadl_plus"
                )
            manifest = cls(
                dataset_id=body["dataset_id"],
                version=body["version"],
                schema=Schema.from_json(body["schema"]),
                chunks=[ChunkInfo(**c) for c in body["chunks"]],
                source_fingerprint=body["source"]["fingerprint"],
                source_kind=body["source"]["kind"],
                library_version=body["library_version"],
                created=body["created"],
                format_version=body["format_version"],
            )
        except CacheCorrupted:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CacheCorrupted(
                f"{where}: unreadable manifest ({type(exc).__name__}: {exc})"
            ) from None
        if manifest.num_records != body["num_records"]:
            raise CacheCorrupted(f"{where}: chunk record counts do not add up to num_records")
        return manifest

    def write(self, directory: str) -> None:
        """Write the manifest durably: temp file, fsync, rename."""
        write_durably(os.path.join(directory, MANIFEST_NAME), self.to_json().encode())

    @classmethod
    def read(cls, directory: str) -> Manifest:
        path = os.path.join(directory, MANIFEST_NAME)
        with open(path, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise CacheCorrupted(f"{path}: the manifest is not UTF-8 text") from None
        return cls.from_json(text, path)


def write_durably(path: str, data: bytes) -> None:
    """Replace ``path`` by ``data`` whole or not at all: temp file, fsync, rename."""
    temp = path + ".tmp"
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def bytes_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def check_chunk(
    path: str,
    info: ChunkInfo,
    where: str | None = None,
    damaged: str = "the version is damaged: delete it and build it again",
) -> None:
    """Raise CacheCorrupted unless the file at ``path`` has the size and sha256 of ``info``.

    The message names the chunk as ``where`` (default: ``path``), the place a user can act on,
    and ends with ``damaged``: what to do about it.
    """
    where = where or path
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise CacheCorrupted(f"chunk {where} is missing") from None
    if size != info.bytes:
        raise CacheCorrupted(f"chunk {where} has {size} bytes, the manifest says {info.bytes}")
    digest = file_sha256(path)
    if digest != info.sha256:
        raise CacheCorrupted(
            f"chunk {where} has sha256 {digest}, the manifest says {info.sha256}; {damaged}"
        )
