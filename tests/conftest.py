"""Shared fixtures for the yogadl_plus tests."""

from __future__ import annotations

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
