"""An existing version asked for again with a source that tells, without being read, that it
holds other data: a SourceChangedWarning naming each difference (length, a field's type or
shape, fields added or missing) and how to rebuild; silence for the same data, of every kind;
and a ``schema=`` that contradicts the cached schema refused, naming the field."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import yogadl_plus as ydl

torch_data = pytest.importorskip("torch.utils.data")

ROWS = 10


class Pairs(torch_data.Dataset):
    """A map-style dataset of ``(x, v)`` tuples (fields "0" and "1")."""

    def __init__(self, table: pa.Table) -> None:
        self.columns = {name: table.column(name).to_pylist() for name in table.column_names}

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        return tuple(np.asarray(values[i]) for values in self.columns.values())


def table(
    rows: int = ROWS, x: Any = np.int64, width: int = 2, extra: bool = False, drop: bool = False
) -> pa.Table:
    """The data every kind is made of: ``x`` (a scalar of dtype ``x``), ``v`` (float32 of
    ``width``), and ``z`` if ``extra``; without ``v`` if ``drop``."""
    values = np.arange(rows * width, dtype=np.float32) / 4
    columns = {"x": pa.array(np.arange(rows).astype(x))}
    if not drop:
        columns["v"] = pa.FixedSizeListArray.from_arrays(pa.array(values), width)
    if extra:
        columns["z"] = pa.array([f"z{i}" for i in range(rows)])
    return pa.table(columns)


def as_numpy(t: pa.Table) -> dict[str, np.ndarray]:
    out = {}
    for name in t.column_names:
        column = t.column(name)
        if pa.types.is_fixed_size_list(column.type):
            flat = column.combine_chunks().flatten().to_numpy()
            out[name] = flat.reshape(len(column), column.type.list_size)
        else:
            out[name] = column.to_numpy()
    return out


def as_parquet_dataset(t: pa.Table, folder: Path) -> Any:
    path = folder / f"data-{abs(hash(str(t.schema)))}-{t.num_rows}.parquet"
    pq.write_table(t, path)
    return pads.dataset(path)


def as_hugging_face(t: pa.Table) -> Any:
    datasets = pytest.importorskip("datasets")
    return datasets.Dataset(t)


def as_tf_data(t: pa.Table) -> Any:
    tf = pytest.importorskip("tensorflow")
    return tf.data.Dataset.from_tensor_slices(as_numpy(t))


def as_polars(t: pa.Table) -> Any:
    polars = pytest.importorskip("polars")
    return polars.from_arrow(t)


def as_pandas(t: pa.Table) -> Any:
    return t.drop_columns(["v"] if "v" in t.column_names else []).to_pandas()


def as_reader(t: pa.Table) -> Any:
    return pa.RecordBatchReader.from_batches(t.schema, t.to_batches())


BOTH = {"length", "schema"}
# kind -> (make the source from the table, what it tells unread)
KINDS: dict[str, tuple[Callable[[pa.Table, Path], Any], set[str]]] = {
    "numpy": (lambda t, _: as_numpy(t), BOTH),
    "pandas": (lambda t, _: as_pandas(t), BOTH),
    "polars": (lambda t, _: as_polars(t), BOTH),
    "arrow": (lambda t, _: t, BOTH),
    "arrow-dataset": (as_parquet_dataset, BOTH),
    "arrow-reader": (lambda t, _: as_reader(t), {"schema"}),
    "huggingface": (lambda t, _: as_hugging_face(t), BOTH),
    "tensorflow": (lambda t, _: as_tf_data(t), BOTH),
    "torch": (lambda t, _: Pairs(t), {"length"}),
    "list": (lambda t, _: t.to_pylist(), {"length"}),
}
# Arrow datasets and readers say their columns may hold nulls ("nullable int64"); tf.data's
# strings are bytes.
MAY = "(nullable )?"


def cache(source: Any, storage: ydl.LocalStorage, **kwargs: Any) -> ydl.DataRef:
    return ydl.cache_dataset(source, "toy", "v1", storage, progress=False, **kwargs)


def silently(source: Any, storage: ydl.LocalStorage, **kwargs: Any) -> ydl.DataRef:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return cache(source, storage, **kwargs)


def warned(source: Any, storage: ydl.LocalStorage, **kwargs: Any) -> str:
    with pytest.warns(ydl.SourceChangedWarning) as caught:
        ref = cache(source, storage, **kwargs)
    (message,) = [str(w.message) for w in caught if w.category is ydl.SourceChangedWarning]
    assert "the source of 'toy' version 'v1' has changed" in message
    assert "overwrite=True" in message and "new version" in message
    assert len(ref) == ROWS  # the cached data, as it is
    return message


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_warns_of_what_it_tells_and_is_silent_for_the_same_data(
    kind, local_storage, tmp_path
):
    make, tells = KINDS[kind]
    built = cache(make(table(), tmp_path), local_storage)
    assert len(built) == ROWS
    silently(make(table(), tmp_path), local_storage)
    silently(make(table(), tmp_path), local_storage)  # and again: nothing was rebuilt
    if "length" in tells:
        assert "length 12 against 10 cached" in warned(make(table(12), tmp_path), local_storage)
    if "schema" not in tells:
        return
    message = warned(make(table(x=np.float64), tmp_path), local_storage)
    assert re.search(f"field 'x' is {MAY}float64 against {MAY}int64 cached", message)
    message = warned(make(table(extra=True), tmp_path), local_storage)
    assert re.search(rf"field 'z' \({MAY}(str|bytes)\) is not cached", message)
    if kind != "pandas":  # (its frames hold no arrays: v is left out of them)
        message = warned(make(table(width=3), tmp_path), local_storage)
        assert re.search(rf"field 'v' is {MAY}float32\[3\] against {MAY}float32\[2\]", message)
        message = warned(make(table(drop=True), tmp_path), local_storage)
        assert re.search(rf"field 'v' \({MAY}float32\[2\]\) is cached but missing", message)


def test_several_differences_are_one_warning(local_storage):
    cache(as_numpy(table()), local_storage)
    message = warned(as_numpy(table(12, x=np.int32, extra=True)), local_storage)
    assert message.split(". ")[0].count("; ") == 2, message
    assert "length 12 against 10" in message and "int32 against int64" in message


def test_a_keras_dataset_of_the_same_batches_is_silent(local_storage):
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 2  # batches, not records

        def __getitem__(self, i):
            return np.full((5, 2), i, np.float32), np.arange(5) + 5 * i

    assert len(cache(Batches(), local_storage)) == ROWS
    silently(Batches(), local_storage)


def test_a_generator_tells_nothing_and_is_not_read(local_storage):
    cache(lambda: iter(table().to_pylist()), local_storage)

    def never():
        raise AssertionError("read")

    silently(never, local_storage)


def test_hugging_face_images_are_not_read_to_compare(local_storage, monkeypatch):
    datasets = pytest.importorskip("datasets")
    from yogadl_plus.sources import huggingface

    images = [np.full((4 + i % 2, 5, 3), i, np.uint8) for i in range(ROWS)]
    features = datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")})
    data = {"img": images, "label": list(range(ROWS))}
    ref = cache(datasets.Dataset.from_dict(data, features=features), local_storage)
    assert ref.schema["img"].shape == (None, 5, 3)  # the build read the images' headers

    def no_headers(*args, **kwargs):
        raise AssertionError("an image header was read")

    monkeypatch.setattr(huggingface, "_header", no_headers)
    silently(datasets.Dataset.from_dict(data, features=features), local_storage)
    more = {"img": [*images, images[0]], "label": list(range(ROWS + 1))}
    assert "length 11 against 10" in warned(
        datasets.Dataset.from_dict(more, features=features), local_storage
    )


# --- schema= given ---


SCHEMA = ydl.Schema([ydl.Field("x", np.int64), ydl.Field("v", np.float32, (2,))])


def test_the_same_schema_given_again_is_accepted_in_any_order(local_storage):
    cache(as_numpy(table()), local_storage, schema=SCHEMA)
    silently(as_numpy(table()), local_storage, schema=SCHEMA)
    reordered = ydl.Schema([SCHEMA["v"], SCHEMA["x"]])
    silently(as_numpy(table()), local_storage, schema=reordered)


@pytest.mark.parametrize(
    "field, said",
    [
        (ydl.Field("x", np.float64), "field 'x' is float64 against int64 cached"),
        (ydl.Field("x", np.int64, nullable=True), "field 'x' is nullable int64 against int64"),
        (
            ydl.Field("x", np.int64, codec=ydl.codecs.Compressed()),
            "field 'x' is int64 codecs.Compressed(level=3) against int64 codecs.Scalar() cached",
        ),
    ],
)
def test_a_contradicting_schema_is_refused_naming_the_field(local_storage, field, said):
    cache(as_numpy(table()), local_storage)
    other = ydl.Schema([field, SCHEMA["v"]])
    with pytest.raises(ydl.SchemaError, match="schema= contradicts") as caught:
        cache(as_numpy(table()), local_storage, schema=other)
    assert said in str(caught.value)
    assert "overwrite=True" in str(caught.value)


def test_a_schema_with_a_field_more_or_less_is_refused(local_storage):
    cache(as_numpy(table()), local_storage)
    fewer = ydl.Schema([SCHEMA["x"]])
    with pytest.raises(ydl.SchemaError, match=r"field 'v' \(float32\[2\]\) is cached but missing"):
        cache({"x": np.arange(ROWS)}, local_storage, schema=fewer)
    more = ydl.Schema([*SCHEMA, ydl.Field("z", str)])
    with pytest.raises(ydl.SchemaError, match=r"field 'z' \(str\) is not cached"):
        cache(as_numpy(table(extra=True)), local_storage, schema=more)


def test_a_version_cached_with_a_schema_given_is_silent_without_one(local_storage):
    # The columns' own types (int64, float32[2]) are not what was declared: no false alarm.
    declared = ydl.Schema([ydl.Field("x", np.float64), ydl.Field("v", np.float32, (None,))])
    cache(as_numpy(table()), local_storage, schema=declared)
    silently(as_numpy(table()), local_storage)
    assert "length 12 against 10" in warned(as_numpy(table(12)), local_storage)


def test_versions_without_the_sources_schema_compare_its_length_alone(local_storage):
    """Versions cached before the source's schema was stored, or by another yogadl_plus."""
    ref = cache(as_numpy(table()), local_storage)
    manifest = Path(ref.directory) / "manifest.json"
    body = json.loads(manifest.read_text())
    for edit in ("older", "other library"):
        if edit == "older":
            del body["source"]["schema"]
        else:
            body["library_version"] = "0.0.1"
        manifest.write_text(json.dumps(body))
        silently(as_numpy(table(x=np.float64)), local_storage)
        assert "length 12 against 10" in warned(as_numpy(table(12)), local_storage)
