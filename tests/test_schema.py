"""Schema: JSON round trips, inference, and clear SchemaErrors for every kind of bad record."""

from __future__ import annotations

import json
import mmap
import re
import resource
import warnings

import numpy as np
import pytest

import yogadl_plus as ydl
from yogadl_plus.cache.keys import column_key
from yogadl_plus.cache.layout import MAX_RECORD_BYTES
from yogadl_plus.schema import MAX_NAME_BYTES, infer_schema

SCHEMA = ydl.Schema(
    [
        ydl.Field("x", np.float32, (4,)),
        ydl.Field("label", np.int64),
        ydl.Field("name", str),
        ydl.Field("blob", bytes, nullable=True),
        ydl.Field("seq", np.int32, (None,), codec=ydl.codecs.Compressed()),
    ]
)


def good(i: int = 0) -> dict:
    return {
        "x": np.full(4, i, np.float32),
        "label": np.int64(i),
        "name": f"r{i}",
        "blob": b"b",
        "seq": np.arange(i, dtype=np.int32),
    }


def build(tmp_path, records, schema=SCHEMA):
    return ydl.cache_dataset(
        records, "d", "v", ydl.LocalStorage(tmp_path), schema=schema, progress=False
    )


def assert_nothing_left(tmp_path):
    """A failed build published nothing and left no file but the version's lock."""
    storage = ydl.LocalStorage(tmp_path)
    assert storage.list() == []
    lock = storage.lock_path("d", "v")
    assert [str(p) for p in tmp_path.rglob("*") if p.is_file() and str(p) != lock] == []


def lazy_zeros(nbytes: int) -> np.ndarray:
    """``nbytes`` zeros as a uint8 array whose pages are never committed (a private anonymous
    map): a value past 4 GiB that costs no memory as long as nothing reads or copies it."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), np.uint8)


def nested(depth: int) -> list:
    """[[[...[1]...]]]: lists ``depth`` deep."""
    value: list = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def available_memory_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def test_schema_json_roundtrip_has_no_pickles():
    text = json.dumps(SCHEMA.to_json())
    assert "pickle" not in text and "\\x80" not in text
    assert ydl.Schema.from_json(json.loads(text)) == SCHEMA


def test_fields_normalize_dtypes_and_default_codecs():
    assert ydl.Field("a", "float32", 3).shape == (3,)
    assert ydl.Field("a", ">i4").dtype == np.dtype("<i4")
    assert isinstance(ydl.Field("a", np.int8).codec, ydl.codecs.Scalar)
    assert isinstance(ydl.Field("a", np.int8, (2,)).codec, ydl.codecs.Raw)
    assert isinstance(ydl.Field("a", "string").codec, ydl.codecs.String)
    assert ydl.Field("a", np.uint8, (None, 3)).num_variable_dims == 1


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ydl.Field("", np.int8), "non-empty"),
        (lambda: ydl.Field("a", object), "unsupported dtype"),
        (lambda: ydl.Field("a", np.int8, (-1,)), "shape"),
        (lambda: ydl.Field("a", str, (3,)), "shape"),
        (lambda: ydl.Schema([ydl.Field("a", np.int8), ydl.Field("a", np.int16)]), "twice"),
        (lambda: ydl.Schema([]), "at least one"),
    ],
)
def test_bad_schemas(make, message):
    with pytest.raises(ydl.SchemaError, match=message):
        make()


def test_field_names_are_refused_where_a_chunk_could_not_key_their_column():
    # A chunk stores a scalar field's values whole, under 4 bytes then the name: LMDB keys
    # are at most 511 bytes.
    assert len(column_key("x" * MAX_NAME_BYTES)) == 511
    assert ydl.Field("é" * (MAX_NAME_BYTES // 2) + "x", np.int8).name
    with pytest.raises(ydl.SchemaError, match=r"field 'éééé.*\(a name of 508 bytes"):
        ydl.Field("é" * 254, np.int8)
    with pytest.raises(ydl.SchemaError, match=r"field 'a\\udcff': .*'\\udcff' at position 1"):
        ydl.Field("a\udcff", str)  # (os.listdir's surrogateescape: no UTF-8, no key)


def test_a_stored_field_keeps_a_name_longer_than_new_fields_may_have():
    """Fields that are no column of a chunk (str, arrays, nullable) were stored with longer
    names before names were checked: their caches stay readable."""
    stored = [{**ydl.Field("s", str).to_json(), "name": "x" * 600}]
    schema = ydl.Schema.from_json(json.loads(json.dumps(stored)))
    assert schema.names == ("x" * 600,) and schema["x" * 600].kind == "str"
    assert schema == ydl.Schema.from_json(schema.to_json())


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda r: r.pop("label"), r"record 3: missing field\(s\) \['label'\]"),
        (lambda r: r.update(extra=1), r"record 3: unexpected field\(s\) \['extra'\]"),
        (
            lambda r: r.update(x=np.zeros(4, np.float64)),
            r"record 3, field 'x': expected float32\[4\], got dtype float64 which does not cast",
        ),
        (
            lambda r: r.update(x=np.zeros(5, np.float32)),
            r"record 3, field 'x': expected float32\[4\], got shape \(5,\)",
        ),
        (
            lambda r: r.update(label=None),
            r"record 3, field 'label': got None but the field is not nullable",
        ),
        (lambda r: r.update(label=2.5), r"record 3, field 'label': expected int64, got float 2.5"),
        (lambda r: r.update(label="7"), r"record 3, field 'label': expected int64, got str"),
        (lambda r: r.update(name=b"bytes"), r"record 3, field 'name': expected str, got bytes"),
        (
            lambda r: r.update(seq=np.zeros((2, 2), np.int32)),
            r"record 3, field 'seq': expected int32\[None\], got shape \(2, 2\)",
        ),
    ],
)
def test_bad_records_name_record_field_expected_and_received(tmp_path, change, expected):
    records = [good(i) for i in range(6)]
    change(records[3])
    with pytest.raises(ydl.SchemaError, match=expected):
        build(tmp_path, records)
    assert ydl.LocalStorage(tmp_path).list() == [], "a failed build publishes nothing"


def test_not_a_dict_record(tmp_path):
    with pytest.raises(ydl.SchemaError, match="record 1: expected a dict"):
        build(tmp_path, [good(0), [1, 2, 3]])


def test_lossless_conversions_are_accepted(tmp_path):
    schema = ydl.Schema(
        [
            ydl.Field("f", np.float64, (2,)),
            ydl.Field("i", np.int64),
            ydl.Field("u", np.uint8),
            ydl.Field("b", np.bool_),
        ]
    )
    records = [
        {"f": np.array([1, 2], np.float32), "i": np.int32(-5), "u": 255, "b": True},
        {"f": [0.5, 1e300], "i": 2**62, "u": np.uint8(3), "b": np.bool_(False)},
        {"f": np.array([1, 2], ">f8"), "i": True, "u": 0, "b": 0},
    ]
    ref = build(tmp_path, records, schema)
    assert ref[0]["i"] == -5 and ref[1]["f"][1] == 1e300 and ref[0]["u"] == 255
    assert ref[2]["f"].dtype == np.float64 and ref[2]["f"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize(
    "field, value",
    [
        (ydl.Field("v", np.uint8), 256),
        (ydl.Field("v", np.uint8), -1),
        (ydl.Field("v", np.float32), 0.1),
        (ydl.Field("v", np.int32), np.int64(1)),
        (ydl.Field("v", np.float32, (2,)), [0.1, 0.2]),
        (ydl.Field("v", np.int64, (2,)), [1, float("nan")]),
        (ydl.Field("v", np.int64), float("inf")),
        (ydl.Field("v", np.uint8, (2,)), [1, -1]),
        (ydl.Field("v", np.uint8, (None,)), np.array([-1])),
        (ydl.Field("v", np.int8, (None,)), [127, 128]),
        (ydl.Field("v", np.uint64), -1),
        (ydl.Field("v", np.float16), 1e6),
        (ydl.Field("v", np.bool_), 2),
        (ydl.Field("v", str), b"bytes"),
        (ydl.Field("v", bytes), "str"),
    ],
)
def test_lossy_conversions_are_refused(tmp_path, field, value):
    with pytest.raises(ydl.SchemaError, match="record 0, field 'v'"):
        build(tmp_path, [{"v": value}], ydl.Schema([field]))


def test_nullable_fields_hold_none(tmp_path):
    schema = ydl.Schema(
        [
            ydl.Field("a", np.int64, nullable=True),
            ydl.Field("b", str, nullable=True),
            ydl.Field("c", np.float32, (2,), nullable=True),
        ]
    )
    records = [{"a": 1, "b": None, "c": None}, {"a": None, "b": "", "c": np.ones(2, np.float32)}]
    ref = build(tmp_path, records, schema)
    assert ref[0] == {"a": 1, "b": None, "c": None}
    assert ref[1]["a"] is None and ref[1]["b"] == "" and ref[1]["c"].tolist() == [1, 1]
    batch = ref.get_batch([0, 1])
    assert batch["a"] == [1, None] and batch["b"] == [None, ""]


def test_infer_schema_from_first_records():
    schema = infer_schema(
        [
            {"img": np.zeros((4, 5, 3), np.uint8), "y": 1, "w": 0.5, "t": "a", "b": b"", "m": None},
            {
                "img": np.zeros((6, 5, 3), np.uint8),
                "y": 2,
                "w": 1.0,
                "t": "b",
                "b": b"x",
                "m": [1, 2],
            },
        ]
    )
    assert schema["img"].shape == (None, 5, 3) and schema["img"].dtype == np.uint8
    assert schema["y"].dtype == np.int64 and schema["w"].dtype == np.float64
    assert schema["t"].kind == "str" and schema["b"].kind == "bytes"
    assert schema["m"].nullable and schema["m"].shape == (2,)


@pytest.mark.parametrize(
    "records, message",
    [
        ([{"a": 1}, {"b": 1}], "record 1: fields"),
        ([{"a": 1}, {"a": "x"}], "different kinds"),
        ([{"a": np.zeros(2)}, {"a": np.zeros((2, 2))}], "different ranks"),
        ([{"a": object()}], "cannot infer"),
        ([{"a": None}], "None in all"),
        ([], "no records"),
    ],
)
def test_inference_errors(records, message):
    with pytest.raises(ydl.SchemaError, match=message):
        infer_schema(records)


def test_select_unknown_field_names_the_known_ones():
    with pytest.raises(ydl.SchemaError, match=r"no field 'nope'; the schema has \['x', 'label'"):
        SCHEMA.select(["x", "nope"])


@pytest.mark.parametrize(
    "shape, value, where",
    [
        ((2, 2), [[1, 2], [3]], r"item \[1\] has length 1 where item \[0\] has length 2"),
        ((None, None), [[1, 2], [3]], r"item \[1\] has length 1 where item \[0\] has length 2"),
        ((None,), [[1, 2], [3]], r"item \[1\] has length 1 where item \[0\] has length 2"),
        ((None, None), [[], [1]], r"item \[1\] has length 1 where item \[0\] has length 0"),
        (
            (None, None, None),
            [[[1], [2, 3]]],
            r"item \[0\]\[1\] has length 2 where item \[0\]\[0\] has length 1",
        ),
        ((None, None), [[1, 2], 3], r"item \[1\] is a single value where item \[0\] has length 2"),
        (
            (None, None),
            [np.array([1, 2]), np.array([3])],
            r"item \[1\] has length 1 where item \[0\] has length 2",
        ),
    ],
)
def test_ragged_lists_name_the_record_the_field_where_and_what_to_do(tmp_path, shape, value, where):
    field = ydl.Field("v", np.int64, shape)
    good = np.zeros([1 if d is None else d for d in shape], np.int64)
    records = [{"v": good}] * 3 + [{"v": value}]
    with pytest.raises(ydl.SchemaError) as info:
        build(tmp_path, records, ydl.Schema([field]))
    message = str(info.value)
    expected = re.escape(
        f"record 3, field 'v': expected {field.describe()}, got a ragged nested list: "
    )
    assert re.match(expected + where, message), message
    assert "pad the rows to one length" in message and "inhomogeneous" not in message
    assert_nothing_left(tmp_path)


def test_ragged_lists_in_the_first_records_fail_inference_by_record_and_field(tmp_path):
    records = [{"y": 0, "v": [[1, 2], [3, 4]]}, {"y": 1, "v": [[1, 2], [3]]}]
    with pytest.raises(
        ydl.SchemaError,
        match=r"^record 1, field 'v': cannot infer a field from a ragged nested list: "
        r"item \[1\] has length 1 where item \[0\] has length 2; .*pad the rows",
    ):
        ydl.cache_dataset(records, "d", "v", ydl.LocalStorage(tmp_path), progress=False)
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize(
    "records, message",
    [
        ([{"a": [1, "x"]}], r"record 0, field 'a': .* holding str 'x' at \[1\]"),
        ([{"a": 1}, {"a": [[1], [None]]}], r"record 1, field 'a': .* null \(None\) inside; .*fill"),
        ([{"a": {"b": 1}}], r"record 0, field 'a': .*dict .*make each key a field of its own"),
        ([{"a": 1}, {"a": np.uint64(2**63)}], r"int64 and uint64 .* pass schema="),
        ([{"a": 1}, {"a": nested(3000)}], r"record 1, field 'a': .*maximum number of dim"),
    ],
)
def test_inference_says_which_record_and_what_it_holds(records, message):
    with pytest.raises(ydl.SchemaError, match=message):
        infer_schema(records)


MASKED = np.ma.array([1, 2], mask=[False, True])


@pytest.mark.parametrize(
    "field, value, message",
    [
        # silently wrong before: rounded, wrapped around, or a mask dropped
        (
            ydl.Field("v", np.float64, (None,)),
            np.array([1, 2**53 + 1], np.int64),
            r"got int64\[2\] holding 9007199254740993 at flat index 1, which float64 cannot "
            r"hold exactly \(it would be stored as 9007199254740992.0\); declare the field as "
            r"int64",
        ),
        (
            ydl.Field("v", np.float64),
            2**53 + 1,
            r"got int 9007199254740993, which float64 cannot hold exactly",
        ),
        (
            ydl.Field("v", np.float64, (None,)),
            [0.5, 2**53 + 1],
            r"holding 9007199254740993 at flat index 1, which float64 cannot hold exactly",
        ),
        (
            ydl.Field("v", "M8[ns]", (None,)),
            np.array(["2000-01-01", "3000-01-01"], "M8[s]"),
            r"holding 3000-01-01T00:00:00 at flat index 1, which datetime64\[ns\] cannot hold "
            r"exactly \(it would be stored as 1830-11-23",
        ),
        (
            ydl.Field("v", "M8[ns]"),
            np.datetime64("3000-01-01", "s"),
            r"got datetime64\[s\] 3000-01-01T00:00:00, which datetime64\[ns\] cannot hold",
        ),
        (
            ydl.Field("v", np.int64, (2,)),
            MASKED,
            r"got a masked array with 1 masked value\(s\); fill them",
        ),
        # a bare library message before, or advice that cannot work
        (
            ydl.Field("v", np.int64, (None,)),
            [1, "x"],
            r"got a list of length 2 holding str 'x' at \[1\], not a number: parse it",
        ),
        (
            ydl.Field("v", np.int64, (None,)),
            np.array([1, "x"], dtype=object),
            r"got object\[2\] holding str 'x' at \[1\], not a number",
        ),
        (
            ydl.Field("v", np.float64),
            np.str_("1.5"),
            r"got str '1.5', not numbers: parse it into numbers first, or declare the field as str",
        ),
        (
            ydl.Field("v", np.float64, (None,)),
            np.array(["1.5"]),
            r"got <U3\[1\], not numbers: parse it",
        ),
        (
            ydl.Field("v", "M8[ns]"),
            "2020-01-01",
            r"got str '2020-01-01', not a number: convert it with np.datetime64",
        ),
        (
            ydl.Field("v", np.int64, (None,)),
            np.zeros(2, [("a", "<i8")]),
            r"not numbers: store each of its fields as a field of its own",
        ),
        (
            ydl.Field("v", np.int64, (2,)),
            {"a": 1, "b": 2},
            r"got a dict \(keys \['a', 'b'\]\); a field holds one array, not a nested record",
        ),
        (
            ydl.Field("v", np.uint8, (None,)),
            b"abc",
            r"got bytes of 3 bytes, not numbers: np.frombuffer\(value, 'uint8'\)",
        ),
        (
            ydl.Field("v", np.uint8, (None,)),
            [np.int64(-1)],
            r"holding -1 at flat index 0, which uint8 cannot hold exactly "
            r"\(it would be stored as 255\)",
        ),
        (
            ydl.Field("v", np.uint64),
            2**64,
            r"got int 18446744073709551616, not convertible to uint64: .*"
            r"\(uint64 holds \[0, 18446744073709551615\]\)",
        ),
        (ydl.Field("v", bytes), np.str_("x"), r"got str; encode it to bytes first"),
        (
            ydl.Field("v", str),
            "caf\udce9",
            r"got a str holding '\\udce9' at position 3, which UTF-8 cannot store",
        ),
    ],
)
def test_bad_values_say_what_came_and_what_to_do(tmp_path, field, value, message):
    records = [{"v": value}]
    with pytest.raises(ydl.SchemaError, match=r"^record 0[:,] field 'v': .*" + message):
        build(tmp_path, records, ydl.Schema([field]))
    assert_nothing_left(tmp_path)


def test_values_that_come_through_exactly_are_stored_exactly(tmp_path):
    schema = ydl.Schema(
        [
            ydl.Field("obj", np.int64, (3,)),
            ydl.Field("t", "M8[ns]"),
            ydl.Field("span", "m8[ns]"),
            ydl.Field("dates", "M8[ns]", (None,)),
            ydl.Field("f", np.float64, (None,)),
            ydl.Field("g", np.float64),
            ydl.Field("h", np.float32, (2,)),
        ]
    )
    record = {
        "obj": np.array([1, np.int32(2), 3.0], dtype=object),
        "t": np.datetime64("2000-01-01", "s"),
        "span": np.timedelta64(3, "s"),
        "dates": np.array(["2000-01-01", "NaT"], "M8[D]"),
        "f": np.array([1, -(2**53)], np.int64),
        "g": 2**60,
        "h": [float("nan"), 2**24],
    }
    got = build(tmp_path, [record], schema)[0]
    assert got["obj"].tolist() == [1, 2, 3]
    assert got["t"] == np.datetime64("2000-01-01T00:00:00", "ns")
    assert got["span"] == np.timedelta64(3 * 10**9, "ns")
    assert got["dates"][0] == np.datetime64("2000-01-01", "ns") and np.isnat(got["dates"][1])
    assert got["f"].tolist() == [1.0, -(2.0**53)] and got["g"] == 2.0**60
    assert np.isnan(got["h"][0]) and got["h"][1] == 2**24


def test_overflow_is_a_schema_error_when_warnings_are_errors(tmp_path):
    schema = ydl.Schema([ydl.Field("v", np.float16), ydl.Field("w", np.float32, (None,))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for bad in ({"v": 1e6, "w": [1.0]}, {"v": 1.0, "w": [1e300]}):
            with pytest.raises(ydl.SchemaError, match=r"record 0, field '[vw]'"):
                build(tmp_path, [bad], schema)
    assert_nothing_left(tmp_path)


def test_a_value_over_4_gib_is_refused_before_it_is_copied(tmp_path):
    schema = ydl.Schema([ydl.Field("id", np.int64), ydl.Field("blob", np.uint8, (None,))])
    huge = lazy_zeros(MAX_RECORD_BYTES + 1)
    records = [{"id": 0, "blob": np.zeros(3, np.uint8)}, {"id": 1, "blob": huge}]
    before = peak_rss_bytes()
    with pytest.raises(
        ydl.SchemaError,
        match=r"^record 1: field 'blob': got uint8\[4294967296\], 4294967296 bytes, over the "
        r"\d+ bytes a record of this schema can give it \(one record holds at most 4294967295 "
        r"bytes\); split the value across records or fields, or store it elsewhere .* and "
        r"cache a reference to it",
    ):
        build(tmp_path, records, schema)
    if before < 2 << 30:  # a copy would have raised the peak by 4 GiB
        assert peak_rss_bytes() < before + (1 << 30)
    assert_nothing_left(tmp_path)


def test_fixed_fields_over_4_gib_are_refused_with_the_schema(tmp_path):
    schema = ydl.Schema([ydl.Field("id", np.int64), ydl.Field("big", np.uint8, (2**32,))])
    with pytest.raises(
        ydl.SchemaError,
        match=r"the fixed-shape fields take 4294967304 bytes per record \('id' 8, 'big' "
        r"4294967296\), over the 4294967295 bytes one record can hold; split the value",
    ):
        build(tmp_path, [{"id": 0, "big": lazy_zeros(2**32)}], schema)
    assert_nothing_left(tmp_path)


@pytest.mark.skipif(
    available_memory_bytes() < 10 << 30, reason="in case bytes(n) commits its pages here"
)
@pytest.mark.parametrize("sizes", [{"a": MAX_RECORD_BYTES + 1}, {"a": 2**31, "b": 2**31}])
def test_records_over_4_gib_are_refused_before_they_are_joined(tmp_path, sizes):
    # bytes(n) comes from calloc, whose fresh pages cost nothing until read; bytes fields
    # are stored without a copy, so nothing here touches them.
    schema = ydl.Schema([ydl.Field(name, bytes) for name in sizes])
    records = [dict.fromkeys(sizes, b"small"), {name: bytes(n) for name, n in sizes.items()}]
    named = ", ".join(f"'{name}' {n}" for name, n in sizes.items())
    with pytest.raises(
        ydl.SchemaError,
        match=rf"^record 1: {sum(sizes.values()) + 4 * len(sizes)} bytes encoded, over the "
        rf"4294967295 bytes one record can hold \(field bytes: {named}\); split the value",
    ):
        build(tmp_path, records, schema)
    assert_nothing_left(tmp_path)


def test_the_schema_package_exports_what_the_module_did():
    import yogadl_plus.schema as schema
    from yogadl_plus.schema import inference, model, values

    assert schema.Field is model.Field is ydl.Field and schema.Schema is ydl.Schema
    assert schema.infer_schema is inference.infer_schema
    assert schema.cast_exactly is values.cast_exactly
    names = {"MAX_NAME_BYTES", "Field", "Schema", "cast_exactly", "infer_field", "infer_schema"}
    assert names | {"infer_value"} <= set(schema.__all__)
