"""Seeded augmentation (``ydl.random_map``): the same record in the same epoch gets the same
augmentation after a resume, with any workers, on any number of shards, after an elastic
rescale, through the torch and tf.data faces, and in a mixture keyed by its source and the
source's own epoch too (each copy of an up-sampled record draws its own)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.augment import generator

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


def test_plain_streams_draw_what_they_drew_before(ref: ydl.DataRef) -> None:
    # Values drawn by the release before mixtures keyed draws by the source's own epoch: a
    # saved run over a DataRef replays the same augmentations.
    first, second = epochs(ref.stream(**ARGS), 2)
    assert {k: first[k] for k in (0, 1, 150, 299)} == {
        0: 1.2011897862456915, 1: 0.3474710294124057, 150: 0.8385502993726759,
        299: 1.1159508941716167,
    }  # fmt: skip
    assert {k: second[k] for k in (0, 1, 150, 299)} == {
        0: 0.5312038062466283, 1: 0.7476969785646689, 150: 0.7276446650170637,
        299: 1.7252418510979313,
    }  # fmt: skip
    seeded = drawn(ref.stream(transform=ydl.random_map(jitter, seed=5)))
    assert (seeded[0], seeded[7]) == (0.22819731190271134, 0.2926121074523236)


def test_a_mixture_reading_each_source_once_an_epoch_draws_what_it_drew_before(tmp_path) -> None:
    # Sources at their own sizes read one epoch of their own per mixture epoch: its number.
    storage = ydl.LocalStorage(tmp_path)
    a = ydl.cache_dataset({"i": np.arange(50)}, "a", "v", storage, progress=False)
    b = ydl.cache_dataset({"i": np.arange(30)}, "b", "v", storage, progress=False)
    stream = ydl.mix({"a": a, "b": b}).stream(**ARGS)
    first, second = list(stream), list(stream)
    assert [(int(x["i"]), x["noise"]) for x in first[:3]] == [
        (29, 0.10314760003560172), (31, 1.6659198379863616), (48, -0.5036678726898368),
    ]  # fmt: skip
    assert [(int(x["i"]), x["noise"]) for x in second[:3]] == [
        (5, -1.884956030384807), (26, 2.4455919307757847), (4, 0.39598049138954194),
    ]  # fmt: skip


def tagged(record, rng):
    """An augmentation that says which source's record it drew for."""
    return {"src": record["src"], "i": record["i"], "noise": rng.normal()}


@pytest.fixture(scope="module")
def up_sampled(tmp_path_factory: pytest.TempPathFactory) -> ydl.Mixture:
    """A source of 5 records up-sampled 3 times in each epoch, beside one of 30 read once."""
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("up"))
    small = {"src": np.array(["small"] * 5), "i": np.arange(5)}
    big = {"src": np.array(["big"] * 30), "i": np.arange(30)}
    small_ref = ydl.cache_dataset(small, "small", "v", storage, progress=False)
    big_ref = ydl.cache_dataset(big, "big", "v", storage, progress=False)
    mix = ydl.mix({"small": small_ref, "big": big_ref}, {"small": 1, "big": 2}, epoch_size=45)
    assert mix.counts == [15, 30]
    return mix


MIX_ARGS = dict(shuffle=True, shuffle_seed=4, transform=ydl.random_map(tagged))


def draws(items) -> list[tuple[str, int, float]]:
    """(source, record, draw) of each item, from records or batches, in order."""
    out = []
    for item in items:
        rows = zip(*(np.atleast_1d(item[k]) for k in ("src", "i", "noise")))
        out += [(str(src), int(i), float(noise)) for src, i, noise in rows]
    return out


@pytest.mark.parametrize("shuffle", [True, False])
def test_each_copy_of_an_up_sampled_record_draws_its_own(up_sampled, shuffle) -> None:
    stream = up_sampled.stream(**{**MIX_ARGS, "shuffle": shuffle})
    for _ in range(2):
        epoch = draws(stream)
        small = Counter(i for src, i, _ in epoch if src == "small")
        assert small == dict.fromkeys(range(5), 3)
        noises = [noise for src, _, noise in epoch if src == "small"]
        assert len(set(noises)) == 15  # three copies of each record, three draws


@pytest.mark.parametrize("offset", [0, 1, 7, 22, 44])
def test_up_sampled_draws_survive_a_resume_at_any_offset(up_sampled, offset) -> None:
    stream = up_sampled.stream(**MIX_ARGS)
    first, second = draws(stream), draws(stream)
    resumed = up_sampled.stream(**MIX_ARGS, start_offset=offset)
    assert draws(resumed) == first[offset:]
    assert draws(resumed) == second


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_up_sampled_draws_are_the_same_with_workers(up_sampled, worker_type) -> None:
    args = {**MIX_ARGS, "batch_size": 4}
    inline = up_sampled.stream(**args)
    workers = up_sampled.stream(**args, num_workers=2, worker_type=worker_type)
    assert [draws(workers) for _ in range(2)] == [draws(inline) for _ in range(2)]
    workers.close()


def test_up_sampled_draws_are_the_same_on_shards_and_after_a_rescale(up_sampled) -> None:
    whole = Counter(draws(up_sampled.stream(**MIX_ARGS)))
    shards = Counter()
    for rank in range(3):
        shards.update(draws(up_sampled.stream(**MIX_ARGS, num_shards=3, shard_rank=rank)))
    assert shards == whole
    streams = [up_sampled.stream(**MIX_ARGS, num_shards=3, shard_rank=r) for r in range(3)]
    seen = Counter()
    for stream in streams:
        it = iter(stream)
        seen.update(draws(next(it) for _ in range(7)))
    start = streams[0].global_offset
    for rank in range(2):
        seen.update(
            draws(up_sampled.stream(**MIX_ARGS, num_shards=2, shard_rank=rank, global_start=start))
        )
    assert seen == whole


@settings(max_examples=25, deadline=None)
@given(
    small_weight=st.integers(0, 4), big_weight=st.integers(1, 4),
    epoch_size=st.integers(1, 40), epoch=st.integers(0, 3),
)  # fmt: skip
def test_a_mixture_draws_from_each_source_s_own_epoch(
    up_sampled, small_weight, big_weight, epoch_size, epoch
) -> None:
    # Reference: source j's items of mixture epoch e are items e*c .. (e+1)*c - 1 of its own
    # sequence; item q is record q % n read in its own epoch q // n (unshuffled).
    small, big = (leaf.ref for leaf in up_sampled.leaves)
    weights = {"small": small_weight, "big": big_weight}
    mix = ydl.mix({"small": small, "big": big}, weights, epoch_size=epoch_size)
    args = {**MIX_ARGS, "shuffle": False, "start_offset": epoch * epoch_size}
    got = Counter(draws(mix.stream(**args)))
    want = Counter()
    for name, ref, count in zip(("small", "big"), (small, big), mix.counts):
        n = len(ref)
        for q in range(epoch * count, (epoch + 1) * count):
            noise = generator(MIX_ARGS["shuffle_seed"], q // n, q % n, name).normal()
            want[(name, q % n, float(noise))] += 1
    assert got == want


def test_the_faces_draw_an_up_sampled_mixture_s_copies_as_the_stream(up_sampled) -> None:
    args = {**MIX_ARGS, "batch_size": 5}
    whole = draws(up_sampled.stream(**args))
    torch_face = pytest.importorskip("torch") and ydl.torch
    loader = torch_face.make_dataloader(up_sampled.stream(**args), num_workers=2)
    assert draws({k: np.asarray(v) for k, v in b.items()} for b in loader) == whole
    pytest.importorskip("tensorflow")
    dataset = ydl.tensorflow.make_tf_dataset(up_sampled.stream(**args))
    as_numpy = ({k: v.numpy() for k, v in b.items()} for b in dataset)
    got = draws({**b, "src": [s.decode() for s in b["src"]]} for b in as_numpy)
    assert got == whole
