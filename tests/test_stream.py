"""Stream: the order contract of docs/api.md#stream (epochs, shards, offsets, batches, fields)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.order import ShardByRecords

N = 97  # prime, so shards and batches never divide evenly


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("stream"))
    records = ({"i": np.int64(i), "x": np.full(3, i, np.float32), "s": str(i)} for i in range(N))
    return ydl.cache_dataset(records, "d", "v", storage, chunk_bytes=1500, progress=False)


def ids(items):
    return [int(r["i"]) for r in items]


def test_unshuffled_is_storage_order_and_each_iter_is_the_next_epoch(ref):
    stream = ref.stream()
    assert len(stream) == N
    assert ids(stream) == list(range(N)) and stream.offset == N
    assert ids(stream) == list(range(N)) and stream.offset == 2 * N


def test_shuffled_epochs_differ_and_each_covers_everything(ref):
    stream = ref.stream(shuffle=True, shuffle_seed=11)
    first, second = ids(stream), ids(stream)
    assert sorted(first) == sorted(second) == list(range(N))
    assert first != second and first != list(range(N))
    assert first == ids(ref.stream(shuffle=True, shuffle_seed=11))
    assert first == ShardByRecords(N, shuffle=True, shuffle_seed=11).indices(0, 0, N).tolist()


def test_skip_shuffle_at_epoch_end_reuses_epoch_0(ref):
    stream = ref.stream(shuffle=True, shuffle_seed=3, skip_shuffle_at_epoch_end=True)
    assert ids(stream) == ids(stream) != list(range(N))


def test_unfinished_epoch_then_iter_starts_the_next_epoch(ref):
    stream = ref.stream(shuffle=True, shuffle_seed=5)
    epoch0 = ids(ref.stream(shuffle=True, shuffle_seed=5, start_offset=0))
    epoch1 = ids(ref.stream(shuffle=True, shuffle_seed=5, start_offset=N))
    assert ids(itertools.islice(iter(stream), 10)) == epoch0[:10]
    assert stream.offset == 10
    assert ids(stream) == epoch1 and stream.offset == 2 * N


def test_random_seed_is_drawn_and_reported(ref):
    a, b = ref.stream(shuffle=True), ref.stream(shuffle=True)
    assert isinstance(a.shuffle_seed, int) and a.shuffle_seed != b.shuffle_seed
    assert ids(a) == ids(ref.stream(shuffle=True, shuffle_seed=a.shuffle_seed))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shards=st.integers(1, 8), drop=st.booleans(), shuffle=st.booleans(), epoch=st.integers(0, 3))
def test_shards_are_disjoint_and_cover_the_cut_order(ref, shards, drop, shuffle, epoch):
    seen = []
    lengths = set()
    for rank in range(shards):
        stream = ref.stream(
            shuffle=shuffle,
            shuffle_seed=9,
            num_shards=shards,
            shard_rank=rank,
            drop_shard_remainder=drop,
        )
        stream_epoch = ref.stream(
            shuffle=shuffle,
            shuffle_seed=9,
            num_shards=shards,
            shard_rank=rank,
            drop_shard_remainder=drop,
            start_offset=epoch * len(stream),
        )
        got = ids(stream_epoch)
        assert len(got) == len(stream)
        lengths.add(len(got))
        seen.extend(got)
    assert len(seen) == len(set(seen)), "shards overlap"
    if drop:
        assert len(seen) == N - N % shards and len(lengths) == 1
    else:
        assert sorted(seen) == list(range(N))


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shards=st.integers(1, 4),
    shuffle=st.booleans(),
    batch=st.one_of(st.none(), st.integers(1, 40)),
    drop_last=st.booleans(),
    start=st.integers(0, 3 * N),
    take=st.integers(0, 3 * N),
)
def test_resuming_from_offset_reproduces_the_rest_exactly(
    ref, shards, shuffle, batch, drop_last, start, take
):
    args = dict(
        shuffle=shuffle,
        shuffle_seed=4,
        num_shards=shards,
        shard_rank=shards - 1,
        batch_size=batch,
        drop_last=drop_last,
    )

    def flat(stream, epochs):
        out = []
        for _ in range(epochs):
            for item in stream:
                out.append(tuple(int(i) for i in np.atleast_1d(item["i"])))
        return out

    reference = ref.stream(start_offset=start, **args)
    whole = flat(reference, 3)
    stream = ref.stream(start_offset=start, **args)
    prefix, epochs_used = [], 0
    while len(prefix) < min(take, len(whole)):
        for item in stream:
            prefix.append(tuple(int(i) for i in np.atleast_1d(item["i"])))
            if len(prefix) == min(take, len(whole)):
                break
        epochs_used += 1
    resumed = ref.stream(start_offset=stream.offset, **args)
    rest = flat(resumed, 3)
    assert prefix == whole[: len(prefix)]
    # The resumed stream continues exactly where the prefix stopped.
    n = min(len(rest), len(whole) - len(prefix))
    assert rest[:n] == whole[len(prefix) : len(prefix) + n]


def test_start_offset_counts_positions_across_epochs(ref):
    stream = ref.stream(shuffle=True, shuffle_seed=2, start_offset=2 * N + 5)
    expected = ShardByRecords(N, shuffle=True, shuffle_seed=2).indices(2, 5, N).tolist()
    assert ids(stream) == expected and stream.offset == 3 * N


def test_batches(ref):
    stream = ref.stream(batch_size=10)
    batches = list(stream)
    assert len(stream) == len(batches) == 10
    assert batches[0]["x"].shape == (10, 3) and batches[-1]["i"].tolist() == list(range(90, 97))
    assert batches[0]["s"] == [str(i) for i in range(10)]
    dropped = ref.stream(batch_size=10, drop_last=True)
    assert len(dropped) == 9 and len(list(dropped)) == 9 and dropped.offset == N


def test_batch_offset_counts_records_not_batches(ref):
    stream = ref.stream(batch_size=8, shuffle=True, shuffle_seed=1)
    it = iter(stream)
    next(it), next(it)
    assert stream.offset == 16
    resumed = ref.stream(batch_size=8, shuffle=True, shuffle_seed=1, start_offset=16)
    assert next(iter(resumed))["i"].tolist() == next(it)["i"].tolist()


def test_fields_selects_and_orders(ref):
    record = next(iter(ref.stream(fields=["s", "i"])))
    assert list(record) == ["s", "i"] and record == {"s": "0", "i": 0}
    with pytest.raises(ydl.SchemaError, match="no field 'zz'"):
        ref.stream(fields=["zz"])


def test_transform_runs_after_decoding(ref):
    stream = ref.stream(transform=lambda r: {"double": r["i"] * 2}, fields=["i"])
    assert [int(r["double"]) for r in stream][:3] == [0, 2, 4]
    batches = list(ref.stream(transform=lambda r: {"x2": r["x"] * 2}, batch_size=4))
    assert batches[1]["x2"].shape == (4, 3) and batches[1]["x2"][0, 0] == 8


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_shards=0), "num_shards"),
        (dict(num_shards=2, shard_rank=2), "shard_rank"),
        (dict(shard_rank=-1), "shard_rank"),
        (dict(start_offset=-1), "start_offset"),
        (dict(start_offset=1.5), "start_offset"),
        (dict(batch_size=0), "batch_size"),
        (dict(shuffle=True, num_shards=2), "shuffle_seed"),
        (dict(shuffle=True, shuffle_seed=-3), "seed"),
    ],
)
def test_bad_arguments_are_value_errors_with_the_reason(ref, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ref.stream(**kwargs)


def test_empty_shard(tmp_path):
    ref = ydl.cache_dataset(
        [{"a": 1}, {"a": 2}], "e", "v", ydl.LocalStorage(tmp_path), progress=False
    )
    stream = ref.stream(num_shards=3, shard_rank=2)
    assert len(stream) == 0 and list(stream) == [] and stream.offset == 0


def test_shard_by_chunks_streams_and_resumes(tmp_path) -> None:
    storage = ydl.LocalStorage(tmp_path)
    ref = ydl.cache_dataset(
        ({"i": np.int64(i), "pad": np.zeros(100, np.float32)} for i in range(3000)),
        "c", "v", storage, chunk_bytes=50_000,
    )  # fmt: skip
    assert len(ref.manifest.chunks) >= 4
    kwargs = {"shard_by": "chunks", "num_shards": 2, "shuffle": True, "shuffle_seed": 5}
    epochs = [[int(r["i"]) for r in ref.stream(shard_rank=k, **kwargs)] for k in range(2)]
    assert sorted(epochs[0] + epochs[1]) == list(range(3000))
    stream = ref.stream(shard_rank=1, batch_size=7, fields="i", **kwargs)
    it = iter(stream)
    [next(it) for _ in range(10)]
    resumed = ref.stream(
        shard_rank=1, batch_size=7, fields="i", start_offset=stream.offset, **kwargs
    )
    rest = [int(i) for b in resumed for i in b["i"]]
    assert rest == epochs[1][70:]
    with pytest.raises(ValueError, match="no global order"):
        _ = stream.global_offset
    with pytest.raises(ValueError, match="shard_by must be"):
        ref.stream(shard_by="rows")
    with pytest.raises(ValueError, match="global_start"):
        ref.stream(shard_by="chunks", global_start=5)


def test_every_stream_keyword_is_a_field_of_exactly_one_settings_class():
    # stream() routes its keywords to the settings dataclasses by name: a keyword no class
    # holds would be dropped, one two classes hold would be set twice.
    import dataclasses
    import inspect

    from yogadl_plus.order import OrderSettings
    from yogadl_plus.recordsource import RecordSource
    from yogadl_plus.stream import BoundarySettings, WorkerSettings

    keywords = set(inspect.signature(RecordSource.stream).parameters) - {"self"}
    held = [
        {f.name for f in dataclasses.fields(kind)}
        for kind in (OrderSettings, BoundarySettings, WorkerSettings)
    ]
    assert set().union(*held) == keywords
    assert sum(map(len, held)) == len(keywords)
    assert ydl.DataRef.stream is ydl.Mixture.stream is RecordSource.stream


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=st.integers(1, 40),
    drop_last=st.booleans(),
    start=st.integers(0, 2 * N),
    workers=st.sampled_from([0, 2]),
    consumed=st.integers(0, 12),
)
def test_blocks_of_whole_batches_are_iters_batches_with_the_same_ledger(
    ref, batch, drop_last, start, workers, consumed
):
    # iter_blocks() of a batching stream (the tf.data face's bulk path): the same batches,
    # cut from blocks of whole batches, and the same offsets for a count of batches consumed.
    kwargs = dict(
        shuffle=True,
        shuffle_seed=4,
        batch_size=batch,
        drop_last=drop_last,
        start_offset=start,
        num_workers=workers,
    )
    by_items, by_blocks = ref.stream(**kwargs), ref.stream(**kwargs)
    epoch = by_items.next_epoch_position[0]
    batches = [b["i"].tolist() for b in by_items]
    blocks = list(by_blocks.iter_blocks())
    assert all(len(block) % batch == 0 for block in blocks[:-1])  # only the last may be short
    rows = [i for block in blocks for i in block.columns["i"].tolist()]
    assert rows == [i for b in batches for i in b]
    assert by_blocks.offset == by_items.offset
    assert by_blocks.next_epoch_position == by_items.next_epoch_position
    k = min(consumed, len(batches))
    assert by_blocks.offset_after(epoch, k) == by_items.offset_after(epoch, k)
    assert by_blocks.stats().batches == by_items.stats().batches == len(batches)


def test_handed_out_counts_what_an_epochs_latest_iteration_handed_out(ref):
    # What a consumer that reads ahead asks to know whether the epoch has another item for it.
    odd = ydl.predicates.in_lambda(["i"], lambda i: i % 2 == 1)
    stream = ref.stream(shuffle=True, shuffle_seed=4, batch_size=3, predicate=odd)
    assert stream.handed_out(0) == 0  # not iterated yet
    batches = iter(stream)
    for k in range(1, 4):
        next(batches)
        assert stream.handed_out(0) == k
    assert 3 + len(list(batches)) == stream.handed_out(0) == 16  # the 48 odd ids of 97, by 3
    next(iter(stream))
    assert (stream.handed_out(0), stream.handed_out(1)) == (16, 1)
    stream.seek(0)  # epoch 0 again: its latest iteration counts
    next(iter(stream))
    assert stream.handed_out(0) == 1
    with pytest.raises(ValueError, match="epoch"):
        stream.handed_out(-1)


def test_iter_blocks_refuses_batches_that_are_not_plain_runs(ref):
    odd = ydl.predicates.in_lambda(["i"], lambda i: i % 2 == 1)
    for kwargs in ({"predicate": odd}, {"transform": lambda r: r}):
        with pytest.raises(ValueError, match="iter\\(\\)"):
            ref.stream(batch_size=4, **kwargs).iter_blocks()


def test_stream_hands_every_keyword_as_given_to_the_routing(ref, monkeypatch):
    # RecordSource.stream names its keywords once more to hand them on: one left out would
    # silently keep its default.
    import inspect

    from yogadl_plus.recordsource import RecordSource
    from yogadl_plus.stream import keywords

    names = set(inspect.signature(RecordSource.stream).parameters) - {"self"}
    assert names == keywords.KEYWORDS
    got = {}
    monkeypatch.setattr(keywords, "routed", lambda given: got.update(given) or 1 / 0)
    marked = {name: (name,) for name in names}  # a value that only this keyword has
    with pytest.raises(ZeroDivisionError):
        ref.stream(**marked)
    assert got == marked


def test_replace_routes_its_changes_and_names_an_unknown_one(ref):
    stream = ref.stream(shuffle=True, shuffle_seed=4, batch_size=8)
    changed = stream.replace(batch_size=16, num_workers=1, start_offset=3)
    plan = changed.plan()
    assert (plan.boundary.batch_size, changed.workers.num_workers) == (16, 1)
    assert plan.order.settings.start_offset == 3 and plan.order.settings.shuffle_seed == 4
    with pytest.raises(TypeError, match=r"replace\(\) got unknown arguments \['bacth_size'\]"):
        stream.replace(bacth_size=16)
