"""Petastorm datasets as a source: a store written by Petastorm 0.13.1 (tests/data, made by
tests/data/make_petastorm_dataset.py in the side venv) caches as the tensors Petastorm's own
reader decodes; a store partitioned by Spark (make_petastorm_partitioned.py) keeps its
partition columns; and a hostile schema pickle is refused without running anything."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import yogadl_plus as ydl
from yogadl_plus import codecs
from yogadl_plus.sources.petastorm import UNISCHEMA_KEY, load_unischema

DATA = Path(__file__).parent / "data"
STORE = DATA / "petastorm_sensors"


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    """What Petastorm's make_reader decoded from the store, by id (no pickles in the file)."""
    with np.load(DATA / "petastorm_sensors_expected.npz", allow_pickle=False) as saved:
        return {name: saved[name] for name in saved.files}


def by_id(ref: ydl.DataRef) -> dict[str, list]:
    batch = ref.get_batch(list(range(len(ref))))
    order = np.argsort(np.asarray(batch["id"]))
    return {name: [values[i] for i in order] for name, values in batch.items()}


@pytest.mark.parametrize("workers", [None, 2])
def test_a_petastorm_store_caches_the_tensors_petastorm_decodes(expected, local_storage, workers):
    ref = ydl.cache_dataset(str(STORE), "sensors", "v1", local_storage, workers=workers)
    assert ref.manifest.source_kind == "petastorm" and len(ref) == 40
    got = by_id(ref)
    for name in ("id", "level", "station", "matrix", "image_png", "mask_png", "photo"):
        assert np.array_equal(np.stack(got[name]), expected[name]), name
    readings = [np.nan if v is None else v for v in got["reading"]]
    assert np.array_equal(readings, expected["reading"], equal_nan=True)
    assert got["reading"][4] is None  # a null stays a null
    lengths = expected["trace_lengths"]
    traces = np.split(expected["trace_values"], np.cumsum(lengths)[:-1])
    assert all(np.array_equal(a, b) for a, b in zip(got["trace"], traces))


def test_unischema_fields_map_to_our_codecs_dtypes_and_shapes():
    schema = ydl.sources.PetastormSource(STORE).schema
    expect = {
        "id": (np.dtype("int64"), (), codecs.Scalar, False),
        "station": (str, (), codecs.String, False),
        "reading": (np.dtype("float64"), (), codecs.Scalar, True),
        "matrix": (np.dtype("float32"), (4, 5), codecs.Raw, False),
        "trace": (np.dtype("int16"), (None,), codecs.Compressed, False),
        "image_png": (np.dtype("uint8"), (12, 10, 3), codecs.Image, False),
        "mask_png": (np.dtype("uint8"), (8, 8), codecs.Image, False),
        "photo": (np.dtype("uint8"), (16, 16, 3), codecs.Raw, False),  # JPEG: decoded pixels
    }
    for name, (dtype, shape, codec, nullable) in expect.items():
        field = schema[name]
        assert (field.dtype, field.shape, type(field.codec), field.nullable) == (
            dtype,
            shape,
            codec,
            nullable,
        ), name


def test_columns_select_fields_and_unknown_ones_are_named(local_storage):
    source = ydl.sources.PetastormSource(f"file://{STORE}", columns=["photo", "id"])
    ref = ydl.cache_dataset(source, "sensors", "two", local_storage)
    assert ref.schema.names == ("photo", "id") and ref[0]["photo"].shape == (16, 16, 3)
    with pytest.raises(ydl.SchemaError, match=r"\['nope'\]"):
        ydl.sources.PetastormSource(STORE, columns=["id", "nope"])


def test_plain_parquet_is_not_mistaken_for_petastorm(tmp_path):
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "a.parquet")
    assert type(ydl.sources.as_source(str(tmp_path))) is ydl.sources.ParquetSource
    with pytest.raises(ydl.SchemaError, match="no Petastorm schema"):
        ydl.sources.PetastormSource(tmp_path)


# --------------------------------------------------------------------------- hostile stores


class RunsACommand:
    """A pickle that calls os.system when loaded by a plain unpickler."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class CallsEval:
    def __reduce__(self):
        return (eval, ("__import__('os').getcwd()",))


def store_with_schema(tmp_path: Path, payload: bytes) -> Path:
    """A copy of the test store whose _common_metadata carries ``payload`` as its Unischema."""
    store = tmp_path / "hostile"
    shutil.copytree(STORE, store)
    schema = pq.read_schema(store / "_common_metadata")
    metadata = {**schema.metadata, UNISCHEMA_KEY: payload}
    pq.write_metadata(schema.with_metadata(metadata), store / "_common_metadata")
    return store


@pytest.mark.parametrize(
    "make, refused",
    [
        (lambda marker: RunsACommand(marker), r"posix\.system"),
        (lambda marker: CallsEval(), r"builtins\.eval"),
        (lambda marker: {"fields": [shutil.rmtree]}, r"shutil\.rmtree"),
    ],
)
def test_a_hostile_schema_pickle_is_refused_and_runs_nothing(
    tmp_path, local_storage, make, refused
):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(make(marker))
    store = store_with_schema(tmp_path, payload)
    with pytest.raises(ydl.SchemaError, match=f"refusing to unpickle {refused}"):
        ydl.cache_dataset(str(store), "hostile", "v1", local_storage)
    assert not marker.exists()
    assert local_storage.list() == []
    pickle.loads(pickle.dumps(RunsACommand(marker)))  # the payload is real: plain pickle runs it
    assert marker.exists()


def test_allowed_names_that_are_no_unischema_are_refused():
    with pytest.raises(ydl.SchemaError, match="not a Unischema"):
        load_unischema(pickle.dumps({"a": np.int64}), "store")
    with pytest.raises(ydl.SchemaError, match="cannot read the Petastorm schema"):
        load_unischema(b"not a pickle", "store")


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_unischemas_pickled_with_old_protocols_load(monkeypatch, protocol):
    """Old Petastorm stores hold protocol 0/2 pickles (copyreg._reconstructor, numpy.dtype):
    pickle a look-alike Unischema from fake petastorm modules, then read it without them."""
    import collections
    import sys
    import types

    unischema_module = types.ModuleType("petastorm.unischema")
    codecs_module = types.ModuleType("petastorm.codecs")

    class Unischema:
        pass

    class UnischemaField(collections.namedtuple("F", "name numpy_dtype shape codec nullable")):
        pass

    class NdarrayCodec:
        pass

    for cls, module in ((Unischema, unischema_module), (UnischemaField, unischema_module),
                        (NdarrayCodec, codecs_module)):  # fmt: skip
        cls.__module__, cls.__qualname__ = module.__name__, cls.__name__
        setattr(module, cls.__name__, cls)
    for module in (types.ModuleType("petastorm"), unischema_module, codecs_module):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    schema = Unischema()
    field = UnischemaField("x", np.dtype(">f4"), (2, None), NdarrayCodec(), True)
    schema._name, schema._fields = "Old", collections.OrderedDict(x=field)
    data = pickle.dumps(schema, protocol=protocol)
    for name in ("petastorm", "petastorm.unischema", "petastorm.codecs"):
        monkeypatch.delitem(sys.modules, name)

    (loaded,) = load_unischema(data, "old-store")
    assert (loaded.name, loaded.shape, loaded.nullable) == ("x", (2, None), True)
    assert loaded.numpy_dtype.dtype == np.dtype(">f4")  # the byte order survives
    from yogadl_plus.sources.petastorm import our_field

    ours, how = our_field(loaded, "old-store")  # cached in the machine's byte order
    assert (ours.dtype, ours.shape, how) == (np.dtype("f4"), (2, None), "npy")


# --------------------------------------------------------------------------- partitioned stores

PARTITIONED = DATA / "petastorm_partitioned"


@pytest.mark.parametrize("workers", [None, 2])
def test_a_store_partitioned_by_spark_caches_its_partition_columns(local_storage, workers):
    """Petastorm's materialize_dataset + Spark's partitionBy("station", "day") (tests/data):
    the files hold neither column; the folders do, day=__HIVE_DEFAULT_PARTITION__ for a null."""
    with np.load(DATA / "petastorm_partitioned_expected.npz", allow_pickle=False) as saved:
        expected = {name: saved[name] for name in saved.files}
    ref = ydl.cache_dataset(str(PARTITIONED), "readings", "v1", local_storage, workers=workers)
    assert ref.manifest.source_kind == "petastorm" and len(ref) == 24
    assert ref.schema.names == ("id", "station", "day", "reading", "matrix")  # the Unischema's
    assert ref.schema["station"].kind == "str" and not ref.schema["station"].nullable
    assert ref.schema["day"].dtype == np.int32 and ref.schema["day"].nullable
    got = by_id(ref)
    assert got["station"] == expected["station"].tolist()
    assert [-1 if d is None else d for d in got["day"]] == expected["day"].tolist()
    assert np.array_equal(np.stack(got["matrix"]), expected["matrix"])
    assert np.array_equal(got["reading"], expected["reading"])
    picked = ydl.sources.PetastormSource(PARTITIONED, columns=["day", "id"])
    ref = ydl.cache_dataset(picked, "readings", "picked", local_storage, workers=workers)
    assert ref.schema.names == ("day", "id") and by_id(ref)["day"] == got["day"]


def partitioned_copy(tmp_path: Path, by: list[str], rename: dict[str, str] | None = None) -> Path:
    """The sensors store as Spark's partitionBy(*by) writes it: each file's rows split into
    key=value folders (``rename`` changes folder names), the columns ``by`` taken out of the
    files, _common_metadata (the Unischema) kept."""
    store = tmp_path / "partitioned"
    store.mkdir()
    shutil.copy(STORE / "_common_metadata", store)
    for number, path in enumerate(sorted(STORE.glob("*.parquet"))):
        data = pq.read_table(path)
        keys = sorted({tuple(row[c] for c in by) for row in data.select(by).to_pylist()})
        for values in keys:
            mask = np.all([np.asarray(data[c]) == v for c, v in zip(by, values)], axis=0)
            folder = store.joinpath(*(f"{c}={v}" for c, v in zip(by, values)))
            for old, new in (rename or {}).items():
                folder = Path(str(folder).replace(old, new))
            folder.mkdir(parents=True, exist_ok=True)
            name = f"part-{number:05d}-e7bcf242.c000.snappy.parquet"
            pq.write_table(data.filter(mask).drop_columns(by), folder / name)
    (store / "_SUCCESS").write_bytes(b"")
    return store


@pytest.mark.parametrize("workers", [None, 2])
def test_partition_values_take_the_unischemas_types(expected, tmp_path, local_storage, workers):
    """Before: a raw pyarrow ArrowInvalid (no field 'station' in the files)."""
    store = partitioned_copy(tmp_path, ["station", "id"])
    source = ydl.sources.PetastormSource(store)
    assert source.arrow_schema.field("id").type == pa.int64()  # int32 by the folders alone
    ref = ydl.cache_dataset(source, "sensors", "v1", local_storage, workers=workers)
    assert ref.schema["id"].dtype == np.int64 and ref.schema["station"].kind == "str"
    got = by_id(ref)
    for name in ("id", "level", "station", "matrix", "image_png", "mask_png", "photo"):
        assert np.array_equal(np.stack(got[name]), expected[name]), name


def test_a_null_partition_of_a_field_that_is_not_nullable_is_named(tmp_path):
    store = partitioned_copy(
        tmp_path, ["station"], {"station=east": "station=__HIVE_DEFAULT_PARTITION__"}
    )
    with pytest.raises(ydl.SchemaError, match="partition column 'station' has a null partition"):
        ydl.sources.PetastormSource(store)


def test_partition_columns_the_unischema_does_not_list_are_kept(tmp_path, local_storage):
    store = partitioned_copy(tmp_path, ["level"], {"level=": "batch=7/level="})
    ref = ydl.cache_dataset(str(store), "sensors", "v1", local_storage)
    assert ref.schema.names[-1] == "batch" and ref.schema["batch"].dtype == np.int32
    assert {r for r in ref.get_batch(range(len(ref)), fields=["batch"])["batch"]} == {7}
    assert sorted(ref.get_batch(range(40), fields=["id"])["id"].tolist()) == list(range(40))
