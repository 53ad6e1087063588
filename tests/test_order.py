"""Tests of yogadl_plus.order: the stream order as a pure function of (epoch, position)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yogadl_plus.order import Permutation, ShardByChunks, ShardByRecords

REPO_ROOT = Path(__file__).resolve().parents[1]

seeds = st.integers(min_value=0, max_value=2**70)
epochs = st.integers(min_value=0, max_value=10**9)


def global_order(num_records: int, shuffle: bool, seed: int | None, epoch: int) -> np.ndarray:
    """The whole global order of an epoch, built the slow, obvious way."""
    if not shuffle:
        return np.arange(num_records, dtype=np.int64)
    assert seed is not None
    return Permutation(num_records, seed, epoch).indices(np.arange(num_records))


def correlation(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(x.astype(np.float64), y.astype(np.float64))[0, 1])


# --- Permutation ----------------------------------------------------------------------------


@settings(deadline=None)
@given(n=st.integers(min_value=0, max_value=3000), seed=seeds, epoch=epochs)
def test_permutation_is_a_bijection_and_scalar_matches_vector(
    n: int, seed: int, epoch: int
) -> None:
    p = Permutation(n, seed, epoch)
    values = p.indices(np.arange(n))
    assert len(p) == n
    assert values.dtype == np.int64
    assert values.shape == (n,)
    np.testing.assert_array_equal(np.sort(values), np.arange(n))
    assert [p[i] for i in range(n)] == values.tolist()


@pytest.mark.parametrize("n", [2**63, 2**63 - 1, 10**18 + 7, 4**15 + 1, 10**9])
def test_permutation_of_huge_domains_stays_in_range(n: int) -> None:
    p = Permutation(n, seed=11, epoch=2)
    positions = np.concatenate(
        [np.arange(500), n - 1 - np.arange(500), np.arange(500) * (n // 500)]
    ).astype(np.int64)
    values = p.indices(positions)
    assert values.min() >= 0
    assert values.max() < n
    assert len(np.unique(values)) == len(np.unique(positions))
    assert [p[int(i)] for i in positions[::50]] == values[::50].tolist()


def test_permutation_spanning_many_chunks_matches_scalar_path() -> None:
    n = 50_001  # several numpy work slices, and a cycle walk in most of them
    p = Permutation(n, seed=5, epoch=1)
    values = p.indices(np.arange(n))
    np.testing.assert_array_equal(np.sort(values), np.arange(n))
    sample = np.arange(0, n, 97)
    assert [p[int(i)] for i in sample] == values[sample].tolist()


def test_permutation_indices_keep_shape_and_accept_any_int_dtype() -> None:
    p = Permutation(1000, seed=4)
    positions = np.array([[3, 999, 0], [500, 1, 42]], dtype=np.int32)
    values = p.indices(positions)
    assert values.shape == (2, 3)
    assert values.dtype == np.int64
    assert values.tolist() == [[p[int(i)] for i in row] for row in positions]
    assert p.indices(np.array([], dtype=np.int64)).shape == (0,)
    assert p.indices([7, 8]).tolist() == [p[7], p[8]]


def test_permutation_trivial_sizes() -> None:
    assert Permutation(1, seed=9)[0] == 0
    assert Permutation(1, seed=9).indices(np.zeros(3, dtype=np.int64)).tolist() == [0, 0, 0]
    empty = Permutation(0, seed=9)
    assert len(empty) == 0
    assert empty.indices(np.arange(0)).shape == (0,)
    with pytest.raises(IndexError, match="0"):
        empty[0]
    assert sorted(Permutation(2, seed=9).indices(np.arange(2)).tolist()) == [0, 1]


@pytest.mark.parametrize("bad", [-1, 10, 2**40])
def test_permutation_rejects_out_of_range_positions(bad: int) -> None:
    p = Permutation(10, seed=1)
    with pytest.raises(IndexError, match=rf"{bad}.*\[0, 9\]"):
        p[bad]
    with pytest.raises(IndexError, match=rf"{bad}.*\[0, 9\]"):
        p.indices(np.array([0, 3, bad, 2]))


def test_permutation_rejects_non_integer_positions() -> None:
    with pytest.raises(TypeError, match="float64"):
        Permutation(10, seed=1).indices(np.array([1.0, 2.0]))


def test_permutation_construction_is_constant_time() -> None:
    begin = time.perf_counter()
    for seed in range(100):
        Permutation(10**18, seed=seed, epoch=seed)
    assert (time.perf_counter() - begin) / 100 < 1e-3


def test_permutation_repr_shows_the_arguments() -> None:
    assert repr(Permutation(12, seed=34, epoch=5)) == "Permutation(n=12, seed=34, epoch=5)"


@pytest.mark.parametrize(
    ("kwargs", "value"),
    [
        ({"n": -1, "seed": 0}, "-1"),
        ({"n": 2**63 + 1, "seed": 0}, str(2**63 + 1)),
        ({"n": 5, "seed": -7}, "-7"),
        ({"n": 5, "seed": 1, "epoch": -2}, "-2"),
        ({"n": 5, "seed": 1.5}, "1.5"),
        ({"n": True, "seed": 1}, "True"),
    ],
)
def test_permutation_rejects_bad_arguments(kwargs: dict[str, Any], value: str) -> None:
    with pytest.raises(ValueError, match=re.escape(value)):
        Permutation(**kwargs)


# --- Determinism ----------------------------------------------------------------------------

CONFIGS = [
    {"num_records": 1000, "shuffle": True, "shuffle_seed": 0},
    {
        "num_records": 1000,
        "shuffle": True,
        "shuffle_seed": 2**64 + 3,
        "num_shards": 3,
        "shard_rank": 2,
    },
    {
        "num_records": 777,
        "shuffle": True,
        "shuffle_seed": 9,
        "num_shards": 4,
        "shard_rank": 1,
        "drop_shard_remainder": True,
    },
    {"num_records": 10**12, "shuffle": True, "shuffle_seed": 123456789},
    {"num_records": 50, "shuffle": True, "shuffle_seed": 5, "skip_shuffle_at_epoch_end": True},
]


ORDERS_OF = """
import json, sys
from yogadl_plus.order import ShardByRecords

def orders_of(configs):
    return [
        [ShardByRecords(**c).indices(epoch, 0, 200).tolist() for epoch in (0, 1, 10**6)]
        for c in configs
    ]
"""


def test_same_arguments_give_the_same_order_in_a_fresh_process() -> None:
    namespace: dict[str, Any] = {}
    exec(ORDERS_OF, namespace)
    here = namespace["orders_of"](CONFIGS)
    assert here == namespace["orders_of"](CONFIGS)
    code = ORDERS_OF + "json.dump(orders_of(json.loads(sys.argv[1])), sys.stdout)\n"
    # A different hash salt: the order must not depend on Python's per-process hash().
    env = {**os.environ, "PYTHONHASHSEED": "987654321"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(CONFIGS)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(result.stdout) == here


def test_orders_are_pinned_across_versions() -> None:
    # Checkpoints store (seed, offset) only: if these values change, resuming a run made with
    # an older version silently repeats and skips records. Change them only with a format bump.
    assert Permutation(10, seed=0).indices(np.arange(10)).tolist() == [6, 4, 3, 7, 0, 1, 8, 5, 9, 2]
    other_key = Permutation(10, seed=2**64 + 5, epoch=7)
    assert other_key.indices(np.arange(10)).tolist() == [7, 8, 2, 1, 0, 6, 4, 5, 3, 9]
    billion = ShardByRecords(10**9, shuffle=True, shuffle_seed=3)
    assert billion.indices(5, 0, 5).tolist() == [
        407688921,
        881758441,
        18353014,
        546562339,
        210816084,
    ]
    order = ShardByRecords(
        1000,
        shuffle=True,
        shuffle_seed=12345,
        num_shards=3,
        shard_rank=1,
        drop_shard_remainder=True,
    )
    assert order.indices(2, 10, 16).tolist() == [604, 763, 892, 167, 738, 92]


@settings(deadline=None, derandomize=True)
@given(n=st.integers(min_value=10, max_value=3000), seed=seeds, epoch=epochs)
def test_epochs_and_seeds_give_different_orders(n: int, seed: int, epoch: int) -> None:
    positions = np.arange(n)
    first = Permutation(n, seed, epoch).indices(positions)
    assert not np.array_equal(first, Permutation(n, seed, epoch + 1).indices(positions))
    assert not np.array_equal(first, Permutation(n, seed + 1, epoch).indices(positions))
    shuffled = ShardByRecords(n, shuffle=True, shuffle_seed=seed)
    assert not np.array_equal(shuffled.indices(0, 0, n), shuffled.indices(1, 0, n))


@settings(deadline=None)
@given(n=st.integers(min_value=0, max_value=3000), seed=seeds, epoch=epochs)
def test_skip_shuffle_at_epoch_end_reuses_epoch_zero(n: int, seed: int, epoch: int) -> None:
    order = ShardByRecords(n, shuffle=True, shuffle_seed=seed, skip_shuffle_at_epoch_end=True)
    expected = Permutation(n, seed, 0).indices(np.arange(n))
    np.testing.assert_array_equal(order.indices(epoch, 0, n), expected)
    np.testing.assert_array_equal(order.indices(0, 0, n), expected)


def test_switching_epochs_back_and_forth_gives_each_epochs_order() -> None:
    order = ShardByRecords(500, shuffle=True, shuffle_seed=8)
    for epoch in [3, 4, 3, 0, 4, 4, 9, 3]:
        np.testing.assert_array_equal(
            order.indices(epoch, 0, 500), global_order(500, True, 8, epoch)
        )
        assert order.index(epoch, 17) == global_order(500, True, 8, epoch)[17]


# --- Sharding -------------------------------------------------------------------------------


@st.composite
def order_arguments(draw: st.DrawFn) -> dict[str, Any]:
    num_shards = draw(st.integers(min_value=1, max_value=12))
    shuffle = draw(st.booleans())
    remainder = draw(st.sampled_from(["keep", "drop", "pad"]))
    return {
        "num_records": draw(st.integers(min_value=0, max_value=3000)),
        "shuffle": shuffle,
        "shuffle_seed": draw(seeds) if shuffle else draw(st.none() | seeds),
        "num_shards": num_shards,
        "shard_rank": draw(st.integers(min_value=0, max_value=num_shards - 1)),
        "drop_shard_remainder": remainder == "drop",
        "pad_shard_remainder": remainder == "pad",
    }


@settings(deadline=None)
@given(args=order_arguments(), epoch=epochs)
def test_shards_are_disjoint_and_cover_the_cut_global_order(
    args: dict[str, Any], epoch: int
) -> None:
    n, num_shards = args["num_records"], args["num_shards"]
    full = global_order(n, args["shuffle"], args["shuffle_seed"], epoch)
    drop, pad = args["drop_shard_remainder"], args["pad_shard_remainder"]
    cut = full[: n - n % num_shards] if drop else full
    if pad:  # wrapped around to the order's start, as DistributedSampler pads
        cut = np.resize(full, -(-n // num_shards) * num_shards)

    shards = []
    for rank in range(num_shards):
        order = ShardByRecords(**{**args, "shard_rank": rank})
        shard = order.indices(epoch, 0, order.shard_length)
        assert order.num_records == n
        assert order.global_length == len(cut)
        assert order.shard_length == len(range(rank, len(cut), num_shards)) == len(shard)
        assert shard.dtype == np.int64
        np.testing.assert_array_equal(shard, cut[rank::num_shards])
        np.testing.assert_array_equal(order.indices(epoch, -3, order.shard_length + 5), shard)
        for position in {0, order.shard_length // 2, order.shard_length - 1} if shard.size else ():
            assert order.index(epoch, position) == shard[position]
            assert order.global_position(position) == rank + num_shards * position
        shards.append(shard)

    together = np.concatenate(shards)
    if not pad:
        assert len(np.unique(together)) == len(together)  # pairwise disjoint
    np.testing.assert_array_equal(np.sort(together), np.sort(cut))
    lengths = {len(shard) for shard in shards}
    assert len(lengths) == 1 if drop or pad else max(lengths) - min(lengths) <= 1
    assert ShardByRecords(**args).shard_lengths(epoch) == [len(shard) for shard in shards]


@settings(deadline=None)
@given(
    args=order_arguments(),
    epoch=epochs,
    start=st.integers(min_value=-10, max_value=3100),
    stop=st.integers(min_value=-10, max_value=3100),
)
def test_a_slice_equals_slicing_the_whole_epoch(
    args: dict[str, Any], epoch: int, start: int, stop: int
) -> None:
    order = ShardByRecords(**args)
    whole = order.indices(epoch, 0, order.shard_length)
    length = order.shard_length
    lo, hi = min(max(start, 0), length), min(max(stop, 0), length)
    np.testing.assert_array_equal(order.indices(epoch, start, stop), whole[lo:hi])
    if 0 <= start < length:
        assert order.index(epoch, start) == whole[start]


def test_drop_shard_remainder_drops_other_records_each_shuffled_epoch() -> None:
    def dropped(order: ShardByRecords, epoch: int) -> set[int]:
        shards = [
            ShardByRecords(
                103,
                shuffle=order.settings.shuffle,
                shuffle_seed=order.shuffle_seed,
                num_shards=10,
                shard_rank=rank,
                drop_shard_remainder=True,
            )
            for rank in range(10)
        ]
        kept = np.concatenate([shard.indices(epoch, 0, 10) for shard in shards])
        return set(range(103)) - set(kept.tolist())

    shuffled = ShardByRecords(
        103, shuffle=True, shuffle_seed=1, num_shards=10, drop_shard_remainder=True
    )
    assert len(dropped(shuffled, 0)) == 3
    assert dropped(shuffled, 0) != dropped(shuffled, 1)
    plain = ShardByRecords(103, num_shards=10, drop_shard_remainder=True)
    assert dropped(plain, 0) == dropped(plain, 1) == {100, 101, 102}


def test_unshuffled_order_is_the_identity() -> None:
    order = ShardByRecords(10, shuffle_seed=5, num_shards=3, shard_rank=1)
    assert order.indices(7, 0, 10).tolist() == [1, 4, 7]
    assert order.index(0, 2) == 7


def test_repr_shows_the_arguments() -> None:
    text = repr(ShardByRecords(10, shuffle=True, shuffle_seed=5, num_shards=3, shard_rank=1))
    assert text.startswith("ShardByRecords(")
    for part in [
        "num_records=10",
        "shuffle=True",
        "seed=5",
        "shard_rank=1",
        "num_shards=3",
        "skip_shuffle_at_epoch_end=False",
        "drop_shard_remainder=False",
    ]:
        assert part in text


# --- Scale: cost and memory independent of N, epoch and position -----------------------------


def test_tracemalloc_sees_numpy_buffers() -> None:
    # The flat-memory test below is only meaningful if numpy reports its buffers.
    tracemalloc.start()
    try:
        buffer = np.ones(1_000_000, dtype=np.int64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert buffer.nbytes == 8_000_000
    assert peak >= 8_000_000


def test_a_billion_records_cost_no_more_than_a_thousand() -> None:
    begin = time.perf_counter()
    order = ShardByRecords(10**9, shuffle=True, shuffle_seed=3)
    first = order.indices(5, 0, 1000)
    assert time.perf_counter() - begin < 0.05

    begin = time.perf_counter()
    far = order.indices(5, 9 * 10**8, 9 * 10**8 + 1000)
    assert time.perf_counter() - begin < 0.05

    begin = time.perf_counter()
    order.indices(10**6, 10**8, 10**8 + 1000)
    assert time.perf_counter() - begin < 0.05

    for values in (first, far):
        assert len(values) == 1000
        assert len(np.unique(values)) == 1000
        assert values.min() >= 0 and values.max() < 10**9
    assert not set(first.tolist()) & set(far.tolist())

    tracemalloc.start()
    try:
        order = ShardByRecords(10**9, shuffle=True, shuffle_seed=3)
        order.indices(5, 0, 1000)
        order.indices(5, 9 * 10**8, 9 * 10**8 + 1000)
        order.index(7, 123_456_789)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


# --- Statistical mixing (fixed seeds: deterministic, bounds far from the observed values) ----

N_STATS = 100_000


@pytest.fixture(scope="module")
def big_orders() -> dict[int, np.ndarray]:
    return {seed: Permutation(N_STATS, seed).indices(np.arange(N_STATS)) for seed in (1, 2, 3)}


def test_position_and_index_are_uncorrelated(big_orders: dict[int, np.ndarray]) -> None:
    # Identity gives r = 1, most rotations |r| >> 0.02; 1/sqrt(N) = 0.003 for a random order.
    for values in big_orders.values():
        assert abs(correlation(np.arange(N_STATS), values)) < 0.02


def test_adjacent_positions_are_uncorrelated(big_orders: dict[int, np.ndarray]) -> None:
    # Identity and rotations give r close to 1.
    for values in big_orders.values():
        assert abs(correlation(values[:-1], values[1:])) < 0.02


def test_orders_of_different_seeds_are_uncorrelated(big_orders: dict[int, np.ndarray]) -> None:
    assert abs(correlation(big_orders[1], big_orders[2])) < 0.02
    assert abs(correlation(big_orders[2], big_orders[3])) < 0.02


def test_steps_between_adjacent_positions_vary(big_orders: dict[int, np.ndarray]) -> None:
    # (a * i + b) % n can dodge the correlation tests, but all its steps are a. A random order
    # has ~1980 distinct steps among 2000.
    for values in big_orders.values():
        steps = np.diff(values[:2001]) % N_STATS
        assert len(np.unique(steps)) > 1900


@pytest.mark.parametrize("vary", ["seed", "epoch"])
def test_first_index_is_uniform_over_seeds_and_epochs(vary: str) -> None:
    keys = range(2000)
    firsts = [
        Permutation(10, seed=key, epoch=0)[0] if vary == "seed" else Permutation(10, 77, key)[0]
        for key in keys
    ]
    counts = np.bincount(firsts, minlength=10)
    chi_square = float(((counts - 200.0) ** 2 / 200.0).sum())
    assert chi_square < 45.0  # P(chi2 with 9 dof > 45) < 1e-6


# --- Validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "value"),
    [
        ({"num_records": -1}, "-1"),
        ({"num_records": 2.0}, "2.0"),
        ({"num_records": 10, "num_shards": 0}, "0"),
        ({"num_records": 10, "num_shards": -2}, "-2"),
        ({"num_records": 10, "num_shards": 2.5}, "2.5"),
        ({"num_records": 10, "num_shards": "2"}, "'2'"),
        ({"num_records": 10, "num_shards": True}, "True"),
        ({"num_records": 10, "num_shards": 4, "shard_rank": 4}, "4"),
        ({"num_records": 10, "num_shards": 4, "shard_rank": -1}, "-1"),
        ({"num_records": 10, "shuffle": True}, "None"),
        ({"num_records": 10, "shuffle": True, "shuffle_seed": -5}, "-5"),
        ({"num_records": 10, "shuffle_seed": -5}, "-5"),
        ({"num_records": 10, "shuffle": "yes", "shuffle_seed": 1}, "'yes'"),
    ],
)
def test_bad_arguments_raise_value_error_quoting_the_value(
    kwargs: dict[str, Any], value: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(value)) as info:
        ShardByRecords(**kwargs)
    if "shard_rank" in kwargs:
        assert "[0, 3]" in str(info.value)


def test_missing_seed_message_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="shuffle_seed"):
        ShardByRecords(10, shuffle=True)


def test_bad_epoch_and_position_are_rejected() -> None:
    order = ShardByRecords(10, shuffle=True, shuffle_seed=1, num_shards=3, shard_rank=0)
    with pytest.raises(ValueError, match="-1"):
        order.indices(-1, 0, 2)
    with pytest.raises(ValueError, match="-1"):
        order.index(-1, 0)
    with pytest.raises(IndexError, match=r"4.*\[0, 3\]"):
        order.index(0, 4)
    with pytest.raises(IndexError, match="-1"):
        order.index(0, -1)
    with pytest.raises(ValueError, match="-2"):
        order.global_position(-2)


@pytest.mark.parametrize("n", [3, 5])
def test_small_orders_are_uniform_as_whole_permutations(n: int) -> None:
    # Each of the n! orders should come up equally often over seeds (a Feistel network over a
    # tiny domain reaches only some of them: n = 5 gave chi-square ~1200 with 119 dof).
    import itertools
    import math

    runs = 200 * math.factorial(n)
    seen = Counter(
        tuple(Permutation(n, seed=s).indices(np.arange(n)).tolist()) for s in range(runs)
    )
    assert set(seen) == set(itertools.permutations(range(n)))
    chi_square = sum((c - 200.0) ** 2 / 200.0 for c in seen.values())
    dof = math.factorial(n) - 1
    assert chi_square < dof + 6 * math.sqrt(2 * dof) + 10  # far out in the tail of chi2(dof)


def test_table_and_network_sizes_meet_at_the_threshold() -> None:
    from yogadl_plus.order.permutation import TABLE_MAX

    for n in (TABLE_MAX - 1, TABLE_MAX, TABLE_MAX + 1):
        p = Permutation(n, seed=9, epoch=2)
        values = p.indices(np.arange(n))
        assert sorted(values.tolist()) == list(range(n))
        assert [p[i] for i in range(0, n, 97)] == values[::97].tolist()


# --------------------------------------------------------------------------- whole-chunk shards


@settings(max_examples=150, deadline=None)
@given(
    counts=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    shards=st.integers(1, 5),
    shuffle=st.booleans(),
    remainder=st.sampled_from(["keep", "drop", "pad"]),
    epoch=st.integers(0, 3),
    seed=st.integers(0, 2**40),
)
def test_chunk_shards_own_whole_chunks_and_cover_the_version(
    counts: list[int], shards: int, shuffle: bool, remainder: str, epoch: int, seed: int
) -> None:
    drop, pad = remainder == "drop", remainder == "pad"
    if len(counts) < shards:
        with pytest.raises(ValueError, match="at least one chunk per shard"):
            ShardByChunks(counts, num_shards=shards)
        return
    starts = np.concatenate([[0], np.cumsum(counts)])
    chunk_of = np.repeat(np.arange(len(counts)), counts)
    seen = []
    lengths = set()
    for rank in range(shards):
        order = ShardByChunks(
            counts, shuffle=shuffle, shuffle_seed=seed, shard_rank=rank, num_shards=shards,
            drop_shard_remainder=drop, pad_shard_remainder=pad,
        )  # fmt: skip
        got = order.indices(epoch, 0, order.shard_length)
        assert len(got) == order.shard_length == order.shard_lengths(epoch)[rank]
        assert set(chunk_of[got]) <= set(range(rank, len(counts), shards))  # its chunks only
        own = order.num_records
        assert len(set(got.tolist())) == min(len(got), own)
        if pad:  # its own order, then that order again from its start
            np.testing.assert_array_equal(got, np.resize(got[:own], len(got)))
        # any position costs the same, and agrees with the slice
        if len(got):
            k = len(got) // 2
            assert order.index(epoch, k) == got[k]
            np.testing.assert_array_equal(order.indices(epoch, k, len(got)), got[k:])
        seen.extend(got.tolist())
        lengths.add(len(got))
    if pad:
        assert len(lengths) == 1 and set(seen) == set(range(int(starts[-1])))
    elif drop:
        assert len(lengths) == 1  # equal lengths, cut to the shortest shard
        if shuffle:
            # The cut moves with the epoch (it is not always the same tail of the shard).
            order = ShardByChunks(
                counts,
                shuffle=True,
                shuffle_seed=seed,
                num_shards=shards,
                drop_shard_remainder=True,
            )
            mine = np.flatnonzero(chunk_of % shards == 0)
            first = set(order.indices(0, 0, order.shard_length).tolist())
            read = set().union(
                *(set(order.indices(e, 0, order.shard_length).tolist()) for e in range(20))
            )
            assert read <= set(mine.tolist())
            assert read != first or order.shard_length in (0, len(mine))
    else:
        assert sorted(seen) == list(range(int(starts[-1])))  # disjoint and covering


def test_chunk_shards_have_no_global_offset() -> None:
    # (A Stream over it raises the same ValueError "no global order": tests/test_stream.py).
    order = ShardByChunks([5, 5, 5], num_shards=2, shard_rank=1)
    with pytest.raises(ValueError, match="no global order"):
        order.global_offset(0, 0)


def test_small_tables_drawn_at_once_equal_the_draw_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # Windowed shuffles make a table per small window, so the draws are vectorized; the tables
    # must stay those of the loop (which also takes over when a draw would be rejected).
    from yogadl_plus.order import permutation

    keys = [0, 1, 2**64 - 1, 0x9E3779B97F4A7C15, 123456789012345]
    sizes = [0, 1, 2, 3, 7, 64, 1000, 1024]
    fast = {(n, k): permutation.fisher_yates(n, k).tolist() for n in sizes for k in keys}
    # Many tables of one size are made together, swap by swap in numpy: the same tables.
    for n in sizes:
        rows = permutation.fisher_yates_rows(n, keys * 8)
        assert [row.tolist() for row in rows] == [fast[(n, k)] for k in keys * 8]
    monkeypatch.setattr(permutation, "draws_at_once", lambda n, key: None)
    for (n, k), table in fast.items():
        assert permutation.fisher_yates(n, k).tolist() == table


def test_wide_products_match_python_integers() -> None:
    from yogadl_plus.order.permutation import wide_product

    rng = np.random.default_rng(5)
    draws = rng.integers(0, 2**64, size=2000, dtype=np.uint64, endpoint=False)
    draws[:3] = [0, 2**64 - 1, 2**63]
    bounds = rng.integers(1, 2**31, size=2000, dtype=np.uint64)
    bounds[:3] = [2**31 - 1, 2**31 - 1, 1]
    high, low = wide_product(draws, bounds)
    for d, b, h, lo in zip(draws.tolist(), bounds.tolist(), high.tolist(), low.tolist()):
        assert (h, lo) == divmod(d * b, 2**64)
