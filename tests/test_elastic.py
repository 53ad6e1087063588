"""Elastic resume: a job checkpointed at global step k on S shards continues the same epoch on
S' shards (global_start=stream.global_offset) with no record repeated or skipped."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.order import ShardByRecords


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("elastic"))
    made: dict[int, ydl.DataRef] = {}

    def of_size(n: int) -> ydl.DataRef:
        if n not in made:
            records = [{"i": i} for i in range(n)]
            made[n] = ydl.cache_dataset(records, "d", f"n{n}", storage, progress=False)
        return made[n]

    return of_size


def ids(items) -> list[int]:
    return [int(r["i"]) for r in items]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 120),
    shards=st.integers(1, 6),
    new_shards=st.integers(1, 6),
    epoch=st.integers(0, 2),
    shuffle=st.booleans(),
    drop=st.booleans(),
    data=st.data(),
)
def test_rescaling_mid_epoch_repeats_and_skips_nothing(
    datasets, n, shards, new_shards, epoch, shuffle, drop, data
):
    # A shard with no positions at all (n < S) cannot tell one epoch from the next.
    assume(n >= shards)
    ref = datasets(n)
    common = dict(shuffle=shuffle, shuffle_seed=5, drop_shard_remainder=drop)
    before = [ref.stream(num_shards=shards, shard_rank=r, **common) for r in range(shards)]
    shortest = min(len(s) for s in before)
    k = data.draw(st.integers(0, shortest))  # the global step reached by every rank
    consumed = []
    offsets = set()
    for stream in before:
        stream_epoch = ref.stream(
            num_shards=shards,
            shard_rank=stream.plan().order.shard_rank,
            start_offset=epoch * stream.plan().positions_per_epoch,
            **common,
        )
        consumed += ids(itertools.islice(iter(stream_epoch), k))
        offsets.add(stream_epoch.global_offset)
    assert len(offsets) == 1, "every rank at the same step reports the same global offset"
    (checkpoint,) = offsets
    after = [
        ref.stream(num_shards=new_shards, shard_rank=r, global_start=checkpoint, **common)
        for r in range(new_shards)
    ]
    epoch_end = (epoch + 1) * n
    assert epoch * n + shards * k <= checkpoint <= epoch_end
    if checkpoint < epoch_end:
        rest = [i for stream in after for i in ids(stream)]  # the rest of this epoch
        whole_epoch = epoch + 1
    else:
        rest = []  # the epoch was finished: the new shards start the next one whole
        whole_epoch = epoch + 1
    seen = consumed + rest
    assert len(seen) == len(set(seen)), "a record came twice"
    if not drop:
        assert sorted(seen) == list(range(n)), "a record was skipped"
    elif rest:
        # The rest of the epoch is cut to whole rounds of the new shards, nothing more.
        start = checkpoint - epoch * n
        assert len(rest) == (n - start) // new_shards * new_shards
    # Then the new shards run whole epochs, in the order a fresh S'-shard stream has.
    for stream in after:
        order = ShardByRecords(
            n,
            shuffle=shuffle,
            shuffle_seed=5,
            shard_rank=stream.plan().order.shard_rank,
            num_shards=new_shards,
            drop_shard_remainder=drop,
        )
        expected = order.indices(whole_epoch, 0, order.shard_length).tolist()
        assert ids(stream) == expected


def test_global_offset_counts_every_shards_positions(datasets):
    ref = datasets(100)
    streams = [ref.stream(num_shards=4, shard_rank=r) for r in range(4)]
    its = [iter(s) for s in streams]
    for it in its:
        for _ in range(7):
            next(it)
    assert {s.global_offset for s in streams} == {28}
    assert streams[0].offset == 7
    # A whole epoch finished: the next epoch starts at 100.
    for it in its:
        list(it)
    assert {s.global_offset for s in streams} == {100}


def test_same_shard_count_global_start_equals_start_offset(datasets):
    ref = datasets(50)
    a = ref.stream(shuffle=True, shuffle_seed=1, num_shards=2, shard_rank=1, start_offset=30)
    g = ref.stream(shuffle=True, shuffle_seed=1, num_shards=2, shard_rank=1, global_start=60)
    assert ids(a) == ids(g) and ids(a) == ids(g)


def test_a_resumed_stream_resumes_again_from_its_offset(datasets):
    ref = datasets(90)
    args = dict(shuffle=True, shuffle_seed=3, num_shards=4, shard_rank=2, global_start=137)
    stream = ref.stream(**args)
    it = iter(stream)
    head = ids(itertools.islice(it, 5))
    again = ref.stream(start_offset=stream.offset, **args)
    assert ids(again)[:3] == ids(itertools.islice(it, 3))
    assert len(head) == 5


def test_batches_report_global_offsets_too(datasets):
    ref = datasets(64)
    streams = [ref.stream(num_shards=2, shard_rank=r, batch_size=5) for r in range(2)]
    for s in streams:
        next(iter(s))
    assert {s.global_offset for s in streams} == {10}


def test_bad_global_start(datasets):
    with pytest.raises(ValueError, match="global_start"):
        datasets(10).stream(global_start=-1)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 100),
    counts=st.lists(st.integers(1, 5), min_size=2, max_size=4),
    shuffle=st.booleans(),
    data=st.data(),
)
def test_rescaling_again_and_again_within_one_epoch(datasets, n, counts, shuffle, data):
    """S1 -> S2 -> S3 ... shards, each rescale at a global step the ranks reached together."""
    ref = datasets(n)
    checkpoint, seen = 0, []
    for shards in counts[:-1]:
        streams = [
            ref.stream(
                shuffle=shuffle,
                shuffle_seed=8,
                num_shards=shards,
                shard_rank=r,
                global_start=checkpoint,
            )
            for r in range(shards)
        ]
        its = [iter(s) for s in streams]
        lengths = [s.plan().epoch_length(s.plan().order.first_epoch) for s in streams]
        k = data.draw(st.integers(0, min(lengths)))
        for it in its:
            seen += ids(itertools.islice(it, k))
        offsets = {s.global_offset for s in streams}
        assert len(offsets) == 1
        (checkpoint,) = offsets
        if checkpoint >= n:
            break
    if checkpoint < n:
        last = counts[-1]
        for r in range(last):
            seen += ids(
                ref.stream(
                    shuffle=shuffle,
                    shuffle_seed=8,
                    num_shards=last,
                    shard_rank=r,
                    global_start=checkpoint,
                )
            )
    assert sorted(seen) == list(range(n))


def test_with_ranks_out_of_step_the_minimum_global_offset_skips_nothing(datasets):
    ref = datasets(120)
    keep = ydl.predicates.in_lambda(["i"], lambda i: i % 3 != 0)  # ranks drift apart
    args = dict(shuffle=True, shuffle_seed=4, predicate=keep)
    ranks = [ref.stream(num_shards=3, shard_rank=r, **args) for r in range(3)]
    seen = []
    for stream in ranks:
        seen += ids(itertools.islice(iter(stream), 12))
    offsets = [s.global_offset for s in ranks]
    assert len(set(offsets)) > 1, "the predicate put the ranks at different positions"
    rest = []
    for r in range(2):
        rest += ids(ref.stream(num_shards=2, shard_rank=r, global_start=min(offsets), **args))
    assert set(seen) | set(rest) == {i for i in range(120) if i % 3 != 0}, "nothing skipped"


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 120),
    shards=st.integers(1, 6),
    new_shards=st.integers(1, 6),
    shuffle=st.booleans(),
    data=st.data(),
)
def test_padded_shards_rescale_without_skipping_a_record(
    datasets, n, shards, new_shards, shuffle, data
):
    # pad_shard_remainder (DDP's evened shards) repeats the order's first records to fill the
    # last round; a rescale mid-epoch may repeat more of them, but never skips one, and every
    # new shard has as many positions as the others.
    ref = datasets(n)
    common = dict(shuffle=shuffle, shuffle_seed=5, pad_shard_remainder=True)
    before = [ref.stream(num_shards=shards, shard_rank=r, **common) for r in range(shards)]
    assert len({len(s) for s in before}) == 1
    k = data.draw(st.integers(0, len(before[0])))
    consumed, offsets = [], set()
    for stream in before:
        consumed += ids(itertools.islice(iter(stream), k))
        offsets.add(stream.global_offset)
    assert len(offsets) == 1
    (checkpoint,) = offsets
    after = [
        ref.stream(num_shards=new_shards, shard_rank=r, global_start=checkpoint, **common)
        for r in range(new_shards)
    ]
    rest = [ids(stream) for stream in after]  # the rest of the epoch (or all of the next)
    assert len({len(r) for r in rest}) == 1
    seen = consumed + [i for r in rest for i in r]
    if checkpoint < n:
        assert set(seen) == set(range(n)), "a record was skipped"
        assert len(seen) < n + shards + new_shards, "more than the padding came twice"
