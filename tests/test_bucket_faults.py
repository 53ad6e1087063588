"""What a bucket's faults do to a run: they stall it, never fail it or damage it.

A real SeaweedFS on 127.0.0.1 (the session's), reached through ``tests/fault_proxy.py``, which
flips bytes of answers on the way, answers ``503 SlowDown`` or drops connections, and counts
requests. The storages here try each request once in their client (as yogadl_plus's own default
client does), so what rides a fault out is yogadl_plus's own retrying and checking.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.fault_proxy import FaultProxy
from helpers.remote_helpers import records

import yogadl_plus as ydl
from yogadl_plus.dataref import DataRefOnDemand
from yogadl_plus.errors import TransientStorageError
from yogadl_plus.storage.objects import DEFAULT_RETRY_TIMEOUT, Retries

N = 2000
CHUNK_BYTES = 100_000


@pytest.fixture
def bucket(s3_server: Any) -> str:
    return s3_server.make_bucket()


def storage(server: Any, bucket: str, cache: Path, endpoint: str | None = None, **options: Any):
    from botocore.config import Config

    return ydl.S3Storage(
        bucket,
        "team",
        local_cache=cache,
        endpoint_url=endpoint or server.endpoint_url,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name=server.region,
        config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
        **options,
    )


@pytest.fixture
def built(s3_server: Any, bucket: str, tmp_path: Path) -> ydl.DataRef:
    ref = ydl.cache_dataset(
        records(N), "d", "v", storage(s3_server, bucket, tmp_path / "builder"),
        chunk_bytes=CHUNK_BYTES, progress=False,
    )  # fmt: skip
    assert len(ref.manifest.chunks) >= 6
    return ref


def same_records(ref: ydl.DataRef) -> None:
    expected = np.stack([r["x"] for r in records(N)])
    got = ref.get_batch(np.arange(N), ["x", "label"])
    np.testing.assert_array_equal(got["label"], np.arange(N))
    np.testing.assert_array_equal(got["x"], expected)


def messages(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records]


# --- damage on the way, and in the bucket ---------------------------------------------------


@pytest.mark.servers
@pytest.mark.parametrize("on_demand", [False, True], ids=["pull", "on-demand"])
def test_a_byte_flipped_on_the_way_is_fetched_again(
    s3_server: Any, bucket: str, built: ydl.DataRef, tmp_path: Path, caplog: Any, on_demand: bool
) -> None:
    chunk = built.manifest.chunks[1].file
    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.add("GET", chunk, "flip")
        reader = storage(s3_server, bucket, tmp_path / "reader", proxy.url)
        with caplog.at_level(logging.WARNING, logger="yogadl_plus"):
            ref = reader.fetch("d", "v", on_demand=on_demand)
            same_records(ref)
        assert proxy.applied["flip"] == 1
        assert proxy.count("GET", chunk) >= 2
    said = messages(caplog)
    assert any(chunk in m and "fetching it again (download 1 of 3)" in m for m in said), said
    assert any("arrived whole on download 2: it had been damaged on the way" in m for m in said)


@pytest.mark.servers
def test_bytes_damaged_on_the_way_every_time_are_told_from_a_damaged_object(
    s3_server: Any, bucket: str, built: ydl.DataRef, tmp_path: Path
) -> None:
    chunk = built.manifest.chunks[2].file
    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.add("GET", chunk, "flip", times=3)  # a byte further on each time
        reader = storage(s3_server, bucket, tmp_path / "reader", proxy.url)
        with pytest.raises(ydl.CacheCorrupted) as caught:
            reader.fetch("d", "v")
    text = str(caught.value)
    assert f"{chunk} arrived damaged 3 times, other bytes each time" in text
    assert "damaged on the way" in text and "the object in the bucket may be whole" in text
    assert "rebuild" not in text  # rebuilding would not help: the bucket is fine


@pytest.mark.servers
def test_an_object_damaged_in_the_bucket_is_blamed_after_the_same_bytes_three_times(
    s3_server: Any, bucket: str, built: ydl.DataRef, tmp_path: Path
) -> None:
    victim = built.manifest.chunks[3]
    data = bytearray(Path(built.directory, victim.file).read_bytes())
    data[len(data) // 3] ^= 0x01
    s3_server.client().put_object(Bucket=bucket, Key=f"team/d/v/{victim.file}", Body=bytes(data))
    with FaultProxy(s3_server.endpoint_url) as proxy:
        reader = storage(s3_server, bucket, tmp_path / "reader", proxy.url)
        with pytest.raises(ydl.CacheCorrupted) as caught:
            reader.fetch("d", "v")
        assert proxy.count("GET", victim.file) == 3
    text = str(caught.value)
    assert victim.file in text and "sha256" in text
    assert "3 downloads gave these same bytes: the object in the bucket is damaged" in text
    assert "rebuild the version (overwrite=True)" in text


# --- throttling and cut connections -----------------------------------------------------------


@pytest.mark.servers
def test_slow_down_is_backed_off_and_the_read_goes_on(
    s3_server: Any, bucket: str, built: ydl.DataRef, tmp_path: Path, caplog: Any
) -> None:
    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.add("GET", "manifest.json", "503", times=2)
        proxy.add("GET", ".mdb", "503", times=6)
        proxy.add("GET", ".mdb", "drop", times=2)
        reader = storage(s3_server, bucket, tmp_path / "reader", proxy.url)
        with caplog.at_level(logging.WARNING, logger="yogadl_plus"):
            same_records(reader.fetch("d", "v"))
        assert proxy.applied == {"503": 8, "drop": 2}
    assert any("SlowDown" in m and "retrying" in m for m in messages(caplog)), messages(caplog)


def test_backoff_is_jittered_and_warns_every_30_s(monkeypatch: pytest.MonkeyPatch, caplog: Any):
    # A fake clock: each sleep moves it on. The call fails for 100 s, then succeeds.
    now = [0.0]
    slept: list[float] = []
    monkeypatch.setattr("yogadl_plus.storage.objects.time.monotonic", lambda: now[0])

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    monkeypatch.setattr("yogadl_plus.storage.objects.time.sleep", sleep)

    def attempt() -> str:
        if now[0] < 100:
            raise TransientStorageError("s3://b/k: SlowDown")
        return "done"

    random.seed(1)
    with caplog.at_level(logging.INFO, logger="yogadl_plus"):
        assert Retries().call(attempt) == "done"
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    # At the first retry, then about every 30 s: 0, 30, 60, 90 s.
    assert 4 <= len(warned) <= 5, [r.getMessage() for r in warned]
    assert all("giving up after 600 s" in r.getMessage() for r in warned)
    capped = slept[6:]  # (0.2 s doubling reaches the 5 s cap by the 6th wait)
    assert len(set(capped)) == len(capped) > 5  # jittered: no two waits alike
    assert all(2.5 <= s <= 5.0 for s in capped)  # half to all of max_delay
    assert any("succeeded after" in r.getMessage() for r in caplog.records)


def test_reads_wait_five_minutes_by_default() -> None:
    assert DEFAULT_RETRY_TIMEOUT >= 300 and Retries().timeout >= 300
    s3 = ydl.S3Storage("b", "p", local_cache="/tmp/unused-ydl", endpoint_url="http://127.0.0.1:9")
    assert s3.objects.retries.timeout >= 300


def test_calls_to_one_store_failing_together_warn_once_every_30_s(
    monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    # Eight fetches through an outage, each retrying: one WARNING every 30 s for the store,
    # naming how many retries it spoke for, not one per fetch. (A fake clock: each try takes
    # 1 s, and each call fails 3 times.)
    now = [1000.0]
    monkeypatch.setattr("yogadl_plus.storage.objects.time.monotonic", lambda: now[0])
    monkeypatch.setattr("yogadl_plus.storage.objects.time.sleep", lambda s: None)
    tries = {k: 0 for k in range(8)}

    def attempt(k: int) -> str:
        tries[k] += 1
        now[0] += 1.0
        if tries[k] <= 3:
            raise TransientStorageError(f"s3://bucket/p/chunk-{k}: cannot reach the server")
        return "ok"

    with caplog.at_level(logging.WARNING, logger="yogadl_plus"):
        for k in range(8):  # 32 s in all
            Retries(timeout=100).call(lambda k=k: attempt(k), store="s3://bucket/p")
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned  # at 0 and 30 s; each call alone would have said it 8 times
    assert "chunk-0" in warned[0] and "other retries since the last warning" in warned[1]
    # Another store speaks for itself.
    caplog.clear()
    tries[0] = 0
    with caplog.at_level(logging.WARNING, logger="yogadl_plus"):
        Retries(timeout=100).call(lambda: attempt(0), store="s3://another/p")
    assert len(caplog.records) == 1


@pytest.mark.servers
def test_gcs_a_byte_flipped_on_the_way_is_fetched_again(
    gcs_server: Any, tmp_path: Path, caplog: Any
) -> None:
    # A chunk comes in ranged reads, which google-cloud-storage does not check against the
    # object's hash: the sha256 taken on the way finds the damage, and the chunk is fetched
    # again, not retried for retry_timeout.
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    bucket = gcs_server.make_bucket()
    builder = ydl.GCSStorage(bucket, "team", local_cache=tmp_path / "b", client=gcs_server.client())
    built = ydl.cache_dataset(
        records(N), "d", "v", builder, chunk_bytes=CHUNK_BYTES, progress=False
    )
    chunk = built.manifest.chunks[1].file
    with FaultProxy(gcs_server.endpoint) as proxy:
        proxy.add("GET", chunk.replace("/", "%2F"), "flip")
        client = gcs.Client(
            project=gcs_server.project,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": proxy.url},
        )
        reader = ydl.GCSStorage(bucket, "team", local_cache=tmp_path / "r", client=client)
        with caplog.at_level(logging.WARNING, logger="yogadl_plus"):
            same_records(reader.fetch("d", "v"))
        assert proxy.applied["flip"] == 1
    said = messages(caplog)
    assert any(chunk in m and "fetching it again (download 1 of 3)" in m for m in said), said
    assert any("arrived whole on download 2: it had been damaged on the way" in m for m in said)


@pytest.mark.servers
def test_a_manifest_damaged_on_the_way_is_read_again(
    s3_server: Any, bucket: str, built: ydl.DataRef, tmp_path: Path, caplog: Any
) -> None:
    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.add("GET", "manifest.json", "flip")
        reader = storage(s3_server, bucket, tmp_path / "reader", proxy.url)
        with caplog.at_level(logging.WARNING, logger="yogadl_plus"):
            same_records(reader.fetch("d", "v"))
        assert proxy.applied["flip"] == 1
    assert any("manifest.json" in m and "reading it again" in m for m in messages(caplog))


# --- a server that does not answer ---------------------------------------------------------------


@pytest.fixture
def said_soon(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call still waiting is said after 0.2 s, then every 0.5 s (5 s and 30 s in earnest)."""
    try:
        from yogadl_plus.storage import waiting
    except ImportError:  # (the code before it said nothing while a call waited)
        return
    monkeypatch.setattr(waiting, "SLOW_CALL_S", 0.2)
    monkeypatch.setattr(waiting, "SLOW_CALL_EVERY_S", 0.5)


def said_while(thread: threading.Thread, caplog: Any, text: str) -> list[str]:
    """The WARNINGs naming ``text``, the first of which comes while ``thread`` still waits."""
    for _ in range(1000):
        found = [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and text in r.getMessage()
        ]
        assert thread.is_alive(), f"nothing said of {text} while it waited: {messages(caplog)}"
        if found:
            return found
        time.sleep(0.01)
    raise AssertionError(f"nothing said of {text} in 10 s: {messages(caplog)}")


def in_thread(work: Any) -> tuple[threading.Thread, dict[str, Any]]:
    done: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: done.setdefault("result", work()), daemon=True)
    thread.start()
    return thread, done


@pytest.mark.servers
def test_a_pull_waiting_on_a_hung_server_says_so_naming_the_chunk(
    s3_server: Any, bucket: str, built: ydl.DataRef, tmp_path: Path, caplog: Any, said_soon: None
) -> None:
    # Before, nothing was said until the request's read timeout (60 s) ran out.
    chunk = built.manifest.chunks[2].file
    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.add("GET", chunk, "hang")
        reader = storage(s3_server, bucket, tmp_path / "reader", proxy.url)
        with caplog.at_level(logging.INFO, logger="yogadl_plus"):
            pull, done = in_thread(lambda: reader.fetch("d", "v"))
            said = said_while(pull, caplog, chunk)
            proxy.release()  # the hung request's connection closes: tried again, answered
            pull.join(60)
    same_records(done["result"])
    assert f"ranged read of {reader.url}/d/v/{chunk}: nothing from the server for" in said[0]
    assert any(chunk in m and "went on after" in m for m in messages(caplog))


@pytest.mark.servers
def test_a_pull_given_up_on_a_hung_server_names_the_chunk(
    s3_server: Any, bucket: str, built: ydl.DataRef, tmp_path: Path
) -> None:
    # The server hangs once the pull has read the manifest. Before, the error named
    # manifest.json: the pull read it again (to see whether the version was replaced meanwhile)
    # for another retry_timeout, and that failure replaced the chunk's.
    chunk = built.manifest.chunks[2].file
    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.hang_s = 0.3
        proxy.add("GET", "manifest.json", "pass")
        proxy.add("GET", "manifest.json", "hang", times=100)
        proxy.add("GET", chunk, "hang", times=100)
        reader = storage(s3_server, bucket, tmp_path / "reader", proxy.url, retry_timeout=1)
        with pytest.raises(ydl.StorageError) as caught:
            reader.fetch("d", "v")
    text = str(caught.value)
    assert f"{reader.url}/d/v/{chunk}" in text and "retry_timeout=1 s" in text, text
    assert "manifest.json" not in text, text


@pytest.mark.servers
def test_a_stream_reading_on_demand_says_which_chunk_a_hung_server_holds_up(
    s3_server: Any, bucket: str, built: ydl.DataRef, tmp_path: Path, caplog: Any, said_soon: None
) -> None:
    chunk = built.manifest.chunks[3].file
    limit = sum(c.bytes for c in built.manifest.chunks) // 2
    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.add("GET", chunk, "hang")
        reader = storage(s3_server, bucket, tmp_path / "r", proxy.url, local_cache_limit=limit)
        ref = reader.fetch("d", "v")
        assert isinstance(ref, DataRefOnDemand)
        with caplog.at_level(logging.INFO, logger="yogadl_plus"):
            stream, done = in_thread(
                lambda: [i for b in ref.stream(batch_size=100) for i in b["label"].tolist()]
            )
            said = said_while(stream, caplog, chunk)
            proxy.release()
            stream.join(60)
    assert done["result"] == list(range(N))  # the stream waited, and went on
    assert f"ranged read of {reader.url}/d/v/{chunk}: nothing from the server" in said[0], said


def test_a_transfer_moving_bytes_is_not_taken_for_a_hung_server(
    monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    # A large chunk over a slow link takes far longer than SLOW_CALL_S: only silence is said.
    from yogadl_plus.storage import waiting

    monkeypatch.setattr(waiting, "SLOW_CALL_S", 0.5)
    store, what = "s3://b/p", "download of s3://b/p/d/v/b-1/chunk-00000.mdb"
    with caplog.at_level(logging.WARNING, logger="yogadl_plus"):
        with waiting.waiting_on(store, what):
            moved = waiting.progress()
            for _ in range(30):  # 1.5 s, bytes every 0.05 s
                time.sleep(0.05)
                moved(1 << 16)
        assert not messages(caplog)
        with waiting.waiting_on(store, what):
            waiting.progress()(1 << 16)
            for _ in range(500):  # then silence, until it is said
                if messages(caplog):
                    break
                time.sleep(0.01)
    said = messages(caplog)
    assert len(said) == 1 and said[0].startswith(f"{what}: nothing from the server for"), said
