"""Every codec gives back exactly what it was given (within JPEG's loss), any shape or dtype."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import yogadl_plus as ydl
from yogadl_plus.cache.layout import RecordLayout
from yogadl_plus.codecs import codec_from_json

NUMERIC = st.sampled_from(
    [
        np.bool_,
        np.int8,
        np.uint8,
        np.int16,
        np.uint16,
        np.int32,
        np.uint32,
        np.int64,
        np.uint64,
        np.float16,
        np.float32,
        np.float64,
        np.complex64,
    ]
)


def roundtrip(field: ydl.Field, value):
    """Through the real record layout, as a cache stores and reads it."""
    layout = RecordLayout(ydl.Schema([field]))
    data = layout.encode({field.name: value}, 0)
    one = layout.decode_field(memoryview(data), field)
    many = layout.decode_columns([memoryview(data), memoryview(data)], [field])[field.name]
    return one, many


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(), dtype=NUMERIC, variable=st.booleans(), codec=st.sampled_from(["raw", "zstd"])
)
def test_array_codecs_roundtrip_exactly(data, dtype, variable, codec):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5))
    value = data.draw(hnp.arrays(dtype, shape))
    declared = tuple(None if variable and i % 2 == 0 else d for i, d in enumerate(shape))
    c = ydl.codecs.Raw() if codec == "raw" else ydl.codecs.Compressed(level=1)
    field = ydl.Field("a", dtype, declared, codec=c)
    one, many = roundtrip(field, value)
    assert one.dtype == value.dtype and one.shape == value.shape
    np.testing.assert_array_equal(one, value)
    stacked = np.asarray(many) if isinstance(many, list) else many
    np.testing.assert_array_equal(stacked[1], value)
    assert one.flags.writeable, "decoded arrays are private, writable copies"


@given(value=st.one_of(st.integers(-(2**63), 2**63 - 1), st.booleans()))
def test_scalar_int64_roundtrip(value):
    one, many = roundtrip(ydl.Field("s", np.int64), value)
    assert one == value and many[0] == value and many.dtype == np.int64


@given(value=st.floats(allow_nan=True, allow_infinity=True))
def test_scalar_float64_roundtrip_keeps_every_bit(value):
    one, _ = roundtrip(ydl.Field("s", np.float64), value)
    assert np.float64(value).tobytes() == one.tobytes()


@given(value=st.text())
def test_string_roundtrip(value):
    one, many = roundtrip(ydl.Field("t", str), value)
    assert one == value and many == [value, value]


@given(value=st.binary())
def test_bytes_roundtrip(value):
    one, many = roundtrip(ydl.Field("b", bytes), value)
    assert one == value and many == [value, value]


@settings(max_examples=30, deadline=None)
@given(data=st.data(), channels=st.sampled_from([None, 1, 3, 4]))
def test_png_is_lossless(data, channels):
    h, w = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 12))
    shape = (h, w) if channels is None else (h, w, channels)
    image = data.draw(hnp.arrays(np.uint8, shape))
    field = ydl.Field(
        "img",
        np.uint8,
        (None, None) + (() if channels is None else (channels,)),
        codec=ydl.codecs.Image("png"),
    )
    one, _ = roundtrip(field, image)
    np.testing.assert_array_equal(one, image)


def test_png_16_bit_grayscale_is_lossless():
    image = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) * 15
    one, _ = roundtrip(ydl.Field("img", np.uint16, (64, 64), codec=ydl.codecs.Image("png")), image)
    np.testing.assert_array_equal(one, image)


def test_jpeg_is_close_and_quality_matters():
    y, x = np.mgrid[0:64, 0:64]
    image = np.stack([x * 4, y * 4, (x + y) * 2], axis=-1).astype(np.uint8)
    errors = {}
    for quality in (30, 95):
        field = ydl.Field("img", np.uint8, (64, 64, 3), codec=ydl.codecs.Image("jpeg", quality))
        one, _ = roundtrip(field, image)
        assert one.shape == image.shape and one.dtype == np.uint8
        errors[quality] = np.abs(one.astype(int) - image).mean()
    assert errors[95] < errors[30] < 10


def test_compressed_shrinks_compressible_data():
    value = np.zeros((256, 256), np.float32)
    field = ydl.Field("z", np.float32, (256, 256), codec=ydl.codecs.Compressed(3))
    data = RecordLayout(ydl.Schema([field])).encode({"z": value}, 0)
    assert len(data) < value.nbytes / 50


@pytest.mark.parametrize(
    "codec",
    [
        ydl.codecs.Raw(),
        ydl.codecs.Compressed(7),
        ydl.codecs.Image("jpeg", 80),
        ydl.codecs.Scalar(),
        ydl.codecs.Bytes(),
        ydl.codecs.String(),
    ],
)
def test_codecs_are_found_again_by_name_and_params(codec):
    again = codec_from_json(codec.to_json())
    assert again == codec and type(again) is type(codec)


def test_unknown_codec_name_is_a_schema_error_not_a_guess():
    with pytest.raises(ydl.SchemaError, match="unknown codec 'pickle'"):
        codec_from_json({"name": "pickle"})


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ydl.codecs.Compressed(level=0), "level"),
        (lambda: ydl.codecs.Image("gif"), "format"),
        (lambda: ydl.codecs.Image("jpeg", quality=101), "quality"),
    ],
)
def test_bad_codec_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "field, message",
    [
        (lambda: ydl.Field("s", str, codec=ydl.codecs.Raw()), "numeric"),
        (lambda: ydl.Field("x", np.float32, (3,), codec=ydl.codecs.Scalar()), "shape"),
        (lambda: ydl.Field("i", np.float32, (8, 8), codec=ydl.codecs.Image()), "dtypes"),
        (lambda: ydl.Field("i", np.uint8, (8,), codec=ydl.codecs.Image()), "shape"),
        (lambda: ydl.Field("i", np.uint8, (8, 8, 2), codec=ydl.codecs.Image("jpeg")), "channels"),
        (lambda: ydl.Field("b", bytes, codec=ydl.codecs.String()), "str"),
    ],
)
def test_codec_field_mismatch_is_reported_at_schema_time(field, message):
    with pytest.raises(ydl.SchemaError, match=message):
        field()


@pytest.mark.parametrize(
    "field, value",
    [
        # 2**32 elements of one byte: no memory behind them (a zero-strided view)
        (
            ydl.Field("a", np.uint8, (None,), codec=ydl.codecs.Compressed()),
            np.broadcast_to(np.zeros(1, np.uint8), (2**32,)),
        ),
        (ydl.Field("a", np.uint8, (None, None)), np.zeros((2**32, 0), np.uint8)),
    ],
)
def test_dims_a_stored_shape_cannot_say_are_schema_errors(field, value):
    with pytest.raises(
        ydl.SchemaError,
        match=r"^record 7: field 'a': got shape \(4294967296, ?0?\), whose dims over 4294967295 "
        r"a stored shape cannot say",
    ):
        RecordLayout(ydl.Schema([field])).encode({"a": value}, 7)


@pytest.mark.parametrize(
    "codec, shape, message",
    [
        ("png", (0, 5), r"got shape \(0, 5\), an image without pixels"),
        ("jpeg", (4, 0, 3), r"got shape \(4, 0, 3\), an image without pixels"),
        (
            "jpeg",
            (1, 70000, 3),
            r"got shape .*; JPEG images are at most 65500 pixels high and wide",
        ),
        (
            "jpeg",
            (65501, 1, 1),
            r"got shape .*; JPEG images are at most 65500 pixels high and wide",
        ),
    ],
)
def test_images_a_format_cannot_store_are_schema_errors(codec, shape, message):
    field = ydl.Field("img", np.uint8, (None, None, None), codec=ydl.codecs.Image(codec))
    if len(shape) == 2:
        field = ydl.Field("img", np.uint8, (None, None), codec=ydl.codecs.Image(codec))
    with pytest.raises(ydl.SchemaError, match=r"^record 2: field 'img': " + message):
        RecordLayout(ydl.Schema([field])).encode({"img": np.zeros(shape, np.uint8)}, 2)
