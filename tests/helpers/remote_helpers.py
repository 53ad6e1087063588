"""Remote storages for tests, described by a plain dict so that child processes can make the
same storage (same bucket and prefix, their own local cache)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pytest

import yogadl_plus as ydl


def spec_for(kind: str, server: Any, bucket: str, prefix: str = "team/caches") -> dict[str, Any]:
    if kind == "s3":
        return {
            "kind": "s3",
            "bucket": bucket,
            "prefix": prefix,
            "endpoint_url": server.endpoint_url,
            "access_key": server.access_key,
            "secret_key": server.secret_key,
            "region": server.region,
        }
    return {"kind": "gcs", "bucket": bucket, "prefix": prefix, "endpoint": server.endpoint}


def client_for(spec: dict[str, Any], **overrides: Any) -> Any:
    if spec["kind"] == "s3":
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=overrides.get("endpoint_url", spec["endpoint_url"]),
            aws_access_key_id=spec["access_key"],
            aws_secret_access_key=overrides.get("secret_key", spec["secret_key"]),
            region_name=spec["region"],
            config=Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 2, "mode": "standard"},
                max_pool_connections=64,
            ),
        )
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="test-project",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": overrides.get("endpoint", spec["endpoint"])},
    )


def make_storage(
    spec: dict[str, Any], local_cache: str | os.PathLike[str], **options: Any
) -> ydl.Storage:
    cls = ydl.S3Storage if spec["kind"] == "s3" else ydl.GCSStorage
    return cls(
        spec["bucket"],
        spec["prefix"],
        local_cache=local_cache,
        client=client_for(spec),
        **options,
    )


def records(n: int, width: int = 64, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, width)).astype(np.float32)
    return [{"x": x[i], "label": np.int64(i)} for i in range(n)]


def count_downloads(storage: Any) -> list[str]:
    """Record every chunk download of ``storage`` (its first ranged read; wraps its
    ObjectStore)."""
    seen: list[str] = []
    original = storage.objects.read_range_into

    def read_range_into(key: str, start: int, stop: int, out: Any) -> None:
        if start == 0:
            seen.append(key)
        original(key, start, stop, out)

    storage.objects.read_range_into = read_range_into
    return seen


# --- pyarrow filesystems on the test servers (what Parquet, ImageFolder and WebDataset read)


def s3_filesystem(server: Any) -> pafs.S3FileSystem:
    host = server.endpoint_url.split("://", 1)[1]
    return pafs.S3FileSystem(
        access_key=server.access_key,
        secret_key=server.secret_key,
        endpoint_override=host,
        scheme="http",
        region=server.region,
    )


def gcs_filesystem(server: Any) -> pafs.GcsFileSystem:
    host = server.endpoint.split("://", 1)[1]
    return pafs.GcsFileSystem(anonymous=True, endpoint_override=host, scheme="http")


def filesystem_of(kind: str, request: pytest.FixtureRequest) -> tuple[Any, str]:
    """(a pyarrow filesystem on a fresh bucket of the real test server, the bucket's name)."""
    server = request.getfixturevalue("s3_server" if kind == "s3" else "gcs_server")
    bucket = server.make_bucket()
    return (s3_filesystem(server) if kind == "s3" else gcs_filesystem(server)), bucket
