"""tf.data in and out: TFDatasetSource (element_spec -> schema, batched reading) and
ydl.tensorflow.make_tf_dataset (signature, epochs, exact offsets, model.fit)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import yogadl_plus as ydl  # noqa: E402
from yogadl_plus.sources.tensorflow import TFDatasetSource  # noqa: E402

make_tf_dataset = ydl.tensorflow.make_tf_dataset


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return ydl.LocalStorage(tmp_path_factory.mktemp("tf"))


_names = itertools.count()


def cache(ds, storage, **kwargs):
    return ydl.cache_dataset(ds, f"d{next(_names)}", "v1", storage, progress=False, **kwargs)


def flat(element, prefix=""):
    """An element of tf.data as numpy, flattened to the field names TFDatasetSource uses."""
    if isinstance(element, dict):
        out = {}
        for key, value in element.items():
            out.update(flat(value, f"{prefix}{key}/"))
        return out
    if isinstance(element, tuple):
        out = {}
        for i, value in enumerate(element):
            out.update(flat(value, f"{prefix}{i}/"))
        return out
    return {prefix[:-1] or "value": element}


def assert_same_value(got, want):
    if isinstance(want, bytes):
        assert type(got) is bytes and got == want
    else:
        want = np.asarray(want)
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def as_numpy(value):
    """A tf output as numpy (ragged: a list of the per-row arrays)."""
    if isinstance(value, tf.RaggedTensor):
        rows = [value[i] for i in range(int(value.nrows()))]
        return [(r.to_tensor() if isinstance(r, tf.RaggedTensor) else r).numpy() for r in rows]
    return value.numpy()


def assert_same_structure_and_values(got, want):
    tf.nest.assert_same_structure(got, want)
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
        assert_same_value(g.numpy(), w)


# --- sources: every kind of element round-trips with its dtypes ---


def _variable_lengths():
    return tf.data.Dataset.range(7).map(
        lambda i: {"seq": tf.range(i, dtype=tf.int32), "grid": tf.zeros([i % 3, 2, i % 2 + 1])}
    )


SOURCES = {
    "dict": lambda: tf.data.Dataset.from_tensor_slices(
        {"x": np.arange(12, dtype=np.float32).reshape(6, 2), "label": np.arange(6, dtype=np.uint8)}
    ),
    "tuple": lambda: tf.data.Dataset.from_tensor_slices(
        (np.arange(5, dtype=np.int16), np.ones((5, 3), np.float64), np.arange(5) % 2 == 0)
    ),
    "single": lambda: tf.data.Dataset.from_tensor_slices(
        np.arange(20, dtype=np.int32).reshape(5, 4)
    ),
    "scalar": lambda: tf.data.Dataset.range(9),
    "nested": lambda: tf.data.Dataset.from_tensor_slices(
        {"a": {"b": np.arange(4, dtype=np.int64), "c": (np.ones(4, np.float16), np.zeros(4))}}
    ),
    "ragged": lambda: tf.data.Dataset.from_tensor_slices(
        tf.ragged.constant([[1, 2], [3], [], [4, 5, 6]])
    ),
    "variable": _variable_lengths,
    "strings": lambda: tf.data.Dataset.from_tensor_slices({"text": ["héllo", "", "wörld"]}),
    "bytes": lambda: tf.data.Dataset.from_tensor_slices(
        {"blob": tf.constant([b"\x00\xff\x80", b"", b"abc"]), "n": [1, 2, 3]}
    ),
}


@pytest.mark.parametrize("kind", list(SOURCES))
def test_tf_source_round_trips_values_and_dtypes(kind, storage):
    ds = SOURCES[kind]()
    elements = list(ds.as_numpy_iterator())
    ref = cache(ds, storage)
    assert ref.manifest.source_kind == "tensorflow"
    assert len(ref) == len(elements)
    for i, element in enumerate(elements):
        want = flat(element)
        got = ref[i]
        assert list(got) == list(want)
        for name in want:
            assert_same_value(got[name], want[name])
    # And back out as tf.data with the element's own structure, record by record.
    out = list(make_tf_dataset(ref.stream()))
    assert len(out) == len(elements)
    for got, element in zip(out, ds):
        assert_same_structure_and_values(got, tf.nest.map_structure(lambda t: t.numpy(), element))


def test_schema_comes_from_element_spec(storage):
    ds = tf.data.Dataset.range(4).map(
        lambda i: {
            "img": tf.zeros([i + 1, 3, 2], tf.uint8),
            "s": tf.strings.as_string(i),
            "f": tf.cast(i, tf.float32),
        }
    )
    schema = TFDatasetSource(ds).schema
    assert schema["img"].dtype == np.uint8 and schema["img"].shape == (None, 3, 2)
    assert (
        schema["s"].kind == "bytes" and schema["f"].shape == () and schema["f"].dtype == np.float32
    )
    assert TFDatasetSource(ds).length == 4
    assert TFDatasetSource(ds.filter(lambda e: True)).length is None
    ragged = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1.0], [2.0, 3.0]]))
    assert TFDatasetSource(ragged).schema["value"].shape == (None,)


def test_infinite_dataset_is_refused_saying_to_remove_repeat(storage):
    with pytest.raises(ydl.YogaError, match=r"remove \.repeat\(\)") as info:
        cache(tf.data.Dataset.range(3).repeat(), storage)
    assert isinstance(info.value, ValueError)
    assert len(list(TFDatasetSource(tf.data.Dataset.range(3).repeat(2)).records())) == 6


@pytest.mark.parametrize(
    "ds, message",
    [
        (lambda: tf.data.Dataset.from_tensor_slices(tf.constant([["a", "b"]])), "scalar strings"),
        (
            lambda: tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[[1], [2, 3]], [[4]]])),
            "ragged_rank=1",
        ),
        (
            lambda: tf.data.Dataset.from_tensors(
                tf.sparse.SparseTensor([[0, 0]], [1.0], dense_shape=[2, 2])
            ),
            "SparseTensorSpec",
        ),
        (lambda: tf.data.Dataset.from_tensor_slices({"a/b": [1], "a": {"b": [2]}}), "twice"),
    ],
)
def test_unsupported_elements_fail_clearly(ds, message, storage):
    with pytest.raises(ydl.SchemaError, match=message):
        cache(ds(), storage)


def test_unknown_rank_asks_for_a_shape_or_schema(storage):
    ds = tf.data.Dataset.range(3).map(
        lambda i: tf.py_function(lambda j: tf.range(j), [i], Tout=tf.int64)
    )
    with pytest.raises(ydl.SchemaError, match="schema="):
        cache(ds, storage)
    schema = ydl.Schema([ydl.Field("value", np.int64, (None,))])
    ref = cache(ds, storage, schema=schema)
    assert [ref[i]["value"].tolist() for i in range(3)] == [[], [0], [0, 1]]


def test_reading_is_batched_not_element_by_element(storage, monkeypatch):
    pulls = []
    original = tf.data.Dataset.as_numpy_iterator

    def counting(self):
        pulls.append(self.element_spec)
        for item in original(self):
            pulls.append(None)
            yield item

    monkeypatch.setattr(tf.data.Dataset, "as_numpy_iterator", counting)
    ref = cache(
        tf.data.Dataset.range(20_000).map(lambda i: {"i": i, "v": tf.range(i % 5)}), storage
    )
    monkeypatch.undo()
    spec, items = pulls[0], pulls[1:]
    assert len(items) == 20  # ceil(20_000 / 1024) batches, not 20_000 elements
    assert all(s.shape.rank >= 1 and s.shape[0] is None for s in tf.nest.flatten(spec))
    assert len(ref) == 20_000 and ref[19_999]["v"].tolist() == list(range(19_999 % 5))


# --- make_tf_dataset over a stream ---

N = 53


def _record(i):
    return {
        "id": np.int64(i),
        "x": np.full(3, i, np.float32),
        "grid": np.arange((i % 4) * 2, dtype=np.int32).reshape(i % 4, 1, 2),
        "pair": np.full((3, i % 3), i, np.int16),
        "name": f"r{i}",
        "blob": bytes([i % 256]) * (i % 5),
    }


@pytest.fixture(scope="module")
def ref(storage):
    return cache([_record(i) for i in range(N)], storage)


def assert_batch_equal(got, want):
    assert set(got) == set(want)
    for name, column in want.items():
        value = as_numpy(got[name])
        if isinstance(column, np.ndarray):
            assert value.dtype == column.dtype
            np.testing.assert_array_equal(value, column)
        elif isinstance(column[0], str):
            assert [v.decode() for v in value] == column
        elif isinstance(column[0], bytes):
            assert list(value) == column
        else:
            assert len(value) == len(column)
            for v, c in zip(value, column):
                assert v.dtype == c.dtype
                np.testing.assert_array_equal(v, c)


def test_batch_mode_yields_the_streams_own_batches(ref):
    def stream():
        return ref.stream(shuffle=True, shuffle_seed=4, batch_size=7)

    got = list(make_tf_dataset(stream()))
    want = list(stream())
    assert len(got) == len(want) == 8
    for g, w in zip(got, want):
        assert_batch_equal(g, w)


def test_record_mode_yields_the_streams_own_records(ref):
    got = list(make_tf_dataset(ref.stream(shuffle=True, shuffle_seed=4, fields=["id", "name"])))
    want = list(ref.stream(shuffle=True, shuffle_seed=4, fields=["id", "name"]))
    assert [int(g["id"]) for g in got] == [int(w["id"]) for w in want]
    assert [g["name"].numpy().decode() for g in got] == [w["name"] for w in want]


def test_signature_has_none_dims_strings_and_ragged(ref):
    spec = make_tf_dataset(ref.stream()).element_spec
    assert spec["grid"] == tf.TensorSpec((None, 1, 2), tf.int32)
    assert spec["pair"] == tf.TensorSpec((3, None), tf.int16)
    assert spec["name"] == spec["blob"] == tf.TensorSpec((), tf.string)
    batched = make_tf_dataset(ref.stream(batch_size=4)).element_spec
    assert batched["x"] == tf.TensorSpec((None, 3), tf.float32)
    assert batched["id"] == tf.TensorSpec((None,), tf.int64)
    assert batched["name"] == tf.TensorSpec((None,), tf.string)
    assert batched["grid"] == tf.RaggedTensorSpec((None, None, 1, 2), tf.int32, ragged_rank=1)
    assert batched["pair"] == tf.RaggedTensorSpec((None, 3, None), tf.int16, ragged_rank=2)
    flat_spec = make_tf_dataset(ref.stream(fields=["id"]), nested=False).element_spec
    assert flat_spec == {"id": tf.TensorSpec((), tf.int64)}


def test_repeat_gives_the_next_epochs(ref):
    kwargs = dict(shuffle=True, shuffle_seed=8, batch_size=10, fields=["id"])
    stream = ref.stream(**kwargs)
    got = [b["id"].numpy().tolist() for b in make_tf_dataset(stream).repeat(2)]
    epoch0 = [b["id"].tolist() for b in ref.stream(**kwargs)]
    epoch1 = [b["id"].tolist() for b in ref.stream(start_offset=N, **kwargs)]
    assert got == epoch0 + epoch1 and epoch0 != epoch1
    assert stream.offset == 2 * N


def test_mid_epoch_resume_continues_with_the_next_batch(ref):
    kwargs = dict(shuffle=True, shuffle_seed=2, batch_size=6, fields=["id", "grid"])
    full = [b["id"].tolist() for b in ref.stream(**kwargs)]
    stream = ref.stream(**kwargs)
    epoch = stream.next_epoch_position[0]
    taken = [b["id"].numpy().tolist() for b in make_tf_dataset(stream).take(3)]
    assert taken == full[:3]
    assert stream.offset_after(epoch, 3) == 18  # whatever tf.data read ahead
    resumed = ref.stream(start_offset=stream.offset_after(epoch, 3), **kwargs)
    rest = [b["id"].numpy().tolist() for b in make_tf_dataset(resumed)]
    assert taken + rest == full


def test_without_read_ahead_stream_offset_is_what_was_taken(ref):
    kwargs = dict(shuffle=True, shuffle_seed=2, batch_size=6, fields=["id", "grid"])
    stream = ref.stream(**kwargs)
    taken = [b["id"].numpy().tolist() for b in make_tf_dataset(stream, read_ahead=False).take(3)]
    assert stream.offset == 18 and len(taken) == 3  # no read-ahead past what was taken
    records = ref.stream(shuffle=True, shuffle_seed=2)
    list(make_tf_dataset(records, read_ahead=False).take(7))
    assert records.offset == 7


@pytest.mark.parametrize("batch_size", [None, 7])
def test_offset_after_maps_items_consumed_to_the_exact_position_with_a_predicate(ref, batch_size):
    odd = ydl.predicates.in_lambda(["id"], lambda i: i % 2 == 1)
    kwargs = dict(shuffle=True, shuffle_seed=4, fields=["id"], predicate=odd, batch_size=batch_size)
    whole = [int(i) for b in ref.stream(**kwargs) for i in np.atleast_1d(b["id"])]
    stream = ref.stream(start_offset=9, **kwargs)  # resumed mid-epoch 0
    epoch = stream.next_epoch_position[0]
    data = make_tf_dataset(stream)
    taken = [int(i) for b in data.take(4) for i in np.atleast_1d(b["id"].numpy())]
    resumed = ref.stream(start_offset=stream.offset_after(epoch, 4), **kwargs)
    rest = [int(i) for b in make_tf_dataset(resumed) for i in np.atleast_1d(b["id"].numpy())]
    head = [int(i) for b in ref.stream(**kwargs) for i in np.atleast_1d(b["id"])]
    assert taken + rest == [i for i in head if i in set(taken + rest)]
    assert sorted(taken + rest) == sorted(set(whole) - set(_passing_before(ref, kwargs, 9)))
    assert stream.offset_after(epoch) == N  # the whole epoch
    # An epoch not iterated is counted from its start (a rank restarted alone).
    fresh = ref.stream(**kwargs)
    assert (
        fresh.offset_after(5, 4)
        == stream.offset_after(5, 4)
        == ref.stream(**kwargs, start_offset=5 * N).offset_after(5, 4)
    )


def _passing_before(ref, kwargs, positions):
    """The ids at the first ``positions`` positions of epoch 0 that pass the predicate."""
    order = ref.stream(shuffle=True, shuffle_seed=4, fields=["id"])
    return [int(r["id"]) for r, _ in zip(order, range(positions)) if int(r["id"]) % 2 == 1]


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_model_fit_two_epochs_and_offset_is_exact_inside_fit(ref):
    stream = ref.stream(shuffle=True, shuffle_seed=1, batch_size=8, fields=["x", "id"])
    ds = make_tf_dataset(stream).map(lambda b: (b["x"] / N, b["id"] % 2))
    history = _model().fit(ds, epochs=2, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 2 and stream.offset == 2 * N
    # Stopped after 3 steps, the offset is after exactly 3 batches: Keras read none ahead.
    stream = ref.stream(shuffle=True, shuffle_seed=1, batch_size=8, fields=["x", "id"])
    ds = make_tf_dataset(stream, read_ahead=False).map(lambda b: (b["x"] / N, b["id"] % 2))
    _model().fit(ds, epochs=1, steps_per_epoch=3, verbose=0, shuffle=False)
    assert stream.offset == 3 * 8


def test_model_fit_of_a_resumed_stream_finishes_the_epoch_then_runs_whole_ones(ref):
    kwargs = dict(shuffle=True, shuffle_seed=1, batch_size=8, fields=["x", "id"])
    stream = ref.stream(start_offset=5 * 8, **kwargs)
    seen = []

    def log(ids):
        seen.append(ids.numpy().tolist())
        return ids

    def to_xy(b):
        ids = tf.py_function(log, [b["id"]], tf.int64)
        with tf.control_dependencies([ids]):
            return b["x"] / N, b["id"] % 2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras: "Your input ran out of data" (the short one)
        _model().fit(make_tf_dataset(stream).map(to_xy), epochs=3, verbose=0)
    want = [b["id"].tolist() for b in ref.stream(**kwargs)][5:]
    want += [b["id"].tolist() for e in (1, 2) for b in ref.stream(start_offset=e * N, **kwargs)]
    assert seen == want


def test_transform_signature_is_inferred_or_given(ref):
    def to_pair(r):
        return r["x"] * 2, np.int64(r["id"] % 2)

    stream = ref.stream(fields=["x", "id"], transform=to_pair, batch_size=5)
    ds = make_tf_dataset(stream)
    assert ds.element_spec == (
        tf.TensorSpec((None, 3), tf.float32),
        tf.TensorSpec((None,), tf.int64),
    )
    x, y = next(iter(ds))
    np.testing.assert_array_equal(x.numpy()[:, 0], np.arange(5) * 2.0)
    assert y.numpy().tolist() == [0, 1, 0, 1, 0]
    history = _model().fit(ds, epochs=1, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 1

    def grid_only(r):
        return {"g": r["grid"].reshape(-1)}

    signature = {"g": tf.RaggedTensorSpec((None, None), tf.int32, ragged_rank=1)}
    stream = ref.stream(fields=["grid"], transform=grid_only, batch_size=4)
    first = next(iter(make_tf_dataset(stream, output_signature=signature)))
    assert [len(row) for row in first["g"].to_list()] == [0, 2, 4, 6]


def test_ngram_items_are_nested_by_offset(storage):
    records = [{"t": np.int64(i), "v": np.float32(i) * 10} for i in range(12)]
    ref = cache(records, storage)
    ngram = ydl.NGram({0: ["v"], 1: ["v", "t"]}, delta_threshold=1, timestamp_field="t")
    ds = make_tf_dataset(ref.stream(ngram=ngram, batch_size=4))
    assert ds.element_spec[1]["t"] == tf.TensorSpec((None,), tf.int64)
    first = next(iter(ds))
    assert first[0]["v"].numpy().tolist() == [0, 10, 20, 30]
    assert first[1]["t"].numpy().tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("batch_size", [None, 4])
def test_ngram_offsets_not_named_are_empty_dicts_as_the_streams(storage, batch_size):
    # Petastorm yields an empty entry for each offset between two named ones: so do the
    # stream and tf.data, in records and batches (through the block path too).
    records = [{"t": np.int64(i), "v": np.float32(i) * 10} for i in range(12)]
    ref = cache(records, storage)
    ngram = ydl.NGram({0: ["v"], 2: ["v", "^t$"]}, delta_threshold=1, timestamp_field="t")
    ds = make_tf_dataset(ref.stream(ngram=ngram, batch_size=batch_size))
    assert list(ds.element_spec) == [0, 1, 2] and ds.element_spec[1] == {}
    got = list(ds)
    want = list(ref.stream(ngram=ngram, batch_size=batch_size))
    assert len(got) == len(want) and all(g[1] == {} for g in got)
    for g, w in zip(got, want):
        assert g[2]["t"].numpy().tolist() == np.asarray(w[2]["t"]).tolist()
        assert g[0]["v"].numpy().tolist() == np.asarray(w[0]["v"]).tolist()


def test_nullable_fields_are_refused_and_datetimes_become_int64(storage):
    stamps = np.array(["2024-01-01", "2024-01-02"], dtype="datetime64[s]")
    records = [{"when": stamps[i], "note": None if i else "a"} for i in range(2)]
    ref = cache(records, storage)
    with pytest.raises(ValueError, match="nullable"):
        make_tf_dataset(ref.stream())
    got = [
        b["when"].numpy().tolist()
        for b in make_tf_dataset(ref.stream(fields=["when"], batch_size=2))
    ]
    assert got == [stamps.astype(np.int64).tolist()]


@pytest.mark.slow
def test_cardinality_is_a_whole_epoch_and_iterations_may_end_before_it(ref):
    assert int(make_tf_dataset(ref.stream(batch_size=10)).cardinality()) == 6
    assert int(make_tf_dataset(ref.stream(batch_size=10, drop_last=True)).cardinality()) == 5
    assert int(make_tf_dataset(ref.stream(batch_size=10)).repeat(2).cardinality()) == 12
    assert int(make_tf_dataset(ref.stream()).cardinality()) == N
    resumed = make_tf_dataset(ref.stream(batch_size=10, start_offset=5))
    assert int(resumed.cardinality()) == 6  # no check: the resumed epoch ends early
    assert len(list(resumed)) == 5 and len(list(resumed)) == 6  # then whole epochs
    records = make_tf_dataset(ref.stream(start_offset=N - 1))
    assert [len(list(records)) for _ in range(3)] == [1, N, N]
    odd = ydl.predicates.in_lambda(["id"], lambda i: i % 2 == 1)
    filtered = make_tf_dataset(ref.stream(batch_size=10, predicate=odd))
    assert int(filtered.cardinality()) == 6  # an upper bound
    assert [sum(len(b["id"]) for b in filtered) for _ in range(2)] == [N // 2, N // 2]
    nothing = ydl.predicates.in_lambda(["id"], lambda i: False)
    empty = make_tf_dataset(ref.stream(predicate=nothing))
    with pytest.warns(ydl.NothingPassedWarning, match="kept none of the 53 records"):
        assert [len(list(empty)) for _ in range(2)] == [0, 0]


def test_cacheable_builds_a_tf_pipeline_once(tmp_path):
    storage = ydl.LocalStorage(tmp_path)
    calls = []

    @storage.cacheable("tf-cacheable", "v1")
    def pipeline(n):
        calls.append(n)
        return tf.data.Dataset.range(n).map(lambda i: {"i": i, "sq": i * i})

    first, again = pipeline(20), pipeline(20)
    assert calls == [20], "the pipeline runs only when the version is missing"
    assert len(first) == len(again) == 20 and again[7] == {"i": 7, "sq": 49}


def test_cacheable_builds_a_keras_pydataset_once(tmp_path):
    storage = ydl.LocalStorage(tmp_path)

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 3

        def __getitem__(self, k):
            x = np.arange(4 * k, 4 * k + 4, dtype=np.float32)[:, None]
            return x, (x[:, 0] > 5).astype(np.int64)

    runs = []

    @storage.cacheable("keras-cacheable", "v1")
    def batches():
        runs.append(1)
        return Batches()

    ref, _ = batches(), batches()
    assert runs == [1] and len(ref) == 12 and ref[7]["y"] == 1 and ref[2]["x"].tolist() == [2.0]


# --- records: blocks read in Python, unbatched in tf.data (the default) ---


def assert_same_records(got, want):
    """Two lists of record-mode elements: same structure, types, shapes and values."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        tf.nest.assert_same_structure(g, w)
        for a, b in zip(tf.nest.flatten(g), tf.nest.flatten(w)):
            assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_read_ahead_gives_record_mode_items_in_the_same_order(ref):
    def stream():
        return ref.stream(shuffle=True, shuffle_seed=5)

    record_mode = make_tf_dataset(stream(), read_ahead=False)
    ahead = make_tf_dataset(stream())
    assert ahead.element_spec == record_mode.element_spec
    assert ahead.element_spec["grid"] == tf.TensorSpec((None, 1, 2), tf.int32)
    assert ahead.element_spec["name"] == tf.TensorSpec((), tf.string)
    assert int(ahead.cardinality()) == N
    got, want = list(ahead), list(record_mode)
    assert [int(g["id"]) for g in got] != list(range(N))  # shuffled
    assert_same_records(got, want)
    assert [g["name"].numpy().decode() for g in got] == [w["name"] for w in stream()]
    assert [g["blob"].numpy() for g in got] == [w["blob"] for w in stream()]


def test_read_ahead_keeps_nested_structures_and_transforms(storage):
    ds = SOURCES["nested"]()
    nested_ref = cache(ds, storage)
    record_mode = make_tf_dataset(nested_ref.stream(shuffle=True, shuffle_seed=1), read_ahead=False)
    ahead = make_tf_dataset(nested_ref.stream(shuffle=True, shuffle_seed=1))
    assert ahead.element_spec == record_mode.element_spec
    assert_same_records(list(ahead), list(record_mode))

    variable = cache(_variable_lengths(), storage)

    def transform(r):
        return r["seq"] * 2, r["grid"]

    inferred = make_tf_dataset(variable.stream(transform=transform))
    record_inferred = make_tf_dataset(variable.stream(transform=transform), read_ahead=False)
    assert inferred.element_spec == record_inferred.element_spec
    signature = (tf.TensorSpec((None,), tf.int32), tf.TensorSpec((None, 2, None), tf.float32))
    record_mode = make_tf_dataset(
        variable.stream(transform=transform), output_signature=signature, read_ahead=False
    )
    given = make_tf_dataset(variable.stream(transform=transform), output_signature=signature)
    assert given.element_spec == record_mode.element_spec == signature
    assert_same_records(list(given), list(record_mode))


def test_read_ahead_repeat_gives_the_next_epochs(ref):
    kwargs = dict(shuffle=True, shuffle_seed=8, fields=["id"])
    stream = ref.stream(**kwargs)
    got = [int(r["id"]) for r in make_tf_dataset(stream).repeat(2)]
    epoch0 = [int(r["id"]) for r in ref.stream(**kwargs)]
    epoch1 = [int(r["id"]) for r in ref.stream(start_offset=N, **kwargs)]
    assert got == epoch0 + epoch1 and epoch0 != epoch1
    assert stream.offset == 2 * N


def test_read_ahead_resumes_at_offset_after_the_records_consumed(ref):
    kwargs = dict(shuffle=True, shuffle_seed=2, fields=["id", "grid"])
    full = [int(r["id"]) for r in ref.stream(start_offset=N, **kwargs)]  # epoch 1
    stream = ref.stream(start_offset=N + 5, **kwargs)  # a stream resumed mid-epoch 1
    ahead = make_tf_dataset(stream)
    taken = [int(r["id"]) for r in ahead.take(13)]
    assert taken == full[5:18] and stream.offset > N + 18  # tf.data read ahead
    resumed = make_tf_dataset(ref.stream(start_offset=stream.offset_after(1, 13), **kwargs))
    assert [int(r["id"]) for r in resumed] == full[18:]
    # A stream already iterated: the dataset starts where its next iter() would.
    stream = ref.stream(**kwargs)
    next(iter(stream))
    assert [int(r["id"]) for r in make_tf_dataset(stream)] == full


@pytest.mark.parametrize("bad", [0, 8, 2.5, None, "8"])
def test_read_ahead_refuses_what_is_not_a_bool(ref, bad):
    with pytest.raises(ValueError, match="read_ahead must be True or False"):
        make_tf_dataset(ref.stream(), read_ahead=bad)


EMPTY_VALUES_SCRIPT = """
import sys, numpy as np, yogadl_plus as ydl
ref = ydl.cache_dataset(
    ({"i": np.int64(i), "e": np.zeros((2, 0), np.float32)} for i in range(10)),
    "empty", "v1", ydl.LocalStorage(sys.argv[1]), progress=False)
for stream in (ref.stream(batch_size=4), ref.stream(batch_size=4, drop_last=True), ref.stream()):
    items = list(ydl.tensorflow.make_tf_dataset(stream))
    ids = [int(i) for item in items for i in np.atleast_1d(item["i"].numpy())]
    assert ids == list(range(len(ids))) and len(ids) in (8, 10), ids
    assert all(tuple(item["e"].shape[-2:]) == (2, 0) for item in items)
print("ok")
"""


@pytest.mark.slow
def test_values_with_a_zero_dim_come_through_without_a_crash(tmp_path):
    # Before: TensorFlow's unbatch, which the face used for blocks and groups of batches,
    # ended the process with a segmentation fault on a field of shape (2, 0).
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", EMPTY_VALUES_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and result.stdout.endswith("ok\n"), result.stderr[-2000:]
