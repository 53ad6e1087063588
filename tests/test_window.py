"""The windowed shuffle: ``stream(shuffle=True, shuffle_window=W)`` permutes the chunks, then the
records within each window of W consecutive chunks of that permutation, as a pure function of (seed,
epoch, position) with the resume, shard and elastic contract of the full shuffle
(docs/windowed-shuffle.md, docs/design.md#windowed-shuffle)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.order import (
    OrderSettings,
    Permutation,
    ShardByChunks,
    ShardByRecords,
    WindowPermutation,
)

REPO_ROOT = Path(__file__).resolve().parents[1]

N = 400
seeds = st.integers(min_value=0, max_value=2**70)
# Chunk layouts as versions have them: mostly alike, some short, some empty (a chunk without
# any n-gram anchor), sometimes none at all.
layouts = st.lists(st.integers(0, 40), min_size=0, max_size=30)
windows = st.integers(1, 8)


def _records(n: int) -> Any:
    # Values of varying size, so chunks of chunk_bytes hold different numbers of records.
    return ({"i": np.int64(i), "t": np.int64(i), "pad": b"x" * (i * 37 % 90)} for i in range(n))


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> ydl.LocalStorage:
    return ydl.LocalStorage(tmp_path_factory.mktemp("window"))


@pytest.fixture(scope="module")
def ref(storage: ydl.LocalStorage) -> ydl.DataRef:
    made = ydl.cache_dataset(_records(N), "w", "v", storage, chunk_bytes=900, progress=False)
    assert len(made.manifest.chunks) > 20  # many chunks, of different sizes
    assert len({c.records for c in made.manifest.chunks}) > 1
    return made


def ids(items: Any) -> list[int]:
    return [int(r["i"]) for r in items]


def chunk_of(counts: list[int] | np.ndarray) -> np.ndarray:
    """Each record's chunk, in storage order."""
    return np.repeat(np.arange(len(counts)), counts)


def whole(order: WindowPermutation) -> np.ndarray:
    return order.indices(np.arange(order.n))


# --- the permutation -----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(counts=layouts, window=windows, seed=seeds, epoch=st.integers(0, 10**9))
def test_each_window_is_a_permutation_of_the_records_of_its_chunks(
    counts: list[int], window: int, seed: int, epoch: int
) -> None:
    perm = WindowPermutation(counts, window, seed, epoch)
    values = whole(perm)
    n = sum(counts)
    assert len(perm) == perm.n == n
    np.testing.assert_array_equal(np.sort(values), np.arange(n))  # the epoch: a permutation
    assert sorted(perm.chunk_order.tolist()) == list(range(len(counts)))
    assert perm.num_windows == -(-len(counts) // window)
    owner = chunk_of(counts)
    start = 0
    for k in range(perm.num_windows):
        chunks = perm.window_chunks(k)
        assert len(chunks) <= window
        size = int(np.asarray(counts, dtype=np.int64)[chunks].sum())
        # Window k holds the next `size` positions, and they are exactly its chunks' records.
        got = values[start : start + size]
        expected = np.flatnonzero(np.isin(owner, chunks))
        np.testing.assert_array_equal(np.sort(got), expected)
        if size:
            assert set(perm.window_of(np.arange(start, start + size)).tolist()) == {k}
        start += size
    assert start == n
    assert [perm[i] for i in range(0, n, 7)] == values[::7].tolist()  # scalar == vector


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(1, 40), max_size=30), window=windows, seed=seeds)
def test_a_reader_spans_at_most_two_windows_of_chunks_at_a_time(
    counts: list[int], window: int, seed: int
) -> None:
    # What bounds the working set: any run of consecutive positions no longer than a window
    # touches the chunks of at most two consecutive windows, 2 * W chunks (every window but
    # the last has W chunks of at least `smallest` records).
    owner = chunk_of(counts)
    values = whole(WindowPermutation(counts, window, seed))
    smallest = min((c for c in counts if c), default=0)
    span = max(window * smallest, 1)
    for begin in range(0, len(values), max(span // 2, 1)):
        assert len(set(owner[values[begin : begin + span]].tolist())) <= 2 * window


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(1, 40), min_size=2, max_size=30), seed=seeds)
def test_epochs_seeds_and_windows_give_different_orders(counts: list[int], seed: int) -> None:
    first = whole(WindowPermutation(counts, 2, seed, 0))
    if sum(counts) < 8:
        return  # too few records for orders to differ surely
    assert not np.array_equal(first, whole(WindowPermutation(counts, 2, seed, 1)))
    assert not np.array_equal(first, whole(WindowPermutation(counts, 2, seed + 1, 0)))
    assert not np.array_equal(first, whole(WindowPermutation(counts, 3, seed, 0)))


def test_the_window_order_is_not_the_full_shuffle_even_in_one_window() -> None:
    counts = [100, 100, 37]
    one_window = whole(WindowPermutation(counts, 3, seed=5))
    np.testing.assert_array_equal(np.sort(one_window), np.arange(237))
    full = Permutation(237, seed=5).indices(np.arange(237))
    assert not np.array_equal(one_window, full)  # another order, with its own keys


def test_a_window_of_one_chunk_keeps_each_chunk_together_and_mixes_within() -> None:
    counts = [50] * 20
    values = whole(WindowPermutation(counts, 1, seed=3))
    owner = chunk_of(counts)[values]
    runs = owner.reshape(20, 50)
    assert (runs == runs[:, :1]).all()  # each chunk's records together
    assert sorted(runs[:, 0].tolist()) == list(range(20))
    assert not np.array_equal(values, np.sort(values))  # in another order than storage


def test_records_are_mixed_within_each_window() -> None:
    # Windows of 500 records (the network) and of 40 (a table): within each window, place and
    # record are uncorrelated, neighbours too, and no two windows share an order.
    for size in (500, 40):
        counts = [size] * 200
        values = whole(WindowPermutation(counts, 1, seed=11, epoch=2))
        local = (values % size).reshape(200, size)  # each window is one chunk here
        place = np.arange(size)
        r_place = [np.corrcoef(place, row)[0, 1] for row in local]
        r_next = [np.corrcoef(row[:-1], row[1:])[0, 1] for row in local]
        # (neighbours in a uniform order of n correlate by -1/(n-1) on average: no repeats)
        assert abs(np.mean(r_place)) < 0.04
        assert abs(np.mean(r_next) + 1 / (size - 1)) < 0.04
        assert len({row.tobytes() for row in local}) == 200
        # and each record's place is spread evenly over the window (chi-square, 9 dof)
        deciles = np.bincount((np.argsort(local, axis=1)[:, 0] * 10) // size, minlength=10)
        assert float(((deciles - 20.0) ** 2 / 20.0).sum()) < 30.0


def test_windowed_orders_are_pinned_across_versions() -> None:
    # Checkpoints store (seed, window, offset) only: if these change, resuming a run made with
    # an older version silently repeats and skips records. Change them only with a format bump.
    perm = WindowPermutation([5, 7, 0, 3, 9, 1], 2, seed=3, epoch=1)
    assert perm.chunk_order.tolist() == [2, 3, 4, 5, 1, 0]
    assert whole(perm).tolist() == [
        14, 12, 13, 18, 20, 17, 23, 22, 21, 19, 24, 15, 16, 5, 3, 0, 11, 1, 8, 4, 10, 9, 7, 6, 2,
    ]  # fmt: skip
    # Windows of more than 64 records take the network instead of a table.
    mid = WindowPermutation([300, 200, 40, 500], 2, seed=8, epoch=3)
    assert mid.chunk_order.tolist() == [3, 2, 1, 0]
    assert mid.indices(np.arange(0, 1040, 130)).tolist() == [
        521, 556, 747, 886, 774, 298, 327, 219,
    ]  # fmt: skip
    big = ShardByRecords(
        10**9, shuffle=True, shuffle_seed=3, shuffle_window=4, chunk_records=[10**5] * 10**4
    )
    assert big.indices(5, 0, 4).tolist() == [298266319, 298296993, 926535657, 298234382]


def test_memory_is_per_chunk_never_per_record() -> None:
    # A billion records in 10,000 chunks: an epoch costs the chunk arrays (a few hundred KB),
    # never an array per record, wherever it is read.
    counts = [10**5] * 10**4
    tracemalloc.start()
    try:
        order = ShardByRecords(
            10**9, shuffle=True, shuffle_seed=3, shuffle_window=4, chunk_records=counts
        )
        first = order.indices(5, 0, 1000)
        far = order.indices(5, 9 * 10**8, 9 * 10**8 + 1000)
        order.index(7, 123_456_789)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3_000_000
    assert len(np.unique(first)) == len(np.unique(far)) == 1000
    assert not set(first.tolist()) & set(far.tolist())


# --- the order: shards, resume, elastic ----------------------------------------------------


@st.composite
def window_orders(draw: st.DrawFn) -> dict[str, Any]:
    counts = draw(layouts)
    num_shards = draw(st.integers(1, 6))
    return {
        "num_records": sum(counts),
        "chunk_records": counts,
        "shuffle": True,
        "shuffle_seed": draw(seeds),
        "shuffle_window": draw(windows),
        "num_shards": num_shards,
        "shard_rank": draw(st.integers(0, num_shards - 1)),
        "drop_shard_remainder": draw(st.booleans()),
        "skip_shuffle_at_epoch_end": draw(st.booleans()),
    }


@settings(max_examples=150, deadline=None)
@given(args=window_orders(), epoch=st.integers(0, 50))
def test_shards_are_disjoint_and_cover_the_cut_windowed_order(
    args: dict[str, Any], epoch: int
) -> None:
    n, shards = args["num_records"], args["num_shards"]
    key_epoch = 0 if args["skip_shuffle_at_epoch_end"] else epoch
    full = whole(WindowPermutation(args["chunk_records"], args["shuffle_window"],
                                   args["shuffle_seed"], key_epoch))  # fmt: skip
    cut = full[: n - n % shards] if args["drop_shard_remainder"] else full
    got = []
    for rank in range(shards):
        order = ShardByRecords(**{**args, "shard_rank": rank})
        shard = order.indices(epoch, 0, order.shard_length)
        np.testing.assert_array_equal(shard, cut[rank::shards])
        if len(shard):
            k = len(shard) // 2
            assert order.index(epoch, k) == shard[k]
            np.testing.assert_array_equal(order.indices(epoch, k, len(shard)), shard[k:])
        got.append(shard)
    together = np.concatenate(got)
    assert len(np.unique(together)) == len(together)
    np.testing.assert_array_equal(np.sort(together), np.sort(cut))


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    shards=st.integers(1, 4),
    window=windows,
    seed=st.integers(0, 2**40),
    epoch=st.integers(0, 3),
)
def test_chunk_shards_shuffle_their_own_chunks_in_windows(
    counts: list[int], shards: int, window: int, seed: int, epoch: int
) -> None:
    if len(counts) < shards:
        return
    owner = chunk_of(counts)
    seen = []
    for rank in range(shards):
        order = ShardByChunks(
            counts, shuffle=True, shuffle_seed=seed, shuffle_window=window, shard_rank=rank,
            num_shards=shards,
        )  # fmt: skip
        got = order.indices(epoch, 0, order.shard_length)
        mine = list(range(rank, len(counts), shards))
        assert set(owner[got].tolist()) <= set(mine)
        # The shard's windowed order over its own chunks, mapped to the version's records.
        perm = order.window_permutation(epoch)
        assert perm is not None and perm.n == len(got)
        local = whole(perm)
        mine_records = np.flatnonzero(np.isin(owner, mine))
        np.testing.assert_array_equal(got, mine_records[local])
        seen += got.tolist()
    assert sorted(seen) == list(range(sum(counts)))


def test_skip_shuffle_at_epoch_end_reuses_epoch_zeros_windowed_order() -> None:
    args = {"shuffle": True, "shuffle_seed": 4, "shuffle_window": 3, "chunk_records": [10] * 9}
    order = ShardByRecords(90, skip_shuffle_at_epoch_end=True, **args)
    epoch0 = order.indices(0, 0, 90)
    for epoch in (1, 2, 10**6):
        np.testing.assert_array_equal(order.indices(epoch, 0, 90), epoch0)
    moving = ShardByRecords(90, **args)
    np.testing.assert_array_equal(moving.indices(0, 0, 90), epoch0)
    assert not np.array_equal(moving.indices(1, 0, 90), epoch0)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    window=windows,
    shards=st.integers(1, 3),
    drop=st.booleans(),
    offset=st.integers(0, 3 * N),
    batch=st.none() | st.integers(1, 50),
)
def test_resume_from_any_offset_is_the_tail_of_a_full_run(
    ref: ydl.DataRef, window: int, shards: int, drop: bool, offset: int, batch: int | None
) -> None:
    args = dict(shuffle=True, shuffle_seed=11, shuffle_window=window, num_shards=shards,
                shard_rank=shards - 1, drop_shard_remainder=drop)  # fmt: skip
    stream = ref.stream(**args)
    run = [i for _ in range(4) for i in ids(stream)]  # four whole epochs, from the start
    resumed = ref.stream(start_offset=offset, batch_size=batch, **args)
    epoch, _ = resumed.next_epoch_position
    tail = []
    for _ in range(4 - epoch):
        for item in resumed:
            tail += [int(i) for i in item["i"]] if batch else [int(item["i"])]
    assert tail == run[offset:]


def test_each_stream_epoch_is_a_permutation_that_moves_window_by_window(
    ref: ydl.DataRef,
) -> None:
    counts = [c.records for c in ref.manifest.chunks]
    owner = chunk_of(counts)
    stream = ref.stream(shuffle=True, shuffle_seed=2, shuffle_window=3)
    epochs = [ids(stream) for _ in range(3)]
    for epoch, got in enumerate(epochs):
        assert sorted(got) == list(range(N))
        perm = stream.plan().order.window_permutation(epoch)
        assert perm is not None
        start = 0
        for k in range(perm.num_windows):
            chunks = set(perm.window_chunks(k).tolist())
            size = sum(counts[c] for c in chunks)
            assert set(owner[got[start : start + size]].tolist()) == chunks
            start += size
    assert epochs[0] != epochs[1] != epochs[2]
    assert stream.plan().order.window_permutation(0) is not None
    assert ref.stream(shuffle=True, shuffle_seed=2).plan().order.window_permutation(0) is None


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shards=st.integers(1, 5),
    new_shards=st.integers(1, 5),
    steps=st.integers(0, N // 5),
    drop=st.booleans(),
    window=windows,
)
def test_elastic_rescale_loses_and_repeats_nothing(
    ref: ydl.DataRef, shards: int, new_shards: int, steps: int, drop: bool, window: int
) -> None:
    args = dict(shuffle=True, shuffle_seed=7, shuffle_window=window, drop_shard_remainder=drop)
    ranks = [ref.stream(num_shards=shards, shard_rank=r, **args) for r in range(shards)]
    steps = min(steps, ranks[-1].plan().positions_per_epoch)
    iters = [iter(s) for s in ranks]
    seen = [int(next(it)["i"]) for _ in range(steps) for it in iters]
    checkpoint = ranks[0].global_offset
    assert {r.global_offset for r in ranks} == {checkpoint}
    rest = [
        int(r["i"])
        for k in range(new_shards)
        for r in ref.stream(num_shards=new_shards, shard_rank=k, global_start=checkpoint, **args)
    ]
    # The global order (one shard, nothing cut) of each epoch: the S ranks handed out its
    # first S * steps records, the S' ranks hand out the rest (cut to rounds of S' with drop).
    one = ref.stream(shuffle=True, shuffle_seed=7, shuffle_window=window).plan().order
    assert sorted(seen) == sorted(one.indices(0, 0, shards * steps).tolist())
    epoch, start = divmod(checkpoint, N)
    end = start + (N - start) // new_shards * new_shards if drop else N
    assert sorted(rest) == sorted(one.indices(epoch, start, end).tolist())
    if epoch == 0:
        assert not set(seen) & set(rest)


def test_same_order_in_a_fresh_process() -> None:
    code = (
        "import json, sys\n"
        "from yogadl_plus.order import ShardByRecords\n"
        "orders = [ShardByRecords(1000, shuffle=True, shuffle_seed=s, shuffle_window=w,\n"
        "                         num_shards=3, shard_rank=1,\n"
        "                         chunk_records=[90] * 11 + [10]).indices(e, 0, 300)\n"
        "          .tolist() for s in (0, 2**65) for w in (1, 4) for e in (0, 7)]\n"
        "json.dump(orders, sys.stdout)\n"
    )
    here = [
        ShardByRecords(1000, shuffle=True, shuffle_seed=s, shuffle_window=w, num_shards=3,
                       shard_rank=1, chunk_records=[90] * 11 + [10]).indices(e, 0, 300).tolist()
        for s in (0, 2**65) for w in (1, 4) for e in (0, 7)
    ]  # fmt: skip
    # A different hash salt: the order must not depend on Python's per-process hash().
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    assert json.loads(result.stdout) == here


# --- n-grams --------------------------------------------------------------------------------


def test_ngram_windows_are_grouped_by_their_anchor_records_chunk(ref: ydl.DataRef) -> None:
    gram = ydl.NGram({0: ["i"], 1: ["i"]}, delta_threshold=1, timestamp_field="t")
    anchors = gram.anchors(ref)
    counts = [c.records for c in ref.manifest.chunks]
    owner = chunk_of(counts)
    stream = ref.stream(ngram=gram, shuffle=True, shuffle_seed=5, shuffle_window=2)
    got = [int(w[0]["i"]) for w in stream]
    assert sorted(got) == anchors.tolist()  # each window once
    perm = stream.plan().order.window_permutation(0)
    assert perm is not None and perm.n == len(anchors)
    start = 0
    for k in range(perm.num_windows):
        chunks = set(perm.window_chunks(k).tolist())
        size = int(np.isin(owner[anchors], list(chunks)).sum())
        assert set(owner[got[start : start + size]].tolist()) <= chunks
        start += size
    resumed = ref.stream(ngram=gram, shuffle=True, shuffle_seed=5, shuffle_window=2,
                         start_offset=17)  # fmt: skip
    assert [int(w[0]["i"]) for w in resumed] == got[17:]


# --- arguments, states ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shuffle_window": 0}, r"shuffle_window must be in \[1, inf\), got 0"),
        ({"shuffle_window": -3}, "-3"),
        ({"shuffle_window": 1.5}, "shuffle_window must be an int.*1.5"),
        ({"shuffle_window": True}, "shuffle_window must be an int.*bool True"),
        ({"shuffle_window": "4"}, "shuffle_window must be an int.*'4'"),
        ({"shuffle": False, "shuffle_window": 4}, "needs shuffle=True"),
    ],
)
def test_bad_windows_are_value_errors_naming_the_argument(
    ref: ydl.DataRef, kwargs: dict[str, Any], message: str
) -> None:
    args = {"shuffle": True, "shuffle_seed": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        ref.stream(**args)
    with pytest.raises(ValueError, match=message):
        OrderSettings(
            shuffle=args["shuffle"], shuffle_seed=1, shuffle_window=kwargs["shuffle_window"]
        )


def test_orders_need_and_check_the_chunk_counts() -> None:
    with pytest.raises(ValueError, match="chunk_records"):
        ShardByRecords(10, shuffle=True, shuffle_seed=1, shuffle_window=2)
    with pytest.raises(ValueError, match="adding up to num_records=10"):
        ShardByRecords(10, shuffle=True, shuffle_seed=1, shuffle_window=2, chunk_records=[5, 4])
    with pytest.raises(ValueError, match="chunk_records must be >= 0"):
        WindowPermutation([5, -1], 2, seed=1)
    with pytest.raises(ValueError, match="1-d sequence of ints"):
        WindowPermutation([[1, 2]], 2, seed=1)
    with pytest.raises(IndexError, match=r"9.*\[0, 8\]"):
        WindowPermutation([4, 5], 1, seed=1)[9]
    assert whole(WindowPermutation([], 3, seed=1)).tolist() == []
    text = repr(
        ShardByRecords(10, shuffle=True, shuffle_seed=1, shuffle_window=2, chunk_records=[5, 5])
    )
    assert "shuffle_window=2" in text


def test_replace_changes_or_keeps_the_window(ref: ydl.DataRef) -> None:
    stream = ref.stream(shuffle=True, shuffle_seed=3, shuffle_window=2)
    assert ids(stream.replace(start_offset=5)) == ids(stream)[5:]
    assert stream.replace(start_offset=5).plan().order.settings.shuffle_window == 2
    full = stream.replace(shuffle_window=None)
    assert ids(full) == ids(ref.stream(shuffle=True, shuffle_seed=3))


def test_a_state_with_another_window_is_refused(ref: ydl.DataRef) -> None:
    stream = ref.stream(shuffle=True, shuffle_seed=3, shuffle_window=2)
    it = iter(stream)
    [next(it) for _ in range(5)]
    saved = json.loads(json.dumps(stream.state().to_dict()))
    assert saved["order"]["shuffle_window"] == 2
    with pytest.raises(ValueError, match="shuffle_window: saved 2, this stream 3"):
        ref.stream(shuffle=True, shuffle_seed=3, shuffle_window=3).load_state(saved)
    with pytest.raises(ValueError, match="shuffle_window: saved 2, this stream None"):
        ref.stream(shuffle=True, shuffle_seed=3).load_state(saved)
    resumed = ref.stream(shuffle=True, shuffle_seed=3, shuffle_window=2, batch_size=8)
    resumed.load_state(saved)
    assert [int(i) for b in resumed for i in b["i"]] == ids(stream.replace(start_offset=5))
    full = ref.stream(shuffle=True, shuffle_seed=3).state().to_dict()
    with pytest.raises(ValueError, match="shuffle_window: saved None, this stream 2"):
        ref.stream(shuffle=True, shuffle_seed=3, shuffle_window=2).load_state(full)
