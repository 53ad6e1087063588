"""The yogadl-plus command, the examples as a user runs them, and import hygiene."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import yogadl_plus as ydl
from yogadl_plus.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "YOGADL_PLUS_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "yogadl_plus", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_demo_runs_on_the_default_storage(tmp_path):
    first = run_cli("demo", home=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "5000 records" in first.stdout and "disjoint=True covering=True" in first.stdout
    assert "checksums verified" in first.stdout
    assert ydl.LocalStorage(tmp_path).list() == [("demo-sensors", "v1")]
    again = run_cli("demo", home=tmp_path)
    assert again.returncode == 0 and "demo-sensors" in again.stdout


def test_bundled_parquet_is_what_the_generator_makes():
    import pyarrow.parquet as pq

    from yogadl_plus.demo import DEMO_PARQUET, make_demo_table

    assert pq.read_table(DEMO_PARQUET).equals(make_demo_table())


def test_build_ls_info_head_verify_rm(tmp_path, capsys):
    from yogadl_plus.demo import DEMO_PARQUET

    store = ["--storage", str(tmp_path)]
    assert main(["build", DEMO_PARQUET, "sensors", "v2", "--columns", "id,label", *store]) == 0
    assert "5000 records" in capsys.readouterr().out
    assert main(["ls", *store]) == 0 and capsys.readouterr().out == "sensors\tv2\n"
    assert main(["info", "sensors", "v2", *store]) == 0
    info = capsys.readouterr().out
    assert "records   5000" in info and "label" in info and "features" not in info
    assert main(["info", "sensors", "v2", "--json", *store]) == 0
    assert json.loads(capsys.readouterr().out)["num_records"] == 5000
    assert main(["head", "sensors", "v2", "-n", "2", "--json", *store]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["0", "1"]
    assert main(["verify", "sensors", "v2", *store]) == 0
    assert main(["rm", "sensors", "v2", *store]) == 0
    assert ydl.LocalStorage(tmp_path).list() == []


def test_errors_are_one_clear_line_and_exit_2(tmp_path, capsys):
    assert main(["info", "nope", "v1", "--storage", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("yogadl-plus info: error: no version 'v1' of dataset 'nope'")
    assert main(["info", "bad/name", "v1", "--storage", str(tmp_path)]) == 2
    assert "not allowed" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["demo", "build", "ls", "info", "head", "verify", "rm"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0 and "usage: yogadl-plus" in capsys.readouterr().out


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "examples").glob("*.py")))
def test_examples_run_as_they_are(script, tmp_path):
    for prefix, framework in (("torch_", "torch"), ("tf_", "tensorflow")):
        if script.startswith(prefix):
            pytest.importorskip(framework)
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_import_pulls_in_no_framework():
    code = (
        "import sys, yogadl_plus\n"
        "heavy = {'tensorflow', 'torch', 'keras', 'jax', 'ray', 'boto3', 'google', 'pandas'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def python_blocks(path: Path) -> list[str]:
    text = path.read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
def test_documentation_snippets_run(page, tmp_path, request, monkeypatch):
    """Every ```python block of a page runs (```py blocks are signatures, not programs).

    Pages that use buckets run against the test servers, reached through the standard
    credential chains (environment variables), as a user's machine would.
    """
    text = page.read_text()
    if "s3://my-team-bucket" in text:
        s3 = request.getfixturevalue("s3_server")
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        s3.make_bucket("my-team-bucket")
    if "gs://my-team-bucket" in text:
        gcs = request.getfixturevalue("gcs_server")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
        monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", gcs.project)
        gcs.make_bucket("my-team-bucket")
    for block in python_blocks(page):
        code = block.replace("/tmp/caches", str(tmp_path))
        code = code.replace("/tmp/yogadl-docs", str(tmp_path))
        namespace: dict = {}
        exec(compile(code, f"{page.name}", "exec"), namespace)


@pytest.mark.parametrize(
    "tty, progress, shown", [(True, True, True), (True, False, False), (False, True, False)]
)
def test_progress_bar_only_on_a_terminal_and_when_asked(
    tmp_path, monkeypatch, tty, progress, shown
):
    import io

    stderr = io.StringIO()
    stderr.isatty = lambda: tty  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stderr", stderr)
    records = ({"i": i} for i in range(10_000))
    ydl.cache_dataset(records, "bar", "v1", ydl.LocalStorage(tmp_path), progress=progress)
    assert ("caching bar:v1" in stderr.getvalue()) is shown
