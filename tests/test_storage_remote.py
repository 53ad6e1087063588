"""S3Storage and GCSStorage against real servers (SeaweedFS, fake-gcs-server; tests/servers.py).

Two "machines" are two storages on the same bucket and prefix with different local caches.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.remote_helpers import client_for, count_downloads, make_storage, records, spec_for

import yogadl_plus as ydl
from yogadl_plus.storage.lease import BuildLease

pytestmark = pytest.mark.servers

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


@pytest.fixture(params=["s3", "gcs"])
def spec(request: pytest.FixtureRequest) -> dict[str, Any]:
    server = request.getfixturevalue(f"{request.param}_server")
    return spec_for(request.param, server, server.make_bucket())


def labels(dataref: ydl.DataRef) -> list[int]:
    return [int(v) for v in dataref.get_batch(np.arange(len(dataref)), "label")["label"]]


def remote_keys(storage: Any) -> list[str]:
    return sorted(k for k, _ in storage.objects.keys(""))


# --------------------------------------------------------------------------- sharing versions


def test_two_machines_share_a_version(spec: dict, tmp_path: Path) -> None:
    a = make_storage(spec, tmp_path / "a")
    b = make_storage(spec, tmp_path / "b")
    built = ydl.cache_dataset(records(3000), "sensors", "v1", a, chunk_bytes=200_000)
    assert len(built.manifest.chunks) > 2
    downloads = count_downloads(b)
    got = b.fetch("sensors", "v1")
    assert labels(got) == list(range(3000))
    np.testing.assert_array_equal(got[1234]["x"], records(3000)[1234]["x"])
    assert len(downloads) == len(built.manifest.chunks)
    assert got.directory.startswith(str(tmp_path / "b"))
    # The builder's machine kept what it built: no download there.
    a_downloads = count_downloads(a)
    assert labels(a.fetch("sensors", "v1")) == list(range(3000))
    assert a_downloads == []
    # Reused while the remote manifest is unchanged.
    b.fetch("sensors", "v1")
    assert len(downloads) == len(built.manifest.chunks)
    assert a.list() == b.list() == [("sensors", "v1")]
    b.verify("sensors", "v1")
    # The remote layout: manifest plus one build folder of chunks, no lease left behind.
    keys = remote_keys(a)
    assert "sensors/v1/manifest.json" in keys and not any(k.endswith("lease.json") for k in keys)
    assert len({k.split("/")[2] for k in keys if k.count("/") == 3}) == 1


def test_a_changed_remote_version_is_pulled_again(spec: dict, tmp_path: Path) -> None:
    a = make_storage(spec, tmp_path / "a", lease_ttl=1.0)
    b = make_storage(spec, tmp_path / "b")
    ydl.cache_dataset(records(500), "d", "v", a)
    old = b.fetch("d", "v")
    assert labels(old) == list(range(500))
    ydl.cache_dataset(records(700), "d", "v", a, overwrite=True)
    # A reader of the old copy keeps reading it while the new one is pulled beside it.
    new = b.fetch("d", "v")
    assert labels(new) == list(range(700)) and labels(old) == list(range(500))
    local = Path(new.directory)
    assert len([p for p in local.iterdir() if p.is_dir()]) == 2
    del old, new
    assert labels(b.fetch("d", "v")) == list(range(700))  # nobody reads the old build now
    assert len([p for p in local.iterdir() if p.is_dir()]) == 1

    def builds() -> set[str]:
        return {k.split("/")[2] for k in remote_keys(a) if k.count("/") == 3}

    # The replaced build stays in the bucket for a lease_ttl (pulls in flight may need it) ...
    assert len(builds()) == 2
    time.sleep(2.5)  # listings time objects to the second
    ydl.cache_dataset(records(900), "d", "v", a, overwrite=True)
    # ... and is collected by a later build once it is older than that.
    assert len(builds()) == 1
    assert labels(b.fetch("d", "v")) == list(range(900))


def test_cacheable_list_delete_and_not_found(spec: dict, tmp_path: Path) -> None:
    a = make_storage(spec, tmp_path / "a")
    calls = []

    @a.cacheable("digits", "1")
    def make() -> list[dict]:
        calls.append(1)
        return records(100)

    assert len(make()) == 100 and len(make()) == 100
    assert calls == [1]
    with pytest.raises(ydl.DatasetNotFound, match="'nope'"):
        a.fetch("digits", "nope")
    a.delete("digits", "1")
    assert a.list() == [] and remote_keys(a) == []
    with pytest.raises(ydl.DatasetNotFound):
        a.delete("digits", "1")
    with pytest.raises(ValueError, match="not allowed"):
        a.fetch("../etc", "1")


def test_open_storage_urls(s3_server: Any, gcs_server: Any, tmp_path: Path) -> None:
    bucket = s3_server.make_bucket()
    s3 = ydl.open_storage(
        f"s3://{bucket}/some/prefix/",
        local_cache=tmp_path / "c",
        client=s3_server.client(),
    )
    assert isinstance(s3, ydl.S3Storage) and s3.prefix == "some/prefix/"
    ydl.cache_dataset(records(10), "d", "v", s3)
    keys = list(s3_server.client().list_objects_v2(Bucket=bucket)["Contents"])
    assert all(k["Key"].startswith("some/prefix/d/v/") for k in keys)
    gbucket = gcs_server.make_bucket()
    gs = ydl.open_storage(f"gs://{gbucket}", local_cache=tmp_path / "g", client=gcs_server.client())
    assert isinstance(gs, ydl.GCSStorage) and gs.prefix == ""
    with pytest.raises(ValueError, match="no bucket"):
        ydl.open_storage("s3:///prefix")
    with pytest.raises(ValueError, match=r"'\.\.'"):
        ydl.S3Storage("b", "a/../b", client=s3_server.client())


def test_default_local_cache_is_under_the_default_storage(s3_server: Any) -> None:
    storage = ydl.S3Storage(s3_server.make_bucket(), "p", client=s3_server.client())
    assert storage.local_cache.root.startswith(ydl.default_storage().root)
    assert ydl.default_storage().list() == []  # its '+remote' folder is no dataset


CHILD_FETCH = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    from helpers.remote_helpers import count_downloads, make_storage
    storage = make_storage(json.loads(sys.argv[1]), sys.argv[2])
    seen = count_downloads(storage)
    ref = storage.fetch("d", "v")
    print(len(seen), len(ref), flush=True)
    """
)


def test_processes_of_one_machine_download_once(spec: dict, tmp_path: Path) -> None:
    built = ydl.cache_dataset(
        records(4000), "d", "v", make_storage(spec, tmp_path / "a"), chunk_bytes=100_000
    )
    cache = tmp_path / "one-machine"
    command = [sys.executable, "-c", CHILD_FETCH.format(tests=str(TESTS)), json.dumps(spec)]
    children = [
        subprocess.Popen([*command, str(cache)], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [c.communicate(timeout=120)[0].split() for c in children]
    assert all(c.returncode == 0 for c in children)
    assert all(int(records_) == 4000 for _, records_ in outputs)
    assert sorted(int(downloads) for downloads, _ in outputs) == [
        0,
        0,
        len(built.manifest.chunks),
    ]


def test_transient_failures_are_retried(spec: dict, tmp_path: Path) -> None:
    import functools

    from yogadl_plus.errors import TransientStorageError
    from yogadl_plus.storage.objects import retried

    ydl.cache_dataset(records(1000), "d", "v", make_storage(spec, tmp_path / "a"))
    b = make_storage(spec, tmp_path / "b")
    one_try = type(b.objects).read_range_into.__wrapped__  # a store's calls retry themselves
    failures = []

    def flaky(store: Any, key: str, start: int, stop: int, out: Any) -> None:
        if len(failures) < 2:
            failures.append(key)
            out.seek(0)
            out.write(b"cut off midway")  # written over by the next try
            raise TransientStorageError(f"{key}: connection reset (injected)")
        one_try(store, key, start, stop, out)

    b.objects.read_range_into = functools.partial(retried(flaky), b.objects)
    assert labels(b.fetch("d", "v")) == list(range(1000))
    assert len(failures) == 2


# --------------------------------------------------------------------------- sharded pulls


def test_sharded_fetch_pulls_only_the_shards_chunks(spec: dict, tmp_path: Path) -> None:
    a = make_storage(spec, tmp_path / "a")
    built = ydl.cache_dataset(records(4000), "d", "v", a, chunk_bytes=100_000)
    chunks = len(built.manifest.chunks)
    assert chunks >= 6
    seen = []
    for rank in range(2):
        machine = make_storage(spec, tmp_path / f"rank{rank}")
        downloads = count_downloads(machine)
        ref = machine.fetch("d", "v", shards=(rank, 2))
        assert len(downloads) == len(range(rank, chunks, 2))
        stream = ref.stream(
            shard_by="chunks", shard_rank=rank, num_shards=2, shuffle=True, shuffle_seed=3
        )
        seen += [int(r["label"]) for r in stream]
        # A full fetch on the same machine then pulls only the chunks still missing.
        machine.fetch("d", "v")
        assert len(downloads) == chunks
    assert sorted(seen) == list(range(4000))


# --------------------------------------------------------------------------- racing builders


def test_racing_builders_in_threads_build_once(spec: dict, tmp_path: Path) -> None:
    builds = []
    results: dict[int, list[int]] = {}

    def machine(i: int) -> None:
        storage = make_storage(spec, tmp_path / f"m{i}")

        def source() -> Any:
            builds.append(i)
            for r in records(2000):
                time.sleep(0.0002)
                yield r

        results[i] = labels(ydl.cache_dataset(source(), "race", "v", storage, chunk_bytes=50_000))

    threads = [threading.Thread(target=machine, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert all(results[i] == list(range(2000)) for i in range(4))
    one = make_storage(spec, tmp_path / "check")
    assert len({k.split("/")[2] for k in remote_keys(one) if k.count("/") == 3}) == 1


CHILD_BUILD = textwrap.dedent(
    """
    import json, os, sys, time
    sys.path.insert(0, {tests!r})
    import yogadl_plus as ydl
    from helpers.remote_helpers import make_storage, records

    spec = json.loads(sys.argv[1]); cache = sys.argv[2]; marker = sys.argv[3]
    options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {{}}
    slow_upload = options.pop("slow_upload", 0)
    storage = make_storage(spec, cache, **options)
    if slow_upload:
        upload = storage.objects.upload
        def slow(key, path):
            upload(key, path)
            print("uploaded", key, flush=True)
            time.sleep(slow_upload)
        storage.objects.upload = slow

    def source():
        with open(marker, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        yield from records(2000)

    ref = ydl.cache_dataset(source(), "race", "v", storage, chunk_bytes=50_000)
    print("labels", int(ref.get_batch(list(range(len(ref))), "label")["label"].sum()), flush=True)
    """
)


def run_child(spec: dict, cache: Path, marker: Path, **options: Any) -> subprocess.Popen:
    code = CHILD_BUILD.format(tests=str(TESTS))
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            json.dumps(spec),
            str(cache),
            str(marker),
            json.dumps(options),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def test_racing_builders_in_processes_build_once(spec: dict, tmp_path: Path) -> None:
    marker = tmp_path / "builds.txt"
    children = [run_child(spec, tmp_path / f"m{i}", marker) for i in range(3)]
    outputs = [c.communicate(timeout=120) for c in children]
    for child, (out, err) in zip(children, outputs):
        assert child.returncode == 0, err
        assert f"labels {sum(range(2000))}" in out
    assert len(marker.read_text().split()) == 1


@pytest.mark.crash
def test_builder_killed_mid_upload_leaves_no_version_and_its_lease_expires(
    spec: dict, tmp_path: Path
) -> None:
    marker = tmp_path / "builds.txt"
    child = run_child(spec, tmp_path / "dead", marker, lease_ttl=2.0, slow_upload=1.0)
    assert child.stdout is not None
    line = child.stdout.readline()  # the first chunk is in the bucket
    assert line.startswith("uploaded"), child.stderr.read() if child.stderr else ""
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    witness = make_storage(spec, tmp_path / "witness", lease_ttl=2.0)
    keys = remote_keys(witness)
    assert any("/chunk-" in k for k in keys)  # half an upload is there ...
    assert witness.list() == []  # ... but no version
    with pytest.raises(ydl.DatasetNotFound):
        witness.fetch("race", "v")
    # A retry waits for the dead builder's lease to expire, takes it over and completes.
    start = time.monotonic()
    ref = ydl.cache_dataset(records(2000), "race", "v", witness, chunk_bytes=50_000)
    assert time.monotonic() - start >= 1.5
    assert labels(ref) == list(range(2000))
    # The manifest names only its own build; the dead build's chunks are collected by a
    # builder once nothing was written to them for a lease_ttl.
    ours = {c.file.split("/")[0] for c in ref.manifest.chunks}
    assert len(ours) == 1

    def builds() -> set[str]:
        return {k.split("/")[2] for k in remote_keys(witness) if k.count("/") == 3}

    assert ours <= builds() and len(builds()) <= 2
    time.sleep(3.5)  # over lease_ttl, as listings time objects to the second
    again = ydl.cache_dataset(records(2000), "race", "v", witness, overwrite=True)
    assert builds() == {c.file.split("/")[0] for c in again.manifest.chunks}


def test_chunk_sink_names_the_build_staged_in_its_folder_from_any_thread(
    spec: dict, tmp_path: Path
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    storage = make_storage(spec, tmp_path / "m")
    seen: list[tuple[str, Any]] = []

    def rows() -> Any:
        # Runs inside the staging block: the build's folder is the one "+build." folder.
        (folder,) = (tmp_path / "m" / "d").glob("+build.v.*")
        with ThreadPoolExecutor(1) as pool:  # a task's thread, not the builder's
            seen.append((str(folder), pool.submit(storage.chunk_sink, str(folder), True).result()))
        yield from records(10)

    ref = ydl.cache_dataset(rows(), "d", "v", storage, progress=False)
    folder, sink = seen[0]
    assert sink.base == "d/v/"
    assert {sink.build} == {c.file.split("/")[0] for c in ref.manifest.chunks}
    with pytest.raises(ValueError, match="is not the staging folder of a build"):
        storage.chunk_sink(folder, True)  # the block has ended


# --------------------------------------------------------------------------- the lease itself


def test_lease_excludes_and_is_taken_over_only_after_silence(spec: dict, tmp_path: Path) -> None:
    storage = make_storage(spec, tmp_path / "a")
    store = storage.objects
    holder = BuildLease(store, "x/lease.json", ttl=1.0)
    with holder:
        got = []
        waiter = threading.Thread(
            target=lambda: got.append(BuildLease(store, "x/lease.json", ttl=1.0).__enter__())
        )
        waiter.start()
        time.sleep(2.5)  # over two ttls: the holder keeps renewing, so the waiter waits
        assert got == []
    waiter.join(timeout=10)
    assert len(got) == 1  # released: taken at once
    got[0].__exit__(None, None, None)
    # A holder that stops renewing (dies) loses the lease after one ttl of silence.
    dead = BuildLease(store, "y/lease.json", ttl=1.0)
    dead.__enter__()
    dead._stop.set()  # the renewer stops: as if the process were gone
    start = time.monotonic()
    with BuildLease(store, "y/lease.json", ttl=1.0):
        assert time.monotonic() - start >= 1.0
    assert store.token("y/lease.json") is None


def test_of_two_takers_of_a_dead_lease_one_wins(spec: dict, tmp_path: Path) -> None:
    store = make_storage(spec, tmp_path / "a").objects
    token = store.create("z/lease.json", b"dead")
    assert token is not None
    assert store.create("z/lease.json", b"again") is None
    assert store.replace("z/lease.json", b"one", token) is not None
    assert store.replace("z/lease.json", b"two", token) is None


# --------------------------------------------------------------------------- damage and errors


def test_a_corrupted_object_is_detected_on_download_and_nothing_is_kept(
    spec: dict, tmp_path: Path
) -> None:
    a = make_storage(spec, tmp_path / "a")
    built = ydl.cache_dataset(records(2000), "d", "v", a, chunk_bytes=100_000)
    victim = f"{spec['prefix']}/d/v/{built.manifest.chunks[1].file}"
    path = os.path.join(built.directory, built.manifest.chunks[1].file)
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one flipped byte
    client = client_for(spec)
    if spec["kind"] == "s3":
        client.put_object(Bucket=spec["bucket"], Key=victim, Body=bytes(data))
    else:
        client.bucket(spec["bucket"]).blob(victim).upload_from_string(bytes(data))
    b = make_storage(spec, tmp_path / "b")
    with pytest.raises(ydl.CacheCorrupted, match="sha256"):
        b.fetch("d", "v")
    # (Bookkeeping aside: locks, and the manifest as the bucket gave it to this machine's
    # ranks, storage/manifestshare.py.)
    leftovers = [
        p
        for p in (tmp_path / "b").rglob("*")
        if p.is_file() and "+lock" not in p.name and "+manifests" not in p.parts
    ]
    assert leftovers == []
    assert b.local_cache.local.list() == []


def test_a_hostile_manifest_cannot_name_paths_outside_its_version(
    spec: dict, tmp_path: Path
) -> None:
    a = make_storage(spec, tmp_path / "a")
    ydl.cache_dataset(records(10), "d", "v", a)
    data, token = a.objects.read("d/v/manifest.json")
    body = json.loads(data)
    body["chunks"][0]["file"] = "../../../escape.mdb"
    assert a.objects.replace("d/v/manifest.json", json.dumps(body).encode(), token)
    b = make_storage(spec, tmp_path / "b")
    with pytest.raises(ydl.CacheCorrupted, match="escape"):
        b.fetch("d", "v")
    assert not (tmp_path / "escape.mdb").exists()


def test_missing_bucket_names_the_url(spec: dict, tmp_path: Path) -> None:
    ghost = dict(spec, bucket="no-such-bucket-here")
    storage = make_storage(ghost, tmp_path / "a")
    with pytest.raises(ydl.StorageError, match=r"no-such-bucket-here.*does not exist"):
        ydl.cache_dataset(records(10), "d", "v", storage)
    with pytest.raises(ydl.StorageError, match="no-such-bucket-here"):
        storage.list()
    assert ydl.LocalStorage(tmp_path / "a").list() == []


def test_unreachable_endpoint_names_it(spec: dict, tmp_path: Path) -> None:
    from helpers.servers import free_ports

    port = free_ports(1)[0]
    key = "endpoint_url" if spec["kind"] == "s3" else "endpoint"
    dead = dict(spec, **{key: f"http://127.0.0.1:{port}"})
    storage = make_storage(dead, tmp_path / "a", retry_timeout=2.0)
    with pytest.raises(ydl.StorageError, match=f"cannot reach.*127.0.0.1:{port}"):
        storage.fetch("d", "v")


def test_denied_access_names_the_credentials(s3_server: Any, tmp_path: Path) -> None:
    spec = spec_for("s3", s3_server, s3_server.make_bucket())
    storage = ydl.S3Storage(
        spec["bucket"],
        local_cache=tmp_path / "a",
        client=client_for(spec, secret_key="wrong-secret"),
    )
    with pytest.raises(ydl.StorageError, match=r"access denied.*credentials"):
        ydl.cache_dataset(records(10), "d", "v", storage)
    assert make_storage(spec, tmp_path / "b").list() == []


# --------------------------------------------------------------------------- the local cache limit


CHILD_READER = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {tests!r})
    from helpers.remote_helpers import make_storage
    spec = json.loads(sys.argv[1])
    storage = make_storage(spec, sys.argv[2])
    ref = storage.fetch("d", "old")
    print("reading", len(ref), flush=True)
    while True:
        ref[len(ref) - 1]
        time.sleep(0.05)
    """
)


def test_eviction_under_a_size_limit_spares_versions_in_use(spec: dict, tmp_path: Path) -> None:
    a = make_storage(spec, tmp_path / "a")
    sizes = {}
    for version in ("old", "mid", "new"):
        ref = ydl.cache_dataset(records(2000, seed=len(sizes)), "d", version, a)
        sizes[version] = sum(c.bytes for c in ref.manifest.chunks)
    limit = sizes["old"] + sizes["mid"] + sizes["new"] // 2
    cache = tmp_path / "shared-cache"
    reader = subprocess.Popen(
        [sys.executable, "-c", CHILD_READER.format(tests=str(TESTS)), json.dumps(spec), str(cache)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout is not None
    try:
        assert reader.stdout.readline().startswith("reading")
        machine = make_storage(spec, cache, local_cache_limit=limit)
        machine.fetch("d", "mid")
        # "old" is least recently used but another process reads it: "mid" goes instead.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            machine.fetch("d", "new")
        assert {v for _, v in machine.local_cache.local.list()} == {"old", "new"}
        # Over the limit with everything else in use: a warning, and the version is still there.
        held = machine.fetch("d", "new")
        with pytest.warns(ydl.CacheLimitWarning, match="in use"):
            machine.fetch("d", "mid")
        assert len(held) == 2000
    finally:
        reader.kill()
        reader.wait()
        reader.stdout.close()
    # The reader is gone (its flock with it): now "old", least recently used, can be evicted.
    del held
    machine.local_cache.remove("d", "mid")
    machine2 = make_storage(spec, cache, local_cache_limit=sizes["new"] + sizes["mid"] + 65536)
    machine2.fetch("d", "mid")
    assert {v for _, v in machine2.local_cache.local.list()} == {"mid", "new"}


def test_a_pickled_dataref_keeps_its_copy_pinned(spec: dict, tmp_path: Path) -> None:
    import pickle

    ydl.cache_dataset(records(100), "d", "v", make_storage(spec, tmp_path / "a"))
    machine = make_storage(spec, tmp_path / "m")
    ref = machine.fetch("d", "v")
    copy = pickle.loads(pickle.dumps(ref))  # what a spawned worker receives
    del ref
    assert not machine.local_cache.space.evict_copy("d", "v")
    assert labels(copy) == list(range(100))
    del copy
    assert machine.local_cache.space.evict_copy("d", "v")


def test_verify_pulls_a_damaged_local_copy_again(spec: dict, tmp_path: Path) -> None:
    ydl.cache_dataset(records(500), "d", "v", make_storage(spec, tmp_path / "a"))
    machine = make_storage(spec, tmp_path / "m")
    ref = machine.fetch("d", "v")
    chunk = Path(ref.directory) / ref.manifest.chunks[0].file
    good = chunk.read_bytes()
    del ref
    damaged = bytearray(good)
    damaged[100] ^= 0xFF
    chunk.write_bytes(bytes(damaged))
    machine.verify("d", "v")
    assert chunk.read_bytes() == good


def test_on_transfer_counts_every_chunk_uploaded_and_downloaded(spec: dict, tmp_path: Path) -> None:
    builder = make_storage(spec, tmp_path / "a")
    uploaded: list[int] = []
    ref = ydl.cache_dataset(
        records(3000), "ds", "v1", builder, chunk_bytes=64 << 10, on_transfer=uploaded.append
    )
    sizes = sorted(c.bytes for c in ref.manifest.chunks)
    assert len(sizes) > 1 and sorted(uploaded) == sizes
    reader = make_storage(spec, tmp_path / "b")
    downloaded: list[int] = []
    reader.fetch("ds", "v1", on_transfer=downloaded.append)
    assert sorted(downloaded) == sizes


def test_old_builds_of_a_pulled_copy_go_once_their_own_readers_are_done(
    spec: dict, tmp_path: Path
) -> None:
    """Readers pin the builds they read: with jobs overlapping across overwrites, a build
    nobody reads any more goes, whoever still reads a newer one."""
    a = make_storage(spec, tmp_path / "a", lease_ttl=1.0)
    b = make_storage(spec, tmp_path / "b")
    ydl.cache_dataset(records(300), "d", "v", a)
    job1 = b.fetch("d", "v")
    ydl.cache_dataset(records(400), "d", "v", a, overwrite=True)
    job2 = b.fetch("d", "v")
    del job1
    # What an eviction killed half-way left behind: removed before the next download.
    trash = tmp_path / "b" / "d" / "+trash.v.0123456789ab"
    trash.mkdir()
    (trash / "chunk-00000.mdb").write_bytes(b"x" * 100)
    ydl.cache_dataset(records(500), "d", "v", a, overwrite=True)
    job3 = b.fetch("d", "v")
    assert labels(job2) == list(range(400)) and labels(job3) == list(range(500))
    builds = {p.name for p in Path(job3.directory).iterdir() if p.is_dir()}
    assert builds == {c.file.split("/")[0] for r in (job2, job3) for c in r.manifest.chunks}
    assert not trash.exists()
