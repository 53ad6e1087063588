"""Schema: JSON round trips, inference, and clear SchemaErrors for every kind of bad record."""

from __future__ import annotations

import json

import numpy as np
import pytest

import yogadl_plus as ydl
from yogadl_plus.schema import infer_schema

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
