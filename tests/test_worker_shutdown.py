"""Workers always stop, even in a transform that never returns: a program using them ends within
seconds on close(), on exit and on Ctrl-C, and its worker processes end within seconds of the
program being killed. Tried as a user meets it: a real program, really signalled."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

# A program that caches 2000 records, reads 10 items through workers whose transform never
# returns from record STUCK on (each worker process writes its pid to a file first), waits
# until both workers are stuck, prints "ready", then does ACTION.
PROGRAM = textwrap.dedent(
    """
    import os, sys, threading, time
    import numpy as np
    import yogadl_plus as ydl

    root, mode, action, stuck_from = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    records = ({"i": i, "x": np.zeros(256, np.float32)} for i in range(2000))
    ref = ydl.cache_dataset(records, "d", "v", ydl.LocalStorage(root), progress=False)

    def stuck(record):
        path = os.path.join(root, f"worker-{os.getpid()}")
        if not os.path.exists(path):
            open(path, "w").close()
        if int(record["i"]) >= stuck_from:
            open(os.path.join(root, f"stuck-{os.getpid()}-{threading.get_ident()}"), "w").close()
            threading.Event().wait()  # never returns
        return record

    if mode == "torch":
        # Batches of 64 KB: numpy arrays through the DataLoader's pipe fill it.
        stream = ref.stream(transform=stuck, batch_size=64)
        it = iter(ydl.torch.make_dataloader(stream, num_workers=2))
    else:
        stream = ref.stream(transform=stuck, num_workers=2, worker_type=mode)
        it = iter(stream)
    for _ in range(10):
        next(it)
    while stuck_from < len(ref) and len([f for f in os.listdir(root) if "stuck" in f]) < 2:
        time.sleep(0.01)  # until both workers are stuck
    # ... and until each worker process has begun (one may hand over ten batches alone).
    while len([f for f in os.listdir(root) if "worker-" in f]) < (1 if mode == "thread" else 2):
        time.sleep(0.01)
    print("ready", flush=True)
    if action == "close":
        stream.close()
        print("closed", flush=True)
    elif action == "exit":
        sys.exit(0)
    elif action == "abort":
        os._exit(0)
    else:
        for _ in it:  # waits on a unit that never ends: killed or interrupted here
            pass
    """
)

# Record stuck from: with process and thread workers, units of 32 then 512 records are read
# ahead, so the third and fourth (from 544) get stuck while the first ten records are taken;
# with torch, batch 12 on, two past the ten taken (a worker fetches two ahead).
STUCK = {"process": 1000, "thread": 1000, "torch": 12 * 64}


@pytest.fixture
def start(tmp_path):
    """Starts the program in ``tmp_path``; afterwards, whatever the test found, kills what is
    left of it (the program, and worker processes it left behind)."""
    started: list[subprocess.Popen] = []

    def run(mode: str, action: str, stuck_from: int | None = None) -> subprocess.Popen:
        if mode == "torch":
            pytest.importorskip("torch")
        stuck_from = STUCK[mode] if stuck_from is None else stuck_from
        # Output to files, not pipes: orphaned workers would hold a pipe open for ever.
        with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", PROGRAM, str(tmp_path), mode, action, str(stuck_from)],
                stdout=out,
                stderr=err,
                cwd=tmp_path,  # the installed yogadl_plus (or PYTHONPATH's), not the cwd's
                start_new_session=True,  # a Ctrl-C at the test runner's terminal is not for it
            )
        started.append(proc)
        deadline = time.monotonic() + 120
        while "ready" not in (tmp_path / "out").read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the program did not start:\n{(tmp_path / 'err').read_text()}")
            time.sleep(0.05)
        return proc

    yield run
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in worker_pids(tmp_path, expected=0):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def worker_pids(tmp_path, expected: int = 2, timeout: float = 20.0) -> list[int]:
    """The pids the workers wrote (each writes once, on its first record)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [int(p.rsplit("-", 1)[1]) for p in glob.glob(str(tmp_path / "worker-*"))]
        if len(pids) >= expected or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Running (a zombie left to a parent that does not reap it counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def still_alive_after(pids: list[int], timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def ends_within(proc: subprocess.Popen, tmp_path, timeout: float = 20.0) -> tuple[int | None, str]:
    """The program's exit status and stderr, or None if it had not ended by then."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    return proc.returncode, (tmp_path / "err").read_text()


@pytest.mark.parametrize("action", ["close", "exit", "sigint"])
def test_process_workers_stuck_in_a_transform_stop_with_the_program(start, tmp_path, action):
    proc = start("process", "wait" if action == "sigint" else action)
    pids = worker_pids(tmp_path)
    assert len(pids) == 2
    if action == "sigint":
        time.sleep(0.5)  # waiting for a stuck unit by now
        proc.send_signal(signal.SIGINT)  # Ctrl-C, to the program (its workers ignore it)
    status, err = ends_within(proc, tmp_path)
    assert status is not None, f"the program did not end within 20 s of {action}"
    if action == "sigint":
        assert "KeyboardInterrupt" in err
    else:
        assert status == 0, err
    assert still_alive_after(pids, 10.0) == [], "worker processes outlived the program"


@pytest.mark.crash
@pytest.mark.parametrize("mode", ["process", "torch"])
def test_workers_stuck_in_a_transform_end_when_the_program_is_killed(start, tmp_path, mode):
    proc = start(mode, "wait")
    pids = worker_pids(tmp_path)
    assert len(pids) == 2
    time.sleep(0.5)
    proc.kill()
    proc.wait()
    assert still_alive_after(pids) == [], "orphaned worker processes still run 20 s later"


def test_dataloader_workers_end_when_the_program_exits_abruptly(start, tmp_path):
    # Nothing stuck: the workers had filled their pipe with batches nobody will read.
    proc = start("torch", "abort", stuck_from=10**9)
    pids = worker_pids(tmp_path)
    assert len(pids) == 2
    status, err = ends_within(proc, tmp_path)
    assert status == 0, err
    assert still_alive_after(pids) == [], "DataLoader workers still run 20 s later"


@pytest.mark.parametrize("action", ["close", "exit", "sigint"])
def test_thread_workers_stuck_in_a_transform_do_not_hold_the_program(start, tmp_path, action):
    # Python cannot stop a thread: close() and exit leave it (a daemon thread) after the grace
    # period instead of waiting for it for ever, and close() says so.
    proc = start("thread", "wait" if action == "sigint" else action)
    if action == "sigint":
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
    status, err = ends_within(proc, tmp_path)
    assert status is not None, f"the program did not end within 20 s of {action}"
    if action == "close":
        assert status == 0 and "Python cannot stop a thread" in err, err
    elif action == "exit":
        assert status == 0, err
    else:
        assert "KeyboardInterrupt" in err
