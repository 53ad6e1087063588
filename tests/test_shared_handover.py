"""Worker processes hand large results over in shared memory (a ring per worker), not pickled
through a pipe: same items, never overwritten while held, bounded, and nothing left behind
(no /dev/shm entries, no mappings) on close, on a worker's SIGKILL or at exit."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import yogadl_plus as ydl
from yogadl_plus.stream.workers.ring import MIN_SHARED, SharedRing

pytestmark = pytest.mark.skipif(
    not hasattr(os, "memfd_create"), reason="shared rings need memfd (Linux)"
)

N = 240
WIDTH = 8192  # 16 records are MIN_SHARED bytes: every block and batch of 16+ goes in a ring


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("handover"))
    records = (
        {"i": np.int64(i), "x": np.full(WIDTH, i % 251, np.uint8), "s": f"r{i}"} for i in range(N)
    )
    return ydl.cache_dataset(records, "d", "v", storage, progress=False, chunk_bytes=600_000)


def ring_mappings() -> list[str]:
    """This process's mappings of shared rings (from /proc/self/maps)."""
    with open("/proc/self/maps") as f:
        return [line for line in f if "yogadl_plus-ring" in line]


def in_a_ring(array: np.ndarray) -> bool:
    """Whether ``array``'s memory lies in one of this process's shared rings."""
    address = array.__array_interface__["data"][0]
    for line in ring_mappings():
        start, stop = (int(a, 16) for a in line.split()[0].split("-"))
        if start <= address < stop:
            return True
    return False


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def ids(items) -> list[int]:
    return [int(i) for item in items for i in np.atleast_1d(np.asarray(item["i"]))]


def check_rows(batch) -> None:
    """Each record's big field still holds its own value (i % 251)."""
    x = np.asarray(batch["x"]).reshape(-1, WIDTH)
    i = np.atleast_1d(np.asarray(batch["i"]))
    assert (x == (i % 251).astype(np.uint8)[:, None]).all()


# --- the ring itself ---


def _pack_into(ring: SharedRing, conn, values: list[int]) -> None:
    for v in values:
        conn.send(ring.pack({"a": np.full((256, 1024), v, np.uint8), "b": np.arange(3)}))
    conn.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_result_crosses_in_the_ring_and_its_part_is_freed_when_dropped(method):
    ring = SharedRing.create()
    assert ring is not None
    context = multiprocessing.get_context(method)
    here, there = context.Pipe()
    worker = context.Process(target=_pack_into, args=(ring, there, [1, 2, 3]))
    worker.start()
    there.close()
    got = [ring.unpack(here.recv()) for _ in range(3)]
    worker.join(30)
    assert [int(g["a"][5, 5]) for g in got] == [1, 2, 3] and (got[2]["b"] == [0, 1, 2]).all()
    assert all(in_a_ring(g["a"]) and not in_a_ring(g["b"]) for g in got), "small stays in band"
    assert got[0]["a"].flags.writeable and got[0]["a"].shape == (256, 1024)
    assert sorted(ring.held()) == [0, 1, 2]
    view = got[1]["a"][3]  # a view keeps its part held
    del got
    gc.collect()
    assert ring.held() == [1]
    del view
    assert ring.held() == []


def test_a_held_part_is_never_written_again_and_a_full_ring_falls_back():
    ring = SharedRing.create(capacity=4096 + 4 * MIN_SHARED)
    assert ring is not None
    held = [ring.unpack(ring.pack(np.full(MIN_SHARED, v, np.uint8))) for v in range(4)]
    assert not ring.pack(np.zeros(MIN_SHARED, np.uint8)).shared, "full: all in the pickle"
    del held[1]
    again = ring.unpack(ring.pack(np.full(MIN_SHARED, 9, np.uint8)))
    assert [int(h[0]) for h in held] == [0, 2, 3] and int(again[-1]) == 9
    small = ring.pack(np.full(MIN_SHARED // 2, 5, np.uint8))
    assert not small.shared and int(ring.unpack(small)[-1]) == 5, "small: all in the pickle"


def test_readonly_arrays_stay_readonly():
    ring = SharedRing.create()
    assert ring is not None
    frozen = np.arange(1 << 15, dtype=np.int32)
    frozen.flags.writeable = False
    out = ring.unpack(ring.pack({"f": frozen, "w": frozen.copy()}))
    assert not out["f"].flags.writeable and out["w"].flags.writeable
    assert (out["f"] == frozen).all()


def _pack_made(ring: SharedRing, conn) -> None:
    # A worker whose decoder makes its arrays in the ring (empty), then hands them over.
    kept = []
    while (request := conn.recv()) is not None:
        value, keep = request
        batch = ring.empty((32, 8192), np.uint8)
        batch[:] = value
        conn.send((ring.pack({"x": batch, "n": value}), batch.__array_interface__["data"][0]))
        if keep:
            kept.append(batch)  # the worker itself still holds this one
        del batch
    conn.send([int(b[0, 0]) for b in kept])


def test_arrays_made_in_the_ring_are_handed_over_without_a_copy():
    ring = SharedRing.create()
    assert ring is not None
    context = multiprocessing.get_context("fork")
    here, there = context.Pipe()
    worker = context.Process(target=_pack_made, args=(ring, there))
    worker.start()

    def ask(value: int, keep: bool = False):
        here.send((value, keep))
        packed, address = here.recv()
        out = ring.unpack(packed)
        assert int(out["x"][31, 8191]) == value and out["n"] == value
        return out, address, packed

    first, address, packed = ask(1)
    assert len(packed.parts) == 1, "the array made there needs no other part"
    # A forked worker maps the ring where this process does: the very same bytes, no copy.
    assert first["x"].__array_interface__["data"][0] == address
    second, _, _ = ask(2)  # the first is still held here: another part
    assert int(first["x"][0, 0]) == 1
    del first
    third, _, _ = ask(3)  # the first's part is free again: reused, the second untouched
    assert int(second["x"][0, 0]) == 2
    kept, _, _ = ask(4, keep=True)
    del kept  # freed here, but the worker still holds it: never written over
    for value in range(5, 9):
        ask(value)
    here.send(None)
    assert here.recv() == [4], "the worker's own array was written over"
    worker.join(30)
    assert (third["x"] == 3).all() and (second["x"] == 2).all()


def test_an_array_made_in_the_ring_and_dropped_unsent_frees_its_part():
    ring = SharedRing.create(capacity=4096 + (256 << 10))
    assert ring is not None
    batch = ring.empty((256, 1024), np.uint8)
    assert in_a_ring(batch)
    assert not in_a_ring(ring.empty((256, 1024), np.uint8)), "full: an ordinary array"
    del batch
    again = ring.empty((256, 1024), np.uint8)
    assert in_a_ring(again)
    small = ring.empty((10,), np.float32)
    assert not in_a_ring(small) and small.shape == (10,)
    # Handed over twice: the second time it is copied (the part is the reader's by then).
    ring.unpack(ring.pack(again))
    twice = ring.pack(again)
    assert not twice.shared, "no room left for a copy: all in the pickle"


def _try_pack(ring: SharedRing, conn) -> None:
    conn.send(ring.pack(np.zeros(1 << 20, np.uint8)).shared)


def test_one_process_writes_a_ring_at_a_time():
    ring = SharedRing.create()
    assert ring is not None
    context = multiprocessing.get_context("fork")
    first = ring.pack(np.zeros(1 << 20, np.uint8))  # this process now holds the ring
    assert first.shared
    here, there = context.Pipe()
    other = context.Process(target=_try_pack, args=(ring, there))
    other.start()
    assert here.recv() is False, "a second writer must keep out of the ring"
    other.join(30)
    ring.discard(first)


def _pack_on_request(ring: SharedRing, conn) -> None:
    while (value := conn.recv()) is not None:
        conn.send(ring.pack(np.full(1 << 17, value, np.uint8)))


def test_what_the_parent_held_at_a_fork_stays_intact_in_the_child():
    # The writer is a forked worker; this process reads, holds an array, forks a child, then
    # drops the array: the worker must not write over what the child still sees.
    ring = SharedRing.create()
    assert ring is not None
    context = multiprocessing.get_context("fork")
    here, there = context.Pipe()
    worker = context.Process(target=_pack_on_request, args=(ring, there))
    worker.start()
    here.send(7)
    held = ring.unpack(here.recv())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write)
        os.read(read, 1)  # until the parent has let go and the worker wrote more
        os._exit(0 if (held == 7).all() else 1)
    os.close(read)
    del held
    for _ in range(3):
        here.send(8)
        assert int(ring.unpack(here.recv())[0]) == 8  # each dropped at once
    here.send(None)
    worker.join(30)
    os.write(write, b"x")
    os.close(write)
    assert os.waitpid(pid, 0)[1] == 0, "the forked child saw the held array change"


# --- stream process workers ---


@pytest.mark.parametrize("batch_size", [None, 16, 40])
def test_stream_workers_hand_blocks_over_in_their_rings(ref, batch_size):
    args = dict(shuffle=True, shuffle_seed=3, batch_size=batch_size)
    stream = ref.stream(num_workers=2, worker_type="process", **args)
    try:
        got = list(stream)
        assert ids(got) == ids(ref.stream(**args))
        for item in got:
            check_rows(item)
        assert sum(in_a_ring(item["x"]) for item in got) > len(got) // 2, "not in a ring"
        assert got[0]["s"] == next(iter(ref.stream(**args)))["s"]
    finally:
        stream.close()


def test_items_held_across_a_whole_epoch_stay_right(ref):
    # Holding everything fills the rings: the rest crosses through the pipes, nothing is
    # overwritten.
    from yogadl_plus.stream.workers import ring as shared_buffers

    args = dict(shuffle=True, shuffle_seed=5, batch_size=16)
    capacity = shared_buffers.RING_BYTES
    # Room for a bit less than half the epoch per worker (whatever the workers' units of
    # whole batches are): the two rings cannot hold it all.
    shared_buffers.RING_BYTES = 4096 + (N // 2) * WIDTH
    try:
        stream = ref.stream(num_workers=2, worker_type="process", **args)
        held = list(stream)
    finally:
        shared_buffers.RING_BYTES = capacity
    stream.close()
    assert ids(held) == ids(ref.stream(**args))
    for batch in held:
        check_rows(batch)
    assert 0 < sum(in_a_ring(b["x"]) for b in held) < len(held)


def test_rings_are_unmapped_once_closed_and_dropped(ref):
    before = len(ring_mappings())
    stream = ref.stream(num_workers=2, worker_type="process", batch_size=32)
    for _ in range(3):
        assert len(ids(stream)) == N
    assert len(ring_mappings()) == before + 2, "one ring per worker, kept across epochs"
    stream.close()
    gc.collect()
    assert len(ring_mappings()) == before


def _children() -> list[int]:
    return [p.pid for p in multiprocessing.active_children()]


@pytest.mark.crash
def test_a_worker_killed_mid_epoch_is_worker_died_and_leaves_nothing(ref):
    shm = shm_entries()
    gc.collect()
    before = len(ring_mappings())
    earlier = set(_children())
    args = dict(shuffle=True, shuffle_seed=6, batch_size=16)
    stream = ref.stream(num_workers=2, worker_type="process", **args)
    it = iter(stream)
    got = list(itertools.islice(it, 3))
    assert any(in_a_ring(b["x"]) for b in got)
    os.kill(next(p for p in _children() if p not in earlier), signal.SIGKILL)
    with pytest.raises(ydl.WorkerDied, match="killed by SIGKILL"):
        for batch in it:
            got.append(batch)
    expected = ids(ref.stream(**args))
    assert ids(got) == expected[: len(ids(got))]
    for batch in got:
        check_rows(batch)  # what was handed out before the death is intact
    assert ids(got) + ids(ref.stream(start_offset=stream.offset, **args)) == expected
    stream.close()
    del got, batch, it, stream
    gc.collect()
    assert len(ring_mappings()) == before
    assert shm_entries() <= shm, "left in /dev/shm"


EXIT_SCRIPT = """
import os, sys, numpy as np, yogadl_plus as ydl
ref = ydl.cache_dataset(({{"x": np.full(8192, i % 200, np.uint8)}} for i in range(400)), "d", "v",
                        ydl.LocalStorage(sys.argv[1]), progress=False)
stream = {make}
held = [b for _, b in zip(range(3), stream)]
print(sum(1 for line in open("/proc/self/maps") if "yogadl_plus-ring" in line), flush=True)
{action}
"""


@pytest.mark.crash
@pytest.mark.parametrize(
    "make",
    [
        'ref.stream(batch_size=32, num_workers=2, worker_type="process")',
        "ydl.torch.make_dataloader(ref.stream(batch_size=32), num_workers=2)",
    ],
)
@pytest.mark.parametrize("action", ["sys.exit(0)", "os._exit(0)", "os.kill(os.getpid(), 9)"])
def test_the_program_ending_any_way_leaves_nothing(tmp_path, make, action):
    if "torch" in make:
        pytest.importorskip("torch")
    shm = shm_entries()
    code = textwrap.dedent(EXIT_SCRIPT.format(make=make, action=action))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the workers are found by it
    )
    out, err = proc.communicate(timeout=120)
    assert out.strip().splitlines()[:1] == ["2"], err  # a ring per worker
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("worker processes outlived the program")
    assert shm_entries() <= shm, "left in /dev/shm"


# --- the torch loader ---


@pytest.mark.parametrize(
    "workers, persistent, context",
    [(2, False, None), (2, True, None), pytest.param(1, False, "spawn", marks=pytest.mark.slow)],
)
def test_loader_batches_come_from_the_rings_as_tensors(ref, workers, persistent, context):
    torch = pytest.importorskip("torch")
    args = dict(shuffle=True, shuffle_seed=2, batch_size=20, fields=["i", "x"])
    loader = ydl.torch.make_dataloader(
        ref.stream(**args),
        num_workers=workers,
        persistent_workers=persistent,
        multiprocessing_context=context,
    )
    for epoch in range(2):
        got = list(loader)
        expected = list(ref.stream(start_offset=epoch * N, **args))
        assert ids(got) == ids(expected)
        assert isinstance(got[0]["x"], torch.Tensor) and got[0]["x"].dtype == torch.uint8
        for batch in got:
            check_rows({k: v.numpy() for k, v in batch.items()})
        assert sum(in_a_ring(b["x"].numpy()) for b in got) > len(got) // 2


def test_epochs_left_early_leave_no_ring_parts_behind(ref):
    # Before: persistent workers are reset for each epoch and DataLoader drops, unread, what
    # they had sent: those results' ring parts were never freed. A loop that leaves each epoch
    # early (a step cap) filled the rings, and from then on every batch was pickled whole.
    pytest.importorskip("torch")
    args = dict(shuffle=True, shuffle_seed=1, batch_size=16, fields=["i", "x"])
    loader = ydl.torch.make_dataloader(ref.stream(**args), num_workers=2)  # persistent
    for _ in range(150):  # about a part per worker per epoch: more than a ring's SLOTS
        for step, batch in enumerate(loader):
            check_rows({k: v.numpy() for k, v in batch.items()})
            if step == 1:
                break
    del batch
    whole = list(loader)
    for batch in whole:
        check_rows({k: v.numpy() for k, v in batch.items()})
    assert all(in_a_ring(b["x"].numpy()) for b in whole[1:])


def test_loader_groups_of_small_items_resume_exactly(ref):
    pytest.importorskip("torch")
    args = dict(shuffle=True, shuffle_seed=4, fields=["i", "s"])

    def make():
        return ydl.torch.make_dataloader(ref.stream(**args), num_workers=2)

    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(37)]  # inside the first group a worker handed over
    state = loader.state_dict()
    del it
    again = make()
    again.load_state_dict(state)
    rest = list(again)
    assert ids(head + rest) == ids(ref.stream(**args))
    assert rest[0]["s"] == f"r{ids(rest)[0]}"


def fail_on_77(record):
    if int(record["i"]) == 77:
        raise ZeroDivisionError("boom")
    return record


@pytest.mark.parametrize("batch_size", [None, 4])
def test_loader_hands_out_the_items_before_a_failing_one_then_its_error(ref, batch_size):
    pytest.importorskip("torch")
    stream = ref.stream(fields=["i"], transform=fail_on_77, batch_size=batch_size)
    loader = ydl.torch.make_dataloader(stream, num_workers=2)
    got = []
    with pytest.raises(ydl.TransformError, match="record 77: ZeroDivisionError: boom"):
        for item in loader:
            got.append(item)
    last = 77 if batch_size is None else 76
    assert ids(got) == list(range(last)), "each item before the failing one, and no other"
    assert loader.state_dict()["position"] == last


def test_loader_with_a_collate_fn_gets_it_per_item(ref):
    pytest.importorskip("torch")
    stream = ref.stream(fields=["i"], batch_size=10)
    loader = ydl.torch.make_dataloader(
        stream, num_workers=2, collate_fn=lambda b: {"i": list(b["i"] * 2)}
    )
    got = list(loader)
    assert [int(v) for b in got for v in b["i"]] == [2 * i for i in range(N)]


def slow(record):
    time.sleep(0.005)
    return record


@pytest.mark.crash
def test_loader_workers_killed_leave_nothing_behind(ref):
    torch = pytest.importorskip("torch")
    shm = shm_entries()
    gc.collect()
    before = len(ring_mappings())
    earlier = set(_children())
    stream = ref.stream(batch_size=16, transform=slow)  # the workers are still busy when killed
    loader = ydl.torch.make_dataloader(stream, num_workers=2, timeout=30)
    it = iter(loader)
    got = [next(it) for _ in range(3)]
    os.kill(next(p for p in _children() if p not in earlier), signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"killed by signal|exited unexpectedly"):
        for batch in it:
            got.append(batch)
    for batch in got:
        check_rows({k: v.numpy() for k, v in batch.items() if isinstance(v, torch.Tensor)})
    del got, batch, it, loader
    gc.collect()
    assert len(ring_mappings()) == before
    assert shm_entries() <= shm, "left in /dev/shm"


def test_a_ring_pickled_outside_a_process_start_is_the_same_memory():
    ring = SharedRing.create()
    assert ring is not None
    copy = pickle.loads(pickle.dumps(ring))  # its descriptor goes through the fd sharer
    out = copy.pack(np.full(1 << 17, 3, np.uint8))
    assert out.shared and int(ring.unpack(out)[-1]) == 3


def test_a_plan_decodes_into_the_allocator_it_is_given(ref):
    # What a worker process does with its ring: big decoded arrays are made there, and a plan
    # given none decodes as usual.
    ring = SharedRing.create()
    assert ring is not None
    # (One field of a MiB or more in all: decoded by one copy into an array made for it.)
    plan = ref.stream(batch_size=N, fields="x").plan()
    assert not in_a_ring(plan.read(0, 0, N).columns["x"])
    plan.decode_into(ring.empty)
    batch = plan.read(0, 0, N).columns
    assert in_a_ring(batch["x"])
    assert (batch["x"] == (np.arange(N) % 251).astype(np.uint8)[:, None]).all()
    plan.decode_into(None)
    assert not in_a_ring(plan.read(0, 0, N).columns["x"])
