"""Integrity on every read path: a chunk changed after publishing (a byte, a page, a column value, a
truncation, a file swapped in from another version) is found before a record of it is served, by
``ref[i]``, ``get_batch``, record and batched streams, predicates and ``yogadl-plus head``, and
LMDB's own errors become CacheCorrupted without poisoning the thread's reads of good records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.damage import chunk_path, flip_byte

import yogadl_plus as ydl
from yogadl_plus.cache import reader
from yogadl_plus.cli import main

STAMP_SUFFIX = ".verified"  # cache/integrity.py; spelled out so this file imports on old code


def file_state(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


N = 400


def records(n: int = N, seed: int = 0):
    for i in range(n):
        yield {
            "id": np.int64(i),
            "x": np.full(16, i + 1000 * seed, dtype=np.float32),
            "s": f"rec-{seed}-{i:06d}",
        }


def build(storage: ydl.LocalStorage, version: str = "v1", seed: int = 0, **kwargs) -> ydl.DataRef:
    return ydl.cache_dataset(
        lambda: records(seed=seed), "ds", version, storage, progress=False, **kwargs
    )


def damage_value(path: Path, text: str) -> None:
    """Flip a byte inside every copy of ``text`` in the file (LMDB may keep an old copy of a
    page among its free pages: which one is live is LMDB's business)."""
    data = path.read_bytes()
    at = data.find(text.encode())
    assert at >= 0
    while at >= 0:
        flip_byte(path, at + len(text) - 1)
        at = data.find(text.encode(), at + 1)


READERS = {
    "getitem": lambda ref: ref[7],
    "get_batch": lambda ref: ref.get_batch([3, 7, 9]),
    "records": lambda ref: list(ref.stream()),
    "shuffled_records": lambda ref: list(ref.stream(shuffle=True, shuffle_seed=1)),
    "batches": lambda ref: list(ref.stream(batch_size=32)),
    "columns_only": lambda ref: list(ref.stream(batch_size=32, fields=["id"])),
    "predicate": lambda ref: list(ref.stream(predicate=ydl.predicates.in_set("id", [7]))),
    "workers": lambda ref: list(ref.stream(batch_size=16, num_workers=2)),
}


@pytest.fixture
def storage(tmp_path: Path) -> ydl.LocalStorage:
    return ydl.LocalStorage(tmp_path / "store")


@pytest.fixture
def strict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Open chunks re-checked before every read (the default re-checks at most every 10 ms)."""
    monkeypatch.setattr(reader, "RECHECK_SECONDS", 0.0, raising=False)
    monkeypatch.setattr(reader, "_RECHECK_SHARE", 0, raising=False)


# --- a byte flipped in a record's value ---------------------------------------------------------


@pytest.mark.parametrize("read", READERS)
def test_a_flipped_byte_in_a_value_is_never_served(storage, read):
    path = chunk_path(build(storage))
    damage_value(path, "rec-0-000007")
    # Found when the version is opened (its first chunk is checked then), or at the first read.
    with pytest.raises(ydl.CacheCorrupted, match=r"chunk .*chunk-00000\.mdb of ds:v1 .*sha256"):
        READERS[read](storage.fetch("ds", "v1"))
    # Every later read fails the same way: nothing of the chunk is served.
    with pytest.raises(ydl.CacheCorrupted):
        READERS[read](storage.fetch("ds", "v1"))


@pytest.mark.parametrize("read", ["getitem", "get_batch", "records", "batches", "columns_only"])
def test_a_byte_flipped_while_a_reader_has_the_chunk_open(storage, strict, read):
    ref = build(storage)
    before = ref[7]
    assert before["s"] == "rec-0-000007"
    path = chunk_path(ref)
    damage_value(path, "rec-0-000007")
    with pytest.raises(ydl.CacheCorrupted, match="sha256"):
        READERS[read](ref)


def test_by_default_an_open_chunk_is_rechecked_within_ten_milliseconds(storage):
    ref = build(storage)
    assert ref[7]["s"] == "rec-0-000007"
    path = chunk_path(ref)
    damage_value(path, "rec-0-000007")
    time.sleep(2 * getattr(reader, "RECHECK_SECONDS", 0.01))
    with pytest.raises(ydl.CacheCorrupted, match="sha256"):
        ref[7]


def test_a_touched_chunk_is_hashed_again_and_read_on(storage, strict):
    ref = build(storage)
    path = chunk_path(ref)
    ref[0]
    os.utime(path, ns=(1, 1))  # mtime changed, bytes unchanged: checked again, then trusted
    assert ref[7]["s"] == "rec-0-000007"
    stamp = json.loads(Path(str(path) + STAMP_SUFFIX).read_text())
    assert stamp["states"][-1] == file_state(str(path))


def test_a_chunk_replaced_while_open_is_refused(storage, strict):
    ref = build(storage)
    ref[0]
    path = chunk_path(ref)
    shutil.copyfile(path, str(path) + ".copy")
    os.replace(str(path) + ".copy", path)  # the same bytes, another file
    with pytest.raises(ydl.CacheCorrupted, match="replaced by another file while it was open"):
        ref.get_batch([1, 2])
    # Opened again, the file is checked (it holds the right bytes) and read.
    again = storage.fetch("ds", "v1")
    assert again[7]["s"] == "rec-0-000007"


def test_head_exits_1_on_a_damaged_chunk(storage, capsys):
    build(storage)
    path = chunk_path(storage.fetch("ds", "v1"))
    damage_value(path, "rec-0-000002")
    assert main(["head", "ds", "v1", "--storage", storage.root]) == 1
    err = capsys.readouterr().err
    assert "error: chunk" in err and "sha256" in err and "rec-0" not in err


# --- whole chunks: swapped, truncated, zeroed pages ----------------------------------------------


@pytest.mark.parametrize("how", ["copy_over", "rename_over", "with_its_stamp"])
def test_a_chunk_of_another_version_of_the_same_size_is_refused(storage, how):
    build(storage, "v1", seed=0)
    build(storage, "v2", seed=1)
    mine, theirs = (chunk_path(storage.fetch("ds", v)) for v in ("v1", "v2"))
    assert mine.stat().st_size == theirs.stat().st_size
    if how == "copy_over":
        shutil.copyfile(theirs, mine)
    elif how == "rename_over":
        shutil.copyfile(theirs, str(mine) + ".new")
        os.replace(str(mine) + ".new", mine)
    else:  # the chunk and its stamp: the stamp names another file's state
        shutil.copyfile(theirs, mine)
        shutil.copyfile(str(theirs) + STAMP_SUFFIX, str(mine) + STAMP_SUFFIX)
    for read in ("getitem", "get_batch", "batches"):
        with pytest.raises(ydl.CacheCorrupted, match=r"chunk-00000\.mdb of ds:v1"):
            READERS[read](storage.fetch("ds", "v1"))


def test_a_chunk_with_a_forged_stamp_is_still_refused_by_its_identity(storage):
    """Even where a stamp vouches for a foreign file (copied with its stamp by a tool that keeps
    inodes and times: a stand-in for any check that trusts the file), the chunk's own identity
    (id, counts, schema digest) is checked at open."""
    build(storage, "v1", seed=0)
    build(storage, "v2", seed=1)
    ref1, ref2 = storage.fetch("ds", "v1"), storage.fetch("ds", "v2")
    mine, theirs = chunk_path(ref1), chunk_path(ref2)
    shutil.copyfile(theirs, mine)
    state = file_state(str(mine))
    sha = ref1.manifest.chunks[0].sha256
    Path(str(mine) + STAMP_SUFFIX).write_text(json.dumps({"sha256": sha, "states": [state]}))
    with pytest.raises(ydl.CacheCorrupted, match="is not the chunk the manifest names"):
        storage.fetch("ds", "v1")[0]


# --- a chunk entry copied from another build of the dataset ---------------------------------


def with_entry_of(mine: ydl.DataRef, theirs: ydl.DataRef, number: int) -> dict:
    """``mine``'s manifest with chunk ``number``'s entry (file, sha256, id, counts) copied from
    ``theirs``, and the chunk file it names put in ``mine``'s folder if it is not there: a
    manifest merged by hand from two builds."""
    entry = json.loads(theirs.manifest.to_json())["chunks"][number]
    placed = Path(mine.directory, entry["file"])
    if not placed.exists():  # (another version's build folder)
        placed.parent.mkdir()
        (placed.parent / "+pin").touch()
        shutil.copyfile(Path(theirs.directory, entry["file"]), placed)
    body = json.loads(mine.manifest.to_json())
    body["chunks"][number] = entry
    assert body["num_records"] == sum(c["records"] for c in body["chunks"])
    return body


@pytest.mark.parametrize("other", ["overwritten", "another_version"])
def test_a_chunk_entry_copied_from_another_build_is_refused(storage, other):
    """Before: the copied entry and its file passed every check (the chunk says the id, name
    and counts its entry gives), and the other build's records were served as this one's."""
    mine = build(storage, "v1", seed=0, chunk_bytes=8000)  # (held: its build stays on disk)
    theirs = build(
        storage, "v1" if other == "overwritten" else "v2", seed=1, chunk_bytes=8000, overwrite=True
    )
    assert len(mine.manifest.chunks) >= 3
    manifest = Path(mine.directory, "manifest.json")
    manifest.write_text(json.dumps(with_entry_of(mine, theirs, 1)))
    with pytest.raises(ydl.CacheCorrupted) as caught:
        storage.fetch("ds", "v1")  # refused before any record is read
    message = str(caught.value)
    assert str(manifest) in message and "chunks[1]" in message, message
    assert theirs.manifest.chunks[1].file in message and "another build" in message, message


def test_a_manifest_turned_back_to_format_2_takes_no_chunk_of_another_build(storage):
    """The same copy in a manifest whose format was set back to 2, which names no build: the
    chunks of format 3 say which build they are of, so not one of them is read."""
    mine = build(storage, "v1", seed=0, chunk_bytes=8000)
    theirs = build(storage, "v1", seed=1, chunk_bytes=8000, overwrite=True)
    body = with_entry_of(mine, theirs, 1)
    body["format_version"] = 2
    del body["build"]
    for entry in body["chunks"]:
        del entry["tokens"]  # (format 4's)
    Path(mine.directory, "manifest.json").write_text(json.dumps(body))
    for read in ("getitem", "get_batch", "batches"):
        with pytest.raises(ydl.CacheCorrupted, match="is not the chunk the manifest names"):
            READERS[read](storage.fetch("ds", "v1"))


def test_a_flipped_value_in_a_whole_chunk_column_is_refused(storage):
    ref = build(storage)
    assert "id" in ref.manifest.chunks[0].columns
    path = chunk_path(ref)
    data = path.read_bytes()
    column = np.arange(N, dtype=np.int64).tobytes()
    at = data.find(column)
    assert at > 0
    with open(path, "r+b") as f:  # the column says record 7 has id 71; the record says 7
        f.seek(at + 7 * 8)
        f.write(np.int64(71).tobytes())
    time.sleep(2 * getattr(reader, "RECHECK_SECONDS", 0.01))
    with pytest.raises(ydl.CacheCorrupted):
        ref.get_batch([7], fields=["id"])
    with pytest.raises(ydl.CacheCorrupted):
        list(storage.fetch("ds", "v1").stream(predicate=ydl.predicates.in_set("id", [71])))


@pytest.mark.parametrize("keep", [0, 4096, -1])
def test_a_truncated_chunk_is_refused(storage, strict, keep):
    ref = build(storage)
    path = chunk_path(ref)
    size = path.stat().st_size
    os.truncate(path, size - 1 if keep == -1 else keep)
    with pytest.raises(ydl.CacheCorrupted, match=r"was cut to \d+ bytes"):
        ref.get_batch([0, 5])  # opened before the cut
    with pytest.raises(ydl.CacheCorrupted, match="bytes, the manifest says"):
        storage.fetch("ds", "v1")[0]


CHILD = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import yogadl_plus as ydl
    root, page, forge = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    storage = ydl.LocalStorage(root)
    manifest = json.load(open(os.path.join(root, "ds", "v1", "manifest.json")))
    path = os.path.join(root, "ds", "v1", manifest["chunks"][0]["file"])
    with open(path, "r+b") as f:
        f.seek(page * 4096)
        f.write(bytes(4096))
    if forge:
        # Bit rot that leaves the file's metadata as it was: the stamp still vouches for it.
        st = os.stat(path)
        state = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        sha = manifest["chunks"][0]["sha256"]
        with open(path + ".verified", "w") as f:
            json.dump({"sha256": sha, "states": [state]}, f)
    outcomes = []
    try:
        ref = storage.fetch("ds", "v1")
    except ydl.CacheCorrupted as exc:
        print(json.dumps(["CacheCorrupted: " + str(exc)[:300]]))
        sys.exit(0)
    for attempt in range(3):
        # With a forged stamp, shuffled reads only: they look records up one by one, while LMDB
        # may abort on a cursor walking into a damaged page (see docs/guarantees.md).
        shuffled = lambda: list(ref.stream(batch_size=64, shuffle=True, shuffle_seed=3))
        sequential = lambda: list(ref.stream(batch_size=64))
        for read in (shuffled if forge else sequential, lambda: ref.get_batch([0, 1])):
            try:
                read()
                outcomes.append("ok")
            except ydl.CacheCorrupted as exc:
                outcomes.append("CacheCorrupted: " + str(exc)[:300])
            except Exception as exc:
                outcomes.append(type(exc).__module__ + "." + type(exc).__name__ + ": " + str(exc))
    print(json.dumps(outcomes))
    """
)


def run_child(storage: ydl.LocalStorage, page: int, forge: bool) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, storage.root, str(page), "1" if forge else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=storage.root,  # not the repository: the child imports the installed yogadl_plus
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def big_records():
    for i in range(3000):
        yield {"id": np.int64(i), "x": np.full(64, i, dtype=np.float32)}


@pytest.mark.parametrize("page", [1, 2, 5, 40])
def test_a_zeroed_page_is_refused_without_killing_the_process(storage, page):
    ydl.cache_dataset(big_records, "ds", "v1", storage, progress=False)
    outcomes = run_child(storage, page, forge=False)
    assert all(o.startswith("CacheCorrupted") for o in outcomes), outcomes


@pytest.mark.parametrize("page", [5, 40])
def test_lmdb_errors_are_cache_corrupted_and_good_records_read_on(storage, page):
    """Damage that no check before LMDB can see (a forged stamp stands for bit rot): what LMDB
    reports is a CacheCorrupted naming the chunk, and the thread's transaction is renewed."""
    ydl.cache_dataset(big_records, "ds", "v1", storage, progress=False)
    outcomes = run_child(storage, page, forge=True)
    assert not [o for o in outcomes if not o.startswith(("ok", "CacheCorrupted"))], outcomes
    lmdb_errors = [o for o in outcomes if "LMDB could not read" in o]
    if lmdb_errors:
        # Records 0 and 1 are on a page LMDB can still reach: read after each failure.
        assert outcomes[1::2] == ["ok"] * 3, outcomes


# --- a pulled copy, damaged after the pull --------------------------------------------------------


@pytest.mark.servers
def test_a_pulled_copy_damaged_after_the_pull_is_refused_and_verify_repairs_it(
    s3_server, s3_bucket, tmp_path
):
    bucket = s3_server.storage(s3_bucket, "integrity", tmp_path / "cache")
    ydl.cache_dataset(lambda: records(), "ds", "v1", bucket, progress=False)
    reader_side = s3_server.storage(s3_bucket, "integrity", tmp_path / "other-machine")
    pulled = reader_side.fetch("ds", "v1")
    assert pulled[7]["s"] == "rec-0-000007"
    pulled.close()
    del pulled
    path = next((tmp_path / "other-machine").rglob("chunk-00000.mdb"))
    damage_value(path, "rec-0-000007")
    with pytest.raises(ydl.CacheCorrupted, match="sha256"):
        reader_side.fetch("ds", "v1").get_batch([7])  # checked as it is opened
    reader_side.verify("ds", "v1")  # pulls the damaged chunk again
    assert reader_side.fetch("ds", "v1")[7]["s"] == "rec-0-000007"


# --- what it costs: chunks are hashed once, not per open ------------------------------------------


def test_a_chunk_is_hashed_once_then_trusted_by_its_stamp(storage, monkeypatch):
    integrity = pytest.importorskip("yogadl_plus.cache.integrity")
    build(storage)
    hashed: list[str] = []
    real = integrity.file_sha256
    monkeypatch.setattr(integrity, "file_sha256", lambda path: hashed.append(path) or real(path))

    def read_as_a_new_process() -> None:
        integrity._VERIFIED.clear()  # what this process checked itself: a new one knows nothing
        ref = storage.fetch("ds", "v1")
        assert ref[7]["s"] == "rec-0-000007"
        ref.close()

    for _ in range(3):
        read_as_a_new_process()
    assert hashed == []  # the builder stamped it
    os.remove(str(chunk_path(storage.fetch("ds", "v1"))) + STAMP_SUFFIX)
    for _ in range(3):
        read_as_a_new_process()
    assert len(hashed) == 1  # the first reader hashed it, and stamped it for the others


# --- no false alarms: what changes only a file's metadata, or the process's resources ------------


def test_metadata_changes_while_reading_are_not_damage(storage, strict):
    """chmod, hard links (copy_version links chunks) and touching change a chunk's ctime, not its
    bytes: readers hash it again and read on, never a CacheCorrupted."""
    import threading

    ref = build(storage, chunk_bytes=4000)
    paths = [Path(ref.directory, c.file) for c in ref.manifest.chunks]
    stop = threading.Event()

    def fiddle() -> None:
        n = 0
        while not stop.is_set():
            for path in paths:
                os.chmod(path, 0o640 if n % 2 else 0o644)
                link = str(path) + ".link"
                os.link(path, link)
                os.remove(link)
            n += 1

    fiddler = threading.Thread(target=fiddle, daemon=True)
    fiddler.start()
    try:
        for _ in range(30):
            fresh = storage.fetch("ds", "v1")
            batch = fresh.get_batch(np.arange(N))
            assert batch["s"] == [f"rec-0-{i:06d}" for i in range(N)]
            fresh.close()
            assert ref[7]["s"] == "rec-0-000007"
    finally:
        stop.set()
        fiddler.join()


CHILD_LIMITED = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    import yogadl_plus as ydl

    ref = ydl.LocalStorage(sys.argv[1]).fetch("ds", "v1")
    used = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (used + (100 << 20),) * 2)  # as `ulimit -v` does
    try:
        ref.get_batch(np.arange(len(ref)))
        print("read")
    except ydl.YogaError as exc:
        print(type(exc).__name__ + ": " + str(exc))
    """
)


def test_running_out_of_address_space_is_not_damage(storage):
    # Many small chunks: each LMDB map takes address space of its own (10 MiB at least).
    ydl.cache_dataset(lambda: records(4000), "ds", "v1", storage, progress=False, chunk_bytes=8000)
    done = subprocess.run(
        [sys.executable, "-c", CHILD_LIMITED, storage.root],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=storage.root,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.strip()
    assert out.startswith("StorageError: ") and "ulimit -v" in out, out


CHILD_CLOSING = textwrap.dedent(
    """
    import sys, threading, time
    import numpy as np
    import yogadl_plus as ydl

    ref = ydl.LocalStorage(sys.argv[1]).fetch("ds", "v1")
    stop, errors, reads = threading.Event(), {}, [0]

    def read():
        rng = np.random.default_rng()
        while not stop.is_set():
            try:
                indices = np.sort(rng.integers(0, len(ref), 64))
                assert (ref.get_batch(indices, fields=["id"])["id"] == indices).all()
                reads[0] += 1
            except ydl.YogaError as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1

    threads = [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(100):
        time.sleep(0.005)
        ref.close()
    stop.set()
    for t in threads:
        t.join()
    print(reads[0], sorted(errors.items()))
    """
)


def test_closing_a_dataref_other_threads_read_neither_crashes_nor_fails_them(storage):
    """close() while other threads read lets go of the closing thread's handles only: unmapping
    files under their reads would kill the process (SIGSEGV), and their reads are not damage."""
    ydl.cache_dataset(
        lambda: records(20000), "ds", "v1", storage, progress=False, chunk_bytes=1 << 18
    )
    done = subprocess.run(
        [sys.executable, "-c", CHILD_CLOSING, storage.root],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=storage.root,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reads, errors = done.stdout.strip().split(" ", 1)
    assert int(reads) > 0 and errors == "[]", done.stdout


# --- hashed once per file: in forked workers, and where stamps cannot be written ------------------


def test_forked_workers_trust_what_their_parent_checked_without_stamps(storage, monkeypatch):
    integrity = pytest.importorskip("yogadl_plus.cache.integrity")
    ref = build(storage)
    path = chunk_path(ref)
    ref.close()
    del ref
    os.remove(str(path) + STAMP_SUFFIX)
    os.mkdir(str(path) + STAMP_SUFFIX)  # no stamp can be written here: as on read-only storage
    hashed: list[str] = []
    real = integrity.file_sha256
    monkeypatch.setattr(integrity, "file_sha256", lambda p: hashed.append(p) or real(p))
    integrity._VERIFIED.clear()
    ref = storage.fetch("ds", "v1")
    assert len(hashed) == 1
    stream = ref.stream(batch_size=50, num_workers=2, worker_type="process")
    assert sum(len(b["id"]) for b in stream) == N
    stream.close()
    child = os.fork()
    if child == 0:  # a forked worker reading a fresh DataRef of the version
        again = storage.fetch("ds", "v1")
        os._exit(0 if again[7]["s"] == "rec-0-000007" and len(hashed) == 1 else 1)
    assert os.waitpid(child, 0)[1] == 0


def test_a_stamp_keeps_the_checks_of_several_hosts(storage):
    """A network filesystem shows one file on another device on each host: each host's check
    is kept, so hosts do not undo each other's stamps (and hash on every open)."""
    integrity = pytest.importorskip("yogadl_plus.cache.integrity")
    ref = build(storage)
    path, sha = str(chunk_path(ref)), ref.manifest.chunks[0].sha256
    here = integrity.file_state(path)
    elsewhere = here._replace(device=here.device + 1)
    integrity._write_stamp(path, elsewhere, sha)  # what another host wrote
    integrity._VERIFIED.clear()
    assert integrity.trusted(path, here, sha) and integrity.trusted(path, elsewhere, sha)
