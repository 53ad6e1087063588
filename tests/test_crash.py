"""Crash safety of LocalStorage: builders really killed with SIGKILL (docs/design.md#publishing:
a crash at any point leaves either no version or a whole one, never a poisoned one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import yogadl_plus as ydl

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

# The builder run in a child process: argv = root version n slow_after sleep seed overwrite marker
# chunk_bytes. Records 0..slow_after-1 come at once, later ones after `sleep` seconds each; the
# marker file appears when record `slow_after` is asked for. The records are ``record(i, seed)``.
CHILD = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    import yogadl_plus as ydl

    root, version = sys.argv[1], sys.argv[2]
    n, slow_after = int(sys.argv[3]), int(sys.argv[4])
    sleep, seed = float(sys.argv[5]), int(sys.argv[6])
    overwrite, marker, chunk_bytes = sys.argv[7] == "1", sys.argv[8], int(sys.argv[9])

    def records():
        for i in range(n):
            if i == slow_after:
                with open(marker + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.rename(marker + ".tmp", marker)
            if i >= slow_after:
                time.sleep(sleep)
            yield {
                "i": np.int64(i),
                "x": np.arange(4, dtype=np.float32) + np.float32(i + 1000 * seed),
                "s": f"rec-{seed}-{i}",
            }

    ydl.cache_dataset(records, "ds", version, ydl.LocalStorage(root), overwrite=overwrite,
                      progress=False, chunk_bytes=chunk_bytes)
    with open(marker + ".done", "w") as f:
        f.write("done")
    """
)

# Past the first block of records the build loop encodes and writes at once (4096), so a marker
# at this record means that chunks are already on disk in the staging folder.
MID_WRITE = 4200
BIG_N = 6000


def record(i: int, seed: int = 0) -> dict:
    return {
        "i": np.int64(i),
        "x": np.arange(4, dtype=np.float32) + np.float32(i + 1000 * seed),
        "s": f"rec-{seed}-{i}",
    }


def check_all(ref: ydl.DataRef, n: int, seed: int = 0) -> None:
    assert len(ref) == n
    batch = ref.get_batch(np.arange(n))
    np.testing.assert_array_equal(batch["i"], np.arange(n))
    want_x = np.arange(4, dtype=np.float32)[None, :] + (np.arange(n) + 1000 * seed)[:, None]
    np.testing.assert_array_equal(batch["x"], want_x.astype(np.float32))
    assert batch["s"] == [f"rec-{seed}-{i}" for i in range(n)]
    for i in (0, n // 2, n - 1):
        got = ref[i]
        assert int(got["i"]) == i and got["s"] == f"rec-{seed}-{i}"


class Source:
    """A fast source in the test process that counts how often it is read."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed, self.calls = n, seed, 0

    def __call__(self):
        self.calls += 1
        return (record(i, self.seed) for i in range(self.n))


class Builder:
    """A child process building ("ds", version) in ``root``; see CHILD."""

    def __init__(
        self,
        tmp_path: Path,
        root: str,
        version: str = "v1",
        *,
        n: int = BIG_N,
        slow_after: int = MID_WRITE,
        sleep: float = 0.05,
        seed: int = 1,
        overwrite: bool = False,
        chunk_bytes: int = 16384,
        name: str = "builder",
    ) -> None:
        self.marker = tmp_path / f"{name}.marker"
        self.done = tmp_path / f"{name}.marker.done"
        self.log_path = tmp_path / f"{name}.log"
        args = [root, version, n, slow_after, sleep, seed, int(overwrite), self.marker, chunk_bytes]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", CHILD, *map(str, args)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_marker(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.marker.exists():
            if self.proc.poll() is not None:
                pytest.fail(f"builder exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"builder never reached its marker:\n{self.log()}")
            time.sleep(0.01)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def assert_killed(self) -> None:
        assert self.proc.returncode == -signal.SIGKILL, self.log()
        assert not self.done.exists()


@pytest.fixture
def builders():
    """Every Builder made in a test is killed at its end, whatever happens."""
    made: list[Builder] = []
    yield made
    for b in made:
        b.kill()


def run_with_timeout(fn, timeout: float = 60):
    """fn() in a daemon thread; fails the test if it is still blocked after ``timeout``."""
    result: dict = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # pragma: no cover - re-raised below
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"still blocked after {timeout} s (a dead builder's lock not released?)")
    if "error" in result:
        raise result["error"]
    return result["value"]


def staging_entries(root: str, dataset_id: str = "ds") -> list[str]:
    folder = os.path.join(root, dataset_id)
    if not os.path.isdir(folder):
        return []
    return sorted(e for e in os.listdir(folder) if e.startswith(("+staging.", "+trash.")))


def chunk_files_in_staging(root: str) -> list[Path]:
    found = []
    for entry in staging_entries(root):
        found.extend((Path(root) / "ds" / entry).glob("chunk-*.mdb"))
    return found


def assert_no_version(storage: ydl.LocalStorage, version: str = "v1") -> None:
    assert ("ds", version) not in storage.list()
    with pytest.raises(ydl.DatasetNotFound):
        storage.fetch("ds", version)
    with pytest.raises(ydl.DatasetNotFound):
        storage.verify("ds", version)


def assert_clean_rebuild(storage: ydl.LocalStorage, version: str = "v1", n: int = 500) -> None:
    """A new build in this process is not blocked, reads its source once and is whole."""
    source = Source(n, seed=7)
    ref = run_with_timeout(
        lambda: ydl.cache_dataset(source, "ds", version, storage, progress=False)
    )
    assert source.calls == 1
    check_all(ref, n, seed=7)
    ref.close()
    assert ("ds", version) in storage.list()
    storage.verify("ds", version)
    check_all(storage.fetch("ds", version), n, seed=7)
    assert staging_entries(storage.root) == []


@pytest.fixture
def storage(tmp_path) -> ydl.LocalStorage:
    return ydl.LocalStorage(tmp_path / "store")


# --- killed builders ---------------------------------------------------------------------------


def test_killed_mid_write_leaves_no_version(tmp_path, storage, builders):
    b = Builder(tmp_path, storage.root)
    builders.append(b)
    b.wait_marker()
    # Really mid-write: chunks with data are in the staging folder, no version yet.
    chunks = chunk_files_in_staging(storage.root)
    assert chunks and all(c.stat().st_size > 0 for c in chunks), staging_entries(storage.root)
    assert len(chunks) >= 2
    assert storage.list() == []
    b.kill()
    b.assert_killed()
    assert staging_entries(storage.root)  # the dead builder's leftovers are still there
    assert_no_version(storage)
    assert_clean_rebuild(storage)


def test_killed_holding_the_lock_before_writing(tmp_path, storage, builders):
    b = Builder(tmp_path, storage.root, slow_after=0, sleep=1.0)
    builders.append(b)
    b.wait_marker()  # inside the lock, staging folder made, nothing written yet
    assert staging_entries(storage.root)
    b.kill()
    b.assert_killed()
    assert_no_version(storage)
    assert_clean_rebuild(storage)


def test_killed_right_after_start(tmp_path, storage, builders):
    b = Builder(tmp_path, storage.root)
    builders.append(b)
    b.kill()
    b.assert_killed()
    assert_no_version(storage)
    assert_clean_rebuild(storage)


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.6, 0.9, 1.3])
def test_killed_after_a_delay(tmp_path, storage, builders, delay):
    # Fast up to MID_WRITE, then slow for minutes: the kill lands during start-up, import,
    # locking, writing the first block, or the slow part, never after the publish.
    b = Builder(tmp_path, storage.root, sleep=0.1)
    builders.append(b)
    time.sleep(delay)
    b.kill()
    b.assert_killed()
    assert_no_version(storage)
    assert_clean_rebuild(storage)


def test_version_folder_without_manifest_does_not_exist(tmp_path, storage):
    # What a crash before the manifest was written would leave if a version were built in place.
    folder = Path(storage.root) / "ds" / "v1"
    folder.mkdir(parents=True)
    (folder / "chunk-00000.mdb").write_bytes(os.urandom(5000))
    (folder / "manifest.json.tmp").write_text('{"format": "yogadl_plus.cache"')
    assert_no_version(storage)
    with pytest.raises(ydl.DatasetNotFound):
        storage.delete("ds", "v1")
    assert_clean_rebuild(storage)
    assert not (folder / "manifest.json.tmp").exists()
    names = sorted(os.listdir(folder))
    assert "manifest.json" in names
    manifest = storage.fetch("ds", "v1").manifest
    builds = {c.file.split("/")[0] for c in manifest.chunks}
    assert names == sorted(["manifest.json", *builds])


def test_killed_overwrite_keeps_the_published_version(tmp_path, storage, builders):
    n_old = 300
    ydl.cache_dataset(Source(n_old, seed=3), "ds", "v1", storage, progress=False)
    old = storage.fetch("ds", "v1")
    check_all(old, n_old, seed=3)
    old.close()
    b = Builder(tmp_path, storage.root, overwrite=True, seed=4)
    builders.append(b)
    b.wait_marker()
    assert chunk_files_in_staging(storage.root)
    b.kill()
    b.assert_killed()

    assert storage.list() == [("ds", "v1")]
    storage.verify("ds", "v1")
    ref = storage.fetch("ds", "v1")
    check_all(ref, n_old, seed=3)
    ref.close()
    # Asking for it again returns the old data without reading the source, and is not blocked.
    source = Source(10, seed=5)
    again = run_with_timeout(lambda: ydl.cache_dataset(source, "ds", "v1", storage, progress=False))
    assert source.calls == 0
    check_all(again, n_old, seed=3)
    again.close()
    # A later overwrite replaces it and clears the dead builder's leftovers.
    source = Source(40, seed=6)
    new = run_with_timeout(
        lambda: ydl.cache_dataset(source, "ds", "v1", storage, overwrite=True, progress=False)
    )
    assert source.calls == 1
    check_all(new, 40, seed=6)
    assert staging_entries(storage.root) == []
    storage.verify("ds", "v1")


# --- a waiting builder takes over from a killed one --------------------------------------------


def test_waiting_thread_takes_over_when_the_lock_holder_is_killed(tmp_path, storage, builders):
    b = Builder(tmp_path, storage.root, slow_after=0, sleep=1.0)
    builders.append(b)
    b.wait_marker()  # the child holds the builder lock
    source = Source(300, seed=8)
    result: dict = {}

    def wait_and_build() -> None:
        try:
            result["ref"] = ydl.cache_dataset(source, "ds", "v1", storage, progress=False)
        except BaseException as exc:  # pragma: no cover - reported below
            result["error"] = exc

    waiter = threading.Thread(target=wait_and_build, daemon=True)
    waiter.start()
    waiter.join(0.7)
    assert waiter.is_alive(), result  # blocked on the lock
    assert source.calls == 0
    b.kill()
    b.assert_killed()
    waiter.join(60)
    assert not waiter.is_alive(), "the waiter never got the dead builder's lock"
    assert "error" not in result, result
    assert source.calls == 1
    check_all(result["ref"], 300, seed=8)
    result["ref"].close()
    assert storage.list() == [("ds", "v1")]
    storage.verify("ds", "v1")
    assert staging_entries(storage.root) == []


def test_waiting_process_takes_over_when_the_lock_holder_is_killed(tmp_path, storage, builders):
    holder = Builder(tmp_path, storage.root, slow_after=0, sleep=1.0, name="holder")
    builders.append(holder)
    holder.wait_marker()
    # A second builder process with a fast source (its marker: its source was opened).
    waiter = Builder(tmp_path, storage.root, n=500, slow_after=0, sleep=0.0, seed=9, name="waiter")
    builders.append(waiter)
    time.sleep(1.5)  # long enough to import and block on the lock
    assert waiter.proc.poll() is None, waiter.log()
    assert not waiter.marker.exists()  # its source was not read
    holder.kill()
    holder.assert_killed()
    assert waiter.proc.wait(timeout=60) == 0, waiter.log()
    assert waiter.done.exists()
    assert storage.list() == [("ds", "v1")]
    storage.verify("ds", "v1")
    check_all(storage.fetch("ds", "v1"), 500, seed=9)
    assert staging_entries(storage.root) == []
