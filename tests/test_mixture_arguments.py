"""What ``ydl.mix`` and a mixture's stream refuse, naming the source or argument: bad weights,
epoch sizes and sources, a source without records given a weight, and stream options a mixture
cannot take; numpy and rational weights are exact numbers.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from helpers.mixtures import Pool, epoch_pairs, largest_remainder

import yogadl_plus as ydl


@pytest.mark.parametrize(
    "weights, error, message",
    [
        ({"a": 1}, ValueError, "weights has no weight for source 'b'"),
        ({"a": 1, "b": 1, "zz": 1}, ValueError, "weights names 'zz', which is not a source"),
        ({"a": -1, "b": 1}, ValueError, "weight of source 'a' must be a finite number >= 0"),
        ({"a": 1, "b": float("nan")}, ValueError, "weight of source 'b' must be a finite"),
        ({"a": float("inf"), "b": 1}, ValueError, "weight of source 'a' must be a finite"),
        ({"a": 1, "b": -math.inf}, ValueError, "weight of source 'b' must be a finite"),
        ({"a": True, "b": 1}, ValueError, "weight of source 'a' must be a number, got True"),
        ({"a": 1, "b": np.True_}, ValueError, "weight of source 'b' must be a number"),
        ({"a": "1", "b": 1}, ValueError, "weight of source 'a' must be a number, got '1'"),
        ({"a": None, "b": 1}, ValueError, "weight of source 'a' must be a number, got None"),
        ({"a": 0, "b": 0.0}, ValueError, "positive sum; they are all zero"),
        ([1, 1], TypeError, "weights must be a mapping"),
    ],
)
def test_bad_weights_are_refused_naming_the_source(
    pool: Pool, weights: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ydl.mix({"a": pool(0, 3), "b": pool(1, 5)}, weights)


@pytest.mark.parametrize("epoch_size", [0, -3, 2.5, 4.0, "3", True, np.float64(3)])
def test_bad_epoch_sizes_are_refused(pool: Pool, epoch_size: Any) -> None:
    with pytest.raises(ValueError, match="epoch_size must be"):
        ydl.mix({"a": pool(0, 3)}, epoch_size=epoch_size)


def test_numpy_and_rational_weights_are_exact_numbers(pool: Pool) -> None:
    sources = {"a": pool(0, 3), "b": pool(1, 5)}
    expected = largest_remainder([3, 1], 10)
    for w in (np.int8(3), np.uint64(3), np.float32(3.0), np.float16(3.0), Fraction(3), 3.0):
        mix = ydl.mix(sources, {"a": w, "b": 1}, epoch_size=10)
        assert mix.counts == expected
        assert all(type(c) is int for c in mix.counts), mix.counts
    # Weights as big as int8's range must not wrap around.
    mix = ydl.mix(sources, {"a": np.int8(100), "b": np.int8(27)}, epoch_size=127)
    assert mix.counts == [100, 27]
    mix = ydl.mix(sources, {"a": np.uint8(200), "b": np.uint8(55)}, epoch_size=1000)
    assert mix.counts == largest_remainder([200, 55], 1000)
    # Past float's range: exact all the same.
    mix = ydl.mix(sources, {"a": 10**400, "b": 3 * 10**399}, epoch_size=13)
    assert mix.counts == [10, 3]
    with pytest.raises(ValueError, match="weight of source 'b' must be a finite number >= 0"):
        ydl.mix(sources, {"a": 1, "b": -(10**400)})


def test_bad_sources_are_refused(pool: Pool, mixture_storage: ydl.LocalStorage) -> None:
    a = pool(0, 3)
    with pytest.raises(ValueError, match="at least one source"):
        ydl.mix({})
    with pytest.raises(TypeError, match="sources must be a mapping"):
        ydl.mix([a])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="source 'b' must be a DataRef or a Mixture, got list"):
        ydl.mix({"a": a, "b": [{"src": 0, "i": 1}]})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="source 'b' must be a DataRef or a Mixture, got Stream"):
        ydl.mix({"a": a, "b": a.stream()})  # type: ignore[dict-item]
    for name in ("", "x/y", 3, None):
        with pytest.raises(ValueError, match="source names must be non-empty strs"):
            ydl.mix({"a": a, name: pool(1, 5)})  # type: ignore[dict-item]


def test_a_source_without_records_takes_no_positive_weight(
    pool: Pool, mixture_storage: ydl.LocalStorage
) -> None:
    schema = ydl.Schema([ydl.Field("src", np.int64), ydl.Field("i", np.int64)])
    empty = ydl.cache_dataset([], "empty", "v", mixture_storage, schema=schema, progress=False)
    a = pool(0, 3)
    with pytest.raises(ValueError, match="source 'e' has no records"):
        ydl.mix({"a": a, "e": empty}, {"a": 1, "e": 1}, epoch_size=10)
    # Even where its share of a short epoch rounds to nothing.
    with pytest.raises(ValueError, match="source 'e' has no records"):
        ydl.mix({"a": a, "e": empty}, {"a": 1, "e": 1}, epoch_size=1)
    with pytest.raises(ValueError, match="no records"):
        ydl.mix({"e": empty})
    # Weight 0, or weights by size: it takes no part.
    for mix in (ydl.mix({"a": a, "e": empty}, {"a": 1, "e": 0}), ydl.mix({"a": a, "e": empty})):
        assert mix.counts == [3, 0]
        assert sorted(epoch_pairs(mix.stream(shuffle=True, shuffle_seed=1))) == [
            (0, 0),
            (0, 1),
            (0, 2),
        ]


def test_options_a_mixture_cannot_take_say_why(pool: Pool) -> None:
    mix = ydl.mix({"a": pool(0, 3), "b": pool(1, 5)})
    gram = ydl.NGram({0: ["i"], 1: ["i"]}, delta_threshold=1, timestamp_field="i")
    with pytest.raises(ValueError, match="ngram= windows run within one dataset"):
        mix.stream(ngram=gram)
    with pytest.raises(ValueError, match=r"shard_by='chunks'.*use shard_by='records'"):
        mix.stream(shard_by="chunks", num_shards=2, shuffle_seed=1)
    with pytest.raises(ValueError, match=r"shuffle_window=.*a mixture's epoch is shuffled whole"):
        mix.stream(shuffle=True, shuffle_seed=1, shuffle_window=2)
