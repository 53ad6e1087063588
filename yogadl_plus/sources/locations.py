"""Files named by path, glob or URL, on local disk or in a bucket (``s3://``, ``gs://``): which
filesystem they are on, listing them, and reading them, all through ``pyarrow.fs``."""

from __future__ import annotations

import fnmatch
import glob as globlib
import os
import re
from typing import Any

from yogadl_plus.errors import YogaError

__all__ = [
    "expand_braces",
    "glob_root",
    "has_wildcard",
    "list_folder",
    "local_matches",
    "read_file",
    "remote_matches",
    "resolve_paths",
    "url_of",
]


def has_wildcard(text: str) -> bool:
    """Whether ``text`` is a glob (``*``, ``?`` or ``[``)."""
    return any(ch in text for ch in "*?[")


def resolve_paths(
    paths: Any, filesystem: Any = None, what: str = "Parquet"
) -> tuple[Any, list[str]]:
    """(the filesystem, each path or URL the user named as a path on it), listing nothing.
    ``what`` names the data in messages ("Parquet", "WebDataset shard")."""
    import pyarrow.fs as pafs

    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    texts = [os.fspath(item) for item in items]
    schemes = {t.split("://", 1)[0] if "://" in t else "file" for t in texts}
    if len(schemes) > 1:
        raise YogaError(f"{what} paths must all be on one filesystem, got {sorted(schemes)}")
    scheme = schemes.pop() if schemes else "file"
    if scheme not in ("file", "s3", "gs"):
        raise YogaError(f"{texts[0]}: {what} URLs may be file://, s3:// or gs://")
    if scheme == "file" and filesystem is None:
        return pafs.LocalFileSystem(), [os.path.abspath(t.removeprefix("file://")) for t in texts]
    if filesystem is None:
        try:
            filesystem, _ = pafs.FileSystem.from_uri(texts[0])
        except Exception as exc:
            raise YogaError(
                f"{texts[0]}: cannot open its filesystem ({exc}); pass filesystem= (a pyarrow.fs "
                "filesystem with your endpoint and credentials)"
            ) from exc
    return filesystem, [t.split("://", 1)[1] if "://" in t else t for t in texts]


def url_of(filesystem: Any, path: str) -> str:
    """``path`` on ``filesystem`` as a user names it: a local path, or ``s3://`` / ``gs://``."""
    kind = filesystem.type_name
    if kind == "local":
        return path
    return f"{'gs' if kind == 'gcs' else kind}://{path}"


def glob_root(pattern: str) -> str:
    """The folders of a glob before its first wildcard (where its partition folders start)."""
    parts = pattern.split("/")[:-1]
    fixed = []
    for part in parts:
        if has_wildcard(part):
            break
        fixed.append(part)
    return "/".join(fixed) or ("/" if pattern.startswith("/") else "")


def local_matches(pattern: str, what: str) -> list[str]:
    """The files a local glob matches, as sorted absolute paths; a YogaError if none."""
    matched = sorted(os.path.abspath(f) for f in globlib.glob(pattern, recursive=True))
    if not matched:
        raise YogaError(f"{what} glob {pattern!r} matches no file")
    return matched


def remote_matches(filesystem: Any, path: str, what: str) -> list[Any]:
    """The files (``pyarrow.fs.FileInfo``, sorted by path) a bucket glob matches: only its last
    part may hold wildcards, so that one listing of its folder finds them."""
    import pyarrow.fs as pafs

    where = url_of(filesystem, path)
    if "/" not in path or has_wildcard(path.rsplit("/", 1)[0]):
        raise YogaError(
            f"{where}: in a bucket URL only the last part may be a glob (s3://bucket/folder/part-*)"
        )
    parent, pattern = path.rsplit("/", 1)
    infos = list_folder(filesystem, pafs.FileSelector(parent))
    found = sorted(
        (i for i in infos if i.is_file and fnmatch.fnmatch(i.base_name, pattern)),
        key=lambda i: i.path,
    )
    if not found:
        raise YogaError(f"{what} glob {where!r} matches no file")
    return found


def list_folder(filesystem: Any, selector: Any) -> list[Any]:
    """``filesystem.get_file_info(selector)``, a YogaError naming the folder where it fails."""
    try:
        return list(filesystem.get_file_info(selector))
    except OSError as exc:
        raise YogaError(
            f"{url_of(filesystem, selector.base_dir)}: cannot list it ({exc}): check the "
            "bucket, credentials and endpoint"
        ) from exc


def read_file(filesystem: Any, path: str) -> bytes:
    """The whole file ``path`` (one GET from a bucket), a YogaError naming it where that fails."""
    try:
        with filesystem.open_input_stream(path) as f:
            return bytes(f.read())
    except OSError as exc:
        raise YogaError(f"{url_of(filesystem, path)}: cannot read it ({exc})") from exc


_RANGE = re.compile(r"(-?[0-9]+)\.\.(-?[0-9]+)")


def expand_braces(text: str) -> list[str]:
    """``text`` with its braces expanded as a shell (and WebDataset's ``braceexpand``) does:
    ``shard-{0000..0099}.tar`` (a range, zero-padded as its bounds are), ``{train,val}``
    (alternatives), nested; a brace that is neither stays as it is."""
    start = text.find("{")
    end = _closing_brace(text, start) if start >= 0 else -1
    if end < 0:
        return [text]
    prefix, inner, suffix = text[:start], text[start + 1 : end], text[end + 1 :]
    bounds = _RANGE.fullmatch(inner)
    if bounds:
        low, high = bounds.groups()
        padded = any(len(b.lstrip("-")) > 1 and b.lstrip("-")[0] == "0" for b in (low, high))
        width = max(len(low), len(high)) if padded else 0
        step = 1 if int(high) >= int(low) else -1
        options = [str(i).zfill(width) for i in range(int(low), int(high) + step, step)]
    else:
        options = _top_level_parts(inner)
        if len(options) == 1:  # "{x}": no alternatives, a brace of the name itself
            return [f"{prefix}{{{inner}}}{rest}" for rest in expand_braces(suffix)]
    return [name for option in options for name in expand_braces(prefix + option + suffix)]


def _closing_brace(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return -1


def _top_level_parts(inner: str) -> list[str]:
    """``inner`` cut at its commas outside nested braces."""
    parts, depth, begun = [], 0, 0
    for i, ch in enumerate(inner):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(inner[begun:i])
            begun = i + 1
    return [*parts, inner[begun:]]
