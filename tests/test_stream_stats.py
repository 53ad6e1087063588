"""stream.stats(): items, bytes and where the time went, in every way a stream is read."""

from __future__ import annotations

import time

import numpy as np
import pytest

import yogadl_plus as ydl
from yogadl_plus.predicates import in_lambda
from yogadl_plus.stream.stats import TIMED

N = 2000
X = 64  # float32 values a record: 256 bytes, plus its int64 id


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("stats"))
    records = ({"i": np.int64(i), "x": np.full(X, i, np.float32)} for i in range(N))
    return ydl.cache_dataset(records, "d", "v", storage, chunk_bytes=100_000, progress=False)


RECORD_BYTES = X * 4 + 8


def spent(stats):
    return {name: getattr(stats, name) for name in TIMED}


def test_a_fresh_stream_has_counted_nothing(ref):
    stats = ref.stream().stats()
    assert (stats.items, stats.batches, stats.bytes, stats.seconds) == (0, 0, 0, 0.0)
    assert stats.items_per_s == 0.0 and set(spent(stats).values()) == {0.0}


@pytest.mark.parametrize("batch_size", [None, 64])
def test_items_batches_and_bytes_are_those_handed_out(ref, batch_size):
    stream = ref.stream(shuffle=True, shuffle_seed=1, batch_size=batch_size)
    for _ in stream:
        pass
    stats = stream.stats()
    assert stats.items == N and stats.bytes == N * RECORD_BYTES
    assert stats.batches == (0 if batch_size is None else -(-N // 64))
    assert stats.items_per_s == pytest.approx(N / stats.seconds)
    assert stats.reading > 0 and stats.decoding > 0
    assert stats.predicates == stats.transforms == stats.waiting_on_workers == 0.0


def test_counts_are_exact_mid_block_when_the_consumer_stops(ref):
    # A record stream reads blocks of hundreds of records: the count is of those handed out.
    stream = ref.stream(shuffle=True, shuffle_seed=1)
    for n, _ in enumerate(stream, 1):
        if n == 700:
            break
    assert stream.stats().items == 700
    batches = ref.stream(batch_size=30)
    for n, _ in enumerate(batches, 1):
        if n == 7:
            break
    assert (batches.stats().items, batches.stats().batches) == (210, 7)


def test_time_in_the_consumer_and_in_transforms_is_told_apart(ref):
    def slow(record):
        time.sleep(0.001)
        return record["i"]

    stream = ref.stream(fields=["i"], transform=slow, batch_size=100)
    for _ in stream:
        time.sleep(0.01)  # the training step
    stats = stream.stats()
    assert stats.transforms >= N * 0.001  # 2 s
    assert stats.in_consumer >= 20 * 0.01  # 0.2 s
    assert stats.in_consumer < stats.transforms
    assert stats.reading + stats.decoding + stats.transforms <= stats.seconds


def test_predicates_are_timed_and_only_passing_records_counted(ref):
    keep_even = in_lambda(["i"], lambda i: i % 2 == 0)
    stream = ref.stream(predicate=keep_even, batch_size=50)
    assert sum(len(b["i"]) for b in stream) == N // 2
    stats = stream.stats()
    assert stats.items == N // 2 and stats.bytes == N // 2 * RECORD_BYTES
    assert stats.predicates > 0


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_workers_work_is_summed_and_the_wait_for_them_timed(ref, worker_type):
    def slow(record):
        time.sleep(0.0005)
        return record

    stream = ref.stream(transform=slow, batch_size=100, num_workers=2, worker_type=worker_type)
    for _ in stream:
        pass
    stats = stream.stats()
    assert stats.items == N and stats.bytes == N * RECORD_BYTES
    assert stats.transforms >= N * 0.0005  # in the workers, carried back with their blocks
    assert 0 < stats.waiting_on_workers <= stats.seconds
    stream.close()


def test_stats_span_epochs_and_reset_counts_from_now(ref):
    stream = ref.stream(batch_size=500)
    for _ in range(2):
        for _ in stream:
            pass
    assert stream.stats().items == 2 * N
    stream.reset_stats()
    assert stream.stats().items == 0 and stream.stats().reading == 0.0
    for _ in stream:
        pass
    assert stream.stats().items == N


def test_iter_blocks_and_the_tf_face_count_on_the_stream(ref):
    stream = ref.stream()
    assert sum(len(block) for block in stream.iter_blocks()) == N
    assert stream.stats().items == N
    tf = pytest.importorskip("tensorflow")
    stream = ref.stream(batch_size=100)
    assert sum(int(tf.shape(b["i"])[0]) for b in ydl.tensorflow.make_tf_dataset(stream)) == N
    assert stream.stats().items == N and stream.stats().batches == 20


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_torch_loader_reports_its_stream_stats(ref, num_workers):
    pytest.importorskip("torch")
    stream = ref.stream(shuffle=True, shuffle_seed=4, batch_size=128)
    loader = ydl.torch.make_dataloader(stream, num_workers=num_workers)
    for _ in loader:
        time.sleep(0.005)
    stats = loader.stats()
    assert (stats.items, stats.batches) == (N, -(-N // 128))
    assert stats.bytes == N * RECORD_BYTES and stats.reading > 0
    assert stats.in_consumer >= 16 * 0.005
    assert (stats.waiting_on_workers > 0) == bool(num_workers)
    loader.reset_stats()
    assert loader.stats().items == 0


def test_a_mixture_stream_counts_its_sources_together(ref, tmp_path):
    other = ydl.cache_dataset(
        ({"i": np.int64(-i), "x": np.zeros(X, np.float32)} for i in range(500)),
        "o",
        "v",
        ydl.LocalStorage(tmp_path),
        progress=False,
    )
    mix = ydl.mix({"a": ref, "b": other}, weights={"a": 3, "b": 1}, epoch_size=1000)
    stream = mix.stream(shuffle=True, shuffle_seed=0, batch_size=100)
    for _ in stream:
        pass
    stats = stream.stats()
    assert (stats.items, stats.bytes) == (1000, 1000 * RECORD_BYTES)
    assert stats.reading > 0 and stats.decoding > 0


def test_str_shows_every_figure(ref):
    stream = ref.stream(batch_size=100)
    for _ in stream:
        pass
    text = str(stream.stats())
    assert text.startswith(f"{N:,} items in 20 batches, ")
    for name in TIMED:
        assert name.replace("_", " ") in text
    assert set(stream.stats().as_dict()) >= {"items", "bytes", "items_per_s", "in_consumer"}
