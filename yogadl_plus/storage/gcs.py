"""GCSStorage: versions in a Google Cloud Storage bucket."""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

from yogadl_plus.errors import StorageError, TransientStorageError, YogaError, missing_extra
from yogadl_plus.storage.objects import (
    ObjectStore,
    RangeSink,
    Retries,
    again_if_damaged,
    retried,
)
from yogadl_plus.storage.remote import (
    DEFAULT_LEASE_TTL,
    DEFAULT_RETRY_TIMEOUT,
    DEFAULT_TRANSFERS,
    RemoteSettings,
    RemoteStorage,
)
from yogadl_plus.storage.waiting import progress

__all__ = ["GCSStorage"]

_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


class _GCSObjects(ObjectStore):
    def __init__(self, client: Any, bucket: str, prefix: str, retries: Retries) -> None:
        self.client = client
        self.bucket_name = bucket
        self.bucket = client.bucket(bucket)
        self.prefix = prefix
        self.retries = retries
        self.url = f"gs://{bucket}/{prefix}".rstrip("/")
        # Every call is one try (retry=None) bounded by these; trying again is ours (@retried).
        self.once: dict[str, Any] = {"retry": None, "timeout": retries.request_timeouts()}

    def _failure(
        self, exc: Exception, what: str, where: str, missing_is_bucket: bool = True, **_: Any
    ) -> YogaError:
        import requests
        from google import auth
        from google.api_core import exceptions as gx
        from google.auth.exceptions import DefaultCredentialsError

        try:
            from google.resumable_media import DataCorruption, InvalidResponse
        except ImportError:  # google-cloud-storage 3 without the old package
            from google.cloud.storage.exceptions import (  # type: ignore[no-redef]
                DataCorruption,
                InvalidResponse,
            )

        from urllib3.exceptions import NewConnectionError

        gax = auth.exceptions
        if isinstance(exc, DataCorruption):
            return self.arrived_damaged(where, exc)
        if isinstance(exc, gx.NotFound) and missing_is_bucket:
            return StorageError(
                f"{where}: bucket {self.bucket_name!r} does not exist (or the object vanished "
                f"during {what}): check the bucket name and project"
            )
        if isinstance(exc, (gx.Forbidden, gx.Unauthorized)):
            return StorageError(
                f"{where}: access denied to {what}: check the credentials "
                "(GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login, or "
                "client=) and the bucket's IAM roles"
            )
        if isinstance(exc, DefaultCredentialsError):
            return StorageError(
                f"{where}: no Google credentials found: set GOOGLE_APPLICATION_CREDENTIALS, run "
                "`gcloud auth application-default login`, or pass client="
            )
        if isinstance(exc, gax.RefreshError):
            return StorageError(
                f"{where}: the Google credentials could not be refreshed ({exc}): check "
                "GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth application-default login`"
            )
        if isinstance(exc, gx.GoogleAPICallError):
            status = exc.code
        elif isinstance(exc, InvalidResponse):  # from uploads and downloads
            status = getattr(getattr(exc, "response", None), "status_code", None)
        else:
            status = None
        if status in _TRANSIENT_STATUS:
            return TransientStorageError(f"{where}: {what} failed: {exc}")
        if isinstance(exc, requests.exceptions.SSLError):  # a certificate will not mend itself
            return StorageError(f"{where}: TLS with {self._endpoint()} failed: {exc}")
        if isinstance(exc, requests.exceptions.ConnectTimeout) or isinstance(
            getattr(exc.args[0] if exc.args else None, "reason", None), NewConnectionError
        ):  # refused, unresolved, no answer to connect
            return TransientStorageError(
                f"{where}: cannot reach {self._endpoint()} ({type(exc).__name__}): check the "
                "endpoint (client_options, STORAGE_EMULATOR_HOST), the network and any proxy"
            )
        # Dropped connections, read timeouts.
        cut_off = (
            requests.exceptions.ConnectionError,
            requests.exceptions.Timeout,
            requests.exceptions.ChunkedEncodingError,
            gax.TransportError,
        )
        return self._cut_off_or_failed(exc, what, where, cut_off)

    def _endpoint(self) -> str:
        return str(getattr(self.client, "api_endpoint", None) or "?")

    @again_if_damaged
    @retried
    def read(self, key: str) -> tuple[bytes, str] | None:
        from google.api_core.exceptions import NotFound

        blob = self.bucket.blob(self.prefix + key)
        with self._errors("read", key, missing_is_bucket=False):
            try:
                data = blob.download_as_bytes(**self.once)
            except NotFound:
                return None
        return data, str(blob.generation)

    @retried
    def token(self, key: str) -> str | None:
        with self._errors("head", key, missing_is_bucket=False):
            blob = self.bucket.get_blob(self.prefix + key, **self.once)
        return None if blob is None else str(blob.generation)

    @retried
    def _write(self, key: str, data: bytes, generation: int) -> str | None:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self.bucket.blob(self.prefix + key)
        with self._errors("conditional write", key):
            try:
                blob.upload_from_string(data, if_generation_match=generation, **self.once)
            except PreconditionFailed:
                return None
            except NotFound:
                if generation == 0:
                    raise
                return None  # the object to replace is gone
        return str(blob.generation)

    def create(self, key: str, data: bytes) -> str | None:
        return self._write(key, data, 0)

    def replace(self, key: str, data: bytes, token: str) -> str | None:
        return self._write(key, data, int(token))

    @retried
    def delete(self, key: str, token: str | None = None) -> None:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self.bucket.blob(self.prefix + key)
        generation = None if token is None else int(token)
        with self._errors("delete", key), contextlib.suppress(NotFound, PreconditionFailed):
            blob.delete(if_generation_match=generation, **self.once)

    @retried
    def upload(self, key: str, path: str) -> None:
        with self._errors("upload", key), open(path, "rb") as f:
            self.bucket.blob(self.prefix + key).upload_from_file(
                _Moving(f, progress()), size=os.path.getsize(path), **self.once
            )

    @retried
    def read_range_into(self, key: str, start: int, stop: int, out: RangeSink) -> None:
        from google.api_core.exceptions import NotFound, RequestRangeNotSatisfiable

        if stop <= start:
            return
        with self._errors("ranged read", key, missing_is_bucket=False):
            out.seek(0)
            try:
                self.bucket.blob(self.prefix + key).download_to_file(
                    _Moving(out, progress()), start=start, end=stop - 1, **self.once
                )
            except RequestRangeNotSatisfiable:
                return
            except NotFound:
                raise self.gone(key) from None

    @retried
    def keys(self, prefix: str) -> list[tuple[str, float]]:
        with self._errors("list", prefix):
            return [
                (blob.name[len(self.prefix) :], blob.updated.timestamp())
                for blob in self.client.list_blobs(
                    self.bucket_name, prefix=self.prefix + prefix, **self.once
                )
            ]

    @retried
    def folders(self, prefix: str) -> list[str]:
        start = len(self.prefix + prefix)
        with self._errors("list", prefix):
            listing = self.client.list_blobs(
                self.bucket_name, prefix=self.prefix + prefix, delimiter="/", **self.once
            )
            for _ in listing.pages:
                pass
            return sorted(p[start:].rstrip("/") for p in listing.prefixes)

    @retried
    def check(self) -> None:
        with self._errors("the bucket"):
            self.client.get_bucket(self.bucket_name, **self.once)


class _Moving:
    """A file the client reads an upload from or writes a download into, telling ``moved``
    the bytes of each read or write (storage/waiting.py); the rest is the file's own."""

    def __init__(self, file: Any, moved: Callable[[int], None]) -> None:
        self._file = file
        self._moved = moved

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._file.read(size)
        self._moved(len(data))
        return data

    def write(self, data: bytes) -> int:
        written: int = self._file.write(data)
        self._moved(len(data))
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


class GCSStorage(RemoteStorage):
    """Versions in ``gs://bucket/prefix``, pulled into ``local_cache`` to be read.

    Credentials come from google-auth's standard chain (and ``STORAGE_EMULATOR_HOST`` for an
    emulator); ``client=`` injects a ready ``google.cloud.storage.Client``. ``retry_timeout``
    (seconds) is how long each call keeps trying while the store is unreachable or failing
    transiently, before it fails with a StorageError (``timeout=`` is its old name).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        local_cache: str | os.PathLike[str] | None = None,
        client: Any = None,
        local_cache_limit: int | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        max_transfers: int = DEFAULT_TRANSFERS,
        retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
        timeout: float | None = None,
    ) -> None:
        if timeout is not None:
            warnings.warn(
                "GCSStorage(timeout=) is now retry_timeout=", DeprecationWarning, stacklevel=2
            )
            retry_timeout = timeout
        settings = RemoteSettings(
            local_cache, local_cache_limit, lease_ttl, max_transfers, retry_timeout
        )
        super().__init__(bucket, prefix, functools.partial(_connect, client), settings)


def _connect(client: Any, bucket: str, prefix: str, retries: Retries) -> _GCSObjects:
    """The store of gs://bucket/prefix through ``client``, or (None) a client made from
    google-auth's standard chain, which other processes make again."""
    if client is not None:
        return _GCSObjects.made(client, None, bucket, prefix, retries)
    try:
        from google.cloud import storage
    except ModuleNotFoundError as exc:
        raise missing_extra(exc, "GCSStorage") from None
    try:
        made = storage.Client()
    except Exception as exc:
        raise StorageError(
            f"gs://{bucket}/{prefix}: cannot make a Google Cloud Storage client ({exc}): "
            "set GOOGLE_APPLICATION_CREDENTIALS or pass client="
        ) from exc
    return _GCSObjects.made(made, storage.Client, bucket, prefix, retries)
