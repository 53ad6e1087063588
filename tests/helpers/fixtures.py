"""Pytest plugin: the fixtures every test module may use (registered from ``tests/conftest.py``).

``_isolated_yogadl_home`` (autouse) keeps every test off ``~/.cache/yogadl_plus``;
``local_storage`` is a LocalStorage in the test's temp folder; ``ray_cluster`` is a local Ray
cluster for the session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import yogadl_plus as ydl
from helpers.servers import start_local_ray

TESTS = Path(__file__).resolve().parents[1]


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
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    ray.shutdown()  # one a documentation snippet started, without this runtime environment
    start_local_ray(ray, runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()
