"""Batches of fixed-size records gathered from the chunk files (cache/pagemap.py): the map of
where each value lies agrees with LMDB's own gets in every layout LMDB writes (small values,
values near a page, values on overflow pages, many chunks, chunks of several commits); a file
it cannot read, or one that changed, gets no map and is read by gets; damage is still found
before a record is served; and the streams hand out exactly what gets would."""

from __future__ import annotations

import mmap
import os
import shutil
import struct
import threading
import time
from pathlib import Path

import lmdb
import numpy as np
import pytest
from helpers.damage import chunk_path, flip_byte

import yogadl_plus as ydl
from yogadl_plus import predicates
from yogadl_plus.cache import opening, pagemap, reader
from yogadl_plus.cache.integrity import file_state
from yogadl_plus.cache.keys import record_key
from yogadl_plus.errors import UnexpectedLayout

LAYOUTS = {
    "small values": (lambda i: {"x": np.full(64, i, np.float32), "y": np.int64(i)}, 20_000, {}),
    "one int64": (lambda i: {"y": np.int64(i)}, 5_000, {}),
    "half a page": (lambda i: {"x": np.full(2000, i % 251, np.uint8)}, 600, {}),
    "just under a page": (lambda i: {"x": np.full(4000, i % 251, np.uint8)}, 200, {}),
    "overflow pages": (lambda i: {"x": np.full(96 << 10, i % 251, np.uint8)}, 40, {}),
    "many chunks": (lambda i: {"x": np.full(16, i, np.float32)}, 30_000, {"chunk_bytes": 1 << 20}),
}


def gets(path: str, records: int) -> list[bytes]:
    env = lmdb.open(path, subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return [txn.get(record_key(i)) for i in range(records)]
    finally:
        env.close()


def mapped(path: str, records: int) -> pagemap.ValueMap | None:
    env = lmdb.open(path, subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return pagemap.map_values(
                path, file_state(path), records, lambda i: txn.get(record_key(i))
            )
    finally:
        env.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_map_agrees_with_lmdb_for_every_record(tmp_path: Path, layout: str) -> None:
    make, n, kwargs = LAYOUTS[layout]
    records = (make(i) for i in range(n))
    ref = ydl.cache_dataset(records, "ds", "v1", storage(tmp_path), progress=False, **kwargs)
    infos = ref.manifest.chunks
    assert sum(c.records for c in infos) == n
    for number, info in enumerate(infos):
        path = str(tmp_path / f"copy-{number}.mdb")  # (the DataRef holds the file open)
        shutil.copyfile(chunk_path(ref, number), path)
        value_map = mapped(path, info.records)
        assert value_map is not None, (layout, number)
        rows = value_map.gather(np.arange(info.records))
        assert [row.tobytes() for row in rows] == gets(path, info.records)
    ref.close()


def test_a_chunk_of_several_commits_is_mapped_from_its_live_pages(tmp_path: Path) -> None:
    """A chunk written in several transactions keeps stale copies of pages among its free ones:
    the map walks the tree from the newest meta page, so it finds the live ones."""
    path = str(tmp_path / "chunk.mdb")
    env = lmdb.open(path, subdir=False, map_size=1 << 26)
    for part in range(5):
        with env.begin(write=True) as txn:
            for i in range(part * 1000, (part + 1) * 1000):
                txn.put(record_key(i), np.full(20, i, np.int32).tobytes(), append=True)
        with env.begin(write=True) as txn:  # rewritten: the old page becomes a free one
            txn.put(record_key(0), np.full(20, -part, np.int32).tobytes())
    env.close()
    value_map = mapped(path, 5000)
    assert value_map is not None
    rows = value_map.gather(np.arange(5000))
    assert [row.tobytes() for row in rows] == gets(path, 5000)
    assert rows[0].view(np.int32)[0] == -4


def test_a_file_it_cannot_read_gets_no_map(tmp_path: Path) -> None:
    records = ({"y": np.int64(i)} for i in range(3000))
    ref = ydl.cache_dataset(records, "ds", "v1", storage(tmp_path), progress=False)
    original = str(tmp_path / "original.mdb")
    shutil.copyfile(chunk_path(ref), original)
    n = ref.manifest.chunks[0].records

    def variant(name: str, offset: int, value: bytes) -> str:
        path = str(tmp_path / name)
        shutil.copyfile(original, path)
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(value)
        return path

    psize = 4096
    for page in (0, 1):  # both meta pages: whichever is newer
        bad_magic = variant(f"magic{page}", page * psize + 16, b"\0\0\0\0")
        bad_version = variant(f"version{page}", page * psize + 20, b"\x02\0\0\0")
        entries = variant(f"entries{page}", page * psize + 16 + 72 + 32, b"\x07")
        for path in (bad_magic, bad_version, entries):
            with open(path, "rb") as f:
                data = f.read()
            txnids = [
                int.from_bytes(data[p * psize + 144 : p * psize + 152], "little") for p in (0, 1)
            ]
            if txnids[page] == max(txnids):
                assert pagemap.map_values(path, file_state(path), n, lambda i: b"") is None
    # A sample that differs from LMDB's get: no map.
    assert pagemap.map_values(original, file_state(original), n, lambda i: b"x" * 8) is None
    # A file in another state than the one checked: no map.
    state = file_state(original)
    os.utime(original, ns=(state.mtime_ns + 10**9, state.mtime_ns + 10**9))
    assert pagemap.map_values(original, state, n, lambda i: b"") is None
    # Values of several sizes: no map.
    varied = tmp_path / "varied.mdb"
    env = lmdb.open(str(varied), subdir=False)
    with env.begin(write=True) as txn:
        for i in range(100):
            txn.put(record_key(i), b"v" * (8 + i % 3), append=True)
    env.close()
    assert mapped(str(varied), 100) is None


def test_flipped_bytes_anywhere_never_raise_or_read_outside_the_file(tmp_path: Path) -> None:
    """Damage is for the sha256 to find; the map must just never crash on it: any byte of the
    tree's pages flipped gives no map, or a map of in-file offsets."""
    records = ({"x": np.full(3, i, np.int64)} for i in range(2000))
    ref = ydl.cache_dataset(records, "ds", "v1", storage(tmp_path), progress=False)
    original = str(tmp_path / "original.mdb")
    shutil.copyfile(chunk_path(ref), original)
    n = ref.manifest.chunks[0].records
    size = os.path.getsize(original)
    rng = np.random.default_rng(0)
    path = str(tmp_path / "flipped.mdb")
    for offset in rng.integers(0, size, 300).tolist():
        shutil.copyfile(original, path)
        flip_byte(path, offset)
        value_map = pagemap.map_values(path, file_state(path), n, lambda i: None)
        assert value_map is None  # (the sample check: a get of None never matches)
        # Without the sample check, the walk itself: in-file offsets or nothing.
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            offsets, sizes = pagemap._record_values(data, n)
        except (UnexpectedLayout, IndexError, ValueError, struct.error):
            continue
        assert (offsets >= 0).all() and (offsets + sizes <= size).all()


def small_ref(tmp_path: Path, n: int = 5000, **kwargs) -> ydl.DataRef:
    records = ({"x": np.full(8, i, np.float32), "i": np.int64(i)} for i in range(n))
    return ydl.cache_dataset(records, "ds", "v1", storage(tmp_path), progress=False, **kwargs)


def storage(tmp_path: Path) -> ydl.LocalStorage:
    return ydl.LocalStorage(str(tmp_path))


def test_streams_hand_out_what_gets_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = small_ref(tmp_path, 8000, chunk_bytes=1 << 16)
    assert len(ref.manifest.chunks) >= 5

    def epoch(**kwargs):
        stream = ref.stream(shuffle=True, shuffle_seed=3, **kwargs)
        return [{k: np.asarray(v).copy() for k, v in b.items()} for b in stream]

    gathered = {}
    calls = []

    def counted(real):
        def gather(*args):
            out = real(*args)
            calls.append(out is not None)
            return out

        return gather

    # Whole rows (gather_rows) or each field straight into its array (gather_spans).
    for name in ("gather_rows", "gather_spans"):
        monkeypatch.setattr(reader, name, counted(getattr(reader, name)))
    for kwargs in ({"batch_size": 512}, {"batch_size": 7}, {"shuffle_window": 2, "batch_size": 64}):
        gathered[str(kwargs)] = epoch(**kwargs)
    assert any(calls)  # (batches of 7 over many chunks are read by gets)
    for name in ("gather_rows", "gather_spans"):
        monkeypatch.setattr(reader, name, lambda *args: None)
    for kwargs in ({"batch_size": 512}, {"batch_size": 7}, {"shuffle_window": 2, "batch_size": 64}):
        by_gets = epoch(**kwargs)
        for a, b in zip(gathered[str(kwargs)], by_gets, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
                assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape


def test_a_mixture_and_a_predicate_read_gathered_rows_in_position_order(tmp_path: Path) -> None:
    a = small_ref(tmp_path / "a", 3000)
    b = small_ref(tmp_path / "b", 1000)
    mix = ydl.mix({"a": a, "b": b}, {"a": 1, "b": 1})
    seen = []
    for batch in mix.stream(shuffle=True, shuffle_seed=1, batch_size=100):
        assert (batch["x"][:, 0] == batch["i"]).all()
        seen.append(batch["i"])
    assert sum(map(len, seen)) == mix.epoch_size
    # A predicate on a field that is no whole-chunk column tests the gathered rows themselves.
    odd_x = predicates.in_lambda(["x"], lambda x: x[:, 0] % 2 == 1, vectorized=True)
    for kwargs in ({"batch_size": 64}, {"batch_size": 64, "shuffle": True}, {}):
        kept = a.stream(predicate=odd_x, **kwargs)
        ids = sorted(int(i) for i in np.concatenate([np.atleast_1d(b["i"]) for b in kept]))
        assert ids == list(range(1, 3000, 2))


def test_damage_is_still_found_before_a_gathered_record_is_served(tmp_path: Path) -> None:
    ref = small_ref(tmp_path)
    assert ref.get_batch(np.arange(100))["i"].tolist() == list(range(100))
    path = chunk_path(ref)
    # The value of record 4000 (x = 4000.0 eight times, then i = 4000), flipped in place.
    data = path.read_bytes()
    at = data.find(np.full(8, 4000, np.float32).tobytes() + np.int64(4000).tobytes())
    assert at > 0
    time.sleep(reader.RECHECK_SECONDS * 2)
    flip_byte(path, at + 3)
    with pytest.raises(ydl.CacheCorrupted, match="chunk-00000"):
        ref.get_batch([4000])
    ref.close()
    # Opened again: the sha256 refuses it before anything is served.
    with pytest.raises(ydl.CacheCorrupted, match="sha256"):
        storage(tmp_path).fetch("ds", "v1").get_batch([1, 2, 3])


def test_maps_kept_are_bounded_and_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    ref = small_ref(tmp_path, 8000, chunk_bytes=1 << 16)
    per_chunk = ref.manifest.chunks[0].records
    monkeypatch.setattr(opening, "MAPPED_RECORDS_KEPT", 3 * per_chunk)
    monkeypatch.setattr(opening, "MAPPED_CHUNKS_KEPT", 2)
    made = []
    real = pagemap.map_values

    def counted(path, *args):
        made.append(os.path.basename(path))
        return real(path, *args)

    monkeypatch.setattr(opening, "map_values", counted)
    for _ in range(2):
        for start in range(0, len(ref), 64):  # chunk after chunk, 20 batches each
            batch = ref.get_batch(np.arange(start, min(start + 64, len(ref))))
            np.testing.assert_array_equal(batch["x"][:, 0], batch["i"])
    chunks = len(ref.manifest.chunks)
    assert len(made) == 2 * chunks  # each pass made every map again: 2 are kept
    assert made[:chunks] == made[chunks:]
    # Readers taking turns over more chunks than are kept: a map that went before serving a few
    # reads is not made again (its chunk reads by gets), rather than made for every batch.
    made.clear()
    starts = np.cumsum([0] + [c.records for c in ref.manifest.chunks])
    for _ in range(20):
        for chunk in range(3):
            batch = ref.get_batch(np.arange(starts[chunk], starts[chunk] + 64))
            np.testing.assert_array_equal(batch["x"][:, 0], batch["i"])
    assert len(made) <= 3


def test_an_empty_batch_of_records_decoded_field_by_field(tmp_path: Path) -> None:
    """Records of exactly 4 KiB in two fields are copied one field at a time."""
    records = ({"a": np.int8(i), "b": np.full(4095, i, np.uint8)} for i in range(50))
    ref = ydl.cache_dataset(records, "ds", "v1", storage(tmp_path), progress=False)
    assert ref.layout.row_bytes == 4096
    empty = ref.get_batch([])
    assert empty["a"].shape == (0,) and empty["b"].shape == (0, 4095)
    assert ref.get_batch([7])["b"][0, 0] == 7
    none = predicates.in_lambda(["a"], lambda a: a < 0, vectorized=True)
    with pytest.warns(ydl.NothingPassedWarning, match="kept none"):
        assert list(ref.stream(batch_size=8, predicate=none)) == []


def test_an_empty_version_and_an_empty_batch(tmp_path: Path) -> None:
    schema = ydl.Schema([ydl.Field("x", np.float32, (4,))])
    empty = ydl.cache_dataset(iter([]), "e", "v1", storage(tmp_path), progress=False, schema=schema)
    assert empty.get_batch([])["x"].shape == (0, 4)
    assert small_ref(tmp_path / "s", 100).get_batch([])["x"].shape == (0, 8)


def test_a_predicate_that_changes_its_input_changes_no_record(tmp_path: Path) -> None:
    ref = small_ref(tmp_path, 1000)

    def even(x: np.ndarray) -> np.ndarray:
        x -= 1000  # (its own copy, as with values read by gets)
        return x[:, 0] % 2 == 0

    kept = ref.stream(batch_size=8, predicate=predicates.in_lambda(["x"], even, vectorized=True))
    batch = next(iter(kept))
    np.testing.assert_array_equal(batch["x"][:, 0], batch["i"])


def test_close_in_another_thread_leaves_a_gathering_thread_its_files(tmp_path: Path) -> None:
    ref = small_ref(tmp_path, 4000, chunk_bytes=1 << 16)
    read, finish = threading.Event(), threading.Event()

    def gather() -> None:
        ref.get_batch(np.arange(0, 4000, 3))
        read.set()
        finish.wait(10)
        ref.get_batch(np.arange(0, 4000, 3))  # (its files must still be there)

    thread = threading.Thread(target=gather)
    thread.start()
    read.wait(10)
    ref.close()  # another thread reads: its handles stay
    assert all(env is not None for env in ref._chunks._opened.envs)
    finish.set()
    thread.join()


def craft(tmp_path: Path, name: str, n: int, size: int) -> tuple[str, bytearray, int, tuple]:
    path = str(tmp_path / name)
    env = lmdb.open(path, subdir=False, map_size=1 << 30)
    with env.begin(write=True) as txn:
        for i in range(n):
            txn.put(record_key(i), np.full(size, i % 251, np.uint8).tobytes(), append=True)
    env.close()
    data = bytearray(Path(path).read_bytes())
    txnids = [struct.unpack_from("<Q", data, p * 4096 + 144)[0] for p in (0, 1)]
    meta = 4096 if txnids[1] > txnids[0] else 0
    return path, data, meta, struct.unpack_from("<IHHQQQQQ", data, meta + 16 + 24 + 48)


def node_offsets(data: bytearray, page: int) -> list[int]:
    lower = struct.unpack_from("<H", data, page * 4096 + 12)[0]
    at = page * 4096 + 16
    return [
        page * 4096 + struct.unpack_from("<H", data, at + 2 * i)[0]
        for i in range((lower - 16) // 2)
    ]


def test_crafted_pages_give_no_map(tmp_path: Path) -> None:
    """Page numbers that would wrap around when multiplied, and a branch that points back at
    itself under a deep tree, are refused before they are followed (not a MemoryError)."""
    path, data, _, db = craft(tmp_path, "overflow.mdb", 40, 96 << 10)
    leaf = node_offsets(data, db[7])
    third = struct.unpack_from("<Q", data, leaf[3] + 12)[0]
    struct.pack_into("<Q", data, leaf[1] + 12, third + (1 << 52))
    Path(path).write_bytes(data)
    assert pagemap.map_values(path, file_state(path), 40, lambda i: b"") is None
    path, data, meta, db = craft(tmp_path, "loop.mdb", 20000, 24)
    root = db[7]
    for node in node_offsets(data, root):
        struct.pack_into("<HHH", data, node, root & 0xFFFF, (root >> 16) & 0xFFFF, root >> 32)
    struct.pack_into("<H", data, meta + 16 + 24 + 48 + 6, 12)  # 12 levels deep
    Path(path).write_bytes(data)
    assert pagemap.map_values(path, file_state(path), 20000, lambda i: b"") is None
