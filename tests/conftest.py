"""Shared fixtures for the yogadl_plus tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import yogadl_plus as ydl

pytest_plugins = ["servers"]  # tests/servers.py: real S3 (SeaweedFS) and GCS servers


@pytest.fixture(autouse=True)
def _isolated_yogadl_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test may touch ~/.cache/yogadl_plus: default_storage() points into a temp folder."""
    monkeypatch.setenv("YOGADL_PLUS_HOME", str(tmp_path_factory.mktemp("yogadl_home")))


@pytest.fixture
def local_storage(tmp_path) -> ydl.LocalStorage:
    """A LocalStorage in a fresh temp folder (``<tmp_path>/store``)."""
    return ydl.LocalStorage(tmp_path / "store")


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of 2 CPUs on 127.0.0.1 for the session, shut down at its end."""
    ray = pytest.importorskip("ray")
    # Workers unpickle the test modules' datasets and transforms by reference: they need tests/
    # on their path.
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    from servers import start_local_ray  # (the plugin below, imported by then)

    ray.shutdown()  # one a documentation snippet started, without this runtime environment
    start_local_ray(ray, runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()
