"""A mixture's positions read directly: ``mix[i]`` and ``mix.get_batch(indices)`` read the
unshuffled epoch 0, refuse positions out of range and indices that are not ints, and an empty
batch is typed like a DataRef's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers.mixtures import PROPERTY, Pool, batch_pairs, epoch_pairs, make, mixtures, pair
from hypothesis import given
from hypothesis import strategies as st

import yogadl_plus as ydl


@PROPERTY
@given(spec=mixtures(), data=st.data())
def test_getitem_and_get_batch_read_the_unshuffled_epoch_0(
    pool: Pool, spec: dict[str, Any], data: st.DataObject
) -> None:
    mix = make(pool, spec)
    n = len(mix)
    epoch0 = epoch_pairs(mix.stream(shuffle=False))
    assert [pair(mix[i]) for i in range(n)] == epoch0
    assert [pair(mix[i]) for i in range(-n, 0)] == epoch0
    assert pair(mix[np.int64(n - 1)]) == epoch0[-1]
    indices = data.draw(st.lists(st.integers(-n, n - 1), max_size=25))
    assert batch_pairs([mix.get_batch(indices)]) == [epoch0[i] for i in indices]
    only = mix.get_batch(np.array(indices, dtype=np.int32), fields=["i"])
    assert list(only) == ["i"]
    assert [int(i) for i in only["i"]] == [epoch0[i][1] for i in indices]


def test_getitem_and_get_batch_refuse_bad_positions(pool: Pool) -> None:
    mix = ydl.mix({"a": pool(0, 3), "b": pool(1, 5)})
    assert len(mix) == 8
    for bad in (8, -9, 10**12):
        with pytest.raises(IndexError, match=f"position {bad} is out of range"):
            mix[bad]
        with pytest.raises(IndexError, match=f"position {bad} is out of range"):
            mix.get_batch([0, bad])
    for bad in (1.0, "1", None):
        with pytest.raises(TypeError, match="Mixture indices are ints"):
            mix[bad]  # type: ignore[index]
    for indices in ([1.5], [[0, 1]], ["a"], np.zeros((2, 2), np.int64)):
        with pytest.raises(TypeError, match="1-d sequence of ints"):
            mix.get_batch(indices)  # type: ignore[arg-type]


def test_get_batch_of_no_positions_is_typed_like_a_datarefs(pool: Pool) -> None:
    mix = ydl.mix({"a": pool(0, 3), "b": pool(1, 5)})
    empty = mix.get_batch([])
    plain = pool(0, 3).get_batch([])
    assert list(empty) == list(plain) == ["src", "i"]
    for name in plain:
        assert isinstance(empty[name], np.ndarray) and empty[name].dtype == plain[name].dtype
        assert empty[name].shape == (0,)
