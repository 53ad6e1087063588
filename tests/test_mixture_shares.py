"""How a mixture divides each epoch: ``ydl.mix(sources, weights, epoch_size)`` gives each
source exactly its largest-remainder share of every epoch, dealt evenly through it by the
interleave, and over whole epochs reads each source's records evenly.

The expected shares are computed here with fractions, not by the library; the interleave is
checked at 10^9 items per source too.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from helpers.mixtures import (
    PROPERTY,
    Pair,
    Pool,
    epoch_pairs,
    expected_counts,
    largest_remainder,
    make,
    mixtures,
)
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from yogadl_plus.order.interleave import Interleave, shares


@settings(max_examples=300, deadline=None)
@given(
    weights=st.lists(st.fractions(min_value=0, max_value=50), min_size=1, max_size=8),
    total=st.integers(0, 10**12),
)
def test_shares_are_the_largest_remainder_rounding(weights: list[Fraction], total: int) -> None:
    if not any(weights):
        weights[0] = Fraction(1)
    parts = shares(weights, total)
    assert parts == largest_remainder(weights, total)
    # What largest remainder means: each part its quota rounded down or up, summing to total,
    # and every part rounded up had a remainder no smaller than any rounded down.
    quotas = [w * total / sum(weights) for w in weights]
    assert sum(parts) == total
    assert all(math.floor(q) <= p <= math.ceil(q) for p, q in zip(parts, quotas))
    up = [q - math.floor(q) for p, q in zip(parts, quotas) if p > q]
    down = [q - math.floor(q) for p, q in zip(parts, quotas) if p == math.floor(q)]
    assert not up or not down or min(up) >= max(down)


def test_shares_break_ties_to_the_earlier_source_and_are_exact_at_any_size() -> None:
    assert shares([Fraction(1)] * 3, 4) == [2, 1, 1]
    assert shares([Fraction(1)] * 3, 5) == [2, 2, 1]
    assert shares([Fraction(1), Fraction(0), Fraction(1)], 3) == [2, 0, 1]
    # Floats would round 10^18 / 3 wrongly; exact rationals do not.
    third = 10**18 // 3
    assert shares([Fraction(1)] * 3, 10**18) == [third + 1, third, third]
    assert shares([Fraction(1, 3), Fraction(2, 3)], 3 * 10**17 + 1) == [10**17, 2 * 10**17 + 1]


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=7))
def test_interleave_deals_each_source_its_count_evenly(counts: list[int]) -> None:
    assume(sum(counts))
    total = sum(counts)
    source, rank = Interleave(counts).source_and_rank(np.arange(total))
    # A split in halves per level: each level is within one of the exact proportion.
    levels = max(1, math.ceil(math.log2(len(counts))))
    for j, count in enumerate(counts):
        mine = source == j
        assert rank[mine].tolist() == list(range(count)), "ranks 0.. in slot order"
        seen = np.cumsum(mine)
        exact = np.arange(1, total + 1) * count / total
        assert np.abs(seen - exact).max() < levels
    if len([c for c in counts if c]) == 2:
        # Two sources: every prefix holds its exact share rounded down or up.
        j = next(j for j, c in enumerate(counts) if c)
        seen = np.cumsum(source == j)
        exact = [Fraction(p * counts[j], total) for p in range(1, total + 1)]
        assert all(math.floor(e) <= s <= math.ceil(e) for s, e in zip(seen.tolist(), exact))


def test_interleave_refuses_bad_counts_and_slots() -> None:
    with pytest.raises(ValueError, match="not all zero"):
        Interleave([0, 0])
    with pytest.raises(ValueError, match="non-negative"):
        Interleave([3, -1])
    with pytest.raises(IndexError, match="slot 5 is out of range"):
        Interleave([2, 3]).source_and_rank([0, 5])
    with pytest.raises(IndexError, match="slot -1"):
        Interleave([2, 3]).source_and_rank([-1])


def test_the_interleave_is_exact_at_billions() -> None:
    counts = [10**9, 10**9, 3 * 10**9]
    interleave = Interleave(counts)
    # Source a gets every 5th slot (4, 9, ...); of the other slots, b every 4th, c the rest:
    # in 20 slots, 4 of a, 4 of b and 12 of c, each source's ranks running on.
    end = sum(counts)
    for first in (0, 20 * 123_456_789, end - 20_000):
        slots = np.arange(first, first + 20_000)
        source, rank = interleave.source_and_rank(slots)
        assert np.bincount(source, minlength=3).tolist() == [4000, 4000, 12000]
        a = slots[source == 0]
        assert (a % 5 == 4).all() and (rank[source == 0] == a // 5).all()
        for j, count in enumerate(counts):
            ranks = rank[source == j]
            assert (np.diff(ranks) == 1).all()
            assert ranks[0] == first * count // end
    source, rank = interleave.source_and_rank([end - 1])
    assert (int(source[0]), int(rank[0])) == (0, 10**9 - 1), "the last slot, a's last rank"
    # Past int64 products (3e9 * 8e9): each slot's side is floor((s + 1) * a / T) > floor(s *
    # a / T), in exact integers, up to the last slot.
    a, b = 3 * 10**9 + 1, 5 * 10**9 + 7
    total = a + b
    slots = np.concatenate([np.arange(5000), np.arange(total // 3, total // 3 + 5000)])
    # ... and where slot * a / T falls just short of an integer (slot * a = -1 mod T), which
    # floating point would round up.
    short = -pow(a, -1, total) % total
    slots = np.concatenate([slots, np.arange(short - 2, short + 3), np.arange(total - 5000, total)])
    source, rank = Interleave([a, b]).source_and_rank(slots)
    for slot, j, r in zip(slots.tolist(), source.tolist(), rank.tolist()):
        left = (slot + 1) * a // total > slot * a // total
        assert (j, r) == ((0, slot * a // total) if left else (1, slot - slot * a // total))
    assert rank[source == 0][-1] == a - 1 and rank[source == 1][-1] == b - 1
    # Two equal sources alternate exactly.
    two = Interleave([4 * 10**9, 4 * 10**9])
    slots = np.array([0, 1, 2, 8 * 10**9 - 2, 8 * 10**9 - 1])
    source, rank = two.source_and_rank(slots)
    assert source.tolist() == [1, 0, 1, 1, 0]
    assert rank.tolist() == [0, 0, 1, 4 * 10**9 - 1, 4 * 10**9 - 1]


@PROPERTY
@given(spec=mixtures(), shuffle=st.booleans(), seed=st.integers(0, 2**64))
def test_each_epoch_gives_each_source_exactly_its_share(
    pool: Pool, spec: dict[str, Any], shuffle: bool, seed: int
) -> None:
    mix = make(pool, spec)
    counts = expected_counts(spec)
    assert mix.counts == counts and len(mix) == sum(counts)
    stream = mix.stream(shuffle=shuffle, shuffle_seed=seed)
    for _ in range(3):
        items = epoch_pairs(stream)
        per_source = Counter(src for src, _ in items)
        assert [per_source[j] for j in range(len(counts))] == counts
        assert all(0 <= i < spec["sizes"][src] for src, i in items)


@PROPERTY
@given(spec=mixtures(), shuffle=st.booleans(), seed=st.integers(0, 2**64))
def test_over_whole_epochs_the_records_of_a_source_are_seen_evenly(
    pool: Pool, spec: dict[str, Any], shuffle: bool, seed: int
) -> None:
    mix = make(pool, spec)
    counts = expected_counts(spec)
    stream = mix.stream(shuffle=shuffle, shuffle_seed=seed)
    seen: Counter[Pair] = Counter()
    for epochs in range(1, 5):
        seen.update(epoch_pairs(stream))
        for j, n in enumerate(spec["sizes"]):
            per_record = [seen[(j, i)] for i in range(n)]
            assert sum(per_record) == epochs * counts[j]
            # A down-sampled source repeats nothing before all of it was seen, an up-sampled
            # one repeats evenly.
            assert max(per_record) - min(per_record) <= 1, (j, per_record)
