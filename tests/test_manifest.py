"""Manifests are checked strictly before use: every value of a real manifest changed (negated,
grown, of the wrong type, removed) gives a CacheCorrupted naming the field, or exactly the right
records; never wrong ones, never a bare exception."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import yogadl_plus as ydl
from yogadl_plus.cli import main

N = 60
FIELDS = ["id", "x", "s", "maybe"]


def records() -> Iterator[dict[str, Any]]:
    for i in range(N):
        yield {
            "id": np.int64(i),
            "x": np.full(3, i, dtype=np.float32),
            "s": f"s{i}",
            "maybe": None if i % 3 else np.int32(i),
        }


SCHEMA = ydl.Schema(
    [
        ydl.Field("id", np.int64),
        ydl.Field("x", np.float32, (3,)),
        ydl.Field("s", str),
        ydl.Field("maybe", np.int32, nullable=True),
    ]
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    """A real version of three chunks: its folder, its manifest's text, and all its records."""
    root = tmp_path_factory.mktemp("manifest") / "store"
    storage = ydl.LocalStorage(root)
    ref = ydl.cache_dataset(
        records, "ds", "v1", storage, schema=SCHEMA, progress=False, chunk_bytes=600
    )
    assert len(ref.manifest.chunks) >= 3
    expected = ref.get_batch(np.arange(N))
    text = Path(ref.directory, "manifest.json").read_text()
    return Path(ref.directory), text, expected


def leaves(body: Any, path: tuple = ()) -> Iterator[tuple]:
    """The path of every value in a JSON document, containers included."""
    yield path
    if isinstance(body, dict):
        for key, value in body.items():
            yield from leaves(value, (*path, key))
    elif isinstance(body, list):
        for i, value in enumerate(body):
            yield from leaves(value, (*path, i))


def changed(value: Any) -> Iterator[tuple[str, Any]]:
    """Ways a value can be damaged: negated, grown, of another type, emptied."""
    if isinstance(value, bool):
        yield "flipped", not value
        yield "as-int", int(value)
    elif isinstance(value, int):
        yield "negated", -value - 1
        yield "grown", value * 2 + 1
        yield "huge", 2**70
        yield "float", value + 0.5
        yield "as-str", str(value)
        yield "as-bool", True
    elif isinstance(value, str):
        yield "grown", value + "x"
        yield "emptied", ""
        yield "other-hex", "0" * len(value)
        yield "as-int", 7
        yield "path", "../" + value
    elif isinstance(value, list):
        yield "nested", [value]
        yield "emptied", []
        yield "doubled", value + value
        yield "as-dict", {}
        if value[::-1] != value:
            yield "reversed", value[::-1]
    elif isinstance(value, dict):
        yield "in-a-list", [value]
        yield "emptied", {}
        yield "as-list", []
    yield "null", None


def mutations(body: dict) -> Iterator[tuple[str, dict]]:
    for path in leaves(body):
        if not path:
            continue
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        value = parent[path[-1]]
        for how, new in changed(value):
            if json.dumps(new) == json.dumps(value):
                continue  # (no change: an empty object "emptied")
            damaged = copy.deepcopy(body)
            target = damaged
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = new
            yield f"{'.'.join(map(str, path))}:{how}", damaged
        if isinstance(parent, dict):
            damaged = copy.deepcopy(body)
            target = damaged
            for key in path[:-1]:
                target = target[key]
            del target[path[-1]]
            yield f"{'.'.join(map(str, path))}:removed", damaged


def read_all(storage: ydl.LocalStorage) -> dict[str, Any]:
    ref = storage.fetch("ds", "v1")
    try:
        batch = ref.get_batch(np.arange(len(ref)), fields=FIELDS)
        for i in (0, len(ref) // 2, len(ref) - 1):
            one = ref[i]
            assert set(one) == set(FIELDS)
        streamed = list(ref.stream(batch_size=16))
        assert sum(len(b["id"]) for b in streamed) == len(ref)
        return batch
    finally:
        ref.close()


def same(got: dict[str, Any], want: dict[str, Any]) -> bool:
    for name in FIELDS:
        a, b = got[name], want[name]
        if isinstance(b, np.ndarray):
            if not (isinstance(a, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)):
                return False
        elif list(a) != list(b):
            return False
    return True


def test_every_value_changed_gives_cache_corrupted_or_the_right_records(built):
    folder, text, expected = built
    storage = ydl.LocalStorage(folder.parent.parent)
    body = json.loads(text)
    manifest = folder / "manifest.json"
    outcomes: dict[str, list[str]] = {"refused": [], "read": []}
    try:
        for name, damaged in mutations(body):
            manifest.write_text(json.dumps(damaged))
            try:
                got = read_all(storage)
            except ydl.CacheCorrupted as exc:
                assert str(exc), name
                outcomes["refused"].append(name)
                continue
            except ydl.DatasetNotFound:
                pytest.fail(f"{name}: DatasetNotFound for a damaged manifest")
            except Exception as exc:
                pytest.fail(f"{name}: {type(exc).__name__}: {exc}")
            assert same(got, expected), f"{name}: wrong records served"
            outcomes["read"].append(name)
    finally:
        manifest.write_text(text)
    # What may change without consequence: when and by what it was made, where it came from,
    # and spellings of the same schema (a missing shape of a scalar field is its shape, ()).
    # Every change to where records are (chunks, counts, names, format) is refused.
    harmless = ("created", "library_version", "source", "schema")
    unexpected = [n for n in outcomes["read"] if not n.startswith(harmless)]
    assert not unexpected, unexpected
    assert not [n for n in outcomes["read"] if n.startswith("schema") and ".name" in n]
    assert len(outcomes["refused"]) > 300


@pytest.mark.parametrize(
    "damage",
    [
        "deep",
        "directory",
        "binary",
        "duplicate_files",
        "duplicate_ids",
        "swapped_files",
        "other_version",
        "truncated",
        "newer_format",
        "extra_chunk_key",
    ],
)
def test_structural_damage_is_named(built, damage):
    folder, text, _ = built
    storage = ydl.LocalStorage(folder.parent.parent)
    manifest = folder / "manifest.json"
    body = json.loads(text)
    chunks = body["chunks"]
    if damage == "deep":
        data = ("[" * 100_000 + "]" * 100_000).encode()
    elif damage == "binary":
        data = b"\xff\xfe" + os.urandom(64)
    elif damage == "duplicate_files":
        chunks[1]["file"] = chunks[0]["file"]
        data = json.dumps(body).encode()
    elif damage == "duplicate_ids":
        chunks[1]["id"] = chunks[0]["id"]
        data = json.dumps(body).encode()
    elif damage == "swapped_files":
        chunks[0]["file"], chunks[1]["file"] = chunks[1]["file"], chunks[0]["file"]
        data = json.dumps(body).encode()
    elif damage == "other_version":
        body["version"] = "v2"
        data = json.dumps(body).encode()
    elif damage == "truncated":
        data = text.encode()[: len(text) // 2]
    elif damage == "newer_format":
        body["format_version"] = 99
        data = json.dumps(body).encode()
    elif damage == "extra_chunk_key":
        chunks[0]["offset"] = 5
        data = json.dumps(body).encode()
    else:
        data = b""
    try:
        if damage == "directory":
            manifest.unlink()
            manifest.mkdir()
        else:
            manifest.write_bytes(data)
        with pytest.raises(ydl.CacheCorrupted) as caught:
            read_all(storage)
        message = str(caught.value)
        assert "manifest" in message or "chunk" in message, message
        if damage == "newer_format":
            assert "upgrade yogadl_plus" in message
        assert main(["info", "ds", "v1", "--storage", storage.root]) == 1
    finally:
        if manifest.is_dir():
            manifest.rmdir()
        manifest.write_text(text)


def test_a_negative_record_count_is_refused(built):
    """The finding: a negative count made record 984 come back as record 0."""
    folder, text, _ = built
    storage = ydl.LocalStorage(folder.parent.parent)
    body = json.loads(text)
    body["chunks"][0]["records"] = -body["chunks"][0]["records"]
    body["num_records"] = sum(c["records"] for c in body["chunks"])
    manifest = folder / "manifest.json"
    try:
        manifest.write_text(json.dumps(body))
        with pytest.raises(ydl.CacheCorrupted, match=r"chunks\[0\]\.records must be an int"):
            storage.fetch("ds", "v1")
    finally:
        manifest.write_text(text)


@pytest.mark.servers
def test_a_tampered_remote_manifest_is_refused(s3_server, s3_bucket, tmp_path):
    bucket = s3_server.storage(s3_bucket, "manifest", tmp_path / "cache")
    ydl.cache_dataset(records, "ds", "v1", bucket, schema=SCHEMA, progress=False, chunk_bytes=600)
    key = "ds/v1/manifest.json"
    data, token = bucket.objects.read(key)
    body = json.loads(data)
    body["chunks"][0]["records"] = -body["chunks"][0]["records"]
    body["num_records"] = sum(c["records"] for c in body["chunks"])
    assert bucket.objects.replace(key, json.dumps(body).encode(), token)
    elsewhere = s3_server.storage(s3_bucket, "manifest", tmp_path / "other")
    with pytest.raises(ydl.CacheCorrupted, match=r"chunks\[0\]\.records"):
        elsewhere.fetch("ds", "v1")


@pytest.mark.servers
@pytest.mark.parametrize("on_demand", [False, True], ids=["pull", "on-demand"])
def test_a_remote_manifest_with_a_chunk_entry_of_another_build_is_refused(
    s3_server, s3_bucket, tmp_path, on_demand
):
    # The version's manifest as its first build published it, with chunk 1's entry taken from
    # the build that overwrote it (whose objects are in the bucket too).
    bucket = s3_server.storage(s3_bucket, f"splice-{on_demand}", tmp_path / "cache")
    build = dict(schema=SCHEMA, progress=False, chunk_bytes=600)
    ydl.cache_dataset(records, "ds", "v1", bucket, **build)
    key = "ds/v1/manifest.json"
    first = json.loads(bucket.objects.read(key)[0])
    ydl.cache_dataset(records, "ds", "v1", bucket, overwrite=True, **build)
    data, token = bucket.objects.read(key)
    first["chunks"][1] = json.loads(data)["chunks"][1]
    assert bucket.objects.replace(key, json.dumps(first).encode(), token)
    elsewhere = s3_server.storage(s3_bucket, f"splice-{on_demand}", tmp_path / "other")
    with pytest.raises(ydl.CacheCorrupted) as caught:
        elsewhere.fetch("ds", "v1", on_demand=on_demand)
    message = str(caught.value)
    assert f"{bucket.url}/{key}" in message and "chunks[1]" in message, message
    assert "another build" in message


def test_a_chunk_left_out_of_the_list_is_refused(built):
    """Dropping a chunk and fixing the counts would serve record 91 from the next chunk."""
    folder, text, _ = built
    storage = ydl.LocalStorage(folder.parent.parent)
    body = json.loads(text)
    gone = body["chunks"].pop(1)
    body["num_records"] -= gone["records"]
    manifest = folder / "manifest.json"
    try:
        manifest.write_text(json.dumps(body))
        with pytest.raises(ydl.CacheCorrupted, match="reordered or a chunk left out"):
            storage.fetch("ds", "v1")
    finally:
        manifest.write_text(text)


MAKE_FORMAT_1 = """
import sys
import numpy as np
import yogadl_plus as ydl

records = ({"id": np.int64(i), "x": np.full(8, i, np.float32)} for i in range(300))
ydl.cache_dataset(records, "d", "v1", ydl.LocalStorage(sys.argv[1]), progress=False,
                  chunk_bytes=4000)
"""


@pytest.fixture
def format_1(tmp_path: Path) -> ydl.LocalStorage:
    """A version written by yogadl_plus 0.1.0 (format 1: flat chunk files, no chunk ids), when
    its code is at hand (YOGADL_PLUS_OLD_CHECKOUT, or a checkout named base beside this one)."""
    import subprocess
    import sys

    old = os.environ.get("YOGADL_PLUS_OLD_CHECKOUT", str(Path(__file__).parents[2] / "base"))
    if not os.path.isfile(os.path.join(old, "yogadl_plus", "cache", "manifest.py")):
        pytest.skip("no checkout of yogadl_plus 0.1.0 to write a format 1 cache with")
    root = tmp_path / "old"
    done = subprocess.run(
        [sys.executable, "-c", MAKE_FORMAT_1, str(root)],
        env={**os.environ, "PYTHONPATH": old},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    body = json.loads((root / "d" / "v1" / "manifest.json").read_text())
    if body["format_version"] != 1:
        pytest.skip(f"{old} writes format {body['format_version']}, not 1")
    return ydl.LocalStorage(root)


def test_a_format_1_version_is_read_and_its_chunk_order_checked(format_1):
    ref = format_1.fetch("d", "v1")
    assert len(ref.manifest.chunks) >= 3
    np.testing.assert_array_equal(ref.get_batch(np.arange(300))["id"], np.arange(300))
    ref.close()
    manifest = Path(format_1.path("d", "v1"), "manifest.json")
    body = json.loads(manifest.read_text())
    body["chunks"][0], body["chunks"][1] = body["chunks"][1], body["chunks"][0]
    manifest.write_text(json.dumps(body))
    with pytest.raises(ydl.CacheCorrupted, match="reordered or a chunk left out"):
        format_1.fetch("d", "v1")
