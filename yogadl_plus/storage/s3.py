"""S3Storage: versions in an S3 bucket (AWS, or any S3-compatible store via ``endpoint_url``)."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
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

__all__ = ["S3Storage"]

_PART_BYTES = 16 << 20
_PIECE_BYTES = 1 << 20  # a ranged read's body is read in pieces of this, each one progress
_THREADS_PER_OBJECT = 4  # ranged parts of one object in flight, times max_transfers objects
_MISSING = {"404", "NoSuchKey", "NotFound"}
_PRECONDITION = {"412", "PreconditionFailed"}
_PAST_THE_END = {"416", "InvalidRange"}
_DENIED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden"}
# 409 ConditionalRequestConflict: concurrent conditional writes; AWS says to retry.
_TRANSIENT = {"500", "502", "503", "504", "409", "SlowDown", "Throttling", "RequestTimeout",
              "InternalError", "ServiceUnavailable", "ConditionalRequestConflict"}  # fmt: skip


def _code(exc: Any) -> str:
    error = getattr(exc, "response", {}).get("Error", {})
    return str(error.get("Code") or getattr(exc, "response", {}).get("ResponseMetadata", {})
               .get("HTTPStatusCode", ""))  # fmt: skip


class _S3Objects(ObjectStore):
    def __init__(
        self, client: Any, bucket: str, prefix: str, max_transfers: int, retries: Retries
    ) -> None:
        from boto3.s3.transfer import TransferConfig

        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.retries = retries
        self.url = f"s3://{bucket}/{prefix}".rstrip("/")
        self.endpoint = getattr(getattr(client, "meta", None), "endpoint_url", "?")
        self.transfer = TransferConfig(
            multipart_threshold=_PART_BYTES,
            multipart_chunksize=_PART_BYTES,
            max_concurrency=_THREADS_PER_OBJECT,
            # One try is one pass; trying again (with backoff, within retries.timeout) is ours.
            num_download_attempts=1,
        )

    def _failure(self, exc: Exception, what: str, where: str, **context: Any) -> YogaError:
        from boto3 import exceptions as b3x
        from botocore import exceptions as bx

        if isinstance(exc, bx.FlexibleChecksumError):
            return self.arrived_damaged(where, exc)
        if isinstance(exc, b3x.S3UploadFailedError) and isinstance(exc.__context__, bx.ClientError):
            exc = exc.__context__  # boto3 raised it while handling this error of a part
        if isinstance(exc, bx.ClientError):
            code = _code(exc)
            if code == "NoSuchBucket" or (what == "the bucket" and code in _MISSING):
                return StorageError(
                    f"{where}: bucket {self.bucket!r} does not exist at {self.endpoint}: check "
                    "the bucket name, the region and endpoint_url"
                )
            if code in _DENIED:
                return StorageError(
                    f"{where}: access denied ({code}) to {what}: check the credentials "
                    "(AWS_PROFILE, AWS_ACCESS_KEY_ID, or client=) and the bucket's policy"
                )
            if code in _TRANSIENT:  # the server's own trouble: say which server
                return TransientStorageError(f"{where}: {what} failed at {self.endpoint}: {exc}")
            return StorageError(f"{where}: {what} failed: {exc}")
        if isinstance(exc, bx.NoCredentialsError):
            return StorageError(
                f"{where}: no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or pass client="
            )
        if isinstance(exc, bx.SSLError):  # a certificate will not mend itself
            return StorageError(f"{where}: TLS with {self.endpoint} failed: {exc}")
        if isinstance(exc, bx.EndpointConnectionError):  # refused, unresolved, connect timeout
            return TransientStorageError(
                f"{where}: cannot reach {self.endpoint} ({type(exc).__name__}): check "
                "endpoint_url, the network and any proxy"
            )
        # Dropped connections, read timeouts, transfers boto3 gave up on (it wraps their causes).
        cut_off = (
            bx.ConnectionError,
            bx.HTTPClientError,
            bx.IncompleteReadError,
            b3x.S3UploadFailedError,
            b3x.RetriesExceededError,
        )
        return self._cut_off_or_failed(exc, what, where, cut_off)

    def _missing_or_lost(self, call: Any, lost: set[str]) -> Any:
        from botocore.exceptions import ClientError

        try:
            return call()
        except ClientError as exc:
            if _code(exc) in lost:
                return None
            raise

    @again_if_damaged
    @retried
    def read(self, key: str) -> tuple[bytes, str] | None:
        with self._errors("read", key):
            got = self._missing_or_lost(
                lambda: self.client.get_object(Bucket=self.bucket, Key=self.prefix + key),
                _MISSING,
            )
            if got is None:
                return None
            return got["Body"].read(), got["ETag"]

    @retried
    def token(self, key: str) -> str | None:
        with self._errors("head", key):
            got = self._missing_or_lost(
                lambda: self.client.head_object(Bucket=self.bucket, Key=self.prefix + key),
                _MISSING,
            )
            return None if got is None else str(got["ETag"])

    @retried
    def create(self, key: str, data: bytes) -> str | None:
        with self._errors("conditional create", key):
            got = self._missing_or_lost(
                lambda: self.client.put_object(
                    Bucket=self.bucket, Key=self.prefix + key, Body=data, IfNoneMatch="*"
                ),
                _PRECONDITION,
            )
            return None if got is None else str(got["ETag"])

    @retried
    def replace(self, key: str, data: bytes, token: str) -> str | None:
        with self._errors("conditional replace", key):
            got = self._missing_or_lost(
                lambda: self.client.put_object(
                    Bucket=self.bucket, Key=self.prefix + key, Body=data, IfMatch=token
                ),
                _PRECONDITION | _MISSING,
            )
            return None if got is None else str(got["ETag"])

    @retried
    def delete(self, key: str, token: str | None = None) -> None:
        extra = {} if token is None else {"IfMatch": token}
        with self._errors("delete", key):
            self._missing_or_lost(
                lambda: self.client.delete_object(
                    Bucket=self.bucket, Key=self.prefix + key, **extra
                ),
                _PRECONDITION | _MISSING,
            )

    @retried
    def upload(self, key: str, path: str) -> None:
        with self._errors("upload", key):
            self.client.upload_file(
                path, self.bucket, self.prefix + key, Config=self.transfer, Callback=progress()
            )

    @retried
    def read_range_into(self, key: str, start: int, stop: int, out: RangeSink) -> None:
        from botocore.exceptions import ClientError

        if stop <= start:
            return
        with self._errors("ranged read", key):
            try:
                got = self.client.get_object(
                    Bucket=self.bucket, Key=self.prefix + key, Range=f"bytes={start}-{stop - 1}"
                )
            except ClientError as exc:
                if _code(exc) in _PAST_THE_END:
                    return
                if _code(exc) not in _MISSING:
                    raise
                raise self.gone(key) from exc
            # A body cut off midway raises here, inside _errors: tried again.
            moved = progress()
            out.seek(0)
            for piece in got["Body"].iter_chunks(_PIECE_BYTES):
                out.write(piece)
                moved(len(piece))

    def _pages(self, prefix: str, **options: Any) -> Iterator[dict[str, Any]]:
        return self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + prefix, **options
        )

    @retried
    def keys(self, prefix: str) -> list[tuple[str, float]]:
        with self._errors("list", prefix):
            return [
                (item["Key"][len(self.prefix) :], item["LastModified"].timestamp())
                for page in self._pages(prefix)
                for item in page.get("Contents", [])
            ]

    @retried
    def folders(self, prefix: str) -> list[str]:
        with self._errors("list", prefix):
            start = len(self.prefix + prefix)
            return [
                p["Prefix"][start:].rstrip("/")
                for page in self._pages(prefix, Delimiter="/")
                for p in page.get("CommonPrefixes", [])
            ]

    @retried
    def check(self) -> None:
        with self._errors("the bucket"):
            self.client.head_bucket(Bucket=self.bucket)


class S3Storage(RemoteStorage):
    """Versions in ``s3://bucket/prefix``, pulled into ``local_cache`` to be read.

    Credentials come from boto3's standard chain; ``endpoint_url`` points at an S3-compatible
    store (MinIO, SeaweedFS, Ceph); ``client=`` injects a ready boto3 client; other keywords go
    to ``boto3.client("s3", ...)`` (a ``config=`` there is merged over ours). ``retry_timeout``
    (seconds) is how long each call keeps trying while the store is unreachable or failing
    transiently, before it fails with a StorageError.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        local_cache: str | os.PathLike[str] | None = None,
        endpoint_url: str | None = None,
        client: Any = None,
        local_cache_limit: int | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        max_transfers: int = DEFAULT_TRANSFERS,
        retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
        **client_kwargs: Any,
    ) -> None:
        settings = RemoteSettings(
            local_cache, local_cache_limit, lease_ttl, max_transfers, retry_timeout
        )
        connect = functools.partial(
            _connect, client, endpoint_url, client_kwargs, settings.max_transfers
        )
        super().__init__(bucket, prefix, connect, settings)


def _connect(
    client: Any,
    endpoint_url: str | None,
    client_kwargs: dict[str, Any],
    max_transfers: int,
    bucket: str,
    prefix: str,
    retries: Retries,
) -> _S3Objects:
    """The store of s3://bucket/prefix through ``client``, or (None) a boto3 client made from
    ``endpoint_url`` and ``client_kwargs``, which other processes make again."""
    if client is not None:
        if endpoint_url is not None or client_kwargs:
            raise ValueError("pass either client= or endpoint_url=/client keywords, not both")
        return _S3Objects.made(client, None, bucket, prefix, max_transfers, retries)
    try:
        import boto3
        from botocore.config import Config
    except ModuleNotFoundError as exc:
        raise missing_extra(exc, "S3Storage") from None
    connect_timeout, read_timeout = retries.request_timeouts()
    config = Config(
        # One try is one request: trying again, with backoff, for retry_timeout seconds
        # is ours, so that the whole of a call is bounded by that budget.
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=_THREADS_PER_OBJECT * max_transfers + 8,
    )
    theirs = client_kwargs.get("config")
    client_kwargs["config"] = (
        config.merge(theirs) if isinstance(theirs, Config) else (theirs or config)
    )
    make_client = functools.partial(boto3.client, "s3", endpoint_url=endpoint_url, **client_kwargs)
    return _S3Objects.made(make_client(), make_client, bucket, prefix, max_transfers, retries)
