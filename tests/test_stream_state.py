"""The Stream's public position API and its checked state: what adapters build on."""

from __future__ import annotations

import gc
import json
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.order import OrderSettings, ShardByChunks, ShardByRecords, shard_order
from yogadl_plus.stream import StreamState

N = 53


def _records(n, shift=0):
    return ({"i": np.int64(i + shift), "t": np.int64(i)} for i in range(n))


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return ydl.LocalStorage(tmp_path_factory.mktemp("state"))


@pytest.fixture(scope="module")
def ref(storage):
    return ydl.cache_dataset(_records(N), "d", "v", storage, chunk_bytes=400, progress=False)


def ids(items):
    return [int(r["i"]) for r in items]


# --- positions ---


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shards=st.integers(1, 4),
    drop=st.booleans(),
    global_start=st.one_of(st.none(), st.integers(0, 3 * N)),
    offset=st.integers(0, 4 * N),
)
def test_locate_and_offset_of_are_inverse_and_match_iteration(
    ref, shards, drop, global_start, offset
):
    stream = ref.stream(
        shuffle=True, shuffle_seed=7, num_shards=shards, shard_rank=shards - 1,
        drop_shard_remainder=drop, global_start=global_start,
    )  # fmt: skip
    plan = stream.plan()
    epoch, position = plan.position_of(offset)
    assert 0 <= position <= plan.epoch_length(epoch)
    if position < plan.epoch_length(epoch) and plan.positions_per_epoch:
        assert plan.offset_of(epoch, position) == offset
    resumed = stream.replace(start_offset=offset)
    assert resumed.next_epoch_position == (epoch, position)
    expected = plan.indices(epoch, position, plan.epoch_length(epoch)).tolist()
    assert ids(resumed) == expected
    assert plan.items_from(epoch, position) == len(expected)


def test_items_from_counts_batches(ref):
    stream = ref.stream(batch_size=10)
    assert stream.plan().items_from(0, 0) == len(stream) == 6
    assert stream.plan().items_from(0, 45) == 1
    assert stream.replace(drop_last=True).plan().items_from(0, 45) == 0


def test_order_settings_are_checked_once_and_frozen():
    settings_ = OrderSettings(shuffle=True, shuffle_seed=np.int64(3), num_shards=2, shard_rank=1)
    assert type(settings_.shuffle_seed) is int and settings_.seeded() is settings_
    with pytest.raises(AttributeError):
        settings_.shuffle_seed = 4  # type: ignore[misc]
    assert OrderSettings(shuffle=True).seeded().shuffle_seed is not None
    with pytest.raises(ValueError, match="explicit shuffle_seed"):
        OrderSettings(shuffle=True, num_shards=2)
    with pytest.raises(ValueError, match="shard_by must be"):
        OrderSettings(shard_by="rows")
    with pytest.raises(ValueError, match="global_start"):
        OrderSettings(shard_by="chunks", global_start=3)
    assert isinstance(shard_order(OrderSettings(), 10, [10]), ShardByRecords)
    chunked = shard_order(OrderSettings(shard_by="chunks"), 10, [5, 5])
    assert isinstance(chunked, ShardByChunks)


def test_the_torch_sampler_orders_as_the_stream_without_making_one(ref):
    pytest.importorskip("torch")
    args = {"shuffle": True, "shuffle_seed": 5, "num_shards": 3, "shard_rank": 2}
    sampler = ydl.torch.StreamSampler(ref, start_offset=4, **args)
    assert list(sampler) == ids(ref.stream(start_offset=4, **args))


# --- the state ---


def test_a_state_resumes_exactly_through_json(ref):
    stream = ref.stream(shuffle=True, shuffle_seed=1, num_shards=2, shard_rank=1)
    epoch = list(stream)
    it = iter(stream)
    head = [next(it) for _ in range(9)]
    saved = json.loads(json.dumps(stream.state().to_dict()))
    assert saved["offset"] == stream.offset
    fresh = ref.stream(shuffle=True, shuffle_seed=1, num_shards=2, shard_rank=1, batch_size=4)
    fresh.load_state(saved)
    rest = [int(i) for batch in fresh for i in batch["i"]]
    assert ids(head) + rest == ids(ref.stream(shuffle=True, shuffle_seed=1, num_shards=2,
                                              shard_rank=1, start_offset=len(epoch)))  # fmt: skip


def test_a_state_of_another_stream_is_refused_naming_what_differs(ref, storage):
    stream = ref.stream(shuffle=True, shuffle_seed=1, num_shards=2, shard_rank=0)
    state = stream.state()
    with pytest.raises(ValueError, match=r"seed: saved 1, this stream 2"):
        ref.stream(shuffle=True, shuffle_seed=2, num_shards=2).load_state(state)
    with pytest.raises(ValueError, match=r"num_shards: saved 2, this stream 3.*global_start"):
        ref.stream(shuffle=True, shuffle_seed=1, num_shards=3).load_state(state)
    other = ydl.cache_dataset(_records(N), "d", "w", storage, chunk_bytes=400, progress=False)
    with pytest.raises(ValueError, match=r"dataset: saved 'd:v', this stream 'd:w'"):
        other.stream(shuffle=True, shuffle_seed=1, num_shards=2).load_state(state)
    # The same name over other bytes (an overwrite) has another fingerprint.
    rebuilt = ydl.cache_dataset(
        _records(N, shift=1), "d", "x", storage, chunk_bytes=400, progress=False
    )
    original = ydl.cache_dataset(_records(N), "d", "x2", storage, chunk_bytes=400, progress=False)
    assert rebuilt.stream().state().fingerprint != original.stream().state().fingerprint
    ydl.cache_dataset(_records(N, shift=2), "d", "x", storage, overwrite=True, progress=False)
    saved = rebuilt.stream().state()
    with pytest.raises(ValueError, match="fingerprint"):
        storage.fetch("d", "x").stream().load_state(saved)
    # What does not change an offset's meaning does not matter.
    ref.stream(shuffle=True, shuffle_seed=1, num_shards=2, batch_size=5, fields="i").load_state(
        state
    )


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d.pop("fingerprint"), "lacks"),
        (lambda d: d.update(offset=-1), "offset"),
        (lambda d: d["order"].pop("shuffle_seed"), "'order' must hold"),
        (lambda d: d.update(dataset=3), "'dataset' must be a str"),
    ],
)
def test_a_malformed_state_is_a_clear_error(ref, damage, message):
    data = ref.stream().state().to_dict()
    damage(data)
    with pytest.raises(ValueError, match=message):
        ref.stream().load_state(data)
    with pytest.raises(ValueError, match="is a dict"):
        StreamState.from_dict([1, 2])  # type: ignore[arg-type]


def test_the_torch_loader_state_carries_the_stream_state(ref):
    pytest.importorskip("torch")
    stream = ref.stream(shuffle=True, shuffle_seed=3, batch_size=4)
    loader = ydl.torch.make_dataloader(stream)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["stream"]["offset"] == state["offset"] == 4
    other = ydl.torch.make_dataloader(ref.stream(shuffle=True, shuffle_seed=3, batch_size=4,
                                                 num_shards=2))  # fmt: skip
    with pytest.raises(ValueError, match="num_shards"):
        other.load_state_dict(state)
    # A state without the stream's (an earlier release's) is refused, saying where to resume.
    older = {k: v for k, v in state.items() if k != "stream"}
    fresh = ydl.torch.make_dataloader(ref.stream(shuffle=True, shuffle_seed=3, batch_size=4))
    with pytest.raises(ValueError, match="start_offset=4"):
        fresh.load_state_dict(older)


# --- caches a module owns ---


def test_ngram_anchors_live_as_long_as_their_dataref(storage):
    ref = ydl.cache_dataset(_records(N), "ng", "v", storage, progress=False)
    gram = ydl.NGram({0: ["i"], 1: ["i"]}, delta_threshold=5, timestamp_field="t")
    first = gram.anchors(ref)
    assert gram.anchors(ref) is first  # computed once per DataRef
    assert not hasattr(ref, "_ngram_anchors")  # the cache is ngram's, not written onto ref
    anchors = weakref.ref(first)
    del ref, first
    gc.collect()
    assert anchors() is None


def test_a_state_saved_before_an_order_setting_existed_still_loads(ref):
    # pad_shard_remainder came after format 2: a state without it was saved by a release that
    # never padded, and resumes as before (not "'order' must hold ...").
    stream = ref.stream(shuffle=True, shuffle_seed=5, num_shards=2, shard_rank=1)
    next(iter(stream))
    saved = stream.state().to_dict()
    del saved["order"]["pad_shard_remainder"]
    again = ref.stream(shuffle=True, shuffle_seed=5, num_shards=2, shard_rank=1)
    again.load_state(saved)
    assert again.offset == stream.offset
    padded = ref.stream(
        shuffle=True, shuffle_seed=5, num_shards=2, shard_rank=1, pad_shard_remainder=True
    )
    with pytest.raises(ValueError, match="pad_shard_remainder: saved False, this stream True"):
        padded.load_state(saved)


# --- how the stream made its items: recorded, never compared ---


def test_a_state_says_how_its_stream_made_items_and_loads_across_them(ref):
    keep = ydl.predicates.in_set("i", [1, 2, 3])
    stream = ref.stream(batch_size=4, drop_last=True, skip=[5, 1, 5], predicate=keep)
    saved = json.loads(json.dumps(stream.state().to_dict()))
    made = saved["boundary"]
    assert (made["batch_size"], made["drop_last"]) == (4, True)
    assert made["skip"]["records"] == 2 and len(made["skip"]["sha256"]) == 64
    assert made["predicate"] == "in_set('i', {1, 2, 3})"
    # Never compared: a state loads into a stream with another skip list, or none.
    for other in (ref.stream(), ref.stream(skip=[7]), ref.stream(batch_size=2)):
        other.load_state(saved)
    assert StreamState.from_dict(saved).boundary == made
    # A mask and the indices of its True values are the same skip list.
    mask = np.zeros(N, bool)
    mask[[1, 5]] = True
    assert ref.stream(skip=mask).state().boundary["skip"] == made["skip"]
    assert ref.stream(skip=[1, 6]).state().boundary["skip"] != made["skip"]
    assert ref.stream().state().boundary == {
        "batch_size": None, "drop_last": False, "skip": None, "predicate": None
    }  # fmt: skip


def test_a_state_saved_before_the_boundary_was_recorded_loads(ref):
    stream = ref.stream(shuffle=True, shuffle_seed=2, batch_size=3)
    next(iter(stream))
    saved = stream.state().to_dict()
    assert saved["format"] == 2  # an earlier release reads it: the key is optional
    del saved["boundary"]
    again = ref.stream(shuffle=True, shuffle_seed=2, skip=[0])
    again.load_state(saved)
    assert again.offset == stream.offset
    assert StreamState.from_dict(saved).boundary is None
    # Keys a later release adds to it are information too: they are left out.
    later = {**stream.state().to_dict()}
    later["boundary"] = {**later["boundary"], "transform": "crop"}
    assert "transform" not in StreamState.from_dict(later).boundary


@pytest.mark.parametrize(
    "boundary",
    [
        [],
        {"batch_size": 4},
        {"batch_size": 0, "drop_last": False, "skip": None, "predicate": None},
        {"batch_size": None, "drop_last": "no", "skip": None, "predicate": None},
        {"batch_size": None, "drop_last": False, "skip": {"records": 3}, "predicate": None},
        {
            "batch_size": None,
            "drop_last": False,
            "skip": {"records": -1, "sha256": ""},
            "predicate": None,
        },
        {"batch_size": None, "drop_last": False, "skip": None, "predicate": 3},
    ],
)
def test_a_malformed_boundary_is_a_clear_error(ref, boundary):
    data = {**ref.stream().state().to_dict(), "boundary": boundary}
    with pytest.raises(ValueError, match=r"boundary|batch_size|skipped records"):
        StreamState.from_dict(data)
