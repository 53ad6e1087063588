"""LocalStorage: names, on-disk layout, versions, verification, concurrency, fingerprints,
storage URLs and DataRef pickling (docs/api.md#storage, #caching, #dataref and #errors;
docs/design.md#cache-format)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import pickle
import re
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl

# --- helpers -----------------------------------------------------------------------------------


def record(i: int, seed: int = 0) -> dict:
    return {
        "i": np.int64(i),
        "x": np.arange(4, dtype=np.float32) + np.float32(i + 1000 * seed),
        "s": f"rec-{seed}-{i}",
    }


def check_record(got: dict, i: int, seed: int = 0) -> None:
    want = record(i, seed)
    assert set(got) == set(want), got
    assert int(got["i"]) == i
    np.testing.assert_array_equal(got["x"], want["x"])
    assert got["x"].dtype == np.float32
    assert got["s"] == want["s"]


def check_all(ref: ydl.DataRef, n: int, seed: int = 0) -> None:
    assert len(ref) == n
    for i in range(n):
        check_record(ref[i], i, seed)


def check_all_and_close(ref: ydl.DataRef, n: int, seed: int = 0) -> None:
    """check_all, then release the LMDB handles: see test_two_datarefs_of_one_version_in_one_process
    for why tests that hold several DataRefs of one version close each after reading it."""
    check_all(ref, n, seed)
    ref.close()


def digest(ref: ydl.DataRef) -> str:
    """A hash of every record of ``ref``, to compare data across threads and processes."""
    h = hashlib.sha256()
    for i in range(len(ref)):
        r = ref[i]
        h.update(f"{int(r['i'])}|{r['s']}|".encode())
        h.update(np.asarray(r["x"]).tobytes())
    return h.hexdigest()


def expected_digest(n: int, seed: int = 0) -> str:
    h = hashlib.sha256()
    for i in range(n):
        r = record(i, seed)
        h.update(f"{int(r['i'])}|{r['s']}|".encode())
        h.update(r["x"].tobytes())
    return h.hexdigest()


class CountingSource:
    """A zero-argument callable source that counts how often it is read."""

    def __init__(self, n: int, seed: int = 0, delay: float = 0.0) -> None:
        self.n, self.seed, self.delay = n, seed, delay
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            self.calls += 1
        return self._records()

    def _records(self):
        for i in range(self.n):
            if self.delay:
                time.sleep(self.delay)
            yield record(i, self.seed)


def must_not_read():
    raise AssertionError("the source must not be read")


def tree(root: os.PathLike | str) -> list[str]:
    """Every path under ``root`` (relative), to show that nothing on disk changed."""
    out = []
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            out.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(out)


def build(storage, dataset_id="ds", version="v1", n=20, seed=0, **kwargs) -> ydl.DataRef:
    return ydl.cache_dataset(
        CountingSource(n, seed), dataset_id, version, storage, progress=False, **kwargs
    )


def leftovers(storage: ydl.LocalStorage, dataset_id: str = "ds") -> list[str]:
    folder = os.path.join(storage.root, dataset_id)
    return sorted(e for e in os.listdir(folder) if e.startswith(("+staging.", "+trash.")))


# --- names (docs/api.md#storage) ---------------------------------------------------------------

VALID_NAMES = ["a", "mnist-v1.2_x", "Z9", "v1.0", "a.b.c", "x-", "_", "A_b-C.9"]
INVALID_NAMES = [
    "",
    ".",
    "..",
    "a..b",
    "..a",
    "a..",
    "a/b",
    "/a",
    "a/",
    "a b",
    " a",
    "é",
    "a\n",
    "a\x00",
    "a+b",
    "+lock",
    "a\\b",
    "~",
    "a:b",
    None,
    1,
    1.5,
    b"a",
    ["a"],
]


def _op_fetch(storage, dataset_id, version, source):
    storage.fetch(dataset_id, version)


def _op_delete(storage, dataset_id, version, source):
    storage.delete(dataset_id, version)


def _op_verify(storage, dataset_id, version, source):
    storage.verify(dataset_id, version)


def _op_cache_dataset(storage, dataset_id, version, source):
    ydl.cache_dataset(source, dataset_id, version, storage, progress=False)


def _op_cacheable(storage, dataset_id, version, source):
    decorated = storage.cacheable(dataset_id, version)(source)
    decorated()


OPS = {
    "fetch": _op_fetch,
    "delete": _op_delete,
    "verify": _op_verify,
    "cache_dataset": _op_cache_dataset,
    "cacheable": _op_cacheable,
}


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_names_are_accepted(local_storage, name):
    ref = build(local_storage, name, name, n=3)
    assert (ref.dataset_id, ref.version) == (name, name)
    assert local_storage.list() == [(name, name)]
    assert os.path.isdir(os.path.join(local_storage.root, name, name))
    check_all(local_storage.fetch(name, name), 3)
    local_storage.verify(name, name)
    local_storage.delete(name, name)
    assert local_storage.list() == []


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("bad", INVALID_NAMES, ids=repr)
def test_invalid_names_raise_value_error_before_touching_disk(local_storage, op, bad):
    build(local_storage, "ds", "v1", n=2)
    before = tree(local_storage.root)
    source = CountingSource(3)
    for dataset_id, version in [(bad, "v1"), ("ds", bad), ("new", bad), (bad, bad)]:
        with pytest.raises(ValueError):
            OPS[op](local_storage, dataset_id, version, source)
        assert tree(local_storage.root) == before, (op, dataset_id, version)
    assert source.calls == 0
    assert local_storage.list() == [("ds", "v1")]


def test_cacheable_rejects_bad_names_at_decoration_time(local_storage):
    before = tree(local_storage.root)
    with pytest.raises(ValueError):
        local_storage.cacheable("a/b", "v1")
    with pytest.raises(ValueError):
        local_storage.cacheable("ds", "..")
    assert tree(local_storage.root) == before


_ALLOWED = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _is_valid_name(name: str) -> bool:
    return bool(name) and set(name) <= _ALLOWED and name != "." and ".." not in name


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.one_of(
        st.text(alphabet=st.sampled_from(list("ab9._-/ +é\n")), max_size=6),
        st.text(max_size=6),
    )
)
def test_name_rule_matches_the_documented_rule(tmp_path_factory, name):
    storage = ydl.LocalStorage(tmp_path_factory.getbasetemp() / "names-property")
    before = tree(storage.root)
    for dataset_id, version in [(name, "v1"), ("ds", name)]:
        if _is_valid_name(name):
            with pytest.raises(ydl.DatasetNotFound):
                storage.fetch(dataset_id, version)
        else:
            with pytest.raises(ValueError) as info:
                storage.fetch(dataset_id, version)
            assert not isinstance(info.value, ydl.DatasetNotFound)
    assert tree(storage.root) == before


# --- layout and manifest (docs/design.md#cache-format) -------------------------------------------


def test_version_folder_layout_and_manifest(local_storage):
    n = 200
    ref = build(local_storage, "ds", "v1", n=n, chunk_bytes=2000)
    folder = Path(local_storage.root) / "ds" / "v1"
    assert ref.directory == str(folder)
    assert folder.is_dir()
    names = sorted(os.listdir(folder))
    # The manifest, and one folder for the one build (its chunks, their stamps, its pin).
    assert len(names) == 2 and names[1] == "manifest.json", names
    build_folder = names[0]
    assert re.fullmatch(r"b-[0-9a-f]{16}", build_folder), names
    in_build = sorted(os.listdir(folder / build_folder))
    chunk_files = [f"{build_folder}/{f}" for f in in_build if f.endswith(".mdb")]
    assert len(chunk_files) >= 2
    assert all(re.fullmatch(r"b-[0-9a-f]{16}/chunk-\d+\.mdb", f) for f in chunk_files), names
    assert sorted(in_build) == sorted(
        ["+pin", *(os.path.basename(f) for f in chunk_files)]
        + [os.path.basename(f) + ".verified" for f in chunk_files]
    )

    text = (folder / "manifest.json").read_text()
    assert "pickle" not in text.lower()
    body = json.loads(text)
    assert body["format_version"] == 4
    assert re.fullmatch(r"[0-9a-f]{32}", body["build"])
    assert body["dataset_id"] == "ds" and body["version"] == "v1"
    assert body["num_records"] == n
    assert body["library_version"] == ydl.__version__
    assert body["source"]["kind"] == "iterable"
    assert body["source"]["fingerprint"] is None  # an iterable has no cheap identity

    schema = {f["name"]: f for f in body["schema"]}
    assert set(schema) == {"i", "x", "s"}
    for f in body["schema"]:
        assert isinstance(f["codec"], dict) and isinstance(f["codec"]["name"], str), f
        json.dumps(f["codec"])  # plain JSON: a name and parameters
    assert schema["x"]["shape"] == [4]

    chunks = body["chunks"]
    assert sorted(c["file"] for c in chunks) == chunk_files
    assert sum(c["records"] for c in chunks) == n
    for c in chunks:
        data = (folder / c["file"]).read_bytes()
        assert c["records"] > 0
        assert c["bytes"] == len(data)
        assert c["sha256"] == hashlib.sha256(data).hexdigest()
        assert re.fullmatch(r"[0-9a-f]{32}", c["id"])
    assert len({c["id"] for c in chunks}) == len(chunks)


def test_list_is_sorted_and_ignores_bookkeeping_and_folders_without_manifest(local_storage):
    pairs = [("b", "2"), ("a", "9"), ("b", "1"), ("a", "10"), ("a.x", "v")]
    for dataset_id, version in pairs:
        build(local_storage, dataset_id, version, n=2)
    root = Path(local_storage.root)
    manifest = (root / "a" / "9" / "manifest.json").read_text()
    # Bookkeeping entries (a '+' in the name) even when they hold a manifest.
    for junk in [root / "+junk" / "v", root / "a" / "+staging.9.abc", root / "a" / "+trash.7.x"]:
        junk.mkdir(parents=True)
        (junk / "manifest.json").write_text(manifest)
    # A version folder without a manifest, an empty dataset folder, a stray file.
    (root / "a" / "11").mkdir()
    (root / "a" / "11" / "chunk-00000.mdb").write_bytes(b"x" * 100)
    (root / "c").mkdir()
    (root / "c" / "v").mkdir()
    (root / "stray.txt").write_text("hello")
    (root / "a" / "stray-file").write_text("hello")

    assert local_storage.list() == sorted(pairs)
    assert local_storage.list() == [("a", "10"), ("a", "9"), ("a.x", "v"), ("b", "1"), ("b", "2")]


# --- fetch / delete ----------------------------------------------------------------------------


def test_fetch_missing_raises_dataset_not_found(local_storage):
    build(local_storage, "ds", "v1", n=2)
    for dataset_id, version in [("ds", "v2"), ("other", "v1")]:
        with pytest.raises(ydl.DatasetNotFound) as info:
            local_storage.fetch(dataset_id, version)
        assert isinstance(info.value, LookupError)
        assert isinstance(info.value, ydl.YogaError)
        assert version in str(info.value)


def test_delete_then_gone_then_rebuild(local_storage):
    build(local_storage, "ds", "v1", n=5)
    build(local_storage, "ds", "v2", n=3)
    local_storage.delete("ds", "v1")
    assert local_storage.list() == [("ds", "v2")]
    assert not os.path.exists(os.path.join(local_storage.root, "ds", "v1"))
    with pytest.raises(ydl.DatasetNotFound):
        local_storage.fetch("ds", "v1")
    with pytest.raises(ydl.DatasetNotFound):
        local_storage.verify("ds", "v1")
    with pytest.raises(ydl.DatasetNotFound):
        local_storage.delete("ds", "v1")
    assert leftovers(local_storage) == []
    # The other version is untouched.
    check_all(local_storage.fetch("ds", "v2"), 3)
    # Building it again reads the (new) source.
    source = CountingSource(7, seed=1)
    ref = ydl.cache_dataset(source, "ds", "v1", local_storage, progress=False)
    assert source.calls == 1
    check_all_and_close(ref, 7, seed=1)
    check_all(local_storage.fetch("ds", "v1"), 7, seed=1)


def test_delete_missing_raises_dataset_not_found(local_storage):
    with pytest.raises(ydl.DatasetNotFound):
        local_storage.delete("nothing", "v1")
    assert local_storage.list() == []


# --- cache_dataset on an existing version ------------------------------------------------------


def test_existing_version_does_not_read_the_source(local_storage):
    first = build(local_storage, "ds", "v1", n=10)
    again = ydl.cache_dataset(must_not_read, "ds", "v1", local_storage, progress=False)
    counting = CountingSource(99, seed=5)
    third = ydl.cache_dataset(counting, "ds", "v1", local_storage, progress=False)
    assert counting.calls == 0
    want = expected_digest(10)
    for ref in (first, again, third):
        assert digest(ref) == want
        ref.close()


def test_overwrite_rebuilds_with_the_new_data(local_storage):
    build(local_storage, "ds", "v1", n=10)
    old_ref = local_storage.fetch("ds", "v1")
    check_record(old_ref[0], 0)  # opens the old chunk
    source = CountingSource(6, seed=2)
    ref = ydl.cache_dataset(source, "ds", "v1", local_storage, overwrite=True, progress=False)
    assert source.calls == 1
    check_all_and_close(ref, 6, seed=2)
    check_all(local_storage.fetch("ds", "v1"), 6, seed=2)
    assert local_storage.list() == [("ds", "v1")]
    assert leftovers(local_storage) == []
    local_storage.verify("ds", "v1")


def test_overwrite_of_a_missing_version_builds_it(local_storage):
    source = CountingSource(4)
    ref = ydl.cache_dataset(source, "ds", "v1", local_storage, overwrite=True, progress=False)
    assert source.calls == 1
    check_all(ref, 4)


# --- the cacheable decorator -------------------------------------------------------------------


def test_cacheable_runs_only_on_a_miss(local_storage):
    calls = []

    @local_storage.cacheable("ds", "v1")
    def make(n, seed=0):
        """Make the source."""
        calls.append((n, seed))
        return [record(i, seed) for i in range(n)]

    assert make.__name__ == "make" and make.__doc__ == "Make the source."
    refs = [make(8, seed=3) for _ in range(3)]
    assert calls == [(8, 3)]
    for ref in refs:
        assert isinstance(ref, ydl.DataRef)
        check_all_and_close(ref, 8, seed=3)
    assert local_storage.list() == [("ds", "v1")]
    # After a delete it is a miss again.
    local_storage.delete("ds", "v1")
    check_all(make(2, seed=4), 2, seed=4)
    assert calls == [(8, 3), (2, 4)]


def test_cacheable_writes_what_a_serial_cache_dataset_writes(local_storage, tmp_path):
    """Storage.cacheable builds with the cache's own serial writer (write_version), whose
    defaults are cache_dataset's: the two versions hold the same chunks."""
    make = local_storage.cacheable("ds", "v1")(lambda: [record(i) for i in range(300)])
    cached = make()
    other = ydl.LocalStorage(tmp_path / "other")
    built = ydl.cache_dataset([record(i) for i in range(300)], "ds", "v1", other, progress=False)
    assert cached.manifest.schema == built.manifest.schema
    assert [c.records for c in cached.manifest.chunks] == [c.records for c in built.manifest.chunks]
    assert cached.manifest.source_kind == built.manifest.source_kind == "iterable"
    check_all_and_close(cached, 300)


# --- chunk roll-over ---------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "chunk_bytes"), [(300, 1500), (20, 1), (5000, 60_000)])
def test_records_read_back_across_chunk_boundaries(local_storage, n, chunk_bytes):
    ref = build(local_storage, "ds", "v1", n=n, chunk_bytes=chunk_bytes)
    chunks = ref.manifest.chunks
    assert len(chunks) >= 3
    if chunk_bytes == 1:
        assert [c.records for c in chunks] == [1] * n
    assert all(c.records > 0 for c in chunks)
    assert sum(c.records for c in chunks) == n
    ref = local_storage.fetch("ds", "v1")  # a fresh reader, not the builder's
    check_all(ref, n)
    for i in (-1, -n, -(n // 2)):
        check_record(ref[i], i % n)
    with pytest.raises(IndexError):
        ref[n]
    with pytest.raises(IndexError):
        ref[-n - 1]

    starts = np.cumsum([0] + [c.records for c in chunks])[1:-1]
    around = np.unique(np.concatenate([starts - 1, starts, starts + 1]).clip(0, n - 1))
    rng = np.random.default_rng(0)
    for indices in (rng.permutation(n), rng.permutation(around), np.array([n - 1, 0, n - 1])):
        batch = ref.get_batch(indices)
        np.testing.assert_array_equal(batch["i"], indices)
        np.testing.assert_array_equal(batch["x"], np.stack([record(int(i))["x"] for i in indices]))
        assert list(batch["s"]) == [record(int(i))["s"] for i in indices]
    only = ref.get_batch(rng.permutation(around), fields=["s"])
    assert set(only) == {"s"}
    negative = ref.get_batch(-1 - around)
    np.testing.assert_array_equal(negative["i"], n - 1 - around)


# --- verify and corruption ---------------------------------------------------------------------


def _two_versions(storage, n=300):
    build(storage, "ds", "v1", n=n, chunk_bytes=1500)
    build(storage, "ds", "other", n=n, chunk_bytes=1500)
    folder = Path(storage.root) / "ds" / "v1"
    chunks = storage.fetch("ds", "v1").manifest.chunks
    assert len(chunks) >= 3
    return folder, chunks


def _other_is_fine(storage, n=300):
    storage.verify("ds", "other")
    check_all(storage.fetch("ds", "other"), n)


def test_verify_passes_on_a_fresh_build(local_storage):
    _two_versions(local_storage)
    local_storage.verify("ds", "v1")
    local_storage.fetch("ds", "v1").verify()


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_verify_catches_one_flipped_byte(local_storage, where):
    folder, chunks = _two_versions(local_storage)
    target = folder / chunks[1].file
    size = target.stat().st_size
    offset = {"first": 0, "middle": size // 2, "last": size - 1}[where]
    with open(target, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
    assert target.stat().st_size == size
    with pytest.raises(ydl.CacheCorrupted) as info:
        local_storage.verify("ds", "v1")
    assert chunks[1].file in str(info.value)
    with pytest.raises(ydl.CacheCorrupted):
        local_storage.fetch("ds", "v1").verify()
    _other_is_fine(local_storage)


@pytest.mark.parametrize("damage", ["truncate", "extend", "delete"])
def test_damaged_chunk_raises_cache_corrupted(local_storage, damage):
    folder, chunks = _two_versions(local_storage)
    target = folder / chunks[1].file
    if damage == "truncate":
        os.truncate(target, target.stat().st_size // 2)
    elif damage == "extend":
        with open(target, "ab") as f:
            f.write(b"\0" * 4096)
    else:
        target.unlink()
    with pytest.raises(ydl.CacheCorrupted) as info:
        local_storage.verify("ds", "v1")
    assert chunks[1].file in str(info.value)
    in_chunk = chunks[0].records  # the first record of chunk 1
    with pytest.raises(ydl.CacheCorrupted):
        ref = local_storage.fetch("ds", "v1")
        ref[in_chunk]
    with pytest.raises(ydl.CacheCorrupted):
        local_storage.fetch("ds", "v1").get_batch([0, in_chunk])
    # Chunk 0 is fine and still reads.
    check_record(local_storage.fetch("ds", "v1")[0], 0)
    _other_is_fine(local_storage)


def test_manifest_record_count_not_matching_the_chunk_raises(local_storage):
    folder, chunks = _two_versions(local_storage)
    path = folder / "manifest.json"
    body = json.loads(path.read_text())
    body["chunks"][1]["records"] += 1
    body["chunks"][2]["records"] -= 1  # num_records still adds up
    path.write_text(json.dumps(body))
    ref = local_storage.fetch("ds", "v1")
    with pytest.raises(ydl.CacheCorrupted):
        ref[chunks[0].records]
    _other_is_fine(local_storage)


def _garble_truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garble_num_records(path: Path) -> None:
    body = json.loads(path.read_text())
    body["num_records"] += 1
    path.write_text(json.dumps(body))


def _garble_format(path: Path) -> None:
    body = json.loads(path.read_text())
    body["format"] = "something-else"
    path.write_text(json.dumps(body))


def _garble_newer_format(path: Path) -> None:
    body = json.loads(path.read_text())
    body["format_version"] = 999
    path.write_text(json.dumps(body))


def _garble_missing_key(path: Path) -> None:
    body = json.loads(path.read_text())
    del body["chunks"]
    path.write_text(json.dumps(body))


def _garble_non_utf8(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[10:14] = b"\xff\xfe\xfd\xfc"
    path.write_bytes(bytes(data))


GARBLINGS = [
    pytest.param(_garble_truncated, id="truncated"),
    pytest.param(lambda p: p.write_text(""), id="empty"),
    pytest.param(lambda p: p.write_text("{not json"), id="not-json"),
    pytest.param(_garble_num_records, id="num-records"),
    pytest.param(_garble_format, id="wrong-format-name"),
    pytest.param(_garble_newer_format, id="newer-format"),
    pytest.param(_garble_missing_key, id="missing-key"),
    pytest.param(
        lambda p: p.write_text("[]"),
        id="json-array",
    ),
    pytest.param(
        _garble_non_utf8,
        id="non-utf8",
    ),
]


@pytest.mark.parametrize("garble", GARBLINGS)
def test_garbled_manifest_raises_cache_corrupted_on_fetch(local_storage, garble):
    folder, _ = _two_versions(local_storage)
    garble(folder / "manifest.json")
    with pytest.raises(ydl.CacheCorrupted) as info:
        local_storage.fetch("ds", "v1")
    assert "manifest.json" in str(info.value)
    with pytest.raises(ydl.CacheCorrupted):
        local_storage.verify("ds", "v1")
    _other_is_fine(local_storage)


# --- concurrency -------------------------------------------------------------------------------


def test_threads_build_a_version_once(local_storage):
    n = 40
    source = CountingSource(n, seed=1, delay=0.003)
    barrier = threading.Barrier(4)
    results: list = [None] * 4

    def worker(k: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[k] = ydl.cache_dataset(source, "ds", "v1", local_storage, progress=False)
        except BaseException as exc:  # pragma: no cover - reported below
            results[k] = exc

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a builder thread is stuck"
    assert all(isinstance(r, ydl.DataRef) for r in results), results
    assert source.calls == 1
    want = expected_digest(n, seed=1)
    for ref in results:
        assert digest(ref) == want
        ref.close()
    assert local_storage.list() == [("ds", "v1")]
    assert leftovers(local_storage) == []


_PROC_N = 60


def _counting_source(counter: str, seed: int):
    def make():
        fd = os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"build {os.getpid()}\n".encode())
        finally:
            os.close(fd)
        for i in range(_PROC_N):
            time.sleep(0.003)
            yield record(i, seed)

    return make


def _proc_build(root: str, counter: str, barrier, out: str) -> None:
    barrier.wait(timeout=30)
    ref = ydl.cache_dataset(
        _counting_source(counter, 7), "ds", "v1", ydl.LocalStorage(root), progress=False
    )
    Path(out).write_text(digest(ref))


def test_processes_build_a_version_once(tmp_path):
    root = str(tmp_path / "store")
    counter = str(tmp_path / "builds.txt")
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(3)
    outs = [str(tmp_path / f"out{k}") for k in range(3)]
    procs = [ctx.Process(target=_proc_build, args=(root, counter, barrier, o)) for o in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0, 0]
    lines = Path(counter).read_text().splitlines()
    assert len(lines) == 1, lines
    want = expected_digest(_PROC_N, seed=7)
    assert [Path(o).read_text() for o in outs] == [want] * 3
    storage = ydl.LocalStorage(root)
    assert storage.list() == [("ds", "v1")]
    assert leftovers(storage) == []


def test_building_a_version_does_not_disturb_a_build_of_a_dotted_sibling(local_storage):
    started, go = threading.Event(), threading.Event()

    def slow():
        for i in range(50):
            if i == 1:
                started.set()
                go.wait(20)
            yield record(i)

    result: list = []

    def sibling() -> None:
        try:
            result.append(ydl.cache_dataset(slow, "ds", "v1.2", local_storage, progress=False))
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=sibling, daemon=True)
    thread.start()
    try:
        assert started.wait(20)
        check_all(build(local_storage, "ds", "v1", n=3), 3)
    finally:
        go.set()
        thread.join(timeout=30)
    assert len(result) == 1
    assert isinstance(result[0], ydl.DataRef), result[0]
    check_all(result[0], 50)
    assert local_storage.list() == [("ds", "v1"), ("ds", "v1.2")]


# --- leftovers of dead builders ----------------------------------------------------------------


def test_stale_staging_and_trash_are_removed_by_the_next_build(local_storage):
    parent = Path(local_storage.root) / "ds"
    junk = [parent / "+staging.v1.deadbeef0001", parent / "+trash.v1.deadbeef0002"]
    for folder in junk:
        (folder / "sub").mkdir(parents=True)
        (folder / "chunk-00000.mdb").write_bytes(os.urandom(1000))
        (folder / "sub" / "junk").write_text("junk")
    (junk[1] / "manifest.json").write_text("{}")
    assert local_storage.list() == []
    ref = build(local_storage, "ds", "v1", n=12)
    check_all(ref, 12)
    for folder in junk:
        assert not folder.exists()
    assert leftovers(local_storage) == []
    assert local_storage.list() == [("ds", "v1")]
    local_storage.verify("ds", "v1")


# --- source fingerprints -----------------------------------------------------------------------


def _write_parquet(path: Path, n: int, offset: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "i": pa.array(np.arange(n, dtype=np.int64) + offset),
            "f": pa.array(np.arange(n, dtype=np.float64) * 0.5),
            "s": pa.array([f"row-{offset + k}" for k in range(n)]),
        }
    )
    pq.write_table(table, path)


def test_changed_parquet_source_warns_and_returns_the_cached_data(local_storage, tmp_path):
    path = tmp_path / "data.parquet"
    _write_parquet(path, 50, offset=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ref = ydl.cache_dataset(str(path), "pq", "v1", local_storage, progress=False)
        # Unchanged source: no warning.
        same = ydl.cache_dataset(str(path), "pq", "v1", local_storage, progress=False)
    old = ref.manifest.source_fingerprint
    assert isinstance(old, str) and old
    assert ref.manifest.source_kind == "parquet"
    assert same.manifest.source_fingerprint == old
    assert len(same) == 50

    stat = path.stat()
    _write_parquet(path, 60, offset=1000)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    new = ydl.sources.ParquetSource(str(path)).fingerprint()
    assert new != old
    with pytest.warns(ydl.SourceChangedWarning) as record_:
        again = ydl.cache_dataset(str(path), "pq", "v1", local_storage, progress=False)
    messages = [str(w.message) for w in record_ if issubclass(w.category, ydl.SourceChangedWarning)]
    assert len(messages) == 1
    assert old in messages[0] and new in messages[0]
    assert len(again) == 50
    assert int(again[49]["i"]) == 49 and again[49]["s"] == "row-49"

    # overwrite=True rebuilds from the new file, without a warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rebuilt = ydl.cache_dataset(
            str(path), "pq", "v1", local_storage, overwrite=True, progress=False
        )
        after = ydl.cache_dataset(str(path), "pq", "v1", local_storage, progress=False)
    assert len(rebuilt) == 60 and rebuilt[0]["s"] == "row-1000"
    assert rebuilt.manifest.source_fingerprint == new
    assert len(after) == 60


# --- default_storage / open_storage ------------------------------------------------------------


def test_default_storage_honours_yogadl_plus_home(tmp_path, monkeypatch):
    home = tmp_path / "home-store"
    monkeypatch.setenv("YOGADL_PLUS_HOME", str(home))
    storage = ydl.default_storage()
    assert isinstance(storage, ydl.LocalStorage)
    assert storage.root == str(home)
    ref = ydl.cache_dataset(CountingSource(3), "ds", "v1", progress=False)  # storage=None
    check_all(ref, 3)
    assert (home / "ds" / "v1" / "manifest.json").is_file()
    assert ydl.LocalStorage(home).list() == [("ds", "v1")]


def test_default_storage_without_env_is_under_the_home_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("YOGADL_PLUS_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    storage = ydl.default_storage()
    assert storage.root == str(tmp_path / ".cache" / "yogadl_plus")


def test_open_storage_paths_and_file_urls(tmp_path, monkeypatch):
    target = tmp_path / "store"
    build(ydl.LocalStorage(target), "ds", "v1", n=3)
    monkeypatch.chdir(tmp_path)
    for url in (str(target), f"file://{target}", target, "store", "./store"):
        storage = ydl.open_storage(url)
        assert isinstance(storage, ydl.LocalStorage), url
        assert storage.root == str(target), url
        assert storage.list() == [("ds", "v1")]
        check_all(storage.fetch("ds", "v1"), 3)


@pytest.mark.parametrize("url", ["ftp://host/path", "http://example.com/x", "bogus://x"])
def test_open_storage_unknown_scheme_raises_value_error(url):
    with pytest.raises(ValueError):
        ydl.open_storage(url)


def test_open_storage_decodes_percent_escapes_in_file_urls(tmp_path):
    target = tmp_path / "with space"
    storage = ydl.open_storage(target.as_uri())
    assert storage.root == str(target)


# --- DataRef pickling --------------------------------------------------------------------------


def _child_digest(ref: ydl.DataRef, out: str) -> None:
    Path(out).write_text(f"{ref.dataset_id} {ref.version} {len(ref)} {digest(ref)}")


def test_dataref_pickles(local_storage):
    ref = build(local_storage, "ds", "v1", n=50, seed=3, chunk_bytes=1000)
    check_all_and_close(ref, 50, seed=3)  # pickled after it was read
    copy = pickle.loads(pickle.dumps(ref))
    assert isinstance(copy, ydl.DataRef)
    assert (copy.dataset_id, copy.version, len(copy)) == ("ds", "v1", 50)
    assert list(copy.schema.names) == ["i", "x", "s"]
    assert copy.manifest.chunks == ref.manifest.chunks
    check_all_and_close(copy, 50, seed=3)
    assert digest(ref) == expected_digest(50, seed=3)


def _second_ref_by_fetch(storage, ref):
    return storage.fetch("ds", "v1")


def _second_ref_by_pickle(storage, ref):
    return pickle.loads(pickle.dumps(ref))


@pytest.mark.parametrize("second", [_second_ref_by_fetch, _second_ref_by_pickle])
def test_two_datarefs_of_one_version_in_one_process(local_storage, second):
    ref = build(local_storage, "ds", "v1", n=10)
    check_record(ref[3], 3)  # the first DataRef has its chunk open
    other = second(local_storage, ref)
    check_record(other[3], 3)
    check_all(other, 10)
    check_all(ref, 10)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataref_in_a_child_process(local_storage, tmp_path, method):
    ref = build(local_storage, "ds", "v1", n=50, seed=4, chunk_bytes=1000)
    assert len(ref.manifest.chunks) >= 2
    # The parent reads first, so it holds open LMDB handles when the child starts.
    check_all(ref, 50, seed=4)
    out = tmp_path / "child.txt"
    proc = multiprocessing.get_context(method).Process(target=_child_digest, args=(ref, str(out)))
    proc.start()
    proc.join(timeout=60)
    if proc.is_alive():
        proc.kill()
    assert proc.exitcode == 0
    assert out.read_text() == f"ds v1 50 {expected_digest(50, seed=4)}"
    # The parent's handles still work after the child is gone.
    check_all(ref, 50, seed=4)


def test_a_chunk_without_its_column_arrays_is_corrupted(local_storage):
    import lmdb

    from yogadl_plus.cache.writer import column_key

    ref = ydl.cache_dataset(
        [{"i": i, "s": str(i)} for i in range(10)], "cols", "v1", local_storage, progress=False
    )
    info = ref.manifest.chunks[0]
    assert info.columns == ("i",), "small scalar fields are kept as columns too"
    ref.close()
    path = os.path.join(local_storage.path("cols", "v1"), info.file)
    with lmdb.open(path, subdir=False, lock=False) as env, env.begin(write=True) as txn:
        txn.delete(column_key("i"))
    with pytest.raises(ydl.CacheCorrupted, match=r"chunk-00000\.mdb"):
        local_storage.fetch("cols", "v1").get_batch([1], fields=["i"])


def test_a_lock_removed_under_a_waiter_is_never_held_twice(tmp_path):
    """rm deletes a version's lock file while holding it: a process that was waiting on that
    file must lock the file now at the path, not the deleted one, or it would build beside a
    newcomer that created the new file."""
    import threading
    import time

    from yogadl_plus.storage.versionlock import remove_lock, version_lock

    path = str(tmp_path / "ds" / "+lock.v1")
    (tmp_path / "ds").mkdir()
    holders: list[str] = []
    most = [0]
    guard = threading.Lock()

    def hold(name: str, seconds: float, remove: bool = False) -> None:
        with version_lock(path):
            with guard:
                holders.append(name)
                most[0] = max(most[0], len(holders))
            time.sleep(seconds)
            if remove:
                remove_lock(path)
            with guard:
                holders.remove(name)

    for _ in range(20):
        first = threading.Thread(target=hold, args=("rm", 0.05, True))
        first.start()
        time.sleep(0.01)
        waiters = [threading.Thread(target=hold, args=(f"w{k}", 0.01)) for k in range(3)]
        for thread in waiters:
            thread.start()
        first.join()
        newcomer = threading.Thread(target=hold, args=("new", 0.02))
        newcomer.start()
        for thread in [*waiters, newcomer]:
            thread.join()
    assert most[0] == 1
    with version_lock(path, wait=False) as held:
        assert held
        with version_lock(path, wait=False) as again:
            assert not again  # another descriptor: busy, at once
