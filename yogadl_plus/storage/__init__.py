"""Where versioned caches live: local folders, S3 and GCS, all with the same Storage face."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlparse

from yogadl_plus.storage.base import Storage, check_name
from yogadl_plus.storage.gcs import GCSStorage
from yogadl_plus.storage.local import LocalStorage, default_root, default_storage
from yogadl_plus.storage.s3 import S3Storage
from yogadl_plus.storage.transfer import copy_version

__all__ = [
    "GCSStorage",
    "LocalStorage",
    "S3Storage",
    "Storage",
    "check_name",
    "copy_version",
    "default_storage",
    "local_root",
    "open_storage",
]


def open_storage(url: str | os.PathLike[str], **options: Any) -> Storage:
    """The storage a URL names: "/path", "file:///path", "s3://bucket/prefix", "gs://bucket/prefix".

    ``options`` go to S3Storage / GCSStorage (``local_cache=``, ``endpoint_url=``, ...).
    """
    text = os.fspath(url)
    parsed = urlparse(text)
    if parsed.scheme in ("s3", "gs"):
        if not parsed.netloc:
            raise ValueError(f"{text}: no bucket; use {parsed.scheme}://bucket/prefix")
        if parsed.scheme == "s3":
            return S3Storage(parsed.netloc, parsed.path, **options)
        return GCSStorage(parsed.netloc, parsed.path, **options)
    if options:
        raise ValueError(f"{text}: a local storage takes no options, got {sorted(options)}")
    root = local_root(text)
    if root is None:
        raise ValueError(f"unsupported storage URL {text!r}: use a path, file://, s3:// or gs://")
    return LocalStorage(root)


def local_root(url: str | os.PathLike[str] | None) -> str | None:
    """The folder a local storage URL names (a path or file://; None: the default storage's
    root), or None for any other URL."""
    if url is None:
        return default_root()
    text = os.fspath(url)
    parsed = urlparse(text)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{text}: file:// URLs name a local path, not host {parsed.netloc!r}")
        return os.path.abspath(unquote(parsed.path))
    if parsed.scheme == "":
        return os.path.abspath(text)
    return None
