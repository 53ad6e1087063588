"""Worker pools: same output as inline whatever the workers and timing, offsets that count what
was handed out, errors that name the record, and clean shutdown (no zombies, no leaked files)."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import yogadl_plus as ydl
from yogadl_plus.errors import TransformError

N = 600


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("workers"))
    records = ({"i": np.int64(i), "x": np.full(4, i, np.float32), "s": f"r{i}"} for i in range(N))
    return ydl.cache_dataset(records, "d", "v", storage, progress=False, chunk_bytes=8000)


def add_square(record):
    return {**record, "sq": int(record["i"]) ** 2}


def jittery(record):
    # Uneven per-record cost: later units may finish first.
    time.sleep(0.002 if int(record["i"]) % 7 == 0 else 0)
    return record


def fail_on_123(record):
    if int(record["i"]) == 123:
        raise ZeroDivisionError("boom")
    return record


def flatten(items):
    out = []
    for item in items:
        out.extend(int(i) for i in np.atleast_1d(item["i"]))
    return out


@pytest.mark.parametrize("worker_type", ["thread", "process"])
@pytest.mark.parametrize("batch_size", [None, 7])
def test_output_never_depends_on_workers(ref, worker_type, batch_size):
    args = dict(
        shuffle=True,
        shuffle_seed=3,
        num_shards=2,
        shard_rank=1,
        batch_size=batch_size,
        transform=add_square,
    )
    expected = list(ref.stream(**args))
    for workers in (1, 2, 3):
        stream = ref.stream(num_workers=workers, worker_type=worker_type, prefetch=3, **args)
        try:
            got = list(stream)
        finally:
            stream.close()
        assert flatten(got) == flatten(expected)
        sq = [int(v) for b in got for v in np.atleast_1d(b["sq"])]
        assert sq == [i * i for i in flatten(expected)]


def test_order_holds_under_uneven_timing(ref):
    stream = ref.stream(shuffle=True, shuffle_seed=1, transform=jittery, num_workers=4)
    assert flatten(stream) == flatten(ref.stream(shuffle=True, shuffle_seed=1))
    stream.close()


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_offset_counts_what_was_handed_out_not_prefetched(ref, worker_type):
    args = dict(shuffle=True, shuffle_seed=9)
    stream = ref.stream(num_workers=2, worker_type=worker_type, prefetch=8, **args)
    it = iter(stream)
    head = flatten(itertools.islice(it, 10))
    time.sleep(0.05)  # let the workers run ahead
    assert stream.offset == 10
    assert flatten(ref.stream(start_offset=10, **args))[:5] == flatten(itertools.islice(it, 5))
    stream.close()
    assert len(head) == 10


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_batches_with_workers_resume_exactly(ref, worker_type):
    args = dict(shuffle=True, shuffle_seed=2, batch_size=16)
    stream = ref.stream(num_workers=2, worker_type=worker_type, **args)
    it = iter(stream)
    next(it), next(it), next(it)
    resumed = ref.stream(start_offset=stream.offset, **args)
    assert flatten([next(iter(resumed))]) == flatten([next(it)])
    stream.close()


@pytest.mark.parametrize("worker_type", ["thread", "process"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_transform_names_the_record(ref, worker_type, workers):
    stream = ref.stream(transform=fail_on_123, num_workers=workers, worker_type=worker_type)
    with pytest.raises(TransformError, match="record 123: ZeroDivisionError: boom") as info:
        list(stream)
    stream.close()
    # The worker's own traceback comes along (as the cause chain).
    chain = []
    exc: BaseException | None = info.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__
    text = "".join(str(e) for e in chain)
    assert any(isinstance(e, ZeroDivisionError) for e in chain) or "fail_on_123" in text


_EARLIER: set[int] = set()


@pytest.fixture(autouse=True)
def _ignore_earlier_children():
    """Child processes started before a test (other suites' DataLoader workers that end when
    collected) are not this test's to count."""
    import gc

    gc.collect()
    _EARLIER.clear()
    _EARLIER.update(p.pid for p in multiprocessing.active_children())
    yield


def children() -> list[multiprocessing.process.BaseProcess]:
    """Child processes started by the current test that are still alive."""
    return [p for p in multiprocessing.active_children() if p.pid not in _EARLIER]


def test_processes_stop_on_close_and_restart_for_the_next_epoch(ref):
    assert children() == []
    stream = ref.stream(num_workers=2, worker_type="process")
    first = flatten(stream)
    assert len(children()) == 2
    stream.close()
    assert children() == []
    assert flatten(stream) == first  # the next epoch starts new workers
    stream.close()
    assert children() == []


def test_dropping_an_unfinished_iterator_and_the_stream_leaves_no_processes(ref):
    stream = ref.stream(num_workers=2, worker_type="process", prefetch=4)
    it = iter(stream)
    next(it)
    del it, stream
    import gc

    gc.collect()
    deadline = time.monotonic() + 10
    while children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children() == []


def test_no_file_handles_or_processes_grow_across_epochs(ref):
    stream = ref.stream(num_workers=2, worker_type="process", batch_size=50)
    list(stream)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        list(stream)
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert len(children()) == 2
    stream.close()


def test_keyboard_interrupt_in_the_loop_stops_cleanly(ref):
    stream = ref.stream(num_workers=2, worker_type="process")
    with pytest.raises(KeyboardInterrupt):
        for k, _ in enumerate(stream):
            if k == 20:
                raise KeyboardInterrupt
    stream.close()
    assert children() == []


SCRIPT = """
import sys, time, numpy as np, yogadl_plus as ydl
ref = ydl.cache_dataset(({{"i": i}} for i in range(5000)), "d", "v",
                        ydl.LocalStorage(sys.argv[1]), progress=False)
def slow(r):
    time.sleep(0.001)
    return r
stream = ref.stream(num_workers=2, worker_type="process", transform=slow)
for k, _ in enumerate(stream):
    if k == 50:
        print("ready", flush=True)
        {action}
"""


def run_script(tmp_path, action: str) -> subprocess.Popen:
    code = textwrap.dedent(SCRIPT.format(action=action))
    return subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def group_is_gone(pgid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)
    return False


def test_ctrl_c_ends_the_program_and_its_workers(tmp_path):
    proc = run_script(tmp_path, "time.sleep(60)")
    assert proc.stdout.readline().strip() == "ready"
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    _, err = proc.communicate(timeout=30)
    assert "KeyboardInterrupt" in err
    assert group_is_gone(proc.pid), "worker processes outlived the program"


def test_exiting_with_an_unfinished_stream_leaves_nothing_behind(tmp_path):
    proc = run_script(tmp_path, "sys.exit(0)")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert group_is_gone(proc.pid), "worker processes outlived the program"


def test_bad_worker_arguments(ref):
    with pytest.raises(ValueError, match="worker_type"):
        ref.stream(num_workers=1, worker_type="fiber")
    with pytest.raises(ValueError, match="num_workers"):
        ref.stream(num_workers=-1)
    with pytest.raises(ValueError, match="prefetch"):
        ref.stream(num_workers=1, prefetch=0)


@pytest.mark.crash
def test_a_worker_killed_mid_epoch_is_reported_and_the_stream_goes_on(ref):
    args = dict(shuffle=True, shuffle_seed=5, transform=jittery)
    stream = ref.stream(num_workers=2, worker_type="process", **args)
    it = iter(stream)
    got = flatten(itertools.islice(it, 5))
    os.kill(children()[0].pid, signal.SIGKILL)
    with pytest.raises(ydl.WorkerDied, match=r"resume from stream\.offset"):
        for item in it:
            got += flatten([item])
    # What was handed out is right, and resuming from the offset carries on exactly.
    expected = flatten(ref.stream(**args))
    assert got == expected[: len(got)]
    resumed = ref.stream(num_workers=2, worker_type="process", start_offset=stream.offset, **args)
    assert got + flatten(resumed) == expected
    resumed.close()
    stream.close()
    assert children() == []


def test_spawned_workers_give_the_same_stream(ref):
    args = dict(shuffle=True, shuffle_seed=8, transform=add_square, batch_size=32)
    stream = ref.stream(num_workers=2, worker_type="process", worker_start_method="spawn", **args)
    try:
        assert flatten(stream) == flatten(ref.stream(**args))
    finally:
        stream.close()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_memory_does_not_grow_across_epochs(ref, worker_type):
    stream = ref.stream(
        shuffle=True,
        shuffle_seed=1,
        transform=add_square,
        batch_size=20,
        num_workers=2,
        worker_type=worker_type,
    )
    for _ in range(3):
        list(stream)
    settled = rss_bytes()
    for _ in range(12):
        list(stream)
    stream.close()
    assert rss_bytes() - settled < 8 << 20, "memory grew across epochs"


# --- every worker failure is WorkerDied or TransformError, naming the records ---


def exit_at_123(record):
    if int(record["i"]) == 123:
        os._exit(3)
    return record


def lock_at_77(item):
    # A window is a dict of offsets; a record a dict of fields.
    first = item.get(0, item)
    return {**item, "lock": threading.Lock()} if int(first["i"]) == 77 else item


@pytest.fixture(scope="module")
def wide_ref(tmp_path_factory):
    """Records of 40 KB: without a transform, workers read units of about 1 MiB of records
    (several batches each), so the epoch of ``ref`` would be one unit; here it is 25."""
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("wide"))
    records = ({"i": np.int64(i), "x": np.full(10_000, i, np.float32)} for i in range(N))
    return ydl.cache_dataset(records, "d", "v", storage, progress=False)


@pytest.mark.crash
@pytest.mark.parametrize("transform", [None, add_square])
def test_a_worker_killed_while_batches_are_consumed_is_worker_died(wide_ref, transform):
    # Batches: the death is noticed when the next unit is handed to the pool as well as when a
    # result is awaited (before: a bare BrokenProcessPool from submit).
    ref = wide_ref
    args = dict(shuffle=True, shuffle_seed=6, batch_size=8, transform=transform)
    stream = ref.stream(num_workers=2, worker_type="process", **args)
    it = iter(stream)
    got = flatten(itertools.islice(it, 3))
    os.kill(children()[0].pid, signal.SIGKILL)
    time.sleep(0.5)  # the death is known before the next unit is handed out
    with pytest.raises(ydl.WorkerDied, match=r"killed by SIGKILL.*positions \d+ to \d+") as info:
        for batch in it:
            got += flatten([batch])
    assert "resume from stream.offset" in str(info.value)
    expected = flatten(ref.stream(**args))
    assert got == expected[: len(got)]
    assert got + flatten(ref.stream(start_offset=stream.offset, **args)) == expected
    stream.close()
    assert children() == []


def test_a_worker_that_exits_in_the_transform_names_the_records_it_held(ref):
    stream = ref.stream(num_workers=2, worker_type="process", transform=exit_at_123, batch_size=7)
    with pytest.raises(
        ydl.WorkerDied, match=r"exit status 3.*records 119, 120, 121, 122, 123, 124, 125\)"
    ):
        list(stream)
    stream.close()


def big_and_exit_at_13(record):
    """Unit 0 (records 0-3) is slow; every result is a MiB of bytes, pickled through the pipe;
    the worker on records 12-15 (unit 3, the second worker's second unit) dies there."""
    i = int(record["i"])
    if i == 0:
        time.sleep(1.0)
    if i == 13:
        os._exit(3)
    return {"i": i, "blob": bytes(300_000)}


@pytest.mark.crash
def test_a_worker_that_dies_with_a_result_unsent_names_the_unit_it_was_on(ref):
    # The second worker finishes unit 1, but the parent, waiting on the slow unit 0, does not
    # read its pipe: the result (a MiB) is still being sent when the worker goes on to unit 3
    # and dies in it. What it died in is unit 3, though the unit awaited from it is unit 1.
    stream = ref.stream(num_workers=2, worker_type="process", transform=big_and_exit_at_13,
                        batch_size=4, prefetch=4)  # fmt: skip
    with pytest.raises(
        ydl.WorkerDied, match=r"exit status 3\) while on positions 12 to 15 .*records 12, 13, 14"
    ):
        list(stream)
    stream.close()


@pytest.mark.parametrize("batch_size", [None, 7])
@pytest.mark.parametrize("windows", [False, True])
def test_an_unpicklable_result_is_a_transform_error_naming_the_record(ref, batch_size, windows):
    what = "record"
    args: dict = dict(batch_size=batch_size, transform=lock_at_77)
    if windows:
        args["ngram"] = ydl.NGram({0: ["i"], 1: ["i"]}, delta_threshold=1, timestamp_field="i")
        what = "window anchored at record"
    stream = ref.stream(num_workers=2, worker_type="process", **args)
    with pytest.raises(TransformError, match=rf"result for {what} 77 cannot be sent back .*lock"):
        list(stream)
    stream.close()


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_closing_while_iterating_goes_on_with_new_workers(ref, worker_type):
    args = dict(shuffle=True, shuffle_seed=4, transform=add_square, batch_size=10)
    stream = ref.stream(num_workers=2, worker_type=worker_type, **args)
    it = iter(stream)
    got = flatten(itertools.islice(it, 4))
    stream.close()
    got += flatten(it)
    stream.close()
    assert got == flatten(ref.stream(**args))


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_a_stream_copied_into_a_forked_child_runs_workers_of_its_own(ref, worker_type):
    # As in a DataLoader worker forked while the stream's workers run: the child's copy must
    # neither use nor stop its parent's workers (before: the child waited for ever).
    args = dict(shuffle=True, shuffle_seed=3, batch_size=20, transform=add_square)
    stream = ref.stream(num_workers=2, worker_type=worker_type, **args)
    it = iter(stream)
    first = flatten(itertools.islice(it, 2))
    expected = flatten(ref.stream(**args))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the next epoch, with workers of its own; says if it was right
        try:
            ok = flatten(stream) == flatten(ref.stream(start_offset=len(ref), **args))
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 60
    while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    if time.monotonic() >= deadline:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    verdict = os.read(read, 1)
    os.close(read)
    assert verdict == b"1", "the forked child's epoch was wrong or never ended"
    # The parent's workers were left alone: its epoch goes on.
    assert first + flatten(it) == expected
    stream.close()


FAULTS = """
import resource, sys, numpy as np
from yogadl_plus.stream.workers.child import keep_freed_memory
if sys.argv[1] == "keep":
    keep_freed_memory()
values = [bytes(98312) for _ in range(256)]  # a batch of 96 KiB records, decoded as a worker does
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = bytearray().join(values)
    rows = np.frombuffer(buffer, np.uint8).reshape(256, 98312)
    batch = np.ascontiguousarray(rows[:, :98304])
    del buffer, rows, batch  # handed over: freed before the next one is made
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(max(faults[1:]))
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc's allocator",
)
def test_a_worker_reuses_the_memory_each_result_frees():
    # With glibc's defaults each 24 MB batch freed went back to the system, and the next one
    # faulted its 6,000 pages in again (3x the cost of decoding it).
    def faults(mode: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True
        )
        return int(done.stdout)

    assert faults("plain") > 3000, "the allocator no longer gives pages back: test is moot"
    assert faults("keep") < 300
