"""GCSStorage: versions in a Google Cloud Storage bucket."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from yogadl_plus.errors import StorageError, YogaError
from yogadl_plus.storage.objects import ObjectStore, TransientStorageError, object_gone
from yogadl_plus.storage.remote import (
    DEFAULT_LEASE_TTL,
    DEFAULT_TRANSFERS,
    RemoteStorage,
    check_location,
)

__all__ = ["GCSStorage"]


class _GCSObjects(ObjectStore):
    def __init__(self, client: Any, bucket: str, prefix: str, timeout: float) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        # How long one call may keep retrying transient failures (an unreachable endpoint too).
        self.retry = DEFAULT_RETRY.with_timeout(timeout)
        self.client = client
        self.bucket_name = bucket
        self.bucket = client.bucket(bucket)
        self.prefix = prefix
        self.url = f"gs://{bucket}/{prefix}".rstrip("/")

    @contextlib.contextmanager
    def _errors(self, what: str, key: str = "", missing_is_bucket: bool = True) -> Iterator[None]:
        """google-cloud failures as StorageError naming the URL and what to check."""
        import requests
        from google import auth
        from google.api_core import exceptions as gx
        from google.auth.exceptions import DefaultCredentialsError
        from google.resumable_media import common as rmx

        gax = auth.exceptions

        where = f"{self.url}/{key}" if key else self.url
        try:
            try:
                yield
            except gx.RetryError as exc:
                if exc.cause is None:
                    raise StorageError(f"{where}: {what} timed out: {exc}") from exc
                raise exc.cause from exc
        except gx.NotFound as exc:
            if not missing_is_bucket:
                raise
            raise StorageError(
                f"{where}: bucket {self.bucket_name!r} does not exist (or the object vanished "
                f"during {what}): check the bucket name and project"
            ) from exc
        except (gx.Forbidden, gx.Unauthorized) as exc:
            raise StorageError(
                f"{where}: access denied to {what}: check the credentials "
                "(GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login, or "
                "client=) and the bucket's IAM roles"
            ) from exc
        except DefaultCredentialsError as exc:
            raise StorageError(
                f"{where}: no Google credentials found: set GOOGLE_APPLICATION_CREDENTIALS, run "
                "`gcloud auth application-default login`, or pass client="
            ) from exc
        except (gx.TooManyRequests, gx.ServerError) as exc:
            raise TransientStorageError(f"{where}: {what} failed: {exc}") from exc
        except requests.exceptions.ConnectionError as exc:
            endpoint = getattr(getattr(self.client, "_connection", None), "API_BASE_URL", "?")
            raise StorageError(
                f"{where}: cannot reach {endpoint}: check the endpoint (client_options, "
                "STORAGE_EMULATOR_HOST), the network and any proxy"
            ) from exc
        except (
            requests.exceptions.RequestException,
            rmx.InvalidResponse,
            rmx.DataCorruption,
            gax.TransportError,
        ) as exc:
            raise TransientStorageError(f"{where}: {what} was cut off: {exc}") from exc
        except gax.RefreshError as exc:
            raise StorageError(
                f"{where}: the Google credentials could not be refreshed ({exc}): check "
                "GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth application-default login`"
            ) from exc
        except YogaError:
            raise
        except Exception as exc:  # anything else from the client, still named by its URL
            raise StorageError(f"{where}: {what} failed: {type(exc).__name__}: {exc}") from exc

    def read(self, key: str) -> tuple[bytes, str] | None:
        from google.api_core.exceptions import NotFound

        blob = self.bucket.blob(self.prefix + key)
        with self._errors("read", key, missing_is_bucket=False):
            try:
                data = blob.download_as_bytes(retry=self.retry)
            except NotFound:
                return None
        return data, str(blob.generation)

    def token(self, key: str) -> str | None:
        with self._errors("head", key, missing_is_bucket=False):
            blob = self.bucket.get_blob(self.prefix + key, retry=self.retry)
        return None if blob is None else str(blob.generation)

    def _write(self, key: str, data: bytes, generation: int) -> str | None:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self.bucket.blob(self.prefix + key)
        with self._errors("conditional write", key):
            try:
                blob.upload_from_string(data, if_generation_match=generation, retry=self.retry)
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

    def delete(self, key: str, token: str | None = None) -> None:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self.bucket.blob(self.prefix + key)
        with self._errors("delete", key), contextlib.suppress(NotFound, PreconditionFailed):
            blob.delete(if_generation_match=None if token is None else int(token), retry=self.retry)

    def upload(self, key: str, path: str) -> None:
        with self._errors("upload", key):
            self.bucket.blob(self.prefix + key).upload_from_filename(path, retry=self.retry)

    def download(self, key: str, path: str) -> None:
        from google.api_core.exceptions import NotFound

        with self._errors("download", key, missing_is_bucket=False):
            try:
                self.bucket.blob(self.prefix + key).download_to_filename(path, retry=self.retry)
            except NotFound:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)  # the client leaves an empty file behind
                raise object_gone(self.url, key) from None

    def keys(self, prefix: str) -> Iterator[tuple[str, float]]:
        with self._errors("list", prefix):
            for blob in self.client.list_blobs(
                self.bucket_name, prefix=self.prefix + prefix, retry=self.retry
            ):
                yield blob.name[len(self.prefix) :], blob.updated.timestamp()

    def folders(self, prefix: str) -> list[str]:
        start = len(self.prefix + prefix)
        with self._errors("list", prefix):
            listing = self.client.list_blobs(
                self.bucket_name, prefix=self.prefix + prefix, delimiter="/", retry=self.retry
            )
            for _ in listing.pages:
                pass
            return sorted(p[start:].rstrip("/") for p in listing.prefixes)

    def check(self) -> None:
        with self._errors("the bucket"):
            self.client.get_bucket(self.bucket_name, retry=self.retry)


class GCSStorage(RemoteStorage):
    """Versions in ``gs://bucket/prefix``, pulled into ``local_cache`` to be read.

    Credentials come from google-auth's standard chain (and ``STORAGE_EMULATOR_HOST`` for an
    emulator); ``client=`` injects a ready ``google.cloud.storage.Client``. ``timeout`` bounds
    how long one call keeps retrying transient failures, an unreachable endpoint included.
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
        timeout: float = 120.0,
    ) -> None:
        bucket, prefix = check_location(bucket, prefix)
        if client is None:
            try:
                from google.cloud import storage
            except ImportError:
                raise ImportError(
                    "GCSStorage needs google-cloud-storage: pip install 'yogadl_plus[gcs]'"
                ) from None
            try:
                client = storage.Client()
            except Exception as exc:
                raise StorageError(
                    f"gs://{bucket}/{prefix}: cannot make a Google Cloud Storage client ({exc}): "
                    "set GOOGLE_APPLICATION_CREDENTIALS or pass client="
                ) from exc
            make_client = storage.Client
        else:
            make_client = None
        self.bucket = bucket
        self.prefix = prefix
        objects = _GCSObjects(client, bucket, prefix, timeout)
        if make_client is not None:
            objects.remake = (make_client, (bucket, prefix, timeout))
        super().__init__(objects, local_cache, local_cache_limit, lease_ttl, max_transfers)
