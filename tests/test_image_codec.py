"""codecs.Image keeps image files' bytes as they are: checked at build, stored byte for byte,
decoded at read with the field's channels; arrays are encoded as before."""

from __future__ import annotations

import io
import os
import pickle
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image as PILImage

import yogadl_plus as ydl
from yogadl_plus.cache.layout import RecordLayout

# simplejpeg (libjpeg-turbo's TurboJPEG API) against Pillow (libjpeg-turbo too) on the JPEGs
# below and on random arrays at qualities 50-100: measured 0 levels apart. One level is left for
# builds of the two wheels that round the inverse DCT differently.
JPEG_ROUNDING = 1


def photo(height: int = 48, width: int = 64, seed: int = 0) -> np.ndarray:
    """A small RGB picture with smooth parts and noise (JPEG and PNG both have work to do)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    smooth = np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], axis=-1)
    return np.clip(smooth + rng.integers(-20, 20, smooth.shape), 0, 255).astype(np.uint8)


def file_bytes(array: np.ndarray, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    PILImage.fromarray(array).save(out, format=fmt, **options)
    return out.getvalue()


def near(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal within libjpeg's rounding (same shape)."""
    return got.shape == want.shape and np.abs(got.astype(int) - want).max() <= JPEG_ROUNDING


def pillow_decode(data: bytes, mode: str) -> np.ndarray:
    """What Pillow decodes (grey from a JPEG: libjpeg's own, the luma it holds)."""
    with PILImage.open(io.BytesIO(data)) as image:
        if mode == "L" and image.format == "JPEG":
            image.draft("L", image.size)
        return np.asarray(image.convert(mode))


FILES = {
    "jpeg": file_bytes(photo(), "JPEG", quality=90),
    "png": file_bytes(photo(), "PNG"),
    "webp": file_bytes(photo(), "WEBP", quality=80),
}
RGB = ydl.Field("image", np.uint8, (None, None, 3), codec=ydl.codecs.Image())
SCHEMA = ydl.Schema([RGB, ydl.Field("label", np.int64)])


def stored_bytes(ref: ydl.DataRef, index: int, name: str = "image") -> bytes:
    """The bytes the cache holds for one field of one record (before any decoding)."""
    (value,) = ref.read_values(np.array([index]))
    return bytes(ref.layout.field_bytes(value, ref.schema[name]))


def no_build_left(storage: ydl.LocalStorage, dataset_id: str) -> bool:
    with pytest.raises(ydl.DatasetNotFound):
        storage.fetch(dataset_id, "v1")
    folder = os.path.join(storage.root, dataset_id)
    left = os.listdir(folder) if os.path.isdir(folder) else []
    return not [e for e in left if e.startswith(("+staging.", "+trash."))]


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_image_files_are_stored_byte_for_byte_and_decode_as_pillow_does(fmt, local_storage):
    data = FILES[fmt]
    records = [{"image": data, "label": 0}, {"image": bytearray(data), "label": 1}]
    ref = ydl.cache_dataset(records, fmt, "v1", local_storage, schema=SCHEMA)
    assert stored_bytes(ref, 0) == data and stored_bytes(ref, 1) == data
    got = ref.get_batch([0, 1], ["image"])["image"]
    want = pillow_decode(data, "RGB")
    for image in got:
        assert image.dtype == np.uint8 and near(image, want)
        if fmt != "jpeg":
            np.testing.assert_array_equal(image, want)


@pytest.mark.parametrize("quality", [50, 90, 100])
def test_jpeg_encoded_arrays_decode_as_pillow_decodes_them(quality):
    field = ydl.Field("image", np.uint8, (48, 64, 3), codec=ydl.codecs.Image("jpeg", quality))
    layout = RecordLayout(ydl.Schema([field]))
    data = layout.encode({"image": photo()}, 0)
    got = layout.decode_field(memoryview(data), field)
    want = pillow_decode(bytes(layout.field_bytes(data, field)), "RGB")
    assert got.shape == (48, 64, 3) and near(got, want)


@settings(max_examples=25, deadline=None)
@given(
    array=hnp.arrays(
        np.uint8,
        st.one_of(
            hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=9),
            st.tuples(st.integers(1, 9), st.integers(1, 9), st.sampled_from([3, 4])),
        ),
    )
)
def test_png_files_of_any_array_read_back_exactly(array):
    channels = array.shape[2] if array.ndim == 3 else None
    shape = (None, None) if channels is None else (None, None, channels)
    field = ydl.Field("image", np.uint8, shape, codec=ydl.codecs.Image())
    layout = RecordLayout(ydl.Schema([field]))
    data = file_bytes(array, "PNG")
    value = layout.encode({"image": data}, 0)
    assert bytes(layout.field_bytes(value, field)) == data
    np.testing.assert_array_equal(layout.decode_field(memoryview(value), field), array)


def test_pictures_are_converted_to_the_fields_channels(local_storage):
    grey = photo()[:, :, 0]
    rgba = np.dstack([photo(), np.arange(48 * 64).reshape(48, 64).astype(np.uint8)])
    grey_jpeg, rgba_png = file_bytes(grey, "JPEG"), file_bytes(rgba, "PNG")
    schema = ydl.Schema(
        [
            RGB,
            ydl.Field("rgba", np.uint8, (None, None, 4), codec=ydl.codecs.Image()),
            ydl.Field("grey", np.uint8, (None, None), codec=ydl.codecs.Image("jpeg")),
            ydl.Field("kept", np.uint8, (None, None, None), codec=ydl.codecs.Image()),
        ]
    )
    record = {"image": grey_jpeg, "rgba": rgba_png, "grey": FILES["jpeg"], "kept": grey_jpeg}
    ref = ydl.cache_dataset([record], "channels", "v1", local_storage, schema=schema)
    got = ref[0]
    assert got["image"].shape == (48, 64, 3)  # grey into RGB, as torchvision's loader does
    assert (got["image"] == got["image"][:, :, :1]).all()
    assert near(got["image"][:, :, 0], pillow_decode(grey_jpeg, "L"))
    np.testing.assert_array_equal(got["rgba"], rgba)
    assert near(got["grey"], pillow_decode(FILES["jpeg"], "L"))  # (luma, as torchvision's)
    assert got["kept"].shape == (48, 64, 1)  # None channels: as the file has them


def truncated_png() -> bytes:
    data = file_bytes(np.random.default_rng(1).integers(0, 256, (64, 64, 3), np.uint8), "PNG")
    return data[: len(data) // 2]


BAD = {
    "truncated JPEG": (FILES["jpeg"][: len(FILES["jpeg"]) // 2], "does not decode"),
    "truncated PNG": (truncated_png(), "does not decode"),
    "zero bytes": (b"", "no bytes at all"),
    "random bytes": (np.random.default_rng(2).bytes(300), "not an image"),
    "a text file": (b"label,path\n0,cat.jpg\n", "not an image"),
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_bytes_that_are_no_image_fail_the_build_naming_record_and_field(what, local_storage):
    bad, reason = BAD[what]
    records = [{"image": FILES["png"], "label": 0}, {"image": bad, "label": 1}]
    with pytest.raises(ydl.SchemaError, match=rf"record 1: field 'image': .*{reason}"):
        ydl.cache_dataset(records, "bad", "v1", local_storage, schema=SCHEMA)
    assert no_build_left(local_storage, "bad")


def test_a_fixed_size_the_file_contradicts_fails_the_build(local_storage):
    schema = ydl.Schema([ydl.Field("image", np.uint8, (48, 32, 3), codec=ydl.codecs.Image())])
    records = [{"image": FILES["webp"]}]
    with pytest.raises(ydl.SchemaError, match=r"record 0: field 'image'.*width 64.*width 32"):
        ydl.cache_dataset(records, "size", "v1", local_storage, schema=schema)
    assert no_build_left(local_storage, "size")


def test_a_path_or_other_object_is_a_clear_error(local_storage):
    for value, said in [("cat.jpg", "read_bytes"), ({"bytes": b""}, "dict")]:
        with pytest.raises(ydl.SchemaError, match=rf"record 0, field 'image'.*{said}"):
            ydl.cache_dataset(
                [{"image": value, "label": 0}], "path", "v1", local_storage, schema=SCHEMA
            )
    sixteen = ydl.Field("depth", np.uint16, (None, None), codec=ydl.codecs.Image())
    with pytest.raises(ydl.SchemaError, match=r"record 0, field 'depth'.*not numbers"):
        RecordLayout(ydl.Schema([sixteen])).encode({"depth": FILES["png"]}, 0)


def test_checked_images_are_not_decoded_again_but_their_size_is_checked():
    assert "CheckedImage" in ydl.codecs.__all__
    # A source vouches for these (and names the file in its own errors): stored as they are.
    truncated = FILES["jpeg"][: len(FILES["jpeg"]) // 2]
    checked = ydl.codecs.CheckedImage(truncated)
    sent = pickle.loads(pickle.dumps(checked))  # (as to and from build workers)
    assert type(sent) is ydl.codecs.CheckedImage and sent == truncated
    layout = RecordLayout(ydl.Schema([RGB]))
    assert bytes(layout.field_bytes(layout.encode({"image": checked}, 0), RGB)) == truncated
    with pytest.raises(ydl.SchemaError, match="does not decode"):
        layout.encode({"image": truncated}, 0)
    fixed = ydl.Field("image", np.uint8, (48, 48, 3), codec=ydl.codecs.Image())
    with pytest.raises(ydl.SchemaError, match=r"record 0: field 'image'.*width 64"):
        RecordLayout(ydl.Schema([fixed])).encode({"image": checked}, 0)


def test_columns_pandas_and_parallel_builds_take_image_files(local_storage):
    images = [FILES[fmt] for fmt in ("jpeg", "png", "webp")] * 2
    records = [{"image": image, "label": i} for i, image in enumerate(images)]
    columns = {"image": images, "label": np.arange(len(images))}
    built = {
        "records": ydl.cache_dataset(records, "r", "v1", local_storage, schema=SCHEMA),
        "columns": ydl.cache_dataset(columns, "c", "v1", local_storage, schema=SCHEMA),
        "workers": ydl.cache_dataset(records, "w", "v1", local_storage, schema=SCHEMA, workers=2),
        "pandas": ydl.cache_dataset(pd.DataFrame(columns), "p", "v1", local_storage, schema=SCHEMA),
    }
    for how, ref in built.items():
        assert [stored_bytes(ref, i) for i in range(len(images))] == images, how
    bad = {"image": [*images[:3], b"not an image"], "label": np.arange(4)}
    with pytest.raises(ydl.SchemaError, match="record 3: field 'image'"):
        ydl.cache_dataset(bad, "c-bad", "v1", local_storage, schema=SCHEMA)
    assert no_build_left(local_storage, "c-bad")


def test_a_parallel_build_names_the_file_that_does_not_decode(local_storage):
    records = [{"image": FILES["png"], "label": i} for i in range(6)]
    records[4]["image"] = b"GIF89a, cut short"
    with pytest.raises(ydl.SchemaError, match="record 4: field 'image'"):
        ydl.cache_dataset(records, "w-bad", "v1", local_storage, schema=SCHEMA, workers=2)
    assert no_build_left(local_storage, "w-bad")


def test_without_a_schema_file_bytes_stay_a_bytes_field(local_storage):
    ref = ydl.cache_dataset([{"image": FILES["png"]}], "inferred", "v1", local_storage)
    assert ref.schema["image"].kind == "bytes" and ref[0]["image"] == FILES["png"]


def test_a_stored_image_that_no_longer_decodes_is_cache_corrupted():
    damaged = FILES["jpeg"][:200]
    for field in (RGB, ydl.Field("d", np.uint16, (None, None), codec=ydl.codecs.Image())):
        with pytest.raises(ydl.CacheCorrupted, match=f"field '{field.name}'"):
            field.codec.decode(field, damaged)


def test_without_simplejpeg_pillow_decodes_the_same(monkeypatch, local_storage):
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # import simplejpeg: ImportError
    layout = RecordLayout(SCHEMA)
    value = layout.encode({"image": FILES["jpeg"], "label": 0}, 0)
    with_pillow = layout.decode_field(memoryview(value), RGB)
    monkeypatch.undo()
    with_simplejpeg = layout.decode_field(memoryview(value), RGB)
    assert near(with_pillow, with_simplejpeg)
    monkeypatch.setitem(sys.modules, "simplejpeg", None)
    with pytest.raises(ydl.SchemaError, match="record 0: field 'image'"):
        layout.encode({"image": FILES["jpeg"][:300], "label": 0}, 0)
