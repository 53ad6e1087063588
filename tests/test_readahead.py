"""Big records and cold disks: read-ahead along the order, the page map it relies on, big
batches that reuse memory. None of it may change a byte of what is read."""

from __future__ import annotations

import gc
import os
import sys
import threading
import time

import numpy as np
import pytest

import yogadl_plus as ydl
from yogadl_plus.cache import reader
from yogadl_plus.cache.pages import page_map
from yogadl_plus.cache.recycle import RECYCLED_BYTES, ArrayRecycler


def _cache(storage, name, n, size, chunk_bytes=1 << 20, variable=False):
    fields = [ydl.Field("y", np.int64)]
    fields.append(ydl.Field("x", np.uint8, (None,) if variable else (size,)))
    schema = ydl.Schema(fields)

    def records():
        for i in range(n):
            length = size if not variable else (size * (1 + i % 7)) // 4 + 1
            yield {"x": np.full(length, i % 251, np.uint8), "y": np.int64(i)}

    return ydl.cache_dataset(
        records, "ra", name, storage, schema=schema, progress=False, chunk_bytes=chunk_bytes
    )


def _map_base(path: str) -> int:
    with open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith(path):
                return int(line.split("-")[0], 16)
    raise AssertionError(f"{path} is not mapped")


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
@pytest.mark.parametrize(
    ("n", "size", "variable"),
    [(300, 20_000, False), (40_000, 200, False), (500, 9_000, True)],
    ids=["overflow values", "small records, deep tree", "mixed sizes"],
)
def test_page_map_finds_where_lmdb_keeps_each_value(local_storage, n, size, variable, monkeypatch):
    """Every record's span holds exactly the bytes LMDB hands out for it (its own value where
    the value has its own pages, else its leaf page), in every chunk."""
    # Values as views into LMDB's map (not rows gathered from the file: cache/pagemap.py).
    monkeypatch.setattr(reader, "gather_rows", lambda *args: None)
    ref = _cache(local_storage, f"m{n}-{size}", n, size, variable=variable)
    chunks = ref.manifest.chunks
    assert len(chunks) > 1
    start = 0
    for number, info in enumerate(chunks):
        path = os.path.join(ref.directory, info.file)
        fd = os.open(path, os.O_RDONLY)
        try:
            pages = page_map(fd, info.records)
        finally:
            os.close(fd)
        assert pages is not None
        local = np.arange(info.records)
        offsets, lengths = pages.spans(local)
        values = ref.read_values(local + start)  # maps the file in this thread
        base = _map_base(path)
        for k, value in enumerate(values):
            at = np.frombuffer(value, np.uint8).ctypes.data - base if len(value) else None
            if at is None:
                continue
            if lengths[k] == len(value) and len(value) > 2048:
                assert offsets[k] == at, (number, k)
            else:  # a value inside its leaf page
                assert offsets[k] <= at and at + len(value) <= offsets[k] + lengths[k], (number, k)
        start += info.records


def test_page_map_of_a_file_that_is_not_lmdb_is_none(tmp_path):
    for content in (b"", b"\0" * 100, os.urandom(64 << 10)):
        path = tmp_path / "f.mdb"
        path.write_bytes(content)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert page_map(fd, 10) is None
        finally:
            os.close(fd)


@pytest.mark.slow
def test_page_map_of_a_damaged_tree_is_none_or_in_bounds(local_storage):
    """A flipped byte in a branch or leaf page never makes the map point outside the file (a
    hint is harmless, an exception here would not be)."""
    ref = _cache(local_storage, "dmg", 40_000, 200, chunk_bytes=64 << 20)
    info = ref.manifest.chunks[0]
    with open(os.path.join(ref.directory, info.file), "rb") as f:
        data = bytearray(f.read())
    rng = np.random.default_rng(0)
    for trial in range(30):
        copy = bytearray(data)
        page = int(rng.integers(2, len(data) // 4096))
        copy[page * 4096 + int(rng.integers(0, 4096))] ^= 0xFF
        path = os.path.join(ref.directory, f"damaged-{trial}")
        with open(path, "wb") as f:
            f.write(copy)
        fd = os.open(path, os.O_RDONLY)
        try:
            pages = page_map(fd, info.records)
            if pages is not None:
                offsets, lengths = pages.spans(np.arange(info.records))
                assert (offsets >= 0).all() and (offsets + lengths <= len(copy) + 4096).all()
        finally:
            os.close(fd)
            os.remove(path)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("size", [200, 50_000])
def test_read_ahead_changes_nothing_that_is_read(local_storage, monkeypatch, shuffle, size):
    """The same items with read-ahead as without (small and big records, shuffled or not,
    records and batches), and the thread stops with the DataRef."""
    import yogadl_plus.cache.readahead as readahead_module
    import yogadl_plus.stream.units as units_module

    monkeypatch.setattr(readahead_module, "MIN_RECORD_BYTES", 0)
    others = {t for t in threading.enumerate() if t.name == "yogadl-readahead"}
    ref = _cache(local_storage, f"same{size}", 400, size)
    assert ref.stream().plan().sizes.read_ahead > 0
    with_ahead = [r["y"] for r in ref.stream(shuffle=shuffle, shuffle_seed=3)]
    batches = [b["x"].copy() for b in ref.stream(shuffle=shuffle, shuffle_seed=3, batch_size=64)]
    monkeypatch.setattr(units_module, "READ_AHEAD_BYTES", 0)
    plain = ref.stream(shuffle=shuffle, shuffle_seed=3)
    assert plain.plan().sizes.read_ahead == 0
    assert [r["y"] for r in plain] == with_ahead
    for got, want in zip(ref.stream(shuffle=shuffle, shuffle_seed=3, batch_size=64), batches):
        np.testing.assert_array_equal(got["x"], want)
    ref.close()
    del plain, ref
    gc.collect()
    deadline = time.monotonic() + 5  # idle threads of collected DataRefs end within a second
    while {t for t in threading.enumerate() if t.name == "yogadl-readahead"} - others:
        assert time.monotonic() < deadline, "a read-ahead thread outlived its DataRef"
        time.sleep(0.05)


def test_a_damaged_chunk_is_still_refused_with_read_ahead(local_storage):
    """Read-ahead reads pages into the cache, never past the checks: a chunk with a flipped
    byte is CacheCorrupted before any record of it is served."""
    ref = _cache(local_storage, "flip", 300, 20_000)
    info = ref.manifest.chunks[1]
    path = os.path.join(ref.directory, info.file)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0x01
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(data)
    fresh = local_storage.fetch("ra", "flip")
    with pytest.raises(ydl.CacheCorrupted, match=info.file):
        for _ in fresh.stream():
            pass


def test_recycled_arrays_are_reused_only_when_nothing_refers_to_them():
    recycler = ArrayRecycler()
    shape = (RECYCLED_BYTES // 1024, 1024)
    first = recycler.empty(shape, np.uint8)
    address = first.ctypes.data
    view = first[10:20]
    del first
    second = recycler.empty(shape, np.uint8)  # the first is still seen through ``view``
    assert not np.shares_memory(second, view)
    del view
    third = recycler.empty((shape[0] // 4, 1024), np.float32)  # the same bytes, now free
    assert third.ctypes.data == address and third.dtype == np.float32
    assert not np.shares_memory(second, third)
    assert recycler.empty((10,), np.float32).shape == (10,)  # small: plain np.empty
    recycler.clear()
    assert recycler.empty(shape, np.uint8).ctypes.data != address or sys.getrefcount(third) > 1


def test_big_batches_kept_by_the_caller_are_never_overwritten(local_storage):
    """Batches past the recycling size: a batch the caller keeps (or a torch tensor over it)
    keeps its contents while later batches reuse the memory of dropped ones."""
    torch = pytest.importorskip("torch")
    ref = _cache(local_storage, "keep", 96, 400_000, chunk_bytes=16 << 20)
    stream = ref.stream(batch_size=96, shuffle=True, shuffle_seed=1)
    kept, tensors, seen = [], [], []
    for epoch in range(8):
        for batch in stream:
            assert batch["x"].nbytes >= RECYCLED_BYTES
            expected = (batch["y"] % 251).astype(np.uint8)
            np.testing.assert_array_equal(batch["x"][:, 0], expected)
            np.testing.assert_array_equal(batch["x"][:, -1], expected)
            seen.append(batch["x"].ctypes.data)
            if epoch == 0:
                kept.append((batch["x"], expected))
            elif epoch == 1:
                tensors.append((torch.from_numpy(batch["x"]), expected))
    assert len(set(seen[2:])) < len(seen[2:])  # memory of dropped batches was reused
    for array, expected in kept:
        np.testing.assert_array_equal(array[:, 0], expected)
    for tensor, expected in tensors:
        np.testing.assert_array_equal(tensor.numpy()[:, 5], expected)


def test_big_record_mode_reads_in_small_blocks(local_storage):
    """Record by record, big records come in blocks of a few MiB (not 512 records), and a
    record kept by the caller is right after many more were read."""
    ref = _cache(local_storage, "blocks", 200, 300_000, chunk_bytes=32 << 20)
    stream = ref.stream(shuffle=True, shuffle_seed=2)
    assert stream.plan().sizes.read_block < 32
    records = list(stream)
    for r in records:
        assert (r["x"] == r["y"] % 251).all()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_waits_for_the_hint_being_served(local_storage, monkeypatch):
    """A process forked while the read-ahead thread serves a hint must not inherit a lock that
    thread holds (numpy's lazy import of numpy.ma under np.unique hung forked stream workers):
    the fork waits until the hint is served."""
    import yogadl_plus.cache.readahead as readahead_module

    held = threading.Lock()  # stands for the import lock the thread takes
    serving = threading.Event()
    served = readahead_module.ReadAhead._serve

    def slow_serve(self, indices):
        with held:
            serving.set()
            time.sleep(0.5)
            served(self, indices)

    monkeypatch.setattr(readahead_module.ReadAhead, "_serve", slow_serve)
    ref = _cache(local_storage, "fork", 50, 20_000)
    ref.read_ahead(np.arange(10))
    assert serving.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: the lock must be free here
        os._exit(0 if held.acquire(timeout=2) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    ref.close()


def test_no_read_ahead_thread_outlives_the_exit_handlers(local_storage):
    # A daemon thread still in an extension when Python finalizes can abort the process
    # ("terminate called without an active exception", seen once in CI): the read-ahead
    # threads end while the exit handlers run. The check is an exit handler registered before
    # yogadl_plus is imported, so it runs after ours.
    import subprocess

    ydl.cache_dataset(
        ({"x": np.zeros(64, np.float32)} for _ in range(50_000)),
        "d",
        "v",
        local_storage,
        chunk_bytes=1_000_000,
        progress=False,
    )
    code = (
        "import atexit, threading\n"
        "def check():\n"
        "    names = [t.name for t in threading.enumerate()]\n"
        "    print('alive' if 'yogadl-readahead' in names else 'ended', flush=True)\n"
        "atexit.register(check)\n"
        "import sys, numpy as np, yogadl_plus as ydl\n"
        "ref = ydl.LocalStorage(sys.argv[1]).fetch('d', 'v')\n"
        "ref.read_ahead(np.random.default_rng(0).integers(0, len(ref), 3_000_000))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(local_storage.root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ended\n", result.stdout


def test_big_batches_copied_by_two_threads_hold_every_record_whole(local_storage):
    """A batch past rowcopy.PARALLEL_BYTES is copied half by a helper thread: every byte of
    every row is its own record's, in both halves."""
    from yogadl_plus.cache.rowcopy import PARALLEL_BYTES

    ref = _cache(local_storage, "halves", 64, 300_000, chunk_bytes=8 << 20)
    stream = ref.stream(batch_size=61, shuffle=True, shuffle_seed=4)
    batch = next(iter(stream))
    assert batch["x"].nbytes >= PARALLEL_BYTES
    assert "yogadl-plus-copy" in "".join(t.name for t in threading.enumerate())
    for row, y in zip(batch["x"], batch["y"]):
        np.testing.assert_array_equal(row, ref[int(y)]["x"])
        assert (row == y % 251).all()


@pytest.mark.parametrize("rows", [4, 64], ids=["one thread", "two threads"])
def test_a_record_of_the_wrong_size_is_refused_before_a_byte_is_copied(local_storage, rows):
    """Values whose length does not match the stored layout are CacheCorrupted naming the
    field, whichever way the batch is copied."""
    ref = _cache(local_storage, f"sizes{rows}", rows, 300_000, chunk_bytes=8 << 20)
    values = [bytes(ref.read_values(np.array([i]))[0]) for i in range(rows)]
    values[rows // 2 + 1] = values[rows // 2 + 1][:-1]
    with pytest.raises(ydl.CacheCorrupted, match="field 'x': a record of 300007 bytes"):
        ref.layout.decode_columns(values, ref.select(["x"]))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_copies_big_batches_with_its_own_helper(local_storage):
    """A child forked after the parent copied a big batch has the parent's pool object but
    not its thread: it makes its own helper instead of waiting on one that is not there."""
    import multiprocessing

    ref = _cache(local_storage, "forked", 64, 300_000, chunk_bytes=8 << 20)
    stream = ref.stream(batch_size=64)
    next(iter(stream))  # the parent's helper exists now

    def child(queue):
        batch = next(iter(ref.stream(batch_size=64)))
        queue.put(bool((batch["x"][:, 7] == batch["y"] % 251).all()))

    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    process.join(60)
    if process.is_alive():
        process.kill()
        pytest.fail("the forked child hung copying a big batch")
    assert queue.get(timeout=5) is True


def test_a_warm_version_looks_at_one_hint_per_sample_of_records(tmp_path, monkeypatch):
    """Once hints find everything in memory, one is looked at per _WARM_SAMPLE records hinted,
    whatever the hints' sizes (a mixture's sources each get a small hint per unit: counted in
    hints, they cost a mixture twice a plain stream's); a miss looks at every hint again."""
    import yogadl_plus.cache.readahead as readahead_module
    from yogadl_plus.cache.readahead import _WARM_SAMPLE, _WARM_STREAK, ReadAhead

    served: list[int] = []
    cold = threading.Event()

    def counted(self, indices):
        served.append(len(indices))
        self._resident_streak = 0 if cold.is_set() else self._resident_streak + 1

    monkeypatch.setattr(readahead_module.ReadAhead, "_serve", counted)
    ahead = ReadAhead(str(tmp_path), [], np.zeros(1, np.int64))

    def hint(count, size):
        for _ in range(count):
            ahead.hint(np.arange(size))
            deadline = time.monotonic() + 5
            while ahead._pending and time.monotonic() < deadline:  # one hint at a time
                time.sleep(0.001)
        time.sleep(0.01)

    try:
        hint(_WARM_STREAK, 256)
        assert len(served) == _WARM_STREAK  # cold so far: every hint looked at
        hint(4 * _WARM_SAMPLE // 256, 256)
        assert len(served) == _WARM_STREAK + 4
        hint(4 * _WARM_SAMPLE // 64, 64)  # smaller hints: no more looked at per record
        assert len(served) == _WARM_STREAK + 8
        cold.set()
        hint(_WARM_SAMPLE // 256, 256)  # the next one looked at misses...
        assert len(served) == _WARM_STREAK + 9
        hint(10, 256)  # ... and then every hint is looked at again
        assert len(served) == _WARM_STREAK + 19
    finally:
        ahead.close()


def _evicted_chunk(ref):
    """The path of ``ref``'s first chunk, its pages dropped from the page cache (no root
    needed: POSIX_FADV_DONTNEED drops a file's clean pages no process maps); skips where the
    file system keeps them (tmpfs)."""
    path = os.path.join(ref.directory, ref.manifest.chunks[0].file)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if _resident_share(path, 0, os.path.getsize(path)) > 0.5:
        pytest.skip("this file system keeps the pages of a file in memory")
    return path


def _resident_share(path, offset, length):
    """The share of the pages of ``path``'s bytes ``[offset, offset + length)`` that are in the
    page cache (mincore over a read-only map, which reads nothing)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    first = offset // page * page
    pages = (offset + length - first + page - 1) // page
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        address = np.frombuffer(m, np.uint8).ctypes.data + first
        vector = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        assert libc.mincore(address, pages * page, vector) == 0, ctypes.get_errno()
        return sum(v & 1 for v in vector) / pages


def _spans_of(path, records):
    """(first byte, end) of each record's value in a chunk file, from its page map."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pages = page_map(fd, records)
    finally:
        os.close(fd)
    assert pages is not None
    offsets, lengths = pages.spans(np.arange(records))
    return offsets, offsets + lengths


def _served(ahead, indices):
    """Hands ``indices`` to ``ahead`` and waits until its thread took them."""
    ahead.hint(indices)
    deadline = time.monotonic() + 5
    while ahead._pending and time.monotonic() < deadline:
        time.sleep(0.001)
    with ahead._busy:  # the hint taken is served
        pass


def _becomes_resident(path, start, end):
    """True once ``path``'s bytes ``[start, end)`` are all in the page cache (the hinted reads
    are done); False if they are not within 5 s."""
    deadline = time.monotonic() + 5
    while _resident_share(path, start, end - start) < 1.0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux page cache")
def test_a_hint_longer_than_the_kernel_reads_at_once_is_read_whole(local_storage):
    """One posix_fadvise(WILLNEED) reads at most the device's read-ahead size (128 KiB on many
    machines) and drops the rest: sequential records joined into one long range were read in
    part, the rest later 4 KiB at a time. Every byte of a hint is asked for."""
    from yogadl_plus.cache.readahead import ReadAhead

    ref = _cache(local_storage, "long", 48, 256 << 10, chunk_bytes=64 << 20)  # 12 MiB
    assert len(ref.manifest.chunks) == 1
    path = _evicted_chunk(ref)
    starts, ends = _spans_of(path, len(ref))
    ahead = ReadAhead(ref.directory, ref.manifest.chunks, np.array([0]))
    try:
        _served(ahead, np.arange(len(ref)))
        assert _becomes_resident(path, int(starts.min()), int(ends.max())), "read in part"
    finally:
        ahead.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux page cache")
@pytest.mark.parametrize("closed", [False, True], ids=["same stream", "after close"])
def test_hints_start_again_when_a_warm_version_goes_cold(local_storage, closed):
    """A version whose pages were in memory (so that hints were only sampled) and then left it
    (bigger than memory, or a page cache dropped between epochs) is hinted again within a few
    MiB of records, and from the first hint after ``close``: sampled once per 8192 records,
    big records were read unhinted for gigabytes."""
    from yogadl_plus.cache.readahead import _WARM_STREAK, ReadAhead

    ref = _cache(local_storage, f"cold{closed}", 64, 128 << 10, chunk_bytes=64 << 20)
    path = os.path.join(ref.directory, ref.manifest.chunks[0].file)
    with open(path, "rb") as f:  # in memory, read without a map (eviction skips mapped pages)
        f.read()
    starts, ends = _spans_of(path, len(ref))
    ahead = ReadAhead(ref.directory, ref.manifest.chunks, np.array([0]))
    try:
        for _ in range(_WARM_STREAK + 1):
            _served(ahead, np.arange(8))  # all in memory: the hints are only sampled now
        if closed:
            ahead.close()
        _evicted_chunk(ref)
        hinted = np.arange(8, 8 + (48 if not closed else 8))  # 6 MiB, or 1 MiB
        for block in np.split(hinted, len(hinted) // 8):
            _served(ahead, block)
        # A hint looked at asks for its records (the last few of them at least).
        last = hinted[-8:]
        assert _becomes_resident(path, int(starts[last].min()), int(ends[last].max())), (
            "the hints went unlooked-at"
        )
    finally:
        ahead.close()


def test_a_window_announced_in_many_small_hints_is_served_from_its_first(tmp_path, monkeypatch):
    """A stream hands over its whole read-ahead window before reading a record, a hint per
    unit: with batches of one that is a hundred hints at once. Hints waiting for the thread
    are served in order, the first ones first (only 16 were kept, the newest: the records read
    first were read unhinted, 4 KiB at a time)."""
    import yogadl_plus.cache.readahead as readahead_module
    from yogadl_plus.cache.readahead import ReadAhead

    served: list[int] = []
    monkeypatch.setattr(
        readahead_module.ReadAhead, "_serve", lambda self, indices: served.append(int(indices[0]))
    )
    ahead = ReadAhead(str(tmp_path), [], np.zeros(1, np.int64))
    try:
        with ahead._busy:  # the thread waits here with the first hint it took
            for first in range(128):
                ahead.hint(np.array([first]))
        deadline = time.monotonic() + 5
        while len(served) < 128 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert served == list(range(128))
    finally:
        ahead.close()
