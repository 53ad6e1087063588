"""WebDataset tar shards, local or in a bucket, read by streaming: one record per sample (the
members that share a key), each member's bytes kept as they are or made an int or a str."""

from __future__ import annotations

import functools
import hashlib
import os
import posixpath
import re
import tarfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from yogadl_plus.errors import SchemaError, YogaError
from yogadl_plus.schema import Field, Schema
from yogadl_plus.sources.base import Description, Source, even_cuts
from yogadl_plus.sources.imagebytes import checked_image, image_field, is_image_name
from yogadl_plus.sources.locations import (
    expand_braces,
    has_wildcard,
    list_folder,
    local_matches,
    remote_matches,
    resolve_paths,
    url_of,
)

__all__ = ["INT_EXTENSIONS", "TEXT_EXTENSIONS", "WebDataset"]

#: Extensions whose members are decimal integers, cached as int64 (WebDataset's own).
INT_EXTENSIONS = frozenset({"cls", "cls2", "index", "label"})
#: Extensions whose members are UTF-8 text, cached as str.
TEXT_EXTENSIONS = frozenset({"txt", "json"})
KEY = "__key__"
#: Members WebDataset's reader skips as the shard's metadata: ``__name__`` at the top, or in a
#: top folder so named.
_METADATA = re.compile(r"__[^/]*__($|/)")


@dataclass(frozen=True)
class Shard:
    """One tar shard: its path on the filesystem, and what the listing said of it."""

    path: str
    size: int
    mtime_ns: int | None


class WebDataset(Source):
    """The samples of WebDataset tar shards: ``urls`` is a path, a glob, a brace range
    (``shard-{0000..0099}.tar``, ``{train,val}``), an ``s3://`` or ``gs://`` URL, or a list of
    those (on one filesystem). The shards are read in that order (a glob's matches sorted),
    streamed, never unpacked to disk.

    A sample is the consecutive members that share a key: the member's path up to the first
    dot of its file name (``images/0001.seg.png``: key ``images/0001``, extension
    ``seg.png``). Its record is ``__key__`` plus a field per extension (lower-cased), typed by
    the extension's last part: ``cls``, ``cls2``, ``index``, ``label`` -> int64; ``txt``,
    ``json`` -> str; image extensions -> the image file's bytes (checked, read back as RGB
    pixels); anything else -> bytes. Directories, hidden members (``.name``) and the shard's
    metadata (``__name__``, as WebDataset's reader skips it) are skipped; a sample's members
    are consecutive.

    The fields are the first sample's, unless ``schema`` is given: then a field missing from a
    sample is null where the schema makes it nullable. Anything else is a clear error naming
    the shard and the key or member. ``filesystem`` (a ``pyarrow.fs`` filesystem) reads a
    bucket with an endpoint and credentials of your own.
    """

    kind = "webdataset"

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        schema: Schema | None = None,
        filesystem: Any = None,
    ) -> None:
        named = [urls] if isinstance(urls, (str, os.PathLike)) else list(urls)
        if not named:
            raise ValueError("WebDataset needs at least one shard: a path, glob or URL")
        if schema is not None and KEY not in schema:
            raise ValueError(f"schema= must have the field {KEY!r} (str), every sample's key")
        texts = [t for u in named for t in expand_braces(os.fspath(u))]
        self.filesystem, paths = resolve_paths(texts, filesystem, "WebDataset")
        self.shards = _listed(self.filesystem, paths)
        self.given_schema = schema

    def __repr__(self) -> str:
        first = url_of(self.filesystem, self.shards[0].path)
        return f"WebDataset({len(self.shards)} shards: {first!r}, ...)"

    @functools.cached_property
    def schema(self) -> Schema:
        """The schema given, else the first sample's fields (reading up to its end)."""
        if self.given_schema is not None:
            return self.given_schema
        for shard in self.shards:
            for key, sample in _samples(self.filesystem, shard.path):
                where = f"{url_of(self.filesystem, shard.path)}, sample {key!r}"
                return Schema([Field(KEY, str), *(_field(ext, where) for ext in sample)])
        raise self._no_sample()

    def _no_sample(self) -> YogaError:
        return YogaError(
            f"WebDataset: none of its {len(self.shards)} shards holds a sample (the first: "
            f"{url_of(self.filesystem, self.shards[0].path)}): check the URLs"
        )

    def description(self) -> Description:
        """The schema given, if any: the shards are not read to tell more."""
        return Description(schema=self.given_schema)

    def fingerprint(self) -> str:
        """The shards' URLs, sizes and modification times."""
        digest = hashlib.sha256()
        for shard in self.shards:
            url = url_of(self.filesystem, shard.path)
            digest.update(f"{url}\0{shard.size}\0{shard.mtime_ns}\n".encode())
        return "webdataset-sha256:" + digest.hexdigest()[:32]

    def records(self) -> Iterator[dict[str, Any]]:
        count = 0
        for record in _Shards(self.filesystem, self.shards, self.schema).records():
            count += 1
            yield record
        if not count:
            raise self._no_sample()

    def split(self, parts: int) -> list[Source]:
        """Runs of whole shards, of nearly equal bytes (their records' count is only known by
        reading them)."""
        schema = self.schema
        return [
            _Shards(self.filesystem, self.shards[run.start : run.stop], schema)
            for run in even_cuts([shard.size for shard in self.shards], parts)
        ]


class _Shards(Source):
    """Some shards of a WebDataset, read with its schema."""

    kind = "webdataset"

    def __init__(self, filesystem: Any, shards: list[Shard], schema: Schema) -> None:
        self.filesystem = filesystem
        self.shards = shards
        self._schema = schema

    def __repr__(self) -> str:
        urls = [url_of(self.filesystem, shard.path) for shard in self.shards]
        return f"<WebDataset shards {urls[:3]}{'...' if len(urls) > 3 else ''}>"

    @property
    def schema(self) -> Schema:
        return self._schema

    def records(self) -> Iterator[dict[str, Any]]:
        for shard in self.shards:
            url = url_of(self.filesystem, shard.path)
            for key, sample in _samples(self.filesystem, shard.path):
                yield _record(key, sample, self._schema, f"{url}, sample {key!r}")


def _listed(filesystem: Any, paths: list[str]) -> list[Shard]:
    """The shards the paths and globs name, in order, each a file that exists."""
    import pyarrow.fs as pafs

    folders: dict[str, dict[str, Any]] = {}  # a bucket folder -> its files, listed once
    infos: list[Any] = []
    for path in paths:
        if has_wildcard(path) and filesystem.type_name == "local":
            infos += filesystem.get_file_info(local_matches(path, "WebDataset"))
        elif has_wildcard(path):
            infos += remote_matches(filesystem, path, "WebDataset")
        elif filesystem.type_name == "local" or "/" not in path:
            infos.append(filesystem.get_file_info(path))
        else:  # one listing of its folder tells of its neighbours too: few requests
            folder = path.rsplit("/", 1)[0]
            if folder not in folders:
                selector = pafs.FileSelector(folder, allow_not_found=True)
                folders[folder] = {i.path: i for i in list_folder(filesystem, selector)}
            infos.append(folders[folder].get(path) or pafs.FileInfo(path))
    for info in infos:
        if info.type != pafs.FileType.File:
            what = "is a folder" if info.type == pafs.FileType.Directory else "does not exist"
            raise YogaError(
                f"WebDataset shard {url_of(filesystem, info.path)!r} {what}: name the shards "
                "(folder/shard-{0000..0099}.tar, folder/*.tar)"
            )
    return [Shard(i.path, i.size, i.mtime_ns) for i in infos]


def _samples(filesystem: Any, path: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """The samples of the shard ``path``, streamed: (key, extension -> the member's bytes)."""
    url = url_of(filesystem, path)
    member = ""
    sample: dict[str, bytes]
    try:
        with (
            filesystem.open_input_stream(path) as raw,
            tarfile.open(fileobj=raw, mode="r|*") as tar,
        ):
            key, sample = "", {}
            done: set[str] = set()  # the keys of the samples yielded: each comes once
            for info in tar:
                member = info.name
                found = _key_and_extension(info, url)
                if found is None:
                    continue
                if found[0] != key and sample:
                    yield key, sample
                    done.add(key)
                    sample = {}
                key, extension = found
                if key in done:
                    raise YogaError(
                        f"{url}: member {member!r}: sample {key!r} came earlier in the shard, "
                        "with other samples between: a sample's members must be consecutive "
                        "(write each sample's files together, as WebDataset's TarWriter does, "
                        "or sort the members by name)"
                    )
                if extension in sample:
                    raise YogaError(
                        f"{url}: member {member!r}: sample {key!r} has a {extension!r} member "
                        "twice; each extension is one field of a sample"
                    )
                data = tar.extractfile(info)
                sample[extension] = data.read() if data is not None else b""
            if sample:
                yield key, sample
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        after = f" (after member {member!r})" if member else ""
        raise YogaError(
            f"WebDataset shard {url}: cannot read it as a tar file{after}: {exc}; is it "
            "truncated or damaged? Nothing was cached"
        ) from exc


def _key_and_extension(info: tarfile.TarInfo, url: str) -> tuple[str, str] | None:
    """(key, lower-cased extension) of a member, None for one skipped (a directory, a link,
    a hidden file); a YogaError for a path outside the shard or a file outside any sample."""
    name = info.name
    if posixpath.isabs(name) or ".." in name.split("/"):
        raise YogaError(
            f"{url}: member {name!r} has a path outside the shard (absolute, or with '..'): "
            "a WebDataset member is a relative path"
        )
    base = posixpath.basename(name)
    if not info.isfile() or not base or base.startswith(".") or _METADATA.match(name):
        return None
    if "." not in base or base.endswith("."):
        raise YogaError(
            f"{url}: member {name!r} belongs to no sample: a member's name is its sample's key, "
            "a dot, then its extension (0001.jpg, 0001.cls)"
        )
    cut = len(name) - len(base) + base.index(".")
    extension = name[cut + 1 :].lower()
    if extension == KEY:
        raise YogaError(
            f"{url}: member {name!r} has the extension {KEY!r}, the name of the field that "
            "holds each sample's key: rename the member"
        )
    return name[:cut], extension


def _field(extension: str, where: str) -> Field:
    """The field of members with this extension (typed by its last part)."""
    last = extension.rsplit(".", 1)[-1]
    if last in INT_EXTENSIONS:
        return Field(extension, np.int64)
    if last in TEXT_EXTENSIONS:
        return Field(extension, str)
    if is_image_name(f".{last}"):
        return image_field(extension)
    return Field(extension, bytes)


def _record(key: str, sample: Mapping[str, bytes], schema: Schema, where: str) -> dict[str, Any]:
    """The record of one sample, its fields checked against ``schema``."""
    extra = [extension for extension in sample if extension not in schema]
    if extra:
        raise SchemaError(
            f"{where}: has the field {extra[0]!r}, which the schema {list(schema.names)} lacks "
            "(the first sample's fields): give schema= with every field, nullable ones "
            "for the fields some samples lack"
        )
    record: dict[str, Any] = {KEY: key}
    for field in schema:
        if field.name == KEY:
            continue
        if field.name in sample:
            record[field.name] = _value(field.name, sample[field.name], where)
        elif field.nullable:
            record[field.name] = None
        else:
            raise YogaError(
                f"{where}: has no {field.name!r} member, which the schema requires: give "
                f"schema= with {field.name!r} nullable to cache such samples with a null"
            )
    return record


def _value(extension: str, data: bytes, where: str) -> Any:
    """A member's bytes as its extension says: an int, a str, a checked image, or bytes."""
    last = extension.rsplit(".", 1)[-1]
    member = f"{where}, member .{extension}"
    if last in INT_EXTENSIONS:
        try:
            return np.int64(int(data.decode("ascii").strip()))
        except (UnicodeDecodeError, ValueError, OverflowError):
            raise YogaError(f"{member}: {data[:40]!r} is not an integer (int64)") from None
    if last in TEXT_EXTENSIONS:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise YogaError(f"{member}: not UTF-8 text ({exc})") from None
    if is_image_name(f".{last}"):
        return checked_image(data, member)
    return data
