"""NGram: which windows exist (against a brute-force reference), how they are read, and the
errors at construction, against a schema and on unsorted timestamps."""

from __future__ import annotations

import datetime
import itertools
import pickle
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.columns import collate
from yogadl_plus.errors import NGramError
from yogadl_plus.ngram import NGram
from yogadl_plus.stream import ngram_reader

# --- helpers ---


def brute_anchors(ts, offsets, delta, overlap):
    """Anchors by definition: every window inside [0, n) whose gaps are all <= delta, then the
    greedy non-overlapping subset."""
    lo, hi = min(offsets), max(offsets)
    n = len(ts)
    valid = [
        k
        for k in range(-lo, n - hi)
        if all(ts[i + 1] - ts[i] <= delta for i in range(k + lo, k + hi))
    ]
    if overlap:
        return valid
    chosen, last_used = [], -1
    for k in valid:
        if k + lo > last_used:
            chosen.append(k)
            last_used = k + hi
    return chosen


class FakeRef:
    """Just what NGram.anchors reads: len, schema, get_batch of the timestamp field."""

    def __init__(self, ts):
        self.ts = np.asarray(ts)
        self.schema = ydl.Schema([ydl.Field("ts", self.ts.dtype), ydl.Field("x", np.int64)])
        self.reads = 0

    def __len__(self):
        return len(self.ts)

    def get_batch(self, indices, fields=None):
        assert list(fields) == ["ts"]
        self.reads += 1
        return {"ts": self.ts[np.asarray(indices)]}


def build(records, tmp, chunk_bytes=400):
    storage = ydl.LocalStorage(tmp)
    return ydl.cache_dataset(records, "d", "v", storage, progress=False, chunk_bytes=chunk_bytes)


def timestamps_from_gaps(gaps, start=100):
    return np.concatenate([[start], start + np.cumsum(gaps)]).astype(np.int64)


offsets_strategy = st.sets(st.integers(-4, 4), min_size=1, max_size=4)
gaps_strategy = st.lists(st.integers(0, 4), min_size=0, max_size=60)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """60 records over several chunks, gaps of 1 except a jump of 10 after record 29."""
    ts = np.arange(60, dtype=np.float64)
    ts[30:] += 10
    records = [
        {"ts": float(t), "x": np.full(4, i, np.float32), "id": i, "s": f"r{i}"}
        for i, t in enumerate(ts)
    ]
    dataref = build(records, tmp_path_factory.mktemp("ngram"))
    assert len(dataref.manifest.chunks) > 3
    return dataref


# --- which windows exist ---


@settings(max_examples=300, deadline=None)
@given(
    gaps=gaps_strategy,
    offsets=offsets_strategy,
    delta=st.integers(0, 3),
    overlap=st.booleans(),
    block=st.integers(1, 9),
    as_float=st.booleans(),
)
def test_anchors_match_brute_force(gaps, offsets, delta, overlap, block, as_float):
    ts = timestamps_from_gaps(gaps)
    if as_float:
        ts = ts.astype(np.float64)
    ngram = NGram({o: ["x"] for o in offsets}, delta, "ts", overlap)
    saved = ngram_reader._TS_BLOCK
    ngram_reader._TS_BLOCK = block  # windows across many read blocks
    try:
        got = ngram.anchors(FakeRef(ts))
    finally:
        ngram_reader._TS_BLOCK = saved
    assert got.dtype == np.int64
    assert got.tolist() == brute_anchors(ts.tolist(), offsets, delta, overlap)


@settings(max_examples=25, deadline=None)
@given(gaps=gaps_strategy, offsets=offsets_strategy, delta=st.integers(0, 3))
def test_anchors_of_real_caches_match_brute_force(gaps, offsets, delta):
    ts = timestamps_from_gaps(gaps)
    records = [{"ts": np.int64(t), "id": i} for i, t in enumerate(ts)]
    with tempfile.TemporaryDirectory() as tmp:
        dataref = build(records, tmp, chunk_bytes=200)
        for overlap in (True, False):
            ngram = NGram({o: ["id"] for o in offsets}, delta, "ts", overlap)
            expected = brute_anchors(ts.tolist(), offsets, delta, overlap)
            assert ngram.anchors(dataref).tolist() == expected
            windows = ngram.read_windows(dataref, ngram.anchors(dataref))
            assert [[int(w[o]["id"]) for o in sorted(offsets)] for w in windows] == [
                [k + o for o in sorted(offsets)] for k in expected
            ]
        dataref.close()


@settings(max_examples=200, deadline=None)
@given(gaps=gaps_strategy, offsets=offsets_strategy, delta=st.integers(0, 3))
def test_greedy_windows_are_disjoint_and_each_skipped_one_overlaps_the_previous(
    gaps, offsets, delta
):
    ts = timestamps_from_gaps(gaps)
    fields = {o: ["x"] for o in offsets}
    valid = NGram(fields, delta, "ts", True).anchors(FakeRef(ts)).tolist()
    ngram = NGram(fields, delta, "ts", False)
    chosen = ngram.anchors(FakeRef(ts)).tolist()
    span = ngram.span
    assert set(chosen) <= set(valid)
    used = [r for k in chosen for r in range(k + ngram.min_offset, k + ngram.max_offset + 1)]
    assert len(used) == len(set(used))
    for k in set(valid) - set(chosen):
        previous = max(c for c in chosen if c < k)
        assert k - previous < span
    if valid:
        assert chosen[0] == valid[0]


def test_windows_span_chunk_boundaries_and_stop_at_the_jump(ref):
    ngram = NGram({-1: ["id"], 0: ["id", "x"], 2: ["s"]}, 1.5, "ts")
    anchors = ngram.anchors(ref)
    # Records 0..29 and 30..59 are runs; a window covers records k-1 .. k+2.
    assert anchors.tolist() == list(range(1, 28)) + list(range(31, 58))
    windows = ngram.read_windows(ref, anchors)
    for k, window in zip(anchors.tolist(), windows):
        assert list(window) == [-1, 0, 1, 2] and window[1] == {}  # (offset 1 is not named)
        assert window[-1] == {"id": k - 1}
        assert set(window[0]) == {"id", "x"} and window[0]["id"] == k
        np.testing.assert_array_equal(window[0]["x"], np.full(4, k, np.float32))
        assert window[2] == {"s": f"r{k + 2}"}


def test_non_overlapping_windows_of_a_real_cache(ref):
    ngram = NGram({0: ["id"], 1: ["id"], 2: ["id"]}, 1, "ts", timestamp_overlap=False)
    assert ngram.anchors(ref).tolist() == list(range(0, 28, 3)) + list(range(30, 58, 3))


def test_gaps_at_offsets_not_named_count(ref):
    # Offsets 0 and 3 only, but the jump between records 29 and 30 lies between them.
    ngram = NGram({0: ["id"], 3: ["id"]}, 1, "ts")
    anchors = ngram.anchors(ref).tolist()
    assert 26 in anchors and 27 not in anchors and 29 not in anchors and 30 in anchors


def test_a_window_longer_than_the_dataset_gives_nothing():
    assert NGram({0: ["x"], 5: ["x"]}, 1, "ts").anchors(FakeRef(np.arange(5.0))).size == 0
    assert NGram({0: ["x"], 4: ["x"]}, 1, "ts").anchors(FakeRef(np.arange(5.0))).tolist() == [0]


def test_nan_timestamps_break_windows():
    ts = np.array([0.0, 1.0, np.nan, 3.0, 4.0, 5.0])
    ngram = NGram({0: ["x"], 1: ["x"]}, 1, "ts")
    assert ngram.anchors(FakeRef(ts)).tolist() == [0, 3, 4]


def test_small_int_dtypes_do_not_wrap_around():
    ts = np.array([-100, 100], dtype=np.int8)
    assert NGram({0: ["x"], 1: ["x"]}, 5, "ts").anchors(FakeRef(ts)).size == 0
    ts = np.array([0, 1, 2, 250], dtype=np.uint8)
    assert NGram({0: ["x"], 1: ["x"]}, 5, "ts").anchors(FakeRef(ts)).tolist() == [0, 1]


def test_datetime64_timestamps_with_a_timedelta_threshold(tmp_path):
    seconds = [0, 1, 2, 10, 11, 13, 14]
    records = [
        {"ts": np.datetime64("2024-01-01T00:00:00", "ns") + np.timedelta64(s, "s"), "id": i}
        for i, s in enumerate(seconds)
    ]
    dataref = build(records, tmp_path)
    for delta in (
        np.timedelta64(1, "s"),
        np.timedelta64(1000, "ms"),
        datetime.timedelta(seconds=1),
    ):
        ngram = NGram({0: ["id"], 1: ["id"]}, delta, "ts")
        assert ngram.anchors(dataref).tolist() == [0, 1, 3, 5]
    ngram = NGram({0: ["id"], 1: ["id"]}, np.timedelta64(2, "s"), "ts", timestamp_overlap=False)
    assert ngram.anchors(dataref).tolist() == [0, 3, 5]
    with pytest.raises(ydl.SchemaError, match=r"np\.timedelta64"):
        NGram({0: ["id"]}, 1, "ts").anchors(dataref)


# --- unsorted timestamps ---


@pytest.mark.parametrize("block", [65536, 42, 7])
def test_unsorted_timestamps_inside_a_window_raise_naming_both_records(block, monkeypatch):
    monkeypatch.setattr(ngram_reader, "_TS_BLOCK", block)
    ts = np.concatenate([np.linspace(0.0, 17.0, 42), 12.5 + np.arange(18.0)])
    assert (np.diff(ts) < 0).sum() == 1
    ngram = NGram({0: ["x"], 1: ["x"]}, 100, "ts")
    with pytest.raises(NGramError) as info:
        ngram.anchors(FakeRef(ts))
    message = str(info.value)
    assert "record 41 has 17.0, record 42 has 12.5" in message
    assert "'ts'" in message and "sorted" in message
    assert isinstance(info.value, ydl.YogaError) and isinstance(info.value, ValueError)


def test_unsorted_timestamps_outside_any_window_are_fine():
    ts = np.array([5.0, 3.0, 9.0, 1.0])
    assert NGram({0: ["x"]}, 0, "ts").anchors(FakeRef(ts)).tolist() == [0, 1, 2, 3]
    assert NGram({3: ["x"]}, 0, "ts", False).anchors(FakeRef(ts)).tolist() == [-3, -2, -1, 0]
    # A window of 5 records does not fit in 4: no window, so no order to complain about.
    assert NGram({0: ["x"], 4: ["x"]}, 0, "ts").anchors(FakeRef(ts)).size == 0


def test_a_decrease_in_the_last_pair_is_caught():
    ts = np.array([1.0, 2.0, 3.0, 2.5])
    with pytest.raises(NGramError, match=r"record 2 has 3\.0, record 3 has 2\.5"):
        NGram({-2: ["x"], 0: ["x"]}, 10, "ts").anchors(FakeRef(ts))


# --- caching ---


def test_anchors_are_read_once_per_dataref_and_shared(ref, monkeypatch):
    calls = []
    original = ref.get_batch

    def counting(indices, fields=None):
        calls.append(list(fields))
        return original(indices, fields)

    monkeypatch.setattr(ref, "get_batch", counting)
    ngram = NGram({0: ["id"], 1: ["id"], 4: ["x"]}, 0.75, "ts")
    first = ngram.anchors(ref)
    assert calls and all(c == ["ts"] for c in calls)
    calls.clear()
    assert ngram.anchors(ref) is first
    # Same window geometry and threshold, other fields: the same anchors, not read again.
    assert NGram({0: ["x"], 4: ["s"]}, 0.75, "ts").anchors(ref) is first
    assert calls == []
    with pytest.raises(ydl.SchemaError, match="'nope'"):
        NGram({0: ["nope"], 4: ["s"]}, 0.75, "ts").anchors(ref)
    with pytest.raises(ValueError):
        first[0] = 5  # the shared array is read-only
    # Another threshold is another computation.
    NGram({0: ["id"], 1: ["id"], 4: ["x"]}, 2, "ts").anchors(ref)
    assert calls


def test_the_stream_reads_windows_through_the_reader_that_ngram_hands_over_to(ref):
    ngram = NGram({0: ["id"], 2: ["x"]}, 1, "ts")
    first = ngram_reader.anchors(ngram, ref)
    assert ngram.anchors(ref) is first  # one cache, whichever way it is asked
    picked = first[[0, 3]]
    batch = ngram_reader.read_batch(ngram, ref, picked)
    assert ngram.read_batch(ref, picked).keys() == batch.keys() == {0, 1, 2}
    via_method = ngram.read_windows(ref, picked)
    assert [w[0]["id"] for w in via_method] == [
        w[0]["id"] for w in ngram_reader.read_windows(ngram, ref, picked)
    ]


def test_a_pickled_dataref_computes_its_own(ref):
    ngram = NGram({0: ["id"], 1: ["id"]}, 1, "ts")
    expected = ngram.anchors(ref).tolist()
    copy = pickle.loads(pickle.dumps(ref))
    assert getattr(copy, "_ngram_anchors", {}) == {}
    assert ngram.anchors(copy).tolist() == expected


# --- records of windows, batches ---


def test_window_records():
    ngram = NGram({3: ["x"], -2: ["x"], 0: ["x"]}, 1, "ts")
    assert ngram.offsets == (-2, 0, 3)
    assert (ngram.min_offset, ngram.max_offset, ngram.span) == (-2, 3, 6)
    records = ngram.window_records(np.array([2, 5]))
    assert records.dtype == np.int64
    assert records.tolist() == [[0, 2, 5], [3, 5, 8]]
    assert ngram.window_records([]).shape == (0, 3)
    with pytest.raises(TypeError):
        ngram.window_records(np.array([1.5]))


def test_read_batch_and_assemble(ref):
    ngram = NGram({0: ["id", "x"], 2: ["s"]}, 1, "ts")
    anchors = np.array([3, 40, 10])
    batch = ngram.read_batch(ref, anchors)
    assert list(batch) == [0, 1, 2] and batch[1] == {}
    assert set(batch[0]) == {"id", "x"} and set(batch[2]) == {"s"}
    assert batch[0]["id"].tolist() == [3, 40, 10]
    assert batch[0]["x"].shape == (3, 4)
    assert batch[2]["s"] == ["r5", "r42", "r12"]
    window = ngram.assemble(batch, 1)
    assert window[0]["id"] == 40 and window[2] == {"s": "r42"}
    np.testing.assert_array_equal(window[0]["x"], np.full(4, 40, np.float32))
    windows = ngram.read_windows(ref, anchors)
    assert [w[0]["id"] for w in windows] == [3, 40, 10]
    assert [w[2]["s"] for w in windows] == ["r5", "r42", "r12"]
    collated = collate(windows)
    assert collated[0]["id"].tolist() == [3, 40, 10] and collated[2]["s"] == ["r5", "r42", "r12"]
    np.testing.assert_array_equal(collated[0]["x"], batch[0]["x"])
    with pytest.raises(IndexError, match="record 60"):
        ngram.read_windows(ref, [58])
    with pytest.raises(IndexError, match="record -1"):
        NGram({-1: ["id"]}, 1, "ts").read_batch(ref, [0])


# --- checks ---


@pytest.mark.parametrize(
    ("kwargs", "quoted"),
    [
        ({"fields": {}}, "{}"),
        ({"fields": [(0, ["x"])]}, "[(0, ['x'])]"),
        ({"fields": None}, "None"),
        ({"fields": {"0": ["x"]}}, "'0'"),
        ({"fields": {True: ["x"]}}, "True"),
        ({"fields": {1.0: ["x"]}}, "1.0"),
        ({"fields": {0: []}}, "[]"),
        ({"fields": {0: "x"}}, "'x'"),
        ({"fields": {0: [""]}}, "''"),
        ({"fields": {0: ["x", 3]}}, "3"),
        ({"fields": {0: ["x", "x"]}}, "['x', 'x']"),
        ({"fields": {2**63: ["x"]}}, str(2**63)),
        ({"delta_threshold": "1"}, "'1'"),
        ({"delta_threshold": None}, "None"),
        ({"delta_threshold": True}, "True"),
        ({"delta_threshold": 1j}, "1j"),
        ({"delta_threshold": -1}, "-1"),
        ({"delta_threshold": float("nan")}, "nan"),
        ({"delta_threshold": np.datetime64("2024-01-01")}, "2024-01-01"),
        ({"delta_threshold": np.timedelta64(-1, "s")}, "-1"),
        ({"delta_threshold": np.timedelta64(1, "M")}, "'M'"),
        ({"delta_threshold": np.timedelta64(5)}, "generic"),
        ({"timestamp_field": ""}, "''"),
        ({"timestamp_field": 3}, "3"),
        ({"timestamp_field": None}, "None"),
        ({"timestamp_overlap": "no"}, "'no'"),
    ],
)
def test_constructor_rejects_bad_arguments_quoting_them(kwargs, quoted):
    args = {"fields": {0: ["x"]}, "delta_threshold": 1, "timestamp_field": "ts"}
    args.update(kwargs)
    with pytest.raises(ValueError) as info:
        NGram(**args)
    assert quoted in str(info.value)


def test_constructor_accepts_numpy_numbers_and_infinity():
    ngram = NGram({np.int64(-1): ("a",), 2: ["b", "c"]}, np.float32(0.5), "ts")
    assert ngram.offsets == (-1, 2) and type(ngram.offsets[0]) is int
    assert ngram.fields == {-1: ("a",), 2: ("b", "c")}
    assert ngram.delta_threshold == 0.5
    assert NGram({0: ["a"]}, float("inf"), "ts").delta_threshold == float("inf")
    assert NGram({0: ["a"]}, np.int64(3), "ts").delta_threshold == 3


def schema(**ts):
    spec = {"dtype": np.float64, **ts}
    return ydl.Schema(
        [ydl.Field("ts", **spec), ydl.Field("x", np.float32, (4,)), ydl.Field("s", str)]
    )


def test_check_accepts_a_fitting_schema():
    NGram({0: ["x"], 1: ["s", "ts"]}, 1, "ts").check(schema())
    NGram({0: ["x"]}, 1, "ts").check(schema(dtype=np.int32))
    NGram({0: ["x"]}, np.timedelta64(1, "s"), "ts").check(schema(dtype="datetime64[ns]"))


@pytest.mark.parametrize(
    ("ngram", "ts", "words"),
    [
        (NGram({0: ["x"], 1: ["nope"]}, 1, "ts"), {}, ["'nope'", "offset 1", "'x'"]),
        (NGram({0: ["x"]}, 1, "time"), {}, ["'time'", "timestamp_field"]),
        (NGram({0: ["x"]}, 1, "ts"), {"dtype": str}, ["'ts'"]),
        (NGram({0: ["x"]}, 1, "ts"), {"dtype": bool}, ["'ts'"]),
        (NGram({0: ["x"]}, 1, "ts"), {"dtype": np.complex64}, ["'ts'"]),
        (NGram({0: ["x"]}, 1, "ts"), {"shape": (2,)}, ["'ts'", "(2,)"]),
        (NGram({0: ["x"]}, 1, "ts"), {"nullable": True}, ["'ts'", "nullable"]),
        (NGram({0: ["x"]}, 1, "ts"), {"dtype": "datetime64[s]"}, ["'ts'", "timedelta64"]),
        (NGram({0: ["x"]}, np.timedelta64(1, "s"), "ts"), {}, ["'ts'", "a number"]),
    ],
)
def test_check_names_the_field_that_does_not_fit(ngram, ts, words):
    with pytest.raises(ydl.SchemaError) as info:
        ngram.check(schema(**ts))
    for word in words:
        assert word in str(info.value)


def test_anchors_checks_the_schema_first():
    fake = FakeRef(np.arange(5.0))
    with pytest.raises(ydl.SchemaError, match="'y'"):
        NGram({0: ["y"]}, 1, "ts").anchors(fake)
    assert fake.reads == 0


def test_field_names():
    ngram = NGram({0: ["x"], 1: ["s", "x"]}, 1, "ts")
    assert ngram.field_names(schema()) == frozenset({"x", "s", "ts"})
    assert NGram({0: ["^[xs]$"]}, 1, "^t.*").field_names(schema()) == {"x", "s", "ts"}


# --- identity ---


def test_equality_hash_repr_and_pickle():
    a = NGram({0: ["x"], -1: ["y"]}, 1.5, "ts", timestamp_overlap=False)
    same = NGram({-1: ("y",), 0: ("x",)}, 1.5, "ts", timestamp_overlap=False)
    assert a == same and hash(a) == hash(same) and len({a, same}) == 1
    assert NGram({0: ["x"]}, 2, "ts") == NGram({0: ["x"]}, 2.0, "ts")
    others = [
        NGram({0: ["x"], -1: ["y"]}, 1.5, "ts"),
        NGram({0: ["x"], -1: ["z"]}, 1.5, "ts", False),
        NGram({0: ["x"], -2: ["y"]}, 1.5, "ts", False),
        NGram({0: ["x"], -1: ["y"]}, 1.25, "ts", False),
        NGram({0: ["x"], -1: ["y"]}, 1.5, "t", False),
    ]
    assert all(a != other for other in others)
    assert a != "NGram"
    td = NGram({0: ["x"]}, np.timedelta64(5, "s"), "ts")
    assert td == NGram({0: ["x"]}, np.timedelta64(5, "s"), "ts")
    assert hash(td) == hash(NGram({0: ["x"]}, np.timedelta64(5, "s"), "ts"))
    assert td != NGram({0: ["x"]}, np.timedelta64(6, "s"), "ts")
    for ngram in (a, td):
        copy = pickle.loads(pickle.dumps(ngram))
        assert copy == ngram and hash(copy) == hash(ngram)
        assert copy.window_records([4]).tolist() == ngram.window_records([4]).tolist()
    assert repr(a) == (
        "NGram(fields={-1: ['y'], 0: ['x']}, delta_threshold=1.5, timestamp_field='ts', "
        "timestamp_overlap=False)"
    )
    assert eval(repr(a), {"NGram": NGram}) == a


def test_a_decimal_threshold_is_a_number():
    # Before: Decimal("0.5") was refused (numbers.Real leaves Decimal out); Petastorm takes it.
    from decimal import Decimal

    assert NGram({0: ["x"], 1: ["x"]}, Decimal("0.5"), "ts").delta_threshold == 0.5
    with pytest.raises(ValueError, match="must be >= 0"):
        NGram({0: ["x"], 1: ["x"]}, Decimal("-1"), "ts")
    with pytest.raises(ValueError, match="real number"):
        NGram({0: ["x"], 1: ["x"]}, "0.5", "ts")


# --- as Petastorm: every offset of the span, regular expressions for names ---


def petastorm_windows(data, fields, delta, ts, overlap=True):
    """Petastorm's ``NGram.form_ngram`` over one row group of record dicts, as it is written
    there: an entry per offset of the span, holding the fields named at that offset (none at
    an offset not named)."""
    base = min(fields)
    length = max(fields) - base + 1
    out, previous_end = [], None
    for index in range(len(data) - length + 1):
        window = data[index : index + length]
        if not overlap and previous_end is not None and window[0][ts] <= previous_end:
            continue
        if all(b[ts] - a[ts] <= delta for a, b in itertools.pairwise(window)):
            out.append(
                {
                    base + k: {f: v for f, v in record.items() if f in fields.get(base + k, [])}
                    for k, record in enumerate(window)
                }
            )
            if not overlap:
                previous_end = window[-1][ts]
    return out


def plain(value):
    """numpy values as Python ones, containers walked."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value.tolist() if isinstance(value, (np.ndarray, np.generic)) else value


GAPPED = [
    {"ts": int(t), "a": i, "b": np.full(2, i, np.float32), "c": f"c{i}"}
    for i, t in enumerate(np.cumsum(np.random.default_rng(3).integers(1, 4, 40)))
]


@pytest.fixture(scope="module")
def gapped(tmp_path_factory):
    return build(GAPPED, tmp_path_factory.mktemp("gapped"))


@settings(max_examples=40, deadline=None)
@given(
    named=st.dictionaries(
        st.integers(-3, 3),
        st.lists(st.sampled_from("abc"), min_size=1, max_size=3, unique=True),
        min_size=1,
        max_size=3,
    ),
    delta=st.integers(1, 3),
    overlap=st.booleans(),
)
def test_windows_are_petastorms_with_an_empty_dict_at_each_offset_not_named(
    gapped, named, delta, overlap
):
    # (Timestamps strictly increase: Petastorm's no-overlap rule, on timestamps, is ours.)
    ngram = NGram(named, delta, "ts", overlap)
    want = petastorm_windows([plain(r) for r in GAPPED], named, delta, "ts", overlap)
    got = [plain(w) for w in gapped.stream(ngram=ngram)]
    assert got == want
    assert all(list(w) == list(range(min(named), max(named) + 1)) for w in got)
    batches = gapped.stream(ngram=ngram, batch_size=4)
    assert [plain(w) for batch in batches for w in unbatched(ngram, batch)] == want


def unbatched(ngram, batch):
    """The windows of a batch of windows (its first offset is named, so holds a column)."""
    count = len(next(iter(batch[ngram.min_offset].values())))
    return list(ngram.iter_assembled(batch, count))


def test_gaps_in_batches_and_worker_processes(gapped):
    ngram = NGram({-1: ["a"], 2: ["b", "c"]}, 3, "ts")
    args = dict(ngram=ngram, shuffle=True, shuffle_seed=1, batch_size=4)
    inline = list(gapped.stream(**args))
    assert inline and all(list(b) == [-1, 0, 1, 2] and b[0] == b[1] == {} for b in inline)
    assert inline[0][2]["b"].shape == (4, 2)
    stream = gapped.stream(**args, num_workers=2, worker_type="process")
    workers = list(stream)
    stream.close()
    assert [plain(b) for b in workers] == [plain(b) for b in inline]


def test_a_span_too_long_for_its_entries_is_refused():
    NGram({0: ["x"], 65535: ["x"]}, 1, "ts")
    with pytest.raises(ValueError, match=r"0 \.\. 65536 span 65537 records.*at most 65536"):
        NGram({0: ["x"], 65536: ["x"]}, 1, "ts")


REGEX_RECORDS = [
    {
        "id": i,
        "id2": i % 7,
        "id_float": float(i),
        "id_odd": bool(i % 2),
        "sensor_name": f"s{i}",
        "partition_key": f"p{i % 3}",
        "matrix": np.full(3, i, np.float32),
        "a.b": i,
        "axb": -i,
    }
    for i in range(20)
]


@pytest.fixture(scope="module")
def named_like_petastorms(tmp_path_factory):
    return build(REGEX_RECORDS, tmp_path_factory.mktemp("regex"), chunk_bytes=1000)


def test_ngram_with_regex_fields(named_like_petastorms):
    # Petastorm's test_ngram_with_regex_fields, ported: regular expressions for the fields
    # and the timestamp field.
    fields = {k: ["^id.*$", "sensor_name", "partition_key"] for k in (-1, 0, 1)}
    ngram = NGram(fields, delta_threshold=10, timestamp_field="^id$")
    expected = ("id", "id2", "id_float", "id_odd", "sensor_name", "partition_key")
    schema_ = named_like_petastorms.schema
    assert ngram.names(schema_) == {-1: expected, 0: expected, 1: expected}
    assert ngram.timestamp_name(schema_) == "id"
    windows = list(named_like_petastorms.stream(ngram=ngram))
    assert len(windows) == 18
    for k, window in enumerate(windows, start=1):
        for offset, values in window.items():
            record = REGEX_RECORDS[k + offset]
            assert plain(values) == {name: record[name] for name in expected}


def test_a_field_s_own_name_means_that_field_alone(named_like_petastorms):
    schema_ = named_like_petastorms.schema
    # "a.b" is a field: it is not the pattern that "axb" matches too.
    assert NGram({0: ["a.b"]}, 1, "id").names(schema_) == {0: ("a.b",)}
    assert NGram({0: ["a.?b"]}, 1, "id").names(schema_) == {0: ("a.b", "axb")}
    # Patterns expand in the schema's order, each field once, after the names before them.
    assert NGram({0: ["sensor_name", "id.*", "id"]}, 1, "id").names(schema_) == {
        0: ("sensor_name", "id", "id2", "id_float", "id_odd")
    }
    # Whole names, as Petastorm matches them: "id*" is i, id, idd ..., "id_" no prefix.
    assert NGram({0: ["id*"]}, 1, "id").names(schema_) == {0: ("id",)}
    with pytest.raises(ydl.SchemaError, match=r"offset 0\) 'id_' is not in the dataset"):
        NGram({0: ["id_"]}, 1, "id").check(schema_)


@pytest.mark.parametrize(
    ("fields", "timestamp", "words"),
    [
        ({0: ["id"], 2: ["^nope.*"]}, "id", ["'^nope.*'", "offset 2", "'sensor_name'"]),
        ({0: ["id"]}, "^stamp$", ["timestamp_field", "'^stamp$'", "'id_odd'"]),
        ({0: ["id"]}, "^id.*", ["timestamp_field", "'^id.*'", "matches 4 fields", "'id_float'"]),
        ({0: ["id("]}, "id", ["'id('", "regular expression", "offset 0"]),
    ],
)
def test_names_that_match_no_field_are_named_when_the_stream_is_made(
    named_like_petastorms, fields, timestamp, words
):
    ngram = NGram(fields, 1, timestamp)  # (a name means nothing until there is a schema)
    with pytest.raises(ydl.SchemaError) as info:
        named_like_petastorms.stream(ngram=ngram)
    for word in words:
        assert word in str(info.value)


def test_ngram_delta_threshold(tmp_path):
    # Petastorm's test_ngram_delta_threshold, ported. Its reader stops after (10, 11): its
    # windows end with a row group, as its test data's does there. Here (20, 23) is a window.
    ids = [0, 3, 8, 10, 11, 20, 23]
    ref = build([{"id": i, "id2": i * 2} for i in ids], tmp_path)
    ngram = NGram({0: ["id", "id2"], 1: ["id"]}, delta_threshold=4, timestamp_field="id")
    got = [(int(w[0]["id"]), int(w[1]["id"])) for w in ref.stream(ngram=ngram)]
    assert got == [(0, 3), (8, 10), (10, 11), (20, 23)]
    # test_ngram_delta_small_threshold: a threshold under every gap leaves no window.
    assert list(ref.stream(ngram=NGram({0: ["id"], 1: ["id"]}, 0.5, "id"))) == []


def test_shuffled_and_non_consecutive_keys(gapped):
    # Petastorm's test_shuffled_fields and test_non_consecutive_ngram, ported: keys given out
    # of order come in ascending order, and the offsets between them are empty.
    window = next(iter(gapped.stream(ngram=NGram({2: ["a"], -1: ["a", "c"]}, 10, "ts"))))
    assert list(window) == [-1, 0, 1, 2] and window[0] == window[1] == {}
    assert int(window[2]["a"]) == int(window[-1]["a"]) + 3
