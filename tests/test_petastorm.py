"""Petastorm datasets as a source: a store written by Petastorm 0.13.1 (tests/data, made by
tests/data/make_petastorm_dataset.py in the side venv) caches as the tensors Petastorm's own
reader decodes; a store partitioned by Spark (make_petastorm_partitioned.py) keeps its
partition columns; a hostile schema pickle is refused without running anything, and cannot
make the allowed names build big things."""

from __future__ import annotations

import collections
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import yogadl_plus as ydl
from yogadl_plus import codecs
from yogadl_plus.sources.petastorm import UNISCHEMA_KEY, load_unischema, our_field

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
    text = UnischemaField("t", np.str_, (), None, False)
    raw = UnischemaField("r", np.bytes_, (), None, False)
    schema._name, schema._fields = "Old", collections.OrderedDict(x=field, t=text, r=raw)
    data = pickle.dumps(schema, protocol=protocol)
    for name in ("petastorm", "petastorm.unischema", "petastorm.codecs"):
        monkeypatch.delitem(sys.modules, name)
    if protocol < 4:  # as numpy 1 named them
        data = data.replace(b"numpy\nstr_\n", b"numpy\nunicode_\n")
        data = data.replace(b"numpy\nbytes_\n", b"numpy\nstring_\n")
        assert b"unicode_" in data and b"string_" in data

    loaded, loaded_text, loaded_raw = load_unischema(data, "old-store")
    assert our_field(loaded_text, "old-store")[0].kind == "str"
    assert our_field(loaded_raw, "old-store")[0].kind == "bytes"
    assert (loaded.name, loaded.shape, loaded.nullable) == ("x", (2, None), True)
    assert loaded.numpy_dtype.dtype == np.dtype(">f4")  # the byte order survives
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


# --------------------------------------------------------------------------- schema pickle bombs


class Call:
    """Pickles as a call of ``func(*args)`` (REDUCE), made when the pickle is loaded."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


def bytes_by_newobj(size: int) -> bytes:
    """``bytes.__new__(bytes, size)`` (NEWOBJ, protocol 2), as no object pickles itself."""
    return b"\x80\x02cbuiltins\nbytes\nJ" + size.to_bytes(4, "little") + b"\x85\x81."


def ordered_dict_copies() -> bytes:
    """10**4 OrderedDicts, each a copy of the same 10**4 pairs: 1.7 MB that unpickle to 10**8
    dict entries (several GB), unless OrderedDict may only be called as its pickles call it."""
    pairs = [(i, i) for i in range(10**4)]
    return pickle.dumps([Call(collections.OrderedDict, pairs) for _ in range(10**4)])


def state_copies(monkeypatch: pytest.MonkeyPatch) -> bytes:
    """10**4 codecs, each given the same 10**4-attribute state: 10**8 attributes set."""
    codecs_module = types.ModuleType("petastorm.codecs")

    class ScalarCodec:
        def __getstate__(self):
            return STATE

    STATE = {f"a{i}": i for i in range(10**4)}
    ScalarCodec.__module__, ScalarCodec.__qualname__ = codecs_module.__name__, "ScalarCodec"
    codecs_module.ScalarCodec = ScalarCodec
    monkeypatch.setitem(sys.modules, "petastorm", types.ModuleType("petastorm"))
    monkeypatch.setitem(sys.modules, "petastorm.codecs", codecs_module)
    return pickle.dumps([ScalarCodec() for _ in range(10**4)])


LOAD_IN_A_SMALL_PROCESS = """
import json, resource, sys
from yogadl_plus.sources.petastorm import load_unischema
data = sys.stdin.buffer.read()
page = resource.getpagesize()
size = int(open("/proc/self/statm").read().split()[0]) * page
resource.setrlimit(resource.RLIMIT_AS, (size + 2**30, size + 2**30))  # a bomb: MemoryError
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    load_unischema(data, "store")
    outcome = ["loaded", ""]
except BaseException as exc:
    outcome = [type(exc).__name__, str(exc)[:300]]
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps([*outcome, grown // 1024]))
"""


BOMBS = {  # name: (payload, what the error says)
    "bytes": (
        lambda mp: pickle.dumps(Call(bytes, 10**9)),
        r"to call builtins\.bytes\(1000000000\)",
    ),
    "bytes-newobj": (lambda mp: bytes_by_newobj(10**9), r"NEWOBJ class argument must be a type"),
    "str-of-bytes": (lambda mp: pickle.dumps(Call(str, Call(bytes, 10**8))), r"builtins\.bytes"),
    "tuple-of-bytes": (lambda mp: pickle.dumps(Call(tuple, Call(bytes, 10**8))), r"\.bytes"),
    "numpy-bytes_": (lambda mp: pickle.dumps(Call(np.bytes_, 10**9)), r"to call numpy\.bytes_\("),
    "numpy-str_": (lambda mp: pickle.dumps(Call(np.str_, Call(bytes, 10**8))), r"builtins\.bytes"),
    "numpy-zeros": (
        lambda mp: pickle.dumps(Call(np.zeros, (10**5,) * 2)),
        r"unpickle numpy\.zeros",
    ),
    "bytearray": (lambda mp: pickle.dumps(Call(bytearray, 10**9)), r"unpickle builtins\.bytearray"),
    "ordered-dict-copies": (lambda mp: ordered_dict_copies(), r"to call collections\.OrderedDict"),
    "state-copies": (state_copies, r"the Petastorm schema is not a Unischema: \[<"),
}


@pytest.mark.parametrize("bomb", list(BOMBS))
def test_a_schema_pickle_cannot_make_big_things(monkeypatch, bomb):
    """Before: bytes(10**9) was built (a 1 GB request peaked at 7.6 GB RSS, with the repr of
    the error message), and allowed callables copied the pickle's own containers over and
    over. Loaded in a process of its own that may grow by at most 1 GiB: each is refused, and
    grows it by less than 100 MB. (A pickle calls, it does no arithmetic: ``"x" * n`` cannot
    be written in one.)"""
    make, refused = BOMBS[bomb]
    payload = make(monkeypatch)
    assert len(payload) < 2_000_000
    run = subprocess.run(
        [sys.executable, "-c", LOAD_IN_A_SMALL_PROCESS],
        input=payload,
        capture_output=True,
        timeout=120,
        cwd=Path(ydl.__file__).parent.parent,  # the same yogadl_plus as this process
    )
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    error, message, grown_mb = json.loads(run.stdout)
    assert error == "SchemaError" and re.search(refused, message), (error, message)
    assert grown_mb < 100, f"loading grew the process by {grown_mb} MB"


def test_a_dtype_in_a_schema_is_one_plain_type():
    def unischema_with_dtype(spec: str) -> bytes:
        good = pickle.dumps(np.dtype("<f4"), protocol=2)
        return good.replace(
            b"X\x02\x00\x00\x00f4", b"X" + len(spec).to_bytes(4, "little") + spec.encode()
        )

    assert b"X\x02\x00\x00\x00f4" in pickle.dumps(np.dtype("<f4"), protocol=2)
    for spec, why in [
        ("(1000000000,)u1", "one plain type"),
        ("f4,i8", "one plain type"),
        ("O", "one plain type"),
        ("f" * 100, "short string"),
    ]:
        with pytest.raises(ydl.SchemaError, match=rf"refusing to call numpy\.dtype.*{why}"):
            load_unischema(unischema_with_dtype(spec), "store")
