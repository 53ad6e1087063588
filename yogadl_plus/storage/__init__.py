"""Where versioned caches live: local folders now; S3 and GCS share the same Storage face."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse

from yogadl_plus.storage.base import Storage, check_name
from yogadl_plus.storage.local import LocalStorage

__all__ = ["LocalStorage", "Storage", "check_name", "default_storage", "open_storage"]


def default_storage() -> LocalStorage:
    """LocalStorage at $YOGADL_PLUS_HOME, or ~/.cache/yogadl_plus."""
    root = os.environ.get("YOGADL_PLUS_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache", "yogadl_plus"
    )
    return LocalStorage(root)


def open_storage(url: str | os.PathLike[str]) -> Storage:
    """The storage a URL names: "/path", "file:///path", "s3://bucket/prefix", "gs://bucket/prefix"."""
    text = os.fspath(url)
    parsed = urlparse(text)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{text}: file:// URLs name a local path, not host {parsed.netloc!r}")
        return LocalStorage(unquote(parsed.path))
    if parsed.scheme == "":
        return LocalStorage(text)
    if parsed.scheme in ("s3", "gs"):
        raise NotImplementedError(
            f"{text}: {parsed.scheme}:// storage is not in this release yet; "
            "use a local path or file:// URL"
        )
    raise ValueError(f"unsupported storage URL {text!r}: use a path, file://, s3:// or gs://")
