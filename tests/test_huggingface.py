"""Hugging Face datasets as a source: Features -> fields, values record by record, images,
streams, parallel builds and the errors. Every dataset is built here; the hub is never asked."""

from __future__ import annotations

import datetime
import io
import os
import pickle
import sys
import warnings

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before datasets reads its configuration
os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")
PIL_Image = pytest.importorskip("PIL.Image")

import yogadl_plus as ydl  # noqa: E402
from yogadl_plus.sources import HuggingFaceSource, as_source  # noqa: E402
from yogadl_plus.sources import huggingface as hf_source  # noqa: E402

datasets.disable_progress_bars()

N = 23  # rows of the rich dataset; batches of 5 rows cut it across batch boundaries


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    monkeypatch.setattr(hf_source, "BATCH_ROWS", 5)


def pixels(rng, shape, dtype=np.uint8):
    high = np.iinfo(dtype).max if np.dtype(dtype).kind in "iu" else 1
    if np.dtype(dtype).kind == "f":
        return rng.random(shape).astype(dtype)
    return rng.integers(0, high, shape, endpoint=True).astype(dtype)


def png(array, mode=None):
    out = io.BytesIO()
    PIL_Image.fromarray(array, mode).save(out, format="PNG")
    return out.getvalue()


FEATURES = {
    "id": datasets.Value("int64"),
    "small": datasets.Value("int8"),
    "u16": datasets.Value("uint16"),
    "u64": datasets.Value("uint64"),
    "half": datasets.Value("float16"),
    "score": datasets.Value("float32"),
    "wide": datasets.Value("float64"),
    "flag": datasets.Value("bool"),
    "text": datasets.Value("string"),
    "big_text": datasets.Value("large_string"),
    "blob": datasets.Value("binary"),
    "when": datasets.Value("timestamp[ms]"),
    "day": datasets.Value("date32"),
    "big_blob": datasets.Value("large_binary"),
    "label": datasets.ClassLabel(names=["cat", "dog", "bird"]),
    "fixed": datasets.List(datasets.Value("float32"), length=4),
    "tokens": datasets.List(datasets.Value("int32")),
    "long_tokens": datasets.LargeList(datasets.Value("int16")),
    "grid": datasets.List(datasets.List(datasets.Value("float64"))),
    "rows3": datasets.List(datasets.List(datasets.Value("uint8"), length=3)),
    "tags": datasets.List(datasets.ClassLabel(names=["a", "b"])),
    "old_seq": datasets.Sequence(datasets.Value("int64"), length=2),
    "mat": datasets.Array2D((2, 3), "float32"),
    "vol": datasets.Array3D((2, 2, 2), "int16"),
    "clip": datasets.Array3D((None, 2, 3), "float32"),
    "img": datasets.Image(),
    "meta": {
        "source": datasets.Value("string"),
        "pos": {"x": datasets.Value("float32"), "ys": datasets.List(datasets.Value("int64"))},
    },
    "spans": datasets.Sequence({"start": datasets.Value("int32"), "end": datasets.Value("int32")}),
    "tr": datasets.Translation(languages=["en", "fr"]),
}


def rich_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        k = int(rng.integers(0, 5))
        rows.append(
            {
                "id": i * 1_000_003,
                "small": int(rng.integers(-128, 128)),
                "u16": int(rng.integers(0, 2**16)),
                "u64": 2**62 + i,
                "half": float(np.float16(rng.random())),
                "score": float(np.float32(rng.random())),
                "wide": float(rng.random()),
                "flag": bool(i % 3),
                "text": f"row {i} é{'x' * k}",
                "big_text": "ü" * i,
                "blob": bytes(rng.integers(0, 256, k, dtype=np.uint8)),
                "when": np.datetime64(1_700_000_000_000 + i, "ms"),
                "day": datetime.date(2024, 2, 27) + datetime.timedelta(days=i),
                "big_blob": bytes([i]) * i,
                "label": i % 3,
                "fixed": rng.random(4).astype(np.float32).tolist(),
                "tokens": rng.integers(-(2**31), 2**31, k).tolist(),
                "long_tokens": rng.integers(-100, 100, (k * 2,)).tolist(),
                "grid": [rng.random(k).tolist() for _ in range(i % 3)],
                "rows3": rng.integers(0, 256, (k, 3)).tolist(),
                "tags": [j % 2 for j in range(k)],
                "old_seq": [i, -i],
                "mat": rng.random((2, 3)).astype(np.float32),
                "vol": rng.integers(-1000, 1000, (2, 2, 2)).astype(np.int16),
                "clip": rng.random((k, 2, 3)).astype(np.float32),
                "img": PIL_Image.fromarray(pixels(rng, (6, 7, 3))),
                "meta": {
                    "source": f"file-{i % 4}",
                    "pos": {"x": float(np.float32(i / 7)), "ys": list(range(k))},
                },
                "spans": {"start": list(range(k)), "end": list(range(1, k + 1))},
                "tr": {"en": f"hello {i}", "fr": f"salut {i}"},
            }
        )
    return rows


@pytest.fixture(scope="module")
def rich():
    return datasets.Dataset.from_list(rich_rows(N), features=datasets.Features(FEATURES))


def expected_value(row, name):
    """The datasets' own value of field ``name`` ("outer/inner" for nested) of a python row."""
    value = row
    for key in name.split("/"):
        value = value[key]
    return value


def assert_same(cached, expected, where):
    """A cached value equals the datasets' python value: arrays by shape and every element
    (images by every pixel), everything else by ==."""
    if isinstance(expected, PIL_Image.Image):
        expected = np.asarray(expected)
    if isinstance(cached, np.ndarray) and cached.ndim:
        want = np.asarray(expected, dtype=cached.dtype)
        if want.size == 0 and cached.size == 0:
            return  # an empty list of lists: numpy makes it (0,), a field of its rank (0, 0)
        assert cached.shape == want.shape, (where, cached.shape, want.shape)
        assert np.array_equal(cached, want), where
    elif isinstance(expected, (np.datetime64, datetime.date)):  # datetimes too
        assert np.datetime64(cached, "ms") == np.datetime64(expected, "ms"), where
    else:
        assert cached == expected, (where, cached, expected)
        assert cached is None or type(cached) in (str, bytes) or isinstance(cached, np.generic)


def assert_cached_as(ref, rows):
    """Every cached record equals the dataset's own row, field by field."""
    assert len(ref) == len(rows)
    for i, row in enumerate(rows):
        record = ref[i]
        for name in ref.schema.names:
            assert_same(record[name], expected_value(row, name), (i, name))


def test_features_become_fields(rich):
    schema = as_source(rich).schema
    want = {
        "id": (np.int64, ()),
        "small": (np.int8, ()),
        "u16": (np.uint16, ()),
        "u64": (np.uint64, ()),
        "half": (np.float16, ()),
        "score": (np.float32, ()),
        "wide": (np.float64, ()),
        "flag": (np.bool_, ()),
        "when": (np.dtype("datetime64[ms]"), ()),
        "day": (np.dtype("datetime64[D]"), ()),
        "label": (np.int64, ()),
        "fixed": (np.float32, (4,)),
        "tokens": (np.int32, (None,)),
        "long_tokens": (np.int16, (None,)),
        "grid": (np.float64, (None, None)),
        "rows3": (np.uint8, (None, 3)),
        "tags": (np.int64, (None,)),
        "old_seq": (np.int64, (2,)),
        "mat": (np.float32, (2, 3)),
        "vol": (np.int16, (2, 2, 2)),
        "clip": (np.float32, (None, 2, 3)),
        "img": (np.uint8, (6, 7, 3)),
        "meta/pos/x": (np.float32, ()),
        "meta/pos/ys": (np.int64, (None,)),
        "spans/start": (np.int32, (None,)),
        "spans/end": (np.int32, (None,)),
    }
    for name, (dtype, shape) in want.items():
        assert (schema[name].dtype, schema[name].shape) == (np.dtype(dtype), shape), name
    for name in ("text", "big_text", "meta/source", "tr/en", "tr/fr"):
        assert schema[name].kind == "str", name
    assert schema["blob"].kind == "bytes" and schema["big_blob"].kind == "bytes"
    assert schema["img"].codec == ydl.codecs.Raw()  # one shape: raw pixels, bulk-decoded
    assert not any(f.nullable for f in schema)
    assert schema.names[:3] == ("id", "small", "u16"), "the features' order"
    assert len(schema) == len(want) + 7


def test_values_equal_the_datasets_own_record_by_record(rich, local_storage):
    ref = ydl.cache_dataset(rich, "rich", "v1", local_storage, progress=False)
    assert ref.manifest.source_kind == "huggingface"
    assert_cached_as(ref, list(rich))
    batch = ref.get_batch([3, 0, 22], fields=["img", "label", "mat"])
    assert batch["img"].shape == (3, 6, 7, 3)
    assert np.array_equal(batch["img"][2], np.asarray(rich[22]["img"]))
    assert batch["label"].tolist() == [0, 0, 1]


def test_read_in_arrow_batches_not_python_rows(rich, local_storage, monkeypatch):
    def no_rows(*args, **kwargs):
        raise AssertionError("a row read through Python")

    monkeypatch.setattr(type(rich), "__iter__", no_rows)
    monkeypatch.setattr(type(rich), "__getitem__", no_rows)
    ref = ydl.cache_dataset(rich, "rich", "arrow", local_storage, progress=False)
    assert len(ref) == N


def test_a_shuffled_selected_dataset_is_cached_in_its_order(rich, local_storage):
    view = rich.shuffle(seed=3).select(range(4, 17))
    ref = ydl.cache_dataset(view, "rich", "view", local_storage, progress=False)
    assert [int(ref[i]["id"]) for i in range(len(ref))] == view["id"]
    assert_cached_as(ref, list(view))


def test_nulls_make_nullable_fields(local_storage):
    rng = np.random.default_rng(1)
    features = datasets.Features(
        {
            "x": datasets.Value("float32"),
            "name": datasets.Value("string"),
            "vec": datasets.List(datasets.Value("int64")),
            "img": datasets.Image(),
            "inner": {"y": datasets.Value("int32")},
            "full": datasets.Value("int32"),
        }
    )
    rows = [
        {
            "x": None if i % 3 == 0 else float(i),
            "name": None if i == 2 else f"n{i}",
            "vec": None if i == 4 else list(range(i)),
            "img": None if i == 1 else PIL_Image.fromarray(pixels(rng, (3, 4))),
            "inner": None if i == 5 else {"y": i},
            "full": i,
        }
        for i in range(7)
    ]
    ds = datasets.Dataset.from_list(rows, features=features)
    schema = as_source(ds).schema
    assert [f.name for f in schema if f.nullable] == ["x", "name", "vec", "img", "inner/y"]
    ref = ydl.cache_dataset(ds, "nulls", "v1", local_storage, progress=False)
    assert ref[0]["x"] is None and ref[1]["x"] == 1.0
    assert ref[2]["name"] is None and ref[4]["vec"] is None and ref[1]["img"] is None
    assert ref[5]["inner/y"] is None and ref[6]["inner/y"] == 6  # a null dict: null fields
    assert_cached_as(ref, [{**r, "inner": r["inner"] or {"y": None}} for r in ds])


@pytest.mark.parametrize("streamed", [False, True], ids=["dataset", "stream"])
def test_a_null_inside_a_sequence_is_refused_naming_the_record(local_storage, streamed):
    """Never False, NaN or a raw TypeError: beside a null row (a Dataset), or in a stream."""
    cases = [("bool", [True, None]), ("float64", [0.5, None]), ("int64", [1, None])]
    for value_type, inside in cases:
        features = datasets.Features({"x": datasets.Sequence(datasets.Value(value_type))})
        ds = datasets.Dataset.from_dict({"x": [[], None, inside]}, features=features)
        source = ds.to_iterable_dataset() if streamed else ds
        schema = ydl.Schema([ydl.Field("x", value_type, (None,), nullable=True)])
        with pytest.raises(ydl.SchemaError, match=r"record 2, field 'x': .*null \(None\) inside"):
            ydl.cache_dataset(source, f"in-{value_type}", "v1", local_storage, progress=False,
                              schema=schema if streamed else None)  # fmt: skip
    nested = datasets.Features({"x": datasets.Sequence(datasets.Sequence(datasets.Value("int64")))})
    ds = datasets.Dataset.from_dict({"x": [None, [[1], [2, 3]]]}, features=nested)
    with pytest.raises(ydl.SchemaError, match=r"record 1, field 'x': .*ragged nested list"):
        ydl.cache_dataset(ds, "ragged", "v1", local_storage, progress=False)


def test_a_timestamp_beside_a_null_keeps_its_nanoseconds(local_storage):
    features = datasets.Features({"t": datasets.Value("timestamp[ns]")})
    ds = datasets.Dataset.from_dict({"t": [2**62 + 1, None]}, features=features)
    ref = ydl.cache_dataset(ds, "ns", "v1", local_storage, progress=False)
    assert ref[0]["t"] == np.datetime64(2**62 + 1, "ns") and ref[1]["t"] is None


# --------------------------------------------------------------------------- images


def image_dataset(arrays, mode=None, feature=None):
    images = [PIL_Image.fromarray(a, mode) for a in arrays]
    features = datasets.Features({"i": datasets.Value("int32"), "img": feature or datasets.Image()})
    return datasets.Dataset.from_dict({"i": list(range(len(arrays))), "img": images}, features)


def test_images_of_one_shape_are_pixel_arrays(local_storage):
    rng = np.random.default_rng(2)
    arrays = [pixels(rng, (9, 5, 3)) for _ in range(12)]
    ds = image_dataset(arrays)
    ref = ydl.cache_dataset(ds, "same", "v1", local_storage, progress=False)
    field = ref.schema["img"]
    assert (field.dtype, field.shape, field.codec) == (np.uint8, (9, 5, 3), ydl.codecs.Raw())
    for i, array in enumerate(arrays):
        assert np.array_equal(ref[i]["img"], array), i  # every pixel, as PIL made them
    assert_cached_as(ref, list(ds))


@pytest.mark.parametrize(
    "mode, shape, dtype, codec",
    [
        ("RGB", (None, None, 3), np.uint8, ydl.codecs.Image("png")),
        ("RGBA", (None, None, 4), np.uint8, ydl.codecs.Image("png")),
        ("L", (None, None), np.uint8, ydl.codecs.Image("png")),
        ("I;16", (None, None), np.uint16, ydl.codecs.Image("png")),
        ("LA", (None, None, 2), np.uint8, ydl.codecs.Compressed()),
        ("F", (None, None), np.float32, ydl.codecs.Compressed()),
    ],
)
def test_images_of_mixed_shapes_are_stored_losslessly(local_storage, mode, shape, dtype, codec):
    rng = np.random.default_rng(3)
    channels = shape[2:]
    arrays = [pixels(rng, (3 + i % 4, 8 - i % 3, *channels), dtype) for i in range(10)]
    kwargs = {"mode": mode} if mode in ("LA",) else {}
    ds = image_dataset(arrays, **kwargs)
    assert ds[0]["img"].mode == mode
    ref = ydl.cache_dataset(ds, "mixed", mode.replace(";", "-"), local_storage, progress=False)
    field = ref.schema["img"]
    assert (field.dtype, field.shape, field.codec) == (np.dtype(dtype), shape, codec)
    for i, array in enumerate(arrays):
        got = ref[i]["img"]
        assert got.shape == array.shape and got.dtype == array.dtype, i
        assert np.array_equal(got, array), i
    assert_cached_as(ref, list(ds))


def test_images_of_one_size_but_several_heights_keep_the_fixed_dims(local_storage):
    rng = np.random.default_rng(4)
    ds = image_dataset([pixels(rng, (4 + i % 2, 6, 3)) for i in range(6)])
    schema = as_source(ds).schema
    assert schema["img"].shape == (None, 6, 3)


def test_images_of_several_modes_are_refused_naming_the_cast(local_storage):
    rng = np.random.default_rng(5)
    grey = PIL_Image.fromarray(pixels(rng, (4, 4)))
    colour = PIL_Image.fromarray(pixels(rng, (4, 4, 3)))
    ds = datasets.Dataset.from_dict({"pic": [grey, colour, grey]}).cast_column(
        "pic", datasets.Image()
    )
    with pytest.raises(ydl.SchemaError, match=r"'pic'.*different ranks.*Image\(mode='RGB'\)"):
        ydl.cache_dataset(ds, "modes", "v1", local_storage, progress=False)
    assert local_storage.list() == []
    fixed = ds.cast_column("pic", datasets.Image(mode="RGB"))
    ref = ydl.cache_dataset(fixed, "modes", "v1", local_storage, progress=False)
    assert ref.schema["pic"].shape == (4, 4, 3)
    assert np.array_equal(ref[0]["pic"], np.asarray(grey.convert("RGB")))
    assert_cached_as(ref, list(fixed))


def test_images_as_bytes_keep_the_files(local_storage):
    rng = np.random.default_rng(6)
    files = [png(pixels(rng, (2 + i, 3, 3))) for i in range(4)]
    ds = datasets.Dataset.from_dict(
        {"img": [{"bytes": f, "path": None} for f in files]},
        datasets.Features({"img": datasets.Image()}),
    )
    source = HuggingFaceSource(ds, images="bytes")
    ref = ydl.cache_dataset(source, "files", "v1", local_storage, progress=False)
    assert ref.schema["img"].kind == "bytes"
    assert [ref[i]["img"] for i in range(4)] == files
    undecoded = ds.cast_column("img", datasets.Image(decode=False))
    ref = ydl.cache_dataset(undecoded, "files", "v2", local_storage, progress=False)
    assert [ref[i]["img"] for i in range(4)] == files


def test_images_given_by_path_are_read_from_their_files(tmp_path, local_storage):
    rng = np.random.default_rng(7)
    arrays = [pixels(rng, (5, 5, 3)) for _ in range(3)]
    paths = []
    for i, array in enumerate(arrays):
        paths.append(str(tmp_path / f"{i}.png"))
        PIL_Image.fromarray(array).save(paths[-1])
    ds = datasets.Dataset.from_dict({"img": paths}).cast_column("img", datasets.Image())
    assert ds.data.table.column("img").to_pylist()[0]["bytes"] is None, "paths only"
    ref = ydl.cache_dataset(ds, "paths", "v1", local_storage, progress=False)
    assert all(np.array_equal(ref[i]["img"], a) for i, a in enumerate(arrays))
    as_files = ydl.cache_dataset(
        HuggingFaceSource(ds, images="bytes"), "paths", "v2", local_storage, progress=False
    )
    assert as_files[2]["img"] == (tmp_path / "2.png").read_bytes()


def test_jpeg_turned_by_exif_has_the_shape_datasets_gives(local_storage):
    rng = np.random.default_rng(8)
    files = []
    for orientation in (1, 6, 8, 3):
        exif = PIL_Image.Exif()
        exif[PIL_Image.ExifTags.Base.Orientation] = orientation
        out = io.BytesIO()
        PIL_Image.fromarray(pixels(rng, (4, 10, 3))).save(out, format="JPEG", exif=exif)
        files.append({"bytes": out.getvalue(), "path": None})
    ds = datasets.Dataset.from_dict({"img": files}, datasets.Features({"img": datasets.Image()}))
    assert {np.asarray(r["img"]).shape for r in ds} == {(4, 10, 3), (10, 4, 3)}
    ref = ydl.cache_dataset(ds, "exif", "v1", local_storage, progress=False)
    assert ref.schema["img"].shape == (None, None, 3)
    assert_cached_as(ref, list(ds))  # the same pixels as datasets' own decoding


def test_an_unreadable_image_names_its_record_and_field(local_storage):
    rng = np.random.default_rng(9)
    files = [png(pixels(rng, (3, 3, 3))) for _ in range(9)]
    files[7] = b"not an image"  # in the second batch of 5
    ds = datasets.Dataset.from_dict(
        {"img": [{"bytes": f, "path": None} for f in files]},
        datasets.Features({"img": datasets.Image()}),
    )
    with pytest.raises(ydl.SchemaError, match=r"record 7, field 'img': the image cannot be read"):
        ydl.cache_dataset(ds, "bad", "v1", local_storage, progress=False)
    assert local_storage.list() == []
    schema = ydl.Schema([ydl.Field("img", np.uint8, (3, 3, 3))])  # no header read: decoding
    with pytest.raises(ydl.SchemaError, match=r"record 7, field 'img': the image cannot be read"):
        ydl.cache_dataset(ds, "bad", "v1", local_storage, progress=False, schema=schema)
    stream = ds.to_iterable_dataset()
    with pytest.raises(ydl.SchemaError, match=r"record 7, field 'img': the image cannot be read"):
        ydl.cache_dataset(stream, "bad", "v1", local_storage, progress=False)


# --------------------------------------------------------------------------- streams


def test_a_dataset_turned_iterable_is_cached_in_its_order(rich, local_storage):
    stream = rich.to_iterable_dataset(num_shards=3)
    source = as_source(stream)
    assert isinstance(source, HuggingFaceSource) and source.length is None
    assert source.fingerprint() is None and source.split(4) is None
    ref = ydl.cache_dataset(stream, "stream", "v1", local_storage, progress=False)
    schema = ref.schema
    assert schema["img"].shape == (None, None, 3)  # a stream is not read twice for shapes
    assert schema["img"].codec == ydl.codecs.Image("png")
    assert schema["tokens"].shape == (None,) and schema["clip"].shape == (None, 2, 3)
    assert schema["label"].dtype == np.int64 and schema["meta/pos/x"].dtype == np.float32
    assert_cached_as(ref, list(stream))
    assert [int(ref[i]["id"]) for i in range(N)] == rich["id"]


def test_a_generator_stream_with_features(local_storage):
    rng = np.random.default_rng(10)
    arrays = [pixels(rng, (2 + i % 3, 4, 3)) for i in range(9)]

    def rows():
        for i, array in enumerate(arrays):
            yield {"i": i, "img": PIL_Image.fromarray(array), "v": list(range(i % 4))}

    features = datasets.Features(
        {
            "i": datasets.Value("int16"),
            "img": datasets.Image(),
            "v": datasets.List(datasets.Value("int64")),
        }
    )
    stream = datasets.IterableDataset.from_generator(rows, features=features)
    ref = ydl.cache_dataset(stream, "gen", "v1", local_storage, progress=False)
    assert ref.schema["i"].dtype == np.int16 and ref.schema["v"].shape == (None,)
    assert all(np.array_equal(ref[i]["img"], a) for i, a in enumerate(arrays))
    assert_cached_as(ref, list(stream))


def test_a_generator_stream_without_features_is_inferred(local_storage):
    rng = np.random.default_rng(11)
    arrays = [pixels(rng, (3, 3, 3)) for _ in range(5)]

    def rows():
        for i, array in enumerate(arrays):
            yield {"i": i, "img": PIL_Image.fromarray(array), "meta": {"name": f"r{i}"}}

    stream = datasets.IterableDataset.from_generator(rows)
    assert stream.features is None
    source = as_source(stream)
    assert source.schema is None  # inferred by the build, as for any iterable
    ref = ydl.cache_dataset(stream, "gen", "inferred", local_storage, progress=False)
    assert sorted(ref.schema.names) == ["i", "img", "meta/name"]
    assert ref.schema["img"].shape == (3, 3, 3)
    assert all(np.array_equal(ref[i]["img"], a) for i, a in enumerate(arrays))
    assert ref[4]["meta/name"] == "r4"


def test_a_null_in_a_stream_names_its_field(local_storage):
    features = datasets.Features({"x": datasets.Value("float32")})
    stream = datasets.IterableDataset.from_generator(
        lambda: iter([{"x": 1.0}, {"x": None}]), features=features
    )
    with pytest.raises(ydl.SchemaError, match=r"record 1.*'x'"):
        ydl.cache_dataset(stream, "nulls", "v1", local_storage, progress=False)
    nullable = ydl.Schema([ydl.Field("x", np.float32, nullable=True)])
    ref = ydl.cache_dataset(stream, "nulls", "v1", local_storage, progress=False, schema=nullable)
    assert ref[1]["x"] is None


# --------------------------------------------------------------------------- errors


def audio_dataset(features):
    rows = {"a": ["x.wav"], "meta": [{"id": 1, "clip": "y.wav"}]}
    return datasets.Dataset.from_dict(rows).cast(datasets.Features(features))


@pytest.mark.parametrize(
    "features, field, feature",
    [
        (
            {
                "a": datasets.Audio(),
                "meta": {"id": datasets.Value("int64"), "clip": datasets.Value("string")},
            },
            "a",
            "Audio",
        ),
        (
            {
                "a": datasets.Value("string"),
                "meta": {"id": datasets.Value("int64"), "clip": datasets.Audio()},
            },
            "meta/clip",
            "Audio",
        ),
    ],
)
def test_an_unsupported_feature_names_the_field_and_type(local_storage, features, field, feature):
    ds = audio_dataset(features)
    with pytest.raises(
        ydl.SchemaError, match=rf"field '{field}': the Hugging Face feature {feature}\("
    ):
        ydl.cache_dataset(ds, "audio", "v1", local_storage, progress=False)
    assert local_storage.list() == []
    top = field.split("/")[0]
    ref = ydl.cache_dataset(ds.remove_columns([top]), "audio", "v1", local_storage, progress=False)
    assert len(ref) == 1


@pytest.mark.parametrize(
    "feature, value, says",
    [
        (
            datasets.List(datasets.Value("string")),
            ["a"],
            r"List\(Value\('string'\)\).*list<item: string>",
        ),
        (datasets.List({"a": datasets.Value("int32")}), [{"a": 1}], r"List\(\{'a'"),
        (datasets.Array2D((1, 1), "string"), [["a"]], r"Array2D.*arrays of numbers"),
        (datasets.Value("duration[s]"), 1, r"Value\('duration\[s\]'\)"),
        (datasets.Json(), {"a": 1}, r"Json\("),
        (
            datasets.TranslationVariableLanguages(languages=["en"]),
            {"en": "hi"},
            r"TranslationVariable",
        ),
    ],
)
def test_other_unsupported_features(feature, value, says):
    ds = datasets.Dataset.from_dict({"x": [value]}, datasets.Features({"x": feature}))
    with pytest.raises(
        ydl.SchemaError,
        match=rf"field 'x': the Hugging Face feature {says}.*remove_columns\(\['x'\]\)",
    ):
        as_source(ds)


def test_a_dataset_dict_asks_for_a_split():
    both = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"x": [1]})})
    with pytest.raises(TypeError, match=r"DatasetDict.*ds\['train'\]"):
        ydl.cache_dataset(both, "dict", "v1", progress=False)


def test_images_argument_is_checked(rich):
    with pytest.raises(ValueError, match="images must be one of"):
        HuggingFaceSource(rich, images="pil")


def test_without_datasets_the_extra_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets now fails
    with pytest.raises(ydl.MissingExtra, match=r"pip install 'yogadl_plus\[hf\]'"):
        HuggingFaceSource(object())


# --------------------------------------------------------------------------- builds


@pytest.mark.slow
@pytest.mark.parametrize("stored", ["in_memory", "on_disk"])
def test_parallel_build_equals_the_serial_one(rich, local_storage, tmp_path, stored):
    dataset = rich
    if stored == "on_disk":  # what load_dataset gives: memory-mapped Arrow files
        # (datasets' save_to_disk fails on a Translation next to an Image: not ours to test)
        rich.remove_columns(["tr"]).save_to_disk(str(tmp_path / "saved"))
        dataset = datasets.load_from_disk(str(tmp_path / "saved"))
        assert dataset.cache_files
    dataset = dataset.shuffle(seed=1)
    pieces = as_source(dataset).split(4)
    assert [p.offset for p in pieces] == [0, 5, 11, 17]
    assert sum(p.length for p in pieces) == N
    serial = ydl.cache_dataset(dataset, "rich", "serial", local_storage, progress=False)
    parallel = ydl.cache_dataset(
        dataset, "rich", "parallel", local_storage, progress=False, workers=2
    )
    assert parallel.schema == serial.schema
    assert_cached_as(parallel, list(dataset))


@pytest.mark.parametrize("stored", ["in_memory", "on_disk"])
def test_pieces_carry_their_rows_not_the_whole_table(tmp_path, stored):
    rng = np.random.default_rng(12)
    dataset = datasets.Dataset.from_dict({"x": rng.random((4000, 64), dtype=np.float32)})
    if stored == "on_disk":
        dataset.save_to_disk(str(tmp_path / "saved"))
        dataset = datasets.load_from_disk(str(tmp_path / "saved"))
    whole = len(pickle.dumps(dataset))
    for view in (dataset, dataset.shuffle(seed=0)):
        pieces = as_source(view).split(8)
        sizes = [len(pickle.dumps(p)) for p in pieces]
        limit = whole / 4 if stored == "in_memory" else 20_000  # on disk: file paths
        assert max(sizes) < limit, (sizes, whole)


def test_fingerprint_follows_the_data(rich, local_storage):
    same = datasets.Dataset.from_list(rich_rows(N), features=datasets.Features(FEATURES))
    assert as_source(same).fingerprint() == as_source(rich).fingerprint()
    other = datasets.Dataset.from_list(rich_rows(N, seed=1), features=datasets.Features(FEATURES))
    assert as_source(other).fingerprint() != as_source(rich).fingerprint()
    ydl.cache_dataset(rich, "rich", "fp", local_storage, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ydl.cache_dataset(same, "rich", "fp", local_storage, progress=False)
    with pytest.warns(ydl.SourceChangedWarning):
        ydl.cache_dataset(other, "rich", "fp", local_storage, progress=False)


def test_schema_given_skips_reading_image_headers(rich, local_storage, monkeypatch):
    def no_headers(*args, **kwargs):
        raise AssertionError("headers read")

    monkeypatch.setattr(hf_source, "_header", no_headers)
    schema = ydl.Schema(
        [
            ydl.Field("id", np.int64),
            ydl.Field("img", np.uint8, (None, None, 3), codec=ydl.codecs.Image("jpeg", quality=95)),
        ]
    )
    ref = ydl.cache_dataset(
        rich.select_columns(["id", "img"]),
        "rich",
        "jpeg",
        local_storage,
        progress=False,
        schema=schema,
    )
    assert ref[0]["img"].shape == (6, 7, 3)


def test_a_null_dict_makes_its_fields_null(local_storage):
    import pyarrow as pa

    inner = pa.StructArray.from_arrays(
        [pa.array([1, 2, 3], pa.int32())], names=["a"], mask=pa.array([False, True, False])
    )
    assert inner.field("a").to_pylist() == [1, 2, 3], "a value under the null"
    ds = datasets.Dataset(pa.table({"s": inner}))
    assert ds[1]["s"] is None
    ref = ydl.cache_dataset(ds, "masked", "v1", local_storage, progress=False)
    assert ref.schema["s/a"].nullable
    assert [ref[i]["s/a"] for i in range(3)] == [1, None, 3]


@pytest.mark.parametrize(
    "bad, says",
    [
        (
            300,
            r"records 5\.\.8, column 'x': the stream's values do not fit .* Value\('int8'\)",
        ),
        ("seven", r"the stream failed in the batch after record 4: ValueError"),
    ],
)
def test_stream_values_that_do_not_fit_name_where(local_storage, bad, says):
    def rows():
        for i in range(9):
            yield {"x": bad if i == 7 else i}

    features = datasets.Features({"x": datasets.Value("int8")})
    stream = datasets.IterableDataset.from_generator(rows, features=features)
    with pytest.raises(ydl.SchemaError, match=says):
        ydl.cache_dataset(stream, "bad", "v1", local_storage, progress=False)
    assert local_storage.list() == []


def test_a_stream_is_ours_also_when_datasets_makes_it_a_torch_dataset():
    torch = pytest.importorskip("torch")
    stream = datasets.Dataset.from_dict({"x": [1, 2]}).to_iterable_dataset()
    assert isinstance(stream, torch.utils.data.IterableDataset)  # datasets adds the base class
    assert isinstance(as_source(stream), HuggingFaceSource)
