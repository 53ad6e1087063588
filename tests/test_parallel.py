"""Parallel builds: a process pool (workers=k) and Ray tasks (engine="ray") write the parts of a
source as chunks; the published version equals a serial build record for record, and tasks that
die or fail once are run again without losing or duplicating a record."""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.damage import version_files

import yogadl_plus as ydl
from yogadl_plus.building import starts
from yogadl_plus.cache.manifest import MANIFEST_NAME, ChunkInfo
from yogadl_plus.sources import as_source
from yogadl_plus.storage.sink import UploadSink

torch_data = pytest.importorskip("torch.utils.data")


@pytest.fixture(autouse=True)
def _always_the_pool(monkeypatch):
    """The small sources here are built by the pool, which serves them (a build this small is
    otherwise serial: see the tests of that below)."""
    monkeypatch.setattr(starts, "SERIAL_UNDER_SECONDS", 0.0)


# ----------------------------------------------------------------- sources (importable: workers
# are spawned processes that unpickle them by reference)


class Squares(torch_data.Dataset):
    """A map-style dataset; items in ``crash_at`` kill their worker (SIGKILL) or raise an
    OSError the first time they are read (marker files remember), and ``bad_at`` is no record."""

    def __init__(self, n, marker=None, crash_at=(), how="kill", bad_at=-1):
        self.n, self.marker, self.crash_at, self.how, self.bad_at = n, marker, crash_at, how, bad_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.crash_at and not os.path.exists(f"{self.marker}-{i}"):
            Path(f"{self.marker}-{i}").write_text(str(os.getpid()))
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ConnectionResetError("the network blinked")
        if i == self.bad_at:
            return {"x": "not a vector", "i": i}
        return {"x": np.full(3, i, dtype=np.float32) ** 2, "i": np.int64(i)}


class KillsItsWorker(Squares):
    """Item 90 kills its worker every time it is read (after the 64 the driver reads for the
    schema)."""

    def __getitem__(self, i):
        if i == 90:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


def write_parquet(folder: Path, files: int = 3, rows: int = 900, group: int = 100) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows)
        table = pa.table(
            {
                "id": ids,
                "vec": pa.FixedSizeListArray.from_arrays(
                    pa.array(rng.normal(size=rows * 4).astype(np.float32)), 4
                ),
                "tags": pa.array([[int(i)] * int(i % 4) for i in ids], pa.list_(pa.int32())),
                "name": pa.array([f"row-{i}" for i in ids]),
            }
        )
        pq.write_table(table, folder / f"part-{f}.parquet", row_group_size=group)
    return folder


def assert_same_records(a: ydl.DataRef, b: ydl.DataRef) -> None:
    assert len(a) == len(b)
    assert a.schema == b.schema
    every = list(range(len(a)))
    x, y = a.get_batch(every), b.get_batch(every)
    for name in x:
        if isinstance(x[name], list):
            assert len(x[name]) == len(y[name])
            assert all(np.array_equal(u, v) for u, v in zip(x[name], y[name])), name
        else:
            assert np.array_equal(x[name], y[name]), name


# ----------------------------------------------------------------- process pool


def test_pool_build_of_parquet_equals_the_serial_build(tmp_path, local_storage):
    data = write_parquet(tmp_path / "data")
    serial = ydl.cache_dataset(str(data), "events", "serial", local_storage)
    parallel = ydl.cache_dataset(str(data), "events", "pool", local_storage, workers=2)
    assert_same_records(serial, parallel)
    # One chunk per task: 27 row groups in 8 balanced parts, none of them cut.
    sizes = [c.records for c in parallel.manifest.chunks]
    assert len(sizes) == 8 and all(s % 100 == 0 for s in sizes) and max(sizes) - min(sizes) == 100
    assert parallel.manifest.source_fingerprint == serial.manifest.source_fingerprint
    assert version_files(local_storage, "events", "pool") == {
        MANIFEST_NAME,
        *(c.file for c in parallel.manifest.chunks),
    }
    shuffled = list(parallel.stream(shuffle=True, shuffle_seed=3, fields=["id"]))
    assert sorted(int(r["id"]) for r in shuffled) == list(range(2700))


@pytest.mark.slow
def test_pool_build_of_a_map_style_dataset_and_a_list(local_storage):
    serial = ydl.cache_dataset(Squares(1000), "squares", "serial", local_storage)
    parallel = ydl.cache_dataset(Squares(1000), "squares", "pool", local_storage, workers=2)
    assert_same_records(serial, parallel)
    records = [{"x": np.arange(i % 7, dtype=np.int16), "i": i} for i in range(500)]
    listed = ydl.cache_dataset(records, "listed", "pool", local_storage, workers=2)
    assert [int(r["i"]) for r in listed.stream()] == list(range(500))
    assert listed[123]["x"].tolist() == list(range(123 % 7))


@pytest.mark.crash
@pytest.mark.parametrize("how", ["kill", "oserror"])
def test_a_part_that_dies_once_is_built_again_without_duplicates(tmp_path, local_storage, how):
    marker = tmp_path / "crashed"
    source = Squares(1000, marker=str(marker), crash_at=(700,), how=how)
    ref = ydl.cache_dataset(source, "squares", "v1", local_storage, workers=2)
    assert (tmp_path / "crashed-700").exists()  # the first attempt really died
    assert_same_records(ydl.cache_dataset(Squares(1000), "squares", "serial", local_storage), ref)
    # The dead attempt's files are gone: the version holds exactly what its manifest names.
    assert version_files(local_storage, "squares", "v1") == {
        MANIFEST_NAME,
        *(c.file for c in ref.manifest.chunks),
    }
    ref.verify()


@pytest.mark.crash
def test_crashes_of_different_parts_are_charged_only_to_the_part_that_crashed(
    tmp_path, local_storage
):
    # Three parts each kill their worker once; every kill also breaks the pool under the parts
    # queued behind it, which must not use up their attempts.
    crash_at = (99, 199, 299)
    source = Squares(800, marker=str(tmp_path / "crashed"), crash_at=crash_at)
    ref = ydl.cache_dataset(source, "squares", "v1", local_storage, workers=2)
    assert all((tmp_path / f"crashed-{i}").exists() for i in crash_at)
    assert [int(r["i"]) for r in ref.stream()] == list(range(800))


@pytest.mark.crash
def test_a_part_that_always_kills_its_worker_ends_the_build(local_storage):
    with pytest.raises(ydl.WorkerDied, match=r"part 7 .* died 3 times"):
        ydl.cache_dataset(KillsItsWorker(100), "squares", "v1", local_storage, workers=2)
    assert local_storage.list() == []


def test_the_schema_is_inferred_from_the_first_records_across_parts(local_storage):
    records = [{"x": np.zeros(3 if i < 30 else 4, np.float32), "i": i} for i in range(200)]
    serial = ydl.cache_dataset(records, "shapes", "serial", local_storage)
    parallel = ydl.cache_dataset(records, "shapes", "pool", local_storage, workers=2)
    assert serial.schema["x"].shape == parallel.schema["x"].shape == (None,)
    assert_same_records(serial, parallel)


def test_parquet_files_of_different_types_are_read_as_the_dataset_types(tmp_path, local_storage):
    data = tmp_path / "mixed"
    data.mkdir()
    pq.write_table(pa.table({"id": pa.array(range(150), pa.int32())}), data / "a.parquet",
                   row_group_size=50)  # fmt: skip
    pq.write_table(pa.table({"id": pa.array(range(150, 300), pa.int64())}), data / "b.parquet",
                   row_group_size=50)  # fmt: skip
    serial = ydl.cache_dataset(str(data), "mixed", "serial", local_storage)
    parallel = ydl.cache_dataset(str(data), "mixed", "pool", local_storage, workers=2)
    assert_same_records(serial, parallel)


@pytest.mark.slow
def test_a_bad_record_fails_the_build_naming_it_and_publishes_nothing(local_storage):
    with pytest.raises(ydl.SchemaError, match="record 777"):
        ydl.cache_dataset(Squares(1000, bad_at=777), "squares", "v1", local_storage, workers=2)
    assert local_storage.list() == []
    left = os.listdir(os.path.join(local_storage.root, "squares"))
    assert [e for e in left if not e.startswith("+lock.")] == []  # no staging folder left


# ----------------------------------------------------------------- how workers start


def pool_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "yogadl_plus.building.pool"]


def test_a_small_source_is_built_serially_and_says_why_once(local_storage, caplog, monkeypatch):
    monkeypatch.setattr(starts, "SERIAL_UNDER_SECONDS", 0.5)
    with caplog.at_level(logging.INFO, logger="yogadl_plus"):
        ref = ydl.cache_dataset(Squares(200), "squares", "small", local_storage, workers=2)
    (said,) = pool_lines(caplog)
    assert said.startswith("squares:small is built serially, not by 2 workers: its 200 records")
    assert len(ref.manifest.chunks) == 1  # one writer: this process
    assert_same_records(ydl.cache_dataset(Squares(200), "squares", "v1", local_storage), ref)


@pytest.mark.slow
def test_how_the_workers_start_is_logged_once(local_storage, caplog):
    with caplog.at_level(logging.INFO, logger="yogadl_plus"):
        ref = ydl.cache_dataset(Squares(300), "squares", "pool", local_storage, workers=2)
    (said,) = pool_lines(caplog)
    assert said.startswith("squares:pool is built by 2 worker processes ")
    assert "forked from this process" in said or "started from a forkserver" in said
    assert_same_records(ydl.cache_dataset(Squares(300), "squares", "v1", local_storage), ref)


def test_workers_are_forked_only_where_that_is_safe(monkeypatch):
    def threads(*names):  # the threads this process runs besides this one
        made = [threading.Thread(name=name) for name in names]
        monkeypatch.setattr(starts.threading, "enumerate", lambda: [threading.main_thread(), *made])
        monkeypatch.setattr(starts.threading, "current_thread", threading.main_thread)

    torch_source = as_source(Squares(10))
    for name in ("tensorflow", "jax"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    threads("yogadl-readahead", "yogadl-plus-copy_0")  # left by a stream: they mind forks
    start = starts.worker_start(torch_source)
    assert start.context.get_start_method() == "fork"
    assert start.how == "forked from this process (it holds torch already)"
    # A list of records: its workers need nothing of this process; nor is it forked.
    listed = starts.worker_start(as_source([{"i": 1}]))
    assert listed.context.get_start_method() == "forkserver"
    assert "the iterable source's framework does not fork its own workers" in listed.how
    threads("yogadl-readahead", "your-server")
    served = starts.worker_start(torch_source)
    assert served.context.get_start_method() == "forkserver"
    assert served.how == (
        "started from a forkserver, which imports yogadl_plus.building.pool, pyarrow.parquet, "
        "torch once as it starts (not forked from this process: other threads run here "
        "(your-server))"
    )
    threads()
    monkeypatch.setitem(sys.modules, "tensorflow", object())
    assert "tensorflow is loaded" in starts.worker_start(torch_source).how


def test_sources_read_only_in_order_are_refused_with_a_reason(local_storage):
    def records():
        yield {"x": 1}

    with pytest.raises(ValueError, match="read once, in order"):
        ydl.cache_dataset(records, "gen", "v1", local_storage, workers=2)
    assert local_storage.list() == []


def test_unpicklable_parts_get_a_clear_error(local_storage):
    class Local(torch_data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"i": i}

    with pytest.raises(ydl.YogaError, match="top level of an importable module"):
        ydl.cache_dataset(Local(), "local", "v1", local_storage, workers=2)


@pytest.mark.parametrize(
    "options, message",
    [({"workers": 0}, "workers"), ({"engine": "spark"}, "engine"), ({"workers": 1.5}, "workers")],
)
def test_bad_parallel_arguments(local_storage, options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        ydl.cache_dataset([{"i": 1}], "x", "v1", local_storage, **options)


@pytest.mark.servers
def test_pool_build_into_a_bucket_uploads_what_the_tasks_wrote(tmp_path, s3_server, s3_bucket):
    from helpers.remote_helpers import make_storage, spec_for

    spec = spec_for("s3", s3_server, s3_bucket)
    storage = make_storage(spec, tmp_path / "builder")
    ref = ydl.cache_dataset(str(write_parquet(tmp_path / "data")), "ev", "v1", storage, workers=2)
    reader = make_storage(spec, tmp_path / "reader")
    assert_same_records(ref, reader.fetch("ev", "v1"))


# ----------------------------------------------------------------- storage objects travel


@pytest.mark.servers
def test_a_storage_made_from_keywords_travels_to_other_processes(tmp_path, s3_server, s3_bucket):
    storage = s3_server.storage(s3_bucket, "p", tmp_path / "c")
    storage.objects.create("hello", b"from the parent")
    code = (
        "import pickle, sys; objects = pickle.load(sys.stdin.buffer); "
        "print(objects.read('hello')[0].decode())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps(storage.objects),
        capture_output=True,
        check=True,
    )
    assert out.stdout.decode().strip() == "from the parent"


@pytest.mark.servers
def test_a_storage_with_a_ready_client_says_why_it_cannot_travel(tmp_path, s3_server, s3_bucket):
    from helpers.remote_helpers import make_storage, spec_for

    storage = make_storage(spec_for("s3", s3_server, s3_bucket), tmp_path)
    with pytest.raises(ydl.YogaError, match="without client="):
        pickle.dumps(storage.objects)


@pytest.mark.servers
def test_upload_sink_keeps_only_the_named_chunks(tmp_path, s3_server, s3_bucket):
    from helpers.remote_helpers import make_storage, spec_for

    storage = make_storage(spec_for("s3", s3_server, s3_bucket), tmp_path)
    sink = UploadSink(storage.objects, "ds/v1/", "b-1234")
    for name in ("p00000-aaaaaaaa-chunk-00000.mdb", "p00000-bbbbbbbb-chunk-00000.mdb"):
        storage.objects.create(f"ds/v1/b-1234/{name}", b"chunk")
    kept = ChunkInfo("b-1234/p00000-bbbbbbbb-chunk-00000.mdb", 1, 5, "0" * 64)
    sink.settle([kept])
    assert [k for k, _ in storage.objects.keys("ds/v1/")] == ["ds/v1/" + kept.file]
    missing = ChunkInfo("b-1234/p00001-cccccccc-chunk-00000.mdb", 1, 5, "0" * 64)
    with pytest.raises(ydl.CacheCorrupted, match="p00001-cccccccc"):
        sink.settle([kept, missing])


@pytest.mark.servers
def test_a_task_uploads_each_chunk_as_soon_as_it_is_written(tmp_path, s3_server, s3_bucket):
    from helpers.remote_helpers import make_storage, spec_for

    from yogadl_plus.cache.version_writer import source_blocks, write_blocks

    storage = make_storage(spec_for("s3", s3_server, s3_bucket), tmp_path)
    sink = UploadSink(storage.objects, "ds/v1/", "b-1234")
    read, uploaded_after, on_disk = [0], [], []

    def records():
        for i in range(20_000):
            read[0] += 1
            yield {"x": np.full(16, i, np.float32)}

    def deliver(info):
        uploaded_after.append(read[0])
        delivered = sink.deliver(str(tmp_path / "task"), info)
        on_disk.append(len(os.listdir(tmp_path / "task")))
        return delivered

    (tmp_path / "task").mkdir()
    schema = ydl.Schema([ydl.Field("x", np.float32, (16,))])
    _, blocks = source_blocks(ydl.sources.IterableSource(records), schema)
    chunks = write_blocks(str(tmp_path / "task"), blocks, schema, 32 << 10, on_chunk=deliver)
    assert len(chunks) > 5 and uploaded_after[0] < 20_000  # before the source was read through
    assert max(on_disk) <= 1  # the task held one chunk at a time on its disk
    keys = sorted(k for k, _ in storage.objects.keys("ds/v1/b-1234/"))
    assert keys == sorted(f"ds/v1/{c.file}" for c in chunks)


# ----------------------------------------------------------------- Ray


# (ray_cluster: conftest.py)


@pytest.mark.ray
def test_ray_build_equals_the_serial_build(tmp_path, local_storage, ray_cluster):
    data = write_parquet(tmp_path / "data")
    serial = ydl.cache_dataset(str(data), "events", "serial", local_storage)
    on_ray = ydl.cache_dataset(str(data), "events", "ray", local_storage, engine="ray")
    assert_same_records(serial, on_ray)
    assert len(on_ray.manifest.chunks) == 8  # 4 parts per CPU of the cluster


@pytest.mark.crash
@pytest.mark.ray
def test_ray_task_killed_once_is_retried_without_duplicates(tmp_path, local_storage, ray_cluster):
    marker = tmp_path / "crashed"
    source = Squares(1000, marker=str(marker), crash_at=(450,))
    ref = ydl.cache_dataset(source, "squares", "ray", local_storage, engine="ray", workers=2)
    assert (tmp_path / "crashed-450").exists()
    assert_same_records(ydl.cache_dataset(Squares(1000), "squares", "serial", local_storage), ref)
    assert version_files(local_storage, "squares", "ray") == {
        MANIFEST_NAME,
        *(c.file for c in ref.manifest.chunks),
    }


@pytest.mark.ray
def test_ray_task_errors_reach_the_caller_as_raised(local_storage, ray_cluster):
    with pytest.raises(ydl.SchemaError, match="record 777"):
        ydl.cache_dataset(Squares(1000, bad_at=777), "squares", "v1", local_storage, engine="ray")
    assert local_storage.list() == []


@pytest.mark.ray
@pytest.mark.servers
def test_ray_tasks_upload_their_chunks_into_the_bucket(tmp_path, s3_server, s3_bucket, ray_cluster):
    storage = s3_server.storage(s3_bucket, "team", tmp_path / "builder")
    data = write_parquet(tmp_path / "data")
    ref = ydl.cache_dataset(str(data), "ev", "v1", storage, engine="ray")
    builds = {c.file.split("/")[0] for c in ref.manifest.chunks}
    assert len(builds) == 1 and all("/p0000" in c.file for c in ref.manifest.chunks)
    listed = sorted(k for k, _ in storage.objects.keys("ev/v1/"))
    chunks = ["ev/v1/" + c.file for c in ref.manifest.chunks]
    assert listed == sorted(["ev/v1/manifest.json", *chunks])
    serial = ydl.cache_dataset(str(data), "ev", "serial", ydl.LocalStorage(tmp_path / "serial"))
    assert_same_records(serial, ref)


@pytest.mark.ray
@pytest.mark.servers
def test_a_failed_ray_build_leaves_no_chunks_in_the_bucket(
    tmp_path, s3_server, s3_bucket, ray_cluster
):
    storage = s3_server.storage(s3_bucket, "team", tmp_path / "builder")
    with pytest.raises(ydl.SchemaError, match="record 777"):
        ydl.cache_dataset(Squares(1000, bad_at=777), "sq", "v1", storage, engine="ray", workers=1)
    assert [k for k, _ in storage.objects.keys("sq/v1/")] == []


@pytest.mark.ray
def test_a_ray_dataset_is_a_source(tmp_path, local_storage, ray_cluster):
    import ray.data

    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    items = [
        {"id": i, "vec": np.full(2, i, np.float32), "var": np.arange(i % 3), "name": f"n{i}"}
        for i in range(1000)
    ]
    dataset = ray.data.from_items(items, override_num_blocks=5)
    on_ray = ydl.cache_dataset(dataset, "items", "ray", local_storage, engine="ray")
    serial = ydl.cache_dataset(dataset, "items", "serial", local_storage)
    assert_same_records(serial, on_ray)
    assert [int(r["id"]) for r in on_ray.stream()] == list(range(1000))
    assert on_ray[999]["vec"].tolist() == [999.0, 999.0]
    assert on_ray[998]["var"].tolist() == [0, 1] and on_ray[998]["name"] == "n998"
    assert len(on_ray.manifest.chunks) == 5 and on_ray.manifest.source_kind == "ray"
    pieces = ydl.sources.as_source(dataset).split(2)
    assert [(p.offset, p.length) for p in pieces] == [(i * 200, 200) for i in range(5)]
    with pytest.raises(ValueError, match="engine='ray'"):
        ydl.cache_dataset(dataset, "items", "pool", local_storage, workers=2)


# ----------------------------------------------------------------- scripts without a guard


def test_a_script_building_at_its_top_level_fails_saying_so_instead_of_waiting(tmp_path):
    """Workers started by a forkserver run the script's top level again: its cache_dataset
    waited for the lock of the very build its worker belonged to, for ever. It now fails
    there, and the build names the cure."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import numpy as np\n"
        "import yogadl_plus as ydl\n"
        "schema = ydl.Schema([ydl.Field('x', np.int64)])\n"
        "records = [{'x': np.int64(i)} for i in range(100)]\n"
        f"ydl.cache_dataset(records, 'd', 'v1', ydl.LocalStorage({str(tmp_path / 'c')!r}),\n"
        "                  schema=schema, workers=2, progress=False)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode != 0
    assert "WorkerDied" in done.stderr
    assert 'if __name__ == "__main__":' in done.stderr.splitlines()[-1]
    assert "imports the script that started it" in done.stderr
