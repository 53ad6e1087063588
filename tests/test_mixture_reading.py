"""Reading a mixture through the Stream's boundary: predicates, thread and process workers,
transforms (whose errors name the source), read-ahead of the records each epoch reads, a
damaged chunk of one source, and a source in a bucket mixed with a local one.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.mixtures import Pool, batch_pairs, epoch_pairs, pair, with_twice

import yogadl_plus as ydl
from yogadl_plus import predicates
from yogadl_plus.errors import TransformError
from yogadl_plus.mixture import Mixture


def _fails_on_b2(item: dict[str, Any]) -> dict[str, Any]:
    if item["src"] == 1 and item["i"] == 2:
        raise RuntimeError("no b2")
    return item


def test_predicates_filter_each_sources_items(three: Mixture) -> None:
    common = dict(shuffle=True, shuffle_seed=4)
    everything = epoch_pairs(three.stream(**common))
    odd_or_c = predicates.in_lambda(["src", "i"], lambda s, i: s == 2 or i % 2 == 1)
    kept = epoch_pairs(three.stream(predicate=odd_or_c, **common))
    assert kept == [(s, i) for s, i in everything if s == 2 or i % 2 == 1]
    only_b = predicates.in_set("src", [1])
    batches = list(three.stream(predicate=only_b, batch_size=4, **common))
    assert batch_pairs(batches) == [p for p in everything if p[0] == 1]
    # A stream with a predicate resumes where it left off, offsets counting positions.
    stream = three.stream(predicate=odd_or_c, **common)
    first = [pair(item) for item in itertools.islice(iter(stream), 9)]
    rest = epoch_pairs(three.stream(predicate=odd_or_c, start_offset=stream.offset, **common))
    assert first + rest == kept


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_workers_give_what_reading_inline_gives(three: Mixture, worker_type: str) -> None:
    common = dict(shuffle=True, shuffle_seed=6, num_shards=2, shard_rank=1, start_offset=20)
    for extra in (
        {},
        {"batch_size": 4},
        {"batch_size": 5, "transform": with_twice},
        {"transform": with_twice},
    ):
        inline = three.stream(**common, **extra)
        workers = three.stream(num_workers=2, worker_type=worker_type, **common, **extra)
        try:
            for _ in range(2):
                want, got = list(inline), list(workers)
                assert len(got) == len(want) > 0
                for w, g in zip(want, got):
                    assert w.keys() == g.keys()
                    for name in w:
                        np.testing.assert_array_equal(np.asarray(g[name]), np.asarray(w[name]))
            assert workers.offset == inline.offset
        finally:
            workers.close()


def test_batches_with_a_transform_collate_items_of_every_source(three: Mixture) -> None:
    batches = list(three.stream(batch_size=8, transform=with_twice, shuffle=True, shuffle_seed=1))
    assert sum(len(b["i"]) for b in batches) == 70
    for batch in batches:
        assert (np.asarray(batch["twice"]) == 2 * np.asarray(batch["i"])).all()
    assert batch_pairs(batches) == epoch_pairs(three.stream(shuffle=True, shuffle_seed=1))


@pytest.mark.parametrize("workers, worker_type", [(0, "thread"), (2, "thread"), (2, "process")])
def test_a_transform_error_names_the_source(three: Mixture, workers: int, worker_type: str) -> None:
    stream = three.stream(transform=_fails_on_b2, num_workers=workers, worker_type=worker_type)
    try:
        with pytest.raises(TransformError, match=r"source 'b'.*record 2.*no b2"):
            list(stream)
    finally:
        stream.close()


def test_read_ahead_announces_the_records_each_epoch_reads(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both sources down-sampled: each epoch reads other records of theirs.
    mix = ydl.mix({"a": pool(0, 13), "b": pool(1, 8)}, {"a": 1, "b": 1}, epoch_size=6)
    announced: dict[int, set[int]] = {}
    for j, leaf in enumerate(mix.leaves):

        def note(indices: np.ndarray, now: bool = False, j: int = j) -> None:
            announced.setdefault(j, set()).update(np.asarray(indices).tolist())

        monkeypatch.setattr(leaf.ref, "read_ahead", note)
    stream = mix.stream(shuffle=True, shuffle_seed=3)
    for _ in range(3):
        announced.clear()
        read: dict[int, set[int]] = {}
        for src, i in epoch_pairs(stream):
            read.setdefault(src, set()).add(i)
        assert announced == read


def test_a_damaged_chunk_of_one_source_fails_a_mixtures_batches_naming_it(
    mixture_storage: ydl.LocalStorage,
) -> None:
    # Mixture batches read every source in one pass: a damaged chunk is still the
    # CacheCorrupted naming it, never other records.
    from helpers.damage import chunk_path, flip_byte

    good = ydl.cache_dataset(
        {"src": np.zeros(400, np.int64), "i": np.arange(400)}, "dm-a", "v", mixture_storage,
        progress=False,
    )  # fmt: skip
    bad = ydl.cache_dataset(
        {"src": np.ones(400, np.int64), "i": np.arange(400)}, "dm-b", "v", mixture_storage,
        progress=False,
    )  # fmt: skip
    mix = ydl.mix({"a": good, "b": bad})
    assert len(list(mix.stream(shuffle=True, shuffle_seed=2, batch_size=64))) == 13
    bad.close()  # (its chunks are opened, and checked, again on the next read)
    flip_byte(chunk_path(bad), 5000)
    with pytest.raises(ydl.CacheCorrupted, match="dm-b"):
        list(mix.stream(shuffle=True, shuffle_seed=2, batch_size=64))


@pytest.mark.servers
def test_a_mixture_of_a_remote_dataref_and_a_local_one(
    pool: Pool, s3_server: Any, s3_bucket: str, tmp_path: Path
) -> None:
    builder = s3_server.storage(s3_bucket, "mix", tmp_path / "builder")
    records = [{"src": np.int64(7), "i": np.int64(i), "pad": b"x" * 300} for i in range(200)]
    built = ydl.cache_dataset(records, "remote", "v", builder, chunk_bytes=4000, progress=False)
    assert len(built.manifest.chunks) >= 8
    local = pool(0, 13)
    machine = s3_server.storage(s3_bucket, "mix", tmp_path / "machine")
    # Pulled whole, and read on demand (chunks fetched as reads, and read-ahead, need them).
    for remote in (machine.fetch("remote", "v"), machine.fetch("remote", "v", on_demand=True)):
        mix = ydl.mix({"remote": remote, "local": local}, {"remote": 1, "local": 1}, epoch_size=60)
        assert mix.counts == [30, 30]
        stream = mix.stream(shuffle=True, shuffle_seed=2, fields=["src", "i"])
        epochs = [epoch_pairs(stream) for _ in range(3)]
        remote_seen = [i for items in epochs for src, i in items if src == 7]
        assert len(remote_seen) == len(set(remote_seen)) == 90, "down-sampled: no repeats"
        local_seen = Counter(i for items in epochs for src, i in items if src == 0)
        assert sorted(local_seen) == list(range(13)) and set(local_seen.values()) == {6, 7}
        batches = mix.stream(
            shuffle=True, shuffle_seed=2, batch_size=8, num_workers=2, fields=["src", "i"]
        )
        assert [batch_pairs(batches) for _ in range(3)] == epochs
        assert pair(mix[0]) in ((7, 0), (0, 0))
