"""The bottleneck verdict names the stage made slow on purpose, and says what to do."""

from __future__ import annotations

import time

import numpy as np
import pytest

import yogadl_plus as ydl
from yogadl_plus.stream.verdict import VERDICTS

N = 400


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> ydl.DataRef:
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("verdict"))
    columns = {"i": np.arange(N), "x": np.zeros((N, 16), np.float32)}
    return ydl.cache_dataset(columns, "d", "v", storage, progress=False)


def slow_transform(record):
    time.sleep(0.002)
    return record


def slow_test(i):
    time.sleep(0.002)
    return True


def run(stream: ydl.Stream, pause: float = 0.0) -> ydl.StreamStats:
    for _ in stream:
        if pause:
            time.sleep(pause)
    return stream.stats()


def test_a_slow_transform_is_the_verdict(ref: ydl.DataRef) -> None:
    stats = run(ref.stream(transform=slow_transform))
    assert stats.bottleneck == "transform"
    assert stats.summary().startswith("data-bound ") and "transform is " in stats.summary()
    assert "add num_workers" in stats.summary()


def test_a_slow_predicate_is_the_verdict(ref: ydl.DataRef) -> None:
    predicate = ydl.predicates.in_lambda("i", slow_test)
    stats = run(ref.stream(predicate=predicate, batch_size=8))
    assert stats.bottleneck == "predicate" and "vectorize" in stats.summary()


def test_a_slow_consumer_is_not_data_bound(ref: ydl.DataRef) -> None:
    stats = run(ref.stream(batch_size=20), pause=0.01)
    assert stats.bottleneck == "consumer"
    assert stats.summary().startswith("not data-bound")


def test_a_fresh_stream_has_a_verdict_too(ref: ydl.DataRef) -> None:
    stats = ref.stream().stats()
    assert stats.bottleneck in VERDICTS and stats.bottleneck == "consumer"


def test_stats_in_prometheus_text_format(ref: ydl.DataRef) -> None:
    stream = ref.stream(batch_size=40)
    for _ in stream:
        pass
    text = stream.stats().to_prometheus({"rank": "3", "job": 'a "b"\\c'})
    lines = text.splitlines()
    samples = [line for line in lines if not line.startswith("#")]
    labels = 'job="a \\"b\\"\\\\c",rank="3"'
    assert f"yogadl_plus_items_handed_out{{{labels}}} 400" in samples
    assert f"yogadl_plus_batches_handed_out{{{labels}}} 10" in samples
    assert any(
        s.startswith(f'yogadl_plus_stage_seconds{{{labels},stage="reading"}} ') for s in samples
    )
    assert any(s.startswith("yogadl_plus_bottleneck{") and 'verdict="' in s for s in samples)
    assert "# TYPE yogadl_plus_data_sources_bytes_read counter" in lines
    for sample in samples:  # name{labels} value: every value a number
        float(sample.rsplit(" ", 1)[1])
    with pytest.raises(ValueError, match="label names"):
        stream.stats().to_prometheus({"bad-name": "1"})


def stats_of(**given: float) -> ydl.StreamStats:
    """Stats with the figures given (seconds, items, reading, ...), the rest 0."""
    figures = {f: 0.0 for f in ydl.StreamStats.__dataclass_fields__}
    return ydl.StreamStats(**{**figures, **given})


@pytest.mark.parametrize(
    ("figures", "why"),
    [
        # `yogadl-plus bench` of the demo: 5,000 small records in a few hundredths of a second.
        (dict(items=5000, seconds=0.034, reading=0.021, decoding=0.010), "too short"),
        # A long run of records that cost a microsecond each: a hand-over costs as much.
        (dict(items=2_000_000, seconds=3.0, reading=2.0, decoding=0.5), "1.2 µs an item"),
        # ... with workers already reading.
        (dict(items=2_000_000, seconds=3.0, reading=2.5, waiting_on_workers=1.0), "1.2 µs"),
    ],
    ids=["demo", "cheap records", "cheap, with workers"],
)
def test_no_workers_are_advised_where_they_cannot_help(figures, why) -> None:
    summary = stats_of(**figures).summary()
    assert summary.startswith("data-bound") and "workers would not help" in summary
    assert why in summary and "num_workers" not in summary and "more workers" not in summary
    assert "check the disk or the bucket" in summary  # what else to do


def test_workers_are_advised_where_the_work_is_worth_handing_over() -> None:
    transform = stats_of(items=400, seconds=0.9, transforms=0.85, reading=0.01)
    assert "add num_workers" in transform.summary()
    reading = stats_of(items=10_000, seconds=1.0, reading=0.9, waiting_on_workers=0.4)
    assert "more workers" in reading.summary()
