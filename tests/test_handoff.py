"""stream/workers/handoff.py: what a worker hands over reaches the consumer whole, its big arrays
through the worker's ring, an error after the items read before it."""

from __future__ import annotations

import numpy as np
import pytest

import yogadl_plus as ydl
from yogadl_plus.errors import TransformError
from yogadl_plus.stream.workers.handoff import Parcel, Sender, read_group, unpack, worker_rings
from yogadl_plus.stream.workers.ring import MIN_SHARED


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("handoff"))
    records = ({"i": np.int64(i), "x": np.full(3, i, np.float32)} for i in range(40))
    return ydl.cache_dataset(records, "h", "v", storage, progress=False)


def test_a_result_comes_back_whole_with_or_without_a_ring():
    (ring,) = worker_rings(1)
    big = np.arange(MIN_SHARED, dtype=np.uint8)
    result = {"big": big, "small": [1, "two"]}
    for sender in (Sender(None), Sender(ring)):
        packed = sender.pack(result)
        assert packed.shared == (sender.ring is not None)
        back = unpack(sender.ring, packed)
        np.testing.assert_array_equal(back["big"], big)
        assert back["small"] == [1, "two"]


def fails_on_7(record):
    if record["i"] == 7:
        raise ValueError("seven")
    return record


def test_a_group_carries_its_error_after_the_items_before_it(ref):
    plan = ref.stream(transform=fails_on_7).plan()
    parcel = read_group(plan, 0, 0, 10, 1, None, Sender(None))
    assert [int(r["i"]) for r in parcel.opened([])] == list(range(7))
    assert parcel.read.ends.tolist() == list(range(1, 8))
    with pytest.raises(TransformError, match="record 7"):
        parcel.raise_error(lambda: "position 7")
    with pytest.raises(TransformError, match="record 7"):  # in the consumer: raised at once
        read_group(plan, 0, 0, 10, 1, None, None)


def test_a_group_of_batches_is_packed_in_the_ring_and_counted(ref):
    stream = ref.stream(batch_size=16)
    plan = stream.plan()
    rings = worker_rings(2)
    plan.begin_stats()
    parcel = read_group(plan, 0, 0, 40, 16, None, Sender(rings[1], 1))
    assert isinstance(parcel, Parcel) and parcel.items is None and parcel.ring == 1
    batches = parcel.opened(rings)
    assert [b["i"].tolist() for b in batches] == [list(range(0, 16)), list(range(16, 32)),
                                                  list(range(32, 40))]  # fmt: skip
    parcel.count(plan, len(batches), 0.0, False)
    assert (stream.stats().items, stream.stats().batches) == (40, 3)
