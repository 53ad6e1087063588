"""A mixture's stream keeps the Stream's contract: it resumes exactly from any offset (by
start_offset or a saved state), its shards are disjoint and cover each epoch, ranks rescaled
mid-epoch lose and repeat nothing, and a saved state loads only into the same mixture.
"""

from __future__ import annotations

import itertools
import json
import pickle
import re
from collections import Counter
from typing import Any

import pytest
from helpers.mixtures import PROPERTY, Pair, Pool, epoch_pairs, make, mixtures, pair, take
from hypothesis import assume, given
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.mixture import Mixture


@PROPERTY
@given(
    spec=mixtures(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**64),
    shards=st.integers(1, 3),
    data=st.data(),
)
def test_resume_from_any_offset_gives_the_rest_of_the_stream(
    pool: Pool, spec: dict[str, Any], shuffle: bool, seed: int, shards: int, data: st.DataObject
) -> None:
    mix = make(pool, spec)
    assume(len(mix) >= shards)  # a shard without positions cannot tell one epoch from the next
    rank = data.draw(st.integers(0, shards - 1))
    common = dict(shuffle=shuffle, shuffle_seed=seed, num_shards=shards, shard_rank=rank)
    whole = mix.stream(**common)
    reference = epoch_pairs(whole) + epoch_pairs(whole)  # epochs 0 and 1
    k = data.draw(st.integers(0, len(reference)))
    resumed = mix.stream(start_offset=k, **common)
    tail: list[Pair] = []
    while resumed.next_epoch_position[0] < 2:
        tail += epoch_pairs(resumed)
    assert tail == reference[k:]
    # The same through state() / load_state, into an equal mixture made afresh and a pickled one.
    stream = mix.stream(**common)
    assert take(stream, k) == reference[:k] and stream.offset == k
    state = stream.state()
    for again in (make(pool, spec), pickle.loads(pickle.dumps(mix))):
        loaded = again.stream(**common)
        loaded.load_state(json.loads(json.dumps(state.to_dict())))
        assert take(loaded, len(reference) - k) == reference[k:]


@PROPERTY
@given(
    spec=mixtures(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**64),
    shards=st.integers(1, 4),
    epoch=st.integers(0, 2),
    drop=st.booleans(),
)
def test_shards_are_disjoint_and_cover_each_epoch(
    pool: Pool,
    spec: dict[str, Any],
    shuffle: bool,
    seed: int,
    shards: int,
    epoch: int,
    drop: bool,
) -> None:
    mix = make(pool, spec)
    common = dict(shuffle=shuffle, shuffle_seed=seed)
    whole = epoch_pairs(mix.stream(start_offset=epoch * len(mix), **common))
    # drop_shard_remainder: the epoch's last len % S positions are left out.
    kept = len(mix) // shards * shards if drop else len(mix)
    slots = []
    for rank in range(shards):
        first = mix.stream(num_shards=shards, shard_rank=rank, drop_shard_remainder=drop, **common)
        length = first.plan().positions_per_epoch
        slots += first.plan().indices(epoch, 0, length).tolist()
        stream = mix.stream(
            num_shards=shards,
            shard_rank=rank,
            drop_shard_remainder=drop,
            start_offset=epoch * length,
            **common,
        )
        # Shard r hands out the positions r, r + S, r + 2S, ... of the epoch's order.
        assert epoch_pairs(stream) == whole[:kept][rank::shards]
    assert len(slots) == kept and len(set(slots)) == kept
    assert set(slots) <= set(range(len(mix)))
    if not drop:
        assert sorted(slots) == list(range(len(mix)))


@PROPERTY
@given(
    spec=mixtures(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**64),
    shards=st.integers(1, 4),
    new_shards=st.integers(1, 4),
    epoch=st.integers(0, 1),
    data=st.data(),
)
def test_rescaling_from_s_to_s_prime_ranks_loses_and_repeats_nothing(
    pool: Pool,
    spec: dict[str, Any],
    shuffle: bool,
    seed: int,
    shards: int,
    new_shards: int,
    epoch: int,
    data: st.DataObject,
) -> None:
    mix = make(pool, spec)
    n = len(mix)
    assume(n >= shards)
    common = dict(shuffle=shuffle, shuffle_seed=seed)
    lengths = [
        mix.stream(num_shards=shards, shard_rank=r, **common).plan().positions_per_epoch
        for r in range(shards)
    ]
    k = data.draw(st.integers(0, min(lengths)))  # the global step every rank reached
    consumed: list[Pair] = []
    slots: list[int] = []
    offsets = set()
    for rank in range(shards):
        stream = mix.stream(
            num_shards=shards, shard_rank=rank, start_offset=epoch * lengths[rank], **common
        )
        consumed += [pair(item) for item in itertools.islice(iter(stream), k)]
        slots += stream.plan().indices(epoch, 0, k).tolist()
        offsets.add(stream.global_offset)
    assert len(offsets) == 1, "every rank at the same step reports the same global offset"
    (checkpoint,) = offsets
    assert epoch * n + shards * k <= checkpoint <= (epoch + 1) * n
    after = [
        mix.stream(num_shards=new_shards, shard_rank=r, global_start=checkpoint, **common)
        for r in range(new_shards)
    ]
    whole = [epoch_pairs(mix.stream(start_offset=e * n, **common)) for e in (epoch, epoch + 1)]
    if checkpoint < (epoch + 1) * n:
        for stream in after:
            slots += stream.plan().indices(epoch, 0, stream.plan().epoch_length(epoch)).tolist()
        rest = [p for stream in after for p in epoch_pairs(stream)]
    else:
        rest = []  # the epoch was finished: the new ranks start the next one whole
    assert sorted(slots) == list(range(n)), "each slot of the epoch read exactly once"
    assert Counter(consumed + rest) == Counter(whole[0])
    # And the next epoch, whole on the new ranks.
    following = [p for stream in after for p in epoch_pairs(stream)]
    assert Counter(following) == Counter(whole[1])


def test_stream_state_loads_only_into_the_same_mixture(pool: Pool, three: Mixture) -> None:
    common = dict(shuffle=True, shuffle_seed=8)
    stream = three.stream(**common)
    head = take(stream, 33)
    state = stream.state().to_dict()
    assert json.loads(json.dumps(state)) == state
    same = ydl.mix(
        {"a": pool(0, 13), "b": pool(1, 5), "c": pool(2, 8)},
        {"a": 6, "b": 4, "c": 2},  # other weights, the same shares
        epoch_size=70,
    )
    resumed = same.stream(**common)
    resumed.load_state(state)
    assert head + take(resumed, 70) == take(three.stream(**common), 103)
    sources = {"a": pool(0, 13), "b": pool(1, 5), "c": pool(2, 8)}
    # What differs is named: the shares (in the dataset's description), or the epoch's size.
    others = [
        (ydl.mix(sources, {"a": 1, "b": 2, "c": 3}, epoch_size=70), r"dataset: .*a=s0:n13\*35"),
        (ydl.mix(sources, {"a": 3, "b": 2, "c": 1}, epoch_size=71), "positions: saved 70"),
        (
            ydl.mix({**sources, "c": pool(2, 13)}, {"a": 3, "b": 2, "c": 1}, epoch_size=70),
            "c=s2:n8",
        ),
        (
            ydl.mix(
                {"a": sources["a"], "b": sources["b"], "z": sources["c"]},
                {"a": 3, "b": 2, "z": 1},
                epoch_size=70,
            ),
            "z=s2:n8",
        ),
    ]
    for other, named in others:
        with pytest.raises(ValueError, match="saved from a different stream") as caught:
            other.stream(**common).load_state(state)
        assert re.search(named, str(caught.value)), str(caught.value)
    with pytest.raises(ValueError, match=r"saved from a different stream.*dataset"):
        pool(0, 13).stream(**common).load_state(state)
    with pytest.raises(ValueError, match="seed: saved 8, this stream 9"):
        three.stream(shuffle=True, shuffle_seed=9).load_state(state)
    # And the other way: a DataRef's state does not load into a mixture.
    plain = pool(0, 13).stream(**common)
    with pytest.raises(ValueError, match="saved from a different stream"):
        three.stream(**common).load_state(plain.state())
