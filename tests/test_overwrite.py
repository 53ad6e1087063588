"""Local builds are immutable.

A reader of a version keeps reading the build it opened to the end while another process
overwrites the version, never a mix of builds; and a builder killed with SIGKILL right after any
filesystem step of a build or an overwrite (every mkdir, file created, rename, replace, fsync,
unlink and rmdir, one kill per step, until it finishes) leaves the old version or the new one,
whole, and the next builder is not blocked by what it left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers.forks import Forks, read_log

import yogadl_plus as ydl

pytestmark = pytest.mark.timeout(600)


def record(i: int, seed: int) -> dict:
    return {"i": np.int64(i), "x": np.full(8, i + 1000 * seed, np.float32), "s": f"r{seed}-{i}"}


def build(storage: ydl.LocalStorage, n: int, seed: int, **kwargs) -> ydl.DataRef:
    return ydl.cache_dataset(
        lambda: (record(i, seed) for i in range(n)),
        "ds",
        "v1",
        storage,
        progress=False,
        chunk_bytes=8192,
        **kwargs,
    )


def whole(ref: ydl.DataRef) -> tuple[int, int]:
    """(records, seed) of a version whose records are all of one build; fails on a mix."""
    batch = ref.get_batch(np.arange(len(ref)))
    seeds = {int(s.split("-")[0][1:]) for s in batch["s"]}
    assert len(seeds) == 1, f"records of several builds: {sorted(seeds)}"
    seed = seeds.pop()
    np.testing.assert_array_equal(batch["i"], np.arange(len(ref)))
    want = np.arange(len(ref))[:, None] + 1000 * seed + np.zeros(8)
    np.testing.assert_array_equal(batch["x"], want.astype(np.float32))
    assert batch["s"] == [f"r{seed}-{i}" for i in range(len(ref))]
    return len(ref), seed


# --- a reader during an overwrite by another process ---------------------------------------------

OVERWRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import yogadl_plus as ydl

    root, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    records = lambda: ({"i": np.int64(i), "x": np.full(8, i + 1000 * seed, np.float32),
                        "s": f"r{seed}-{i}"} for i in range(n))
    ydl.cache_dataset(records, "ds", "v1", ydl.LocalStorage(root), overwrite=True,
                      progress=False, chunk_bytes=8192)
    """
)


def overwrite_in_another_process(storage: ydl.LocalStorage, n: int, seed: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", OVERWRITER, storage.root, str(n), str(seed)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=storage.root,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("batch_size", [None, 50])
def test_a_reader_reads_the_build_it_opened_to_the_end(tmp_path, batch_size):
    storage = ydl.LocalStorage(tmp_path / "store")
    old = build(storage, 2000, seed=1)
    assert len(old.manifest.chunks) >= 4
    stream = old.stream(shuffle=True, shuffle_seed=5, batch_size=batch_size)
    items = iter(stream)
    seen = [next(items) for _ in range(5)]  # only the chunks those touch are open so far
    overwrite_in_another_process(storage, 1900, seed=2)
    seen.extend(items)
    strings = [s for b in seen for s in b["s"]] if batch_size else [r["s"] for r in seen]
    assert sorted(strings) == sorted(f"r1-{i}" for i in range(2000))
    assert whole(old) == (2000, 1)  # random access too
    assert whole(storage.fetch("ds", "v1")) == (1900, 2)
    # The old build stays while its reader lives, and goes once nobody reads it.
    folder = Path(storage.path("ds", "v1"))
    assert len([p for p in folder.iterdir() if p.is_dir()]) == 2
    old.close()
    del old, stream, items
    assert whole(storage.fetch("ds", "v1")) == (1900, 2)
    assert len([p for p in folder.iterdir() if p.is_dir()]) == 1


def test_a_reader_in_a_worker_process_keeps_its_build(tmp_path):
    """A DataRef pickled into a worker pins the build there too."""
    storage = ydl.LocalStorage(tmp_path / "store")
    old = build(storage, 1000, seed=1)
    stream = old.stream(batch_size=100, num_workers=2, worker_type="process")
    items = iter(stream)
    first = next(items)
    overwrite_in_another_process(storage, 900, seed=2)
    rest = list(items)
    strings = [s for b in [first, *rest] for s in b["s"]]
    assert strings == [f"r1-{i}" for i in range(1000)]
    stream.close()


def _read_when_told(blob: bytes, ready, go, out: str) -> None:
    import pickle

    ref = pickle.loads(blob)  # takes its own pins, in this process
    ready.set()
    go.wait(120)
    Path(out).write_text(json.dumps(whole(ref)))


def test_a_dataref_unpickled_in_a_spawned_process_pins_its_build_there(tmp_path):
    """What the storage hands a DataRef to keep its build (its pins) pickles itself: taken
    again in a process that unpickles it, even once the process that pickled it let go."""
    import multiprocessing
    import pickle

    storage = ydl.LocalStorage(tmp_path / "store")
    ref = build(storage, 1000, seed=1)
    old = ref.manifest.chunks[0].file.split("/")[0]
    blob = pickle.dumps(ref)
    del ref  # from here on, only the child pins the old build
    context = multiprocessing.get_context("spawn")
    ready, go = context.Event(), context.Event()
    out = tmp_path / "child.json"
    child = context.Process(target=_read_when_told, args=(blob, ready, go, str(out)))
    child.start()
    folder = Path(storage.path("ds", "v1"))
    try:
        assert ready.wait(120)
        build(storage, 900, seed=2, overwrite=True)  # removes every build nobody pins
        assert old in {p.name for p in folder.iterdir() if p.is_dir()}
        go.set()
        child.join(120)
    finally:
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert json.loads(out.read_text()) == [1000, 1]
    assert whole(storage.fetch("ds", "v1")) == (900, 2)  # and the old build goes now
    assert old not in {p.name for p in folder.iterdir() if p.is_dir()}


def test_delete_while_reading_lets_the_reader_finish(tmp_path):
    storage = ydl.LocalStorage(tmp_path / "store")
    old = build(storage, 2000, seed=1)
    items = iter(old.stream(shuffle=True, shuffle_seed=1))
    seen = [next(items)]
    storage.delete("ds", "v1")
    assert storage.list() == []
    with pytest.raises(ydl.DatasetNotFound):
        storage.fetch("ds", "v1")
    seen.extend(items)
    assert sorted(r["s"] for r in seen) == sorted(f"r1-{i}" for i in range(2000))
    del items, old, seen
    build(storage, 10, seed=3)  # the next build of the version removes what nobody reads
    folder = Path(storage.path("ds", "v1"))
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == [
        storage.fetch("ds", "v1").manifest.chunks[0].file.split("/")[0]
    ]


# --- SIGKILL after every filesystem step ---------------------------------------------------------

# argv: root n seed overwrite kill_at report. Counts the filesystem steps taken from the moment
# cache_dataset starts and SIGKILLs itself right after step kill_at (0: never); writes the
# steps taken to `report` when it finishes.
STEPPER = textwrap.dedent(
    """
    import builtins, json, os, shutil, signal, sys
    import numpy as np
    import yogadl_plus as ydl

    root, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    overwrite, kill_at, report = sys.argv[4] == "1", int(sys.argv[5]), sys.argv[6]
    steps = []

    def step(name, *args):
        steps.append(name + " " + " ".join(str(a).replace(root, "") for a in args[:2]))
        if len(steps) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def counted(name, real):
        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            step(name, *args)
            return result
        return call

    for name in ("rename", "replace", "fsync", "remove", "unlink", "rmdir", "mkdir", "link",
                 "truncate"):
        setattr(os, name, counted(name, getattr(os, name)))
    real_open = builtins.open
    def opened(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if any(c in mode for c in "wax+"):
            step("open-" + mode, file)
        return handle
    builtins.open = opened
    real_os_open = os.open
    def os_opened(path, flags, *args, **kwargs):
        fd = real_os_open(path, flags, *args, **kwargs)
        if flags & os.O_CREAT:
            step("os.open-create", path)
        return fd
    os.open = os_opened

    records = lambda: ({"i": np.int64(i), "x": np.full(8, i + 1000 * seed, np.float32),
                        "s": f"r{seed}-{i}"} for i in range(n))
    ydl.cache_dataset(records, "ds", "v1", ydl.LocalStorage(root), overwrite=overwrite,
                      progress=False, chunk_bytes=8192)
    builtins.open = real_open
    with real_open(report, "w") as f:
        json.dump(steps, f)
    """
)


@pytest.fixture(scope="module")
def forks() -> Iterator[Forks]:
    forks = Forks("numpy", "yogadl_plus")
    yield forks
    forks.close()


def run_stepper(
    forks: Forks, tmp_path: Path, root: str, n: int, seed: int, overwrite: bool, kill_at: int
) -> list[str] | None:
    report = tmp_path / f"steps-{kill_at}.json"
    log = tmp_path / f"steps-{kill_at}.log"
    args = [root, str(n), str(seed), str(int(overwrite)), str(kill_at), str(report)]
    returncode = forks.run(STEPPER, *args, cwd=tmp_path, log=log, timeout=120)
    if returncode == -signal.SIGKILL:
        return None
    assert returncode == 0, read_log(log)
    return json.loads(report.read_text())


def leftovers(root: str) -> list[str]:
    """Bookkeeping a finished build must not leave: staging and trash folders, temp files."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if name.startswith(("+staging.", "+trash.")) or name.endswith(".tmp"):
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return found


def unnamed_files(storage: ydl.LocalStorage) -> list[str]:
    """Files in the version's folder that its manifest does not name (nor their stamps or the
    builds' pins): what is left of other builds."""
    folder = storage.path("ds", "v1")
    named = {"manifest.json"}
    for chunk in storage.fetch("ds", "v1").manifest.chunks:
        named.update(
            {
                chunk.file,
                chunk.file + ".verified",
                os.path.join(os.path.dirname(chunk.file), "+pin"),
            }
        )
    found = []
    for dirpath, _, names in os.walk(folder):
        for name in names:
            relative = os.path.relpath(os.path.join(dirpath, name), folder)
            if relative not in named:
                found.append(relative)
    return found


@pytest.mark.crash
@pytest.mark.parametrize("overwrite", [False, True], ids=["first_build", "overwrite"])
def test_sigkill_after_every_filesystem_step_leaves_old_or_new_whole(forks, tmp_path, overwrite):
    old_n, new_n = 300, 240
    # How many steps a whole build takes (same sizes, so the same steps each time).
    probe = ydl.LocalStorage(tmp_path / "probe")
    if overwrite:
        build(probe, old_n, seed=1)
    steps = run_stepper(forks, tmp_path, probe.root, new_n, 2, overwrite, 0)
    assert steps and any(s.startswith("rename") for s in steps), steps
    assert any(s.startswith("replace") and "manifest.json" in s for s in steps), steps
    outcomes = []
    for kill_at in range(1, len(steps) + 1):
        storage = ydl.LocalStorage(tmp_path / f"kill-{kill_at}")
        if overwrite:
            build(storage, old_n, seed=1).close()
        finished = run_stepper(forks, tmp_path, storage.root, new_n, 2, overwrite, kill_at)
        assert finished is None, f"step {kill_at} of {len(steps)} did not kill it"
        # What the kill left: the old version or the new one, whole (or, for a first build,
        # no version at all).
        if ("ds", "v1") in storage.list():
            ref = storage.fetch("ds", "v1")
            outcomes.append(whole(ref)[1])
            ref.verify()
            del ref  # its pins: the next build may then remove the build it read
        else:
            assert not overwrite, f"killed after step {kill_at} ({steps[kill_at - 1]}): no version"
            outcomes.append(None)
        # The next builder is not blocked, reads its source once, and cleans up after the dead.
        calls: list[int] = []

        def source(calls: list[int] = calls):
            calls.append(1)
            return (record(i, 3) for i in range(50))

        again = ydl.cache_dataset(
            source,
            "ds",
            "v1",
            storage,
            progress=False,
            overwrite=True,
        )
        assert calls == [1] and whole(again) == (50, 3)
        again.close()
        del again
        assert leftovers(storage.root) == [], (kill_at, steps[kill_at - 1])
        assert unnamed_files(storage) == [], (kill_at, steps[kill_at - 1])
    # Early kills leave the old state, late ones the new: one switch, at the manifest's replace.
    first_new = outcomes.index(2)
    assert set(outcomes[:first_new]) == ({1} if overwrite else {None}), outcomes
    assert set(outcomes[first_new:]) == {2}, outcomes
    switch = steps[first_new]  # outcomes[j] is what a kill right after steps[j] left
    assert switch.startswith("replace") and switch.endswith("/ds/v1/manifest.json"), switch


# --- what readers leave is removed once they are done -------------------------------------------


def build_folders(storage: ydl.LocalStorage) -> list[str]:
    folder = Path(storage.root, "ds", "v1")
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


@pytest.mark.parametrize("then", ["fetch", "delete"])
def test_a_deleted_version_read_until_now_is_removed_when_its_reader_is_done(tmp_path, then):
    storage = ydl.LocalStorage(tmp_path / "store")
    reader = build(storage, 500, seed=1)
    storage.delete("ds", "v1")
    assert len(build_folders(storage)) == 1  # still read
    assert whole(reader) == (500, 1)
    del reader
    with pytest.raises(ydl.DatasetNotFound):
        getattr(storage, then)("ds", "v1")
    assert not Path(storage.root, "ds", "v1").exists()


def test_a_missing_build_folder_is_named_as_damage(tmp_path, capfd):
    import shutil

    storage = ydl.LocalStorage(tmp_path / "store")
    ref = build(storage, 300, seed=1)
    build_name = ref.manifest.chunks[0].file.split("/")[0]
    del ref
    shutil.rmtree(Path(storage.path("ds", "v1"), build_name))
    with pytest.raises(ydl.CacheCorrupted, match=rf"build folder {build_name}/ .* is gone"):
        storage.fetch("ds", "v1")
    assert "Exception ignored" not in capfd.readouterr().err


def test_a_pickled_dataref_whose_build_is_gone_says_so(tmp_path):
    import pickle

    storage = ydl.LocalStorage(tmp_path / "store")
    ref = build(storage, 300, seed=1)
    blob = pickle.dumps(ref)
    del ref
    build(storage, 200, seed=2, overwrite=True)  # the old build goes: nobody reads it
    with pytest.raises(ydl.DatasetNotFound, match="the build this DataRef read is gone"):
        pickle.loads(blob)


MAKE_FORMAT_1 = textwrap.dedent(
    """
    import sys
    import numpy as np
    import yogadl_plus as ydl

    records = ({"i": np.int64(i), "x": np.full(8, i + 1000, np.float32), "s": f"r1-{i}"}
               for i in range(300))
    ydl.cache_dataset(records, "ds", "v1", ydl.LocalStorage(sys.argv[1]), progress=False,
                      chunk_bytes=8192)
    """
)


def test_a_format_1_version_overwritten_while_read_goes_once_its_reader_is_done(tmp_path):
    # A checkout of 0.1.0: YOGADL_PLUS_OLD_CHECKOUT, or one named base beside this one.
    old_code = os.environ.get("YOGADL_PLUS_OLD_CHECKOUT", str(Path(__file__).parents[2] / "base"))
    if not os.path.isfile(os.path.join(old_code, "yogadl_plus", "cache", "manifest.py")):
        pytest.skip("no checkout of yogadl_plus 0.1.0 to write a format 1 cache with")
    root = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-c", MAKE_FORMAT_1, str(root)],
        env={**os.environ, "PYTHONPATH": old_code},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    storage = ydl.LocalStorage(root)
    reader = storage.fetch("ds", "v1")
    if reader.manifest.format_version != 1:
        pytest.skip(f"the checkout at {old_code} writes format {reader.manifest.format_version}")
    assert whole(reader) == (300, 1)
    build(storage, 100, seed=2, overwrite=True)
    assert whole(reader) == (300, 1)  # its flat chunk files stay while it reads
    del reader
    assert whole(storage.fetch("ds", "v1")) == (100, 2)
    assert not [p for p in Path(storage.path("ds", "v1")).iterdir() if p.name.startswith("chunk")]
