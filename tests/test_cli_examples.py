"""The examples and the demo as a user runs them, the documentation snippets, import hygiene."""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from helpers.servers import stop_spark

import yogadl_plus as ydl

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


@pytest.mark.slow
def test_demo_runs_on_the_default_storage(tmp_path):
    first = run_cli("demo", home=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "5000 records" in first.stdout and "disjoint=True covering=True" in first.stdout
    assert "checksums verified" in first.stdout
    assert ydl.LocalStorage(tmp_path).list() == [("demo-sensors", "v1")]
    again = run_cli("demo", home=tmp_path)
    assert again.returncode == 0 and "demo-sensors" in again.stdout
    # It says whether it built the cache or found it, and how to time the same epochs again.
    assert "built the cache:" in first.stdout and "reused the cache" in again.stdout
    assert "yogadl-plus bench demo-sensors v1 --shuffle --seed 7 --batch-size 256" in again.stdout


# The libraries the extras bring, as if none were installed (a None in sys.modules makes
# `import x` fail with ModuleNotFoundError, as a missing package does).
EXTRA_LIBRARIES = ("torch", "tensorflow", "keras", "pyspark", "ray", "grain", "jax", "datasets")
EXTRA_LIBRARIES += ("boto3", "botocore", "google")
WITHOUT_EXTRAS = (
    "import runpy, sys\n"
    f"sys.modules.update(dict.fromkeys({EXTRA_LIBRARIES!r}))\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def run_without_extras(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


FRAMEWORK_EXAMPLES = sorted(
    p.name
    for p in (ROOT / "examples").glob("*.py")
    if p.name.startswith(("torch_", "tf_", "grain_", "spark_"))
)


@pytest.mark.parametrize("script", FRAMEWORK_EXAMPLES)
def test_examples_name_the_extra_they_need(script, tmp_path):
    # Before: a bare ModuleNotFoundError traceback ("No module named 'torch'").
    result = run_without_extras(ROOT / "examples" / script, str(tmp_path))
    assert result.returncode == 1, result.stderr
    assert re.fullmatch(
        rf"examples/{script} needs [^:]+: pip install 'yogadl_plus\[\w+\]'\n", result.stderr
    ), result.stderr


@pytest.mark.parametrize(
    "use, extra",
    [
        ("ydl.torch.make_dataloader", "torch"),
        ("ydl.tensorflow.make_tf_dataset", "tf"),
        ("ydl.keras.StreamSequence", "tf"),
        ("ydl.grain.source", "grain"),
        ("ydl.S3Storage('bucket')", "s3"),
        ("ydl.GCSStorage('bucket')", "gcs"),
    ],
)
def test_faces_and_storages_name_the_extra_they_need(use, extra, tmp_path):
    script = tmp_path / "use.py"
    script.write_text(
        "import yogadl_plus as ydl\n"
        f"try:\n    {use}\nexcept ydl.MissingExtra as exc:\n    print(exc)\n"
    )
    result = run_without_extras(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(f" pip install 'yogadl_plus[{extra}]'\n"), result.stdout


@pytest.mark.parametrize(
    "face, name, library, extra",
    [
        ("torch", "make_dataloader", "PyTorch", "torch"),
        ("tensorflow", "make_tf_dataset", "TensorFlow", "tf"),
        ("keras", "StreamSequence", "Keras (with TensorFlow)", "tf"),
        ("grain", "source", "Grain", "grain"),
    ],
)
def test_faces_import_by_name_and_name_the_extra_they_need(face, name, library, extra, tmp_path):
    # Before: `from yogadl_plus.torch import make_dataloader` was a ModuleNotFoundError for
    # yogadl_plus.torch itself, although ydl.torch.make_dataloader worked.
    script = tmp_path / "use.py"
    script.write_text(
        "import yogadl_plus as ydl\n"
        f"try:\n    from yogadl_plus.{face} import {name}\n"
        "except ydl.MissingExtra as exc:\n    print(exc)\n"
    )
    result = run_without_extras(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"yogadl_plus.{face} needs {library}: pip install 'yogadl_plus[{extra}]'\n"
    )


@pytest.mark.slow
def test_every_way_of_importing_a_face_gives_one_module_and_no_framework_before():
    script = (
        "import sys\n"
        "import yogadl_plus as ydl\n"
        "frameworks = ('torch', 'tensorflow', 'keras', 'grain')\n"
        "assert not [m for m in frameworks if m in sys.modules], 'imported a framework'\n"
        "from yogadl_plus.torch import make_dataloader\n"
        "import yogadl_plus.torch\n"
        "import yogadl_plus.adapters.torch as adapter\n"
        "assert yogadl_plus.torch is ydl.torch and ydl.torch.__name__ == 'yogadl_plus.torch'\n"
        "assert make_dataloader is ydl.torch.make_dataloader is adapter.make_dataloader\n"
        "assert 'tensorflow' not in sys.modules, 'the torch face imported tensorflow'\n"
        "from yogadl_plus import grain\n"
        "from yogadl_plus.adapters.grain import source\n"
        "assert grain is ydl.grain and grain.source is source\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


def test_bundled_parquet_is_what_the_generator_makes():
    import pyarrow.parquet as pq

    from yogadl_plus.demo import DEMO_PARQUET, make_demo_table

    assert pq.read_table(DEMO_PARQUET).equals(make_demo_table())


def marks_of(code: str, slow: bool, bucket: bool = False) -> list[pytest.MarkDecorator]:
    """The marks (docs/contributing.md) of a program: what it starts, and how long it takes."""
    marks = [pytest.mark.ray] if "import ray" in code else []
    marks += [pytest.mark.spark] if "pyspark" in code else []
    return marks + [pytest.mark.servers] * bucket + [pytest.mark.slow] * slow


# The examples and pages that take more than about 2 s on 2 cores, most of it their framework's
# import, or Ray's or Spark's start (the "slow" mark; docs/contributing.md).
SLOW_EXAMPLES = {
    "grain_jax_train.py", "mixture.py", "parallel_build.py", "parquet_shards.py",
    "tf_fit_resume.py", "torch_ddp_resume.py", "torch_preprocess.py",
}  # fmt: skip
SLOW_PAGES = {
    "adapters/grain.md", "adapters/keras.md", "adapters/tensorflow.md", "adapters/torch.md",
    "boundary.md", "distributed.md", "long-runs.md", "many-machines.md", "migrating/petastorm.md",
    "parallel.md", "sources/columns.md", "sources/spark.md", "stats.md",
}  # fmt: skip

# spark_build.py runs as it is, and as a job scheduler runs it, in
# test_the_spark_example_runs_from_a_virtual_environment_not_activated (one Spark start, not two).
RUN_ELSEWHERE = {"spark_build.py"}
EXAMPLES = [
    pytest.param(p.name, marks=marks_of(p.read_text(), p.name in SLOW_EXAMPLES))
    for p in sorted((ROOT / "examples").glob("*.py"))
    if p.name not in RUN_ELSEWHERE
]


def example_temp(request: pytest.FixtureRequest) -> Path:
    """A folder for an example's TMPDIR, removed after the test.

    (A short path: Ray puts its sockets under the temp folder, in at most 107 bytes.)
    """
    temp = Path(tempfile.mkdtemp(prefix="ex-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    return temp


def assert_ran_clean(result: subprocess.CompletedProcess[str], temp: Path) -> None:
    """The example succeeded, removed the folder it made in ``temp``, and warned of nothing."""
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in temp.iterdir() if p.name.startswith(("yogadl", "tmp"))] == []
    # Python's warnings (path:line: SomeWarning: ...) are for a reader to worry about.
    assert not re.findall(r"^\S+:\d+: \w*Warning: .*", result.stderr, re.M), result.stderr[-3000:]


@pytest.mark.parametrize("script", EXAMPLES)
def test_examples_run_as_they_are(script, tmp_path, request):
    for prefix, framework in (("torch_", "torch"), ("tf_", "tensorflow"), ("grain_", "grain")):
        if script.startswith(prefix):
            pytest.importorskip(framework)
    # Run as a reader would, with no folder given: each makes a temporary one, and removes it
    # (before: every example left its folder in the system's temp folder).
    temp = example_temp(request)
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert_ran_clean(result, temp)


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


def page(path: Path, name: str) -> Any:
    """A page as a parameter, marked by what its snippets start (the test servers' bucket: as
    test_documentation_snippets_run tells) and by how long they take."""
    bucket = any(f"{scheme}://my-team-bucket" in path.read_text() for scheme in ("s3", "gs"))
    code = "\n".join(python_blocks(path))
    return pytest.param(path, id=name, marks=marks_of(code, name in SLOW_PAGES, bucket))


DOC_PAGES = [  # README.md, then every page under docs/ (nested too), named by its path there
    page(ROOT / "README.md", "README.md"),
    *(page(p, p.relative_to(ROOT / "docs").as_posix()) for p in sorted(ROOT.glob("docs/**/*.md"))),
]


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
@pytest.mark.filterwarnings("error::UserWarning")  # a warning a reader would worry about
def test_documentation_snippets_run(page, tmp_path, request, monkeypatch):
    """Every ```python block of a page runs (```py blocks are signatures, not programs).

    Pages that use buckets run against the test servers, reached through the standard
    credential chains (environment variables), as a user's machine would.
    """
    text = page.read_text()
    monkeypatch.setenv("YOGADL_PLUS_HOME", str(tmp_path / "home"))  # ydl.default_storage()
    if "s3://my-team-bucket" in text:
        s3 = request.getfixturevalue("s3_server")
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        s3.empty_bucket("my-team-bucket")
    if "gs://my-team-bucket" in text:
        gcs = request.getfixturevalue("gcs_server")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
        monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", gcs.project)
        gcs.empty_bucket("my-team-bucket")
    try:
        for block in python_blocks(page):
            code = block.replace("/tmp/caches", str(tmp_path))
            code = code.replace("/tmp/yogadl-docs", str(tmp_path))
            namespace: dict = {}
            exec(compile(code, f"{page.name}", "exec"), namespace)
            # What a page left behind (a DataLoader iterator it broke out of, with its worker
            # processes and queues) is collected here, in its own test: otherwise a later page
            # collects it, and an error while it shuts down is reported against that page.
            # Emptied first, as a script's globals are at its end: the functions a page defines
            # hold the namespace, and collected as one cycle with it, an iterator's queues may
            # be finalized before the iterator, whose workers then never get its word to stop
            # and are terminated after torch's 5 s wait each.
            namespace.clear()
            del namespace
            gc.collect()
    finally:
        stop_spark()  # a page's Spark, and its JVM: the next page starts one with its own env


def test_the_readme_quickstart_caches_where_the_cli_looks(tmp_path, monkeypatch, capsys):
    # Before: the quickstart cached into /tmp/caches and `yogadl-plus info toy v1` said "no
    # version", looking in ~/.cache/yogadl_plus.
    monkeypatch.setenv("YOGADL_PLUS_HOME", str(tmp_path))
    exec(compile(python_blocks(ROOT / "README.md")[0], "README.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["100000 5", "(3, 64)", "25856 True"]
    info = run_cli("info", "toy", "v1", home=tmp_path)
    assert info.returncode == 0 and "records   100000" in info.stdout, info.stderr


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


@pytest.mark.slow
@pytest.mark.spark
def test_the_spark_example_runs_from_a_virtual_environment_not_activated(tmp_path, request):
    # Before: run by a venv's python with the venv not on the PATH (as Slurm and cron run it),
    # Spark's Python workers ran the system's python3 and failed after 96 s: no module 'lmdb'.
    # Also what test_examples_run_as_they_are checks of the other examples: with no folder
    # given, it removes the temporary one it makes, and warns of nothing.
    pytest.importorskip("pyspark")
    java = shutil.which("java")
    if java is None:
        pytest.skip("Spark needs Java")
    paths = [os.path.dirname(java), "/usr/bin", "/bin"]
    temp = example_temp(request)
    env = {
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PATH": os.pathsep.join(p for p in paths if p != os.path.dirname(sys.executable)),
        "PYTHONPATH": str(ROOT),
        "TMPDIR": str(temp),
    }
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "spark_build.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert_ran_clean(result, temp)
    assert "cached 50000 rows" in result.stdout


def test_a_local_spark_on_another_python_is_said_before_the_tasks_start(caplog):
    import logging
    import types

    from yogadl_plus.building.spark import _check_local_python

    elsewhere = types.SimpleNamespace(master="local[2]", pythonExec="/nowhere/python3")
    with caplog.at_level(logging.WARNING, logger="yogadl_plus"):
        _check_local_python(elsewhere)
        _check_local_python(types.SimpleNamespace(master="local[2]", pythonExec=sys.executable))
        _check_local_python(types.SimpleNamespace(master="yarn", pythonExec="/nowhere/python3"))
    (said,) = [r.getMessage() for r in caplog.records]
    assert "'/nowhere/python3' (not found), not this Python" in said and "PYSPARK_PYTHON" in said
