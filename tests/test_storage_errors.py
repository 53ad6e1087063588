"""Errors that say what happened, on the storage side: a full disk, names the filesystem cannot
hold, permissions, a storage folder removed under us, a read-only local cache. Each is one of
yogadl_plus's own exceptions naming the path and what to do, and nothing of a failed build is left
behind; a version already cached is never lost."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import yogadl_plus as ydl
from yogadl_plus.cli import main

ROOT = os.geteuid() == 0


def records(n: int, width: int = 1024, seed: int = 0) -> Iterator[dict]:
    rng = np.random.default_rng(seed)
    for i in range(n):
        yield {"i": np.int64(i), "x": rng.integers(0, 255, width, dtype=np.uint8)}


@contextlib.contextmanager
def mounted(kind: str, target: Path, *options: str, source: str = "none") -> Iterator[Path]:
    """A mount for the test's length (root only): a small tmpfs, or a read-only bind."""
    target.mkdir(parents=True, exist_ok=True)
    args = ["mount", "-t", kind, *options, source, str(target)] if kind else [*options]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount ({done.stderr.strip()})")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def bookkeeping_left(root: Path) -> list[str]:
    """Files or folders a failed build must not leave (its lock file aside)."""
    left = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if name.startswith("+lock."):
                continue
            path = Path(dirpath, name)
            if path.is_file() or name.startswith(("+staging", "b-")):
                left.append(str(path.relative_to(root)))
    return left


# --- a full disk ------------------------------------------------------------------------------


@pytest.mark.skipif(not ROOT, reason="mounting a small tmpfs needs root")
def test_a_full_disk_is_a_storage_error_naming_the_path_and_free_space(tmp_path):
    with mounted("tmpfs", tmp_path / "small", "-o", "size=3m") as small:
        storage = ydl.LocalStorage(small / "store")
        with pytest.raises(ydl.StorageError) as caught:
            ydl.cache_dataset(
                lambda: records(6000), "ds", "v1", storage, progress=False, chunk_bytes=1 << 20
            )
        message = str(caught.value)
        assert "no space left on the device" in message and str(small) in message
        assert "bytes free of" in message
        assert bookkeeping_left(small / "store") == []
        assert storage.list() == []


@pytest.mark.skipif(not ROOT, reason="mounting a small tmpfs needs root")
def test_a_full_disk_during_an_overwrite_keeps_the_version(tmp_path):
    with mounted("tmpfs", tmp_path / "small", "-o", "size=3m") as small:
        storage = ydl.LocalStorage(small / "store")
        ydl.cache_dataset(lambda: records(300), "ds", "v1", storage, progress=False)
        with pytest.raises(ydl.StorageError, match="no space left"):
            ydl.cache_dataset(
                lambda: records(6000, seed=1), "ds", "v1", storage, overwrite=True, progress=False
            )
        ref = storage.fetch("ds", "v1")
        assert len(ref) == 300
        np.testing.assert_array_equal(ref.get_batch(np.arange(300))["i"], np.arange(300))
        ref.verify()


@pytest.mark.skipif(not ROOT, reason="mounting a small tmpfs needs root")
def test_the_cli_exits_4_on_a_full_disk(tmp_path, capsys):
    noise = np.random.default_rng(0).bytes(8 << 20)  # (made once: 13 s when made per row)
    table = pa.table({"x": pa.array([noise[i::1000] for i in range(1000)])})
    pq.write_table(table, tmp_path / "big.parquet")
    with mounted("tmpfs", tmp_path / "small", "-o", "size=3m") as small:
        code = main(["build", str(tmp_path / "big.parquet"), "ds", "v1", "--storage",
                     str(small / "store"), "--no-progress"])  # fmt: skip
        assert code == 4
        err = capsys.readouterr().err
        assert err.startswith("yogadl-plus build: error: ") and "no space left" in err
        assert bookkeeping_left(small / "store") == []


# --- names, permissions, a removed storage folder -----------------------------------------------


@pytest.mark.parametrize("what", ["dataset_id", "version"])
def test_a_name_too_long_for_the_filesystem_is_refused_before_touching_disk(tmp_path, what):
    storage = ydl.LocalStorage(tmp_path / "store")
    names = {"dataset_id": "ds", "version": "v1", what: "a" * 300}
    with pytest.raises(ValueError, match=r"is 300 characters long; at most 200"):
        ydl.cache_dataset(lambda: records(3), names["dataset_id"], names["version"], storage)
    assert os.listdir(storage.root) == []
    # The longest name allowed works end to end.
    names[what] = "b" * 200
    ref = ydl.cache_dataset(lambda: records(3), names["dataset_id"], names["version"], storage)
    assert len(ref) == 3 and storage.list() == [(names["dataset_id"], names["version"])]


CHILD_WITHOUT_OVERRIDES = textwrap.dedent(
    """
    import sys
    import yogadl_plus as ydl
    try:
        ref = ydl.LocalStorage(sys.argv[1]).fetch("ds", "v1")
        ref.get_batch([0, 1])
        print("read")
    except ydl.YogaError as exc:
        print(type(exc).__name__ + ": " + str(exc))
    """
)


@pytest.mark.skipif(not ROOT or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_a_chunk_without_read_permission_is_said_so(tmp_path):
    storage = ydl.LocalStorage(tmp_path / "store")
    ref = ydl.cache_dataset(lambda: records(10), "ds", "v1", storage, progress=False)
    chunk = Path(ref.directory, ref.manifest.chunks[0].file)
    os.chmod(chunk, 0o000)
    # Root reads anything: the reader runs without the capabilities that let it.
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
    done = subprocess.run(
        [*drop, sys.executable, "-c", CHILD_WITHOUT_OVERRIDES, storage.root],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.strip()
    assert out.startswith("StorageError: "), out
    assert "permission denied" in out and "damaged" not in out
    assert f"{chunk.parent.name}/{chunk.name} of ds:v1" in out


def test_a_removed_storage_folder_is_named(tmp_path):
    storage = ydl.LocalStorage(tmp_path / "store")
    ydl.cache_dataset(lambda: records(3), "ds", "v1", storage, progress=False)
    shutil.rmtree(tmp_path / "store")
    for call in (
        storage.list,
        lambda: storage.fetch("ds", "v1"),
        lambda: storage.delete("ds", "v1"),
    ):
        with pytest.raises(ydl.StorageError, match="storage folder does not exist any more"):
            call()
    # The command line only reads: it names the missing root and makes nothing.
    assert main(["ls", "--storage", str(tmp_path / "store")]) == 3
    assert not (tmp_path / "store").exists()
    # A build makes the folder again, as LocalStorage() does.
    assert len(ydl.cache_dataset(lambda: records(3), "ds", "v1", storage, progress=False)) == 3


def test_a_storage_root_that_is_a_file_is_named(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ydl.StorageError, match="exists and is not a folder"):
        ydl.LocalStorage(tmp_path / "file")


# --- a read-only local cache of a bucket --------------------------------------------------------


@pytest.mark.servers
@pytest.mark.skipif(not ROOT, reason="a read-only bind mount needs root")
def test_a_read_only_local_cache_of_a_bucket_is_read(s3_server, s3_bucket, tmp_path):
    prefix = f"ro-{uuid.uuid4().hex[:6]}"
    writer = s3_server.storage(s3_bucket, prefix, tmp_path / "cache")
    ydl.cache_dataset(lambda: records(500, width=64), "ds", "v1", writer, progress=False)
    ydl.cache_dataset(lambda: records(20, width=64), "ds", "v2", writer, progress=False)
    shutil.rmtree(tmp_path / "cache" / "ds" / "v2")  # pulled: only v1
    writer.fetch("ds", "v1").close()
    ro = tmp_path / "ro"
    with (
        mounted("", ro, "mount", "--bind", str(tmp_path / "cache"), str(ro)),
        mounted("", ro, "mount", "-o", "remount,ro,bind", str(ro)),
    ):
        assert os.statvfs(ro).f_flag & os.ST_RDONLY
        reader = s3_server.storage(s3_bucket, prefix, ro)
        ref = reader.fetch("ds", "v1")
        np.testing.assert_array_equal(ref.get_batch(np.arange(500))["i"], np.arange(500))
        assert ydl.LocalStorage(ro).fetch("ds", "v1")[3]["i"] == 3
        with pytest.raises(ydl.StorageError, match="is read-only and does not hold ds:v2"):
            reader.fetch("ds", "v2")
