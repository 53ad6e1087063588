"""Predicates and n-gram windows through the Stream: they shuffle, shard, batch and resume like
records, and a predicate decodes the other fields only of the records it lets through."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus import codecs, predicates

N = 400


def make_records():
    ts = 0.0
    for i in range(N):
        ts += 5.0 if i % 50 == 0 else 1.0  # a gap every 50 records breaks windows
        yield {
            "i": np.int64(i),
            "key": np.int64(i % 10),
            "ts": ts,
            "payload": f"p{i}" * 20,
            "x": np.full(3, i, np.float32),
        }


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("boundary"))
    return ydl.cache_dataset(make_records, "d", "v", storage, progress=False, chunk_bytes=6000)


def flat(items, key="i"):
    out = []
    for item in items:
        out.extend(int(v) for v in np.atleast_1d(item[key]))
    return out


# --- predicates ---


def test_predicate_filters_and_counts_positions(ref):
    stream = ref.stream(predicate=predicates.in_set("key", [3]), shuffle=True, shuffle_seed=1)
    got = flat(stream)
    assert sorted(got) == list(range(3, N, 10))
    assert stream.offset == N, "rejected records still count as positions"
    assert len(stream) == N, "an upper bound with a predicate"


def test_rejected_records_decode_only_the_predicates_fields(ref, monkeypatch):
    calls = []
    original = codecs.String.decode

    def counting(self, field, data):
        calls.append(field.name)
        return original(self, field, data)

    monkeypatch.setattr(codecs.String, "decode", counting)
    passed = list(ref.stream(predicate=predicates.in_set("key", [7])))
    assert len(passed) == N // 10
    assert calls.count("payload") == N // 10, "payload decoded for passing records only"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    take=st.integers(0, 3 * N // 5),
    batch=st.one_of(st.none(), st.integers(1, 9)),
    shards=st.integers(1, 3),
    workers=st.sampled_from([0, 2]),
)
def test_resuming_with_a_predicate_is_exact(ref, take, batch, shards, workers):
    args = dict(
        predicate=predicates.in_set("key", [1, 4]),
        shuffle=True,
        shuffle_seed=6,
        num_shards=shards,
        shard_rank=shards - 1,
        batch_size=batch,
        num_workers=workers,
    )
    whole = [
        flat([item])
        for item in itertools.chain(ref.stream(**args), ref.stream(start_offset=0, **args))
    ]
    stream = ref.stream(**args)
    it = iter(stream)
    prefix = [flat([item]) for item in itertools.islice(it, min(take, len(whole) // 2))]
    rest = [flat([item]) for item in ref.stream(start_offset=stream.offset, **args)]
    stream.close()
    assert prefix + rest[: len(whole) // 2 - len(prefix)] == whole[: len(whole) // 2]


def test_predicate_batches_are_full_but_the_last(ref):
    batches = list(ref.stream(predicate=predicates.in_set("key", [2, 5]), batch_size=7))
    sizes = [len(b["i"]) for b in batches]
    assert all(s == 7 for s in sizes[:-1]) and 0 < sizes[-1] <= 7
    assert sum(sizes) == 2 * N // 10
    assert all(k in (2, 5) for b in batches for k in b["key"].tolist())


def test_vectorized_lambda_predicate(ref):
    keep = predicates.in_lambda(["i", "key"], lambda i, k: (i < 100) & (k == 0), vectorized=True)
    assert flat(ref.stream(predicate=keep)) == list(range(0, 100, 10))


def test_predicate_on_a_missing_field_fails_at_stream_time(ref):
    with pytest.raises(ydl.SchemaError, match="nope"):
        ref.stream(predicate=predicates.in_set("nope", [1]))
    with pytest.raises(ValueError, match=r"ydl\.predicates"):
        ref.stream(predicate=lambda r: True)


# --- n-grams ---


def ngram(overlap=True):
    return ydl.NGram(
        fields={-1: ["i"], 0: ["i", "x"], 2: ["payload"]},
        delta_threshold=1.5,
        timestamp_field="ts",
        timestamp_overlap=overlap,
    )


def test_windows_come_in_storage_order_and_skip_gaps(ref):
    g = ngram()
    windows = list(ref.stream(ngram=g))
    anchors = [int(w[0]["i"]) for w in windows]
    assert anchors == g.anchors(ref).tolist()
    # Gaps of 5 between records 49|50, 99|100, ...: no window spans them.
    for w in windows:
        k = int(w[0]["i"])
        assert w[-1]["i"] == k - 1 and w[0]["x"].tolist() == [k] * 3
        assert w[2] == {"payload": f"p{k + 2}" * 20}
        assert (k - 1) // 50 == (k + 2) // 50 or (k + 2) % 50 != 0
    assert list(windows[0]) == [-1, 0, 1, 2] and set(windows[0][-1]) == {"i"}
    assert all(w[1] == {} for w in windows)  # offset 1 is not named: empty, as in Petastorm


@pytest.mark.parametrize("overlap", [True, False])
def test_windows_shuffle_and_shard_disjointly(ref, overlap):
    g = ngram(overlap)
    seen = []
    for rank in range(3):
        stream = ref.stream(ngram=g, shuffle=True, shuffle_seed=2, num_shards=3, shard_rank=rank)
        seen += [int(w[0]["i"]) for w in stream]
    assert sorted(seen) == g.anchors(ref).tolist()
    if not overlap:
        members = sorted(a + o for a in seen for o in range(-1, 3))
        assert len(members) == len(set(members)), "windows share no record"


def test_window_batches_and_resume(ref):
    args = dict(ngram=ngram(), shuffle=True, shuffle_seed=4, batch_size=8)
    stream = ref.stream(**args)
    it = iter(stream)
    first = next(it)
    assert first[0]["x"].shape == (8, 3) and len(first[2]["payload"]) == 8
    next(it)
    resumed = ref.stream(start_offset=stream.offset, **args)
    assert next(iter(resumed))[0]["i"].tolist() == next(it)[0]["i"].tolist()


def test_windows_through_worker_processes(ref):
    g = ngram()
    stream = ref.stream(
        ngram=g,
        shuffle=True,
        shuffle_seed=9,
        num_workers=2,
        worker_type="process",
        transform=lambda w: {**w, "sum": int(w[0]["i"]) + int(w[-1]["i"])},
    )
    windows = list(stream)
    stream.close()
    assert [w["sum"] for w in windows] == [2 * int(w[0]["i"]) - 1 for w in windows]
    assert [int(w[0]["i"]) for w in windows] == [
        int(w[0]["i"]) for w in ref.stream(ngram=g, shuffle=True, shuffle_seed=9)
    ]


def test_ngram_argument_conflicts(ref):
    with pytest.raises(ValueError, match="fields="):
        ref.stream(ngram=ngram(), fields=["i"])
    with pytest.raises(ValueError, match="cannot be combined"):
        ref.stream(ngram=ngram(), predicate=predicates.in_set("key", [1]))


def test_a_predicate_on_column_fields_reads_only_the_passing_records(ref, monkeypatch):
    from yogadl_plus.cache.reader import ChunkSet

    assert ref.has_columns(ref.select(["key", "i"])) and not ref.has_columns(
        ref.select(["payload"])
    )
    fetched = []
    original = ChunkSet.get_many

    def counting(self, indices, *args):
        fetched.extend(np.asarray(indices).tolist())
        return original(self, indices, *args)

    monkeypatch.setattr(ChunkSet, "get_many", counting)
    got = flat(ref.stream(predicate=predicates.in_set("key", [4]), shuffle=True, shuffle_seed=2))
    assert sorted(fetched) == sorted(got) == list(range(4, N, 10))


def test_a_predicate_on_other_fields_decodes_them_from_the_records(ref):
    long_payload = predicates.in_lambda(["payload"], lambda p: p.startswith("p1"))
    got = flat(ref.stream(predicate=long_payload, batch_size=16))
    assert got == [i for i in range(N) if str(i).startswith("1")]


def test_get_batch_of_column_fields_matches_the_records(ref):
    idx = np.random.default_rng(0).permutation(N)[:50]
    batch = ref.get_batch(idx, fields=["i", "key", "ts"])
    assert batch["i"].tolist() == idx.tolist() and batch["key"].tolist() == (idx % 10).tolist()
    assert batch["ts"].tolist() == [ref[int(i)]["ts"] for i in idx]


@pytest.mark.parametrize("transform", [None, lambda record: record])
def test_batches_of_nullable_fields_keep_their_none(local_storage, transform):
    # Before: a batch with a missing variable-size value was an AttributeError counting its
    # bytes, and through a transform a missing scalar made an object array of the batch.
    records = [
        {
            "v": None if i % 3 == 1 else np.arange(i % 4, dtype=np.float32),
            "n": None if i % 2 else np.float32(i),
        }
        for i in range(6)
    ]
    ref = ydl.cache_dataset(records, "nullable", "v1", local_storage, progress=False)
    (batch,) = ref.stream(batch_size=6, transform=transform)
    assert [None if v is None else v.tolist() for v in batch["v"]] == [
        None if i % 3 == 1 else list(range(i % 4)) for i in range(6)
    ]
    assert isinstance(batch["n"], list)
    assert [None if n is None else float(n) for n in batch["n"]] == [0, None, 2, None, 4, None]
