"""Mixtures of sources whose fields differ (in shape, in dtype, or missing): records keep each
source's own fields, batches merge only fields alike and refuse the others naming the field and
the sources, and a predicate or tf.data over them holds to the fields they share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers.mixtures import batch_pairs, epoch_pairs, pair

import yogadl_plus as ydl
from yogadl_plus import predicates
from yogadl_plus.errors import TransformError


@pytest.fixture(scope="module")
def varied(mixture_storage: ydl.LocalStorage) -> dict[str, ydl.DataRef]:
    """Datasets whose field ``x`` differs: in shape, in dtype, or missing."""

    def build(name: str, src: int, x: Callable[[int], Any] | None) -> ydl.DataRef:
        records = [
            {"src": np.int64(src), "i": np.int64(i), **({"x": x(i)} if x is not None else {})}
            for i in range(6)
        ]
        return ydl.cache_dataset(records, name, "v", mixture_storage, progress=False)

    return {
        "x4": build("x4", 0, lambda i: np.full(4, i, np.float32)),
        "x4b": build("x4b", 1, lambda i: np.full(4, -i, np.float32)),
        "x3": build("x3", 2, lambda i: np.full(3, i, np.float32)),
        "xint": build("xint", 3, lambda i: np.full(4, i, np.int32)),
        "nox": build("nox", 4, None),
    }


@pytest.mark.parametrize("other", ["x3", "xint", "nox"])
def test_batching_sources_whose_fields_differ_is_a_schema_error(
    varied: dict[str, ydl.DataRef], other: str
) -> None:
    mix = ydl.mix({"four": varied["x4"], "other": varied[other]})
    for fields in (None, ["i", "x"]):
        with pytest.raises(ydl.SchemaError, match="field 'x'") as caught:
            mix.stream(batch_size=4, fields=fields)
        assert "'other'" in str(caught.value)
        if fields is None or other != "nox":
            # (Asked for by name, a field one source lacks is that source's error.)
            assert "'four'" in str(caught.value)
        with pytest.raises(ydl.SchemaError, match="field 'x'"):
            mix.get_batch([0], fields=fields)  # one source's position: still refused
        with pytest.raises(ydl.SchemaError, match="field 'x'"):
            mix.get_batch([len(mix) - 1], fields=fields)
    # The shared fields batch.
    batches = list(mix.stream(batch_size=4, fields=["src", "i"], shuffle=True, shuffle_seed=3))
    assert sorted(batch_pairs(batches)) == sorted(epoch_pairs(mix.stream()))
    assert batch_pairs([mix.get_batch(range(len(mix)), ["src", "i"])]) == epoch_pairs(mix.stream())


def test_batches_of_sources_alike_merge_their_arrays(varied: dict[str, ydl.DataRef]) -> None:
    mix = ydl.mix({"p": varied["x4"], "q": varied["x4b"]}, {"p": 1, "q": 2}, epoch_size=9)
    batches = list(mix.stream(batch_size=4, shuffle=True, shuffle_seed=5))
    assert [len(b["i"]) for b in batches] == [4, 4, 1]
    for batch in batches:
        assert batch["x"].dtype == np.float32 and batch["x"].shape[1:] == (4,)
        for src, i, x in zip(batch["src"], batch["i"], batch["x"]):
            assert x.tolist() == [float(i if src == 0 else -i)] * 4


def test_record_mode_keeps_each_sources_own_fields(varied: dict[str, ydl.DataRef]) -> None:
    mix = ydl.mix({"four": varied["x4"], "three": varied["x3"], "none": varied["nox"]})
    items = list(mix.stream(shuffle=True, shuffle_seed=2))
    assert len(items) == 18
    for item in items:
        if item["src"] == 4:
            assert set(item) == {"src", "i"}
        else:
            assert set(item) == {"src", "i", "x"}
            assert item["x"].shape == ((4,) if item["src"] == 0 else (3,))
            assert item["x"].tolist() == [float(item["i"])] * len(item["x"])
    with pytest.raises(TransformError, match="source 'three'"):
        list(mix.stream(transform=lambda r: r["x"][3]))
    assert all(set(item) == {"i"} for item in mix.stream(fields=["i"]))
    # Naming a field a source lacks is an error naming that source.
    lacking = ydl.mix({"four": varied["x4"], "none": varied["nox"]})
    with pytest.raises(ydl.SchemaError, match=r"source 'none'.*'x'"):
        lacking.stream(fields=["i", "x"])


def test_a_predicate_on_a_field_a_source_lacks_names_the_source(
    varied: dict[str, ydl.DataRef],
) -> None:
    mix = ydl.mix({"four": varied["x4"], "none": varied["nox"]})
    with pytest.raises(ydl.SchemaError, match=r"source 'none'.*'x'"):
        mix.stream(predicate=predicates.in_lambda("x", lambda x: x[0] > 0))


def test_tf_dataset_of_records_whose_fields_differ_holds_the_shared_ones(
    varied: dict[str, ydl.DataRef],
) -> None:
    pytest.importorskip("tensorflow")
    mix = ydl.mix({"four": varied["x4"], "none": varied["nox"]})
    want = epoch_pairs(mix.stream(shuffle=True, shuffle_seed=3))
    for read_ahead in (True, False):
        dataset = ydl.tensorflow.make_tf_dataset(
            mix.stream(shuffle=True, shuffle_seed=3), read_ahead=read_ahead
        )
        got = list(dataset.as_numpy_iterator())
        assert all(set(e) == {"src", "i"} for e in got)
        assert [pair(e) for e in got] == want
