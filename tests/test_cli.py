"""The yogadl-plus command: every command, --json, progress bars, exit codes, push and pull.

Most tests call ``main([...])`` in this process; a few run ``python -m yogadl_plus`` to see the
real exit status and output of a process. Push and pull run against the real S3 and GCS servers
of tests/servers.py, reached through the standard credential chains (environment variables).
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.damage import chunk_path, without_builds
from helpers.remote_helpers import records

import yogadl_plus as ydl
from yogadl_plus.cli import main
from yogadl_plus.demo import DEMO_PARQUET
from yogadl_plus.storage import copy_version

COMMANDS = [
    *("demo", "build", "ls", "info", "head", "verify", "push", "pull", "rm", "lineage", "bench")
]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m yogadl_plus ARGS`` with this test's environment (YOGADL_PLUS_HOME, servers)."""
    return subprocess.run(
        [sys.executable, "-m", "yogadl_plus", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a failed command wrote to stderr."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


@pytest.fixture
def local(tmp_path: Path) -> ydl.LocalStorage:
    """A local storage holding sensors:v1, 3000 records in several chunks."""
    storage = ydl.LocalStorage(tmp_path / "local")
    built = ydl.cache_dataset(
        records(3000), "sensors", "v1", storage, chunk_bytes=200_000, progress=False
    )
    assert len(built.manifest.chunks) > 2
    return storage


def remote_url(kind: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the test server of ``kind``, its URL, and the environment that makes
    the default clients (of this process and of child processes) reach it."""
    server = request.getfixturevalue(f"{kind}_server")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    if kind == "s3":
        import boto3

        # boto3's default session keeps the credentials it first read: read these.
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    else:
        monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", server.project)
    scheme = "s3" if kind == "s3" else "gs"
    return f"{scheme}://{server.make_bucket()}/team/caches"


@pytest.fixture(params=["s3", "gcs"])
def remote(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return remote_url(request.param, request, monkeypatch)


@pytest.fixture
def s3_url(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return remote_url("s3", request, monkeypatch)


def all_columns(ref: ydl.DataRef) -> dict[str, Any]:
    return ref.get_batch(np.arange(len(ref)))


# --------------------------------------------------------------------------- the commands


def test_build_ls_info_head_verify_rm(tmp_path, capsys):
    store = ["--storage", str(tmp_path)]
    assert main(["build", DEMO_PARQUET, "sensors", "v2", "--columns", "id,label", *store]) == 0
    assert "5000 records" in capsys.readouterr().out
    assert main(["ls", *store]) == 0 and capsys.readouterr().out == "sensors\tv2\n"
    assert main(["info", "sensors", "v2", *store]) == 0
    info = capsys.readouterr().out
    assert "records   5000" in info and "label" in info and "features" not in info
    assert f"where     {tmp_path / 'sensors' / 'v2'}\n" in info
    assert main(["info", "sensors", "v2", "--json", *store]) == 0
    assert json.loads(capsys.readouterr().out)["num_records"] == 5000
    assert main(["head", "sensors", "v2", "-n", "3", *store]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["index", "id", "label"] and len(rows) == 3
    # Aligned: every value starts where its column's header does.
    at = header.index("id"), header.index("label")
    assert [row[at[0] : at[1]].rstrip() for row in rows] == ["0", "1", "2"]
    assert [row[at[1] :] for row in rows] == ["0", "0", "1"]
    assert main(["head", "sensors", "v2", "-n", "2", "--json", *store]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == [{"index": 0, "id": 0, "label": 0}, {"index": 1, "id": 1, "label": 0}]
    assert main(["verify", "sensors", "v2", *store]) == 0
    assert "every chunk matches its checksum" in capsys.readouterr().out
    assert main(["rm", "sensors", "v2", *store]) == 0
    assert ydl.LocalStorage(tmp_path).list() == []


def test_head_json_writes_whole_values_and_the_schema(tmp_path, capsys):
    # Before: arrays came as display text ("float32[3] [1.5, nan, ...]"), bytes as their repr,
    # and no schema said what a value is.
    records = [
        {
            "f": np.array([1.5, np.nan, -np.inf], np.float32),
            "image": np.arange(6, dtype=np.uint8).reshape(2, 3) + i,
            "raw": b"\x00\xffhi",
            "text": "h\u00e9llo",
            "at": np.datetime64("2026-11-24T10:00:00", "s"),
            "took": np.timedelta64(5, "ms"),
            "tokens": np.arange(i + 1, dtype=np.int32),
            "n": i,
        }
        for i in range(3)
    ]
    ydl.cache_dataset(records, "h", "v1", ydl.LocalStorage(tmp_path), progress=False)
    assert main(["head", "h", "v1", "-n", "2", "--json", "--storage", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["dataset_id"], out["version"]) == ("h", "v1")
    schema = {field["name"]: field for field in out["schema"]}
    assert schema["image"]["dtype"] == "|u1" and schema["image"]["shape"] == [2, 3]
    assert schema["tokens"]["shape"] == [None] and schema["took"]["dtype"] == "<m8[ms]"
    first, second = out["records"]
    assert first == {
        "index": 0,
        "f": [1.5, "NaN", "-Infinity"],
        "image": [[0, 1, 2], [3, 4, 5]],
        "raw": base64.b64encode(b"\x00\xffhi").decode(),
        "text": "h\u00e9llo",
        "at": "2026-11-24T10:00:00",
        "took": 5,
        "tokens": [0],
        "n": 0,
    }
    assert second["image"] == [[1, 2, 3], [4, 5, 6]] and second["tokens"] == [0, 1]
    assert main(["head", "h", "v1", "--fields", "n", "--json", "--storage", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [f["name"] for f in out["schema"]] == ["n"]
    assert out["records"] == [{"index": i, "n": i} for i in range(3)]


def test_every_printing_command_speaks_json(local, tmp_path, capsys):
    store = ["--storage", local.root]
    version = ["sensors", "v1", *store, "--json"]
    other = str(tmp_path / "other")
    runs = {
        "build": ["build", DEMO_PARQUET, "demo", "v1", *store, "--json"],
        "ls": ["ls", *store, "--json"],
        "info": ["info", *version],
        "head": ["head", *version, "-n", "2"],
        "verify": ["verify", *version],
        "bench": ["bench", *version, "--batch-size", "500"],
        "push": ["push", *version, other],
        "pull": ["pull", *version, other, "--overwrite"],
        "rm": ["rm", "demo", "v1", *store, "--json"],
    }
    out = {}
    for name, argv in runs.items():
        assert main(argv) == 0, name
        out[name] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert out["build"][0].pop("bytes") > 0
    assert out["build"] == [
        {
            "dataset_id": "demo",
            "version": "v1",
            "records": 5000,
            "chunks": 1,
            "where": local.path("demo", "v1"),
            "built": True,
        }
    ]
    assert out["ls"] == [[{"dataset_id": "demo", "version": "v1"}, *out["ls"][0][1:]]]
    assert out["info"][0]["where"] == local.path("sensors", "v1")
    assert [row["index"] for row in out["head"][0]["records"]] == [0, 1]
    assert out["verify"][0]["verified"] is True
    assert [row["records"] for row in out["bench"][0]] == [3000]
    assert out["push"][0]["where"] == os.path.join(other, "sensors", "v1")
    assert out["pull"][0]["where"] == local.path("sensors", "v1")
    assert out["rm"] == [{"dataset_id": "demo", "version": "v1", "removed": True}]


def test_build_caches_what_a_module_function_returns(tmp_path, monkeypatch, capsys):
    (tmp_path / "cli_made_records.py").write_text(
        "def make():\n"
        "    return ({'label': i, 'name': str(i)} for i in range(123))\n"
        "def not_a_source():\n"
        "    return 42\n"
        "NOT_A_FUNCTION = 'x'\n"
    )
    monkeypatch.chdir(tmp_path)  # imported from the current directory, as python -m would
    monkeypatch.setattr(sys, "path", list(sys.path))
    store = ["--storage", str(tmp_path / "store")]
    assert main(["build", "cli_made_records:make", "made", "v1", *store]) == 0
    assert "123 records" in capsys.readouterr().out
    ref = ydl.LocalStorage(tmp_path / "store").fetch("made", "v1")
    assert ref[122] == {"label": 122, "name": "122"}
    for spec, message in [
        ("no_such_module_here:make", "cannot import module 'no_such_module_here'"),
        ("cli_made_records:missing", "module 'cli_made_records' has no 'missing'"),
        ("cli_made_records:NOT_A_FUNCTION", "'NOT_A_FUNCTION' is a str, not a function"),
        ("cli_made_records:not_a_source", "returned a int, not a source"),
    ]:
        assert main(["build", spec, "made", "v2", *store]) == 2, spec
        line = error_line(capsys)
        assert line.startswith(f"yogadl-plus build: error: {spec}") and message in line


def test_bench_times_each_epoch(tmp_path, capsys):
    store = ["--storage", str(tmp_path)]
    assert main(["build", DEMO_PARQUET, "sensors", "v1", *store]) == 0
    capsys.readouterr()
    options = ["--shuffle", "--seed", "3", "--num-shards", "2", "--shard-rank", "1"]
    options += ["--batch-size", "100", "--fields", "id", "--num-workers", "2", "--epochs", "3"]
    assert main(["bench", "sensors", "v1", *store, *options, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["epoch"] for row in rows] == [0, 1, 2]
    for row in rows:
        assert (row["records"], row["batches"]) == (2500, 25)
        assert row["records_per_s"] == pytest.approx(2500 / row["seconds"])
        # MB/s counts the decoded bytes: 2500 int64 ids.
        assert row["mb_per_s"] * 1e6 * row["seconds"] == pytest.approx(2500 * 8)
        assert 0 < row["first_item_s"] < row["seconds"]
        # Where the epoch's time went (stream.stats()): the workers read and decoded.
        assert row["time"]["reading"] > 0 and row["time"]["waiting_on_workers"] > 0
    assert main(["bench", "sensors", "v1", *store, "--shard-by", "chunks"]) == 0
    header, row, why, spent, verdict = capsys.readouterr().out.splitlines()
    assert header.split("  ")[:4] == ["epoch", "records", "seconds", "records/s"]
    # Record by record too, MB/s counts the decoded bytes (stream.stats()): only batches/s
    # has no meaning there.
    assert row.split()[:2] == ["0", "5000"] and row.split()[4] == "-"
    assert float(row.split()[5]) > 0
    assert why == "(batches/s: with --batch-size)"
    assert spent.startswith("time: reading ") and "decoding" in spent and "own" in spent
    assert "data-bound" in verdict  # stats().summary(): the verdict and what to do


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=lambda c: c[0] if c else "")
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    out = capsys.readouterr().out
    prog = " ".join(["yogadl-plus", *command])
    assert exit_info.value.code == 0 and out.startswith(f"usage: {prog} [-h]")
    if not command:
        assert "4 storage unreachable or denied" in " ".join(out.split())


# --------------------------------------------------------------------------- errors


def test_errors_are_one_clear_line_and_exit_2(tmp_path, capsys):
    store = ["--storage", str(tmp_path)]
    assert main(["info", "bad/name", "v1", *store]) == 2
    assert "not allowed" in error_line(capsys)
    assert main(["build", str(tmp_path / "none.parquet"), "x", "v1", *store]) == 2
    assert error_line(capsys).startswith("yogadl-plus build: error: Parquet path")
    assert main(["build", DEMO_PARQUET, "sensors", "v1", *store]) == 0
    capsys.readouterr()
    shards = ["--shuffle", "--num-shards", "2"]  # a shuffle across shards needs a shared seed
    assert main(["bench", "sensors", "v1", *store, *shards]) == 2
    # In the flags' words (before: the API's "shuffle=True with num_shards > 1 needs ...").
    assert error_line(capsys).startswith(
        "yogadl-plus bench: error: --shuffle with --num-shards > 1 needs --seed N"
    )
    assert main(["bench", "sensors", "v1", *store, "--num-shards", "2", "--no-progress"]) == 0
    table = capsys.readouterr().out  # without --shuffle, no seed is needed
    assert "with --batch-size" in table  # why batches/s and MB/s show "-"
    with pytest.raises(SystemExit) as exit_info:
        main(["head", "sensors"])
    assert exit_info.value.code == 2
    assert (
        "yogadl-plus head: error: the following arguments are required" in capsys.readouterr().err
    )


def test_a_missing_version_exits_3_from_the_process(tmp_path):
    result = run_cli("info", "nope", "v1", "--storage", str(tmp_path))
    assert result.returncode == 3 and result.stdout == ""
    assert result.stderr.startswith("yogadl-plus info: error: no version 'v1' of dataset 'nope'")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("command", ["ls", "info", "head", "verify", "rm", "bench", "push"])
def test_reading_commands_create_nothing_and_name_a_missing_root(command, tmp_path, capsys):
    # Before: `ls --storage /typo` printed nothing, exited 0 and made the folder.
    typo = tmp_path / "typo"
    args = {"ls": [], "push": ["d", "v", str(tmp_path / "elsewhere")]}.get(command, ["d", "v"])
    assert main([command, *args, "--storage", str(typo)]) == 3
    line = error_line(capsys)
    assert f"no storage at {typo}" in line and "--storage" in line, line
    assert not typo.exists() and not (tmp_path / "elsewhere").exists()


def test_the_default_root_missing_is_named_with_how_to_look_elsewhere(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("YOGADL_PLUS_HOME", str(tmp_path / "home"))
    assert main(["ls"]) == 3
    line = error_line(capsys)
    assert str(tmp_path / "home") in line and "$YOGADL_PLUS_HOME" in line, line
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("command", ["info", "head", "verify", "rm", "bench"])
def test_a_version_missing_from_the_default_storage_says_how_to_look_elsewhere(
    command, tmp_path, monkeypatch, capsys
):
    # Before: "no version 'v1' of dataset 'toy' in LocalStorage(...)", with no hint that a
    # quickstart caching into another folder is found with --storage or $YOGADL_PLUS_HOME.
    monkeypatch.setenv("YOGADL_PLUS_HOME", str(tmp_path))
    assert main([command, "toy", "v1"]) == 3
    line = error_line(capsys)
    assert f"no version 'v1' of dataset 'toy' in LocalStorage('{tmp_path}')" in line, line
    assert "that is the default storage ($YOGADL_PLUS_HOME" in line, line
    assert "--storage PATH" in line and line.endswith("set $YOGADL_PLUS_HOME."), line
    # Named explicitly, the storage is where the user meant to look: no hint.
    assert main([command, "toy", "v1", "--storage", str(tmp_path)]) == 3
    assert "default storage" not in error_line(capsys)


def test_ls_on_a_dataset_or_version_folder_names_the_root(local, capsys):
    dataset = os.path.join(local.root, "sensors")
    assert main(["ls", "--storage", dataset]) == 3
    assert f"the storage root is {local.root}" in error_line(capsys)
    assert main(["ls", "--storage", os.path.join(dataset, "v1")]) == 3
    assert f"version sensors:v1; the storage root is {local.root}" in error_line(capsys)
    assert main(["ls", "--storage", local.root]) == 0


def test_rm_of_a_missing_version_lists_those_there_and_leaves_no_lock(local, capsys):
    before = sorted(os.listdir(os.path.join(local.root, "sensors")))
    assert main(["rm", "sensors", "v9", "--storage", local.root]) == 3
    line = error_line(capsys)
    assert "no version 'v9' of dataset 'sensors'" in line and "('sensors', 'v1')" in line, line
    assert sorted(os.listdir(os.path.join(local.root, "sensors"))) == before
    assert main(["rm", "other", "v1", "--storage", local.root]) == 3
    capsys.readouterr()
    assert not os.path.exists(os.path.join(local.root, "other"))


def test_a_damaged_chunk_fails_verify_with_exit_1(local, capsys):
    chunk = chunk_path(local.fetch("sensors", "v1"), 1)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(data)
    assert main(["verify", "sensors", "v1", "--storage", local.root]) == 1
    line = error_line(capsys)
    assert line.startswith(f"yogadl-plus verify: error: chunk {chunk} has sha256")


@pytest.mark.servers
def test_a_denied_storage_exits_4(s3_url, monkeypatch, capsys):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    assert main(["ls", "--storage", s3_url]) == 4
    assert error_line(capsys).startswith(f"yogadl-plus ls: error: {s3_url}: access denied")


def test_ctrl_c_exits_130_and_bugs_exit_70_with_their_traceback(tmp_path, monkeypatch, capsys):
    def interrupted(self: Any) -> list[tuple[str, str]]:
        raise KeyboardInterrupt

    monkeypatch.setattr(ydl.LocalStorage, "list", interrupted)
    assert main(["ls", "--storage", str(tmp_path)]) == 130
    assert error_line(capsys) == "yogadl-plus ls: error: interrupted"

    def broken(self: Any) -> list[tuple[str, str]]:
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(ydl.LocalStorage, "list", broken)
    assert main(["ls", "--storage", str(tmp_path)]) == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: a bug of ours" in err

    def died(self: Any) -> list[tuple[str, str]]:
        raise ydl.WorkerDied("part 3: its worker process died 3 times")

    monkeypatch.setattr(ydl.LocalStorage, "list", died)
    assert main(["ls", "--storage", str(tmp_path)]) == 5
    assert error_line(capsys) == "yogadl-plus ls: error: part 3: its worker process died 3 times"


# --------------------------------------------------------------------------- progress bars


@pytest.mark.parametrize("command", ["verify", "push", "bench"])
@pytest.mark.parametrize(
    "tty, flags, shown", [(True, [], True), (True, ["--no-progress"], False), (False, [], False)]
)
def test_progress_bars_only_on_a_terminal_and_when_asked(
    local, tmp_path, monkeypatch, capsys, command, tty, flags, shown
):
    stderr = io.StringIO()
    stderr.isatty = lambda: tty  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stderr", stderr)
    target = [str(tmp_path / "other")] if command == "push" else []
    assert main([command, "sensors", "v1", *target, "--storage", local.root, *flags]) == 0
    doing = {"verify": "verifying", "push": "pushing", "bench": "bench"}[command]
    assert (f"{doing} sensors:v1" in stderr.getvalue()) is shown


# --------------------------------------------------------------------------- push and pull


@pytest.mark.servers
def test_push_then_pull_copies_a_version_whole(local, remote, tmp_path, monkeypatch, capsys):
    built = local.fetch("sensors", "v1")
    pushed = run_cli("push", "sensors", "v1", remote, "--storage", local.root, "--json")
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["where"] == f"{remote}/sensors/v1"
    # Another machine: its own local cache of the bucket, so every chunk comes through it.
    monkeypatch.setenv("YOGADL_PLUS_HOME", str(tmp_path / "machine-b"))
    second = ydl.LocalStorage(tmp_path / "second")
    assert main(["pull", "sensors", "v1", remote, "--storage", second.root]) == 0
    assert f"3000 records in {len(built.manifest.chunks)} chunk(s)" in capsys.readouterr().out
    assert list((tmp_path / "machine-b").rglob("*.mdb"))
    pulled = second.fetch("sensors", "v1")
    assert without_builds(pulled.manifest) == without_builds(built.manifest)
    for name, column in all_columns(built).items():
        np.testing.assert_array_equal(all_columns(pulled)[name], column)
    assert main(["verify", "sensors", "v1", "--storage", second.root]) == 0


@pytest.mark.servers
def test_push_refuses_a_damaged_chunk_and_publishes_nothing(local, s3_url, tmp_path, capsys):
    chunk = chunk_path(local.fetch("sensors", "v1"), 2)
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0x01
    chunk.write_bytes(data)
    assert main(["push", "sensors", "v1", s3_url, "--storage", local.root]) == 1
    assert error_line(capsys).startswith(f"yogadl-plus push: error: chunk {chunk} has sha256")
    bucket = ydl.open_storage(s3_url, local_cache=tmp_path / "look")
    assert bucket.list() == []
    assert not [key for key, _ in bucket.objects.keys("") if key.endswith(".mdb")]


@pytest.mark.servers
def test_verify_pulls_a_damaged_local_copy_of_a_bucket_again(local, s3_url, capsys):
    copy_version(local, ydl.open_storage(s3_url), "sensors", "v1")
    home = Path(os.environ["YOGADL_PLUS_HOME"])
    chunk = next(home.joinpath("+remote").rglob("chunk-00001.mdb"))
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0x01  # same size: a fetch does not notice, verify does
    os.remove(chunk)  # the pushed copy is a link to the local one: damage only this one
    chunk.write_bytes(data)
    assert main(["verify", "sensors", "v1", "--storage", s3_url]) == 0
    assert "every chunk matches its checksum" in capsys.readouterr().out
    assert chunk.read_bytes() == chunk_path(local.fetch("sensors", "v1"), 1).read_bytes()


@pytest.mark.servers
def test_pull_pulls_a_damaged_local_copy_of_a_bucket_again(local, s3_url, tmp_path, capsys):
    copy_version(local, ydl.open_storage(s3_url), "sensors", "v1")
    home = Path(os.environ["YOGADL_PLUS_HOME"])
    chunk = next(home.joinpath("+remote").rglob("chunk-00001.mdb"))
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0x01  # same size: the pull reuses the local copy, its check catches it
    os.remove(chunk)
    chunk.write_bytes(data)
    elsewhere = ["--storage", str(tmp_path / "elsewhere")]
    assert main(["pull", "sensors", "v1", s3_url, *elsewhere]) == 0
    pulled = ydl.LocalStorage(tmp_path / "elsewhere").fetch("sensors", "v1")
    pulled.verify()
    assert main(["verify", "sensors", "v1", *elsewhere]) == 0


# --------------------------------------------------------------------------- copy_version


def test_copy_version_links_checks_and_keeps_the_manifest(local, tmp_path):
    target = ydl.LocalStorage(tmp_path / "target")
    copied: list[int] = []
    ref = copy_version(local, target, "sensors", "v1", progress=copied.append)
    source = local.fetch("sensors", "v1")
    assert without_builds(ref.manifest) == without_builds(source.manifest)
    assert copied == [c.bytes for c in source.manifest.chunks]
    for number in range(len(source.manifest.chunks)):
        a, b = (os.stat(chunk_path(r, number)) for r in (source, ref))
        assert a.st_ino == b.st_ino  # hard links: no bytes copied


def test_copy_version_copies_where_it_cannot_link(local, tmp_path, monkeypatch):
    def no_links(source: str, target: str) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    ref = copy_version(local, ydl.LocalStorage(tmp_path / "target"), "sensors", "v1")
    source = local.fetch("sensors", "v1")
    for number in range(len(source.manifest.chunks)):
        a, b = (chunk_path(r, number) for r in (source, ref))
        assert os.stat(a).st_ino != os.stat(b).st_ino
        assert Path(a).read_bytes() == Path(b).read_bytes()


def test_copy_version_keeps_an_existing_version_unless_overwrite(local, tmp_path):
    target = ydl.LocalStorage(tmp_path / "target")
    ydl.cache_dataset(records(10), "sensors", "v1", target, progress=False)
    assert len(copy_version(local, target, "sensors", "v1")) == 10
    assert len(copy_version(local, target, "sensors", "v1", overwrite=True)) == 3000


def test_copy_version_names_a_missing_chunk(local, tmp_path):
    os.remove(chunk_path(local.fetch("sensors", "v1"), 1))
    target = ydl.LocalStorage(tmp_path / "target")
    with pytest.raises(ydl.CacheCorrupted, match=r"chunk .*chunk-00001\.mdb is missing"):
        copy_version(local, target, "sensors", "v1")
    assert target.list() == []


@pytest.mark.slow
def test_build_with_workers_equals_the_serial_build(tmp_path, capsys):
    store = ["--storage", str(tmp_path)]
    assert main(["build", DEMO_PARQUET, "sensors", "serial", *store]) == 0
    assert main(["build", DEMO_PARQUET, "sensors", "pool", "--workers", "2", *store]) == 0
    assert "5000 records in 5 chunk(s)" in capsys.readouterr().out  # one chunk per row group
    storage = ydl.LocalStorage(tmp_path)
    serial, pool = storage.fetch("sensors", "serial"), storage.fetch("sensors", "pool")
    every = list(range(len(serial)))
    assert all(
        (serial.get_batch(every)[k] == pool.get_batch(every)[k]).all() for k in ("id", "features")
    )
    assert main(["build", DEMO_PARQUET, "sensors", "bad", "--workers", "0", *store]) == 2
    assert "workers must be" in capsys.readouterr().err


# --- rough edges a new user meets ---


def test_head_json_writes_every_dtype_the_schema_allows(tmp_path, capsys):
    # Before: a complex field exited 70, "Object of type complex is not JSON serializable".
    store = ["--storage", str(tmp_path)]
    kinds = ["bool", "int8", "uint64", "float16", "float32", "float64", "complex64", "complex128"]
    columns: dict[str, Any] = {k: np.array([1, 0], dtype=k) for k in kinds}
    columns["c_arr"] = np.array([[1 + 2j, np.nan + 1j]] * 2, np.complex64)
    columns["when"] = np.array(["2026-01-01", "NaT"], "datetime64[s]")
    columns["took"] = np.array([5, 7], "timedelta64[ms]")
    columns["text"] = np.array(["a", "é"])
    columns["blob"] = [b"\x00\xff", b""]
    columns["maybe"] = [None, 3.5]
    ydl.cache_dataset(columns, "kinds", "v1", ydl.LocalStorage(tmp_path), progress=False)
    assert main(["head", "kinds", "v1", "--json", *store]) == 0
    first, second = json.loads(capsys.readouterr().out)["records"]
    assert first["complex64"] == [1.0, 0.0] and first["c_arr"] == [[1.0, 2.0], ["NaN", 1.0]]
    assert first["uint64"] == 1 and first["bool"] is True and second["float16"] == 0.0
    assert first["when"] == "2026-01-01T00:00:00" and second["when"] == "NaT"
    assert first["took"] == 5 and first["text"] == "a" and second["text"] == "é"
    assert base64.b64decode(first["blob"]) == b"\x00\xff" and first["maybe"] is None


def test_head_refuses_a_negative_count_and_an_empty_field_list(local, capsys):
    store = ["--storage", str(local.root)]
    with pytest.raises(SystemExit) as exited:
        main(["head", "sensors", "v1", "-n", "-1", *store])
    assert exited.value.code == 2 and "must be 0 or more, got -1" in capsys.readouterr().err
    assert main(["head", "sensors", "v1", "--fields", "", *store]) == 2
    assert "a field name is empty" in error_line(capsys)
    assert main(["head", "sensors", "v1", "--fields", "label,", *store]) == 2
    assert "a field name is empty" in error_line(capsys)


def test_rm_leaves_no_lock_and_no_empty_dataset_folder(local, capsys):
    assert main(["rm", "sensors", "v1", "--storage", str(local.root)]) == 0
    assert os.listdir(local.root) == []
    capsys.readouterr()
    assert main(["ls", "--storage", str(local.root)]) == 0
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("no versions in LocalStorage(")
    assert main(["ls", "--json", "--storage", str(local.root)]) == 0
    assert capsys.readouterr().out == "[]\n"


def test_storage_goes_before_the_command_as_well(local, capsys):
    assert main(["--storage", str(local.root), "ls"]) == 0
    assert capsys.readouterr().out == "sensors\tv1\n"
    assert main(["--storage", "/nowhere", "info", "sensors", "v1", "--storage", local.root]) == 0


def test_build_says_whether_it_built_or_reused(tmp_path, capsys):
    store = ["--storage", str(tmp_path)]
    assert main(["build", DEMO_PARQUET, "sensors", "v1", *store]) == 0
    out = capsys.readouterr()
    assert out.out.rstrip().endswith(": built") and "yogadl-plus: built sensors:v1" in out.err
    assert main(["build", DEMO_PARQUET, "sensors", "v1", *store]) == 0
    out = capsys.readouterr()
    assert "reused (already cached; --overwrite rebuilds it)" in out.out and out.err == ""
    assert main(["build", DEMO_PARQUET, "sensors", "v1", "--json", *store]) == 0
    assert json.loads(capsys.readouterr().out)["built"] is False


def test_a_changed_source_is_one_warning_line(tmp_path, capsys):
    import shutil

    source = tmp_path / "data.parquet"
    shutil.copy(DEMO_PARQUET, source)
    store = ["--storage", str(tmp_path / "store")]
    assert main(["build", str(source), "sensors", "v1", *store]) == 0
    capsys.readouterr()
    os.utime(source, (1, 1))  # a new mtime: the fingerprint changes
    assert main(["build", str(source), "sensors", "v1", *store]) == 0
    err = capsys.readouterr().err
    assert err.startswith("yogadl-plus build: warning: the source of 'sensors' version 'v1'")
    assert err.count("\n") == 1 and "SourceChangedWarning" not in err


def test_bench_draws_where_the_time_went(local, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    picture = tmp_path / "bench.png"
    argv = ["bench", "sensors", "v1", "--storage", local.root, "--batch-size", "100"]
    assert main([*argv, "--epochs", "2", "--plot", str(picture)]) == 0
    out = capsys.readouterr().out
    assert "data-bound" in out or "not data-bound" in out
    assert f"(drawn in {picture})" in out
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000


def test_bench_plot_names_the_extra_it_needs(local, monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def without_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_matplotlib)
    argv = ["bench", "sensors", "v1", "--storage", local.root, "--plot", "x.png"]
    assert main(argv) == 2
    assert "pip install 'yogadl_plus[plot]'" in error_line(capsys)


# --------------------------------------------------------------------------- lineage


@pytest.fixture
def lineage_store(tmp_path: Path) -> tuple[ydl.DataRef, list[str], Path]:
    """A version of 200 records (field "i": the index), the --storage option, a folder."""
    storage = ydl.LocalStorage(tmp_path / "store")
    ref = ydl.cache_dataset({"i": np.arange(200)}, "d", "v1", storage, progress=False)
    return ref, ["--storage", str(storage.root)], tmp_path


def lineage_rows(capsys: pytest.CaptureFixture[str]) -> list[list[int]]:
    return [row["records"] for row in json.loads(capsys.readouterr().out)]


def test_lineage_of_a_skip_stream_needs_its_skip_list(lineage_store, capsys):
    ref, store, folder = lineage_store
    bad = np.arange(0, 200, 3)
    args = dict(shuffle=True, shuffle_seed=4, batch_size=8)
    run = ref.stream(skip=bad, **args)
    epoch = iter(run)
    next(epoch)
    state = folder / "state.json"
    state.write_text(json.dumps(run.state().to_dict()))
    coming = [b["i"].tolist() for b in [next(epoch) for _ in range(4)]]
    argv = ["lineage", "d", "v1", "--state", str(state), "--items", "0:4", "--json", *store]
    # Before: the skipped records were named, as if handed out, without a word.
    assert main(argv) == 2
    line = error_line(capsys)
    assert "skipped 67 records" in line and "pass them with --skip FILE" in line
    np.save(folder / "bad.npy", bad)
    mask = np.isin(np.arange(200), bad)
    np.save(folder / "mask.npy", mask)
    (folder / "bad.txt").write_text("\n".join(map(str, bad)))
    (folder / "bad.csv").write_text(", ".join(map(str, bad[::-1])))
    (folder / "mask.txt").write_text(" ".join(str(v) for v in mask))
    for name in ("bad.npy", "mask.npy", "bad.txt", "bad.csv", "mask.txt"):
        assert main([*argv, "--skip", str(folder / name)]) == 0, name
        assert lineage_rows(capsys) == coming  # the batch size is the state's
    (folder / "other.txt").write_text("1 2 4")
    assert main([*argv, "--skip", str(folder / "other.txt")]) == 2
    assert "holds 3 records, not the 67 records" in error_line(capsys)
    for text, said in [("1 x 2", "word 2, 'x', is not a record index"),
                       ("1 200", "record 200, out of range [0, 200)")]:  # fmt: skip
        (folder / "wrong.txt").write_text(text)
        assert main([*argv, "--skip", str(folder / "wrong.txt")]) == 2
        assert said in error_line(capsys)
    np.save(folder / "short.npy", mask[:-1])
    assert main([*argv, "--skip", str(folder / "short.npy")]) == 2
    assert "bool mask of 199 values, but the source has 200 records" in error_line(capsys)
    assert main([*argv, "--skip", str(folder / "none.npy")]) == 2
    assert "cannot read it" in error_line(capsys)


def test_lineage_refuses_a_predicate_stream_and_other_batches(lineage_store, capsys):
    ref, store, folder = lineage_store
    state = folder / "state.json"
    even = ydl.predicates.in_lambda("i", lambda i: i % 2 == 0)
    state.write_text(json.dumps(ref.stream(predicate=even, batch_size=4).state().to_dict()))
    argv = ["lineage", "d", "v1", "--state", str(state), *store]
    assert main(argv) == 2
    line = error_line(capsys)
    assert "with the predicate in_lambda('i'" in line and "in Python" in line
    state.write_text(json.dumps(ref.stream(batch_size=4, start_offset=10).state().to_dict()))
    assert main([*argv, "--batch-size", "5"]) == 2
    assert "batches of 4: --batch-size 5 would number other items" in error_line(capsys)
    assert main([*argv, "--drop-last"]) == 2
    assert "leave out --drop-last" in error_line(capsys)
    assert main([*argv, "--json"]) == 0
    assert lineage_rows(capsys) == [list(range(10, 14))]
    # A state saved before the boundary was recorded: as the options say, and a note says so.
    old = ref.stream(batch_size=4, start_offset=10).state().to_dict()
    del old["boundary"]
    state.write_text(json.dumps(old))
    assert main([*argv, "--json", "--batch-size", "3"]) == 0
    out = capsys.readouterr()
    assert [row["records"] for row in json.loads(out.out)] == [[10, 11, 12]]
    assert "saved by an earlier release" in out.err and out.err.count("\n") == 1


def test_lineage_computes_only_the_items_asked_for(lineage_store, monkeypatch, capsys):
    ref, store, folder = lineage_store
    args = dict(shuffle=True, shuffle_seed=2, batch_size=7, drop_last=True, skip=[5, 6, 7])
    state = folder / "state.json"
    state.write_text(json.dumps(ref.stream(**args, start_offset=30).state().to_dict()))
    asked: list[int] = []
    lineage = ydl.Stream.lineage

    def counted(self: ydl.Stream, n: int, start_offset: int | None = None) -> list[Any]:
        asked.append(n)
        return lineage(self, n, start_offset)

    monkeypatch.setattr(ydl.Stream, "lineage", counted)
    np.save(folder / "skip.npy", np.array([5, 6, 7]))
    argv = ["lineage", "d", "v1", "--state", str(state), "--skip", str(folder / "skip.npy")]
    assert main([*argv, "--items", "60:64", "--json", *store]) == 0
    assert asked == [4]  # before: the first 64 items were made, and 60 thrown away
    expected = [a.tolist() for a in lineage(ref.stream(**args, start_offset=30), 64)[60:]]
    assert lineage_rows(capsys) == expected


def test_lineage_says_where_there_are_no_more_items(lineage_store, capsys):
    ref, store, folder = lineage_store
    state = folder / "state.json"
    # Shard 250 of 300 holds no record: its epochs hand out nothing.
    empty = ref.stream(num_shards=300, shard_rank=250).state().to_dict()
    state.write_text(json.dumps(empty))
    assert main(["lineage", "d", "v1", "--state", str(state), "--items", "0:3", *store]) == 0
    out = capsys.readouterr()
    assert out.out == "" and "there are no items 0 to 2" in out.err


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"{" * 2_000_000, "over 1 MiB"),
        (b'{"offset": ', "Expecting value"),
        (b"\xff\xfe\x00garbage", "--state"),
        (b"[1, 2]", "a stream state is a dict"),
        (b'{"format": 2}', "not a stream state: it lacks"),
        (
            b'{"format": 2, "dataset": "d:v1", "fingerprint": "x", "positions": 200, "order": '
            b'{"shuffle": [[[]]]}, "ngram": null, "offset": 0}',
            "'order' must hold",
        ),
    ],
    ids=["deep", "huge", "not-json", "not-utf8", "a-list", "lacking", "bad-order"],
)
def test_a_bad_state_file_is_one_line_and_exit_2(lineage_store, capsys, content, said):
    _, store, folder = lineage_store
    state = folder / "state.json"
    state.write_bytes(content)
    assert main(["lineage", "d", "v1", "--state", str(state), *store]) == 2
    line = error_line(capsys)
    assert line.startswith(f"yogadl-plus lineage: error: --state {state}") and said in line


def test_a_state_whose_values_are_of_the_wrong_kind_is_one_line_and_exit_2(lineage_store, capsys):
    ref, store, folder = lineage_store
    state = folder / "state.json"
    for name, value in [("shuffle_seed", [[1]]), ("num_shards", "3"), ("shard_by", {"a": 1})]:
        saved = ref.stream().state().to_dict()
        saved["order"][name] = value
        state.write_text(json.dumps(saved))
        assert main(["lineage", "d", "v1", "--state", str(state), *store]) == 2, name
        assert name in error_line(capsys)
    assert main(["lineage", "d", "v1", "--state", str(folder), *store]) == 2
    assert "cannot read it" in error_line(capsys)


# --------------------------------------------------------------------------- bad input


def test_usage_errors_are_one_line_and_exit_2(local, capsys):
    store = ["--storage", str(local.root)]
    for argv, said in [
        (["bench", "sensors", "v1", "--epochs", "0"], "argument --epochs: must be 1 or more"),
        (["bench", "sensors", "v1", "--epochs", "-2"], "argument --epochs: must be 0 or more"),
        (["lineage", "sensors", "v1", "--state", "s", "--items", "3"], "expected A:B"),
        (["head"], "the following arguments are required"),
    ]:
        with pytest.raises(SystemExit) as exited:
            main([*argv, *store])
        line = error_line(capsys)
        assert exited.value.code == 2 and said in line, argv
        assert line.endswith(f"(see yogadl-plus {argv[0]} --help)")


def test_a_build_function_that_raises_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "cli_raising.py").write_text(
        "def make():\n    raise RuntimeError('the bucket is\\nnot there')\n"
        "def records():\n    yield {'a': 1}\n    raise OSError('record 2 is gone')\n"
        "def generate():\n    return records()\n"
    )
    (tmp_path / "cli_broken.py").write_text("def make(:\n")
    (tmp_path / "cli_failing.py").write_text("raise KeyError('at import')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    store = ["--storage", str(tmp_path / "store")]
    for spec, said in [
        ("cli_raising:make", "cli_raising:make() raised RuntimeError: the bucket is not there; "
         "fix it, or see its traceback with `python -c 'import cli_raising; "
         "cli_raising.make()'`"),
        ("cli_raising:generate", "the records cli_raising:generate() returned raised OSError: "
         "record 2 is gone; fix it, or see its traceback with `python -c 'import cli_raising; "
         "list(cli_raising.generate())'`"),
        ("cli_broken:make", "cannot import module 'cli_broken' (SyntaxError: "),
        ("cli_failing:make", "cannot import module 'cli_failing' (KeyError: 'at import')"),
        ("cli_nowhere:make", "cannot import module 'cli_nowhere' (ModuleNotFoundError: "),
    ]:  # fmt: skip
        assert main(["build", spec, "made", "v1", *store]) == 2, spec
        line = error_line(capsys)
        assert said in line and "Traceback" not in line, line


# --------------------------------------------------------------------------- head, demo


def test_head_shows_what_a_bytes_value_is(tmp_path, capsys):
    from PIL import Image

    def encoded(fmt: str) -> bytes:
        out = io.BytesIO()
        Image.fromarray(np.zeros((24, 40, 3), np.uint8)).save(out, format=fmt)
        return out.getvalue()

    images = [encoded(fmt) for fmt in ("PNG", "JPEG", "WEBP", "GIF")]
    others = [bytes(range(200)), b"plain text, not an image", b"\x89PNG\r\n\x1a\nbroken", b""]
    values = [*images, *others]
    ydl.cache_dataset(
        [{"blob": v} for v in values], "b", "v1", ydl.LocalStorage(tmp_path), progress=False
    )
    store = ["--storage", str(tmp_path)]
    assert main(["head", "b", "v1", "-n", "8", *store]) == 0
    _, *rows = capsys.readouterr().out.splitlines()
    shown = [row.split(None, 1)[1] for row in rows]
    for fmt, row, value in zip(["PNG", "JPEG", "WEBP", "GIF"], shown, values):
        assert row == f"<{fmt} image 40x24, {len(value):,} bytes>"  # before: b'\x89PNG\r...
    assert shown[4] == "<200 bytes: 00 01 02 03 04 05 06 07 ...>"
    assert shown[5] == "<24 bytes: b'plain text, not '...>"
    assert shown[6] == "<14 bytes: 89 50 4e 47 0d 0a 1a 0a ...>"  # only looks like a PNG
    assert shown[7] == "<0 bytes>"
    assert main(["head", "b", "v1", "-n", "1", "--json", *store]) == 0  # JSON: still whole
    record = json.loads(capsys.readouterr().out)["records"][0]
    assert base64.b64decode(record["blob"]) == values[0]


def test_the_demo_reports_its_build_once(tmp_path, capsys):
    assert main(["demo", "--storage", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert out.out.count("built the cache") == 1 and "built demo-sensors" not in out.err


def test_the_console_script_names_main_and_the_package_keeps_every_command():
    import importlib
    import re

    import yogadl_plus.cli as cli

    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    (target,) = re.findall(r'^yogadl-plus = "(.+)"$', pyproject, re.M)
    module, _, name = target.partition(":")
    assert getattr(importlib.import_module(module), name) is main
    for command in ("demo", "build", "ls", "info", "head", "verify", "push", "pull", "rm"):
        assert callable(getattr(cli, f"cmd_{command}"))
    assert callable(cli.cmd_lineage) and callable(cli.cmd_bench) and callable(cli.build_parser)
    assert dict(cli.EXIT_CODES)[(ydl.DatasetNotFound,)] == 3 and cli.INTERNAL_ERROR == 70
