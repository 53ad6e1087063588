"""Mixtures of mixtures: each level keeps its shares and reads its records evenly, and the
whole streams, resumes and shards as one mixture.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from helpers.mixtures import (
    NAMES,
    PROPERTY,
    SIZES,
    Pair,
    Pool,
    epoch_pairs,
    expected_counts,
    largest_remainder,
    make,
    mixtures,
    take,
)
from hypothesis import given
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.mixture import Mixture


@st.composite
def nested_mixtures(draw: st.DrawFn) -> dict[str, Any]:
    inner = draw(mixtures(max_sources=2))
    outer = {
        "size": draw(st.sampled_from(SIZES)),
        "weights": draw(st.one_of(st.none(), st.tuples(st.integers(1, 4), st.integers(1, 4)))),
        "epoch_size": draw(st.one_of(st.none(), st.integers(1, 40))),
    }
    return {"inner": inner, "outer": outer}


def make_nested(pool: Pool, spec: dict[str, Any]) -> tuple[Mixture, list[int], list[int]]:
    """The mixture {"in": mixture of sources 0.., "z": source 3}, the outer shares and the
    inner ones."""
    inner = make(pool, spec["inner"])
    o = spec["outer"]
    weights = None if o["weights"] is None else dict(zip(("in", "z"), o["weights"]))
    mix = ydl.mix({"in": inner, "z": pool(3, o["size"])}, weights, epoch_size=o["epoch_size"])
    outer_counts = largest_remainder(
        o["weights"] or (len(inner), o["size"]),
        o["epoch_size"] if o["epoch_size"] is not None else len(inner) + o["size"],
    )
    return mix, outer_counts, expected_counts(spec["inner"])


@PROPERTY
@given(spec=nested_mixtures(), shuffle=st.booleans(), seed=st.integers(0, 2**64))
def test_a_mixture_of_mixtures_keeps_shares_and_balance_at_each_level(
    pool: Pool, spec: dict[str, Any], shuffle: bool, seed: int
) -> None:
    mix, outer_counts, inner_counts = make_nested(pool, spec)
    inner_len = sum(inner_counts)
    sizes = [*spec["inner"]["sizes"], spec["outer"]["size"]]
    assert [leaf.name for leaf in mix.leaves] == [
        *(f"in/{NAMES[j]}" for j in range(len(inner_counts))),
        "z",
    ]
    stream = mix.stream(shuffle=shuffle, shuffle_seed=seed)
    seen: Counter[Pair] = Counter()
    for epochs in range(1, 5):
        items = epoch_pairs(stream)
        seen.update(items)
        # The outer level: each epoch, the inner mixture and "z" get exactly their shares.
        assert sum(src == 3 for src, _ in items) == outer_counts[1]
        # The inner level: the inner mixture's part of e epochs is its first e * c positions,
        # of which each inner source gets exactly its shares for whole inner epochs.
        whole, part = divmod(epochs * outer_counts[0], inner_len)
        if part == 0:
            for j, count in enumerate(inner_counts):
                assert sum(seen[(j, i)] for i in range(sizes[j])) == whole * count
        # The records of every leaf: seen evenly.
        for j, n in enumerate(sizes):
            per_record = [seen[(j, i)] for i in range(n)]
            assert max(per_record) - min(per_record) <= 1, (j, per_record)


def test_a_mixture_of_mixtures_streams_resumes_and_shards(pool: Pool) -> None:
    text = ydl.mix({"a": pool(0, 13), "b": pool(1, 5)}, {"a": 3, "b": 1}, epoch_size=12)
    mix = ydl.mix({"text": text, "code": pool(2, 8)}, {"text": 2, "code": 1}, epoch_size=30)
    assert mix.counts == [20, 10] and text.counts == [9, 3]
    assert repr(mix) == "Mixture(text=20, code=10; epoch_size=30)"
    common = dict(shuffle=True, shuffle_seed=9)
    stream = mix.stream(**common)
    epochs = [epoch_pairs(stream) for _ in range(6)]  # 120 inner positions: 10 inner epochs
    seen = Counter(p for items in epochs for p in items)
    assert sum(seen[(0, i)] for i in range(13)) == 10 * 9
    assert sum(seen[(1, i)] for i in range(5)) == 10 * 3
    flat = [p for items in epochs for p in items]
    for k in (0, 7, 30, 95):
        assert take(mix.stream(start_offset=k, **common), 180 - k) == flat[k:]
    halves = [epoch_pairs(mix.stream(num_shards=2, shard_rank=r, **common)) for r in (0, 1)]
    assert Counter(halves[0] + halves[1]) == Counter(epochs[0])
