"""The server fixtures of tests/servers.py, and probes of the semantics the storage code relies on.

Each probe asserts real S3 / GCS behaviour; where the local server deviates, the test is a
strict xfail that names the deviation, so an upgrade that fixes it turns the suite red.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path

import pytest
from helpers.servers import GCSServer, S3Server

pytestmark = pytest.mark.servers

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~20 MiB of random bytes (not a multiple of the 8 MiB part size)."""
    path = tmp_path_factory.mktemp("big") / "big.bin"
    path.write_bytes(os.urandom(20 * MiB + 12345))
    return path


def _status(exc: BaseException) -> tuple[int, str]:
    resp = exc.response  # type: ignore[attr-defined]
    return resp["ResponseMetadata"]["HTTPStatusCode"], resp["Error"]["Code"]


# =========================================================================== S3 (SeaweedFS)

try:
    from botocore.exceptions import ClientError
except ImportError:  # the s3_server fixture skips these tests
    ClientError = Exception  # type: ignore[assignment,misc]


def test_s3_fixture_round_trip(s3_server: S3Server, s3_bucket: str) -> None:
    assert s3_server.endpoint_url.startswith("http://127.0.0.1:")
    assert s3_server.pid > 0
    s3 = s3_server.client()
    s3.put_object(Bucket=s3_bucket, Key="a/b.txt", Body=b"hello")
    assert s3.get_object(Bucket=s3_bucket, Key="a/b.txt")["Body"].read() == b"hello"
    listed = s3.list_objects_v2(Bucket=s3_bucket, Prefix="a/")
    assert [o["Key"] for o in listed["Contents"]] == ["a/b.txt"]
    assert s3_bucket in {b["Name"] for b in s3.list_buckets()["Buckets"]}


def test_s3_env_points_default_boto3_client(
    s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3")  # endpoint, keys and region all from the environment
    s3.put_object(Bucket=s3_bucket, Key="k", Body=b"env")
    assert s3.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"env"


def test_s3_put_if_none_match_is_create_only(s3_server: S3Server, s3_bucket: str) -> None:
    s3 = s3_server.client()
    s3.put_object(Bucket=s3_bucket, Key="k", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as info:
        s3.put_object(Bucket=s3_bucket, Key="k", Body=b"second", IfNoneMatch="*")
    assert _status(info.value) == (412, "PreconditionFailed")
    assert s3.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"first"


def test_s3_put_if_match_is_compare_and_swap(s3_server: S3Server, s3_bucket: str) -> None:
    s3 = s3_server.client()
    etag = s3.put_object(Bucket=s3_bucket, Key="k", Body=b"v1")["ETag"]
    with pytest.raises(ClientError) as info:
        s3.put_object(Bucket=s3_bucket, Key="k", Body=b"x", IfMatch='"0123456789abcdef"')
    assert _status(info.value) == (412, "PreconditionFailed")
    new = s3.put_object(Bucket=s3_bucket, Key="k", Body=b"v2", IfMatch=etag)["ETag"]
    assert new != etag
    assert s3.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"v2"
    with pytest.raises(ClientError) as info:  # the old etag is stale now
        s3.put_object(Bucket=s3_bucket, Key="k", Body=b"v3", IfMatch=etag)
    assert _status(info.value) == (412, "PreconditionFailed")


def test_s3_put_if_match_on_missing_key_fails(s3_server: S3Server, s3_bucket: str) -> None:
    # AWS documents 404 NoSuchKey here; SeaweedFS 4.48 answers 412 PreconditionFailed.
    s3 = s3_server.client()
    with pytest.raises(ClientError) as info:
        s3.put_object(Bucket=s3_bucket, Key="missing", Body=b"x", IfMatch='"0123456789abcdef"')
    assert _status(info.value)[0] in (404, 412)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=s3_bucket, Key="missing")


def test_s3_delete_if_match(s3_server: S3Server, s3_bucket: str) -> None:
    s3 = s3_server.client()
    etag = s3.put_object(Bucket=s3_bucket, Key="k", Body=b"v1")["ETag"]
    with pytest.raises(ClientError) as info:
        s3.delete_object(Bucket=s3_bucket, Key="k", IfMatch='"0123456789abcdef"')
    assert _status(info.value) == (412, "PreconditionFailed")
    assert s3.head_object(Bucket=s3_bucket, Key="k")["ETag"] == etag
    s3.delete_object(Bucket=s3_bucket, Key="k", IfMatch=etag)
    with pytest.raises(ClientError) as info:
        s3.head_object(Bucket=s3_bucket, Key="k")
    assert _status(info.value)[0] == 404


def test_s3_conditional_puts_have_exactly_one_winner(s3_server: S3Server, s3_bucket: str) -> None:
    # SeaweedFS serialises contended conditional writes on one key with a lock that the
    # losers retry about once a second, so each extra writer adds ~1 s: keep n small.
    s3 = s3_server.client()
    n = 4
    barrier = threading.Barrier(n)

    def attempt(i: int, key: str, **cond: str) -> bool:
        barrier.wait()
        try:
            s3.put_object(Bucket=s3_bucket, Key=key, Body=str(i).encode() * 4096, **cond)
        except ClientError as exc:  # AWS may also answer 409 ConditionalRequestConflict
            assert _status(exc)[0] in (409, 412), exc
            return False
        return True

    with ThreadPoolExecutor(n) as pool:
        created = list(pool.map(lambda i: attempt(i, "create", IfNoneMatch="*"), range(n)))
    assert sum(created) == 1
    winner = created.index(True)
    assert s3.get_object(Bucket=s3_bucket, Key="create")["Body"].read() == (
        str(winner).encode() * 4096
    )

    etag = s3.put_object(Bucket=s3_bucket, Key="cas", Body=b"0")["ETag"]
    with ThreadPoolExecutor(n) as pool:
        swapped = list(pool.map(lambda i: attempt(i, "cas", IfMatch=etag), range(n)))
    assert sum(swapped) == 1


def test_s3_complete_multipart_if_none_match(s3_server: S3Server, s3_bucket: str) -> None:
    s3 = s3_server.client()
    s3.put_object(Bucket=s3_bucket, Key="k", Body=b"existing")
    upload = s3.create_multipart_upload(Bucket=s3_bucket, Key="k")
    part = s3.upload_part(
        Bucket=s3_bucket, Key="k", UploadId=upload["UploadId"], PartNumber=1, Body=b"new"
    )
    with pytest.raises(ClientError) as info:
        s3.complete_multipart_upload(
            Bucket=s3_bucket,
            Key="k",
            UploadId=upload["UploadId"],
            MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
            IfNoneMatch="*",
        )
    assert _status(info.value) == (412, "PreconditionFailed")
    s3.abort_multipart_upload(Bucket=s3_bucket, Key="k", UploadId=upload["UploadId"])
    assert s3.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"existing"


def test_s3_head_has_last_modified_and_date(s3_server: S3Server, s3_bucket: str) -> None:
    s3 = s3_server.client()
    s3.put_object(Bucket=s3_bucket, Key="k", Body=b"x")
    head = s3.head_object(Bucket=s3_bucket, Key="k")
    now = datetime.now(timezone.utc)
    assert isinstance(head["LastModified"], datetime)
    assert abs(head["LastModified"] - now) < timedelta(minutes=5)
    assert head["ContentLength"] == 1
    date = parsedate_to_datetime(head["ResponseMetadata"]["HTTPHeaders"]["date"])
    assert abs(date - now) < timedelta(minutes=5)


def test_s3_multipart_upload_and_ranged_parallel_download(
    s3_server: S3Server, s3_bucket: str, big_file: Path, tmp_path: Path
) -> None:
    from boto3.s3.transfer import TransferConfig

    s3 = s3_server.client()
    config = TransferConfig(
        multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB, max_concurrency=4
    )
    s3.upload_file(str(big_file), s3_bucket, "big", Config=config)
    head = s3.head_object(Bucket=s3_bucket, Key="big")
    assert head["ContentLength"] == big_file.stat().st_size
    assert head["ETag"].endswith('-3"')  # 3 parts: 8 + 8 + ~4 MiB
    out = tmp_path / "out.bin"
    s3.download_file(s3_bucket, "big", str(out), Config=config)
    assert out.read_bytes() == big_file.read_bytes()
    got = s3.get_object(Bucket=s3_bucket, Key="big", Range="bytes=8388600-8388615")
    assert got["Body"].read() == big_file.read_bytes()[8388600:8388616]


# =========================================================================== GCS (fake-gcs-server)

try:
    from google.api_core import exceptions as gexc
except ImportError:  # the gcs_server fixture skips these tests
    gexc = None  # type: ignore[assignment]


def test_gcs_fixture_round_trip(gcs_server: GCSServer, gcs_bucket: str) -> None:
    assert gcs_server.endpoint.startswith("http://127.0.0.1:")
    assert gcs_server.pid > 0
    bucket = gcs_server.client().bucket(gcs_bucket)
    bucket.blob("a/b.txt").upload_from_string(b"hello")
    assert bucket.blob("a/b.txt").download_as_bytes() == b"hello"


def test_gcs_storage_emulator_host_env_works(
    gcs_server: GCSServer, gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    for key, value in gcs_server.env().items():
        monkeypatch.setenv(key, value)
    client = storage.Client(project=gcs_server.project, credentials=AnonymousCredentials())
    client.bucket(gcs_bucket).blob("k").upload_from_string(b"env")
    assert gcs_server.client().bucket(gcs_bucket).blob("k").download_as_bytes() == b"env"


def test_gcs_generation_zero_is_create_only(gcs_server: GCSServer, gcs_bucket: str) -> None:
    bucket = gcs_server.client().bucket(gcs_bucket)
    bucket.blob("k").upload_from_string(b"first", if_generation_match=0)
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob("k").upload_from_string(b"second", if_generation_match=0)
    assert bucket.blob("k").download_as_bytes() == b"first"


def test_gcs_generation_match_overwrite(gcs_server: GCSServer, gcs_bucket: str) -> None:
    bucket = gcs_server.client().bucket(gcs_bucket)
    blob = bucket.blob("k")
    blob.upload_from_string(b"v1")
    gen1 = blob.generation
    assert isinstance(gen1, int) and gen1 > 0
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob("k").upload_from_string(b"x", if_generation_match=gen1 + 1)
    with pytest.raises(gexc.PreconditionFailed):  # generation given, object missing
        bucket.blob("missing").upload_from_string(b"x", if_generation_match=gen1)
    blob2 = bucket.blob("k")
    blob2.upload_from_string(b"v2", if_generation_match=gen1)
    assert blob2.generation != gen1
    assert bucket.blob("k").download_as_bytes() == b"v2"
    with pytest.raises(gexc.PreconditionFailed):  # gen1 is stale now
        bucket.blob("k").upload_from_string(b"v3", if_generation_match=gen1)


def test_gcs_metadata_generation_md5_crc32c(gcs_server: GCSServer, gcs_bucket: str) -> None:
    import google_crc32c

    data = b"some bytes" * 1000
    bucket = gcs_server.client().bucket(gcs_bucket)
    blob = bucket.blob("k")
    blob.upload_from_string(data)
    got = bucket.get_blob("k")
    assert got is not None
    assert got.generation == blob.generation
    assert got.size == len(data)
    assert base64.b64decode(got.md5_hash) == hashlib.md5(data).digest()
    assert base64.b64decode(got.crc32c) == google_crc32c.Checksum(data).digest()
    assert got.updated is not None


def test_gcs_delete_with_current_generation(gcs_server: GCSServer, gcs_bucket: str) -> None:
    bucket = gcs_server.client().bucket(gcs_bucket)
    blob = bucket.blob("k")
    blob.upload_from_string(b"x")
    bucket.blob("k").delete(if_generation_match=blob.generation)
    assert bucket.get_blob("k") is None


@pytest.mark.xfail(
    strict=True,
    reason="fake-gcs-server 1.54 ignores ifGenerationMatch on DELETE (real GCS answers 412)",
)
def test_gcs_delete_with_stale_generation_fails(gcs_server: GCSServer, gcs_bucket: str) -> None:
    bucket = gcs_server.client().bucket(gcs_bucket)
    blob = bucket.blob("k")
    blob.upload_from_string(b"x")
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob("k").delete(if_generation_match=blob.generation + 1)


@pytest.mark.xfail(
    strict=True,
    reason="fake-gcs-server 1.54 ignores ifGenerationMatch on resumable uploads (real GCS "
    "answers 412); google-cloud-storage uses them for every upload over 8 MiB "
    "(or of unknown size), whatever chunk_size is",
)
def test_gcs_resumable_upload_generation_zero_is_create_only(
    gcs_server: GCSServer, gcs_bucket: str
) -> None:
    bucket = gcs_server.client().bucket(gcs_bucket)
    bucket.blob("k").upload_from_string(b"existing")
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob("k").upload_from_string(b"y" * (9 * MiB), if_generation_match=0)


def test_gcs_large_object_round_trip(
    gcs_server: GCSServer, gcs_bucket: str, big_file: Path, tmp_path: Path
) -> None:
    bucket = gcs_server.client().bucket(gcs_bucket)
    bucket.blob("big").upload_from_filename(str(big_file), if_generation_match=0)
    out = tmp_path / "out.bin"
    bucket.blob("big").download_to_filename(str(out))
    assert out.read_bytes() == big_file.read_bytes()
    part = bucket.blob("big").download_as_bytes(start=8 * MiB, end=8 * MiB + 15)
    assert part == big_file.read_bytes()[8 * MiB : 8 * MiB + 16]


def test_gcs_list_blobs_prefixes(gcs_server: GCSServer, gcs_bucket: str) -> None:
    client = gcs_server.client()
    bucket = client.bucket(gcs_bucket)
    for name in ["d/x/1", "d/x/2", "d/y/1", "d/z", "e/1"]:
        bucket.blob(name).upload_from_string(name.encode())
    it = bucket.list_blobs(prefix="d/", delimiter="/")
    assert [b.name for b in it] == ["d/z"]  # iterate first: prefixes fill in as pages load
    assert it.prefixes == {"d/x/", "d/y/"}
    assert sorted(b.name for b in client.list_blobs(gcs_bucket, prefix="d/x/")) == [
        "d/x/1",
        "d/x/2",
    ]
