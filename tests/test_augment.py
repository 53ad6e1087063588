"""Seeded augmentation (``ydl.random_map``): the same record in the same epoch gets the same
augmentation after a resume, with any workers, on any number of shards, after an elastic
rescale, through the torch and tf.data faces, and in a mixture keyed by its source too."""

from __future__ import annotations

import numpy as np
import pytest

import yogadl_plus as ydl

N = 300


def jitter(record, rng):
    """An augmentation: the record's index and a draw of its own generator."""
    return {"i": record["i"], "noise": rng.normal()}


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> ydl.DataRef:
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("augment"))
    return ydl.cache_dataset({"i": np.arange(N)}, "d", "v", storage, progress=False)


def drawn(items) -> dict[int, float]:
    """record index -> its draw, from records or batches."""
    out: dict[int, float] = {}
    for item in items:
        for i, noise in zip(np.atleast_1d(item["i"]), np.atleast_1d(item["noise"])):
            out[int(i)] = float(noise)
    return out


def epochs(stream: ydl.Stream, count: int) -> list[dict[int, float]]:
    return [drawn(stream) for _ in range(count)]


ARGS = dict(shuffle=True, shuffle_seed=11, transform=ydl.random_map(jitter))


def test_each_record_draws_its_own_in_each_epoch(ref: ydl.DataRef) -> None:
    first, second = epochs(ref.stream(**ARGS), 2)
    assert sorted(first) == list(range(N)) and first != second  # a new draw each epoch
    assert len(set(first.values())) == N
    again = epochs(ref.stream(**ARGS), 2)
    assert again == [first, second]
    other_seed = ydl.random_map(jitter, seed=1)
    assert drawn(ref.stream(shuffle=True, shuffle_seed=11, transform=other_seed)) != first


def test_a_resume_draws_what_the_first_run_drew(ref: ydl.DataRef) -> None:
    whole = epochs(ref.stream(**ARGS), 2)
    stream = ref.stream(**ARGS)
    first = iter(stream)
    seen = drawn(next(first) for _ in range(120))
    resumed = ref.stream(**ARGS, start_offset=stream.offset)
    seen.update(drawn(resumed))
    assert seen == whole[0]
    assert drawn(resumed) == whole[1]


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_workers_draw_what_reading_inline_draws(ref: ydl.DataRef, worker_type: str) -> None:
    inline = epochs(ref.stream(**ARGS, batch_size=16), 2)
    workers = ref.stream(**ARGS, batch_size=16, num_workers=2, worker_type=worker_type)
    assert epochs(workers, 2) == inline


def test_shards_and_an_elastic_rescale_draw_what_one_stream_draws(ref: ydl.DataRef) -> None:
    whole = drawn(ref.stream(**ARGS))
    shards: dict[int, float] = {}
    for rank in range(3):
        shards.update(drawn(ref.stream(**ARGS, num_shards=3, shard_rank=rank)))
    assert shards == whole
    # Half an epoch on 3 ranks, then the rest on 2 (global_offset -> global_start).
    streams = [ref.stream(**ARGS, num_shards=3, shard_rank=r) for r in range(3)]
    seen: dict[int, float] = {}
    for stream in streams:
        it = iter(stream)
        seen.update(drawn(next(it) for _ in range(50)))
    start = streams[0].global_offset
    for rank in range(2):
        seen.update(drawn(ref.stream(**ARGS, num_shards=2, shard_rank=rank, global_start=start)))
    assert seen == whole


def test_the_faces_draw_what_the_stream_draws(ref: ydl.DataRef) -> None:
    whole = drawn(ref.stream(**ARGS, batch_size=10))
    torch_face = pytest.importorskip("torch") and ydl.torch
    loader = torch_face.make_dataloader(ref.stream(**ARGS, batch_size=10), num_workers=2)
    assert drawn({k: v.numpy() for k, v in b.items()} for b in loader) == whole
    pytest.importorskip("tensorflow")
    dataset = ydl.tensorflow.make_tf_dataset(ref.stream(**ARGS, batch_size=10))
    assert drawn({k: v.numpy() for k, v in b.items()} for b in dataset) == whole


def test_a_mixture_keys_by_source_too(tmp_path) -> None:
    storage = ydl.LocalStorage(tmp_path)
    a = ydl.cache_dataset({"i": np.arange(50)}, "a", "v", storage, progress=False)
    b = ydl.cache_dataset({"i": np.arange(50)}, "b", "v", storage, progress=False)
    mix = ydl.mix({"a": a, "b": b})
    draws = []
    for item in mix.stream(**ARGS):
        draws.append(item["noise"])
    assert len(set(draws)) == 100  # record 7 of a and record 7 of b draw apart


def test_a_random_map_outside_a_stream_says_where_it_goes() -> None:
    with pytest.raises(TypeError, match=r"stream\(transform=\.\.\.\)"):
        ydl.random_map(jitter)({"i": 1})
    with pytest.raises(ValueError, match="needs a function"):
        ydl.random_map(3)  # type: ignore[arg-type]
