"""Chunks of equal-size records written as LMDB's own pages (cache/pagewriter.py): the file is
the one LMDB makes of the same records appended (its gets, its stat), the page map reads it, a
version built so streams as any other, damage to its pages is found by the sha256 check, a
file LMDB disagrees with is written again by puts, and a build killed while writing pages
publishes nothing. LMDB's own tools (lmdb-utils: mdb_stat, mdb_dump, mdb_load) read such a file
as theirs, and LMDB goes on writing it; records handed over one at a time are not held in
memory; a full disk and a build killed after the pages are finished leave nothing behind."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from unittest import mock

import lmdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.damage import chunk_path, flip_byte
from hypothesis import example, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.cache import lmdbformat, pagemap, pages, pagewriter
from yogadl_plus.cache.integrity import file_state
from yogadl_plus.cache.keys import IDENTITY_KEY, KEY_BYTES, record_key
from yogadl_plus.cache.writer import ChunkWriter, EqualValues
from yogadl_plus.errors import UnexpectedLayout

PSIZE = 4096  # the OS's page: LMDB's page size
PER_LEAF_264 = 14  # records of 264 bytes a leaf page holds
OVERFLOW_FROM = 2027  # the smallest value LMDB puts on overflow pages of its own, in 4 KiB pages


def open_env(path: Path, **kwargs: object) -> lmdb.Environment:
    return lmdb.open(str(path), subdir=False, map_size=1 << 30, lock=False, max_dbs=0, **kwargs)


def rows_of(count: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, width), np.uint8)


def written_directly(path: Path, rows: np.ndarray, cuts: list[int]) -> pagewriter.TreeShape:
    """``rows`` written by the page writer into a new LMDB file at ``path``, in batches cut
    at ``cuts``."""
    open_env(path).close()
    pages = pagewriter.PageWriter(str(path), rows.shape[1])
    bounds = [0, *sorted(c % (len(rows) + 1) for c in cuts), len(rows)]
    for start, stop in itertools.pairwise(bounds):
        pages.add(rows[start:stop].tobytes())
    return pages.finish(1 << 30)


def appended_by_lmdb(path: Path, rows: np.ndarray) -> dict[str, int]:
    """The stat of the same records put by py-lmdb with append=True."""
    env = open_env(path)
    with env.begin(write=True) as txn:
        txn.cursor().putmulti(((record_key(i), row.tobytes()) for i, row in enumerate(rows)),
                              append=True)  # fmt: skip
    stat: dict[str, int] = env.stat()
    env.close()
    return stat


@settings(max_examples=25, deadline=None)
@given(
    count=st.one_of(
        st.sampled_from([0, 1, PER_LEAF_264 - 1, PER_LEAF_264, PER_LEAF_264 + 1]),
        st.integers(0, 1500),
    ),
    width=st.one_of(
        st.sampled_from([1, 8, 264, 2026, OVERFLOW_FROM, OVERFLOW_FROM + 1, 4080, 4081]),
        st.integers(1, 2100),
    ),
    cuts=st.lists(st.integers(0, 10**6), max_size=4),
)
@example(count=75_000, width=1, cuts=[30_000])  # three levels: two of branch pages
@example(count=700, width=2000, cuts=[1])  # two records a leaf: three levels from few records
@example(count=2 * 291 * 290 + 1, width=2500, cuts=[])  # LMDB's split of full branch pages
def test_pages_written_directly_are_the_tree_lmdb_appends(
    tmp_path_factory: pytest.TempPathFactory, count: int, width: int, cuts: list[int]
) -> None:
    if count * max(width, 64) > 64 << 20:  # (the split example: its shape only, by the model)
        pages = pagewriter.branch_pages(2 * 291 * 290 + 1, PSIZE)
        assert pages[:2] == [290, 290] and sum(pages) == 2 * 291 * 290 + 1
        return
    folder = tmp_path_factory.mktemp("pages")
    rows = rows_of(count, width, count + width)
    shape = written_directly(folder / "direct.mdb", rows, cuts)
    assert shape.stat() == appended_by_lmdb(folder / "lmdb.mdb", rows)
    env = open_env(folder / "direct.mdb", readonly=True)
    with env.begin() as txn:
        assert env.stat() == shape.stat()
        read = list(txn.cursor())
        assert read == [(record_key(i), row.tobytes()) for i, row in enumerate(rows)]
        value_map = pagemap.map_values(
            str(folder / "direct.mdb"),
            file_state(str(folder / "direct.mdb")),
            count,
            lambda i: txn.get(record_key(i)),
        )
    env.close()
    if count:
        assert value_map is not None
        some = np.random.default_rng(count).integers(0, count, 50)
        assert (value_map.gather(some) == rows[some]).all()


def build(
    storage: ydl.LocalStorage, n: int = 3000, width: int = 64
) -> tuple[ydl.DataRef, dict[str, np.ndarray]]:
    columns = {
        "x": np.random.default_rng(1).standard_normal((n, width)).astype(np.float32),
        "y": np.arange(n, dtype=np.int64),
    }
    return ydl.cache_dataset(columns, "ds", "v1", storage, progress=False), columns


def finished_shapes(monkeypatch: pytest.MonkeyPatch) -> list[pagewriter.TreeShape]:
    """The shapes of the trees the page writer finishes from now on."""
    finished: list[pagewriter.TreeShape] = []
    finish = pagewriter.PageWriter.finish
    monkeypatch.setattr(
        pagewriter.PageWriter, "finish", lambda self, size: finished.append(finish(self, size))
        or finished[-1],
    )  # fmt: skip
    return finished


def test_a_version_of_columns_is_written_directly_and_streams_as_any_other(
    local_storage: ydl.LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    finished = finished_shapes(monkeypatch)
    ref, columns = build(local_storage)
    assert [shape.entries for shape in finished] == [3000]
    batches = list(ref.stream(batch_size=256, shuffle=True, shuffle_seed=3))
    order = np.concatenate([b["y"] for b in batches])
    assert sorted(order.tolist()) == list(range(3000))
    assert (np.concatenate([b["x"] for b in batches]) == columns["x"][order]).all()
    ys = np.concatenate([b["y"] for b in ref.stream(batch_size=1000, fields=["y"])])
    assert ys.tolist() == list(range(3000))  # (the whole-chunk column, added by LMDB)
    ref.verify()


@pytest.mark.parametrize("where", ["leaf page", "meta page", "branch page"])
def test_a_flipped_byte_in_a_page_written_directly_is_found(
    local_storage: ydl.LocalStorage, where: str
) -> None:
    ref, _ = build(local_storage)
    path = chunk_path(ref)
    ref.close()
    at = {"leaf page": 5 * PSIZE + 3000, "meta page": PSIZE + 40, "branch page": None}[where]
    if at is None:  # the root branch page, as the meta page the reader uses names it
        env = open_env(path, readonly=True)
        with env.begin() as txn:
            txn.get(record_key(0))
        env.close()
        at = (os.path.getsize(path) // PSIZE - 1) * PSIZE + 100
    flip_byte(path, at)
    with pytest.raises(ydl.CacheCorrupted, match="sha256"):
        list(local_storage.fetch("ds", "v1").stream(batch_size=512))


@pytest.mark.parametrize(("n", "width"), [(3000, 64), (300, 2000)])  # on the leaf, spilled
def test_a_file_lmdb_reads_otherwise_is_written_again_by_puts(
    local_storage: ydl.LocalStorage, monkeypatch: pytest.MonkeyPatch, n: int, width: int
) -> None:
    stat = pagewriter.TreeShape.stat
    monkeypatch.setattr(
        pagewriter.TreeShape, "stat", lambda self: {**stat(self), "entries": self.entries + 1}
    )
    written = pagewriter.PageWriter.written
    read_back: list[int] = []
    monkeypatch.setattr(
        pagewriter.PageWriter, "written",
        lambda self, start, stop: read_back.append(stop - start) or written(self, start, stop),
    )  # fmt: skip
    ref, columns = build(local_storage, n, width)
    assert read_back == [n]  # every record written again, from what was written
    assert not os.path.exists(str(chunk_path(ref)) + ".again")
    assert (ref.get_batch(list(range(0, n, 7)))["x"] == columns["x"][::7]).all()
    ref.verify()


def test_a_chunk_started_directly_takes_records_of_other_sizes_by_puts(tmp_path: Path) -> None:
    with ChunkWriter(str(tmp_path)) as writer:
        writer.add_many(EqualValues(b"a" * 40, 8))
        writer.add_many([b"bb", b"c" * 3000])
        writer.add_many(EqualValues(b"d" * 16, 8))
    (info,) = writer.chunks
    env = open_env(tmp_path / info.file, readonly=True)
    with env.begin() as txn:
        values = [txn.get(record_key(i)) for i in range(info.records)]
    env.close()
    assert values == [b"a" * 8] * 5 + [b"bb", b"c" * 3000] + [b"d" * 8] * 2


BUILD_KILLED_WRITING_PAGES = """
import os, signal, sys
import numpy as np
import yogadl_plus as ydl
from yogadl_plus.cache import pagewriter
write = pagewriter.PageWriter._write_on_leaves
def killed(self, rows, per_leaf):
    write(self, rows, per_leaf)
    if self.records > 20_000:
        os.kill(os.getpid(), signal.SIGKILL)
pagewriter.PageWriter._write_on_leaves = killed
x = np.zeros((50_000, 16), np.float32)
ydl.cache_dataset({"x": x}, "ds", "v1", ydl.LocalStorage(sys.argv[1]), progress=False)
"""


@pytest.mark.crash
def test_a_build_killed_while_writing_pages_publishes_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BUILD_KILLED_WRITING_PAGES), str(store)],
        capture_output=True,
        timeout=120,
    )
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()
    storage = ydl.LocalStorage(store)
    assert ("ds", "v1") not in storage.list()
    x = np.arange(50_000 * 16, dtype=np.float32).reshape(-1, 16)
    ref = ydl.cache_dataset({"x": x}, "ds", "v1", storage, progress=False)
    assert (ref.get_batch([0, 49_999])["x"] == x[[0, 49_999]]).all()


# LMDB's own tools (apt-get install lmdb-utils): where they are missing, their checks are left out.
LMDB_TOOLS = all(shutil.which(tool) for tool in ("mdb_dump", "mdb_load", "mdb_stat"))


def lmdb_tool(*args: str | Path, given: bytes = b"") -> bytes:
    """What one of LMDB's own tools prints; it must exit 0."""
    done = subprocess.run([str(a) for a in args], input=given, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def records_of(env: lmdb.Environment) -> dict[bytes, bytes]:
    with env.begin() as txn:
        return dict(txn.cursor())


@settings(max_examples=6, deadline=None)
@given(
    count=st.sampled_from([1, 14, 15, 186, 371]),
    width=st.sampled_from([1, 264, 2026, OVERFLOW_FROM, 4081, 9000]),
    cuts=st.lists(st.integers(0, 10**6), max_size=6),
    group=st.sampled_from([PSIZE, 3 * PSIZE, 32 << 20]),
)
@example(count=371, width=4081, cuts=list(range(371)), group=PSIZE)  # one at a time
def test_lmdb_reads_and_goes_on_writing_a_file_written_directly(
    tmp_path_factory: pytest.TempPathFactory, count: int, width: int, cuts: list[int], group: int
) -> None:
    folder = tmp_path_factory.mktemp("pages")
    rows = rows_of(count, width, count * width)
    direct = folder / "direct.mdb"
    with mock.patch.object(pagewriter, "_GROUP_BYTES", group, create=True):
        written_directly(direct, rows, cuts)
    appended_by_lmdb(folder / "lmdb.mdb", rows)
    # LMDB's own tools: the same records as LMDB's appends, and a file they load back.
    if LMDB_TOOLS:
        dump = lmdb_tool("mdb_dump", "-n", direct)
        assert dump == lmdb_tool("mdb_dump", "-n", folder / "lmdb.mdb")
        lmdb_tool("mdb_load", "-n", folder / "loaded.mdb", given=dump)
        assert lmdb_tool("mdb_dump", "-n", folder / "loaded.mdb") == dump
        lmdb_tool("mdb_stat", "-n", "-a", "-e", "-f", "-r", direct)
    want = {record_key(i): row.tobytes() for i, row in enumerate(rows)}
    env = open_env(direct, readonly=True)
    with env.begin() as txn:
        cursor = txn.cursor()
        assert cursor.last()
        backwards = [cursor.item()]
        while cursor.prev():
            backwards.append(cursor.item())
        assert backwards == sorted(want.items(), reverse=True)
        assert all(cursor.set_range(key) and cursor.key() == key for key in want)
    env.copy(str(folder / "compact.mdb"), compact=True)
    env.close()
    assert records_of(open_env(folder / "compact.mdb", readonly=True)) == want
    # Read-ahead's walk of the pages: each value's own pages, else its leaf page, holds it.
    with open(direct, "rb") as f:
        spans = pages.page_map(f.fileno(), count)
        data = f.read()
    assert spans is not None
    for i, (at, size) in enumerate(zip(*spans.spans(np.arange(count)))):
        assert rows[i].tobytes() in data[at : at + size]
    # LMDB goes on writing it: values replaced by others of any size, deleted, added after.
    rng = np.random.default_rng(count)
    env = open_env(direct)
    for _ in range(3):
        with env.begin(write=True) as txn:
            for key in map(record_key, rng.integers(0, count, 8).tolist()):
                if key[-1] % 3 == 0:
                    txn.delete(key)
                    want.pop(key, None)
                else:
                    want[key] = rng.bytes(int(rng.integers(0, 3 * PSIZE)))
                    txn.put(key, want[key])
            extra = IDENTITY_KEY + rng.bytes(4)
            want[extra] = rng.bytes(int(rng.integers(0, 2 * PSIZE)))
            txn.put(extra, want[extra])
    assert records_of(env) == want
    env.close()
    if LMDB_TOOLS:
        lmdb_tool("mdb_stat", "-n", "-a", "-e", "-f", "-r", direct)


def test_records_handed_over_one_at_a_time_are_not_held_in_memory(tmp_path: Path) -> None:
    # Parquet written a row per row group comes a row at a time: a chunk's records must not
    # pile up in memory (nor be copied again with each record) before the chunk is finished.
    x = np.random.default_rng(0).standard_normal((300, 25_000)).astype(np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
    pq.write_table(pa.table({"x": column}), tmp_path / "x.parquet", row_group_size=1)
    tracemalloc.start()
    try:
        ref = ydl.cache_dataset(
            str(tmp_path / "x.parquet"), "ds", "v1", ydl.LocalStorage(tmp_path), progress=False
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < x.nbytes / 2, f"{peak / 2**20:.0f} MiB held for {x.nbytes / 2**20:.0f} MiB"
    assert (ref.get_batch([0, 150, 299])["x"] == x[[0, 150, 299]]).all()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_while_writing_pages_names_the_chunk_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "none", str(small)])
    if mounted.returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        storage = ydl.LocalStorage(small / "store")
        x = np.ones((40_000, 64), np.uint8)  # pages of ~3 MiB
        with pytest.raises(ydl.StorageError, match=r"chunk-00000\.mdb: no space left"):
            ydl.cache_dataset({"x": x}, "ds", "v1", storage, progress=False)
        left = [f for _, _, files in os.walk(small) for f in files if not f.startswith("+lock")]
        assert left == [] and storage.list() == []
    finally:
        subprocess.run(["umount", "-l", str(small)])


BUILD_KILLED_AFTER_PAGES = """
import os, signal, sys
import numpy as np
import yogadl_plus as ydl
from yogadl_plus.cache import pagewriter, writer
step = sys.argv[2]
def killed(original):
    def then_kill(*args, **kwargs):
        done = original(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    return then_kill
if step == "pages finished":  # meta page written, LMDB has not opened the file yet
    pagewriter.PageWriter.finish = killed(pagewriter.PageWriter.finish)
elif step == "other entries added":  # LMDB's transaction committed, the file not yet synced
    writer._Hash = killed(writer._Hash)
else:  # the chunk synced and stamped, the version not yet published
    writer.stamp = killed(writer.stamp)
x = np.zeros((5_000, 16), np.float32)
ydl.cache_dataset({"x": x, "y": np.arange(5_000)}, "ds", "v1", ydl.LocalStorage(sys.argv[1]),
                  progress=False)
"""


@pytest.mark.crash
@pytest.mark.parametrize("step", ["pages finished", "other entries added", "chunk stamped"])
def test_a_build_killed_after_writing_pages_publishes_nothing(tmp_path: Path, step: str) -> None:
    store = tmp_path / "store"
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BUILD_KILLED_AFTER_PAGES), str(store), step],
        capture_output=True,
        timeout=120,
    )
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()
    storage = ydl.LocalStorage(store)
    assert storage.list() == []
    x = np.arange(5_000 * 16, dtype=np.float32).reshape(-1, 16)
    ref = ydl.cache_dataset({"x": x}, "ds", "v1", storage, progress=False)
    assert (ref.get_batch([0, 4_999])["x"] == x[[0, 4_999]]).all()
    ref.verify()


@pytest.mark.parametrize("width", [264, 9000])
def test_writes_cut_short_are_finished(tmp_path: Path, width: int) -> None:
    # A network or FUSE file system may take part of a write: the rest must follow it.
    def short(fd: int, buffers: list[memoryview], offset: int) -> int:
        return os.pwrite(fd, b"".join(buffers)[:1000], offset)

    rows = rows_of(40, width, width)
    with mock.patch("os.pwritev", short):
        written_directly(tmp_path / "cut.mdb", rows, [7, 8, 20])
    env = open_env(tmp_path / "cut.mdb", readonly=True)
    assert records_of(env) == {record_key(i): row.tobytes() for i, row in enumerate(rows)}
    env.close()


def test_a_file_of_another_lmdb_data_version_is_left_to_lmdb(tmp_path: Path) -> None:
    # py-lmdb built on another LMDB (1.0 lays pages out otherwise) makes files of another data
    # version: pages written as LMDB 0.9's would be garbage to it.
    made = open_env(tmp_path / "new.mdb")
    made.close()
    with open(tmp_path / "new.mdb", "r+b") as f:
        for meta in (0, PSIZE):
            f.seek(meta + 20)  # mm_version, after the page header and the magic
            f.write((2).to_bytes(4, "little"))
    with pytest.raises(UnexpectedLayout, match=r"LMDB 0\.9"):
        pagewriter.PageWriter(str(tmp_path / "new.mdb"), 8)


def test_a_chunk_writer_given_such_a_file_has_lmdb_put_the_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pagewriter, "DATA_VERSION", 2)  # every new file is "of another version"
    rows = rows_of(500, 300, 0)
    with ChunkWriter(str(tmp_path), chunk_bytes=100_000) as writer:
        writer.add_many(EqualValues(rows.tobytes(), 300))
    read = []
    for info in writer.chunks:
        env = open_env(tmp_path / info.file, readonly=True)
        with env.begin() as txn:
            read += [txn.get(record_key(i)) for i in range(info.records)]
        env.close()
    assert len(writer.chunks) > 1 and read == [row.tobytes() for row in rows]


def new_file_of_pages(path: Path, psize: int) -> None:
    """A new LMDB file of ``psize``-byte pages, as LMDB makes one on a machine whose OS pages
    are that big (LMDB then keeps the file's page size): this machine's, its meta pages
    grown and their page size changed."""
    open_env(path).close()
    made = path.read_bytes()
    metas = bytearray()
    for number in range(lmdbformat.META_PAGES):
        page = bytearray(made[number * PSIZE : (number + 1) * PSIZE].ljust(psize, b"\0"))
        struct.pack_into("<I", page, lmdbformat.DB_OFFSET, psize)  # the free DB's pad
        metas += page
    path.write_bytes(bytes(metas))


@pytest.mark.parametrize("psize", [8192, 16384, 32768])
@pytest.mark.parametrize("width", [1, "overflow threshold - 1", "overflow threshold", 50_000])
def test_pages_of_other_sizes_are_the_tree_lmdb_appends(
    tmp_path: Path, psize: int, width: int | str
) -> None:
    spilled = lmdbformat.node_max(psize) - lmdbformat.NODE.size - KEY_BYTES + 1  # (OVERFLOW_FROM)
    width = {"overflow threshold - 1": spilled - 1, "overflow threshold": spilled}.get(
        str(width), width
    )
    assert isinstance(width, int)
    rows = rows_of(max(50, 40_000 // width), width, psize)
    new_file_of_pages(tmp_path / "direct.mdb", psize)
    writer = pagewriter.PageWriter(str(tmp_path / "direct.mdb"), width)
    for batch in np.array_split(rows, 3):
        writer.add(batch.tobytes())
    shape = writer.finish(1 << 30)
    new_file_of_pages(tmp_path / "lmdb.mdb", psize)
    assert shape.psize == psize and shape.stat() == appended_by_lmdb(tmp_path / "lmdb.mdb", rows)
    env = open_env(tmp_path / "direct.mdb", readonly=True)
    assert records_of(env) == {record_key(i): row.tobytes() for i, row in enumerate(rows)}
    env.close()


def test_page_numbers_past_32_bits_are_written_whole(tmp_path: Path) -> None:
    # A chunk never has 2**32 pages, but nothing in the page writer's arithmetic may wrap at
    # 32 bits: a page's own number, a branch node's child (48 bits), a leaf node's first page
    # of a value on pages of its own (64 bits). Checked on pages made in memory.
    far = 2**45 + 12_345
    writer = pagewriter.PageWriter.__new__(pagewriter.PageWriter)
    writer.layout, writer.width = pagewriter.leaf_layout(PSIZE, 5000), 5000
    leaf, nodes = writer._leaves(np.array([far], np.int64), 2**32 - 3, 2)
    assert struct.unpack_from("<Q", leaf, 0)[0] == far
    first = lmdbformat.NODE.size + KEY_BYTES
    assert [int.from_bytes(node[first : first + 8], "little") for node in nodes[0]] == [
        far + 1,
        far + 1 + writer.layout.overflow,
    ]
    assert [bytes(node[lmdbformat.NODE.size : first]) for node in nodes[0]] == [
        record_key(2**32 - 3),
        record_key(2**32 - 2),
    ]
    branch = np.zeros(PSIZE, np.uint8)
    children = np.array([far, 2**47 + 3], np.int64)
    pagewriter._branch_page(branch, far + 9, children, np.array([0, 2**32 - 5], np.int64))
    slots = np.frombuffer(branch, "<u2", 2, lmdbformat.PAGE_HEADER)
    lo, hi, flags, _ = lmdbformat.NODE.unpack_from(branch, int(slots[1]))
    assert struct.unpack_from("<Q", branch, 0)[0] == far + 9
    assert lo | hi << 16 | flags << 32 == 2**47 + 3


BUILD_OUT_OF_ROOM_FOR_BRANCH_PAGES = """
import os, resource, signal, sys
import numpy as np
import yogadl_plus as ydl
from yogadl_plus.cache import pagewriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, as a full disk
layout = pagewriter.leaf_layout(4096, 64)
leaves = -(-20_000 // layout.per_leaf)
resource.setrlimit(resource.RLIMIT_FSIZE, ((2 + leaves) * 4096,) * 2)  # no room past them
store = ydl.LocalStorage(sys.argv[1])
try:
    ydl.cache_dataset({"x": np.ones((20_000, 16), np.float32)}, "ds", "v1", store, progress=False)
except ydl.StorageError as exc:
    print("StorageError:", exc)
    kept = exc  # as a notebook keeps the last error (sys.last_value), its frames with it
def opened(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # (the listing's own, closed since)
        return ""
print("open:", [path for path in map(opened, os.listdir("/proc/self/fd"))
                if path.startswith(sys.argv[1])])
"""


def test_a_full_disk_while_finishing_the_pages_closes_the_file(tmp_path: Path) -> None:
    # A file still open when the build gives up keeps its disk space after it is removed, until
    # the process ends: the space a user frees to try again. The error kept (as a notebook
    # keeps the last one) must not keep the file open.
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc here to list open files")
    run = subprocess.run(
        [sys.executable, "-c", BUILD_OUT_OF_ROOM_FOR_BRANCH_PAGES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    said, open_files = run.stdout.splitlines()
    assert said.startswith("StorageError:") and "chunk-00000.mdb" in said
    assert open_files == "open: []"


def test_records_of_fixed_fields_are_written_directly(
    local_storage: ydl.LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    finished = finished_shapes(monkeypatch)
    x = np.random.default_rng(2).standard_normal((5000, 16)).astype(np.float32)
    records = ({"x": x[i], "y": np.int64(i)} for i in range(5000))
    ref = ydl.cache_dataset(records, "ds", "v1", local_storage, progress=False)
    assert [shape.entries for shape in finished] == [5000]
    got = ref.get_batch(list(range(5000)))
    assert (got["x"] == x).all() and got["y"].tolist() == list(range(5000))
    ref.verify()


def test_records_of_one_size_then_others_are_all_kept(
    local_storage: ydl.LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Variable fields whose first records happen to be of one size: those are written as
    # pages, the rest of the chunk by LMDB's puts.
    finished = finished_shapes(monkeypatch)
    names = ["abc"] * 4096 + ["a" * (i % 7) for i in range(904)]
    ref = ydl.cache_dataset(({"s": s} for s in names), "ds", "v1", local_storage, progress=False)
    assert [shape.entries for shape in finished] == [4096]
    assert list(ref.get_batch(list(range(5000)))["s"]) == names
    ref.verify()
